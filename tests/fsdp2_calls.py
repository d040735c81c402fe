"""Record the AllGathers and ReduceScatters PyTorch's FSDP2 issues, for tests that compare it with fsdp_mini.

FSDP2 calls `dist.all_gather_single` / `dist.reduce_scatter_single` by attribute at call time
(torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:119 and :184 of the pinned torch), so patching
them inside a rank sees every one of its collectives. Releases without those names (pyproject allows
torch>=2.6) call `dist.all_gather_into_tensor` / `dist.reduce_scatter_tensor`, same signatures: `FSDP2_NAMES`
picks the pair the installed torch has. `FSDP2Calls(include_fsdp_mini=True)` also patches the names through
which `fsdp_mini.collectives` issues its builtin collectives, so both implementations land in one list,
in the order they were *issued* (CommLog appends a record when the collective completes), and `mark()`
notes where in that order something else happened (a module's backward starting, say). A helper module,
not a test: the library's differential suite and the course's claims tests both use it.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist


FSDP2_NAMES = (("all_gather_single", "reduce_scatter_single") if hasattr(dist, "all_gather_single")
               else ("all_gather_into_tensor", "reduce_scatter_tensor"))


class Call(NamedTuple):
    """One FSDP2 collective: which, the dtype and element count of its input, and its group's size."""

    op: str  # "all_gather" or "reduce_scatter"
    dtype: torch.dtype
    numel: int
    group_size: int
    reduce_op: str | None = None  # a ReduceScatter's reduction ("AVG", "SUM"); None for an AllGather


class FSDP2Calls:
    """`with FSDP2Calls() as log: ...` then `log.calls` (every Call, in order) or `log.ops("all_gather")`;
    `log.mark(name)` inside records how many calls were issued by then (`log.marks[name]`)."""

    def __init__(self, include_fsdp_mini: bool = False):
        self.calls: list[Call] = []
        self.marks: dict[str, int] = {}
        self.include_fsdp_mini = include_fsdp_mini

    def mark(self, name: str) -> None:
        """Note the number of collectives issued so far under `name` (the first time only)."""
        self.marks.setdefault(name, len(self.calls))

    def _record(self, op, original):
        def call(output, input, *args, **kwargs):
            group = kwargs.get("group", args[1] if op == "reduce_scatter" and len(args) > 1 else
                               args[0] if op == "all_gather" and args else None)
            reduce_op = None
            if op == "reduce_scatter":
                reduce_op = kwargs.get("op", args[0] if args else dist.ReduceOp.SUM)
                reduce_op = getattr(reduce_op, "name", str(reduce_op))
            self.calls.append(Call(op, input.dtype, input.numel(), dist.get_world_size(group), reduce_op))
            return original(output, input, *args, **kwargs)
        return call

    def __enter__(self):
        gather, scatter = FSDP2_NAMES
        self._saved = getattr(dist, gather), getattr(dist, scatter)
        setattr(dist, gather, self._record("all_gather", self._saved[0]))
        setattr(dist, scatter, self._record("reduce_scatter", self._saved[1]))
        if self.include_fsdp_mini:
            from fsdp_mini import collectives

            self._saved_mini = collectives.torch_all_gather_into_tensor, collectives.torch_reduce_scatter_tensor
            collectives.torch_all_gather_into_tensor = self._record("all_gather", self._saved_mini[0])
            collectives.torch_reduce_scatter_tensor = self._record("reduce_scatter", self._saved_mini[1])
        return self

    def __exit__(self, *exc):
        for name, original in zip(FSDP2_NAMES, self._saved):
            setattr(dist, name, original)
        if self.include_fsdp_mini:
            from fsdp_mini import collectives

            collectives.torch_all_gather_into_tensor, collectives.torch_reduce_scatter_tensor = self._saved_mini

    def ops(self, op: str) -> list[Call]:
        return [c for c in self.calls if c.op == op]


class AllReduces:
    """Count `dist.all_reduce` calls: both implementations issue the replica AllReduce through it, by attribute
    at call time (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py, foreach_reduce)."""

    def __enter__(self):
        self.count, self._saved = 0, dist.all_reduce

        def counted(*args, **kwargs):
            self.count += 1
            return self._saved(*args, **kwargs)
        dist.all_reduce = counted
        return self

    def __exit__(self, *exc):
        dist.all_reduce = self._saved
