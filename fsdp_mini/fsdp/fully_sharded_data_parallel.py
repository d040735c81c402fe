"""The FSDP wrapper: cut a model into units, and gather, free and reduce each unit at the right moment.

    model = FSDP(GPT(cfg), sharding_strategy=ShardingStrategy.FULL_SHARD, wrap=(Block,))

Every module of a `wrap` class becomes a *unit*; the parameters left over form the root unit. Each unit
keeps one flat shard per (dtype, requires_grad) of its parameters (`FlatParamHandle`). One training step
of a unit under FULL_SHARD (ZeRO-3):

    pre-forward    AllGather its parameters (already in flight if prefetched), prefetch the next unit
    post-forward   free them (not the root: backward needs it at once), hook its outputs' gradients
    pre-backward   AllGather again, prefetch the unit that backward reaches next
    post-backward  ReduceScatter its gradients into the shard (async), free the parameters; the previous
                   unit's ReduceScatter is done: free its unsharded gradient, start its replica AllReduce
    end of backward  wait for the ReduceScatters (and the replica AllReduces), so `opt.step()` sees them

SHARD_GRAD_OP (ZeRO-2) skips the free after forward and so the second AllGather. Activation checkpointing
(`torch.utils.checkpoint` around a unit) runs the unit's forward again inside its backward: the hooks see
the unit in PRE_BACKWARD and leave it alone, so the recomputation uses the parameters pre-backward gathered
(as PyTorch's FSDP does) instead of freeing them under autograd's feet. HYBRID_SHARD does
FULL_SHARD inside each shard group and then AllReduces each gradient shard across the replica group.
NO_SHARD (DDP) is the same machinery with shard groups of one rank: nothing to gather, and the units'
flat gradients AllReduced across all ranks in buckets of `bucket_cap_mb`, as DDP does (`GradBuckets`).
Per step and unit, with P = padded bytes of a unit's flat parameters, n = shard group size,
r = replicas (CommLog's S bytes; the root unit skips the backward AllGather):

    FULL_SHARD / HYBRID_SHARD     2 AllGather(P)  + ReduceScatter(P)  [+ AllReduce(P/n) across r]
    SHARD_GRAD_OP / _HYBRID_ZERO2 1 AllGather(P)  + ReduceScatter(P)  [+ AllReduce(P/n) across r]
    NO_SHARD                      AllReduce of the P's, packed in backward order into buckets of at
                                  least bucket_cap_mb (the last one holds the rest)

Gradient reductions start in one fixed order on every rank (reverse build order, backward's usual one).
A flat parameter none of whose parameters got a gradient keeps `grad` None; one some of whose parameters
got none on a rank is reduced with zeros for them (the right share when another rank used them), and,
since the optimizer steps a flat shard as one tensor, weight decay and momentum reach them: FSDP warns,
naming them (give them a unit of their own, or use `fully_shard`, which keeps None per parameter).

Prefetch follows the rule both designs share (`fsdp_mini.fsdp.units`), PyTorch FSDP1's and FSDP2's: in
forward, the unit that first ran after this one; in backward, the unit whose forward ended just before.
Which modules become units and how their parameters are grouped is `fsdp_mini.fsdp.plan`'s (pure) decision;
what each strategy implies (reshard after forward, shard-group size) is `fsdp_mini.fsdp.strategy`'s.
"""
from __future__ import annotations

import warnings
from collections import OrderedDict
from contextlib import ExitStack, contextmanager
from functools import partial
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor

from fsdp_mini import collectives as C
from fsdp_mini.collective_calls import in_forward, scope
from fsdp_mini.fsdp.compile_boundary import dynamo_disable, skipped_by_dynamo
from fsdp_mini.parallel.data_parallel import (GradientSync, broadcast_from_rank0, check_same_everywhere,
                                              check_same_fingerprints, fingerprint, refuse_deepcopy)
from fsdp_mini.fsdp.flat_param import flatten
from fsdp_mini.fsdp.flat_param_handle import FlatParamHandle
from fsdp_mini.fsdp.full_state import check_full_state_dict
from fsdp_mini.grad_norm import clip_sharded_grads_
from fsdp_mini.parallel.grad_buckets import GradBuckets, check_bucket_cap_mb
from fsdp_mini.fsdp.grad_reduction import ReductionQueue
from fsdp_mini.fsdp.groups import make_groups
from fsdp_mini.memory import MemoryTracker, step_memory_stats
from fsdp_mini.fsdp.mixed_precision import MixedPrecision
from fsdp_mini.nested import tensors_in
from fsdp_mini.fsdp.plan import FlatParamPlan, Plan, plan_units
from fsdp_mini.fsdp.replaced_params import mark_replaced, mark_wrapped
from fsdp_mini.rank_environment import get_device, require_distributed
from fsdp_mini.fsdp.states import TrainingState
from fsdp_mini.fsdp.strategy import ShardingStrategy, as_strategy, is_hybrid, reshard_after_forward, shard_group_size
from fsdp_mini.torch_internals import queue_after_backward, set_registered_buffer, unregister_parameter
from fsdp_mini.fsdp.units import ExecutionOrder, UnitLifecycle
from fsdp_mini.weak_hooks import weak_hook

