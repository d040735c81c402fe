"""ZeRO stage 1: shard only the optimizer state, between DDP's all-reduce and its optimizer step.

DDP averages gradients with one all-reduce, and a ring all-reduce is a reduce-scatter followed by an
all-gather. ZeRO-1 (Rajbhandari et al., 2020) moves the optimizer step in between the two halves:

    DDP:     all_reduce(grads)   -> every rank steps on all parameters (full optimizer state)
    ZeRO-1:  reduce_scatter(grads, AVG) -> rank r steps on its 1/n shard -> all_gather(params)

The bytes on the wire are the same as DDP's (two halves of one all-reduce), but each rank keeps optimizer
state (Adam's two moments: 2x the parameters) for only 1/n of the parameters. The parameters and the
gradients stay replicated, so the model is an ordinary module, with no hooks and no wrapping; sharding
the gradients too is ZeRO-2, sharding the parameters ZeRO-3 (FSDP's FULL_SHARD).

The model must start identical on every rank (seed it, or load the same checkpoint): as with
`torch.distributed.optim.ZeroRedundancyOptimizer`, nothing is broadcast at construction.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from fsdp_mini.collectives import AVG, IMPLS, all_gather_into_tensor, reduce_scatter_tensor
from fsdp_mini.flat_param import FlatLayout, flatten, unflatten_views
from fsdp_mini.memory import optimizer_state_bytes
from fsdp_mini.runtime import require_distributed

__all__ = ["ZeroRedundancyOptimizer"]


class ZeroRedundancyOptimizer:
    """Wrap `optimizer_class` so that this rank holds optimizer state for 1/n of `params` only.

    Parameters are grouped by dtype; each group is flattened into one buffer padded to a multiple of n
    (`layouts[dtype]`), and this rank's slice of it is a flat `nn.Parameter` (`shards[dtype]`) that the
    inner optimizer (`optim`) steps on. One reduce-scatter and one all-gather per dtype group per step.
    """

    def __init__(self, params, optimizer_class: type[torch.optim.Optimizer], group=None,
                 impl: str = "builtin", **defaults):
        if impl not in IMPLS:
            raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)):
            raise ValueError(f"optimizer_class must be a torch.optim.Optimizer subclass, got {optimizer_class!r}")
        if isinstance(params, torch.Tensor):
            raise ValueError("params must be an iterable of tensors, e.g. model.parameters(), not one tensor")
        params = list(params)
        if any(isinstance(p, dict) for p in params):
            raise ValueError("per-parameter option groups (dicts) are not supported: pass tensors")
        if not all(isinstance(p, torch.Tensor) for p in params):
            raise ValueError("params must be tensors, e.g. model.parameters()")
        unique = {id(p): p for p in params if p.requires_grad}  # tied weights once; frozen ones skipped
        if not unique:
            raise ValueError("no parameters that require grad: nothing to optimize")
        require_distributed("ZeroRedundancyOptimizer")
        self.group, self.impl = group, impl
        n, rank = dist.get_world_size(group), dist.get_rank(group)

        self.params: dict[torch.dtype, list[torch.Tensor]] = {}
        for p in unique.values():
            self.params.setdefault(p.dtype, []).append(p)
        self.layouts: dict[torch.dtype, FlatLayout] = {}
        self.shards: dict[torch.dtype, nn.Parameter] = {}
        for dtype, ps in self.params.items():
            layout = FlatLayout([(f"{dtype}.{i}",) for i in range(len(ps))], [p.shape for p in ps], n)
            lo, hi = layout.shard_range(rank)
            with torch.no_grad():
                shard = flatten([p.detach() for p in ps], layout)[lo:hi].clone()
            self.layouts[dtype], self.shards[dtype] = layout, nn.Parameter(shard)
        self.optim = optimizer_class(list(self.shards.values()), **defaults)

    @property
    def param_groups(self) -> list[dict]:
        return self.optim.param_groups

    @property
    def state(self):
        return self.optim.state

    @property
    def defaults(self) -> dict:
        return self.optim.defaults

    @torch.no_grad()
    def step(self, closure=None):
        """Average gradients into this rank's shard, step the shard, gather the updated parameters."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for dtype, ps in self.params.items():
            layout, shard = self.layouts[dtype], self.shards[dtype]
            flat_grad = flatten([p.grad for p in ps], layout, dtype=dtype, device=shard.device)
            shard.grad = torch.empty_like(shard)
            reduce_scatter_tensor(shard.grad, flat_grad, AVG, self.group, impl=self.impl)
        self.optim.step()
        for dtype, ps in self.params.items():
            layout, shard = self.layouts[dtype], self.shards[dtype]
            flat = torch.empty(layout.padded_numel, dtype=dtype, device=shard.device)
            all_gather_into_tensor(flat, shard.detach(), self.group, impl=self.impl)
            for p, view in zip(ps, unflatten_views(flat, layout)):
                p.copy_(view)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the model's gradients (what backward fills) and the shards' (what step filled)."""
        for p in [*(p for ps in self.params.values() for p in ps), *self.shards.values()]:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.zero_()

    def optimizer_state_bytes(self) -> int:
        """Bytes of this rank's optimizer state tensors: about 1/n of an unsharded optimizer's."""
        return optimizer_state_bytes(self.optim)

    def state_dict(self) -> dict:
        """This rank's inner optimizer state (its shard only): save one per rank."""
        return self.optim.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.optim.load_state_dict(state_dict)

    def __repr__(self) -> str:
        groups = ", ".join(f"{dtype}: {layout}" for dtype, layout in self.layouts.items())
        return f"ZeroRedundancyOptimizer({type(self.optim).__name__}, impl={self.impl!r}, {groups})"
