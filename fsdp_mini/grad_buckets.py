"""NO_SHARD's gradient buckets: the units' flat gradients AllReduced together, as DDP's buckets are.

Under NO_SHARD nothing is sharded, so every unit's gradient needs one AllReduce over all ranks. One call
per unit pays the fixed cost of a collective once per unit and sends many small messages; on gloo that
made NO_SHARD 1.1-1.7x slower than PyTorch's DDP. DDP packs gradients into buckets of `bucket_cap_mb`
(25 MiB) instead, and AllReduces a bucket as soon as it is full while backward goes on. This does the
same with whole flat gradients: a unit joins the open bucket when backward has finished it (so buckets
fill in reverse order, as in DDP), a bucket is sent once it holds at least the cap, the last one at
the end of backward. A unit is never split across buckets.
"""
from __future__ import annotations

import torch

from fsdp_mini import collectives as C
from fsdp_mini.comm_log import scope

__all__ = ["GradBuckets"]


class GradBuckets:
    """Collect flat gradients, AllReduce (AVG) them in buckets of >= `cap_bytes`, hand each back."""

    def __init__(self, group, impl: str, cap_bytes: int):
        self.group, self.impl, self.cap_bytes = group, impl, cap_bytes
        self._open: list[tuple[object, torch.Tensor]] = []  # (handle, flat gradient)
        self._sent: list[tuple[object, torch.Tensor, list]] = []  # (work, buffer, handles)
        self._count = 0

    def add(self, handle, flat: torch.Tensor) -> None:
        """Put one unit's flat gradient into the open bucket; send the bucket once it is full."""
        if self._open and self._open[0][1].dtype != flat.dtype:  # one dtype per bucket
            self._send()
        self._open.append((handle, flat))
        if sum(f.numel() * f.element_size() for _, f in self._open) >= self.cap_bytes:
            self._send()

    def _send(self) -> None:
        if not self._open:
            return
        flats = [f for _, f in self._open]
        buffer = flats[0] if len(flats) == 1 else torch.cat(flats)
        work = None
        if self.group is not None:  # a world of one has nobody to average with
            with scope(f"grad bucket {self._count}"):
                work = C.all_reduce(buffer, C.AVG, group=self.group, async_op=True, impl=self.impl)
        self._sent.append((work, buffer, [h for h, _ in self._open]))
        self._open, self._count = [], self._count + 1

    def wait(self) -> None:
        """End of backward: send the last bucket, wait for every AllReduce, give each unit its slice."""
        self._send()
        for work, buffer, handles in self._sent:
            if work is not None:
                work.wait()
            for handle, piece in zip(handles, buffer.split([h.layout.padded_numel for h in handles])):
                handle.accumulate_grad(piece)
        self._sent, self._count = [], 0
