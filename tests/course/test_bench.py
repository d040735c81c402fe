"""`python -m fsdp_mini bench` runs on a tiny setting (a smoke test: benchmarks are not tests), and the
alpha-beta simulator is right on paper (pure tests, no process group)."""
import json
import math
import os
import subprocess
import sys

import pytest
from cli_in_process import run_main

from fsdp_mini.course import bench, simulate
from fsdp_mini.course.cluster import Cluster
from fsdp_mini.course.cost import fit_alpha_beta, predict
from fsdp_mini.course.models import GPT, GPTConfig

ENV = dict(os.environ, OMP_NUM_THREADS="1")
SMOKE_CASES = "mini:NO_SHARD,mini:FULL_SHARD,mini:FULL_SHARD:noprefetch,fsdp2:reshard,ddp,compute,fully_shard:reshard"


def run(*args, timeout=170):
    return subprocess.run([sys.executable, "-m", "fsdp_mini", *args], capture_output=True, text=True,
                          timeout=timeout, env=ENV)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bench")
    out = run("bench", "--world-sizes", "2", "--sizes", "tiny", "--cases", SMOKE_CASES, "--reps", "1",
              "--steps", "2", "--warmup", "1", "--calibration-iters", "2", "--simulate",
              "--json", str(folder / "bench.json"), "--plot", str(folder / "bench.png"))
    assert out.returncode == 0, out.stderr[-3000:]
    return out, folder


def test_bench_runs_on_a_tiny_setting_and_writes_json(smoke):
    out, folder = smoke
    report = json.loads((folder / "bench.json").read_text())
    rows = {r["case"]: r for r in report["rows"]}
    assert set(rows) == set(SMOKE_CASES.split(","))
    assert all(r["world_size"] == 2 and r["size"] == "tiny" and len(r["times"]) == 2 for r in rows.values())
    assert all(r["step_s"] > 0 and r["peak_alloc"] > 0 for r in rows.values())
    # bytes per step: none without communication; DDP all-reduces every gradient once (ring model,
    # n = 2: each rank sends half of every bucket, so about the model's fp32 bytes); fsdp_mini's
    # FULL_SHARD sends more (two all-gathers and a reduce-scatter of almost the whole model)
    model_bytes = 4 * bench.model_numel("tiny")
    assert rows["compute"]["sent"] == 0
    assert abs(rows["ddp"]["sent"] - model_bytes) <= 64
    assert rows["mini:FULL_SHARD"]["sent"] > rows["mini:NO_SHARD"]["sent"] > 0
    # sharding divides the model state; the gathered peak is fsdp_mini's, prefetch gathers one unit more
    assert rows["mini:FULL_SHARD"]["model_state"] < 0.51 * rows["mini:NO_SHARD"]["model_state"]
    assert rows["mini:FULL_SHARD"]["unsharded_peak"] > rows["mini:FULL_SHARD:noprefetch"]["unsharded_peak"] > 0
    assert rows["mini:FULL_SHARD"]["vs_twin"] == pytest.approx(
        rows["mini:FULL_SHARD"]["step_s"] / rows["fsdp2:reshard"]["step_s"])
    assert {t["target"] for t in report["targets"]} >= {"NO_SHARD step <= 1.1x DDP",
                                                        "FULL_SHARD step <= 0.9x FSDP2 (world 2)"}
    assert report["results"][0]["collectives"]  # the calibration for the simulator
    assert (folder / "bench.png").read_bytes()[:4] == b"\x89PNG"
    for text in ("tiny GPT (24,750 parameters), world size 2", "fsdp_mini FULL_SHARD", "FSDP2 reshard=True",
                 "PyTorch DDP", "performance targets:", "prediction vs measurement", "extrapolation: 8 nodes x 8"):
        assert text in out.stdout, text
    assert "[  7/7] memory tiny x2" in out.stderr and "[  7/7] tiny x2" in out.stderr  # progress


