"""Shard and replica groups: the strategy -> shard_size rule, the grid of ranks, and real process groups."""
from __future__ import annotations

import re

import pytest
import torch
import torch.distributed as dist

from fsdp_mini.fsdp.groups import MeshInfo, grid, make_groups
from fsdp_mini.run import launch
from fsdp_mini.fsdp.strategy import shard_group_size
from fsdp_mini.fsdp.strategy import ShardingStrategy, is_hybrid

S = ShardingStrategy
HYBRIDS = [m for m in S if is_hybrid(m)]
NON_HYBRIDS = [m for m in S if not is_hybrid(m)]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# --- shard_group_size--------------------------------------------------------------------------


def test_hybrids_are_the_two_hybrid_strategies():
    assert set(HYBRIDS) == {S.HYBRID_SHARD, S._HYBRID_SHARD_ZERO2}


@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_no_shard_is_one_rank_per_shard_group(world, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # ignored: only the hybrids read it
    assert shard_group_size(S.NO_SHARD, world, None) == 1


@pytest.mark.parametrize("strategy", [S.FULL_SHARD, S.SHARD_GRAD_OP])
@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_full_and_grad_op_shard_over_the_world(strategy, world, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # ignored: only the hybrids read it
    assert shard_group_size(strategy, world, None) == world


@pytest.mark.parametrize("strategy", HYBRIDS)
@pytest.mark.parametrize("world", [1, 2, 4, 6, 8])
def test_hybrid_uses_the_given_shard_size(strategy, world, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # an explicit shard_size wins over the environment
    for size in _divisors(world):
        assert shard_group_size(strategy, world, size) == size


@pytest.mark.parametrize("strategy", HYBRIDS)
@pytest.mark.parametrize("world", [2, 4, 6, 8])
def test_hybrid_defaults_to_local_world_size(strategy, world, monkeypatch):
    for size in _divisors(world):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(size))
        assert shard_group_size(strategy, world, None) == size


@pytest.mark.parametrize("strategy", HYBRIDS)
@pytest.mark.parametrize("world", [1, 3, 8])
def test_hybrid_without_local_world_size_shards_over_the_world(strategy, world, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert shard_group_size(strategy, world, None) == world


@pytest.mark.parametrize("strategy", HYBRIDS)
def test_hybrid_rejects_a_local_world_size_that_does_not_divide(strategy, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    with pytest.raises(ValueError, match="positive divisor of the world size 4"):
        shard_group_size(strategy, 4, None)


@pytest.mark.parametrize("strategy", NON_HYBRIDS)
@pytest.mark.parametrize("size", [1, 2, 4])
def test_shard_size_is_rejected_for_non_hybrids(strategy, size):
    with pytest.raises(ValueError, match=f"hybrid strategies only, not to {strategy.name}"):
        shard_group_size(strategy, 4, size)


@pytest.mark.parametrize("strategy", HYBRIDS)
@pytest.mark.parametrize("world, size", [(4, 3), (6, 4), (4, 8), (5, 2), (4, 0), (4, -1), (4, -2),
                                         (4, 2.0), (4, "2"), (4, 1.5)])
def test_hybrid_rejects_bad_shard_sizes(strategy, world, size, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match=re.escape(f"shard_size={size!r} must be a positive divisor of the world size {world}")):
        shard_group_size(strategy, world, size)


# --- grid -------------------------------------------------------------------------------------


WORLD_AND_SIZE = [(w, s) for w in range(1, 9) for s in _divisors(w)]


@pytest.mark.parametrize("world, size", WORLD_AND_SIZE)
def test_grid_rows_and_columns_partition_the_ranks(world, size):
    rows, cols = grid(world, size)
    assert len(rows) == world // size and all(len(r) == size for r in rows)
    assert len(cols) == size and all(len(c) == world // size for c in cols)
    for lists in (rows, cols):
        flat = [r for group in lists for r in group]
        assert sorted(flat) == list(range(world))  # every rank exactly once
        assert all(group == sorted(group) for group in lists)
    for r in range(world):
        assert r in rows[r // size] and r in cols[r % size]
        # a row and a column meet in exactly one rank: the grid has no duplicated cell
        assert set(rows[r // size]) & set(cols[r % size]) == {r}
    # rows are contiguous ranks (one node side by side); columns step by the row length
    assert all(row == list(range(row[0], row[0] + size)) for row in rows)
    assert all(col == list(range(col[0], world, size)) for col in cols)


# --- make_groups with real process groups -------------------------------------------------------


def _describe(pg, rank):
    """What this rank sees of one of its groups, and the sum of the members' ranks over it."""
    if pg is None:
        return None
    total = torch.tensor([rank], dtype=torch.int64)
    dist.all_reduce(total, group=pg)
    return {
        "size": dist.get_world_size(pg),
        "ranks": sorted(dist.get_process_group_ranks(pg)),
        "group_rank": dist.get_rank(pg),
        "sum": int(total.item()),
    }


def _make_groups_worker(size):
    rank = dist.get_rank()
    g = make_groups(size)
    assert isinstance(g, MeshInfo)
    # every rank calls the collectives in the same order: shard group first, then replica group
    return {
        "rank": rank,
        "shard_size": g.shard_mesh_size,
        "shard_rank": g.shard_mesh_rank,
        "replicas": g.replicate_mesh_size,
        "shard": _describe(g.shard_process_group, rank),
        "replica": _describe(g.replicate_process_group, rank),
    }


def _expected_group(members, rank):
    if len(members) == 1:
        return None
    return {"size": len(members), "ranks": members, "group_rank": members.index(rank), "sum": sum(members)}


@pytest.mark.usefixtures("no_orphans")
@pytest.mark.parametrize("world, size", [(4, 2), (4, 1), (4, 4), (1, 1), (6, 2), (6, 3)])
def test_make_groups_builds_the_grid(world, size):
    results = launch(_make_groups_worker, world, args=(size,), timeout=60)
    for rank, got in enumerate(results):
        # derived without grid(): row = ranks with the same rank // size, column = the same rank % size
        row = [q for q in range(world) if q // size == rank // size]
        col = [q for q in range(world) if q % size == rank % size]
        assert got["rank"] == rank
        assert got["shard_size"] == size and got["replicas"] == world // size
        assert got["shard_rank"] == rank % size == row.index(rank)
        assert got["shard"] == _expected_group(row, rank), rank
        assert got["replica"] == _expected_group(col, rank), rank
