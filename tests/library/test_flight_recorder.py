"""The divergence finder: every rank's last collectives, and the first one where the ranks differ.

Each failure mode of lesson 10 is reproduced on gloo ranks and must end, within seconds, in a
`LaunchError` that names where the ranks went different ways (its first line; the second, under a rank
that died); the verdict logic itself is tested on hand-made records. Under torchrun every rank records
into a folder of its run without being asked (FSDP_MINI_FLIGHT_DIR chooses another), a rank that times
out prints the verdict, and `python -m fsdp_mini diagnose` prints it from the files, of one run only.
"""
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist

from fsdp_mini import FSDP, LaunchError, fully_shard, launch, register_fsdp_forward_method
from fsdp_mini import collectives as C
from fsdp_mini.flight_recorder import (FLIGHT_DIR_ENV, RECORDER, Ending, Entry, FlightRecorder, diagnose, failure_note,
                                       find_divergence, install_verdict_hook, load_run,
                                       raised_in_a_collective, record_path, remove_if_ended_well)
from small_model import Block, TinyConfig, TinyLM, batch, rank_rows

CFG = TinyConfig(depth=3)
TESTS = Path(__file__).resolve().parents[1]  # where small_model.py is, for the torchrun script
HANG_S = 6  # how long a hung launch waits before it reports


def _batch(step=0):
    return (rank_rows(t, dist.get_rank(), dist.get_world_size()) for t in batch(CFG, 8, step))


class SkipsABlockOnRank1(TinyLM):
    def run_blocks(self, x):
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
    model = FSDP(TinyLM(CFG), "FULL_SHARD", wrap=(Block,))
    for step in range(3 if dist.get_rank() == 0 else 2):  # uneven data: rank 0 has a batch more
        x, y = _batch(step)
        model(x, y).backward()


def state_dict_on_rank0():
    model = FSDP(TinyLM(CFG), "FULL_SHARD", wrap=(Block,))
    x, y = _batch()
    model(x, y).backward()
    if dist.get_rank() == 0:
        model.state_dict()  # a collective, called by one rank
    x, y = _batch(1)
    model(x, y).backward()


def generate_on_rank0():
    model = TinyLM(CFG)
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
    model = FSDP(TinyLM(CFG), "FULL_SHARD", wrap=(Block,))
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
    verdict = info.value.verdict
    assert verdict.startswith(starts) and contains in verdict, verdict
    lines = str(info.value).splitlines()
    if fn is dies_mid_step:  # a rank that died is the cause: said first, the verdict under it
        assert lines[:2] == ["rank 2 exited with code 3 without reporting (os._exit?)", verdict]
    else:  # an error or a crash in a collective (or a hang) is the divergence's consequence: the verdict first
        assert lines[0] == verdict
    if fn is state_dict_on_rank0:  # gloo aborts on the AllGather's different sizes: the crash is named next
        assert lines[1] == "rank 0 was killed by signal 6 (SIGABRT)"
    assert time.monotonic() - start < HANG_S + 10


def test_ranks_that_agree_have_no_verdict_and_a_healthy_launch_is_untouched(no_orphans):
    def fine():
        model = FSDP(TinyLM(CFG), "FULL_SHARD", wrap=(Block,))
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
    got = load_run(str(tmp_path)).records[1]
    assert [(e.seq, e.op, e.shapes, e.label) for e in got] == [(3, "all_gather", ((3, 2),), "blocks.0"),
                                                               (4, "reduce_scatter", ((3, 2),), "blocks.0"),
                                                               (5, "all_gather", ((3, 2),), "blocks.0"),
                                                               (6, "reduce_scatter", ((3, 2),), "blocks.0")]
    assert [e.done for e in got] == [False, False, True, False]
    assert diagnose(str(tmp_path)) == ("the ranks agree on every recorded collective; waiting: "
                                       "rank 1 in ReduceScatter #6 (blocks.0)")


def _ran(folder, run, world, issued):
    """Write the records of a finished run into `folder`: rank r issued `issued[r]` AllReduces."""
    for rank in range(world):
        rec = FlightRecorder(capacity=8)
        rec.attach(record_path(str(folder), rank), run=run, rank=rank, world=world)
        for _ in range(issued[rank]):
            rec.complete(rec.issue("all_reduce", tuple(range(world)), [torch.ones(2)], "blocks.0"))


