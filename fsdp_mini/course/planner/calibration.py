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
three fractions (`validation.fit`); the values
below are its result, rounded to three digits (tests/course/test_planner.py refits them). Other GPUs use the
same three numbers with their own peaks and bandwidths: no per-row, per-model, per-GPU or per-layout term.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Calibration", "CALIBRATION", "MATMUL_FRACTION", "HBM_FRACTION", "NETWORK_FRACTION"]


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
