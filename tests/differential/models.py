"""The small models a description asks for: one `Net` whose features are switched on by name.

Every feature is a way real models break FSDP implementations: a Lightning-like owner holding the wrapped
model as an attribute, tied and reused modules, frozen parts, int / bool / NaN buffers, a ModuleDict with
an unused branch, a non-float parameter and a one-element one (smaller than the world: padding). The
model is built from the description's seed alone, so both implementations (and every rank) start from
the same values.
"""
from __future__ import annotations

import torch
import torch.nn as nn

FEATURES = ("owner", "tied", "reuse", "frozen", "int_buffer", "bool_buffer", "nan_buffer", "unused",
            "int_param", "tiny", "layernorm")


class Block(nn.Module):
    """A residual layer; the unit both designs' policies wrap."""

    def __init__(self, width: int, f: dict):
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width) if f.get("layernorm") else None
        if f.get("int_buffer"):
            self.register_buffer("calls", torch.zeros((), dtype=torch.int64))
        if f.get("bool_buffer"):
            self.register_buffer("mask", torch.arange(width) % 3 != 0)
        if f.get("nan_buffer"):  # the same NaN on every rank: not "ranks start from different values"
            self.register_buffer("missing", torch.tensor([float("nan"), 0.0]))

    def forward(self, x):
        h = self.lin(x)
        if self.norm is not None:
            h = self.norm(h)
        if hasattr(self, "mask"):
            h = h * self.mask
        if hasattr(self, "missing"):
            h = h + torch.nan_to_num(self.missing).sum()
        if hasattr(self, "calls") and self.training:
            self.calls += 1
        return x + torch.tanh(h)


class Net(nn.Module):
    """emb -> blocks -> heads["main"] (heads["aux"] only with `use_aux`: unused otherwise)."""

    def __init__(self, width: int, depth: int, f: dict):
        super().__init__()
        self.emb = nn.Linear(width, width)
        self.blocks = nn.ModuleList(Block(width, f) for _ in range(depth))
        self.heads = nn.ModuleDict({"main": nn.Linear(width, width)})
        if f.get("unused"):
            self.heads["aux"] = nn.Linear(width, 3)
        if f.get("tied"):
            self.heads["main"].weight = self.emb.weight
        if f.get("int_param"):
            self.positions = nn.Parameter(torch.arange(width, dtype=torch.int64), requires_grad=False)
        if f.get("tiny"):
            self.scale = nn.Parameter(torch.full((1,), 0.9))
        self.reuse = bool(f.get("reuse"))
        self.use_aux = False

    def forward(self, x):
        x = self.emb(x)
        if hasattr(self, "positions"):
            x = x + self.positions.to(x.dtype) * 0.01
        for block in self.blocks:
            x = block(x)
        if self.reuse:  # the first block runs twice: a module (and its unit) used twice per forward
            x = self.blocks[0](x)
        out = self.heads["main"](x)
        if self.use_aux:
            out = out + self.heads["aux"](x).sum()
        if hasattr(self, "scale"):
            out = out * self.scale
        return out


class Owner(nn.Module):
    """What Lightning's LightningModule is to a model: holds it as `.model` (wrapped in place by the
    program), has state of its own, and forwards to it."""

    def __init__(self, net: Net):
        super().__init__()
        self.model = net
        # frozen: a trainable parameter outside every FSDP unit is not averaged across ranks, so ranks (and
        # HSDP's replicas, through clipping) would drift apart, and which rank's copy a checkpoint keeps is
        # each implementation's own choice
        self.temperature = nn.Parameter(torch.ones(()), requires_grad=False)
        self.register_buffer("seen", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        if self.training:
            self.seen += 1
        return self.model(x) * self.temperature


def build(model: dict, seed: int) -> nn.Module:
    """The description's model (`Owner` around the `Net` with the "owner" feature), seeded: the same on
    every rank and for both implementations. "frozen": emb frozen before wrapping."""
    torch.manual_seed(seed)
    net = Net(model["width"], model["depth"], model)
    if model.get("frozen"):
        net.emb.requires_grad_(False)
    return Owner(net) if model.get("owner") else net


def net_of(top: nn.Module) -> nn.Module:
    """The module that gets wrapped: the owner's `.model`, or the model itself."""
    return top.model if isinstance(top, Owner) else top
