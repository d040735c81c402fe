"""The alpha-beta (latency-bandwidth) model: how long a collective takes, on paper.

Sending one message of S bytes costs `alpha + S / bandwidth`: a fixed latency alpha (seconds) plus the
bytes over the link's bandwidth (bytes/s). This is Hockney's model (R. Hockney, "The communication
challenge for MPP: Intel Paragon and Meiko CS-2", Parallel Computing, 1994). Counting the messages on
the critical path of each algorithm gives its time; Thakur, Rabenseifner and Gropp, "Optimization of
collective communication operations in MPICH" (IJHPCA, 2005) derive them all. Here S is always the
*full* tensor's size (reduce-scatter: its input; all-gather: its output) and n the group size:

    ring all-reduce        2(n-1) alpha + 2(n-1)/n S/bandwidth
    ring reduce-scatter     (n-1) alpha +  (n-1)/n S/bandwidth   (all-gather: the same)
    naive all-reduce       2(n-1) (alpha + S/bandwidth)          (reduce to a root, broadcast back)
    tree all-reduce        2 ceil(log2 n) (alpha + S/bandwidth)  (binary tree, not pipelined)

Why it matters for FSDP: a ring all-reduce *is* a reduce-scatter followed by an all-gather, which is
why sharding (reduce-scatter gradients, all-gather parameters) costs DDP's communication volume, and
the ring's bandwidth term tends to 2S/bandwidth whatever n is: it is bandwidth-optimal (Patarasuk and
Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations", JPDC, 2009). Its
latency term grows with n, which is why small messages (many small FSDP units) hurt.

What the model ignores: contention between links that share a switch or a PCIe root, the time to
compute the reduction (Thakur et al.'s gamma term), pipelining (NCCL pipelines trees into chunks, which
brings their bandwidth term close to the ring's), hierarchical topologies (NVLink within a node,
network across) and protocol overheads. Use it to reason about trends and to fit measurements with
`fit_alpha_beta`; trust a benchmark over it for absolute numbers.

`bus_factor`, `algbw` and `busbw` follow nccl-tests' conventions, so our benchmarks and theirs compare.
`ring_steps` is the library's ring arithmetic (`fsdp_mini.ring_model`, what CommLog counts), used here.
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

from fsdp_mini.ring_model import RING_OPS as _OPS
from fsdp_mini.ring_model import ring_steps

__all__ = [
    "ring_all_reduce",
    "ring_reduce_scatter",
    "ring_all_gather",
    "naive_all_reduce",
    "tree_all_reduce",
    "predict",
    "ring_steps",
    "bus_factor",
    "algbw",
    "busbw",
    "AlphaBeta",
    "fit_alpha_beta",
]


def _ring(op: str, nbytes: float, n: int, alpha: float, bandwidth: float) -> float:
    """A ring op: ring_steps messages of S/n bytes, one after another (`fsdp_mini.ring_model`)."""
    _check(nbytes, n, alpha, bandwidth)
    return ring_steps(op, n) * alpha + bus_factor(op, n) * nbytes / bandwidth


def ring_all_reduce(nbytes: float, n: int, alpha: float, bandwidth: float) -> float:
    """Ring all-reduce: n-1 reduce-scatter steps then n-1 all-gather steps, each moving S/n bytes."""
    return _ring("all_reduce", nbytes, n, alpha, bandwidth)


def ring_reduce_scatter(nbytes: float, n: int, alpha: float, bandwidth: float) -> float:
    """Ring reduce-scatter of an S-byte input: n-1 steps, each sending one S/n chunk to the next rank."""
    return _ring("reduce_scatter", nbytes, n, alpha, bandwidth)


def ring_all_gather(nbytes: float, n: int, alpha: float, bandwidth: float) -> float:
    """Ring all-gather of an S-byte output: the reverse of reduce-scatter, so the same time."""
    return ring_reduce_scatter(nbytes, n, alpha, bandwidth)


def naive_all_reduce(nbytes: float, n: int, alpha: float, bandwidth: float) -> float:
    """Reduce to a root, then broadcast from it: the root's link carries all 2(n-1) full messages."""
    _check(nbytes, n, alpha, bandwidth)
    if n == 1:
        return 0.0
    return 2 * (n - 1) * (alpha + nbytes / bandwidth)


def tree_all_reduce(nbytes: float, n: int, alpha: float, bandwidth: float) -> float:
    """Binary-tree reduce then broadcast, unpipelined: 2 ceil(log2 n) rounds of one full message."""
    _check(nbytes, n, alpha, bandwidth)
    if n == 1:
        return 0.0
    depth = (n - 1).bit_length()  # ceil(log2 n), exactly, for integers n >= 1
    return 2 * depth * (alpha + nbytes / bandwidth)


_MODELS: dict[tuple[str, str], Callable[[float, int, float, float], float]] = {
    ("all_reduce", "ring"): ring_all_reduce,
    ("all_reduce", "naive"): naive_all_reduce,
    ("all_reduce", "tree"): tree_all_reduce,
    ("reduce_scatter", "ring"): ring_reduce_scatter,
    ("all_gather", "ring"): ring_all_gather,
}
_ALGORITHMS = ("ring", "naive", "tree")
_BUS_OPS = _OPS + ("broadcast", "reduce")


