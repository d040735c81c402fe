"""What the two FSDP designs say the same way about their units: a unit's label and the order units run in.

A unit (a flat `FSDPUnit`, a per-parameter `FSDPParamGroup`) is labelled by its module's path from the
root, and the root's unit "root" (`unit_label`): CommLog scopes, memory events, plots and errors show
that label, whichever design ran.

`ExecutionOrder` is the order units ran in, learnt as they run, so that the unit that comes next can be
gathered early (prefetch). Each design learns it its own way, after its PyTorch model:

    replay (flat `FSDP`, FSDP1's `_ExecOrderData`)   the first pass records every unit it reaches, in
        order (a unit run twice, twice: `reached`); `end_recording` closes it, and later passes count
        their position in it: the unit after this position is the next one
    first runs (`fully_shard`)   a unit joins the first time it runs, whenever that is (`join`: a unit
        skipped so far joins late, after the others); the next unit is the one after it (`after`)
"""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ROOT_LABEL", "unit_label", "ExecutionOrder"]

ROOT_LABEL = "root"


def unit_label(path: str) -> str:
    """How a unit is labelled in CommLog scopes, memory events and plots: its path, or "root"."""
    return path or ROOT_LABEL


@dataclass
class ExecutionOrder:
    """The units in the order they ran in one pass (forward, or backward), root first in forward."""

    units: list = field(default_factory=list)
    recording: bool = True
    position: int = 0  # replay: how many units this pass has reached

    def __iter__(self):
        return iter(self.units)

    def __contains__(self, unit) -> bool:
        return any(u is unit for u in self.units)

    # --- replay (the flat design) --------------------------------------------------------------------

    def start_pass(self) -> None:
        self.position = 0

    def end_recording(self) -> None:
        self.recording = False

    def reached(self, unit):
        """`unit` is running now: record it (first pass), or return the unit that runs after it."""
        i, self.position = self.position, self.position + 1
        if self.recording:
            self.units.append(unit)
            return None
        return self.units[i + 1] if i + 1 < len(self.units) else None

    # --- first runs (the per-parameter design) -------------------------------------------------------

    def join(self, unit) -> None:
        """`unit` is running: add it at the end if it never ran before (a unit skipped so far joins late)."""
        if unit not in self:
            self.units.append(unit)

    def after(self, unit) -> list:
        """The units that first ran after `unit` did, in order."""
        i = next(i for i, u in enumerate(self.units) if u is unit)
        return self.units[i + 1:]
