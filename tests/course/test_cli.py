"""`python -m fsdp_mini`: help, the demo, and a tiny bench-collectives run (a smoke test, not a benchmark).

The demo under torchrun runs in lesson 08's torchrun section (nbval, both twins), not again here."""
import argparse
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from cli_in_process import run_main
from fsdp_mini.course.bench.command import print_report
from fsdp_mini.course.bench_collectives import format_size, parse_size
from fsdp_mini.course.cli import build_parser

ENV = dict(os.environ, OMP_NUM_THREADS="1")


def run(*args):
    return subprocess.run([sys.executable, "-m", "fsdp_mini", *args], capture_output=True, text=True,
                          timeout=120, env=ENV)


def test_help_lists_the_subcommands():
    out = run_main("--help")  # in this process (tests/cli_in_process.py): the demo starts the entry point
    assert out.returncode == 0
    assert all(c in out.stdout for c in ("demo", "ring-demo", "bench-collectives"))


def _subcommands() -> dict:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("name", sorted(_subcommands()))
def test_every_option_has_help_and_shows_its_default(name):
    sub = _subcommands()[name]
    text = "".join(sub.format_help().split())  # wrapping (also inside a long default) does not matter
    for action in sub._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        what = action.option_strings[0] if action.option_strings else action.dest
        assert action.help, f"{name} {what} has no help text"
        if action.default not in (None, argparse.SUPPRESS) and action.option_strings:
            assert f"(default:{action.default})".replace(" ", "") in text, f"{name} {what} does not show its default"


def test_demo_runs_and_checks_itself():
    out = run("demo", "--world-size", "4", "--no-pytorch")
    assert out.returncode == 0, out.stderr
    for name in ("1 process", "NO_SHARD (DDP)", "ZeRO-1", "SHARD_GRAD_OP (ZeRO-2)", "FULL_SHARD (ZeRO-3)",
                 "HYBRID_SHARD (2x2)", "TP x fully_shard, 2x2"):
        assert f"\n{name} " in out.stdout, name
    assert "every strategy matches single-process training: True" in out.stdout
    # Unchanged under torchrun, only rank 0 printing: lesson 08's "torchrun" section runs it (nbval, both twins).


def test_ring_demo_runs_and_checks_itself():
    out = run("ring-demo", "--world-size", "2")
    assert out.returncode == 0, out.stderr
    assert "both equal torch.distributed.all_reduce: True" in out.stdout


def test_bench_collectives_tiny(tmp_path):
    path = tmp_path / "rows.json"
    out = run("bench-collectives", "--world-size", "2", "--sizes", "4K,64K", "--iters", "2", "--json", str(path))
    assert out.returncode == 0, out.stderr
    rows = json.loads(path.read_text())
    assert {(r["size"], r["op"], r["impl"]) for r in rows} == {
        (s, op, impl) for s in (4096, 65536) for op in ("all_reduce", "reduce_scatter", "all_gather")
        for impl in ("builtin", "ring")}
    assert all(len(r["times"]) == 2 and r["seconds"] > 0 and r["busbw"] > 0 for r in rows)
    assert "ring/builtin busbw" in out.stdout and "[ 12/12]" in out.stderr  # ratios and progress


def test_bad_size_is_a_clear_usage_error():
    out = run_main("bench-collectives", "--sizes", "lots")
    assert out.returncode == 2 and "cannot read size 'lots'" in out.stderr


@pytest.mark.parametrize("text, nbytes", [("4K", 4096), ("64M", 64 * 2**20), ("1GiB", 2**30), ("100", 100)])
def test_sizes_round_trip(text, nbytes):
    assert parse_size(text) == nbytes
    assert parse_size(format_size(nbytes)) == nbytes


def _tiny_report(size):
    """A saved bench run in which every target is missed (made up: nothing is measured)."""
    targets = [dict(target="FULL_SHARD step <= 0.9x FSDP2 (world 2)", where=f"{size}, world 2", value=1.3,
                    limit=0.9, met=False, size=size),
               dict(target="NO_SHARD step <= 1.1x DDP", where=f"{size}, world 2", value=1.4, limit=1.1, met=False,
                    size=size)]
    return {"environment": {"cpus": 2, "torch": "2.13.0"}, "results": [{"threads": 1}], "rows": [],
            "targets": targets, "args": {"reps": 1, "steps": 2}}


def test_a_tiny_bench_run_says_its_targets_are_not_meaningful_instead_of_missed(capsys, monkeypatch):
    import fsdp_mini.course.bench.command as command
    monkeypatch.setattr(command, "table", lambda rows: "")  # no rows in this made-up run
    args = SimpleNamespace(simulate=False, json=None, load="bench.json", plot=None)
    print_report(_tiny_report("tiny"), args)
    out = capsys.readouterr().out
    assert "MISSED" not in out and "met " not in out
    assert "tiny: a smoke-test size, too small for these targets to mean anything" in out
    assert out.count("\nn/a    ") == 2
    print_report(_tiny_report("medium"), args)  # at a real size, the same values are judged
    out = capsys.readouterr().out
    assert out.count("\nMISSED ") == 2 and "smoke-test" not in out
