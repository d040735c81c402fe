"""Full state dicts of a sharded model, either design: the shards gathered back into the original names and shapes.

A full state dict has exactly the keys and shapes of the wrapped module's own `state_dict()`, so it
loads into the plain model, into `torch.distributed.fsdp`, or into fsdp_mini at any world size and
strategy. Saving gathers every unit once (an AllGather of its fp32 shards); loading needs no
communication at all: every rank reads the full tensors and copies out the pieces its shard holds.
For checkpoints too large to gather, see `fsdp_mini.checkpoint` (sharded, torch.distributed.checkpoint).

    sd = fsdp_mini.full_state_dict(model)        # every rank, on CPU: {"blocks.0.attn.qkv.weight": ...}
    fsdp_mini.load_full_state_dict(model, sd)    # strict: every key, every shape, or a clear error

This module only dispatches; each design keeps its half beside its engine: the flat design in
`FSDP.full_state_dict` (gathering each `FlatParamHandle`), the per-parameter one in
`fully_shard.full_state_dict` (gathering each `FSDPParam`). A per-parameter model's own `state_dict()` is
its *sharded* state (DTensors, no communication), as in FSDP2; this is how to ask for the full one.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from fsdp_mini.fsdp import FSDP
from fsdp_mini.fully_shard import FSDPModule
from fsdp_mini.fully_shard import full_state_dict as per_parameter_full_state_dict
from fsdp_mini.fully_shard import load_full_state_dict as per_parameter_load

__all__ = ["full_state_dict", "load_full_state_dict", "sharding_design"]


def sharding_design(model: nn.Module) -> str:
    """"per-parameter" for a model with `fully_shard` applied to it or to some of its modules (the rest stays
    replicated), "flat" for an `FSDP` wrapper; anything else is a ValueError. The one test of which design a
    model uses: the full state dicts here and the sharded checkpoints (`fsdp_mini.checkpoint`) both ask it."""
    if isinstance(model, FSDP):
        return "flat"
    if any(isinstance(m, FSDPModule) for m in model.modules()):
        return "per-parameter"
    raise ValueError(f"expected a model wrapped by fsdp_mini.FSDP or fully_shard, got {type(model).__name__}")


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded state dict on every rank, on CPU, with the unwrapped module's keys. Collective."""
    return model.full_state_dict() if sharding_design(model) == "flat" else per_parameter_full_state_dict(model)


def load_full_state_dict(model: nn.Module, state_dict: dict[str, torch.Tensor]) -> None:
    """Load a full state dict (strict); each rank keeps only its shards. No communication."""
    if sharding_design(model) == "flat":
        model.load_full_state_dict(state_dict)
    else:
        per_parameter_load(model, state_dict)
