"""One step's collectives summed per (op, group size): the table lesson 07 reads a HYBRID_SHARD step from.

`CommLog.summary` sums per (op, impl). On a hybrid grid the question is which group a collective ran over,
a shard group inside a node or a replica group across nodes, so here the sums are per (op, group size), and
the same sums are taken of logged records and of `fsdp_mini.course.cluster`'s predicted collectives: two
tables that can be compared with `==`.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

__all__ = ["OpTotals", "op_counts", "totals_by_op"]


@dataclass(frozen=True)
class OpTotals:
    """All calls of one op over groups of one size, in one step, on one rank."""

    op: str  # "all_gather", "all_reduce" or "reduce_scatter"
    group: int  # ranks in the group the op ran over
    calls: int
    nbytes: int  # S (the full tensor's bytes), summed over the calls
    sent: int  # bytes this rank sent, summed over the calls


def op_counts(collectives) -> Counter:
    """How many times each (op, group_size, nbytes, sent) occurs: CommRecords count once each, and
    `fsdp_mini.course.cluster.Collective`s `count` times, so a log and a prediction compare with `==`."""
    counts = Counter()
    for c in collectives:
        counts[(c.op, c.group_size, c.nbytes, c.sent)] += getattr(c, "count", 1)
    return counts


def totals_by_op(counts: Counter) -> list[OpTotals]:
    """`op_counts`'s counts summed per (op, group size), sorted by op then group size."""
    sums: dict[tuple[str, int], list[int]] = {}
    for (op, group, nbytes, sent), calls in counts.items():
        row = sums.setdefault((op, group), [0, 0, 0])
        row[0] += calls
        row[1] += calls * nbytes
        row[2] += calls * sent
    return [OpTotals(op, group, *row) for (op, group), row in sorted(sums.items())]
