"""CommLog counts exactly the bytes each op sends: measured for the ring, the ring model for builtins."""
import pytest
import torch
import torch.distributed as dist

from fsdp_mini import CommLog, launch, scope
from fsdp_mini import collectives as C
from fsdp_mini.comm_log import ring_model_sent

pytestmark = pytest.mark.usefixtures("no_orphans")


def _log_each_op(numel):
    n, r = dist.get_world_size(), dist.get_rank()
    with CommLog() as log:
        with scope("step 1"):
            for impl in C.IMPLS:
                C.all_reduce(torch.ones(numel), impl=impl)
                C.reduce_scatter_tensor(torch.empty(numel), torch.ones(n * numel), impl=impl)
                C.all_gather_into_tensor(torch.empty(n * numel), torch.ones(numel), impl=impl)
        with CommLog() as inner:  # nested logs both see what happens inside
            C.ring_all_reduce(torch.ones(numel), async_op=True).wait()
    return r, [(x.op, x.impl, x.nbytes, x.sent, x.group_size, x.rank, x.label, x.end >= x.start)
               for x in log.records], len(inner.records), log.summary(), log.sent


@pytest.mark.parametrize("world_size, numel", [(1, 5), (2, 6), (3, 7), (4, 1001)])
def test_bytes_are_exact_for_each_op(world_size, numel):
    n, f = world_size, 4  # fp32
    chunk = -(-numel // n)  # the all-reduce pads S to n equal chunks
    for r, records, inner, summary, total in launch(_log_each_op, world_size, args=(numel,)):
        expected = []
        for impl in C.IMPLS:
            expected += [("all_reduce", impl, numel * f, 2 * (n - 1) * chunk * f),
                         ("reduce_scatter", impl, n * numel * f, (n - 1) * numel * f),
                         ("all_gather", impl, n * numel * f, (n - 1) * numel * f)]
        expected += [("all_reduce", "ring", numel * f, 2 * (n - 1) * chunk * f)]
        assert [rec[:4] for rec in records] == expected
        assert {rec[4] for rec in records} == {n} and {rec[5] for rec in records} == {r}
        assert [rec[6] for rec in records] == ["step 1"] * 6 + [""] and all(rec[7] for rec in records)
        assert inner == 1
        assert summary[("all_reduce", "ring")] == {"calls": 2, "nbytes": 2 * numel * f, "sent": 4 * (n - 1) * chunk * f}
        assert total == sum(e[3] for e in expected)


def test_ring_model_matches_the_textbook_formula_when_n_divides_s():
    for n in (1, 2, 3, 4, 8):
        s = 4 * n * 10
        assert ring_model_sent("all_reduce", n * 10, 4, n) == 2 * (n - 1) * s // n
        assert ring_model_sent("reduce_scatter", n * 10, 4, n) == (n - 1) * s // n
        assert ring_model_sent("all_gather", n * 10, 4, n) == (n - 1) * s // n


def test_nothing_is_logged_outside_a_log_and_the_table_lists_each_op():
    def work():
        C.ring_all_reduce(torch.ones(4))  # no active log: not recorded anywhere
        with CommLog() as log:
            C.ring_all_reduce(torch.ones(4))
        return len(log.records), log.table()
    count, table = launch(work, 2)[0]
    assert count == 1
    assert table.splitlines()[1].split() == ["all_reduce", "ring", "1", "16", "16"]
