"""The ring's arithmetic: how many steps a ring collective takes and how many bytes each rank sends.

One home for the numbers that CommLog counts, the course's cost model prices and its cluster model adds
up (their bus factor, nccl-tests' busbw / algbw, is the course's: `fsdp_mini.course.cost.bus_factor`). A
ring over n ranks cuts the full tensor S into n equal chunks (the last padded) and moves one chunk per
rank per step:

    op               steps       bytes each rank sends
    all_reduce       2(n-1)      2(n-1) * ceil(numel/n) elems
    reduce_scatter   n-1         (n-1) * numel/n elems
    all_gather       n-1         (n-1) * numel/n elems

S is always the full tensor: an all-reduce's tensor, a reduce-scatter's input, an all-gather's output
(there numel is a multiple of n by construction). Pure arithmetic, no torch.
"""
from __future__ import annotations

__all__ = ["RING_OPS", "ring_steps", "chunk_numel", "ring_model_sent"]

RING_OPS = ("all_reduce", "reduce_scatter", "all_gather")


def _check(op: str, n: int) -> None:
    if op not in RING_OPS:
        raise ValueError(f"unknown op {op!r}; valid: {', '.join(RING_OPS)}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n (group size) must be an integer >= 1, got {n!r}")


def ring_steps(op: str, n: int) -> int:
    """Messages on a ring op's critical path, the multiplier of alpha: 2(n-1) for all_reduce, else n-1."""
    _check(op, n)
    return 2 * (n - 1) if op == "all_reduce" else n - 1


def chunk_numel(numel: int, n: int) -> int:
    """Elements of one ring chunk: ceil(numel / n), the last chunk padded to it."""
    return -(-numel // n)


def ring_model_sent(op: str, numel: int, element_size: int, n: int) -> int:
    """Bytes one rank sends in a ring `op` over n ranks; numel is S's element count. Padding is counted,
    exactly as the ring sends it: an all-reduce of 5 elements over 2 ranks sends 2 chunks of 3."""
    return ring_steps(op, n) * chunk_numel(numel, n) * element_size

