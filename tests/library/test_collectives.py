"""The hand-written ring collectives equal torch.distributed's builtins, on worlds of 1-4 and subgroups."""
import pytest
import torch
import torch.distributed as dist

from fsdp_mini import collectives as C
from fsdp_mini import CommLog, launch
from launch_cases import run_cases
from subgroups import REPLICA_GROUPS, SHARD_GROUPS, own_group

pytestmark = pytest.mark.usefixtures("no_orphans")

SIZES = (1, 2, 5, 7, 1000, 1_048_583)  # awkward: primes, smaller than the world, > one 4 MiB piece


def _values(numel, gen, integer):
    if integer:  # integer-valued floats: every summation order gives the same bits
        return torch.randint(-1000, 1000, (numel,), generator=gen).float()
    return torch.randn(numel, generator=gen)


def _compare_all(group_ranks=None):
    """On each rank: every ring op vs its builtin; returns the list of mismatches (empty is good)."""
    group = own_group(group_ranks)
    n = dist.get_world_size(group)
    gen = torch.Generator().manual_seed(1234 + dist.get_rank())
    bad = []

    def check(name, ours, ref, integer):
        same = torch.equal(ours, ref) if integer else torch.allclose(ours, ref, rtol=1e-5, atol=1e-5)
        if not same:
            bad.append(name)

    for integer in (True, False):
        for numel in SIZES:
            key = f"{numel}{'i' if integer else 'f'}"
            x = _values(numel, gen, integer)
            ref = x.clone()
            dist.all_reduce(ref, group=group)
            for op in (C.SUM, C.AVG):
                expect = ref if op == C.SUM else ref / n
                a = x.clone()
                C.ring_all_reduce(a, op=op, group=group)
                check(f"ring_all_reduce {op} {key}", a, expect, integer and op == C.SUM)
            m = x.repeat(3).view(3, -1).t()  # not contiguous: all_reduce copies in and out
            C.ring_all_reduce(m, group=group)
            check(f"ring_all_reduce non-contiguous {key}", m, ref.repeat(3).view(3, -1).t(), integer)

            big = _values(n * numel, gen, integer)
            for op in (C.SUM, C.AVG):
                ours, theirs = torch.empty(numel), torch.empty(numel)
                C.ring_reduce_scatter(ours, big, op=op, group=group)
                dist.reduce_scatter_tensor(theirs, big, op=op, group=group)
                check(f"ring_reduce_scatter {op} {key}", ours, theirs, integer and op == C.SUM)
            ours, theirs = torch.empty(n * numel), torch.empty(n * numel)
            handle = C.ring_all_gather(ours, x, group=group, async_op=True)
            dist.all_gather_into_tensor(theirs, x, group=group)
            handle.wait()
            check(f"ring_all_gather {key}", ours, theirs, True)  # a copy: always bit-exact
    return bad


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_ring_ops_equal_builtins(world_size):
    assert launch(_compare_all, world_size, timeout=120) == [[]] * world_size


def test_ring_ops_on_subgroups():
    # 2x2: shard groups {0,1},{2,3} as hybrid sharding uses them, and replica groups {0,2},{1,3}.
    runs = run_cases(_compare_all, (SHARD_GROUPS, REPLICA_GROUPS), 4, timeout=120)  # both layouts, one launch
    assert runs[SHARD_GROUPS] == [[]] * 4
    assert runs[REPLICA_GROUPS] == [[]] * 4


def _async_in_order():
    """Several async ring ops in flight at once complete correctly, in issue order."""
    n = dist.get_world_size()
    tensors = [torch.full((1001,), float(dist.get_rank() + i)) for i in range(4)]
    handles = [C.ring_all_reduce(t, async_op=True) for t in tensors]
    for h in handles:
        h.wait()
    return [t[0].item() for t in tensors] == [sum(range(n)) + n * i for i in range(4)]


def test_async_ops_overlap_and_complete():
    assert launch(_async_in_order, 3) == [True] * 3


def _wrappers_dispatch():
    n, out = dist.get_world_size(), []
    for impl in C.IMPLS:
        t = torch.ones(6) * (dist.get_rank() + 1)
        C.all_reduce(t, op=C.AVG, impl=impl)
        rs = torch.empty(2)
        C.reduce_scatter_tensor(rs, torch.arange(2.0 * n), impl=impl)
        ag = torch.empty(2 * n)
        C.all_gather_into_tensor(ag, torch.full((2,), float(dist.get_rank())), impl=impl)
        out.append((t.tolist(), rs.tolist(), ag.tolist()))
    return out


def test_wrappers_give_the_same_results_for_both_impls():
    results = launch(_wrappers_dispatch, 2)
    for builtin, ring in results:
        assert builtin == ring
    assert results[0][0] == ([1.5] * 6, [0.0, 2.0], [0.0, 0.0, 1.0, 1.0])


def _bad_shapes():
    errors = []
    for call in (lambda: C.ring_reduce_scatter(torch.empty(3), torch.empty(7)),
                 lambda: C.ring_all_gather(torch.empty(7), torch.empty(3)),
                 lambda: C.ring_all_reduce(torch.empty(3), op=dist.ReduceOp.PRODUCT),
                 lambda: C.all_reduce(torch.empty(3), impl="mpi")):
        try:
            call()
            errors.append("no error")
        except ValueError as exc:
            errors.append(str(exc))
    return errors


def test_bad_shapes_and_options_are_value_errors():
    errors = launch(_bad_shapes, 2)[0]
    assert "input has 7 elements, expected group size 2 x output's 3" in errors[0]
    assert "output has 7 elements, expected group size 2 x input's 3" in errors[1]
    assert "op must be ReduceOp.SUM or ReduceOp.AVG or ReduceOp.MAX" in errors[2]
    assert "impl must be one of ('builtin', 'ring')" in errors[3]


def _max_everywhere(world: int):
    """MAX through the ring and the builtin, on values whose maximum sits on different ranks."""
    rank = dist.get_rank()
    out = {}
    for size in (1, 5, 1000):
        x = torch.arange(size, dtype=torch.float32) * (-1) ** rank * (rank + 1)
        ring, builtin = x.clone(), x.clone()
        with CommLog() as log:
            C.all_reduce(ring, C.MAX, impl="ring")
            C.all_reduce(builtin, C.MAX)
        expected = torch.stack([torch.arange(size, dtype=torch.float32) * (-1) ** r * (r + 1)
                                for r in range(world)]).max(0).values
        out[size] = (torch.equal(ring, expected), torch.equal(builtin, expected), len(log.records))
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_max_all_reduce_ring_and_builtin_agree_and_are_logged(world):
    for size, (ring_ok, builtin_ok, logged) in launch(_max_everywhere, world, args=(world,))[0].items():
        assert ring_ok and builtin_ok and logged == 2, size
