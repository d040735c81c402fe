"""The planner's only fitted constants, in one place, and the fit that produced them.

Three numbers turn counted work into seconds; everything else in the planner comes from shapes, published
specifications and the FSDP / TP / CP schedules:

* `MATMUL_FRACTION`: the share of the tensor-core peak that the matrix products of a step reach (GEMMs
  of transformer shapes, with NCCL kernels beside them on the same SMs).
  Causal flash attention is tensor-core work too and runs at the same fraction, on the FLOPs it really does
  (half of the square, backward 2.5 x forward).
* `HBM_FRACTION`: the share of the HBM bandwidth that memory-bound kernels (norms, rotary, SwiGLU, casts,
  the loss, the optimizer step) reach on the bytes they read and write.
* `NETWORK_FRACTION`: the share of the nominal network bandwidth that a ring crossing nodes reaches
  (`step_time.group_link`: min(NVLink, k x NIC) per rank, k the group's GPUs on a node). NVLink is taken
  at its nominal bandwidth.

How they were fitted: on the eight torchtitan A100 rows of `validation.CALIBRATION_ROWS` only (64 x A100-80GB,
FSDP over all 64, as configured: eager, bf16), minimising the sum of squared relative errors of the step
time (published step = tokens per GPU / published tokens/s), by Gauss-Newton on the reciprocals of the
three fractions (`validation.fit`, which runs `fitting.fit_constants`); the values
below are its result, rounded to three digits (tests/course/test_planner.py refits them). Other GPUs use the
same three numbers with their own peaks and bandwidths: no per-row, per-model, per-GPU or per-layout term.

A profile is the same three numbers fitted to someone's own runs (`python -m fsdp_mini fit RUNS.csv --out
PROFILE.json`, `fitting.fit_runs`), which `plan --profile PROFILE.json` uses in their place.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from fsdp_mini.course.planner.json_file import read_json

__all__ = ["Calibration", "CALIBRATION", "MATMUL_FRACTION", "HBM_FRACTION", "NETWORK_FRACTION", "save_profile",
           "load_profile"]


@dataclass(frozen=True)
class Calibration:
    """The three fractions: of the tensor-core peak, of HBM bandwidth, of the network's bandwidth."""

    matmul_fraction: float
    hbm_fraction: float
    network_fraction: float


MATMUL_FRACTION = 0.758
"""Achieved / peak tensor-core FLOP/s of the matrix products (fitted, see the module's docstring)."""
HBM_FRACTION = 0.602
"""Achieved / peak HBM bandwidth of memory-bound kernels (fitted)."""
NETWORK_FRACTION = 0.268
"""Achieved / nominal network bandwidth of rings that cross nodes (fitted)."""

CALIBRATION = Calibration(MATMUL_FRACTION, HBM_FRACTION, NETWORK_FRACTION)


def save_profile(calibration: Calibration, path, **about) -> None:
    """Write `calibration` as a profile (`python -m fsdp_mini fit --out`): its fields under "calibration", and
    whatever `about` says of the fit beside them."""
    profile = {"calibration": dataclasses.asdict(calibration)} | about
    with open(path, "w", encoding="utf-8") as f:
        json.dump(profile, f, indent=1)
        f.write("\n")


def load_profile(path) -> Calibration:
    """The calibration of a profile that `fit` wrote (`plan --profile`); an unknown or missing field, or a value
    that is not a positive number, is an error that names it."""
    profile = read_json(path, "profile")
    values = profile.get("calibration") if isinstance(profile, dict) else None
    if not isinstance(values, dict):
        raise ValueError(f"profile {str(path)!r} has no \"calibration\" object (python -m fsdp_mini fit writes one)")
    names = [f.name for f in dataclasses.fields(Calibration)]
    for name in values:
        if name not in names:
            raise ValueError(f"profile {str(path)!r}: unknown constant {name!r}; constants: {', '.join(names)}")
    for name in names:
        if name not in values:
            raise ValueError(f"profile {str(path)!r}: missing constant {name!r}")
        value = values[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"profile {str(path)!r}: {name}={value!r} must be a positive number")
    return Calibration(**{name: float(values[name]) for name in names})
