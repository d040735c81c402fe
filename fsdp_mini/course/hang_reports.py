"""What lesson 10 prints about a hang, in the lesson's language: the plumbing behind its cells.

The lesson's cells make the ranks go different ways and read what each tool says; reading an error's text
back (a rank's stack, the verdict line), running a mode under `TORCH_DISTRIBUTED_DEBUG=DETAIL` in a process
of its own, and writing `fr_trace`'s finding as a sentence teach nothing of their own, so they live here.
The library's and PyTorch's messages are printed as they wrote them, with a reading under them in Russian
(`fsdp_mini.course.readings.print_with_reading`); the course's own words come from the message table
(`fsdp_mini.course.messages`, lesson 10's section).
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass, field

from fsdp_mini.course.readings import print_with_reading
from fsdp_mini.course.show import say, text

__all__ = ["stack_of", "issued", "verdict_line", "say_verdict", "DetailReport", "under_detail",
           "say_detail", "fr_words", "say_beside"]


def stack_of(error, rank: int, stop: str) -> list[str]:
    """Rank `rank`'s Python stack from a `LaunchError`'s text, innermost first, down to the function
    `stop` (the failure mode): "function (file)" for each frame, `stop` by its name alone."""
    lines = str(error).splitlines()
    start = lines.index(f"--- rank {rank}, last lines of stderr (its stack) ---") + 1
    frames = []
    for line in lines[start:]:
        found = re.search(r'File "(?:.*/)?([^/"]+)", line \d+ in (\w+)', line)
        if line.startswith("---") or (frames and frames[-1] == stop):
            break
        if found:
            frames.append(found[2] if found[2] == stop else f"{found[2]} ({found[1]})")
    return frames


def issued(verdict: str) -> str:
    """A verdict with "waits in" written "issued": whether a rank's last collective had completed when
    the run stopped depends on timing, so a stored output must not depend on it."""
    return re.sub(r"\b(waits in|wait in)\b", "issued", verdict)


def verdict_line(error) -> str:
    """The verdict of a `LaunchError` (its line "ranks diverged: ..."), see `issued`."""
    return issued(next(x for x in str(error).splitlines() if x.startswith("ranks diverged: ")))


def say_verdict(verdict: str, indent: int = 0) -> None:
    """Print "verdict: " and the library's verdict; in Russian, its reading under it."""
    print_with_reading(" " * indent + text("verdict_label") + " ", verdict)


def _ranks(ranks) -> str:
    ranks = list(ranks)
    return text("ranks_named", n=len(ranks), ranks=ranks)


# --- TORCH_DISTRIBUTED_DEBUG=DETAIL -----------------------------------------------------------------

# Three of the lesson's modes, again: DETAIL is read when torch.distributed is imported, so they run in
# a fresh process, which cannot see the functions of a notebook (it knows them by name).
_DETAIL_SCRIPT = textwrap.dedent("""
    import os, sys, tempfile, torch, torch.distributed as dist
    from fsdp_mini import FSDP
    from fsdp_mini import collectives as C
    from fsdp_mini.course.flight_records import record_both
    from fsdp_mini.course.models import GPT, Block, GPTConfig, make_batch
    from fsdp_mini.course.train import local_rows
    CFG = GPTConfig(n_layer=3)

    def batch(step=0):
        rank, world = dist.get_rank(), dist.get_world_size()
        return (local_rows(t, rank, world) for t in make_batch(CFG, 8, step))

    class SkipsABlockOnRank1(GPT):
        def hidden(self, idx):
            x = self.tok_emb(idx) + self.pos_emb(torch.arange(idx.shape[1]))
            for i, block in enumerate(self.blocks):
                if not (i == 1 and dist.get_rank() == 1):
                    x = block(x)
            return x

    def different_shapes():
        C.all_reduce(torch.ones(4 + dist.get_rank()))

    def skipped_block():
        model = FSDP(SkipsABlockOnRank1(CFG), "FULL_SHARD", wrap=(Block,))
        x, y = batch()
        model(x, y).backward()

    def one_batch_fewer():
        model = FSDP(GPT(CFG), "FULL_SHARD", wrap=(Block,))
        for step in range(3 if dist.get_rank() == 0 else 2):
            x, y = batch(step)
            model(x, y).backward()

    cases = {"different_shapes": (different_shapes, 3), "skipped_block": (skipped_block, 4),
             "one_batch_fewer": (one_batch_fewer, 4)}
    for mode in sys.argv[1:]:  # one after the other, as separate runs would
        fn, world = cases[mode]
        with tempfile.TemporaryDirectory() as folder:
            record_both(fn, world, folder, timeout_s=3)  # forked gloo ranks, the group's timeout 3 s
            print(f"=== mode {mode}", flush=True)
            for rank in range(world):
                with open(os.path.join(folder, f"rank{rank}.log")) as f:
                    print(f"=== rank {rank}", f.read(), sep="\\n", flush=True)
""")


