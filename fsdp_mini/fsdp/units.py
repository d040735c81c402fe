"""What the two FSDP designs say the same way about their units: a unit's label, its life in a step, and the
order units run in.

A unit (a flat `FSDPUnit`, a per-parameter `FSDPParamGroup`) is labelled by its module's path from the
root, and the root's unit "root" (`unit_label`): CommLog scopes, memory events, plots and errors show
that label, whichever design ran.

`UnitLifecycle` is a unit's life in a step, one for both designs, with FSDP2's method names
(`_fsdp_param_group.py`): `pre_forward`, `post_forward`, `pre_backward` make every training-state
transition, gather, prefetch, wait and choose whether to reshard. A design's unit keeps the parameters in
its own storage layout (flat `FSDPUnit` over `FlatParamHandle`s, per-parameter `FSDPParamGroup` over
`FSDPParam`s) and gives the lifecycle three storage operations: `unshard(async_op)`, `wait_for_unshard()`,
`reshard()`. The module hooks (`FSDP`, `FSDPState`) only decide which units and call them, as FSDP2's state
only dispatches.

Prefetch needs the unit that comes next; both designs know it by one rule each way, FSDP1's and FSDP2's
(`_exec_order_utils.py`, `_fsdp_state.py`):

    forward    the order units first ran in (`ExecutionOrder`: a unit joins the first time it runs, a unit
               skipped so far joins late, after the others); the next unit is the one that first ran after
               this one (`after`)
    backward   this step's post-forward order (every forward a backward can follow, a unit once per call):
               backward reaches units in reverse, so the next one is the unit whose forward ended just before
               this unit's latest (`UnitLifecycle.post_forward_indices`, `_backward_prefetch`). The root's forward
               ends last: backward prefetches the last block as soon as it starts
"""
from __future__ import annotations

from dataclasses import dataclass, field

from fsdp_mini.fsdp.states import TrainingState

__all__ = ["ROOT_LABEL", "unit_label", "UnitLifecycle", "ExecutionOrder"]

ROOT_LABEL = "root"


def unit_label(path: str) -> str:
    """How a unit is labelled in CommLog scopes, memory events and plots: its path, or "root"."""
    return path or ROOT_LABEL


class UnitLifecycle:
    """A unit's life in one step (see the module doc). A subclass sets `label`, `is_root`,
    `reshard_after_forward`, `training_state` (IDLE) and `post_forward_indices` ([]) and implements the
    three storage operations."""

    label: str
    is_root: bool
    reshard_after_forward: bool  # after forward: free the gathered parameters (True) or keep them for backward
    training_state: TrainingState
    post_forward_indices: list[int]  # where this unit's post-forwards are in the step's post-forward order

    def unshard(self, async_op: bool = False) -> None:
        raise NotImplementedError

    def wait_for_unshard(self) -> None:
        raise NotImplementedError

    def reshard(self) -> None:
        raise NotImplementedError

    def pre_forward(self, prefetch: list["UnitLifecycle"]) -> None:
        """Gather the unit for its forward (waiting for it if prefetched), issuing the AllGathers of
        `prefetch` (the units that run next) right after its own, so that they overlap this unit's compute."""
        self.training_state = TrainingState.FORWARD
        self.unshard(async_op=True)
        for other in prefetch:
            other.unshard(async_op=True)
        self.wait_for_unshard()

    def post_forward(self, post_forward_order: list["UnitLifecycle"] | None, backward_follows: bool) -> None:
        """The unit's forward is over: free its parameters, or keep them for backward
        (`reshard_after_forward` False: SHARD_GRAD_OP, the root); record it in the step's
        `post_forward_order` (None: not recorded), which backward's prefetch reads.
        A forward that no backward can follow (`backward_follows` False: under no_grad, or no output needs a
        gradient, as in evaluation or a registered `generate()`) frees the unit whatever
        `reshard_after_forward` says (nothing else would) and is not recorded (backward will not reach the
        unit: prefetching it would gather it for nothing). FSDP2 keeps a unit kept after forward (the root,
        by default) even then (pytorch#131965), and until the next backward the module's parameters are the gathered copies: an
        optimizer made then, `AdamW(model.parameters())` after an evaluation pass, steps tensors that the next
        reshard discards, and the model never trains; the price of freeing is one AllGather more at the next
        forward. A call that wraps another (a registered `generate` that calls forward) finds the unit out of
        FORWARD when it ends (the inner call ended it) and frees it too, as FSDP2 does (FSDPParamGroup.reshard,
        _fsdp_param_group.py)."""
        ends_forward = self.training_state is TrainingState.FORWARD
        self.training_state = TrainingState.IDLE
        if self.reshard_after_forward or not ends_forward or not backward_follows:
            self.reshard()
        else:
            self.keep_after_forward()
        if post_forward_order is not None and backward_follows:
            self.post_forward_indices.append(len(post_forward_order))
            post_forward_order.append(self)

    def keep_after_forward(self) -> None:
        """What a unit kept after forward keeps: all of its gathered parameters (the per-parameter design
        may keep a 1/k share instead: `FSDPParamGroup.keep_after_forward`)."""

    def pre_backward(self, post_forward_order: list["UnitLifecycle"],
                     prefetch: list["UnitLifecycle"] | None = None) -> None:
        """Backward has reached the unit's outputs: gather it again (if it was freed), issue the AllGathers
        of the units backward reaches next (`prefetch`, or by default `_backward_prefetch`), wait. Once per
        backward: the unit's other outputs find it in PRE_BACKWARD already."""
        if self.training_state is TrainingState.PRE_BACKWARD:
            return
        self.training_state = TrainingState.PRE_BACKWARD
        self.unshard(async_op=True)
        for other in (prefetch if prefetch is not None else self._backward_prefetch(post_forward_order)):
            other.prefetch_in_backward()
        self.wait_for_unshard()

    def _backward_prefetch(self, post_forward_order: list["UnitLifecycle"]) -> list["UnitLifecycle"]:
        """The unit whose post-forward came just before this unit's latest one in this step; each backward
        reaching the unit takes one of its post-forwards off (`post_forward_indices`). A unit run standalone
        after the others' backward (a chunked loss head, called again once the previous chunk's backward
        ended) finds no earlier post-forward: nothing."""
        if not self.post_forward_indices:
            return []
        i = self.post_forward_indices.pop()
        return [post_forward_order[i - 1]] if i > 0 else []

    def prefetch_in_backward(self) -> None:
        """Issue this unit's AllGather ahead of its backward (another unit's pre-backward asks)."""
        self.unshard(async_op=True)


@dataclass
class ExecutionOrder:
    """The units in the order they first ran, root first (forward prefetch: see the module doc)."""

    units: list = field(default_factory=list)

    def __iter__(self):
        return iter(self.units)

    def __contains__(self, unit) -> bool:
        return any(u is unit for u in self.units)

    def join(self, unit) -> None:
        """`unit` is running: add it at the end if it never ran before (a unit skipped so far joins late)."""
        if unit not in self:
            self.units.append(unit)

    def after(self, unit) -> list:
        """The units that first ran after `unit` did, in order."""
        i = next(i for i, u in enumerate(self.units) if u is unit)
        return self.units[i + 1:]
