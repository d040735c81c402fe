"""Activations: what autograd keeps for backward, the formula for it, and checkpointing an FSDP unit.

Per transformer layer, Korthikanti et al. ("Reducing Activation Recomputation in Large Transformer
Models", 2022, the Megatron sequence-parallel paper) count s*b*h*(34 + 5*a*s/h) bytes in 16-bit: s tokens
per sequence, b sequences, h hidden, a heads. Their terms assume dropout (1-byte masks), a softmax
that stores its s x s probabilities, and 2-byte tensors. The course's GPT (`fsdp_mini.course.models`)
has none of the dropout, stores fp32 (4 bytes), and calls `F.scaled_dot_product_attention`, whose CPU
kernel (flash attention) keeps q, k, v, the output and one log-sum-exp per row instead of the s x s
matrix. `course_terms` lists what is left, op by op; `measure_block` counts what autograd really saves
(`fsdp_mini.saved_activations.SavedActivations`), so a lesson can set one beside the other.

`Checkpointed(block)` runs a block under `torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`:
forward keeps only the block's input, backward recomputes the block's forward first. Put around an FSDP
unit, the recomputation runs inside the unit's backward, when pre-backward has already gathered its
parameters: `fsdp_mini.FSDP` and `fsdp_mini.fully_shard` leave a unit in that state alone, so it costs
compute, not an extra AllGather.

PyTorch's own FSDP2 is set beside them: `PyTorchGathers` counts its AllGathers per unit and its gathered
bytes (it has no public counter for either). `SelectiveAttention` checkpoints only the attention core
(Korthikanti et al.'s selective recomputation); `sdpa_saved` shows what `scaled_dot_product_attention`
keeps for backward with and without dropout; `forward_flops` gives what a recomputed forward costs in FLOPs;
`step_traffic` counts the bytes an optimizer step reads and writes (the CPU Adam of offloading).
"""
from __future__ import annotations

from collections import Counter

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from fsdp_mini.course.models import Block, CausalSelfAttention, GPTConfig
from fsdp_mini.saved_activations import SavedActivations

__all__ = ["megatron_bytes", "course_terms", "course_bytes", "measure_block", "Checkpointed", "checkpoint_blocks",
           "recomputations", "PyTorchGathers", "SelectiveAttention", "checkpoint_attention_core", "sdpa_saved",
           "forward_flops", "step_traffic"]


def megatron_bytes(s: int, b: int, h: int, a: int) -> int:
    """Korthikanti et al.'s activation bytes of one layer, as written: 16-bit tensors, 1-byte dropout masks,
    the softmax's s x s output (and its dropout) stored: s*b*h*34 + 5*a*s^2*b."""
    return 34 * s * b * h + 5 * a * s * s * b


def course_terms(s: int, b: int, h: int, a: int, element_bytes: int = 4) -> dict[str, int]:
    """What one `Block` of the course's GPT saves for backward, op by op (fp32 by default): each tensor
    once, in the units of Korthikanti et al.'s table (sbh = one activation of the residual stream)."""
    sbh = s * b * h * element_bytes
    return {
        "ln_1 input": sbh,
        "qkv input (ln_1 output)": sbh,
        "q, k, v (one qkv output)": 3 * sbh,
        "attention output = proj input": sbh,
        "ln_2 input": sbh,
        "fc input (ln_2 output)": sbh,
        "GELU input (fc output, 4h)": 4 * sbh,
        "proj input (GELU output, 4h)": 4 * sbh,
        "LayerNorm mean and 1/std (2 per LayerNorm)": 4 * s * b * element_bytes,
        "attention log-sum-exp (a per token)": a * s * b * element_bytes,
    }


def course_bytes(s: int, b: int, h: int, a: int, element_bytes: int = 4) -> int:
    """The sum of `course_terms`: 64*sbh + 16*sb + 4*a*sb bytes in fp32."""
    return sum(course_terms(s, b, h, a, element_bytes).values())


def measure_block(block: nn.Module, b: int, s: int) -> int:
    """Bytes autograd saves in one forward of `block` on a (b, s, h) input that requires grad (as a block
    inside the model gets), its parameters excluded: `SavedActivations`."""
    h = next(block.parameters()).shape[-1]
    x = torch.randn(b, s, h, requires_grad=True)
    with SavedActivations(exclude=block.parameters()) as saved:
        block(x)
    return saved.nbytes


