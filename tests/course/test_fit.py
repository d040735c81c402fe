"""`python -m fsdp_mini fit RUNS.csv --out PROFILE.json` and `plan --profile`: fitted to three of torchtitan's
published H100 runs the planner carries (`validation.HELD_OUT_ROWS`, benchmarks/llama3_h100_202412_torchtitan.md,
table 1: FSDP on 8 GPUs), the other runs of that benchmark improve; the errors printed are each run's; bad files and
too few runs are errors that name what is wrong."""
import csv
import dataclasses
import json

import pytest
from cli_in_process import run_main

from fsdp_mini.course.planner import CALIBRATION, get_gpu, get_model
from fsdp_mini.course.planner.calibration import load_profile
from fsdp_mini.course.planner.fitting import CONSTANTS, MeasuredRun, fit_constants, undetermined
from fsdp_mini.course.planner.step_time import step_time
from fsdp_mini.course.planner.validation import HELD_OUT_ROWS

BENCHMARK = [r for r in HELD_OUT_ROWS if r.source == "H100, Dec 2024"]
FITTED = [r for r in BENCHMARK if r.gpus == 8 and r.cp == 1 and r.seq == 8192]  # table 1: eager, compile, float8
HELD_OUT = [r for r in BENCHMARK if r not in FITTED]
COLUMNS = ["model", "gpu", "gpus", "seq", "local_batch", "ac", "tp", "sp", "cp", "compile", "float8", "compile_loss",
           "tokens_per_s_per_gpu", "memory_gib"]


def csv_row(r) -> dict:
    layout = r.layout()
    return {"model": r.model, "gpu": r.gpu, "gpus": r.gpus, "seq": r.seq, "local_batch": r.local_batch,
            "ac": r.ac.value, "tp": r.tp, "sp": str(layout.sp).lower(), "cp": r.cp, "compile": str(r.compile).lower(),
            "float8": str(r.float8).lower(), "compile_loss": str(r.compile_loss).lower(),
            "tokens_per_s_per_gpu": r.tokens_per_s, "memory_gib": r.memory_gib}


def write_runs(path, rows, columns=COLUMNS):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(csv_row(r) for r in rows)
    return str(path)


def error(row, calibration) -> float:
    rate = step_time(get_model(row.model), get_gpu(row.gpu), row.layout(), calibration).tokens_per_s_per_gpu
    return rate / row.tokens_per_s - 1


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fit")
    out = run_main("fit", write_runs(folder / "runs.csv", FITTED), "--out", str(folder / "profile.json"))
    return out, str(folder / "profile.json")


def test_the_table_splits_as_the_test_means():
    assert len(FITTED) == 3 and len(HELD_OUT) == 8
    assert {(r.compile, r.float8) for r in FITTED} == {(False, False), (True, False), (True, True)}


def test_fit_prints_each_runs_error_before_and_after(fitted):
    out, profile = fitted
    assert out.returncode == 0, out.stderr
    after = load_profile(profile)
    lines = out.stdout.splitlines()
    for row in FITTED:
        measured = f"{row.tokens_per_s:10,.0f}"
        [line] = [line for line in lines if measured in line and line.startswith(row.model)]
        assert f"{error(row, CALIBRATION) * 100:+7.1f}%" in line
        assert f"{error(row, after) * 100:+7.1f}%" in line
    assert after != CALIBRATION


def test_fitting_improves_the_runs_it_fitted_and_the_held_out_runs_of_the_same_benchmark(fitted):
    after = load_profile(fitted[1])
    assert sum(error(r, after) ** 2 for r in FITTED) < sum(error(r, CALIBRATION) ** 2 for r in FITTED)
    for row in HELD_OUT:
        assert abs(error(row, after)) < abs(error(row, CALIBRATION)), (row, error(row, after))


def test_one_node_runs_leave_the_network_undetermined_and_say_so(fitted):
    out, profile = fitted
    [line] = [line for line in out.stdout.splitlines() if line.startswith("network_fraction")]
    assert "kept" in line
    data = json.loads(open(profile).read())
    assert list(data["undetermined"]) == ["network_fraction"] and data["fitted"] == ["matmul_fraction", "hbm_fraction"]
    assert load_profile(profile).network_fraction == CALIBRATION.network_fraction
    runs = [MeasuredRun(get_model(r.model), get_gpu(r.gpu), r.layout(), r.tokens_per_s) for r in BENCHMARK]
    assert undetermined(runs) == ()  # with the 128- and 256-GPU runs every constant moves some step


def test_plan_with_the_profile_uses_its_constants(fitted):
    row = HELD_OUT[0]
    args = ["plan", "--model", row.model, "--gpu", row.gpu, "--gpus", str(row.gpus), "--seq", str(row.seq),
            "--local-batch", str(row.local_batch), "--ac", row.ac.value, "--json"] + (
        ["--compile"] if row.compile else []) + (["--float8"] if row.float8 else [])
    with_profile, without = run_main(*args, "--profile", fitted[1]), run_main(*args)
    assert with_profile.returncode == 0, with_profile.stderr
    got = json.loads(with_profile.stdout)["tokens_per_s_per_gpu"]
    assert got == pytest.approx(row.tokens_per_s * (1 + error(row, load_profile(fitted[1]))), rel=1e-12)
    assert got != json.loads(without.stdout)["tokens_per_s_per_gpu"]


