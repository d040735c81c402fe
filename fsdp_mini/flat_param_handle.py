"""One flat parameter of one FSDP unit: its shard, its gathered buffer, and the three state changes.

    unshard():      shard ──AllGather──▶ padded buffer; the module's parameters are views into it
    reshard():      free the padded buffer's storage (the views stay, pointing at no memory)
    reduce_grad():  the views' gradients ──flatten──▶ ReduceScatter (+ AllReduce across replicas) ──▶ shard.grad

Under NO_SHARD there is nothing to scatter: the flat gradients go to `GradBuckets` (DDP's buckets) instead.

The shard is the `nn.Parameter` the optimizer sees. The module's original parameters are replaced by
plain leaf tensors that are views of the padded buffer, created once and reused every step, so autograd
puts their gradients in `.grad` and gradient accumulation (`no_sync`) works as in a plain module.

Freeing is `untyped_storage().resize_(0)`, not dropping the tensor: autograd saved the views for backward,
and FULL_SHARD must refill the *same* storage before backward for them to be valid again. Refilling is an
in-place write, which would bump the views' version counter and make autograd refuse the saved tensors;
the counter is restored after each gather, as PyTorch's FSDP does, because the values are the same.

Its states are named (`fsdp_mini.states`: `ShardedState`, `ReduceStage`), as in PyTorch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from fsdp_mini import collectives as C
from fsdp_mini.comm_log import scope
from fsdp_mini.flat_param import FlatLayout, flatten, unflatten_views
from fsdp_mini.groups import Groups
from fsdp_mini.memory import MemoryTracker
from fsdp_mini.states import ReduceStage, ShardedState

__all__ = ["FlatParamHandle", "PendingGather", "PendingReduction"]


@dataclass
class PendingGather:
    """An AllGather in flight: its work (None when a copy sufficed), the gathered buffer's version
    counter before it (restored when it is done), and the source, kept alive until then."""

    work: object
    version: int
    source: torch.Tensor


@dataclass
class PendingReduction:
    """A gradient reduction in flight: its stage, the work to wait for (None if there is none), the
    gradient shard it writes, and the unsharded flat gradient it reads (None once freed)."""

    stage: ReduceStage
    work: object
    shard_grad: torch.Tensor
    unsharded_grad: torch.Tensor | None


class FlatParamHandle:
    """Parameters of one unit that share a dtype and requires_grad, flattened, padded and sharded."""

    def __init__(self, layout: FlatLayout, owners: list[list[tuple[nn.Module, str]]], full: torch.Tensor,
                 groups: Groups, requires_grad: bool, compute_dtype: torch.dtype, reduce_dtype: torch.dtype,
                 impl: str, tracker: MemoryTracker, label: str):
        self.layout, self.owners, self.groups = layout, owners, groups
        self.requires_grad, self.compute_dtype, self.reduce_dtype = requires_grad, compute_dtype, reduce_dtype
        self.impl, self.tracker, self.label = impl, tracker, label
        lo, hi = layout.shard_range(groups.shard_rank)
        self.shard = nn.Parameter(full[lo:hi].clone(), requires_grad=requires_grad)
        # With nothing to gather and nothing to cast (NO_SHARD in full precision) the parameters are
        # views of the shard itself: DDP keeps the whole model, so there is nothing to free.
        self.aliased = groups.shard_size == 1 and compute_dtype == full.dtype
        self.padded = self.shard.detach() if self.aliased else full.to(compute_dtype)  # `full` is ours now
        self.leaves = [v.requires_grad_(requires_grad) for v in unflatten_views(self.padded, layout)]
        for leaf, owners_of_leaf in zip(self.leaves, owners):
            for module, name in owners_of_leaf:
                setattr(module, name, leaf)
        self.nbytes = 0 if self.aliased else self.padded.numel() * self.padded.element_size()
        self.state = ShardedState.UNSHARDED
        self.gather: PendingGather | None = None
        self.reduction: PendingReduction | None = None
        self.tracker.alloc(self.nbytes, self.label)
        self.grads_ready = 0

    # --- parameters ----------------------------------------------------------------------------------

    def unshard(self, async_op: bool = False) -> None:
        """Start gathering the full parameters (if they are not there already); `wait_unshard` ends it."""
        if self.state is not ShardedState.SHARDED:
            return
        self.padded.untyped_storage().resize_(self.nbytes)
        self.tracker.alloc(self.nbytes, self.label)
        version = self.padded._version
        src = self.shard.detach().to(self.compute_dtype)
        if self.groups.shard is None:
            self.padded.copy_(src)
            work = None
        else:
            with scope(self.label):
                work = C.all_gather_into_tensor(self.padded, src, group=self.groups.shard, async_op=True,
                                                impl=self.impl)
        self.gather, self.state = PendingGather(work, version, src), ShardedState.UNSHARDING
        if not async_op:
            self.wait_unshard()

    def wait_unshard(self) -> None:
        """Finish a pending gather (no-op otherwise): afterwards the parameters can be used."""
        if self.gather is None:
            return
        if self.gather.work is not None:
            self.gather.work.wait()
        torch._C._autograd._unsafe_set_version_counter((self.padded,), (self.gather.version,))
        self.gather, self.state = None, ShardedState.UNSHARDED

    def reshard(self) -> None:
        """Free the gathered parameters; the shard stays. A pending gather is finished first. Aliased
        parameters (views of the shard itself) have nothing to free and stay usable."""
        self.wait_unshard()
        if self.aliased:
            return
        if self.state is ShardedState.UNSHARDED:
            self.padded.untyped_storage().resize_(0)
            self.tracker.free(self.nbytes, self.label)
        self.state = ShardedState.SHARDED

    def register_original_params(self) -> list[tuple[nn.Module, str, torch.Tensor]]:
        """Register the gathered views as the module's own `nn.Parameter`s (aliases of the gathered buffer,
        no copy), so that a plain use of the module sees its parameters; returns (module, name, plain view)
        for each, for `unregister_original_params`."""
        placed = []
        for leaf, owners_of_leaf in zip(self.leaves, self.owners):
            alias = nn.Parameter(leaf.detach(), requires_grad=False)
            for module, name in owners_of_leaf:
                delattr(module, name)
                module.register_parameter(name, alias)
                placed.append((module, name, leaf))
        return placed

    def unregister_original_params(self, placed) -> None:
        """Put the plain views back (what forward and backward use)."""
        for module, name, leaf in placed:
            del module._parameters[name]
            setattr(module, name, leaf)

    # --- gradients -----------------------------------------------------------------------------------

    def take_flat_grad(self) -> torch.Tensor:
        """The leaves' gradients, flattened into one padded buffer in the reduce dtype, and taken off
        the leaves (so the next backward starts from None, as in a plain module)."""
        grads = [leaf.grad for leaf in self.leaves]
        for leaf in self.leaves:
            leaf.grad = None
        return flatten(grads, self.layout, dtype=self.reduce_dtype, device=self.shard.device)

    def reduce_grad(self) -> None:
        """Start the ReduceScatter of the unsharded gradients into this rank's shard (async)."""
        flat = self.take_flat_grad()
        out = torch.empty(self.layout.shard_numel, dtype=self.reduce_dtype, device=flat.device)
        with scope(self.label):
            work = C.reduce_scatter_tensor(out, flat, C.AVG, group=self.groups.shard, async_op=True,
                                           impl=self.impl)
        self.reduction = PendingReduction(ReduceStage.SCATTERING, work, out, flat)

    def start_replica_reduce(self) -> None:
        """Once the ReduceScatter is done: free the unsharded gradient and, with replicas (HYBRID_SHARD),
        start averaging the gradient shard across them (async). Called when the next unit's gradients
        are ready, so at most two units' unsharded gradients are alive at a time."""
        r = self.reduction
        if r is None or r.stage is not ReduceStage.SCATTERING:
            return
        r.work.wait()
        r.work, r.unsharded_grad, r.stage = None, None, ReduceStage.ACROSS_REPLICAS
        if self.groups.replica is not None:
            with scope(self.label):
                r.work = C.all_reduce(r.shard_grad, C.AVG, group=self.groups.replica, async_op=True,
                                      impl=self.impl)

    def wait_grad(self) -> None:
        """Finish the reduction started by `reduce_grad` and add the result to `shard.grad`."""
        if self.reduction is None:
            return
        self.start_replica_reduce()
        r, self.reduction = self.reduction, None
        if r.work is not None:
            r.work.wait()
        self.accumulate_grad(r.shard_grad)

    def accumulate_grad(self, grad: torch.Tensor) -> None:
        """Set or add (after `no_sync`) a reduced gradient of this rank's shard."""
        grad = grad.to(self.shard.dtype)
        if self.shard.grad is None:
            self.shard.grad = grad
        else:
            self.shard.grad += grad

    def has_unsharded_grads(self) -> bool:
        return any(leaf.grad is not None for leaf in self.leaves)

    def __repr__(self) -> str:
        return f"FlatParamHandle({self.label}, {self.layout}, requires_grad={self.requires_grad})"
