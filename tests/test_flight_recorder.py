"""The divergence finder: every rank's last collectives, and the first one where the ranks differ.

Each failure mode of lesson 10 is reproduced on gloo ranks and must end, within seconds, in a
`LaunchError` whose first line names where the ranks went different ways; the verdict logic itself is
tested on hand-made records. Under torchrun the records go to FSDP_MINI_FLIGHT_DIR and
`python -m fsdp_mini diagnose` prints the same kind of verdict.
"""
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.distributed as dist

from fsdp_mini import FSDP, LaunchError, fully_shard, launch, register_fsdp_forward_method
from fsdp_mini import collectives as C
from fsdp_mini.flight_recorder import Entry, FlightRecorder, diagnose, find_divergence, load_records, record_path
from fsdp_mini.course.models import GPT, Block, GPTConfig, make_batch
from fsdp_mini.course.train import local_rows

CFG = GPTConfig(n_layer=3)
HANG_S = 6  # how long a hung launch waits before it reports


def _batch(step=0):
    return (local_rows(t, dist.get_rank(), dist.get_world_size()) for t in make_batch(CFG, 8, step))


class SkipsABlockOnRank1(GPT):
    def hidden(self, idx):
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(idx.shape[1]))
        for i, block in enumerate(self.blocks):
            if i == 1 and dist.get_rank() == 1:  # data-dependent control flow, taken on one rank only
                continue
            x = block(x)
        return x


def skipped_block():
    model = FSDP(SkipsABlockOnRank1(CFG), "FULL_SHARD", wrap=(Block,))
    x, y = _batch()
    model(x, y).backward()


def one_batch_fewer():
    model = FSDP(GPT(CFG), "FULL_SHARD", wrap=(Block,))
    for step in range(3 if dist.get_rank() == 0 else 2):  # uneven data: rank 0 has a batch more
        x, y = _batch(step)
        model(x, y).backward()


def state_dict_on_rank0():
    model = FSDP(GPT(CFG), "FULL_SHARD", wrap=(Block,))
    x, y = _batch()
    model(x, y).backward()
    if dist.get_rank() == 0:
        model.state_dict()  # a collective, called by one rank
    x, y = _batch(1)
    model(x, y).backward()


def generate_on_rank0():
    model = GPT(CFG)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    register_fsdp_forward_method(model, "generate")
    if dist.get_rank() == 0:
        model.generate(torch.tensor([[1, 2, 3]]), 4)  # gathers: the other ranks never join
    x, y = _batch()
    model(x, y).backward()


def different_shapes():
    C.all_reduce(torch.ones(4 + dist.get_rank()))


def dies_mid_step():
    model = FSDP(GPT(CFG), "FULL_SHARD", wrap=(Block,))
    x, y = _batch()
    model(x, y).backward()
    if dist.get_rank() == 2:
        os._exit(3)  # a crash in the second step (OOM-killed, segfault...)
    model(x, y).backward()


# (failure mode, world, expected start of the verdict, expected text in it)
CASES = [
    (skipped_block, 4, "ranks diverged: rank 1 issued AllGather #3 (blocks.2, forward) while ranks 0, 2, 3",
     "(blocks.1, forward)"),
    (one_batch_fewer, 4, "ranks diverged: rank 0 waits in AllGather", "ranks 1, 2, 3 issued no collective"),
    (state_dict_on_rank0, 4, "ranks diverged: rank 0 issued AllGather", "(full_state_dict) while ranks 1, 2, 3"),
    (generate_on_rank0, 2, "ranks diverged: rank 0 issued AllGather", "while rank 1 issued AllGather #5 (blocks.2, backward)"),
    (different_shapes, 3, "ranks diverged: rank 0 issued AllReduce #1 of (4,) float32 while rank 1",
     "AllReduce #1 of (5,) float32"),
    (dies_mid_step, 4, "ranks diverged: rank 2 issued no collective", "ranks 0, 1, 3 wait in AllGather"),
]


@pytest.mark.parametrize("fn, world, starts, contains", CASES, ids=[c[0].__name__ for c in CASES])
def test_each_failure_mode_names_where_the_ranks_diverged(fn, world, starts, contains, no_orphans):
    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launch(fn, world, timeout=HANG_S)
    verdict = str(info.value).splitlines()[0]
    assert verdict.startswith(starts) and contains in verdict, verdict
    assert time.monotonic() - start < HANG_S + 10


def test_ranks_that_agree_have_no_verdict_and_a_healthy_launch_is_untouched(no_orphans):
    def fine():
        model = FSDP(GPT(CFG), "FULL_SHARD", wrap=(Block,))
        x, y = _batch()
        model(x, y).backward()
        return 1

    assert launch(fine, 2, timeout=60) == [1, 1]