__all__ = ["FSDP", "FSDPUnit", "materialise_by_name"]


class FSDPUnit(UnitLifecycle):
    """One unit: a module, the flat handles of the parameters it owns, and its per-step state. `label`:
    its module's path from the root, "root" for the root (`fsdp_mini.fsdp.units.unit_label`). Its life
    in a step is the one both designs share (`UnitLifecycle`: `pre_forward`, `post_forward`,
    `pre_backward`) over its handles' storage; `finalize_backward` ends it."""

    def __init__(self, label: str, module: nn.Module, handles: list[FlatParamHandle], is_root: bool,
                 reshard_after_forward: bool):
        self.label, self.module, self.handles, self.is_root = label, module, handles, is_root
        # the strategy's, but the root stays gathered: backward needs it at once
        self.reshard_after_forward = reshard_after_forward and not is_root
        self.training_state = TrainingState.IDLE
        self.post_forward_indices: list[int] = []  # where its post-forwards are in the step's post-forward order

    def unshard(self, async_op: bool = False) -> None:
        for h in self.handles:
            h.unshard(async_op=True)
        if not async_op:
            self.wait_for_unshard()

    def wait_for_unshard(self) -> None:
        for h in self.handles:
            h.wait_for_unshard()

    def reshard(self) -> None:
        for h in self.handles:
            h.reshard()

    def finalize_backward(self, reshard: bool) -> None:
        """End of backward, once every reduction is done: free the gathered parameters (`reshard`, see
        `FSDP._frees_in_backward`), forget this backward's counts."""
        if reshard:
            self.reshard()
        self.training_state = TrainingState.IDLE
        self.post_forward_indices.clear()
        for h in self.handles:
            h.grads_ready = 0

    def __repr__(self) -> str:
        return f"FSDPUnit({self.label}, {len(self.handles)} flat params, {self.training_state.name})"