def test_simulate_reads_the_bench_json(smoke):
    _, folder = smoke
    out = run_main("simulate", str(folder / "bench.json"), "--nodes", "2", "--gpus-per-node", "4",
                   "--json", str(folder / "sim.json"))  # in this process: tests/cli_in_process.py
    assert out.returncode == 0, out.stderr
    assert "prediction vs measurement" in out.stdout and "extrapolation: 2 nodes x 4 GPUs" in out.stdout
    sim = json.loads((folder / "sim.json").read_text())
    cases = {p["case"] for p in sim["predictions"]}
    assert cases <= {"mini:NO_SHARD", "mini:FULL_SHARD", "mini:FULL_SHARD:noprefetch"}
    assert cases or sim["notes"]  # a collective too noisy to fit is a note, not a crash
    assert all(p["serial_s"] >= p["overlapped_s"] > 0 for p in sim["predictions"])


def test_bad_arguments_are_clear_usage_errors():
    out = run_main("bench", "--sizes", "huge")  # usage errors, before any rank starts: in this process
    assert out.returncode == 2 and "unknown size" in out.stderr
    out = run_main("bench", "--cases", "mini:FULL_SHARD:fast")
    assert out.returncode == 2 and "unknown flags" in out.stderr


# --- pure: cases, summary, targets ----------------------------------------------------------------------

def test_cases_parse_and_name_their_twin():
    assert [bench.parse_case(k).name for k in bench.CASES] == [
        "fsdp_mini NO_SHARD", "fsdp_mini SHARD_GRAD_OP", "fsdp_mini FULL_SHARD", "fsdp_mini FULL_SHARD, no prefetch",
        "fsdp_mini FULL_SHARD, no flight recorder", "fsdp_mini HYBRID_SHARD", "fsdp_mini fully_shard reshard=True", "FSDP2 reshard=True", "FSDP2 reshard=False",
        "PyTorch DDP", "compute only"]
    assert bench.parse_case("fully_shard:reshard").twin == "fsdp2:reshard"
    assert bench.parse_case("fully_shard:noreshard").twin == "fsdp2:noreshard"
    assert bench.parse_case("mini:full_shard:ring").impl == "ring"
    assert not bench.parse_case("mini:FULL_SHARD:norecord").record and bench.parse_case("mini:FULL_SHARD").record
    assert bench.parse_case("mini:NO_SHARD").twin == "ddp"
    assert bench.parse_case("mini:SHARD_GRAD_OP").twin == "fsdp2:noreshard"
    assert bench.parse_case("mini:HYBRID_SHARD").twin == "fsdp2:reshard"
    assert bench.parse_case("fsdp2:reshard").twin is None
    for bad in ("mini:ZERO9", "fsdp2:maybe", "deepspeed"):
        with pytest.raises(ValueError):
            bench.parse_case(bad)


def _fake_results(full_state=100, full_peak=30, full_s=0.8, fsdp2_s=1.0, off_s=0.9):
    times = lambda s: {p: [s] * 3 for p in bench.PHASES}  # noqa: E731
    memory = {
        "mini:NO_SHARD": {"model_state": 2 * 100, "records": [], "units": [0, 0, 0]},
        "mini:FULL_SHARD": {"model_state": full_state, "unsharded_peak": full_peak, "units": [5, 12, 12],
                            "records": [["all_gather", "builtin", 1000, 2, 500]]},
        "mini:FULL_SHARD:noprefetch": {"model_state": full_state, "records": [], "units": [5, 12, 12]},
        "mini:FULL_SHARD:norecord": {"model_state": full_state, "records": [], "units": [5, 12, 12]},
        "fsdp2:reshard": {}, "ddp": {}, "compute": {},
    }
    res = {"world_size": 2, "size": "tiny", "times": {"mini:NO_SHARD": times(0.5), "mini:FULL_SHARD": times(full_s),
                                                       "mini:FULL_SHARD:noprefetch": times(off_s),
                                                       "mini:FULL_SHARD:norecord": times(full_s / 1.01),
                                                       "fsdp2:reshard": times(fsdp2_s), "ddp": times(0.5),
                                                       "compute": times(0.4)},
           "memory": memory, "collectives": []}
    return [res]


