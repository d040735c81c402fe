"""`fsdp_mini.course.op_totals`: a CommLog and `cluster`'s prediction of the same calls count alike, and the
sums per (op, group size) are what lesson 07's table and its byte-for-byte assert read."""
from collections import Counter

from fsdp_mini.comm_log import CommRecord
from fsdp_mini.course.cluster import Collective
from fsdp_mini.course.op_totals import OpTotals, op_counts, totals_by_op


def record(op, group_size, nbytes, sent):
    return CommRecord(op, "builtin", nbytes, sent, group_size, rank=0, start=0.0, end=0.0)


def test_a_log_and_a_prediction_of_the_same_calls_count_alike():
    logged = [record("all_gather", 2, 100, 50)] * 3 + [record("all_reduce", 2, 40, 40)]
    predicted = [Collective("all_gather", 100, 2, count=3, crosses_nodes=False, seconds=1e-3, sent=50),
                 Collective("all_reduce", 40, 2, count=1, crosses_nodes=True, seconds=1e-3, sent=40)]
    expected = Counter({("all_gather", 2, 100, 50): 3, ("all_reduce", 2, 40, 40): 1})
    assert op_counts(logged) == op_counts(predicted) == expected
    assert op_counts(logged[1:]) != op_counts(predicted)  # one call fewer is seen


def test_totals_sum_calls_bytes_and_sent_per_op_and_group_size_in_order():
    counts = Counter({("reduce_scatter", 2, 80, 40): 2, ("all_gather", 4, 120, 90): 1,
                      ("all_gather", 2, 60, 30): 1, ("all_gather", 2, 100, 50): 2})
    assert totals_by_op(counts) == [
        OpTotals("all_gather", 2, calls=1 + 2, nbytes=60 + 2 * 100, sent=30 + 2 * 50),
        OpTotals("all_gather", 4, calls=1, nbytes=120, sent=90),
        OpTotals("reduce_scatter", 2, calls=2, nbytes=2 * 80, sent=2 * 40),
    ]
