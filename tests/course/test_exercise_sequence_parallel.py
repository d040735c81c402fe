"""Lesson 12's sequence-parallel exercise (`fsdp_mini.course.exercises.sequence_parallel`): beyond what
tests/course/test_exercise.py checks of every exercise of `all_exercises()` (the reference passes, each planted
mistake fails, an unwritten body is "not yet", the lesson's folded solution is the reference), each planted
mistake's verdict names its own reason, and the reference's names the collectives it counted."""
import pytest

from fsdp_mini.course.exercise import Outcome
from fsdp_mini.course.exercises.sequence_parallel import REDUCE_SCATTER_TO_SEQUENCE as EX

REASONS = {  # each planted mistake, and the words its verdict must contain
    "_all_reduce_then_keep_mine": "CommLog saw in forward: AllReduce (768 B)",
    "_gather_on_the_batch_dim": "the right numbers in the wrong places",
    "_scatter_on_the_batch_dim": "(the sequence is dim 1); got (2, 8, 6)",
    "_no_backward": "outside a torch.autograd.Function, it leaves no node in the graph",
    "_backward_keeps_the_shard": "the gradient of the input slice differs from one process's",
}


def test_the_reference_passes(no_orphans):
    verdict = EX.verdict(EX.reference)
    assert verdict.outcome is Outcome.RIGHT, verdict.detail
    assert "one ReduceScatter in forward and one AllGather in backward" in verdict.detail


@pytest.mark.parametrize("wrong", EX.wrong, ids=lambda f: f.__name__)
def test_a_planted_mistake_fails_with_its_reason(wrong, no_orphans):
    verdict = EX.verdict(wrong)
    assert verdict.outcome is Outcome.WRONG
    assert REASONS[wrong.__name__] in verdict.detail, verdict.detail

