"""One FSDP training step, logged on every rank: what lessons 05 and 06 read collective by collective.

Why a module: both lessons run the same step under several strategies and prefetch settings, and the
per-rank plumbing (a warm-up step, a barrier, three logs, a few counts) teaches nothing once it has
been read; lesson 05 shows this source, lesson 06 calls it again. Run it with
`launch(logged_step, world, args=(cfg, strategy, prefetch))`: one `LoggedStep` per rank, in rank order.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from fsdp_mini import FSDP, CommLog
from fsdp_mini.comm_log import CommRecord
from fsdp_mini.course.models import GPT, Block, GPTConfig, make_batch
from fsdp_mini.course.trace import MemoryEvent, Span, Trace
from fsdp_mini.course.train import local_rows, train
from fsdp_mini.fsdp.strategy import ShardingStrategy

__all__ = ["LoggedStep", "logged_step"]


@dataclass
class LoggedStep:
    """One rank's logged step: its collectives (`CommLog`), its compute spans and gathers/frees
    (`Trace`), the gathered bytes right after forward, `memory_stats` after backward (before the
    optimizer step, so the gradient shards are there) and each unit's gathered size in bytes."""

    records: list[CommRecord]
    spans: list[Span]
    memory: list[MemoryEvent]
    after_forward: int
    stats: dict[str, int]
    units: dict[str, int]


def logged_step(cfg: GPTConfig, strategy: ShardingStrategy, prefetch: bool) -> LoggedStep:
    """Train step 0 unlogged (FSDP records the order of the units), then log step 1 of a batch of 8."""
    model = FSDP(GPT(cfg), strategy, wrap=(Block,), prefetch=prefetch)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train(model, opt, cfg, steps=1, batch_size=8)  # step 0: FSDP records the order of the units
    model.gathered_memory.reset_peak()
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = (local_rows(t, rank, world) for t in make_batch(cfg, 8, step=1))
    dist.barrier()  # start the logged step together, so a timeline shows the step, not a late rank
    with CommLog() as log, Trace(model) as trace:
        loss = model(x, y)
        after_forward = model.gathered_memory.current
        loss.backward()
    stats = model.memory_stats(opt)
    opt.step()
    opt.zero_grad()
    units = {u.label: sum(h.nbytes for h in u.handles) for u in model.units}
    return LoggedStep(log.records, trace.spans, trace.memory, after_forward, stats, units)
