"""Record the AllGathers and ReduceScatters PyTorch's FSDP2 issues, for tests that compare it with fsdp_mini.

FSDP2 calls `dist.all_gather_single` / `dist.reduce_scatter_single` by attribute at call time
(torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:119 and :184), so patching them inside a rank
sees every one of its collectives. A helper module, not a test: the library's differential suite and the
course's claims tests both use it.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist


class Call(NamedTuple):
    """One FSDP2 collective: which, the dtype and element count of its input, and its group's size."""

    op: str  # "all_gather" or "reduce_scatter"
    dtype: torch.dtype
    numel: int
    group_size: int


class FSDP2Calls:
    """`with FSDP2Calls() as log: ...` then `log.calls` (every Call, in order) or `log.ops("all_gather")`."""

    def __init__(self):
        self.calls: list[Call] = []

    def __enter__(self):
        self._saved = dist.all_gather_single, dist.reduce_scatter_single

        def record(op, original):
            def call(output, input, *args, **kwargs):
                group = kwargs.get("group", args[0] if args else None)
                self.calls.append(Call(op, input.dtype, input.numel(), dist.get_world_size(group)))
                return original(output, input, *args, **kwargs)
            return call

        dist.all_gather_single = record("all_gather", self._saved[0])
        dist.reduce_scatter_single = record("reduce_scatter", self._saved[1])
        return self

    def __exit__(self, *exc):
        dist.all_gather_single, dist.reduce_scatter_single = self._saved

    def ops(self, op: str) -> list[Call]:
        return [c for c in self.calls if c.op == op]
