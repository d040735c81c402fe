"""The named states of an FSDP unit, shared by both designs (flat `FSDP` and per-parameter `fully_shard`).

PyTorch's FSDP names them the same way (`TrainingState`, `ShardedState`), so a reader, a test or a
debugger can ask a unit or a parameter where it is instead of decoding which fields happen to be None.
"""
from __future__ import annotations

import enum

__all__ = ["TrainingState", "ShardedState", "ReduceStage"]


class TrainingState(enum.Enum):
    """Where a unit is in the training step."""

    IDLE = enum.auto()
    """Between steps."""
    FORWARD = enum.auto()
    """Inside the unit's forward: gathered for it, until its post-forward."""
    PRE_BACKWARD = enum.auto()
    """Backward has reached the unit's outputs: its parameters are gathered (again) for backward."""
    POST_BACKWARD = enum.auto()
    """Backward is done with the unit (per-parameter design): its reduction started, until the end of
    backward returns it to IDLE."""


class ShardedState(enum.Enum):
    """Where a unit's parameter values are."""

    SHARDED = enum.auto()
    """Only this rank's shard exists; the gathered copy has no storage."""
    SHARDED_POST_FORWARD = enum.auto()
    """After forward with `reshard_after_forward=k` (per-parameter design): this rank keeps a 1/k share
    of the gathered parameters, so backward gathers them from k ranks only (ZeRO++'s hpZ)."""
    UNSHARDING = enum.auto()
    """The AllGather into the gathered copy has been issued and not yet waited for."""
    UNSHARDED = enum.auto()
    """The gathered copy holds every parameter; the module computes with it."""


class ReduceStage(enum.Enum):
    """How far the reduction of one backward's gradients has come."""

    SCATTERING = enum.auto()
    """The ReduceScatter into the gradient shard is in flight; the unsharded gradient must live."""
    ACROSS_REPLICAS = enum.auto()
    """The ReduceScatter is done and its input freed; the AllReduce of the shard across replica groups
    (hybrid sharding) is in flight, or there is none to do."""