class FSDP(GradientSync, nn.Module):
    """Fully Sharded Data Parallel over all ranks of the default process group (see the module doc).

    `wrap`: module classes that become their own unit. `shard_size`: ranks per shard group for the
    hybrid strategies (default LOCAL_WORLD_SIZE: one node). `param_init_fn(module)`, PyTorch FSDP1's: for
    a model built on the meta device, called on every module of a unit (breadth first from the unit's
    module, stopping at other units) to put that module's own tensors on the device and fill them, e.g.
    `lambda m: m.to_empty(device=fsdp_mini.get_device(), recurse=False)` then an init; units are
    materialised one at a time, so at most one is ever whole on a rank. `impl`: "builtin" (torch.distributed) or "ring" (fsdp_mini's own).
    `bucket_cap_mb`: NO_SHARD only, the size of its gradient buckets, as in PyTorch's DDP.
    Every rank must start from the same values: by default this is checked (a ValueError names the ranks
    and the first differing parameter); `sync_module_states=True` gives every rank rank 0's instead.
    Public state: `units` (root first), each with its `handles`; `mesh_info` (its process groups); `gathered_memory` (the
    tracker of gathered bytes); `state_dict_keys`; `forward_order` (an `ExecutionOrder`: the units by their first
    run) and `post_forward_order` (this step's post-forwards), which prefetch reads; `reductions` (the
    reductions in flight).
    """

    def __init__(self, module: nn.Module, sharding_strategy=ShardingStrategy.FULL_SHARD, wrap=(),
                 shard_size: int | None = None, mixed_precision: MixedPrecision | None = None,
                 prefetch: bool = True, param_init_fn=None, impl: str = "builtin", bucket_cap_mb: float = 25,
                 sync_module_states: bool = False):
        super().__init__()
        require_distributed("FSDP")
        if isinstance(module, FSDP) or any(isinstance(m, FSDP) for m in module.modules()):
            raise ValueError("module is already wrapped in FSDP")
        if any(isinstance(p, DTensor) for p in module.parameters()):
            raise ValueError("module has DTensor parameters (fully_shard, or another DTensor parallelism, sharded "
                             "it already): the two FSDP designs do not mix; wrap the plain model")
        if mixed_precision is not None and not isinstance(mixed_precision, MixedPrecision):
            raise ValueError(f"mixed_precision must be a MixedPrecision, got {type(mixed_precision).__name__}")
        C.check_impl(impl)
        check_bucket_cap_mb(bucket_cap_mb)
        self.strategy = as_strategy(sharding_strategy)
        self.mixed_precision = mixed_precision or MixedPrecision()
        self.prefetch, self.impl, self.device = prefetch, impl, get_device()
        self.reshard_after_forward = reshard_after_forward(self.strategy)
        size = shard_group_size(self.strategy, dist.get_world_size(), shard_size)
        if is_hybrid(self.strategy) and shard_size is None and size == dist.get_world_size() > 1:
            warnings.warn(f"{self.strategy.name} on one node: the shard group is all {size} ranks (LOCAL_WORLD_SIZE), "
                          f"so this is FULL_SHARD; pass shard_size= to shard within smaller groups", stacklevel=2)
        plan = plan_units(module, wrap)
        check_same_everywhere((self.strategy.name, size, plan.signature()), "model, wrap set or strategy",
                              " (every rank must build the same FSDP)", device=self.device)

        self.module = module
        self.sync_module_states = bool(sync_module_states)
        self.mesh_info = make_groups(size)
        self.gathered_memory = MemoryTracker()
        self.grad_buckets = GradBuckets(self.mesh_info.replicate_process_group, impl, bucket_cap_mb)
        initial_values: list[tuple[str, torch.Tensor]] = []  # fingerprints of each unit before it is sharded
        originals = list(module.parameters())
        self.units = self._materialise(plan, param_init_fn, initial_values)
        buffers = [(name, b) for name, b in module.named_buffers()]
        if self.sync_module_states:
            broadcast_from_rank0([b for _, b in buffers])
        else:
            check_same_fingerprints(initial_values + [(n, fingerprint(b)) for n, b in buffers], device=self.device)
        # FSDP1 computes with floating-point buffers in `buffer_dtype` and saves them in their own dtype
        self._buffer_dtypes = {name: b.dtype for name, b in module.named_buffers(remove_duplicate=False)}
        if self.mixed_precision.buffer_dtype is not None:
            self._cast_buffers(self.mixed_precision.buffer_dtype)
        self._flat_params = nn.ParameterList([h.sharded_param for h in self.handles])
        self._loading_prefix = ""  # where the last load_state_dict found this wrapper's keys
        self.register_load_state_dict_post_hook(FSDP._drop_inner_missing_keys)
        mark_replaced(originals)  # an optimizer built before wrapping fails at its first step
        mark_wrapped(module, "FSDP")  # fully_shard on one of its modules is refused
        self.state_dict_keys: tuple[str, ...] = plan.state_dict_keys
        self.forward_order = ExecutionOrder()  # units by their first pre-forward (forward prefetch)
        # every unit's post-forward of this step, in order (backward prefetch: `UnitLifecycle._backward_prefetch`)
        self.post_forward_order: list[FSDPUnit] = []
        self.backward_queued = False
        self.reductions = ReductionQueue()  # handles whose reduction is in flight, in issue order
        # Reductions start in one fixed order on every rank (reverse build order: the order backward
        # usually completes units), as DDP starts its buckets in index order: see `_on_grad`.
        self._reduce_order = [h for h in reversed(self.handles) if h.requires_grad]
        self._next_reduce = 0  # how many handles of `_reduce_order` this backward has started reducing
        self._complete: set[int] = set()  # ids of handles whose every parameter got its gradient
        self._warned_zero_filled: set[tuple[str, ...]] = set()
        self._running = False  # inside FSDP.forward or summon_full_params: the wrapped module may run
        # the wrapped module and the modules holding the root unit's parameters (e.g. the embedding, which
        # a `generate()` may call directly) refuse to run on sharded parameters; inner units gather themselves
        root_owners = {id(m): (name, m) for name, m in module.named_modules() if name == "" or any(
            m is owner for fp in plan.units[0].flat_params for p in fp.params for owner, _ in p.owners)}
        for name, owner in root_owners.values():
            owner.register_forward_pre_hook(partial(self._refuse_sharded_use, name or "the wrapped module"))
        # A module inside holds no parameters any more: its requires_grad_ would change nothing. It freezes
        # (or unfreezes) the flat parameters it covers instead, or says why it cannot (`requires_grad_`).
        flattened = [n for h in self.handles for info in h.layout.params for n in info.names]
        for name, inner in module.named_modules():
            if any(_below(n, name) for n in flattened):
                inner.requires_grad_ = weak_hook(self._requires_grad_below, name)
        for u, unit in enumerate(self.units):
            if not unit.is_root:
                if self.mixed_precision.cast_forward_inputs:
                    unit.module.register_forward_pre_hook(self._cast_unit_inputs, with_kwargs=True)
                unit.module.register_forward_pre_hook(skipped_by_dynamo(partial(self._pre_forward, unit)))
                unit.module.register_forward_hook(skipped_by_dynamo(partial(self._post_forward, unit)))
            for i, h in enumerate(unit.handles):
                for leaf in (h.leaves if h.requires_grad else []):  # by index: a handle holds its leaves
                    leaf.register_post_accumulate_grad_hook(weak_hook(self._on_grad, u, i))

    @property
    def handles(self) -> list[FlatParamHandle]:
        """Every flat parameter of every unit, root first, in build order."""
        return [h for u in self.units for h in u.handles]

    # --- construction --------------------------------------------------------------------------------

    def _materialise(self, plan: Plan, init_fn, initial_values: list) -> list[FSDPUnit]:
        """Build each unit's shards one unit at a time: at most one unit is ever whole on this rank."""
        units = []
        unit_modules = {id(u.module) for u in plan.units}
        for u in plan.units:
            if init_fn is not None:
                for module in _modules_of_unit(u.module, unit_modules):  # FSDP1's _get_modules_to_materialize
                    init_fn(module)
            handles = [self._handle(fp, initial_values) for fp in u.flat_params]
            unit = FSDPUnit(u.label, u.module, handles, u.is_root, self.reshard_after_forward)
            unit.reshard()
            units.append(unit)
        for name, buf in list(self.module.named_buffers()):
            if buf.is_meta:
                raise ValueError(f"buffer {name} is on the meta device: pass a param_init_fn that materialises "
                                 f"its module")
            owner, _, attr = name.rpartition(".")
            set_registered_buffer(self.module.get_submodule(owner), attr, buf.to(self.device))
        return units

    def _handle(self, fp: FlatParamPlan, initial_values: list) -> FlatParamHandle:
        """One flat parameter, built whole, synced from rank 0 or fingerprinted into `initial_values`
        (checked across ranks once every unit is built), then sharded."""
        layout = fp.layout(self.mesh_info.shard_mesh_size)
        full = _full_flat(fp, layout, self.device)
        if self.sync_module_states:
            broadcast_from_rank0([full])
        else:
            views = (full[info.offset:info.offset + info.numel] for info in layout.params)
            initial_values += [(p.names[0], fingerprint(v)) for p, v in zip(fp.params, views)]
        for p in fp.params:
            for module, name in p.owners:
                unregister_parameter(module, name)
        compute = self.mixed_precision.compute_dtype(fp.dtype)  # floating-point parameters only
        reduce = self.mixed_precision.gradient_reduce_dtype(fp.dtype)
        return FlatParamHandle(layout, [p.owners for p in fp.params], full, self.mesh_info, fp.requires_grad,
                               compute, reduce, self.impl, self.gathered_memory, fp.label)

    # --- forward -------------------------------------------------------------------------------------

    def forward(self, *args, **kwargs):
        for h in self.handles:  # a flat shard's requires_grad set directly (model.parameters()): its views follow
            if h.sharded_param.requires_grad != h.leaves[0].requires_grad:
                self._set_requires_grad([h], h.sharded_param.requires_grad)
        for t in tensors_in((args, kwargs)):
            if t.device != self.device:
                raise ValueError(f"input on {t.device}, but this rank computes on {self.device}: "
                                 f"move inputs with .to(fsdp_mini.get_device())")
        args, kwargs = self.mixed_precision.cast_inputs(args, kwargs, root=True)
        root = self.units[0]
        in_forward(True)  # the collectives until the end of forward are labelled "forward"
        try:
            self._pre_forward(root, self.module, args)
            self._running = True
            try:
                out = self.module(*args, **kwargs)
            finally:
                self._running = False
            self._post_forward(root, self.module, args, out)
        finally:
            in_forward(False)
        return out

    def _cast_unit_inputs(self, module, args, kwargs):
        """An inner unit's forward pre-hook under `MixedPrecision(cast_forward_inputs=True)`."""
        return self.mixed_precision.cast_inputs(args, kwargs, root=False)

    def _cast_buffers(self, dtype: torch.dtype) -> None:
        """Floating-point buffers in `dtype` (`MixedPrecision.buffer_dtype`), computed with from now on."""
        for name, buf in self.module.named_buffers():
            if buf.is_floating_point():
                owner, _, attr = name.rpartition(".")
                set_registered_buffer(self.module.get_submodule(owner), attr, buf.to(dtype))

    def _refuse_sharded_use(self, name: str, module, args) -> None:
        """A forward pre-hook on the wrapped module and on the modules holding the root unit's parameters:
        called directly (not through this wrapper, e.g. by the model's own `generate()`) outside
        `summon_full_params`, they would compute with parameters that have no storage. Say so."""
        if not self._running:
            raise RuntimeError(f"{name} ({type(module).__name__}) is inside an FSDP wrapper and its parameters are "
                               f"sharded: call the wrapper (model(...)), or use it inside "
                               f"`with model.summon_full_params():`")

    @dynamo_disable  # under torch.compile the hooks run eagerly, at graph breaks (fsdp_mini.fsdp.compile_boundary)
    def _pre_forward(self, unit: FSDPUnit, module, args) -> None:
        if unit.training_state is TrainingState.PRE_BACKWARD:  # activation checkpointing recomputes the unit inside
            return                                     # its backward: pre-backward has gathered it already
        self.forward_order.join(unit)
        unit.pre_forward(self._forward_prefetch(unit))

    def _forward_prefetch(self, unit: FSDPUnit) -> list[FSDPUnit]:
        """The unit to gather ahead: the one that first ran after this one (nothing in the first forward,
        whose order is still being learnt, nor in a recomputation inside backward)."""
        if not self.prefetch or self.backward_queued:
            return []
        return self.forward_order.after(unit)[:1]

    @dynamo_disable
    def _post_forward(self, unit: FSDPUnit, module, args, out) -> None:
        if unit.training_state is TrainingState.PRE_BACKWARD:  # a recomputation: its backward needs the parameters
            return
        needs_grad = [t for t in tensors_in(out) if t.requires_grad]
        for t in needs_grad:
            t.register_hook(partial(self._pre_backward, unit))
        # Kept or freed by the strategy alone while a backward may come, as FSDP1's `_post_forward_reshard` does: a
        # unit whose outputs need no gradient (frozen, fed inputs that need none) stays gathered under
        # SHARD_GRAD_OP, and gradient accumulation does not gather it again for every micro-batch; it is not
        # recorded, so backward does not prefetch it (FSDP1's `_needs_pre_backward_unshard`)
        record = None if self.backward_queued or not needs_grad else self.post_forward_order
        unit.post_forward(record, backward_follows=torch.is_grad_enabled())
        if unit.is_root and not needs_grad:  # inference: no backward will come to free anything
            for u in self.units:
                u.reshard()

    # --- backward ------------------------------------------------------------------------------------

    def _pre_backward(self, unit: FSDPUnit, grad) -> None:
        if not self.backward_queued:
            self.backward_queued = True
            queue_after_backward(self._finish_backward)
        unit.pre_backward(self.post_forward_order, None if self.prefetch else [])

    def _on_grad(self, unit_index: int, handle_index: int, leaf) -> None:
        """Once all of a handle's gradients are accumulated: start the reductions now due, in
        `_reduce_order` (see `_start_reductions`), and free the handle's gathered parameters."""
        handle = self.units[unit_index].handles[handle_index]
        handle.grads_ready += 1
        if handle.grads_ready == len(handle.leaves):  # every parameter's gradient is complete
            self._complete.add(id(handle))
            if self.requires_gradient_sync:
                self._start_reductions(end_of_backward=False)
            if self._frees_in_backward():
                handle.reshard()

    def _frees_in_backward(self) -> bool:
        """Whether backward frees the gathered parameters. Inside `no_sync()` a strategy that keeps them after
        forward (SHARD_GRAD_OP, NO_SHARD) keeps them after backward too, for the next micro-batch: one AllGather
        per accumulation instead of one per micro-batch, for the memory of a gathered model, as FSDP1 trades
        (`_should_free_in_backward`, torch/distributed/fsdp/_runtime_utils.py:811). The synced backward frees."""
        return self.requires_gradient_sync or self.reshard_after_forward

    def _start_reductions(self, end_of_backward: bool) -> None:
        """Reduce the handles of `_reduce_order` from the next one on, while each is complete; at the end
        of backward, every remaining one that has a gradient (missing parameters count as zeros). One
        with no gradient at all keeps `sharded_param.grad` None, as a plain module's unused parameters do (every
        rank leaves the same whole flat parameters unused, as the AllGathers already require).
        Why one fixed order, not the order handles complete in: a rank where some parameter got no
        gradient (routed by data, it served only another rank's rows) completes that handle only at the
        end of backward; issued in completion order, two same-sized units' ReduceScatters would be
        paired with each other's gradients, silently. A handle that never completes holds back those
        after it until the end of backward: correct, with less overlap."""
        while self._next_reduce < len(self._reduce_order):
            h = self._reduce_order[self._next_reduce]
            if not end_of_backward and id(h) not in self._complete:
                return
            if h.has_unsharded_grads():
                self._warn_if_zero_filled(h)
                self._reduce(h)
            self._next_reduce += 1

    def _warn_if_zero_filled(self, handle: FlatParamHandle) -> None:
        """Say so (once per flat parameter and set of names) when some of its parameters got no gradient
        on this rank while others did: a flat shard is one tensor to the optimizer, so they get zeros."""
        missing = handle.names_without_grad()
        if missing and (handle.label, *missing) not in self._warned_zero_filled:
            self._warned_zero_filled.add((handle.label, *missing))
            warnings.warn(
                f"FSDP: {', '.join(missing)} got no gradient on rank {dist.get_rank()} but share the flat parameter "
                f"'{handle.label}' with parameters that did. The optimizer steps a flat shard as one tensor, so they "
                f"get a zero gradient: weight decay, momentum and Adam's moments still change them, where a plain "
                f"model would leave a parameter without gradient alone. If another rank uses them (routing by "
                f"data), the zero is this rank's correct share; if no rank does, give them a unit of their own "
                f"(wrap=...), whose gradient then stays None, or use fully_shard (None per parameter)", stacklevel=2)

    def _reduce(self, handle: FlatParamHandle) -> None:
        """Start reducing one handle's gradients: into the open bucket (NO_SHARD), or a ReduceScatter;
        the previous handle's ReduceScatter is done by now, so its replica AllReduce starts."""
        if self.mesh_info.shard_process_group is None:
            self.grad_buckets.add(handle, handle.take_unsharded_grad())
        else:
            handle.start_grad_reduction()
        self.reductions.add(handle)

    def _finish_backward(self) -> None:
        """End of backward: reduce what post-backward did not (unused parameters, accumulated no_sync
        gradients), wait for every reduction, and free every gathered unit (see `_frees_in_backward`)."""
        if self.requires_gradient_sync:
            self._start_reductions(end_of_backward=True)
        self.grad_buckets.wait()
        self.reductions.wait_all()
        for unit in self.units:
            unit.finalize_backward(reshard=self._frees_in_backward())
        self.backward_queued = False
        self._next_reduce, self._complete = 0, set()
        self.post_forward_order.clear()

    # --- after wrapping: freezing, conversions --------------------------------------------------------

    def requires_grad_(self, requires_grad: bool = True) -> "FSDP":
        """Freeze (or unfreeze) the whole model: every flat parameter (see `_requires_grad_below`)."""
        self._requires_grad_below("", requires_grad)
        return self

    def _requires_grad_below(self, name: str, requires_grad: bool = True) -> nn.Module:
        """`requires_grad_` of the wrapped module `name` ("" for the whole): its parameters live in flat
        parameters now, so it freezes the flat parameters it covers, as FSDP1 freezes a unit's flat parameter.
        A flat parameter is one tensor to autograd and to the optimizer: one the module covers only in part
        cannot be frozen in part, and is a ValueError naming the fix, before anything changes."""
        covered = []
        for h in self.handles:
            inside = [any(_below(n, name) for n in info.names) for info in h.layout.params]
            if not any(inside):
                continue
            if not all(inside):
                where = name or "the wrapped module"
                others = [info.names[0] for info, i in zip(h.layout.params, inside) if not i]
                raise ValueError(f"{where}.requires_grad_({requires_grad}) after FSDP: its parameters share the flat "
                                 f"parameter '{h.label}' with {_listed(others)}, and the flat design trains a flat "
                                 f"parameter as one tensor. Set requires_grad before wrapping (frozen parameters "
                                 f"then get a flat parameter of their own), make the module a unit of its own "
                                 f"(wrap=...), or use fully_shard, which freezes per parameter")
            covered.append(h)
        self._set_requires_grad(covered, requires_grad)
        return self.module.get_submodule(name)

    def _set_requires_grad(self, handles: list[FlatParamHandle], requires_grad: bool) -> None:
        built_frozen = [h.label for h in handles if requires_grad and not h.requires_grad]
        if built_frozen:
            raise ValueError(f"cannot unfreeze {built_frozen} after FSDP: they were frozen when wrapped, so FSDP built "
                             f"them without gradient hooks or a place among the reductions. Wrap the model with them "
                             f"trainable (and freeze them after wrapping, if they start frozen), or use fully_shard")
        for h in handles:
            h.set_requires_grad(requires_grad)

    def _apply(self, fn, recurse: bool = True):
        """`.to()`, `.half()`, `.double()`, `.cpu()` ... on the wrapper or a module holding it: a conversion
        that would change the flat shards' dtype or device is a ValueError before anything changes. The shards
        would change while the units go on gathering, computing and reducing in the dtype and on the device
        chosen at wrapping (PyTorch's FSDP1 accepts `.to(torch.bfloat16)` in torch 2.13; fsdp_mini refuses)."""
        for h in self.handles:
            probe = torch.empty(0, dtype=h.sharded_param.dtype, device=h.sharded_param.device)
            moved = fn(probe)
            if moved.dtype != probe.dtype or moved.device != probe.device:
                raise ValueError(f"FSDP holds its parameters in flat shards of {probe.dtype} on {probe.device}; this "
                                 f"conversion would make them {moved.dtype} on {moved.device} while every unit goes on "
                                 f"computing as set at wrapping. Convert the model before wrapping it, or compute in "
                                 f"another dtype with mixed_precision=MixedPrecision(param_dtype=...); fully_shard "
                                 f"follows .to() after wrapping")
        return super()._apply(fn, recurse)

    # --- public helpers ------------------------------------------------------------------------------

    @contextmanager
    def summon_full_params(module: nn.Module, recurse: bool = True, writeback: bool = True, rank0_only: bool = False,
                           offload_to_cpu: bool = False, with_grads: bool = False):
        """FSDP1's `summon_full_params`: gather every unit and show the wrapped module its original parameters,
        registered under their own names, so it can be read and used as a plain module
        (`model.module.generate(...)`, `.parameters()`, `.device`). Called as FSDP1's static method,
        `FSDP.summon_full_params(model_or_a_module_holding_it)`, or as `model.summon_full_params()`.
        `writeback` (FSDP1's default True): values changed in place inside reach the shards at the end
        (`FlatParamHandle.write_back`); False: read-only, changes are dropped. `recurse`: every unit is this
        wrapper's own (fsdp_mini does not nest wrappers), so both values gather them all. `rank0_only`,
        `offload_to_cpu`, `with_grads` are not implemented: a ValueError says so before anything is gathered
        (`full_state_dict()` gives every value on every rank, on the CPU if you move it)."""
        unsupported = [name for name, on in (("rank0_only", rank0_only), ("offload_to_cpu", offload_to_cpu),
                                             ("with_grads", with_grads)) if on]
        if unsupported:
            raise ValueError(f"summon_full_params({'=True, '.join(unsupported)}=True) is not implemented in fsdp_mini; "
                             f"gather every value with model.full_state_dict() (a dict of whole tensors) instead")
        wrappers = [m for m in module.modules() if isinstance(m, FSDP)]
        with ExitStack() as stack:
            for wrapper in wrappers:
                stack.enter_context(wrapper._summoned(writeback))
            yield

    @contextmanager
    def _summoned(self, writeback: bool):
        for unit in self.units:
            unit.unshard()
        for h in self.handles:
            h.register_original_params(writeback)
        previous, self._running = self._running, True
        try:
            yield
        finally:
            self._running = previous
            for h in self.handles:
                h.unregister_original_params()
            for unit in self.units:
                unit.reshard()

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False
                        ) -> torch.Tensor:
        """Clip the global gradient norm, computed over all shards, as `torch.nn.utils.clip_grad_norm_`
        would on the unsharded model; returns the norm. Call it after backward, before the step. One
        AllReduce of one number over the shard group (SUM of |g|^p, or MAX for the infinity norm),
        through `fsdp_mini.collectives`, so CommLog sees it and `impl` applies (`fsdp_mini.grad_norm`). `error_if_nonfinite`:
        raise, as PyTorch does, when the norm is nan or inf (every rank sees the same norm, so every rank
        raises) instead of scaling the gradients by it. (With `fully_shard` the gradients are DTensors:
        `torch.nn.utils.clip_grad_norm_(model.parameters(), ...)` does the same there.)"""
        grads = [h.sharded_param.grad for h in self.handles if h.requires_grad and h.sharded_param.grad is not None]
        return clip_sharded_grads_(grads, max_norm, norm_type, self.mesh_info.shard_process_group, self.impl,
                                   error_if_nonfinite, self.device)

    def memory_stats(self, optimizer=None) -> dict[str, int]:
        """This rank's bytes: sharded params, sharded grads, optimizer state, unsharded params now/peak."""
        return step_memory_stats([h.sharded_param for h in self.handles], optimizer, self.gathered_memory)

    def reshard(self) -> None:
        """Free every gathered unit (what loading new values into the shards needs first)."""
        for unit in self.units:
            unit.reshard()

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The unsharded state dict on every rank, on CPU: the keys and shapes of the wrapped module's.
        Collective: each flat parameter is gathered once (`FlatParamHandle.full_state`)."""
        values: dict[str, torch.Tensor] = {}
        for h in self.handles:
            values.update(h.full_state())
        for name, buf in self.module.named_buffers(remove_duplicate=False):
            values[name] = buf.detach().to("cpu", dtype=self._buffer_dtypes[name], copy=True)
        return {k: values[k] for k in self.state_dict_keys}

    def full_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every key of the full state dict -> its shape."""
        shapes = {name: shape for h in self.handles for name, shape in h.full_shapes().items()}
        buffers = dict(self.module.named_buffers(remove_duplicate=False))
        return {k: shapes[k] if k in shapes else tuple(buffers[k].shape) for k in self.state_dict_keys}

    def load_full_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Load a full state dict (strict: every key, every shape, or a ValueError before anything is
        copied); each rank keeps only its shards. No communication."""
        check_full_state_dict(self.full_shapes(), state_dict)
        self._copy_in(state_dict)

    def _copy_in(self, values: dict[str, torch.Tensor]) -> None:
        """Copy full tensors (any subset of the full state dict's keys, shapes checked) into the shards and
        buffers; each rank keeps only its pieces. No communication."""
        self.reshard()  # the gathered copies would be stale
        for h in self.handles:
            h.load_full_state(values)
        buffers = dict(self.module.named_buffers(remove_duplicate=False))
        with torch.no_grad():
            for name in self.state_dict_keys:
                if name in buffers and name in values:
                    buffers[name].copy_(values[name])

    def state_dict(self, *args, destination=None, prefix: str = "", keep_vars: bool = False):
        """The full state dict (`full_state_dict`): the familiar call gives the familiar keys. With nn.Module's
        `destination` and `prefix`, which a parent's `state_dict()` passes when it reaches this wrapper, its
        entries go there under the prefix: a model that holds an FSDP part saves that part whole, as with
        PyTorch's FSDP1. Collective (every rank must call it). `keep_vars` changes nothing: the values are
        gathered copies."""
        if args:  # nn.Module's deprecated positional form: state_dict(destination, prefix, keep_vars)
            destination, prefix, keep_vars = (*args, *(destination, prefix, keep_vars)[len(args):])[:3]
        if destination is None:
            destination = OrderedDict()
            destination._metadata = OrderedDict()  # type: ignore[attr-defined] - as nn.Module's
        for name, value in self.full_state_dict().items():
            destination[prefix + name] = value
        return destination

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs) -> None:
        """nn.Module's `load_state_dict` (on this wrapper or on a module that holds it) calls this with the
        keys under `prefix`: the wrapped module's names, as `state_dict()` gives them. The present keys of the
        right shape are copied into the shards (what `load_state_dict` does with a plain module), the rest
        reported as nn.Module reports them (missing, unexpected, size mismatch; `strict` decides whether that
        raises, after the whole traversal, as in PyTorch). The keys are taken out of `state_dict`, so the
        wrapper's own children (`module`, whose parameters are flattened, and `_flat_params`) see none of
        them; what those would report missing is dropped by `_drop_inner_missing_keys`. No communication."""
        if local_metadata.get("assign_to_params_buffers", False):
            raise ValueError("load_state_dict(assign=True) cannot replace the flat design's parameters (they are "
                             "views into flat shards): load without assign, which copies into the shards")
        expected = self.full_shapes()
        mine = {key[len(prefix):]: key for key in state_dict if key.startswith(prefix)}
        values = {}
        for name, shape in expected.items():
            if name not in mine:
                missing_keys.append(prefix + name)
            elif tuple(state_dict[mine[name]].shape) != shape:
                error_msgs.append(f"size mismatch for {mine[name]}: copying a param with shape "
                                  f"{state_dict[mine[name]].shape} from checkpoint, the shape in current model is "
                                  f"{torch.Size(shape)}.")
            else:
                values[name] = state_dict[mine[name]]
        unexpected_keys.extend(key for name, key in mine.items() if name not in expected)
        for key in mine.values():
            del state_dict[key]
        self._loading_prefix = prefix
        self._copy_in(values)

    @staticmethod
    def _drop_inner_missing_keys(module: "FSDP", incompatible_keys) -> None:
        """A load-state-dict post-hook: the keys `module.*` and `_flat_params.*` under this wrapper are its
        internals (the flattened module's buffers were loaded under their own names), never in a state dict."""
        inner = tuple(module._loading_prefix + child for child in ("module.", "_flat_params."))
        incompatible_keys.missing_keys[:] = [k for k in incompatible_keys.missing_keys if not k.startswith(inner)]

    def __deepcopy__(self, memo):
        refuse_deepcopy("FSDP")

    def __getattr__(self, name: str):  # attributes of the wrapped module read through, as in PyTorch
        try:
            return super().__getattr__(name)
        except AttributeError:
            inner = self.__dict__.get("_modules", {}).get("module")
            if inner is None:
                raise
            return getattr(inner, name)


def _below(param_name: str, module_name: str) -> bool:
    """Whether the parameter `param_name` lies inside the module `module_name` ("" is the whole model)."""
    return not module_name or param_name.startswith(module_name + ".")


def _listed(names: list[str], limit: int = 4) -> str:
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _full_flat(fp: FlatParamPlan, layout, device) -> torch.Tensor:
    """The unit's whole flat buffer, copied from the parameters as their first owner holds them now
    (`param_init_fn` may have replaced a meta parameter by a new one)."""
    params = [getattr(module, name) for module, name in (p.owners[0] for p in fp.params)]
    for p, now in zip(fp.params, params):
        if now.is_meta:
            raise ValueError(f"parameter {p.names[0]} is on the meta device: pass a param_init_fn that "
                             f"materialises its module")
    return flatten([t.detach() for t in params], layout, dtype=fp.dtype, device=device)


def _modules_of_unit(root: nn.Module, unit_modules: set[int]) -> list[nn.Module]:
    """The modules a unit materialises, breadth first from its module, stopping at other units' modules
    (PyTorch FSDP1's `_get_modules_to_materialize`, torch/distributed/fsdp/_init_utils.py)."""
    found, queue, seen = [], [root], {id(root)}
    while queue:
        module = queue.pop(0)
        found.append(module)
        for child in module.children():
            if id(child) not in seen and id(child) not in unit_modules:
                seen.add(id(child))
                queue.append(child)
    return found


def materialise_by_name(model: nn.Module, init: Callable[[str, torch.Tensor], None]) -> Callable[[nn.Module], None]:
    """A `param_init_fn(module)` for a model whose initial values are a function of each tensor's name
    (the course's GPT: `init(name, tensor)` fills `tensor` in place): the module's own parameters and
    buffers go to this rank's device (`to_empty(recurse=False)`) and each is filled under its full name."""
    names = {id(m): prefix for prefix, m in model.named_modules()}
    device = get_device()

    def param_init_fn(module: nn.Module) -> None:
        if not any(t.is_meta for t in [*module.parameters(recurse=False), *module.buffers(recurse=False)]):
            return
        module.to_empty(device=device, recurse=False)
        prefix = names[id(module)]
        for name, tensor in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
            with torch.no_grad():
                init(f"{prefix}.{name}" if prefix else name, tensor)

    return param_init_fn

