"""The lessons' code exercises, one module per topic, in lesson order; each exercise is a `CodeExercise`
(`fsdp_mini.course.exercise`) with its judge, its reference solution and the mistakes it must catch, named
"<lesson>.<function>".

  model_states    lesson 00: the bytes of a model's parameters, gradients and optimizer state, and what each
             rank keeps of them under DDP and the ZeRO stages
  p2p_collectives lessons 01, 02: broadcast and the obvious AllReduce, the ring's ReduceScatter and AllGather,
             from send/recv
  ddp_buckets     lesson 03: DDP's gradient hook and end of backward (buckets, async AllReduce), accumulation
             with no_sync
  zero1           lesson 04: ZeRO-1's flat shard with its optimizer, and the step between ReduceScatter and
             AllGather
  flat_param      lesson 05: a flat parameter's unshard (one AllGather, views of one buffer) and its
             gradient's ReduceScatter, against FSDP's own handle
  prefetch        lesson 06: the order backward reaches the units, replayed by FSDP's prefetch; which units backward gathers
             again under each strategy
  mixed_precision lesson 06: the cast policy (compute dtype for floating parameters only, reduce dtype)
  hybrid          lesson 07: the grid's shard and replica groups, HYBRID_SHARD's gradient sync
  port_to_fsdp2   lesson 08: fully_shard bottom-up on a 1-D or 2-D mesh, a full state dict on every rank
  per_parameter   lesson 09: a parameter's dim-0 shard, a unit's unshard (copy-in, AllGather, copy-out),
             its gradients' ReduceScatter
  diagnosis       lesson 10: the first divergence in the ranks' flight records, a forward with
             data-dependent control flow that issues the same collectives on every rank
  activations     lesson 11: which blocks to checkpoint under a memory budget, the tokens per GPU that hide
             an AllGather
  tensor_parallel lesson 12: a row-parallel Linear's forward (its AllReduce and its bias), the 2-D mesh's rank
             grid that keeps tensor parallelism inside a node
  sequence_parallel lesson 12: the pair that leaves a row-parallel region under sequence parallelism
             (ReduceScatter along the sequence forward, AllGather backward)
  planning        lesson 13: the bytes a block keeps under op-level selective checkpointing (against the
             planner and a CPU measurement), the layout for a model, a cluster and a batch (scored by the planner)
"""
from __future__ import annotations

from fsdp_mini.course.exercise import CodeExercise

__all__ = ["all_exercises"]


def all_exercises() -> list[CodeExercise]:
    """Every code exercise of the course, in lesson order (what tests/course/test_exercise.py runs)."""
    from fsdp_mini.course.exercises import (activations, ddp_buckets, diagnosis, flat_param, hybrid, mixed_precision,
                                            model_states, p2p_collectives, per_parameter, planning, port_to_fsdp2,
                                            prefetch, sequence_parallel, tensor_parallel,
                                            zero1)
    return [model_states.MODEL_STATE_BYTES, model_states.BYTES_PER_RANK,
            p2p_collectives.BROADCAST, p2p_collectives.OBVIOUS_ALL_REDUCE,
            p2p_collectives.REDUCE_SCATTER, p2p_collectives.ALL_GATHER,
            ddp_buckets.BUCKET_HOOK, ddp_buckets.FINISH_BACKWARD, ddp_buckets.ACCUMULATE,
            zero1.ZERO1_SHARD, zero1.ZERO1_STEP,
            flat_param.UNSHARD_FLAT, flat_param.REDUCE_GRADIENT, prefetch.BACKWARD_ORDER, prefetch.REGATHERED,
            mixed_precision.CAST_POLICY,
            hybrid.GROUPS_FOR, hybrid.HYBRID_REDUCE, port_to_fsdp2.WRAP_FSDP2, port_to_fsdp2.GATHER_FULL_STATE,
            per_parameter.DIM0_SHARD, per_parameter.UNSHARD, per_parameter.REDUCE_GRADS,
            diagnosis.FIRST_DIVERGENCE, diagnosis.SAME_COLLECTIVES,
            activations.CHOOSE_CHECKPOINTED, activations.TOKENS_TO_HIDE,
            tensor_parallel.ROW_PARALLEL_FORWARD, sequence_parallel.REDUCE_SCATTER_TO_SEQUENCE,
            tensor_parallel.DP_TP_LAYOUT,
            planning.SELECTIVE_OP_BYTES, planning.PICK_LAYOUT]
