"""Full state dicts of a sharded model, either design: the shards gathered back into the original names and shapes.

A full state dict has exactly the keys and shapes of the wrapped module's own `state_dict()`, so it
loads into the plain model, into `torch.distributed.fsdp`, or into fsdp_mini at any world size and
strategy. Saving gathers every unit once (an AllGather of its fp32 shards); loading needs no
communication at all: every rank reads the full tensors and copies out the pieces its shard holds.
For checkpoints too large to gather, see `fsdp_mini.checkpoint.sharded_checkpoint` (sharded, torch.distributed.checkpoint).

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

from fsdp_mini.fsdp.fully_sharded_data_parallel import FSDP
from fsdp_mini.fsdp.full_state import check_full_state_dict
from fsdp_mini.fsdp._fully_shard.fully_shard import FSDPModule
from fsdp_mini.fsdp._fully_shard.fully_shard import full_state_dict as per_parameter_full_state_dict
from fsdp_mini.fsdp._fully_shard.fully_shard import load_full_state_dict as per_parameter_load
from fsdp_mini.torch_internals import save_own_state

__all__ = ["full_state_dict", "load_full_state_dict", "sharding_design", "flat_wrappers", "own_state"]


def flat_wrappers(model: nn.Module) -> list[tuple[str, FSDP]]:
    """(prefix, wrapper) of every `FSDP` in `model`: [("", model)] for a wrapper itself, and for a module that
    holds FSDP parts (a training module with `self.model = FSDP(...)`, a ModuleDict of two wrapped parts) each
    part under its key prefix (`"model."`)."""
    return [(name + "." if name else "", m) for name, m in model.named_modules() if isinstance(m, FSDP)]


def own_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The entries of `model.state_dict(keep_vars=True)` outside its FSDP parts (the holder's own parameters and
    buffers; {} for a wrapper itself), found without gathering anything."""
    out: dict[str, torch.Tensor] = {}

    def visit(module: nn.Module, prefix: str) -> None:
        if isinstance(module, FSDP):
            return
        save_own_state(module, out, prefix)
        for name, child in module.named_children():
            visit(child, prefix + name + ".")

    visit(model, "")
    return out


def sharding_design(model: nn.Module) -> str:
    """"per-parameter" for a model with `fully_shard` applied to it or to some of its modules (the rest stays
    replicated), "flat" for an `FSDP` wrapper or a module that holds FSDP wrappers; anything else, and a model
    that mixes the two designs, is a ValueError. The one test of which design a model uses: the full state
    dicts here and the sharded checkpoints (`fsdp_mini.checkpoint.sharded_checkpoint`) both ask it."""
    flat = any(isinstance(m, FSDP) for m in model.modules())
    per_parameter = any(isinstance(m, FSDPModule) for m in model.modules())
    if flat and per_parameter:
        raise ValueError(f"{type(model).__name__} holds both an FSDP wrapper and fully_shard modules: a state dict or "
                         f"checkpoint covers one design at a time; use one design for the whole model")
    if flat:
        return "flat"
    if per_parameter:
        return "per-parameter"
    raise ValueError(f"expected a model wrapped by fsdp_mini.FSDP or fully_shard (or holding such a part), got "
                     f"{type(model).__name__}")


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded state dict on every rank, on CPU, with the unwrapped module's keys (a holder of FSDP parts:
    its own keys, each part's under its prefix). Collective."""
    if sharding_design(model) != "flat":
        return per_parameter_full_state_dict(model)
    if isinstance(model, FSDP):
        return model.full_state_dict()
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def load_full_state_dict(model: nn.Module, state_dict: dict[str, torch.Tensor]) -> None:
    """Load a full state dict (strict: every key and shape checked before anything is copied); each rank
    keeps only its shards. No communication."""
    if sharding_design(model) != "flat":
        per_parameter_load(model, state_dict)
    elif isinstance(model, FSDP):
        model.load_full_state_dict(state_dict)
    else:
        expected = {k: tuple(t.shape) for k, t in own_state(model).items() if torch.is_tensor(t)}
        for prefix, wrapper in flat_wrappers(model):
            expected.update({prefix + k: shape for k, shape in wrapper.full_shapes().items()})
        check_full_state_dict(expected, state_dict)
        model.load_state_dict(state_dict)