def test_missing_columns_take_the_flags_defaults(tmp_path):
    """torchtitan's A100 rows in the fewest columns (tp, cp, compile... left out) fit the shipped constants (which
    validation.fit fitted on them, tests/course/test_planner.py)."""
    from fsdp_mini.course.planner.validation import CALIBRATION_ROWS

    runs = write_runs(tmp_path / "runs.csv", CALIBRATION_ROWS,
                      ["model", "gpu", "gpus", "seq", "local_batch", "ac", "tokens_per_s_per_gpu"])
    out = run_main("fit", runs, "--out", str(tmp_path / "p.json"))
    assert out.returncode == 0, out.stderr
    got = load_profile(tmp_path / "p.json")
    for name in CONSTANTS:
        assert getattr(got, name) == pytest.approx(getattr(CALIBRATION, name), abs=6e-4), name


def test_too_few_runs_is_an_error_naming_both_counts(tmp_path):
    out = run_main("fit", write_runs(tmp_path / "runs.csv", FITTED[:2]), "--out", str(tmp_path / "p.json"))
    assert out.returncode == 2 and f"2 runs cannot fit {len(CONSTANTS)} constants" in out.stderr


@pytest.mark.parametrize("header, message", [
    (COLUMNS[:-2] + ["tokens"], "unknown column 'tokens'"),
    (COLUMNS[:-2], "missing column 'tokens_per_s_per_gpu'"),
    ([c for c in COLUMNS if c != "seq"], "missing column 'seq'"),
])
def test_a_bad_header_names_the_column(tmp_path, header, message):
    path = tmp_path / "runs.csv"
    path.write_text(",".join(header) + "\n")
    out = run_main("fit", str(path), "--out", str(tmp_path / "p.json"))
    assert out.returncode == 2 and message in out.stderr, out.stderr


@pytest.mark.parametrize("column, value, message", [
    ("ac", "sometimes", "runs.csv line 3: ac='sometimes' must be one of none, selective-op"),
    ("compile", "maybe", "runs.csv line 3: compile='maybe' must be true or false"),
    ("tokens_per_s_per_gpu", "-5", "runs.csv line 3: tokens_per_s_per_gpu='-5' must be a positive number"),
    ("model", "llama9", "runs.csv line 3: unknown model 'llama9'"),
    ("seq", "", "runs.csv line 3: seq is empty"),
])
def test_a_bad_cell_names_its_line_column_and_value(tmp_path, column, value, message):
    path = write_runs(tmp_path / "runs.csv", FITTED)
    lines = open(path).read().splitlines()
    cells = lines[2].split(",")
    cells[COLUMNS.index(column)] = value
    lines[2] = ",".join(cells)
    open(path, "w").write("\n".join(lines) + "\n")
    out = run_main("fit", path, "--out", str(tmp_path / "p.json"))
    assert out.returncode == 2 and message in out.stderr, out.stderr


@pytest.mark.parametrize("profile, message", [
    ({"calibration": {"matmul_fraction": 0.7, "hbm_fraction": 0.6}}, "missing constant 'network_fraction'"),
    ({"calibration": dict(zip(CONSTANTS, (0.7, 0.6, 0.3))) | {"fudge": 1}}, "unknown constant 'fudge'"),
    ({"calibration": dict(zip(CONSTANTS, (0.7, 0.0, 0.3)))}, "hbm_fraction=0.0 must be a positive number"),
    ({"constants": {}}, "has no \"calibration\" object"),
])
def test_a_bad_profile_names_what_is_wrong(tmp_path, profile, message):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile))
    out = run_main("plan", "--model", "gpt2", "--gpu", "h100-sxm", "--gpus", "8", "--seq", "1024", "--local-batch", "1",
                   "--profile", str(path))
    assert out.returncode == 2 and message in out.stderr, out.stderr


def test_fit_constants_keeps_what_it_is_not_given(tmp_path):
    runs = [MeasuredRun(get_model(r.model), get_gpu(r.gpu), r.layout(), r.tokens_per_s) for r in FITTED]
    got = fit_constants(runs, free=("matmul_fraction",))
    assert (got.hbm_fraction, got.network_fraction) == (CALIBRATION.hbm_fraction, CALIBRATION.network_fraction)
    assert got.matmul_fraction != CALIBRATION.matmul_fraction
    with pytest.raises(ValueError, match="unknown constant 'speed'"):
        fit_constants(runs, free=("speed",))


def test_runs_of_one_shape_cannot_tell_the_compute_fractions_apart(tmp_path):
    """Three runs of one layout, measured at three rates: every step moves with both compute fractions alike, so the
    fit keeps the HBM fraction, says why, and fits the matmul fraction alone."""
    row = FITTED[0]
    rows = [dataclasses.replace(row, tokens_per_s=row.tokens_per_s * k) for k in (0.98, 1.0, 1.02)]
    out = run_main("fit", write_runs(tmp_path / "runs.csv", rows), "--out", str(tmp_path / "p.json"))
    assert out.returncode == 0, out.stderr
    [line] = [line for line in out.stdout.splitlines() if line.startswith("hbm_fraction")]
    assert "kept: the runs move it only together with matmul_fraction" in line
    got = load_profile(tmp_path / "p.json")
    assert got.hbm_fraction == CALIBRATION.hbm_fraction and got.matmul_fraction != CALIBRATION.matmul_fraction