def predict(
    op: str, nbytes: float, n: int, alpha: float, bandwidth: float, algorithm: str = "ring"
) -> float:
    """Predicted seconds for collective `op` with `algorithm`; naive and tree exist for all_reduce only."""
    _check_op(op, _OPS)
    if algorithm not in _ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; valid: {', '.join(_ALGORITHMS)}")
    if (op, algorithm) not in _MODELS:
        raise ValueError(f"algorithm {algorithm!r} is modelled for all_reduce only, not {op!r}")
    return _MODELS[op, algorithm](nbytes, n, alpha, bandwidth)


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busbw / algbw ratio: the fraction of S that each rank's link must carry.

    all_reduce 2(n-1)/n; reduce_scatter and all_gather (n-1)/n; broadcast and reduce 1. The formulas
    are used literally, as nccl-tests does, so for n == 1 the first three are 0 (no byte crosses a
    link, so busbw is 0) while broadcast and reduce stay 1.
    """
    _check_op(op, _BUS_OPS)
    _check_n(n)
    if op in ("broadcast", "reduce"):
        return 1.0
    return ring_steps(op, n) / n


def algbw(nbytes: float, seconds: float) -> float:
    """Algorithm bandwidth S / t: what the caller sees, but it falls with n even on saturated links."""
    if not nbytes >= 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes!r}")
    if not seconds > 0:
        raise ValueError(f"seconds must be > 0, got {seconds!r}")
    return nbytes / seconds


def busbw(op: str, nbytes: float, n: int, seconds: float) -> float:
    """Bus bandwidth algbw * bus_factor: the bytes per second each rank's link actually carried.

    A bandwidth-optimal algorithm sends bus_factor * S bytes over every link, so this number does not
    depend on n and approaches the hardware's link bandwidth as messages grow: it is the one to compare
    with NVLink or NIC specifications (for the ring model with alpha = 0, busbw equals `bandwidth`).
    """
    return algbw(nbytes, seconds) * bus_factor(op, n)


class AlphaBeta(NamedTuple):
    """A fitted link: latency `alpha` in seconds, `bandwidth` in bytes/s (beta = 1 / bandwidth)."""

    alpha: float
    bandwidth: float


def fit_alpha_beta(op: str, n: int, sizes: Sequence[float], seconds: Sequence[float]) -> AlphaBeta:
    """Least-squares (alpha, bandwidth) from measured times of ring `op` on `n` ranks.

    The model t = ring_steps * alpha + bus_factor * S / bandwidth is a straight line in S, so this is
    a line fit: intercept / ring_steps is alpha, bus_factor / slope is bandwidth. Noise on tiny
    messages can push the intercept below zero, which no link has; then the best fit with alpha >= 0
    lies on the boundary, so we refit a line through the origin and report alpha = 0.
    """
    _check_op(op, _OPS)
    _check_n(n)
    if n == 1:
        raise ValueError("n must be >= 2 to fit: with one rank no message is sent")
    xs, ts = [float(s) for s in sizes], [float(t) for t in seconds]
    if len(xs) != len(ts):
        raise ValueError(f"sizes and seconds differ in length: {len(xs)} != {len(ts)}")
    if any(not x >= 0 for x in xs) or any(not t >= 0 for t in ts):
        raise ValueError("sizes and seconds must all be >= 0")
    if len(set(xs)) < 2:
        raise ValueError("need at least two distinct sizes to separate latency from bandwidth")
    x_mean, t_mean = sum(xs) / len(xs), sum(ts) / len(ts)
    slope = sum((x - x_mean) * (t - t_mean) for x, t in zip(xs, ts)) / sum((x - x_mean) ** 2 for x in xs)
    intercept = t_mean - slope * x_mean
    if intercept < 0:
        slope, intercept = sum(x * t for x, t in zip(xs, ts)) / sum(x * x for x in xs), 0.0
    if not slope > 0:
        raise ValueError("times do not grow with size, so bandwidth cannot be fitted: measure larger sizes")
    return AlphaBeta(alpha=intercept / ring_steps(op, n), bandwidth=bus_factor(op, n) / slope)


def _check_op(op: str, valid: Sequence[str]) -> None:
    if op not in valid:
        raise ValueError(f"unknown op {op!r}; valid: {', '.join(valid)}")


def _check_n(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n (group size) must be an integer >= 1, got {n!r}")


def _check(nbytes: float, n: int, alpha: float, bandwidth: float) -> None:
    _check_n(n)
    if not nbytes >= 0:  # `not >=` also rejects NaN
        raise ValueError(f"nbytes must be >= 0, got {nbytes!r}")
    if not alpha >= 0:
        raise ValueError(f"alpha must be >= 0 seconds, got {alpha!r}")
    if not bandwidth > 0:
        raise ValueError(f"bandwidth must be > 0 bytes/s, got {bandwidth!r}")
