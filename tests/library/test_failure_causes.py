"""After a failure, the first line names the cause: an exception on one rank, on every rank, a killed rank,
a skipped collective, a checkpoint saved by rank 0 alone (tests/failure_scenarios.py), each under `launch`
(the `LaunchError`'s first line) and under torchrun (each failing rank's note and `diagnose` on the run's
folder); a torchrun run that ends well leaves no folder. The verdict logic behind the torchrun side (end
records, ranks whose process is gone) is tested on hand-made records in test_flight_recorder.py.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from failure_scenarios import BAD_BATCH, CFG, ROWS, SCENARIOS
from fsdp_mini import LaunchError, launch
from fsdp_mini.flight_recorder import FLIGHT_DIR_ENV, diagnose

TESTS = Path(__file__).resolve().parents[1]  # where failure_scenarios.py is, for the torchrun script
HANG_S = 4  # the skipped collective and the lone checkpoint hang until this timeout

DIED = "rank 1 died: its process ended without an end record (killed by a signal, or os._exit?)"
# block 1's LayerNorm gets the residual stream one feature short: (rows per rank, context, width - 1)
SHAPE_ERROR = r"rank [01] failed: " + re.escape(
    f"RuntimeError: Given normalized_shape=[{CFG.width}], expected input with shape [*, {CFG.width}], but got input "
    f"of size[{ROWS // 2}, {CFG.context}, {CFG.width - 1}]")
# the first line that names each cause; `launch` and torchrun differ only for the killed rank (launch sees
# its signal; under torchrun a peer sees its process gone, and torchrun's agent names the signal)
CAUSES = {
    "raises_on_one_rank": re.escape(f"rank 1 failed: ValueError: {BAD_BATCH}"),
    "raises_on_every_rank": SHAPE_ERROR,
    "killed_rank": re.escape("rank 1 was killed by signal 9 (SIGKILL)"),
    "skipped_collective": r"ranks diverged: rank 0 waits in AllGather #(\d+) \(root, forward\) while rank 1 issued "
                          r"no collective #\1 \(its last: ReduceScatter #\d+ \(root, backward\)\)",
    "checkpoint_on_rank0": r"ranks diverged: rank 0 waits in save_checkpoint #(\d+) while rank 1 (waits in|issued) "
                           r"AllGather #\1 \(root, forward\)",
}
TORCHRUN_CAUSES = CAUSES | {"killed_rank": re.escape(DIED)}


@pytest.mark.parametrize("name", CAUSES)
def test_under_launch_the_first_line_names_the_cause(name, tmp_path, no_orphans):
    with pytest.raises(LaunchError) as info:
        launch(SCENARIOS[name], 2, args=(str(tmp_path),), timeout=HANG_S)
    lines = str(info.value).splitlines()
    assert re.fullmatch(CAUSES[name], lines[0]), str(info.value)
    if name in ("raises_on_one_rank", "killed_rank"):  # the divergence it caused comes second
        assert re.fullmatch(CAUSES["skipped_collective"], lines[1]), str(info.value)
    assert "a peer died" not in str(info.value)


def _notes(stderr: str) -> dict[int, list[str]]:
    """Each rank's note under its exception: the `[rankN]: fsdp_mini: ...` lines, in order."""
    notes: dict[int, list[str]] = {}
    for rank, line in re.findall(r"^\[rank(\d+)\]: fsdp_mini: (.*)$", stderr, re.M):
        notes.setdefault(int(rank), []).append(line)
    return notes


@pytest.mark.timeout(400)  # six torchrun jobs at once: about 70 s on a busy 2-core machine
@pytest.mark.torchrun
def test_under_torchrun_each_note_and_diagnose_name_the_cause_and_a_run_that_ends_well_leaves_no_folder(tmp_path):
    """All six runs at once (a torchrun costs seconds to start): each its own TMPDIR, so its own folder
    under TMPDIR/fsdp_mini_flight. The note's first line is the cause, and `diagnose` on the folder says
    the same (a divergence without the "ranks diverged: " of a note, as find_divergence says it)."""
    env = {k: v for k, v in os.environ.items() if k != FLIGHT_DIR_ENV}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")])))
    jobs = {}
    for name in SCENARIOS:
        folder = tmp_path / name
        folder.mkdir()
        jobs[name] = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
             str(TESTS / "failure_scenarios.py"), name, str(folder), str(HANG_S)],
            env=dict(env, TMPDIR=str(folder)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ended = {}
    try:
        for name, job in jobs.items():
            ended[name] = job.communicate(timeout=150)
    finally:
        for job in jobs.values():
            job.kill()
            job.wait()
    wrong = {}  # scenario -> what is wrong with it, every scenario checked before the test fails
    for name, (_, stderr) in ended.items():
        runs = [str(r) for r in (tmp_path / name / "fsdp_mini_flight").glob("*")]
        if name == "ends_well":
            if jobs[name].returncode != 0 or runs:
                wrong[name] = f"exit code {jobs[name].returncode}, folders left: {runs}; stderr ends:\n{stderr[-2000:]}"
            continue
        if jobs[name].returncode == 0 or len(runs) != 1:
            wrong[name] = f"exit code {jobs[name].returncode}, folders left: {runs}"
            continue
        cause = TORCHRUN_CAUSES[name]
        firsts = {rank: lines[0] for rank, lines in _notes(stderr).items()}
        verdict = diagnose(runs[0]).splitlines()[0]
        if (not all(re.fullmatch(cause, line) for line in firsts.values())
                or not re.fullmatch(cause.removeprefix("ranks diverged: "), verdict) or "a peer died" in stderr):
            wrong[name] = f"notes' first lines {firsts}; diagnose: {verdict}"
        # rank 0 said where the records go, at the start
        if f"fsdp_mini: this run's flight records go to {runs[0]} (removed if every rank ends well" not in stderr:
            wrong[name] = wrong.get(name, "") + "; rank 0 did not say where the records go"
    assert not wrong, "\n".join(f"{name}: {what}" for name, what in wrong.items())
    notes = {name: _notes(stderr) for name, (_, stderr) in ended.items()}
    assert 1 in notes["raises_on_one_rank"]  # the rank that raised says it, always
    assert notes["raises_on_every_rank"]  # and so does at least one of the ranks that raised
