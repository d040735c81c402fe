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
"""
from __future__ import annotations

import torch
import torch.nn as nn

from fsdp_mini import collectives as C
from fsdp_mini.comm_log import scope
from fsdp_mini.flat_param import FlatLayout, flatten, unflatten_views
from fsdp_mini.groups import Groups
from fsdp_mini.memory import MemoryTracker

__all__ = ["FlatParamHandle"]


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
        self.unsharded, self._gather, self._reduce = True, None, None
        self.tracker.alloc(self.nbytes)
        self.grads_ready = 0

    # --- parameters ----------------------------------------------------------------------------------

    def unshard(self, async_op: bool = False) -> None:
        """Start gathering the full parameters (if they are not there already); `wait_unshard` ends it."""
        if self.unsharded or self._gather is not None:
            return
        self.padded.untyped_storage().resize_(self.nbytes)
        self.tracker.alloc(self.nbytes)
        version = self.padded._version
        src = self.shard.detach().to(self.compute_dtype)
        if self.groups.shard is None:
            self.padded.copy_(src)
            work = None
        else:
            with scope(self.label):
                work = C.all_gather_into_tensor(self.padded, src, group=self.groups.shard, async_op=True,
                                                impl=self.impl)
        self._gather = (work, version, src)
        if not async_op:
            self.wait_unshard()

    def wait_unshard(self) -> None:
        if self._gather is None:
            return
        work, version, _ = self._gather
        if work is not None:
            work.wait()
        torch._C._autograd._unsafe_set_version_counter((self.padded,), (version,))
        self._gather, self.unsharded = None, True

    def reshard(self) -> None:
        """Free the gathered parameters; the shard stays. A pending gather is finished first."""
        self.wait_unshard()
        if self.unsharded and not self.aliased:
            self.padded.untyped_storage().resize_(0)
            self.tracker.free(self.nbytes)
        self.unsharded = self.aliased

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
        self._reduce = (work, out, flat)  # `flat` must live until the ReduceScatter is done

    def start_replica_reduce(self) -> None:
        """Once the ReduceScatter is done: free the unsharded gradient and, with replicas (HYBRID_SHARD),
        start averaging the gradient shard across them (async). Called when the next unit's gradients
        are ready, so at most two units' unsharded gradients are alive at a time."""
        if self._reduce is None or self._reduce[2] is None:  # nothing pending, or already started
            return
        work, out, _ = self._reduce
        work.wait()
        replica_work = None
        if self.groups.replica is not None:
            with scope(self.label):
                replica_work = C.all_reduce(out, C.AVG, group=self.groups.replica, async_op=True, impl=self.impl)
        self._reduce = (replica_work, out, None)

    def wait_grad(self) -> None:
        """Finish the reduction started by `reduce_grad` and add the result to `shard.grad`."""
        if self._reduce is None:
            return
        self.start_replica_reduce()
        work, out, _ = self._reduce
        self._reduce = None
        if work is not None:
            work.wait()
        self.accumulate_grad(out)

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
