"""A full state dict in both designs: what it must be, the keys and shapes of the unwrapped module's own
`state_dict()`, and how a sharded tensor becomes whole for it. One check for the flat design
(`FSDP.load_full_state_dict`) and the per-parameter one (`fully_shard.load_full_state_dict`), run before
anything is copied, so a wrong file fails on every rank with the same clear message and leaves the model
as it was; one gather of a shard for both (`FlatParamHandle.full_state`, `FSDPParam.gather_full`)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from fsdp_mini import collectives as C
from fsdp_mini.collective_calls import scope

__all__ = ["check_full_state_dict", "gather_shards"]


def gather_shards(shard: torch.Tensor, group=None, impl: str = "builtin") -> torch.Tensor:
    """Every rank's `shard` of `group`, concatenated along dim 0, in a new tensor: one AllGather
    (collective, labelled "full_state_dict" in CommLog), or a copy when `group` is None (this rank holds
    all of it). Padding stays: the caller cuts it off."""
    if group is None:
        return shard.detach().clone()
    n = dist.get_world_size(group)
    full = torch.empty((n * shard.shape[0], *shard.shape[1:]), dtype=shard.dtype, device=shard.device)
    with scope("full_state_dict"):
        C.all_gather_into_tensor(full.view(-1), shard.detach().reshape(-1), group=group, impl=impl)
    return full


def check_full_state_dict(expected: dict[str, tuple[int, ...]], state_dict: dict[str, torch.Tensor]) -> None:
    """Strict: every key of `expected` (name -> shape) and no other, each with its shape; else ValueError."""
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected]
    if missing or unexpected:
        raise ValueError(f"state dict does not match the model: missing keys {missing}, unexpected keys {unexpected}")
    for name, shape in expected.items():
        if tuple(state_dict[name].shape) != tuple(shape):
            raise ValueError(f"{name}: shape {tuple(state_dict[name].shape)} in the state dict, "
                             f"{tuple(shape)} in the model")