def test_diagnose_reads_one_run_and_names_the_stale_files_of_an_earlier_one(tmp_path):
    """A 3-rank job, then a 2-rank job, in the same folder: the second overwrote rank0/rank1.flight, and
    rank2.flight is the first job's. Mixed in, it made the 2-rank job's ranks look as if they had issued
    nothing in the 3-rank group (a wrong verdict); now it is left out, and named."""
    _ran(tmp_path, "20260101-000000-aaaaaaaa", 3, [5, 5, 5])
    time.sleep(0.01)  # the second run starts later
    _ran(tmp_path, "20260101-000100-bbbbbbbb", 2, [3, 2])
    run = load_run(str(tmp_path))
    assert (run.run, run.world, sorted(run.records)) == ("20260101-000100-bbbbbbbb", 2, [0, 1])
    assert run.stale == {"rank2.flight": ("20260101-000000-aaaaaaaa", 3)}
    assert diagnose(str(tmp_path)).splitlines() == [
        "rank 0 issued AllReduce #3 (blocks.0) while rank 1 issued no collective #3 (its last: AllReduce #2 (blocks.0))",
        "(ignored rank2.flight: from an earlier run of 3 ranks, 20260101-000000-aaaaaaaa)"]
    # a run whose ranks agree, with a rank missing from the folder (another node's, or never started)
    _ran(tmp_path, "20260101-000200-cccccccc", 4, [1, 1, 1, 0])
    os.remove(record_path(str(tmp_path), 3))
    assert diagnose(str(tmp_path)).splitlines() == [
        "ranks [0, 1, 2] agree on every recorded collective, and none is waiting in one",
        "(no record of rank 3; this run had 4 ranks)"]


