"""Shard groups and replica groups: the one idea that spans every strategy.

Lay the ranks out as a grid of `replicas x shard_size` (ranks of one node side by side):

    world 4, shard_size 2        shard groups (rows):  [0, 1]  [2, 3]   -- AllGather, ReduceScatter
         0  1                    replica groups (cols): [0, 2]  [1, 3]  -- AllReduce of a gradient shard
         2  3

Each rank holds shard `shard_rank` of every unit, the same shard as the other ranks of its column.
Every strategy is a choice of `shard_size` (`fsdp_mini.fsdp.strategy.shard_group_size`): FULL_SHARD and SHARD_GRAD_OP shard over the whole world
(one row, no replication), NO_SHARD over one rank (one column: plain DDP, whose AllReduce is the
replica AllReduce), and the hybrids over one node.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from fsdp_mini.fsdp.strategy import check_shard_size

__all__ = ["MeshInfo", "grid", "make_groups"]


@dataclass(frozen=True)
class MeshInfo:
    """This rank's place in the grid, for both designs, in PyTorch's names (`FSDPMeshInfo` /
    `HSDPMeshInfo`, torch/distributed/fsdp/_fully_shard/_fsdp_common.py): the shard group (a row) and the
    replicate group (a column). A group of one rank is None: nothing to communicate. `mesh` is the
    DeviceMesh it was read from (`from_mesh`, the per-parameter design), None for groups built from a
    shard size (`make_groups`, the flat design)."""

    shard_process_group: object | None
    shard_mesh_size: int
    shard_mesh_rank: int
    replicate_process_group: object | None
    replicate_mesh_size: int
    mesh: object | None = None

    @classmethod
    def from_mesh(cls, mesh) -> "MeshInfo":
        """A 1-D mesh shards over its one dimension; a 2-D (replicate, shard) mesh is HSDP's."""
        shard_size, shard_rank = mesh.size(mesh.ndim - 1), mesh.get_local_rank(mesh.ndim - 1)
        replicas = mesh.size(0) if mesh.ndim == 2 else 1
        return cls(mesh.get_group(mesh.ndim - 1) if shard_size > 1 else None, shard_size, shard_rank,
                   mesh.get_group(0) if replicas > 1 else None, replicas, mesh)


def grid(world_size: int, shard_size: int) -> tuple[list[list[int]], list[list[int]]]:
    """(shard groups, replica groups) as lists of global ranks: rows and columns of the grid."""
    check_shard_size(shard_size, world_size)
    rows = [list(range(r, r + shard_size)) for r in range(0, world_size, shard_size)]
    cols = [list(range(c, world_size, shard_size)) for c in range(shard_size)]
    return rows, cols


def make_groups(size: int) -> MeshInfo:
    """Create this rank's shard and replica process groups for shard groups of `size` ranks (from
    `fsdp_mini.fsdp.strategy.shard_group_size`); collective: every rank must call it, in the same order."""
    world, rank = dist.get_world_size(), dist.get_rank()
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

    return MeshInfo(shard_process_group=pick(rows), shard_mesh_size=size, shard_mesh_rank=rank % size,
                    replicate_process_group=pick(cols), replicate_mesh_size=world // size)
