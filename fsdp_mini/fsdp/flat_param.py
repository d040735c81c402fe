"""Flatten a unit's parameters into one buffer, pad it, and cut it into equal shards.

This is the bookkeeping at the heart of FSDP, and it is pure tensor logic (no torch.distributed), so it
can be read and tested on its own. Why one flat buffer per unit instead of one collective per
parameter: a unit of a transformer holds a dozen tensors, some tiny (LayerNorm biases), and every
collective pays a fixed latency; one AllGather of the whole unit pays it once.

Layout of one unit's flat buffer, `n` shards, each rank keeping shard `rank`:

    | p0 (numel 6) | p1 (numel 3) | pad |        padded_numel = ceil(9 / n) * n
    |<-- shard 0 -->|<-- shard 1 -->|            n = 2: shard_numel = 5, one element of padding

A shard may end inside a parameter, so a rank's shard holds *pieces* of parameters; `pieces(rank)`
says which. The padding is zero, receives zero gradient and is never read by any parameter view.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["ParamSlot", "Piece", "FlatLayout", "flatten", "unflatten_views"]


@dataclass(frozen=True)
class ParamSlot:
    """One parameter's slot in a flat buffer. `names` are its fully qualified names, more than one when the
    same tensor is tied under several names (embedding = head); the first one owns it in checkpoints.
    (FSDP1 keeps shapes and offsets on the `FlatParameter`, `_shapes` / `_numels`; its `ParamInfo` is
    another thing: name, module, module name.)"""

    names: tuple[str, ...]
    shape: torch.Size
    offset: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Piece:
    """The part of parameter `param` that lies in one shard: elements [start, end) of the flattened
    parameter, found at `shard_offset` inside that shard."""

    param: ParamSlot
    start: int
    end: int
    shard_offset: int

    @property
    def numel(self) -> int:
        return self.end - self.start


class FlatLayout:
    """Where each parameter sits in the flat buffer, and which slice of it each of `n` shards holds."""

    def __init__(self, names: list[tuple[str, ...]], shapes: list[torch.Size], n: int):
        if n < 1:
            raise ValueError(f"the number of shards must be >= 1, got {n}")
        if len(names) != len(shapes) or not names:
            raise ValueError("a flat buffer needs at least one parameter, and one shape per name")
        self.n = n
        self.params: list[ParamSlot] = []
        offset = 0
        for name, shape in zip(names, shapes):
            info = ParamSlot((name,) if isinstance(name, str) else tuple(name), torch.Size(shape), offset)
            self.params.append(info)
            offset += info.numel
        self.numel = offset
        self.shard_numel = max(1, math.ceil(self.numel / n))
        self.padded_numel = self.shard_numel * n

    @property
    def padding(self) -> int:
        return self.padded_numel - self.numel

    def shard_range(self, rank: int) -> tuple[int, int]:
        """[start, end) of shard `rank` in the padded flat buffer."""
        if not 0 <= rank < self.n:
            raise ValueError(f"shard rank {rank} out of range for {self.n} shards")
        return rank * self.shard_numel, (rank + 1) * self.shard_numel

    def pieces(self, rank: int) -> list[Piece]:
        """The pieces of parameters that shard `rank` holds, in order (empty for a padding-only shard)."""
        lo, hi = self.shard_range(rank)
        out = []
        for p in self.params:
            start, end = max(lo, p.offset), min(hi, p.offset + p.numel)
            if start < end:
                out.append(Piece(p, start - p.offset, end - p.offset, start - lo))
        return out

    def signature(self) -> tuple:
        """What must agree across ranks for their shards to fit together."""
        return self.n, tuple((p.names, tuple(p.shape)) for p in self.params)

    def __repr__(self) -> str:
        return (f"FlatLayout({len(self.params)} params, numel={self.numel}, n={self.n}, "
                f"shard_numel={self.shard_numel}, padding={self.padding})")


def flatten(tensors: list[torch.Tensor | None], layout: FlatLayout, dtype=None, device=None) -> torch.Tensor:
    """Concatenate `tensors` (one per parameter, None meaning zeros) into a zero-padded flat buffer of
    `layout.padded_numel` elements: the layout of both the gathered parameters and their gradients."""
    if len(tensors) != len(layout.params):
        raise ValueError(f"expected {len(layout.params)} tensors for this layout, got {len(tensors)}")
    like = next((t for t in tensors if t is not None), None)
    dtype = dtype or (like.dtype if like is not None else torch.float32)
    device = device or (like.device if like is not None else "cpu")
    flat = torch.zeros(layout.padded_numel, dtype=dtype, device=device)
    for info, t in zip(layout.params, tensors):
        if t is not None:
            if t.shape != info.shape:
                raise ValueError(f"{info.names[0]}: expected shape {tuple(info.shape)}, got {tuple(t.shape)}")
            flat[info.offset:info.offset + info.numel].copy_(t.reshape(-1))
    return flat


def unflatten_views(flat: torch.Tensor, layout: FlatLayout) -> list[torch.Tensor]:
    """Views of `flat` shaped like each parameter: no copy, they share the flat buffer's storage."""
    if flat.numel() < layout.numel:
        raise ValueError(f"flat buffer has {flat.numel()} elements, layout needs {layout.numel}")
    return [flat[p.offset:p.offset + p.numel].view(p.shape) for p in layout.params]
