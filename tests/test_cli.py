"""`python -m fsdp_mini`: help, the demo, and a tiny bench-collectives run (a smoke test, not a benchmark)."""
import json
import os
import subprocess
import sys

import pytest

from fsdp_mini.course.bench_collectives import format_size, parse_size

ENV = dict(os.environ, OMP_NUM_THREADS="1")


def run(*args):
    return subprocess.run([sys.executable, "-m", "fsdp_mini", *args], capture_output=True, text=True,
                          timeout=120, env=ENV)


def test_help_lists_the_subcommands():
    out = run("--help")
    assert out.returncode == 0
    assert all(c in out.stdout for c in ("demo", "ring-demo", "bench-collectives"))


def test_demo_runs_and_checks_itself():
    out = run("demo", "--world-size", "2", "--no-pytorch")
    assert out.returncode == 0, out.stderr
    for name in ("1 process", "NO_SHARD (DDP)", "ZeRO-1", "SHARD_GRAD_OP (ZeRO-2)", "FULL_SHARD (ZeRO-3)",
                 "HYBRID_SHARD (1x2)"):
        assert f"\n{name} " in out.stdout, name
    assert "every strategy matches single-process training: True" in out.stdout


def test_demo_runs_unchanged_under_torchrun():
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "fsdp_mini", "demo", "--no-pytorch"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=ENV)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("Training a") == 1, "only rank 0 prints"
    assert "every strategy matches single-process training: True" in out.stdout


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
    out = run("bench-collectives", "--sizes", "lots")
    assert out.returncode == 2 and "cannot read size 'lots'" in out.stderr


@pytest.mark.parametrize("text, nbytes", [("4K", 4096), ("64M", 64 * 2**20), ("1GiB", 2**30), ("100", 100)])
def test_sizes_round_trip(text, nbytes):
    assert parse_size(text) == nbytes
    assert parse_size(format_size(nbytes)) == nbytes
