"""Shard groups and replica groups: the one idea that spans every strategy.

Lay the ranks out as a grid of `replicas x shard_size` (ranks of one node side by side):

    world 4, shard_size 2        shard groups (rows):  [0, 1]  [2, 3]   -- AllGather, ReduceScatter
         0  1                    replica groups (cols): [0, 2]  [1, 3]  -- AllReduce of a gradient shard
         2  3

Each rank holds shard `shard_rank` of every unit, the same shard as the other ranks of its column.
Every strategy is a choice of `shard_size` (`fsdp_mini.strategy.shard_group_size`): FULL_SHARD and SHARD_GRAD_OP shard over the whole world
(one row, no replication), NO_SHARD over one rank (one column: plain DDP, whose AllReduce is the
replica AllReduce), and the hybrids over one node.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

__all__ = ["Groups", "grid", "make_groups"]


@dataclass(frozen=True)
class Groups:
    """This rank's place in the grid. A group of size 1 is None: nothing to communicate."""

    shard: object | None
    shard_size: int
    shard_rank: int
    replica: object | None
    replicas: int


def grid(world_size: int, shard_size: int) -> tuple[list[list[int]], list[list[int]]]:
    """(shard groups, replica groups) as lists of global ranks: rows and columns of the grid."""
    if shard_size < 1 or world_size % shard_size:
        raise ValueError(f"shard_size={shard_size} must be a positive divisor of the world size {world_size}")
    rows = [list(range(r, r + shard_size)) for r in range(0, world_size, shard_size)]
    cols = [list(range(c, world_size, shard_size)) for c in range(shard_size)]
    return rows, cols


def make_groups(size: int) -> Groups:
    """Create this rank's shard and replica process groups for shard groups of `size` ranks (from
    `fsdp_mini.strategy.shard_group_size`); collective: every rank must call it, in the same order."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % size:
        raise ValueError(f"shard groups of {size} ranks do not tile a world of {world}")
    rows, cols = grid(world, size)

    def pick(lists):
        if len(lists[0]) == 1:
            return None
        if len(lists[0]) == world:
            return dist.group.WORLD
        mine = None
        for ranks in lists:  # new_group is collective: every rank creates every group
            pg = dist.new_group(ranks)
            if rank in ranks:
                mine = pg
        return mine

    return Groups(shard=pick(rows), shard_size=size, shard_rank=rank % size,
                  replica=pick(cols), replicas=world // size)
