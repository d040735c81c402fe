"""Full state dicts of an FSDP model: gather the shards back into the original names and shapes.

A full state dict has exactly the keys and shapes of the wrapped module's own `state_dict()`, so it
loads into the plain model, into `torch.distributed.fsdp`, or into fsdp_mini at any world size and
strategy. Saving gathers every unit once (an AllGather of its fp32 shards); loading needs no
communication at all: every rank reads the full tensors and copies out the pieces its shard holds.
For checkpoints too large to gather, see `fsdp_mini.checkpoint` (sharded, torch.distributed.checkpoint).

It works on an `fsdp_mini.FSDP` model through its public surface only (`handles`, `groups`, `impl`,
`module`, `state_dict_keys`, `reshard()`); `FSDP.full_state_dict` and `FSDP.load_full_state_dict` call it.
"""
from __future__ import annotations

import torch

from fsdp_mini import collectives as C
from fsdp_mini.comm_log import scope
from fsdp_mini.flat_param import unflatten_views

__all__ = ["full_state_dict", "load_full_state_dict"]


def _gather_shard(model, h) -> torch.Tensor:
    if model.groups.shard is None:
        return h.shard.detach()
    full = torch.empty(h.layout.padded_numel, dtype=h.shard.dtype, device=h.shard.device)
    with scope("full_state_dict"):
        C.all_gather_into_tensor(full, h.shard.detach(), group=model.groups.shard, impl=model.impl)
    return full


def full_state_dict(model) -> dict[str, torch.Tensor]:
    values: dict[str, torch.Tensor] = {}
    for h in model.handles:
        full = _gather_shard(model, h)
        for info, view in zip(h.layout.params, unflatten_views(full, h.layout)):
            for name in info.names:
                values[name] = view.detach().to("cpu", copy=True)
    for name, buf in model.module.named_buffers(remove_duplicate=False):
        values[name] = buf.detach().to("cpu", copy=True)
    return {k: values[k] for k in model.state_dict_keys}


def load_full_state_dict(model, state_dict: dict[str, torch.Tensor]) -> None:
    expected = set(model.state_dict_keys)
    missing = [k for k in model.state_dict_keys if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected]
    if missing or unexpected:
        raise ValueError(f"state dict does not match the model: missing keys {missing}, unexpected keys {unexpected}")
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
