"""How each implementation shards a description's model: the same policy spelled in each one's API.

flat:      fsdp_mini.FSDP(net, sharding_strategy=S, wrap=classes, shard_size=2 for HYBRID_SHARD)
           against FSDP1 FullyShardedDataParallel(net, sharding_strategy=S, auto_wrap_policy=
           ModuleWrapPolicy(classes), device_id=cpu, use_orig_params=True, device_mesh=2x2 for HSDP).
           use_orig_params=True: FSDP1 then accepts mixed requires_grad in one unit, as fsdp_mini does (it
           keeps one flat shard per (dtype, requires_grad)); AdamW and SGD are elementwise, so the flat
           and the per-parameter optimizer step give the same values.
per_param: fully_shard (fsdp_mini's or torch's) on the policy's modules, bottom-up, on a 1-D mesh or a
           2 x 2 (replicate, shard) mesh for HSDP.
The wrapped net replaces the owner's `.model` (the flat design returns a new module; fully_shard works in
place). Returns the wrapped net.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

import fsdp_mini
from differential.models import Block, Owner

_MESHES: dict[tuple, object] = {}


def mesh(hsdp: bool):
    """One mesh per shape per process (each init_device_mesh makes new process groups)."""
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    shape = (2, world // 2) if hsdp else (world,)
    if shape not in _MESHES:
        names = ("replicate", "shard") if hsdp else ("shard",)
        _MESHES[shape] = init_device_mesh("cpu", shape, mesh_dim_names=names)
    return _MESHES[shape]


def _classes(policy: str) -> tuple:
    return {"blocks": (Block,), "linear": (nn.Linear,), "none": ()}[policy]


def wrap_flat(net: nn.Module, wrap: dict, impl: str) -> nn.Module:
    classes = _classes(wrap["policy"])
    if impl == "fsdp_mini":
        return fsdp_mini.FSDP(net, sharding_strategy=fsdp_mini.ShardingStrategy[wrap["strategy"]], wrap=classes,
                              shard_size=dist.get_world_size() // 2 if wrap["hsdp"] else None)
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    kwargs = dict(sharding_strategy=ShardingStrategy[wrap["strategy"]], device_id=torch.device("cpu"),
                  auto_wrap_policy=ModuleWrapPolicy(set(classes)) if classes else None, use_orig_params=True)
    if wrap["hsdp"]:
        kwargs["device_mesh"] = mesh(True)
    return FullyShardedDataParallel(net, **kwargs)


def fully_shard_of(impl: str):
    if impl == "fsdp_mini":
        return fsdp_mini.fully_shard
    from torch.distributed.fsdp import fully_shard
    return fully_shard


def fsdp_module_class(impl: str):
    if impl == "fsdp_mini":
        return fsdp_mini.FSDPModule
    from torch.distributed.fsdp import FSDPModule
    return FSDPModule


def wrap_per_param(net: nn.Module, wrap: dict, impl: str) -> nn.Module:
    fs = fully_shard_of(impl)
    kw = {"mesh": mesh(wrap["hsdp"]), "reshard_after_forward": wrap["reshard_after_forward"]}
    policy, blocks = wrap["policy"], list(net.blocks)
    if policy in ("blocks", "blocks_noroot"):
        for b in blocks:
            fs(b, **kw)
    elif policy == "group":
        fs(blocks[:2], **kw)
    elif policy == "partial":
        fs(blocks[0], **kw)
    elif policy == "linear":
        for m in [m for m in net.modules() if isinstance(m, nn.Linear)]:
            fs(m, **kw)
    if policy != "blocks_noroot":
        fs(net, **kw)
    return net


def synced_params(net: nn.Module, design: str, spec: dict) -> list[nn.Parameter]:
    """The parameters a wrapping averages across ranks (what the unsharded reference must average): the
    whole net, except with fully_shard on the blocks alone (no root), which leaves the rest unsynced."""
    if design == "per_param" and spec["policy"] == "blocks_noroot":
        return [p for m in net.modules() if isinstance(m, Block) for p in m.parameters()]
    return list(net.parameters())


def compile_blocks(net: nn.Module) -> None:
    """`torch.compile(backend="aot_eager")` on every Block, in place (what FSDP2's docs do per layer)."""
    for m in list(net.modules()):
        if isinstance(m, Block):
            m.compile(backend="aot_eager")


def wrap(top: nn.Module, design: str, spec: dict, impl: str) -> nn.Module:
    """Shard `top`'s net (the owner's `.model`, or `top`) in place; returns the wrapped net. impl "plain":
    not sharded at all (the unsharded reference; the runner averages its gradients itself)."""
    net = top.model if isinstance(top, Owner) else top
    if impl == "plain":
        wrapped = net
    else:
        wrapped = wrap_flat(net, spec, impl) if design == "flat" else wrap_per_param(net, spec, impl)
    if isinstance(top, Owner):
        top.model = wrapped
    if spec.get("compile") == "blocks":
        compile_blocks(wrapped)
    return wrapped


def submodule(wrapped: nn.Module, design: str, path: str) -> nn.Module:
    """The module at `path` of the original net, reached through the wrappers (`.module` of the flat
    design's wrapper, then attributes: FSDP1's inner wrappers read through to their module's)."""
    m = getattr(wrapped, "module", wrapped) if design == "flat" else wrapped  # the plain net has no .module
    for part in path.split("."):
        m = getattr(m, part)
    return m
