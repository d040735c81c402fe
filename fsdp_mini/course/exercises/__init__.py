"""The lessons' code exercises, one module per lesson topic; each exercise is a `CodeExercise`
(`fsdp_mini.course.exercise`) with its judge, its reference solution and the mistakes it must catch.

  per_parameter   lesson 09: a parameter's dim-0 shard, a unit's unshard (copy-in, AllGather, copy-out),
                  its gradients' ReduceScatter
"""
from __future__ import annotations

from fsdp_mini.course.exercise import CodeExercise

__all__ = ["all_exercises"]


def all_exercises() -> list[CodeExercise]:
    """Every code exercise of the course (what tests/test_exercises.py runs)."""
    from fsdp_mini.course.exercises import per_parameter
    return [per_parameter.DIM0_SHARD, per_parameter.UNSHARD, per_parameter.REDUCE_GRADS]