class Checkpointed(nn.Module):
    """A block run under activation checkpointing: forward saves nothing inside it but its input (which the
    checkpoint saves for backward, so `SavedActivations` counts it); backward recomputes the block's
    forward, then runs its backward. `recomputed` counts the recomputations."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block
        self.recomputed = 0
        self._in_forward = False
        block.register_forward_pre_hook(self._count)

    def _count(self, module, args) -> None:
        if self._in_forward:
            self._in_forward = False
        else:
            self.recomputed += 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._in_forward = True
        return checkpoint(self.block, x, use_reentrant=False)


def checkpoint_blocks(model: nn.Module, which) -> nn.Module:
    """Wrap `model.blocks[i]` in `Checkpointed` for each i in `which` (before FSDP wraps the model: the
    blocks stay the units, the checkpoint sits around each). Returns the model."""
    for i in sorted(set(which)):
        model.blocks[i] = Checkpointed(model.blocks[i])
    return model


def recomputations(model: nn.Module) -> int:
    """How many block forwards were recomputed in backward so far, over the checkpointed blocks of `model`."""
    return sum(m.recomputed for m in model.modules() if isinstance(m, Checkpointed))


class PyTorchGathers:
    """While open, on this rank: PyTorch FSDP2's AllGathers per unit (`counts`, by module name, "root" for the
    root) and its gathered parameter bytes (`current`, `peak`), as fsdp_mini's `MemoryTracker` counts them:
    a unit's parameters are live from its AllGather until FSDP2 frees them.

    FSDP2 (`torch.distributed.fsdp.fully_shard`) has no public counter of either, so this wraps methods of its
    parameter group (torch 2.13, torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py): inside `unshard`
    each real AllGather is one call of `dist.all_gather_single` (counted, with the unit's name);
    `_to_sharded` / `_to_sharded_post_forward` free the gathered parameters. `events` lists
    ("gather" | "free", unit) in order. Put back on exit."""

    def __init__(self) -> None:
        self.counts: Counter = Counter()
        self.events: list[tuple[str, str]] = []
        self.current = 0
        self.peak = 0
        self._live: dict[int, int] = {}

    @staticmethod
    def _nbytes(group) -> int:
        return sum(fp._orig_size.numel() * (fp.param_dtype or fp.orig_dtype).itemsize for fp in group.fsdp_params)

    def __enter__(self) -> "PyTorchGathers":
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

        cls, tracker, unit = FSDPParamGroup, self, [None]
        self._saved = {name: getattr(cls, name) for name in ("unshard", "_to_sharded", "_to_sharded_post_forward")}
        self._all_gather = dist.all_gather_single
        saved, all_gather = self._saved, self._all_gather

        def unshard(group, *args, **kwargs):
            before, unit[0] = unit[0], group
            try:
                return saved["unshard"](group, *args, **kwargs)
            finally:
                unit[0] = before

        def all_gather_single(*args, **kwargs):
            group = unit[0]
            if group is not None:
                name = group._module_fqn or "root"
                tracker.counts[name] += 1
                tracker.events.append(("gather", name))
                if id(group) not in tracker._live:
                    tracker._live[id(group)] = nbytes = tracker._nbytes(group)
                    tracker.current += nbytes
                    tracker.peak = max(tracker.peak, tracker.current)
            return all_gather(*args, **kwargs)

        def freeing(name):
            def free(group, *args, **kwargs):
                if id(group) in tracker._live:
                    tracker.current -= tracker._live.pop(id(group))
                    tracker.events.append(("free", group._module_fqn or "root"))
                return saved[name](group, *args, **kwargs)
            return free

        cls.unshard = unshard
        cls._to_sharded = freeing("_to_sharded")
        cls._to_sharded_post_forward = freeing("_to_sharded_post_forward")
        dist.all_gather_single = all_gather_single
        return self

    def __exit__(self, *exc) -> None:
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

        for name, fn in self._saved.items():
            setattr(FSDPParamGroup, name, fn)
        dist.all_gather_single = self._all_gather


class SelectiveAttention(CausalSelfAttention):
    """The course's attention with only its core checkpointed (Korthikanti et al.'s selective recomputation):
    the linear layers keep their inputs as usual; softmax(q k^T) v is recomputed in backward, so whatever the
    kernel would keep of size s x s is not kept. `checkpoint_attention_core` turns a GPT's attention into it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = checkpoint(F.scaled_dot_product_attention, q, k, v, is_causal=True, use_reentrant=False)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


