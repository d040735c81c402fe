"""The course's naive all-reduce (through rank 0, lesson 01's baseline): the builtin's result on worlds of
1-4 and on subgroups, and the bytes CommLog counts and the flight recorder's entry, as for the library's own."""
import pytest
import torch
import torch.distributed as dist

from fsdp_mini import CommLog, launch, scope
from fsdp_mini.collectives import AVG, MAX, SUM
from fsdp_mini.course.naive_collectives import naive_all_reduce
from fsdp_mini.flight_recorder import RECORDER
from launch_cases import run_cases
from subgroups import REPLICA_GROUPS, SHARD_GROUPS, own_group

pytestmark = pytest.mark.usefixtures("no_orphans")

SIZES = (1, 2, 7, 1000)


def _compare(group_ranks=None):
    """On each rank: mismatches with dist.all_reduce (empty is good), SUM and AVG, integer-valued floats."""
    group = own_group(group_ranks)
    n = dist.get_world_size(group)
    gen = torch.Generator().manual_seed(99 + dist.get_rank())
    bad = []
    for numel in SIZES:
        x = torch.randint(-1000, 1000, (numel,), generator=gen).float()  # every summation order: the same bits
        ref = x.clone()
        dist.all_reduce(ref, group=group)
        for op, expect in ((SUM, ref), (AVG, ref / n)):
            ours = x.clone()
            naive_all_reduce(ours, op=op, group=group)
            if not torch.allclose(ours, expect, rtol=0, atol=1e-4):
                bad.append(f"{op} {numel}")
    return bad


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_naive_all_reduce_equals_the_builtin(world_size):
    assert launch(_compare, world_size, timeout=120) == [[]] * world_size


def test_naive_all_reduce_on_subgroups():
    runs = run_cases(_compare, (SHARD_GROUPS, REPLICA_GROUPS), 4, timeout=120)
    assert runs[SHARD_GROUPS] == [[]] * 4 and runs[REPLICA_GROUPS] == [[]] * 4


def _logged(numel):
    RECORDER.reset()
    with CommLog() as log, scope("step 1"):
        naive_all_reduce(torch.ones(numel))
    entries = [(e.op, e.group, e.shapes, e.label) for e in RECORDER.entries()]
    return dist.get_rank(), [(r.op, r.impl, r.nbytes, r.sent, r.group_size, r.label) for r in log.records], entries


@pytest.mark.parametrize("world_size, numel", [(1, 5), (2, 6), (3, 7), (4, 1001)])
def test_the_root_sends_n_minus_1_copies_and_the_others_one(world_size, numel):
    n, nbytes = world_size, 4 * numel  # fp32
    for rank, records, entries in launch(_logged, world_size, args=(numel,), timeout=60):
        sent = (n - 1) * nbytes if rank == 0 else (nbytes if n > 1 else 0)
        assert records == [("all_reduce", "naive", nbytes, sent, n, "step 1")]
        assert entries == [("all_reduce", tuple(range(n)), ((numel,),), "step 1")]


def _refusals():
    out = []
    for call in (lambda: naive_all_reduce(torch.ones(4), op=MAX),
                 lambda: naive_all_reduce(torch.ones(4, 2).t())):
        try:
            call()
            out.append(None)
        except ValueError as e:
            out.append(str(e))
    return out


def test_bad_arguments_are_refused_before_any_message():
    for got in launch(_refusals, 2, timeout=60):
        assert got[0].startswith("op must be ReduceOp.SUM or ReduceOp.AVG, got")
        assert got[1] == "tensor must be contiguous"
