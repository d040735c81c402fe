"""One flat parameter of one FSDP unit: its shard, its gathered buffer, and the three state changes.

    unshard():               shard ──AllGather──▶ `unsharded`, the whole flat buffer (padding included);
                             the module's parameters are views into it
    reshard():               free `unsharded`'s storage (the views stay, pointing at no memory)
    start_grad_reduction():  the views' gradients ──flatten──▶ ReduceScatter (+ AllReduce across
                             replicas) ──▶ sharded_param.grad

Each has its wait (`wait_for_unshard`, `wait_for_grad_reduction`). The first two and their wait are
FSDP2's names (`FSDPParamGroup.unshard / wait_for_unshard / reshard`); PyTorch gives the third no method of
its own (FSDP2 reduces inside `post_backward` through `foreach_reduce`, FSDP1 in `_reduce_grad`), so it is
named for what it does, the same in both designs (`FSDPParamGroup.start_grad_reduction`).

Under NO_SHARD there is nothing to scatter: the flat gradients go to `GradBuckets` (DDP's buckets) instead.

The shard, `sharded_param` (FSDP2's name), is the `nn.Parameter` the optimizer sees. The module's original parameters are replaced by
plain leaf tensors that are views of `unsharded`, created once and reused every step, so autograd
puts their gradients in `.grad` and gradient accumulation (`no_sync`) works as in a plain module.

Freeing frees the storage, not the tensor (`fsdp_mini.fsdp.gathered_storage`, shared with the per-parameter
design): autograd saved the views for backward, and FULL_SHARD refills the *same* storage before backward
for them to be valid again, restoring the version counter after the write.

Its states are named (`fsdp_mini.fsdp.states`: `ShardedState`, `ReduceStage`), as in PyTorch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from fsdp_mini import collectives as C
from fsdp_mini.collective_calls import scope
from fsdp_mini.fsdp.flat_param import FlatLayout, flatten, unflatten_views
from fsdp_mini.fsdp.full_state import gather_shards
from fsdp_mini.fsdp.gathered_storage import FreedParameter, free_storage, refill_storage, restore_version, version_of
from fsdp_mini.fsdp.grad_reduction import GradReduction
from fsdp_mini.fsdp.groups import MeshInfo
from fsdp_mini.memory import MemoryTracker
from fsdp_mini.fsdp.states import ReduceStage, ShardedState
from fsdp_mini.torch_internals import unregister_parameter

__all__ = ["FlatParamHandle", "PendingGather"]


@dataclass
class PendingGather:
    """An AllGather in flight: its work (None when a copy sufficed), the gathered buffer's version
    counter before it (restored when it is done), and the source, kept alive until then."""

    work: object
    version: int
    source: torch.Tensor


class FlatParamHandle:
    """Parameters of one unit that share a dtype and requires_grad, flattened, padded and sharded."""

    def __init__(self, layout: FlatLayout, owners: list[list[tuple[nn.Module, str]]], full: torch.Tensor,
                 mesh_info: MeshInfo, requires_grad: bool, compute_dtype: torch.dtype, reduce_dtype: torch.dtype,
                 impl: str, gathered_memory: MemoryTracker, label: str):
        self.layout, self.owners, self.mesh_info = layout, owners, mesh_info
        self.requires_grad, self.compute_dtype, self.reduce_dtype = requires_grad, compute_dtype, reduce_dtype
        self.impl, self.gathered_memory, self.label = impl, gathered_memory, label
        lo, hi = layout.shard_range(mesh_info.shard_mesh_rank)
        self.sharded_param = nn.Parameter(full[lo:hi].clone(), requires_grad=requires_grad)
        # With nothing to gather and nothing to cast (NO_SHARD in full precision) the parameters are
        # views of the shard itself: DDP keeps the whole model, so there is nothing to free.
        self.aliased = mesh_info.shard_mesh_size == 1 and compute_dtype == full.dtype
        self.unsharded = self.sharded_param.detach() if self.aliased else full.to(compute_dtype)  # `full` is ours now
        self.leaves = [v.requires_grad_(requires_grad) for v in unflatten_views(self.unsharded, layout)]
        # what the modules hold while `unsharded` is freed (see FreedParameter): never a view of freed memory
        self.freed = [FreedParameter(leaf, info.names[0]) for leaf, info in zip(self.leaves, layout.params)]
        self.originals_registered = False  # inside summon_full_params: the modules hold nn.Parameters instead
        self.summoned_values: torch.Tensor | None = None  # summon_full_params(writeback=True): see write_back
        self._use_unsharded_views()
        self.nbytes = 0 if self.aliased else self.unsharded.numel() * self.unsharded.element_size()
        self.sharded_state = ShardedState.UNSHARDED
        self.gather: PendingGather | None = None
        self.grad_reduction: GradReduction | None = None
        self.gathered_memory.alloc(self.nbytes, self.label)
        self.grads_ready = 0

    # --- parameters ----------------------------------------------------------------------------------

    def unshard(self, async_op: bool = False) -> None:
        """Start gathering the full parameters (if they are not there already); `wait_for_unshard` ends it."""
        if self.sharded_state is not ShardedState.SHARDED:
            return
        refill_storage(self.unsharded, self.nbytes)
        self.gathered_memory.alloc(self.nbytes, self.label)
        self._use_unsharded_views()
        version = version_of(self.unsharded)
        src = self.sharded_param.detach().to(self.compute_dtype)
        if self.mesh_info.shard_process_group is None:
            self.unsharded.copy_(src)
            work = None
        else:
            with scope(self.label):
                work = C.all_gather_into_tensor(self.unsharded, src, group=self.mesh_info.shard_process_group, async_op=True,
                                                impl=self.impl)
        self.gather, self.sharded_state = PendingGather(work, version, src), ShardedState.UNSHARDING
        if not async_op:
            self.wait_for_unshard()

    def wait_for_unshard(self) -> None:
        """Finish a pending gather (no-op otherwise): afterwards the parameters can be used."""
        if self.gather is None:
            return
        if self.gather.work is not None:
            self.gather.work.wait()
        restore_version(self.unsharded, self.gather.version)
        self.gather, self.sharded_state = None, ShardedState.UNSHARDED

    def reshard(self) -> None:
        """Free the gathered parameters; the shard stays. A pending gather is finished first. Aliased
        parameters (views of the shard itself) have nothing to free and stay usable."""
        self.wait_for_unshard()
        if self.aliased:
            return
        if self.sharded_state is ShardedState.UNSHARDED:
            self.write_back()  # inside summon_full_params(writeback=True), before the values are gone
            self._use_sharded_views()
            free_storage(self.unsharded)
            self.gathered_memory.free(self.nbytes, self.label)
        self.sharded_state = ShardedState.SHARDED

    def _use_unsharded_views(self) -> None:
        """The modules compute with views of the gathered buffer (FSDP1's `_use_unsharded_views`)."""
        self._place(self.leaves)

    def _place(self, tensors: list[torch.Tensor]) -> None:
        if self.originals_registered:  # summon_full_params' parameters stay until it puts the views back
            return
        for tensor, owners_of_leaf in zip(tensors, self.owners):
            for module, name in owners_of_leaf:
                setattr(module, name, tensor)

    def _use_sharded_views(self) -> None:
        """The modules hold a `FreedParameter` per parameter while the gathered buffer is freed: a read between
        steps is a clear error, not a read of freed memory."""
        self._place(self.freed)

    def set_requires_grad(self, requires_grad: bool) -> None:
        """Freeze (or unfreeze) the whole flat parameter after wrapping: its shard and the views autograd
        differentiates. Only whole, and only one that was built trainable: its gradient hooks and place in the
        reduction order exist from construction (`FSDP.requires_grad_` checks both)."""
        self.sharded_param.requires_grad_(requires_grad)
        for leaf in self.leaves:
            leaf.requires_grad_(requires_grad)

    def register_original_params(self, writeback: bool = False) -> None:
        """Register the gathered views as the module's own `nn.Parameter`s (aliases of the gathered buffer,
        no copy), so that a plain use of the module sees its parameters, until `unregister_original_params`.
        `writeback`: remember this rank's part of the gathered values, so that what is changed in place
        meanwhile reaches the shard (`write_back`)."""
        for leaf, owners_of_leaf in zip(self.leaves, self.owners):
            alias = nn.Parameter(leaf.detach(), requires_grad=False)
            for module, name in owners_of_leaf:
                delattr(module, name)
                module.register_parameter(name, alias)
        self.originals_registered = True
        self.summoned_values = self._gathered_shard().clone() if writeback and not self.aliased else None

    def _gathered_shard(self) -> torch.Tensor:
        """This rank's range of the gathered buffer: what its shard holds, in the compute dtype."""
        lo, hi = self.layout.shard_range(self.mesh_info.shard_mesh_rank)
        return self.unsharded[lo:hi]

    def write_back(self) -> None:
        """`summon_full_params(writeback=True)`, FSDP1's: copy the values changed in place in the gathered
        parameters into this rank's shard (each rank writes its own range, so every rank must change the same
        values). Only the changed elements: under mixed precision the gathered copy is in the compute dtype,
        and rewriting all of it would round every untouched full-precision value. Called before the gathered
        buffer is freed (at the end of `summon_full_params`, or by a forward inside it)."""
        if self.summoned_values is None or self.sharded_state is not ShardedState.UNSHARDED:
            return
        now = self._gathered_shard()
        changed = now != self.summoned_values
        with torch.no_grad():
            self.sharded_param[changed] = now[changed].to(self.sharded_param.dtype)
        self.summoned_values = now.clone()

    def unregister_original_params(self) -> None:
        """Put the plain views back (what forward and backward use), or the freed placeholders if a forward
        inside `summon_full_params` resharded the unit meanwhile."""
        self.write_back()
        self.summoned_values = None
        for owners_of_leaf in self.owners:
            for module, name in owners_of_leaf:
                unregister_parameter(module, name)
        self.originals_registered = False
        self._place(self.leaves if self.sharded_state is not ShardedState.SHARDED else self.freed)

    # --- gradients -----------------------------------------------------------------------------------

    def take_unsharded_grad(self) -> torch.Tensor:
        """The leaves' gradients, flattened into one padded buffer in the reduce dtype, and taken off
        the leaves (so the next backward starts from None, as in a plain module)."""
        grads = [leaf.grad for leaf in self.leaves]
        for leaf in self.leaves:
            leaf.grad = None
        return flatten(grads, self.layout, dtype=self.reduce_dtype, device=self.sharded_param.device)

    def start_grad_reduction(self) -> None:
        """Start the ReduceScatter of the unsharded gradients into this rank's shard (async)."""
        flat = self.take_unsharded_grad()
        out = torch.empty(self.layout.shard_numel, dtype=self.reduce_dtype, device=flat.device)
        with scope(self.label):
            work = C.reduce_scatter_tensor(out, flat, C.AVG, group=self.mesh_info.shard_process_group, async_op=True,
                                           impl=self.impl)
        self.grad_reduction = GradReduction(ReduceStage.SCATTERING, work, out, flat)

    def start_replica_reduce(self) -> None:
        """Once the ReduceScatter is done: free the unsharded gradient and, with replicas (HYBRID_SHARD),
        start averaging the gradient shard across them (async). Called when the next unit's gradients
        are ready, so at most two units' unsharded gradients are alive at a time."""
        r = self.grad_reduction
        if r is not None and r.finish_scatter() and self.mesh_info.replicate_process_group is not None:
            r.start_replica_reduce(self.mesh_info.replicate_process_group, C.AVG, self.label, self.impl)

    def wait_for_grad_reduction(self) -> None:
        """Finish the reduction started by `start_grad_reduction` and add the result to `sharded_param.grad`."""
        if self.grad_reduction is None:
            return
        self.start_replica_reduce()
        r, self.grad_reduction = self.grad_reduction, None
        self.accumulate_sharded_grad(r.wait())

    def accumulate_sharded_grad(self, grad: torch.Tensor) -> None:
        """Set or add (after `no_sync`) a reduced gradient of this rank's shard."""
        grad = grad.to(self.sharded_param.dtype)
        if self.sharded_param.grad is None:
            self.sharded_param.grad = grad
        else:
            self.sharded_param.grad += grad

    def has_unsharded_grads(self) -> bool:
        return any(leaf.grad is not None for leaf in self.leaves)

    def names_without_grad(self) -> list[str]:
        """The parameters (first names) with no gradient now, when some other one has one: those that
        `take_unsharded_grad` fills with zeros."""
        if not self.has_unsharded_grads():
            return []
        return [info.names[0] for info, leaf in zip(self.layout.params, self.leaves) if leaf.grad is None]

    # --- full state dict -----------------------------------------------------------------------------

    def full_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every name of every original parameter (tied ones under each of their names) -> its shape."""
        return {name: tuple(info.shape) for info in self.layout.params for name in info.names}

    def full_state(self) -> dict[str, torch.Tensor]:
        """Every original parameter, whole, on CPU, under each of its names: an AllGather of the fp32 shards
        over the shard group (collective), then the flat buffer's views copied out."""
        full = gather_shards(self.sharded_param, self.mesh_info.shard_process_group, self.impl)
        return {name: view.detach().to("cpu", copy=True)
                for info, view in zip(self.layout.params, unflatten_views(full, self.layout)) for name in info.names}

    def load_full_state(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Copy into this rank's shard the pieces of the full tensors it holds (no communication); a
        parameter none of whose names is in `state_dict` keeps its values (a non-strict load). The
        gathered copy, if any, is stale afterwards: the caller reshards first."""
        with torch.no_grad():
            for piece in self.layout.pieces(self.mesh_info.shard_mesh_rank):
                name = next((n for n in piece.param.names if n in state_dict), None)
                if name is None:
                    continue
                src = state_dict[name].reshape(-1)[piece.start:piece.end]
                self.sharded_param[piece.shard_offset:piece.shard_offset + piece.numel].copy_(src)

    def __repr__(self) -> str:
        return f"FlatParamHandle({self.label}, {self.layout}, requires_grad={self.requires_grad})"
