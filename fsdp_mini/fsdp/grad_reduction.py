"""A gradient reduction in flight, in both designs: ReduceScatter, then AllReduce across replicas.

After a unit's backward its unsharded gradient is reduce-scattered into this rank's gradient shard
(async). Once that is done the unsharded gradient is freed and, with replicas (hybrid sharding), the shard
is averaged across them, again async; the engine waits for it at the end of backward. Splitting the two
steps lets the engines free each unsharded gradient as soon as the next unit's gradients are ready, so at
most two units' unsharded gradients are alive at a time. `ReductionQueue` holds the units (flat handles
or per-parameter groups) whose reduction is in flight, in the order backward started them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fsdp_mini import collectives as C
from fsdp_mini.collective_calls import scope
from fsdp_mini.fsdp.states import ReduceStage

__all__ = ["GradReduction", "ReductionQueue"]


@dataclass
class GradReduction:
    """One ReduceScatter's record: its stage, the work to wait for (None if there is none), the gradient
    shard it writes (`output`), the unsharded gradient it reads (`input`, None once freed), and, in the
    per-parameter design, the parameters it covers."""

    stage: ReduceStage
    work: object
    output: torch.Tensor
    input: torch.Tensor | None
    params: list = field(default_factory=list)

    def finish_scatter(self) -> bool:
        """Wait for the ReduceScatter and free its input. False if it was finished already."""
        if self.stage is not ReduceStage.SCATTERING:
            return False
        if self.work is not None:
            self.work.wait()
        self.work, self.input, self.stage = None, None, ReduceStage.ACROSS_REPLICAS
        return True

    def start_replica_reduce(self, group, op, label: str, impl: str) -> None:
        """Start the AllReduce of the gradient shard across the replica group (async)."""
        with scope(label):
            self.work = C.all_reduce(self.output, op, group=group, async_op=True, impl=impl)

    def wait(self) -> torch.Tensor:
        """Wait for the replica AllReduce, if one was started (after `finish_scatter`); the reduced shard."""
        assert self.stage is ReduceStage.ACROSS_REPLICAS, "finish_scatter() first"
        if self.work is not None:
            self.work.wait()
            self.work = None
        return self.output


@dataclass
class ReductionQueue:
    """The units whose gradient reduction is in flight, in the order backward started them; one per
    engine (the flat `FSDP`) or per root (`fully_shard`, shared by every unit under it: FSDP2's
    `FSDPCommContext` plays this part). A unit is anything with `start_replica_reduce()` and
    `wait_for_grad_reduction()`: a `FlatParamHandle` or an `FSDPParamGroup`.

    When a unit's ReduceScatter is issued, the previous one's is done by now: `add` starts its replica
    AllReduce (and frees its input). At the end of backward nothing is left to overlap with: `add_at_end`
    queues a unit without that, and `wait_all` starts and waits for each in order."""

    units: list = field(default_factory=list)

    def __contains__(self, unit) -> bool:
        return any(u is unit for u in self.units)

    def add(self, unit) -> None:
        if self.units:
            self.units[-1].start_replica_reduce()
        self.units.append(unit)

    def add_at_end(self, unit) -> None:
        self.units.append(unit)

    def wait_all(self) -> None:
        for unit in self.units:
            unit.wait_for_grad_reduction()
        self.units = []

    def clear(self) -> None:
        """Forget the units (after `reset_iter_state`, which finished their work itself)."""
        self.units = []