def checkpoint_attention_core(model: nn.Module) -> nn.Module:
    """Make every block's attention a `SelectiveAttention` (same parameters, same results). Returns `model`."""
    for module in model.modules():
        if type(module) is CausalSelfAttention:
            module.__class__ = SelectiveAttention
    return model


def sdpa_saved(b: int, a: int, s: int, d: int, dropout_p: float = 0.0, backend=None) -> dict:
    """What `F.scaled_dot_product_attention` (causal) keeps for backward on (b, a, s, d) fp32 inputs:
    "backward" (the autograd node, which names the kernel), "nbytes" (each storage once; q, k, v themselves
    excluded: they are the qkv layer's output, kept anyway), "square" (how many of the saved storages hold
    s x s values per head: a*s^2*b of them). `backend`: a `torch.nn.attention.SDPBackend` to force one kernel."""
    from contextlib import nullcontext

    from torch.nn.attention import sdpa_kernel

    q, k, v = (torch.randn(b, a, s, d, requires_grad=True) for _ in range(3))
    skip = {t.untyped_storage().data_ptr() for t in (q, k, v)}
    storages: dict[int, tuple[int, int]] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            storages[storage.data_ptr()] = (storage.nbytes(), t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with sdpa_kernel(backend) if backend is not None else nullcontext():
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
    return {"backward": type(out.grad_fn).__name__, "nbytes": sum(n for n, _ in storages.values()),
            "square": sum(1 for _, numel in storages.values() if numel == a * s * s * b)}


def forward_flops(cfg: GPTConfig, batch: int) -> tuple[int, int]:
    """(FLOPs of one block's forward, FLOPs of the whole model's forward) for the course's GPT on `batch`
    sequences of `cfg.block_size` tokens: 2 per weight per token in the linear layers, and 2 * 2 * s^2 * h
    per sequence for q k^T and its product with v (counted in full, as a kernel without causal skipping
    does). Backward costs twice a forward, so a step is 3 forwards; LayerNorm, GELU, softmax are left out."""
    h, s, tokens = cfg.n_embd, cfg.block_size, batch * cfg.block_size
    block = 2 * 12 * h * h * tokens + 4 * batch * s * s * h
    head = 2 * h * cfg.vocab_size * tokens
    return block, cfg.n_layer * block + head


def step_traffic(optimizer_class, numel: int = 1 << 16, **options) -> float:
    """Bytes one step of `optimizer_class(params, **options)` reads and writes in memory per parameter,
    counted op by op (every tensor an op reads, each storage once, plus every tensor it writes) on one fp32
    parameter of `numel` elements with a gradient, after a first step (the state exists). On large tensors
    none of it stays in cache, so this is the memory traffic of a CPU optimizer step."""
    from torch.utils._python_dispatch import TorchDispatchMode

    def tensors(x) -> list:
        return [t for t in torch.utils._pytree.tree_leaves(x) if isinstance(t, torch.Tensor) and t.numel() > 1]

    class Traffic(TorchDispatchMode):
        nbytes = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            read = {t.untyped_storage().data_ptr(): t.numel() * t.element_size() for t in tensors((args, kwargs))}
            # written: arguments the op's schema marks as mutated, and new outputs
            values = list(args) + [kwargs.get(a.name) for a in func._schema.arguments[len(args):]]
            written = {t.untyped_storage().data_ptr(): t.numel() * t.element_size()
                       for arg, value in zip(func._schema.arguments, values)
                       if arg.alias_info is not None and arg.alias_info.is_write for t in tensors(value)}
            for t in tensors(out):
                written.setdefault(t.untyped_storage().data_ptr(), t.numel() * t.element_size())
            Traffic.nbytes += sum(read.values()) + sum(written.values())
            return out

    param = nn.Parameter(torch.randn(numel))
    param.grad = torch.randn(numel)
    optimizer = optimizer_class([param], **options)
    optimizer.step()
    with Traffic():
        optimizer.step()
    return Traffic.nbytes / numel