def test_targets_say_met_or_missed_with_the_value():
    results = _fake_results()
    rows = bench.summarize(results)
    got = {t["target"]: t for t in bench.targets(rows, results)}
    assert got["FULL_SHARD step <= 0.9x FSDP2 (world 2)"]["met"] and got["FULL_SHARD step <= 0.9x FSDP2 (world 2)"]["value"] == pytest.approx(0.8)
    assert got["NO_SHARD step <= 1.1x DDP"]["met"]
    assert got["FULL_SHARD state/rank <= NO_SHARD's / N + 1%"]["value"] == pytest.approx(0.0)
    assert got["FULL_SHARD gathered peak <= two largest units"]["value"] == pytest.approx(30 / 24)
    assert not got["FULL_SHARD gathered peak <= two largest units"]["met"]
    assert got["prefetch on faster than off"]["met"]
    assert got["flight recorder costs <= 3% of a FULL_SHARD step"]["value"] == pytest.approx(1.01)
    assert got["flight recorder costs <= 3% of a FULL_SHARD step"]["met"]
    assert got["prefetch on faster than off"]["comm_share"] == pytest.approx(1 - 0.4 / 0.9)
    missed = bench.targets(bench.summarize(_fake_results(full_s=0.95, full_state=102)), _fake_results())
    assert [t["met"] for t in missed if "FSDP2" in t["target"] or "state" in t["target"]] == [False, False]
    text = bench.targets_text(bench.targets(rows, results))
    assert "MISSED FULL_SHARD gathered peak" in text and "met    NO_SHARD step" in text
    assert "tiny GPT (24,750 parameters), world size 2" in bench.table(rows)


# --- pure: the simulator -----------------------------------------------------------------------------------

def _rows(op, n, alpha, bandwidth, impl="builtin", sizes=(4096, 65536, 2**20, 2**22)):
    return [{"op": op, "impl": impl, "world_size": n, "size": s, "seconds": predict(op, s, n, alpha, bandwidth)}
            for s in sizes]


def test_fit_recovers_alpha_and_bandwidth_per_collective_and_group_size():
    rows = _rows("all_gather", 2, 50e-6, 1e9) + _rows("reduce_scatter", 2, 80e-6, 0.4e9) + _rows("all_reduce", 4, 20e-6, 2e9)
    fits = simulate.fit(rows + [{"op": "all_gather", "impl": "builtin", "world_size": 8, "size": 4096, "seconds": 1e-3}])
    assert set(fits) == {("all_gather", "builtin", 2), ("reduce_scatter", "builtin", 2), ("all_reduce", "builtin", 4)}
    assert fits["all_gather", "builtin", 2].alpha == pytest.approx(50e-6)
    assert fits["reduce_scatter", "builtin", 2].bandwidth == pytest.approx(0.4e9)
    assert fits["all_reduce", "builtin", 4].alpha == pytest.approx(20e-6)
    plain = simulate.fit(rows, weighting="absolute")
    assert plain["all_gather", "builtin", 2] == pytest.approx(fit_alpha_beta("all_gather", 2, [r["size"] for r in rows[:4]],
                                                                              [r["seconds"] for r in rows[:4]]))
    # one slow large message: the plain fit moves the small messages' latency, the relative one much less
    skewed = _rows("all_reduce", 2, 50e-6, 1e9)
    skewed[-1] = dict(skewed[-1], seconds=2 * skewed[-1]["seconds"])
    small = lambda f: simulate.price("all_reduce", 4096, 2, f)  # noqa: E731
    exact = predict("all_reduce", 4096, 2, 50e-6, 1e9)
    assert abs(small(simulate.fit(skewed)) / exact - 1) < abs(small(simulate.fit(skewed, "absolute")) / exact - 1)
    noisy = [{"op": "all_gather", "impl": "builtin", "world_size": 2, "size": s, "seconds": t}
             for s, t in ((4096, 2e-3), (2**20, 1e-3))]  # shrinks with size: no bandwidth to fit
    assert simulate.fit(noisy) == {}


def test_price_and_comm_seconds_follow_the_ring_model():
    fits = simulate.fit(_rows("all_gather", 2, 50e-6, 1e9) + _rows("all_gather", 2, 10e-6, 2e9, impl="ring"))
    assert simulate.price("all_gather", 2**20, 2, fits) == pytest.approx(50e-6 + 0.5 * 2**20 / 1e9)
    assert simulate.price("all_gather", 2**20, 2, fits, impl="ring") == pytest.approx(10e-6 + 0.5 * 2**20 / 2e9)
    assert simulate.price("all_gather", 2**20, 1, fits) == 0.0  # a group of one sends nothing
    with pytest.raises(KeyError):
        simulate.price("reduce_scatter", 2**20, 2, fits)
    records = [("all_gather", "builtin", 2**20, 2, 2**19), ("all_gather", "naive", 2**10, 2, 2**9)]  # naive: builtin fit
    assert simulate.comm_seconds(records, fits) == pytest.approx(
        simulate.price("all_gather", 2**20, 2, fits) + simulate.price("all_gather", 2**10, 2, fits))


