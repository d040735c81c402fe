"""FSDP2's `replicate`: data parallelism through `fully_shard`'s units, PyTorch's
`torch.distributed._composable.replicate_with_fsdp.replicate`, from scratch.

    for block in model.blocks:
        replicate(block)            # each block: one unit, its gradients averaged by one AllReduce
    replicate(model)                # the root: the rest (embeddings, head)
    opt = torch.optim.AdamW(model.parameters())   # every parameter a DTensor placed Replicate()

PyTorch 2.13 has two replicates. `fsdp_mini.replicate` is the first, DDP as a composable API (buckets of
parameters, plain tensors, applied once to the module that holds what `fully_shard` leaves over). This is the
second (torch/distributed/_composable/replicate_with_fsdp.py): FSDP2's state and parameter groups over a
replicate-only mesh (`DDPMeshInfo(mesh, replicate_mesh_dim=0)`), applied per block as `fully_shard` is.
Why a second one: the lifecycle is `fully_shard`'s, so a model moves between sharding and replicating by
changing the call, keeps one root, one end of backward, one `set_requires_gradient_sync`, and every
parameter is a DTensor (`Replicate()` here, `Shard(0)` there) that DTensor-aware code treats alike.

Per unit and step: no AllGather (a shard group of one rank: the "gather" is a local copy, as FSDP2's
world-size-1 path, _fsdp_param_group.py `unshard`), no ReduceScatter (a local copy), one AllReduce (AVG) of
the unit's gradients once backward is done with it (FSDP2: `dist.all_reduce` on the all-reduce group,
_fsdp_collectives.py "HSDP or DDP/replicate"). Parameters are never freed after forward (FSDP2 passes no
post-forward mesh). Here every unit is an `FSDPParamGroup` whose mesh has only a replicate dimension
(`MeshInfo` with no shard group): the same code as HSDP's replica AllReduce.
"""
from __future__ import annotations

import torch.nn as nn

from fsdp_mini.fsdp._fully_shard.fully_shard import FSDPModule, apply_units
from fsdp_mini.fsdp.mixed_precision import MixedPrecisionPolicy

__all__ = ["replicate", "ReplicateModule"]


class ReplicateModule(FSDPModule):
    """The methods a module gains from this `replicate`: FSDP2's (`FSDPModule`'s), as PyTorch's
    `ReplicateModule(FSDPModule)`; the module's class becomes `Replicate<Class>`."""


def replicate(module: nn.Module | list[nn.Module], *, mesh=None, mp_policy: MixedPrecisionPolicy | None = None,
              ignored_params: set | None = None) -> nn.Module | list[nn.Module]:
    """Replicate `module`'s parameters (those not in a submodule already replicated) over the 1-D `mesh`
    (default: the whole world), as one unit whose gradients are averaged by one AllReduce per backward.
    Apply it bottom-up: to each block, then to the model (the root). Returns `module` itself, now a
    `ReplicateModule`; a list of modules makes one unit of all of them. `mp_policy`, `ignored_params`: as
    `fully_shard`'s. Every rank must start from the same values (checked). PyTorch's `offload_policy` and
    `dp_mesh_dims` are not supported. Collective; bad input is a ValueError first."""
    return apply_units(module, mesh=mesh, reshard_after_forward=False, shard_placement_fn=None, mp_policy=mp_policy,
                       ignored_params=ignored_params, impl="builtin", sync_module_states=False,
                       replicate=("replicate", ReplicateModule))