@dataclass
class DetailReport:
    """What the ranks of one mode raised under DETAIL: {rank: the fingerprint it brought to a mismatch}
    and the mismatch message's first sentence; (rank, its monitored barrier's message, the ranks it names,
    the milliseconds) or None; the ranks that raised nothing (they finished their loop)."""

    fingerprints: dict[int, str] = field(default_factory=dict)
    headline: str | None = None
    barrier: tuple[int, str, str, int] | None = None
    finished: list[int] = field(default_factory=list)


def under_detail(modes) -> dict:
    """Run the modes `modes` (functions of the lesson, known here by their names) one after the other in
    a fresh process with TORCH_DISTRIBUTED_DEBUG=DETAIL (one process: one import of torch), and read what
    each of their ranks raised from the rank's log: {mode: DetailReport}."""
    with tempfile.TemporaryDirectory() as folder:
        script = os.path.join(folder, "detail.py")
        with open(script, "w") as f:
            f.write(_DETAIL_SCRIPT)
        env = dict(os.environ, TORCH_DISTRIBUTED_DEBUG="DETAIL", OMP_NUM_THREADS="1")
        out = subprocess.run([sys.executable, script, *(mode.__name__ for mode in modes)], env=env,
                             capture_output=True, text=True, timeout=120 * len(modes)).stdout
    runs = dict(re.findall(r"^=== mode (\w+)\n(.*?)(?=^=== mode |\Z)", out, re.M | re.S))
    return {mode: _detail_report(runs[mode.__name__]) for mode in modes}


def _detail_report(out: str) -> DetailReport:
    """What one mode's ranks raised, read from their logs (each after its line "=== rank N")."""
    logs = dict(re.findall(r"^=== rank (\d+)\n(.*?)(?=^=== rank |\Z)", out, re.M | re.S))
    report = DetailReport()
    for rank, log in sorted(logs.items()):
        mine = re.search(rf"Rank {rank} is running collective: CollectiveFingerPrint\(SequenceNumber=(\d+), "
                         r"OpType=(\w+)(?:, TensorShape=\[([^\]]*)\])?", log)
        waited = re.search(r"Ranks ([\d, ]+) failed to pass monitoredBarrier in (\d+) ms", log)
        if mine:
            report.fingerprints[int(rank)] = f"{mine[2]} [{mine[3]}] #{int(mine[1]) + 1}"
            report.headline = re.search(r"RuntimeError: (.*?)\. Rank", log)[1]
        elif waited:
            report.barrier = int(rank), waited[0], waited[1], int(waited[2])
        elif f"rank {rank}: " not in log:
            report.finished.append(int(rank))
    return report


def say_detail(report: DetailReport, indent: int = 4) -> None:
    """Print a `DetailReport`: PyTorch's message and each rank's fingerprint; the monitored barrier's
    message; the ranks that finished (PyTorch's messages as it wrote them, read in Russian)."""
    pad = " " * indent
    if report.fingerprints:
        print_with_reading(f"{pad}{_ranks(report.fingerprints)}: RuntimeError: ", report.headline,
                           text("detail_mismatch_reading"))
        prints = [text("rank_said", rank=_ranks([r]), said=said) for r, said in report.fingerprints.items()]
        say("detail_fingerprints", pad=pad, prints="; ".join(prints))
    if report.barrier:
        rank, message, ranks, ms = report.barrier
        print_with_reading(f"{pad}{_ranks([rank])}: RuntimeError: ", message,
                           text("detail_barrier_reading", ranks=ranks, ms=ms))
    if report.finished:
        say("detail_finished", pad=pad, ranks=_ranks(report.finished))


# --- fr_trace -------------------------------------------------------------------------------------------

_FR_ERRORS = {"COLLECTIVE_TYPE_MISMATCH": "fr_type_mismatch", "SIZE_OR_SYNTAX_MISMATCH": "fr_size_mismatch"}


def fr_words(finding: dict, exits: dict[int, int]) -> str:
    """fr_trace's first finding (`flight_records.first_finding`) as a sentence, in the parts that do not
    depend on the order it read the files in; `exits`: each rank's exit code (a dead rank's cause)."""
    if finding["kind"] == "missing dumps":
        dead = [text("exit_code_of", rank=r, code=exits[r]) if exits[r] > 0
                else f"{r} ({signal.Signals(-exits[r]).name})" for r in finding["ranks"]]
        return text("fr_no_dump", ranks=", ".join(dead))
    where = f"#{finding.get('seq')} {finding.get('collective')}"
    if finding["kind"] == "not joined":
        return text("fr_not_joined", where=where, ranks=", ".join(map(str, finding["ranks"])))
    if finding["kind"] == "mismatch":
        meaning = ", ".join(text(_FR_ERRORS[e]) if e in _FR_ERRORS else e for e in finding["errors"])
        return text("fr_mismatch", where=where, errors=", ".join(finding["errors"]), meaning=meaning,
                    values=" / ".join(finding["values"]))
    return text("fr_dumps_agree")


def say_beside(ours: str, finding: str, indent: int = 4) -> None:
    """fsdp_mini's verdict (read in Russian) above fr_trace's finding, their labels aligned."""
    labels = [text("fsdp_mini_says"), text("fr_trace_finds")]
    width = max(map(len, labels)) + 1
    print_with_reading(" " * indent + labels[0].ljust(width), ours)
    print(" " * indent + labels[1].ljust(width) + finding)
