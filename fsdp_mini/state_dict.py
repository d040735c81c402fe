"""Full state dicts of a sharded model, both designs: gather the shards back into the original names and shapes.

A full state dict has exactly the keys and shapes of the wrapped module's own `state_dict()`, so it
loads into the plain model, into `torch.distributed.fsdp`, or into fsdp_mini at any world size and
strategy. Saving gathers every unit once (an AllGather of its fp32 shards); loading needs no
communication at all: every rank reads the full tensors and copies out the pieces its shard holds.
For checkpoints too large to gather, see `fsdp_mini.checkpoint` (sharded, torch.distributed.checkpoint).

    sd = fsdp_mini.full_state_dict(model)        # every rank, on CPU: {"blocks.0.attn.qkv.weight": ...}
    fsdp_mini.load_full_state_dict(model, sd)    # strict: every key, every shape, or a clear error

For the flat design (`fsdp_mini.FSDP`) it uses the wrapper's public surface (`handles`, `groups`, `impl`,
`module`, `state_dict_keys`, `reshard()`); for the per-parameter design (`fully_shard`) each parameter's
`FSDPParam`. A per-parameter model's own `state_dict()` is its *sharded* state (DTensors, no
communication), as in FSDP2; this module is how to ask for the full one.
"""
from __future__ import annotations

import torch

from fsdp_mini import collectives as C
from fsdp_mini.comm_log import scope
from fsdp_mini.flat_param import unflatten_views
from fsdp_mini.fsdp_param import FSDPParam
from fsdp_mini.fully_shard import FSDPModule, state_of

__all__ = ["full_state_dict", "load_full_state_dict"]


def _per_parameter(model) -> bool:
    """A model with `fully_shard` applied to it or to some of its modules (the rest stays replicated)."""
    return any(isinstance(m, FSDPModule) for m in model.modules())


def full_state_dict(model) -> dict[str, torch.Tensor]:
    """The unsharded state dict on every rank, on CPU, with the unwrapped module's keys. Collective."""
    if _per_parameter(model):
        return _per_param_full_state_dict(model)
    _check_flat(model)
    return _flat_full_state_dict(model)


def load_full_state_dict(model, state_dict: dict[str, torch.Tensor]) -> None:
    """Load a full state dict (strict); each rank keeps only its shards. No communication."""
    if _per_parameter(model):
        return _per_param_load(model, state_dict)
    _check_flat(model)
    return _flat_load(model, state_dict)


def _check_flat(model) -> None:
    if not all(hasattr(model, a) for a in ("handles", "groups", "state_dict_keys", "reshard")):
        raise ValueError(f"expected a model wrapped by fsdp_mini.FSDP or fully_shard, got {type(model).__name__}")


def _check_keys(expected: list[str], state_dict) -> None:
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in set(expected)]
    if missing or unexpected:
        raise ValueError(f"state dict does not match the model: missing keys {missing}, unexpected keys {unexpected}")


# --- per-parameter design ----------------------------------------------------------------------------

def _fsdp_params(model) -> dict[int, FSDPParam]:
    """id(sharded parameter) -> its FSDPParam, for every unit in `model`."""
    out = {}
    for m in model.modules():
        if isinstance(m, FSDPModule) and state_of(m).group is not None:
            out.update({id(p.sharded): p for p in state_of(m).group.params})
    return out


def _per_param_full_state_dict(model) -> dict[str, torch.Tensor]:
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()  # the module then shows its sharded parameters, under their names
    by_id, gathered = _fsdp_params(model), {}
    out = {}
    for name, t in model.state_dict(keep_vars=True).items():
        p = by_id.get(id(t))
        if p is None:
            out[name] = t.detach().to("cpu", copy=True)
            continue
        if id(p) not in gathered:
            gathered[id(p)] = _gather_param(p)
        out[name] = gathered[id(p)]
    return out


def _gather_param(p: FSDPParam) -> torch.Tensor:
    group = p.mesh.get_group(p.mesh.ndim - 1) if p.n > 1 else None
    full = torch.empty((p.n * p.chunk_rows, *p.shape[1:]), dtype=p.dtype, device=p.padded_shard.device)
    if group is None:
        full.copy_(p.padded_shard)
    else:
        with scope("full_state_dict"):
            C.all_gather_into_tensor(full.view(-1), p.padded_shard.reshape(-1), group=group)
    return full[:p.rows].to("cpu", copy=True)


def _per_param_load(model, state_dict) -> None:
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()
    own = model.state_dict(keep_vars=True)
    _check_keys(list(own), state_dict)
    for name, t in own.items():
        if tuple(state_dict[name].shape) != tuple(t.shape):
            raise ValueError(f"{name}: shape {tuple(state_dict[name].shape)} in the state dict, "
                             f"{tuple(t.shape)} in the model")
    by_id = _fsdp_params(model)
    with torch.no_grad():
        for name, t in own.items():
            p = by_id.get(id(t))
            if p is None:
                t.copy_(state_dict[name])
            else:
                p.padded_shard[:p.local_rows].copy_(state_dict[name][p.row_start:p.row_start + p.local_rows])


# --- flat design ---------------------------------------------------------------------------------------


def _gather_shard(model, h) -> torch.Tensor:
    if model.groups.shard is None:
        return h.shard.detach()
    full = torch.empty(h.layout.padded_numel, dtype=h.shard.dtype, device=h.shard.device)
    with scope("full_state_dict"):
        C.all_gather_into_tensor(full, h.shard.detach(), group=model.groups.shard, impl=model.impl)
    return full


def _flat_full_state_dict(model) -> dict[str, torch.Tensor]:
    values: dict[str, torch.Tensor] = {}
    for h in model.handles:
        full = _gather_shard(model, h)
        for info, view in zip(h.layout.params, unflatten_views(full, h.layout)):
            for name in info.names:
                values[name] = view.detach().to("cpu", copy=True)
    for name, buf in model.module.named_buffers(remove_duplicate=False):
        values[name] = buf.detach().to("cpu", copy=True)
    return {k: values[k] for k in model.state_dict_keys}


def _flat_load(model, state_dict: dict[str, torch.Tensor]) -> None:
    _check_keys(list(model.state_dict_keys), state_dict)
    for h in model.handles:
        for info in h.layout.params:
            got = state_dict[info.names[0]]
            if tuple(got.shape) != tuple(info.shape):
                raise ValueError(f"{info.names[0]}: shape {tuple(got.shape)} in the state dict, "
                                 f"{tuple(info.shape)} in the model")
    model.reshard()  # the gathered copies would be stale
    with torch.no_grad():
        for h in model.handles:
            for piece in h.layout.pieces(model.groups.shard_rank):
                src = state_dict[piece.param.names[0]].reshape(-1)[piece.start:piece.end]
                h.shard[piece.shard_offset:piece.shard_offset + piece.numel].copy_(src)
    buffers = dict(model.module.named_buffers(remove_duplicate=False))
    for name in model.state_dict_keys:
        if name in buffers:
            buffers[name].copy_(state_dict[name])
