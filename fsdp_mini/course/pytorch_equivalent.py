"""The same strategy in PyTorch itself: what fsdp_mini is checked against, and where a learner goes next.

    NO_SHARD             torch.nn.parallel.DistributedDataParallel
    SHARD_GRAD_OP        fully_shard(unit, reshard_after_forward=False) for each unit, then the root
    FULL_SHARD           fully_shard(unit, reshard_after_forward=True) for each unit, then the root
    HYBRID_SHARD         fully_shard on a 2-D DeviceMesh (replicate, shard): FULL_SHARD in each row
    _HYBRID_SHARD_ZERO2  the same mesh with reshard_after_forward=False

`fully_shard` is FSDP2 (torch.distributed.fsdp), which shards each parameter on dim 0 as a DTensor
instead of flattening a unit into one buffer; the collectives per unit and the numbers are the same.
The root gets FSDP2's default (`reshard_after_forward=None`: it keeps its parameters after forward, since
backward needs them first), which is what FSDP1 and `fsdp_mini.FSDP` do with their root unit.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from fsdp_mini.rank_environment import get_device
from fsdp_mini.fsdp.strategy import ShardingStrategy, as_strategy, is_hybrid, reshard_after_forward, shard_group_size

__all__ = ["wrap_like_pytorch", "shard_per_parameter", "pytorch_full_state_dict"]


def wrap_like_pytorch(module: nn.Module, sharding_strategy, wrap=(), shard_size: int | None = None) -> nn.Module:
    """Wrap `module` with PyTorch's own DDP or FSDP2 the way `fsdp_mini.FSDP` would shard it."""
    strategy = as_strategy(sharding_strategy)
    device = get_device()
    if strategy is ShardingStrategy.NO_SHARD:
        module = module.to(device)
        return nn.parallel.DistributedDataParallel(module, device_ids=None if device.type == "cpu" else [device])
    return shard_per_parameter(module, strategy, wrap, shard_size, engine="pytorch")


def shard_per_parameter(module: nn.Module, sharding_strategy, wrap=(), shard_size: int | None = None,
                        engine: str = "fsdp_mini") -> nn.Module:
    """Shard `module` per parameter (`fully_shard` on each `wrap` module, then on `module`) the way
    `fsdp_mini.FSDP(module, sharding_strategy)` shards it flat: `engine` "fsdp_mini" (our fully_shard) or
    "pytorch" (torch.distributed.fsdp.fully_shard). NO_SHARD has no per-parameter form: use DDP."""
    from torch.distributed.device_mesh import init_device_mesh

    if engine == "pytorch":
        from torch.distributed.fsdp import fully_shard
    elif engine == "fsdp_mini":
        from fsdp_mini.fsdp._fully_shard.fully_shard import fully_shard
    else:
        raise ValueError(f"engine must be 'fsdp_mini' or 'pytorch', got {engine!r}")
    strategy = as_strategy(sharding_strategy)
    if strategy is ShardingStrategy.NO_SHARD:
        raise ValueError("NO_SHARD has no per-parameter form: use DistributedDataParallel")
    device = get_device()
    module = module.to(device)
    world = dist.get_world_size()
    if is_hybrid(strategy):
        size = shard_group_size(strategy, world, shard_size)
        mesh = init_device_mesh(device.type, (world // size, size), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh(device.type, (world,))
    reshard = reshard_after_forward(strategy)
    wrap = tuple(wrap) if not isinstance(wrap, type) else (wrap,)
    for sub in [m for name, m in module.named_modules() if name and isinstance(m, wrap)]:
        fully_shard(sub, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(module, mesh=mesh)  # the root keeps its parameters for backward, as FSDP1's does
    return module


def pytorch_full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The full state dict of a model from `wrap_like_pytorch`, on CPU, with the original keys."""
    if isinstance(model, nn.parallel.DistributedDataParallel):
        return {k: v.detach().cpu().clone() for k, v in model.module.state_dict().items()}
    out = {}
    for k, v in model.state_dict().items():
        full = v.full_tensor() if hasattr(v, "full_tensor") else v
        out[k] = full.detach().cpu().clone()
    return out