@pytest.mark.torchrun
def test_flight_dir_chooses_the_folder_and_diagnose_names_the_divergence(tmp_path, no_orphans):
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
    # rank 0, whose AllReduce times out, says why, and where the records are
    assert "[rank0]: fsdp_mini: ranks diverged: rank 0 waits in AllReduce #2 while rank 1" in run.stderr, run.stderr
    assert f"[rank0]: fsdp_mini: this run's flight records are in {folder} " in run.stderr
    out = subprocess.run([sys.executable, "-m", "fsdp_mini", "diagnose", str(folder)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0
    assert out.stdout.strip() == "rank 0 waits in AllReduce #2 while rank 1 issued no collective #2 (its last: AllReduce #1)"
    empty = subprocess.run([sys.executable, "-m", "fsdp_mini", "diagnose", str(tmp_path)], capture_output=True,
                           text=True, timeout=60)
    assert empty.returncode == 1 and empty.stdout.startswith("no flight records")


HANG_SCRIPT = """
import os, sys, time
import torch, torch.distributed as dist
import fsdp_mini
from fsdp_mini import FSDP
from small_model import Block, TinyConfig, TinyLM, batch, rank_rows

rank, world = fsdp_mini.init(timeout=float(sys.argv[1]))
CFG = TinyConfig(depth=3)


class SkipsABlockOnRank1(TinyLM):
    def run_blocks(self, x):
        for i, block in enumerate(self.blocks):
            if i == 1 and rank == 1:
                continue
            x = block(x)
        return x


model = FSDP(SkipsABlockOnRank1(CFG), "FULL_SHARD", wrap=(Block,))
x, y = (rank_rows(t, rank, world) for t in batch(CFG, 8, 0))
with open(os.path.join(sys.argv[2], f"hang_starts.{rank}"), "w") as f:
    f.write(repr(time.time()))
model(x, y).backward()
fsdp_mini.finish()
"""
SKIPPED_BLOCK_VERDICT = ("ranks diverged: rank 0 issued AllGather #3 (blocks.1, forward) while rank 1 issued "
                         "AllGather #3 (blocks.2, forward)")


def _processes_running(script) -> list:
    """Live processes (zombies are dead) whose command line names `script`."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        if str(script) in " ".join(p.info["cmdline"] or []) and p.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(p)
    return found


@pytest.mark.torchrun
def test_a_torchrun_hang_prints_the_verdict_within_the_timeout_with_nothing_set(tmp_path, no_orphans):
    """Two torchrun ranks, one skips an FSDP unit, `init(timeout=5)`, no environment variable: the ranks
    record into a folder of their run (under the temporary directory, here tmp_path), and a rank whose
    collective times out prints the verdict and that folder with gloo's error, within the timeout."""
    timeout_s = 5
    script = tmp_path / "skips_a_block.py"
    script.write_text(HANG_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != FLIGHT_DIR_ENV}
    env.update(OMP_NUM_THREADS="1", TMPDIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")])))
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          str(script), str(timeout_s), str(tmp_path)],
                         env=env, capture_output=True, text=True, timeout=150)  # the safety net
    ended = time.time()
    assert run.returncode != 0
    hang_started = min(float((tmp_path / f"hang_starts.{r}").read_text()) for r in range(2))
    # within the timeout, not gloo's default 30 min; the rest is torchrun stopping the other rank and exiting,
    # which took 15 s on a 2-core machine running four test workers
    assert ended - hang_started < timeout_s + 25, run.stderr[-3000:]
    printed = [r for r in range(2) if f"[rank{r}]: fsdp_mini: {SKIPPED_BLOCK_VERDICT}" in run.stderr]
    assert printed, run.stderr[-3000:]
    for r in range(2):  # every rank that failed (rather than being stopped by torchrun) said it
        if re.search(rf"^\[rank{r}\]: RuntimeError", run.stderr, re.M):
            assert r in printed, run.stderr[-3000:]
    folder = re.search(r"fsdp_mini: this run's flight records are in (\S+) ", run.stderr)[1]
    assert os.path.dirname(folder) == str(tmp_path / "fsdp_mini_flight")  # a folder per run
    assert diagnose(folder) == SKIPPED_BLOCK_VERDICT.removeprefix("ranks diverged: ")
    assert not _processes_running(script)


# --- the verdict from end records, on records written by real processes ----------------------------------

def _end_in_a_process(folder, run, rank, world, issued, how, what):
    rec = FlightRecorder(capacity=8)
    rec.attach(record_path(folder, rank), run=run, rank=rank, world=world)
    for _ in range(issued):
        rec.complete(rec.issue("all_reduce", tuple(range(world)), [torch.ones(2)], "blocks.0"))
    if how is not None:
        rec.end(how, what)
    os._exit(0)


def _ran_in_processes(folder, ranks):
    """Rank r, in a process of its own that then exits, issues `ranks[r][0]` AllReduces and writes the end
    record `ranks[r][1:]` ((None, "") for none: a process gone without one), one rank after the other."""
    ctx = multiprocessing.get_context("fork")
    for rank, (issued, how, what) in enumerate(ranks):
        p = ctx.Process(target=_end_in_a_process, args=(str(folder), "20260101-000000-aaaaaaaa", rank, len(ranks), issued, how,
                                            what))
        p.start()
        p.join(30)
        time.sleep(0.01)  # the next rank's end comes later


DIED = "rank 1 died: its process ended without an end record (killed by a signal, or os._exit?)"
DIVERGED = "ranks diverged: rank 0 issued AllReduce #3 (blocks.0) while rank 1 issued no collective #3 " \
           "(its last: AllReduce #2 (blocks.0))"


@pytest.mark.parametrize("ranks, lines", [
    # an exception of rank 1's own comes first; rank 0's error in the collective it then waited in follows
    ([(3, Ending.FAILED_IN_COLLECTIVE, "RuntimeError: Connection closed by peer"), (2, Ending.RAISED, "ValueError: bad")],
     ["rank 1 failed: ValueError: bad", DIVERGED]),
    # a rank gone without an end record died; the divergence is its consequence
    ([(3, Ending.FAILED_IN_COLLECTIVE, "RuntimeError: Connection closed by peer"), (2, None, "")], [DIED, DIVERGED]),
    # every rank gone without one: killed from outside (with its agent), not a divergence
    ([(3, None, ""), (2, None, "")],
     ["the run was interrupted: no rank left an end record (ranks 0, 1; killed together, e.g. with their agent?)"]),
    # every rank raised: the first one, and that the others failed the same way; no word of a peer
    ([(2, Ending.RAISED, "RuntimeError: shapes"), (2, Ending.RAISED, "RuntimeError: shapes")],
     ["rank 0 failed: RuntimeError: shapes", "(rank 1 failed the same way)"]),
    # a rank stopped by torchrun's agent while it computed (SIGTERM) is not a second death
    ([(3, Ending.STOPPED, "SIGTERM"), (2, None, "")], [DIED, DIVERGED]),
    # a rank that finished while another waits: the divergence alone
    ([(3, Ending.FAILED_IN_COLLECTIVE, "RuntimeError: Timed out"), (2, Ending.FINISHED, "0")], [DIVERGED]),
], ids=["raised", "died", "interrupted", "all raised", "stopped", "finished"])
def test_diagnose_names_the_cause_first(ranks, lines, tmp_path):
    _ran_in_processes(tmp_path, ranks)
    expected = [lines[0].removeprefix("ranks diverged: "), *lines[1:]]
    assert diagnose(str(tmp_path)).splitlines() == expected


def test_a_run_whose_ranks_all_finished_is_removed_and_a_failed_one_kept(tmp_path):
    well, failed = tmp_path / "fsdp_mini_flight" / "well", tmp_path / "fsdp_mini_flight" / "failed"
    well.mkdir(parents=True)
    failed.mkdir()
    _ran_in_processes(well, [(2, Ending.FINISHED, "0"), (2, Ending.FINISHED, "0")])
    _ran_in_processes(failed, [(2, Ending.FINISHED, "0"), (2, Ending.RAISED, "ValueError: bad")])
    assert not remove_if_ended_well(str(failed)) and failed.exists()
    assert remove_if_ended_well(str(well)) and not well.exists()
    assert failed.exists()


def test_an_exception_of_its_own_is_not_blamed_on_a_peer(tmp_path):
    """A rank that raises (a shape error) while the AllGather forward prefetched is in flight: its note
    names its exception, not "a peer died or stalls inside it?", which is only for an error raised in the
    collective itself, on ranks whose records agree and name no other cause."""
    rec = FlightRecorder(capacity=8)
    rec.attach(record_path(str(tmp_path), 0), run="r", rank=0, world=1)
    rec.issue("all_gather", (0,), [torch.ones(2)], "blocks.2")  # the prefetch, in flight
    try:
        raise RuntimeError("Given normalized_shape=[13]")
    except RuntimeError as exc:
        assert not raised_in_a_collective(exc)
        rec.end(Ending.RAISED, f"{type(exc).__name__}: {exc}")
        note = failure_note(str(tmp_path), 0, exc).splitlines()
    assert note[0] == "fsdp_mini: rank 0 failed: RuntimeError: Given normalized_shape=[13]"
    assert "a peer died" not in "\n".join(note)
    (tmp_path / "b").mkdir()
    collective = FlightRecorder(capacity=8)  # a timeout in the collective, on ranks that agree: where it waited
    collective.attach(record_path(str(tmp_path / "b"), 0), run="r", rank=0, world=1)
    collective.issue("all_gather", (0,), [torch.ones(2)], "blocks.2")
    collective.end(Ending.FAILED_IN_COLLECTIVE, "RuntimeError: Timed out")
    assert failure_note(str(tmp_path / "b"), 0).splitlines()[0] == (
        "fsdp_mini: the ranks agree on every recorded collective; rank 0 failed in AllGather #1 (blocks.2) "
        "(a peer died or stalls inside it?)")


def _stopped_by_sigterm(folder):
    RECORDER.reset()
    RECORDER.attach(record_path(folder, 0), run="r", rank=0, world=1)
    install_verdict_hook(folder, 0)
    os.kill(os.getpid(), signal.SIGTERM)  # what torchrun's agent sends the ranks left once one failed
    time.sleep(30)  # computing: the handler runs at once
    os._exit(0)


def test_a_rank_stopped_by_sigterm_says_so_and_still_dies_of_it(tmp_path):
    p = multiprocessing.get_context("fork").Process(target=_stopped_by_sigterm, args=(str(tmp_path),))
    p.start()
    p.join(30)
    assert p.exitcode == -signal.SIGTERM
    assert load_run(str(tmp_path)).ends[0].how is Ending.STOPPED