def test_predict_adds_compute_and_priced_collectives():
    results = _fake_results()
    results[0]["collectives"] = _rows("all_gather", 2, 1e-3, 1e6)
    report = {"results": results, "rows": bench.summarize(results)}
    preds, notes = simulate.predict(report)
    full = next(p for p in preds if p.case == "mini:FULL_SHARD")
    comm = 1e-3 + 0.5 * 1000 / 1e6
    assert full.comm_s == pytest.approx(comm)
    assert full.compute_s == pytest.approx(0.4 + 0.4 + 0.8)  # compute-only forward + backward, own optimizer
    assert full.serial_s == pytest.approx(full.compute_s + comm)
    assert full.overlapped_s == pytest.approx(max(0.8, comm) + 0.8)
    assert full.measured_s == 0.8 and full.error == pytest.approx(full.serial_s / 0.8 - 1)
    assert full.hidden == pytest.approx(1 - (0.8 - full.compute_s) / comm)
    assert {p.case for p in preds} == {"mini:NO_SHARD", "mini:FULL_SHARD", "mini:FULL_SHARD:noprefetch",
                                       "mini:FULL_SHARD:norecord"}
    assert notes == []
    text = simulate.report(report)
    assert "prediction vs measurement" in text and "7B-parameter model, 32 units" in text


def test_gpt_units_are_the_fsdp_units():
    cfg = GPTConfig(n_layer=3)
    units = simulate.gpt_units(cfg)
    assert len(units) == 4 and sum(units) == sum(p.numel() for p in GPT(cfg).parameters())
    assert units[1] == units[2] == units[3] == sum(p.numel() for p in GPT(cfg).blocks[0].parameters())


def test_extrapolation_hybrid_beats_full_shard_on_a_two_level_cluster():
    units = [10**8] * 32
    out = {e["strategy"]: e for e in simulate.extrapolate(simulate.DEFAULT_CLUSTER, units, compute_s=0.1)}
    assert simulate.DEFAULT_CLUSTER.inter_bandwidth == 50e9 and simulate.DEFAULT_CLUSTER.world_size == 64
    assert out["HYBRID_SHARD"]["comm_s"] < out["FULL_SHARD"]["comm_s"]
    assert out["HYBRID_SHARD"]["sent_inter"] < out["NO_SHARD"]["sent_inter"] < out["FULL_SHARD"]["sent_inter"]
    for e in out.values():
        assert e["serial_s"] == pytest.approx(0.1 + e["comm_s"])
        assert e["overlapped_s"] == pytest.approx(max(0.1, e["comm_s"]))
    one_node = Cluster(1, 8, 300e9, 50e9, 5e-6, 20e-6)
    same = {e["strategy"]: e["comm_s"] for e in simulate.extrapolate(one_node, units, 0.1)}
    assert math.isclose(same["HYBRID_SHARD"], same["FULL_SHARD"])  # one node: the same groups
    assert simulate.flops_seconds(7e9, 16384, 989e12, 0.4) == pytest.approx(6 * 7e9 * 16384 / (0.4 * 989e12))


def test_load_reprints_a_saved_run_and_plots_it_in_russian(smoke):
    out, folder = smoke
    again = run("bench", "--load", str(folder / "bench.json"), "--language", "ru",
                "--plot", str(folder / "bench.ru.png"), timeout=60)
    assert again.returncode == 0, again.stderr
    table_of = lambda text: text[text.index("tiny GPT"):text.index("performance targets:")]  # noqa: E731
    assert table_of(again.stdout) == table_of(out.stdout), "the same table, nothing measured again"
    assert again.stderr.count("memory tiny") == 0
    assert (folder / "bench.ru.png").read_bytes()[:4] == b"\x89PNG"
