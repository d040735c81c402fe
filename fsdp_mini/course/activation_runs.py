"""Lesson 11's runs on ranks: the plumbing that builds, trains and measures, so the lesson's cells keep the
call and the checks.

- `train_checkpointed`: a GPT of 4 blocks under activation checkpointing (none, every block, or one checkpoint
  spanning blocks 0 and 1), sharded by one of three engines (`Engine`: fsdp_mini's `FSDP` and `fully_shard`,
  PyTorch's FSDP2), trained a few SGD steps; returns the AllGathers per unit per step, the gathered peak and
  the full state dict under the plain (unwrapped) names, to compare with one process.
- `checkpoint_then_shard` / `pytorch_checkpointing`: PyTorch's own `apply_activation_checkpointing` before
  or after `fully_shard`, the two orders TorchTitan could use (the first function is the one the lesson
  shows; the second trains and counts).
- `overlap_times`: a step timed with and without prefetch, each block's forward (`Trace`) and AllGather
  (`CommLog`): the medians of a few steps.
- `RecordedTo`: every `Tensor.to` call while open, to show the order in which FSDP2's CPU offload copies a
  shard to the device and casts it.

Each runs on a rank (inside `fsdp_mini.launch`) and returns plain data that pickles.
"""
from __future__ import annotations

import enum
import statistics
import time
from collections import Counter
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointWrapper,
    apply_activation_checkpointing,
)
from torch.distributed.fsdp import fully_shard as torch_fully_shard
from torch.utils.checkpoint import checkpoint

from fsdp_mini import FSDP, CommLog, full_state_dict, fully_shard
from fsdp_mini.course.activations import PyTorchGathers, checkpoint_blocks
from fsdp_mini.course.models import GPT, Block, GPTConfig, make_batch
from fsdp_mini.course.pytorch_equivalent import pytorch_full_state_dict
from fsdp_mini.course.trace import Trace
from fsdp_mini.course.train import local_rows, train
from fsdp_mini.fsdp._fully_shard.fully_shard import gathered_memory

__all__ = ["Engine", "SPAN", "CheckpointedRun", "train_checkpointed", "checkpoint_then_shard",
           "pytorch_checkpointing", "OverlapTimes", "overlap_times", "RecordedTo"]

SPAN = "span"  # `which` for one checkpoint around blocks 0 and 1 together


class Engine(enum.Enum):
    """The three engines lesson 11 runs side by side; the value is how a table names each."""

    FSDP = "mini FSDP"
    FULLY_SHARD = "mini fully_shard"
    PYTORCH = "PyTorch FSDP2"


class TwoBlocks(nn.Module):
    """One checkpoint around two blocks (two FSDP units): a checkpoint that spans units."""

    def __init__(self, first: nn.Module, second: nn.Module):
        super().__init__()
        self.first, self.second = first, second

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(lambda y: self.second(self.first(y)), x, use_reentrant=False)


def _build(cfg: GPTConfig, which) -> nn.Module:
    model = GPT(cfg)
    if which == SPAN:
        pair = TwoBlocks(model.blocks[0], model.blocks[1])
        model.blocks = nn.ModuleList([pair, *model.blocks[2:]])
        return model
    return checkpoint_blocks(model, which)


def _plain_name(name: str, which) -> str:
    """A state-dict key without the checkpoint wrappers: the key of the same tensor in a plain GPT."""
    if which != SPAN:
        return name.replace(".block.", ".")
    for wrapped, plain in (("blocks.0.first.", "blocks.0."), ("blocks.0.second.", "blocks.1."),
                           ("blocks.1.", "blocks.2."), ("blocks.2.", "blocks.3.")):
        if wrapped in name:
            return name.replace(wrapped, plain)
    return name


def _shard(engine: Engine, model: nn.Module, strategy: str) -> nn.Module:
    if engine is Engine.FSDP:
        return FSDP(model, strategy, wrap=(Block,))
    wrap = fully_shard if engine is Engine.FULLY_SHARD else torch_fully_shard
    # PyTorch: None, its default, keeps the root gathered after forward, as fsdp_mini does
    after = None if strategy == "FULL_SHARD" else False  # fsdp_mini's fully_shard has the same default
    for block in [m for m in model.modules() if isinstance(m, Block)]:
        wrap(block, reshard_after_forward=after)
    return wrap(model, reshard_after_forward=after)


def _root_first(units) -> list[str]:
    return sorted(units, key=lambda unit: (unit != "root", unit))


@dataclass
class CheckpointedRun:
    """What one rank saw: AllGathers per unit per step (root first, then the blocks), the gathered peak in
    bytes, and the full state dict under a plain GPT's names."""

    gathers: list[int]
    peak: int
    state: dict[str, torch.Tensor]


