"""The contestants of `python -m fsdp_mini bench`: which model sizes, which engines and strategies, and
how one of them is built and stepped on a rank.

A case key names an engine and a strategy: `mini:FULL_SHARD[:noprefetch][:ring][:norecord]` (fsdp_mini's
FSDP, the flat design; `norecord` turns the flight recorder off, to measure what it costs), `fully_shard:reshard` / `fully_shard:noreshard` (fsdp_mini's per-parameter design),
`fsdp2:reshard` / `fsdp2:noreshard` (PyTorch's `fully_shard`), `ddp` (PyTorch's DDP) or `compute` (the
plain model on this rank's rows, no communication: the compute the simulator adds to the collectives).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from fsdp_mini.course.models import GPT, Block, GPTConfig, make_batch
from fsdp_mini.course.train import hybrid_shard_size, local_rows
from fsdp_mini.flight_recorder import RECORDER
from fsdp_mini.fsdp.strategy import as_strategy

__all__ = ["SIZES", "CASES", "Case", "parse_case", "parse_cases", "parse_sizes", "model_numel",
           "make_optimizer", "build", "local_batch", "step"]

# The small GPT of the course at two sizes (and a tiny one for the smoke test). `batch` is global.
SIZES: dict[str, tuple[GPTConfig, int]] = {
    "tiny": (GPTConfig(n_layer=2), 8),
    "small": (GPTConfig(n_layer=4), 16),
    "medium": (GPTConfig(vocab_size=512, block_size=32, n_layer=4, n_head=4, n_embd=256), 8),
}


@dataclass(frozen=True)
class Case:
    """One contestant. `engine`: "fsdp_mini" (flat), "fully_shard" (fsdp_mini's per-parameter design),
    "fsdp2" (PyTorch's fully_shard), "ddp" (torch's) or "compute" (the
    plain model on this rank's rows, no communication: the compute the simulator adds to the collectives)."""

    key: str
    engine: str
    strategy: str = ""
    prefetch: bool = True
    impl: str = "builtin"
    record: bool = True  # the flight recorder (fsdp_mini.flight_recorder) on, as it is by default

    @property
    def name(self) -> str:
        if self.engine == "fsdp_mini":
            extra = ("" if self.prefetch else ", no prefetch") + ("" if self.impl == "builtin" else f", {self.impl}") \
                + ("" if self.record else ", no flight recorder")
            return f"fsdp_mini {self.strategy}{extra}"
        return {"fsdp2": f"FSDP2 reshard={self.strategy == 'FULL_SHARD'}",
                "fully_shard": f"fsdp_mini fully_shard reshard={self.strategy == 'FULL_SHARD'}", "ddp": "PyTorch DDP",
                "compute": "compute only"}[self.engine]

    @property
    def twin(self) -> str | None:
        """The key of the PyTorch case this one is compared with (the peer a user would otherwise pick)."""
        if self.engine == "fully_shard":
            return "fsdp2:reshard" if self.strategy == "FULL_SHARD" else "fsdp2:noreshard"
        if self.engine != "fsdp_mini":
            return None
        return {"NO_SHARD": "ddp", "SHARD_GRAD_OP": "fsdp2:noreshard",
                "_HYBRID_SHARD_ZERO2": "fsdp2:noreshard"}.get(self.strategy, "fsdp2:reshard")


def parse_case(key: str) -> Case:
    """A case from its key: `mini:FULL_SHARD[:noprefetch][:ring]`, `fsdp2:reshard`, `fsdp2:noreshard`,
    `ddp` or `compute`."""
    parts = key.strip().split(":")
    if parts[0] == "mini" and len(parts) >= 2:
        flags, known = set(parts[2:]), {"noprefetch", "ring", "norecord"}
        if not flags <= known:
            raise ValueError(f"unknown flags {sorted(flags - known)} in case {key!r}")
        strategy = as_strategy(parts[1]).name
        return Case(key.strip(), "fsdp_mini", strategy, prefetch="noprefetch" not in flags,
                    impl="ring" if "ring" in flags else "builtin", record="norecord" not in flags)
    if parts[0] in ("fsdp2", "fully_shard") and len(parts) == 2 and parts[1] in ("reshard", "noreshard"):
        return Case(key.strip(), parts[0], "FULL_SHARD" if parts[1] == "reshard" else "SHARD_GRAD_OP")
    if key.strip() in ("ddp", "compute"):
        return Case(key.strip(), key.strip())
    raise ValueError(f"unknown case {key!r}: use mini:STRATEGY[:noprefetch][:ring][:norecord], fully_shard:reshard, "
                     f"fully_shard:noreshard, fsdp2:reshard, fsdp2:noreshard, ddp or compute")


CASES = ("mini:NO_SHARD", "mini:SHARD_GRAD_OP", "mini:FULL_SHARD", "mini:FULL_SHARD:noprefetch", "mini:FULL_SHARD:norecord",
         "mini:HYBRID_SHARD", "fully_shard:reshard", "fsdp2:reshard", "fsdp2:noreshard", "ddp", "compute")


def parse_cases(text: str) -> list[Case]:
    cases = [parse_case(k) for k in text.split(",") if k.strip()]
    if not cases:
        raise ValueError("no cases given")
    return cases


def parse_sizes(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in names if s not in SIZES]
    if bad or not names:
        raise ValueError(f"unknown size(s) {bad or text!r}: choose from {', '.join(SIZES)}")
    return names


def model_numel(size: str) -> int:
    """Parameters of the GPT of `size` (the tied head counted once)."""
    return sum(p.numel() for p in GPT(SIZES[size][0]).parameters())


# --- building and stepping a case on this rank -------------------------------------------------------------------

def make_optimizer(params):
    """The optimizer every case steps with: AdamW, with the multi-tensor (`foreach`) implementation for
    every case alike. PyTorch picks it by default on GPUs only; on CPU its per-parameter loop pays
    DTensor's dispatch for every op of every parameter, ~6x slower for the per-parameter designs."""
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1, foreach=True)


def build(case: Case, cfg: GPTConfig):
    """(model, optimizer) for one case on this rank."""
    from fsdp_mini.course.pytorch_equivalent import shard_per_parameter, wrap_like_pytorch
    from fsdp_mini.fsdp.fully_sharded_data_parallel import FSDP

    world = dist.get_world_size()
    RECORDER.enabled = case.record
    if case.engine == "fsdp_mini":
        hybrid = "HYBRID" in case.strategy
        model = FSDP(GPT(cfg), case.strategy, wrap=(Block,), prefetch=case.prefetch, impl=case.impl,
                     shard_size=hybrid_shard_size(world) if hybrid else None)
    elif case.engine == "fully_shard":
        model = shard_per_parameter(GPT(cfg), case.strategy, wrap=(Block,))
    elif case.engine == "fsdp2":
        model = wrap_like_pytorch(GPT(cfg), case.strategy, wrap=(Block,))
    elif case.engine == "ddp":
        model = wrap_like_pytorch(GPT(cfg), "NO_SHARD")
    else:
        model = GPT(cfg)
    return model, make_optimizer(model.parameters())


def local_batch(cfg: GPTConfig, batch: int, step: int):
    """This rank's rows of global batch number `step`."""
    return tuple(local_rows(t, dist.get_rank(), dist.get_world_size()) for t in make_batch(cfg, batch, step))


def step(model, opt, x, y) -> None:
    model(x, y).backward()
    opt.step()
    opt.zero_grad()