# --- the verdict, on hand-made records --------------------------------------------------------------

def _e(seq, op="all_gather", group=(0, 1, 2), shape=(4,), label="", phase="", done=False):
    return Entry(seq, op, group, (shape,), "float32", label, phase, done)


def test_the_odd_rank_comes_first_and_shapes_show_only_when_they_differ():
    records = {0: [_e(1), _e(2, label="blocks.3", phase="backward", op="reduce_scatter")],
               1: [_e(1), _e(2, label="blocks.2", phase="forward")],
               2: [_e(1), _e(2, label="blocks.3", phase="backward", op="reduce_scatter")]}
    assert find_divergence(records) == ("rank 1 waits in AllGather #2 (blocks.2, forward) while ranks 0, 2 wait in "
                                        "ReduceScatter #2 (blocks.3, backward)")
    same_op = {0: [_e(1, shape=(4,), done=True)], 1: [_e(1, shape=(5,))], 2: [_e(1, shape=(4,), done=True)]}
    assert find_divergence(same_op) == "rank 1 waits in AllGather #1 of (5,) float32 while ranks 0, 2 issued AllGather #1 of (4,) float32"
    assert find_divergence({0: [_e(1)], 1: [_e(1)], 2: [_e(1)]}) is None


def test_a_subgroup_is_named_and_entries_dropped_from_the_ring_are_not_a_divergence():
    sub = (0, 2)
    records = {0: [_e(1, group=sub), _e(2, group=sub)], 1: [], 2: [_e(1, group=sub), _e(2, group=sub, op="all_reduce")]}
    assert find_divergence(records, world=3).endswith("(in the group of ranks [0, 2])")
    rec = FlightRecorder(capacity=3)
    for _ in range(5):
        rec.complete(rec.issue("all_reduce", (0, 1), [torch.ones(2)], ""))
    assert [e.seq for e in rec.entries()] == [3, 4, 5]
    behind = FlightRecorder(capacity=3)
    for _ in range(4):
        behind.complete(behind.issue("all_reduce", (0, 1), [torch.ones(2)], ""))
    assert find_divergence({0: rec.entries(), 1: behind.entries()}) == (
        "rank 0 issued AllReduce #5 while rank 1 issued no collective #5 (its last: AllReduce #4)")


def test_the_file_mirror_round_trips_and_survives_its_writer(tmp_path):
    rec = FlightRecorder(capacity=4)
    rec.attach(record_path(str(tmp_path), 1))
    tokens = [rec.issue(op, (0, 1), [torch.ones(3, 2)], "blocks.0") for op in ("all_gather", "reduce_scatter") * 3]
    rec.complete(tokens[0])  # long gone from the ring: must not overwrite a newer entry's slot
    rec.complete(tokens[-2])
    del rec  # the file stays, as it does for a rank that died
    got = load_records(str(tmp_path))[1]
    assert [(e.seq, e.op, e.shapes, e.label) for e in got] == [(3, "all_gather", ((3, 2),), "blocks.0"),
                                                               (4, "reduce_scatter", ((3, 2),), "blocks.0"),
                                                               (5, "all_gather", ((3, 2),), "blocks.0"),
                                                               (6, "reduce_scatter", ((3, 2),), "blocks.0")]
    assert [e.done for e in got] == [False, False, True, False]
    assert diagnose(str(tmp_path)) == ("the ranks agree on every recorded collective; waiting: "
                                       "rank 1 in ReduceScatter #6 (blocks.0)")


def test_under_torchrun_the_ranks_write_records_and_diagnose_names_the_divergence(tmp_path, no_orphans):
    script = tmp_path / "hang.py"
    script.write_text(textwrap.dedent("""
        import torch
        import fsdp_mini
        from fsdp_mini import collectives as C
        rank, world = fsdp_mini.init(timeout=3)
        C.all_reduce(torch.ones(3))
        if rank == 0:
            C.all_reduce(torch.ones(3))  # rank 1 never joins: the process group times out
        fsdp_mini.finish()
    """))
    folder = tmp_path / "flight"
    env = dict(os.environ, FSDP_MINI_FLIGHT_DIR=str(folder), OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    out = subprocess.run([sys.executable, "-m", "fsdp_mini", "diagnose", str(folder)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0
    assert out.stdout.strip() == "rank 0 waits in AllReduce #2 while rank 1 issued no collective #2 (its last: AllReduce #1)"
    empty = subprocess.run([sys.executable, "-m", "fsdp_mini", "diagnose", str(tmp_path)], capture_output=True,
                           text=True, timeout=60)
    assert empty.returncode == 1 and empty.stdout.startswith("no flight records")