def train_checkpointed(engine: Engine, strategy: str, which, cfg: GPTConfig, steps: int) -> CheckpointedRun:
    """Train `steps` SGD steps (lr 0.1, 8 rows) of a GPT(cfg) checkpointed as `which` (block indices, or
    `SPAN`) and sharded by `engine` with `strategy`; count the AllGathers and the gathered peak."""
    model = _shard(engine, _build(cfg, which), strategy)
    with CommLog() as log, PyTorchGathers() as torch_log:
        train(model, torch.optim.SGD(model.parameters(), lr=0.1), cfg, steps=steps, batch_size=8)
    if engine is Engine.PYTORCH:
        gathers, peak, state = torch_log.counts, torch_log.peak, pytorch_full_state_dict(model)
    else:
        gathers = Counter(r.label for r in log.records if r.op == "all_gather")
        peak = model.gathered_memory.peak if engine is Engine.FSDP else gathered_memory(model).peak
        state = full_state_dict(model)
    return CheckpointedRun(gathers=[gathers[u] // steps for u in _root_first(gathers)], peak=peak,
                           state={_plain_name(k, which): v for k, v in state.items()})


def checkpoint_then_shard(model: nn.Module, order: str) -> nn.Module:
    """PyTorch's checkpoint wrapper and FSDP2 on a GPT's blocks, in `order`: "none" (no checkpointing),
    "inside" (wrap the blocks, then `fully_shard` each wrapper: TorchTitan's order) or "around"
    (`fully_shard` each block, then wrap it)."""
    if order == "inside":
        apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, Block))
    # the units: the checkpoint wrappers if there are any yet, else the blocks
    units = [m for m in model.modules() if isinstance(m, CheckpointWrapper)] or list(model.blocks)
    for unit in units:
        torch_fully_shard(unit)
    if order == "around":
        apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, Block))
    torch_fully_shard(model)
    return model


@dataclass
class OrderRun:
    """One rank's run of `pytorch_checkpointing`: AllGathers per unit per step (root first), the name of the
    first block's unit, block forwards recomputed per step, gathered peak, full state dict."""

    gathers: list[int]
    unit: str
    recomputed: int
    peak: int
    state: dict[str, torch.Tensor]


def pytorch_checkpointing(order: str, cfg: GPTConfig, steps: int) -> OrderRun:
    """Train a GPT(cfg) built by `checkpoint_then_shard(..., order)` `steps` SGD steps; count AllGathers and
    the blocks' forwards (a forward pre-hook on each block: one a step, plus one per recomputation)."""
    model = GPT(cfg)
    forwards = []
    for block in model.blocks:
        block.register_forward_pre_hook(lambda *_: forwards.append(1))
    model = checkpoint_then_shard(model, order)
    with PyTorchGathers() as gathers:
        train(model, torch.optim.SGD(model.parameters(), lr=0.1), cfg, steps=steps, batch_size=8)
    names = _root_first(gathers.counts)
    return OrderRun(gathers=[gathers.counts[u] // steps for u in names], unit=names[1],
                    recomputed=len(forwards) // steps - cfg.n_layer, peak=gathers.peak,
                    state=pytorch_full_state_dict(model))


@dataclass
class OverlapTimes:
    """Medians over 3 steps, in ms: the step, one block's forward, one block's AllGather; and the set of
    byte counts of the blocks' AllGathers."""

    step_ms: float
    block_forward_ms: float
    allgather_ms: float
    gather_bytes: set[int]


def overlap_times(cfg: GPTConfig, rows_per_rank: int, prefetch: bool) -> OverlapTimes:
    """Time steps of `FSDP(GPT(cfg), "FULL_SHARD")` with `prefetch` on `rows_per_rank` sequences per rank."""
    model = FSDP(GPT(cfg), "FULL_SHARD", wrap=(Block,), prefetch=prefetch)
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = (local_rows(t, rank, world) for t in make_batch(cfg, rows_per_rank * world))
    model(x, y).backward()  # the first step records the order that prefetch replays
    steps, forward, gathers, nbytes = [], [], [], set()
    for _ in range(3):
        dist.barrier()
        start = time.perf_counter()
        with CommLog() as log, Trace(model) as trace:
            model(x, y).backward()
        steps.append(time.perf_counter() - start)
        forward += [s.seconds for s in trace.spans if s.kind == "forward" and s.label.startswith("blocks")]
        blocks = [r for r in log.records if r.op == "all_gather" and r.label.startswith("blocks")]
        gathers += [r.seconds for r in blocks]
        nbytes |= {r.nbytes for r in blocks}
    step, fwd, gather = (statistics.median(v) * 1e3 for v in (steps, forward, gathers))
    return OverlapTimes(step_ms=step, block_forward_ms=fwd, allgather_ms=gather, gather_bytes=nbytes)


class RecordedTo:
    """While open, every `Tensor.to` call in order, as (the tensor's dtype, "device" for a move to a
    `torch.device`, else the dtype it was cast to): `calls`. `Tensor.to` is put back on exit."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __enter__(self) -> "RecordedTo":
        self._to = to = torch.Tensor.to
        calls = self.calls

        def recording_to(tensor, *args, **kwargs):
            out = to(tensor, *args, **kwargs)
            calls.append((tensor.dtype, "device" if isinstance(args[0], torch.device) else out.dtype))
            return out

        torch.Tensor.to = recording_to
        return self

    def __exit__(self, *exc) -> None:
        torch.Tensor.to = self._to
