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

SHARD_GRAD_OP (ZeRO-2) skips the free after forward and so the second AllGather. HYBRID_SHARD does
FULL_SHARD inside each shard group and then AllReduces each gradient shard across the replica group.
NO_SHARD (DDP) is the same machinery with shard groups of one rank: nothing to gather, and the units'
flat gradients AllReduced across all ranks in buckets of `bucket_cap_mb`, as DDP does (`GradBuckets`).
Per step and unit, with P = padded bytes of a unit's flat parameters, n = shard group size,
r = replicas (CommLog's S bytes; the root unit skips the backward AllGather):

    FULL_SHARD / HYBRID_SHARD     2 AllGather(P)  + ReduceScatter(P)  [+ AllReduce(P/n) across r]
    SHARD_GRAD_OP / _HYBRID_ZERO2 1 AllGather(P)  + ReduceScatter(P)  [+ AllReduce(P/n) across r]
    NO_SHARD                      AllReduce of the P's, packed in backward order into buckets of at
                                  least bucket_cap_mb (the last one holds the rest)

Prefetch order is the execution order recorded in the first forward and backward, as in PyTorch FSDP.
"""
from __future__ import annotations

import hashlib
from contextlib import contextmanager
from functools import partial

import torch
import torch.distributed as dist
import torch.nn as nn

from fsdp_mini import collectives as C
from fsdp_mini.comm_log import scope
from fsdp_mini import state_dict as SD
from fsdp_mini.flat_param import FlatLayout, flatten
from fsdp_mini.flat_param_handle import FlatParamHandle
from fsdp_mini.grad_buckets import GradBuckets
from fsdp_mini.groups import make_groups, shard_size_for
from fsdp_mini.launch import get_device
from fsdp_mini.memory import MemoryTracker, optimizer_state_bytes, tensor_bytes
from fsdp_mini.mixed_precision import MixedPrecision
from fsdp_mini.strategy import ShardingStrategy, as_strategy

__all__ = ["FSDP", "FSDPUnit"]

_RESHARD_AFTER_FORWARD = {ShardingStrategy.FULL_SHARD, ShardingStrategy.HYBRID_SHARD}


class FSDPUnit:
    """One unit: a module, the flat handles of the parameters it owns, and its per-step state."""

    def __init__(self, name: str, module: nn.Module, handles: list[FlatParamHandle], is_root: bool):
        self.name, self.module, self.handles, self.is_root = name, module, handles, is_root
        self.backward_started = False

    def unshard(self, async_op: bool = False) -> None:
        for h in self.handles:
            h.unshard(async_op=True)
        if not async_op:
            self.wait()

    def wait(self) -> None:
        for h in self.handles:
            h.wait_unshard()

    def reshard(self) -> None:
        for h in self.handles:
            h.reshard()

    def __repr__(self) -> str:
        return f"FSDPUnit({self.name or '<root>'}, {len(self.handles)} flat params)"


def _tensors(obj):
    """Every tensor inside nested tuples, lists and dicts (a forward's inputs or outputs)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _tensors(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _tensors(x)


def _cast(obj, dtype):
    if isinstance(obj, torch.Tensor):
        return obj.to(dtype) if obj.is_floating_point() else obj
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cast(x, dtype) for x in obj)
    if isinstance(obj, dict):
        return {k: _cast(v, dtype) for k, v in obj.items()}
    return obj


class FSDP(nn.Module):
    """Fully Sharded Data Parallel over all ranks of the default process group (see the module doc).

    `wrap`: module classes that become their own unit. `shard_size`: ranks per shard group for the
    hybrid strategies (default LOCAL_WORLD_SIZE: one node). `param_init_fn(name, tensor)`: fills a
    parameter or buffer in place by its name, required for a model built on the meta device, which is
    materialised one unit at a time. `impl`: "builtin" (torch.distributed) or "ring" (fsdp_mini's own).
    `bucket_cap_mb`: NO_SHARD only, the size of its gradient buckets, as in PyTorch's DDP.
    """

    def __init__(self, module: nn.Module, sharding_strategy=ShardingStrategy.FULL_SHARD, wrap=(),
                 shard_size: int | None = None, mixed_precision: MixedPrecision | None = None,
                 prefetch: bool = True, param_init_fn=None, impl: str = "builtin", bucket_cap_mb: float = 25):
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("FSDP needs torch.distributed: run under fsdp_mini.launch or torchrun and call "
                               "fsdp_mini.init() first")
        if isinstance(module, FSDP) or any(isinstance(m, FSDP) for m in module.modules()):
            raise ValueError("module is already wrapped in FSDP")
        if mixed_precision is not None and not isinstance(mixed_precision, MixedPrecision):
            raise ValueError(f"mixed_precision must be a MixedPrecision, got {type(mixed_precision).__name__}")
        C._check_impl(impl)
        if isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, (int, float)) or not bucket_cap_mb > 0:
            raise ValueError(f"bucket_cap_mb must be a positive number of MiB, got {bucket_cap_mb!r}")
        self.strategy = as_strategy(sharding_strategy)
        self.mixed_precision = mixed_precision or MixedPrecision()
        self.prefetch, self.impl, self.device = prefetch, impl, get_device()
        size = shard_size_for(self.strategy, dist.get_world_size(), shard_size)
        plan = _plan_units(module, _wrap_classes(wrap, module))
        _check_same_model_everywhere(self.strategy, size, plan, self.device)

        self.module = module
        self.groups = make_groups(size)
        self.memory = MemoryTracker()
        self._buckets = GradBuckets(self.groups.replica, impl, int(bucket_cap_mb * 2**20))
        self.units = self._materialise(plan, param_init_fn)
        self._flat_params = nn.ParameterList([h.shard for u in self.units for h in u.handles])
        self._sd_keys = plan.state_dict_keys
        self._sync, self._backward_queued, self._pending = True, False, []
        self._fwd_order, self._bwd_order, self._fwd_calls, self._bwd_calls = [], [], 0, 0
        self._recording_fwd = self._recording_bwd = True
        for unit in self.units:
            if not unit.is_root:
                unit.module.register_forward_pre_hook(partial(self._pre_forward, unit))
                unit.module.register_forward_hook(partial(self._post_forward, unit))
            for h in unit.handles:
                for leaf in (h.leaves if h.requires_grad else []):
                    leaf.register_post_accumulate_grad_hook(partial(self._on_grad, h))

    # --- construction --------------------------------------------------------------------------------

    def _materialise(self, plan, init_fn) -> list[FSDPUnit]:
        """Build each unit's shards one unit at a time: at most one unit is ever whole on this rank."""
        mp, units = self.mixed_precision, []
        for unit_name, unit_module, groups_of_params in plan.units:
            handles = []
            for (requires_grad, dtype), entries in groups_of_params.items():
                layout = FlatLayout([e.names for e in entries], [e.param.shape for e in entries],
                                    self.groups.shard_size)
                full = _full_flat(entries, layout, dtype, self.device, init_fn)
                for e in entries:
                    for module, name in e.owners:
                        del module._parameters[name]
                compute = mp.param_dtype or dtype
                reduce = mp.reduce_dtype or compute
                label = f"{unit_name or 'root'}" + ("" if requires_grad else " (frozen)")
                handles.append(FlatParamHandle(layout, [e.owners for e in entries], full, self.groups,
                                               requires_grad, compute, reduce, self.impl, self.memory, label))
            unit = FSDPUnit(unit_name, unit_module, handles, is_root=unit_name == "")
            unit.reshard()
            units.append(unit)
        for name, buf in list(self.module.named_buffers()):
            owner, _, attr = name.rpartition(".")
            mod = self.module.get_submodule(owner)
            if buf.is_meta:
                if init_fn is None:
                    raise ValueError(f"buffer {name} is on the meta device: pass param_init_fn to materialise it")
                real = torch.empty_like(buf, device=self.device)
                init_fn(name, real)
                mod._buffers[attr] = real
            else:
                mod._buffers[attr] = buf.to(self.device)
        return units

    # --- forward -------------------------------------------------------------------------------------

    def forward(self, *args, **kwargs):
        for t in _tensors((args, kwargs)):
            if t.device != self.device:
                raise ValueError(f"input on {t.device}, but this rank computes on {self.device}: "
                                 f"move inputs with .to(fsdp_mini.get_device())")
        if self.mixed_precision.param_dtype is not None and self.mixed_precision.cast_forward_inputs:
            args, kwargs = _cast((args, kwargs), self.mixed_precision.param_dtype)
        root = self.units[0]
        self._fwd_calls = 0
        self._pre_forward(root, self.module, args)
        out = self.module(*args, **kwargs)
        self._post_forward(root, self.module, args, out)
        return out

    def _pre_forward(self, unit: FSDPUnit, module, args) -> None:
        unit.unshard(async_op=True)
        self._advance(unit, self._fwd_order, "_recording_fwd", "_fwd_calls")
        unit.wait()

    def _advance(self, unit, order, recording, calls) -> None:
        """Record the execution order in the first pass; later, prefetch the unit that comes next."""
        i = getattr(self, calls)
        setattr(self, calls, i + 1)
        if getattr(self, recording):
            order.append(unit)
        elif self.prefetch and i + 1 < len(order):
            order[i + 1].unshard(async_op=True)

    def _post_forward(self, unit: FSDPUnit, module, args, out) -> None:
        needs_grad = [t for t in _tensors(out) if t.requires_grad]
        for t in needs_grad:
            t.register_hook(partial(self._pre_backward, unit))
        if unit.is_root:
            self._recording_fwd = False
            if not needs_grad:  # inference: no backward will come to free anything
                for u in self.units:
                    u.reshard()
        elif not needs_grad or self.strategy in _RESHARD_AFTER_FORWARD:
            unit.reshard()

    # --- backward ------------------------------------------------------------------------------------

    def _pre_backward(self, unit: FSDPUnit, grad) -> None:
        if not self._backward_queued:
            self._backward_queued = True
            self._bwd_calls = 0
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)
        if unit.backward_started:
            return
        unit.backward_started = True
        unit.unshard(async_op=True)
        self._advance(unit, self._bwd_order, "_recording_bwd", "_bwd_calls")
        unit.wait()

    def _on_grad(self, handle: FlatParamHandle, leaf) -> None:
        handle.grads_ready += 1
        if handle.grads_ready == len(handle.leaves):  # every parameter's gradient is complete
            if self._sync:
                self._reduce(handle)
            handle.reshard()

    def _reduce(self, handle: FlatParamHandle) -> None:
        """Start reducing one handle's gradients: into the open bucket (NO_SHARD), or a ReduceScatter;
        the previous handle's ReduceScatter is done by now, so its replica AllReduce starts."""
        if self.groups.shard is None:
            self._buckets.add(handle, handle.take_flat_grad())
        else:
            handle.reduce_grad()
            if self._pending:
                self._pending[-1].start_replica_reduce()
        self._pending.append(handle)

    def _finish_backward(self) -> None:
        """End of backward: reduce what post-backward did not (unused parameters, accumulated no_sync
        gradients), wait for every reduction, and free every gathered unit."""
        for unit in self.units:
            for h in unit.handles:
                if self._sync and h.has_unsharded_grads() and h not in self._pending:
                    self._reduce(h)
        self._buckets.wait()
        for h in self._pending:
            h.wait_grad()
        for unit in self.units:
            unit.reshard()
            unit.backward_started = False
            for h in unit.handles:
                h.grads_ready = 0
        self._pending, self._backward_queued, self._recording_bwd = [], False, False

    # --- public helpers ------------------------------------------------------------------------------

    @contextmanager
    def no_sync(self):
        """Accumulate unsharded gradients locally without communication (gradient accumulation); the
        first backward after the block reduces everything accumulated."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    @contextmanager
    def summon_full_params(self):
        """Gather every unit so the original parameters can be read (e.g. to print them); read-only."""
        for unit in self.units:
            unit.unshard()
        try:
            yield
        finally:
            for unit in self.units:
                unit.reshard()

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip the global gradient norm, computed over all shards, as `torch.nn.utils.clip_grad_norm_`
        would on the unsharded model; returns the norm. Call it after backward, before the step."""
        grads = [h.shard.grad for u in self.units for h in u.handles if h.requires_grad and h.shard.grad is not None]
        norm_type = float(norm_type)
        if not grads:
            return torch.zeros((), device=self.device)
        if norm_type == float("inf"):
            local = torch.stack([g.detach().abs().max() for g in grads]).max().float()
            if self.groups.shard is not None:
                dist.all_reduce(local, dist.ReduceOp.MAX, group=self.groups.shard)
            total = local
        else:
            local = sum(g.detach().float().abs().pow(norm_type).sum() for g in grads).reshape(1)
            if self.groups.shard is not None:
                with scope("clip_grad_norm_"):
                    C.all_reduce(local, C.SUM, group=self.groups.shard, impl=self.impl)
            total = local[0].pow(1.0 / norm_type)
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for g in grads:
            g.mul_(coef.to(g.dtype))
        return total

    def memory_stats(self, optimizer=None) -> dict[str, int]:
        """This rank's bytes: sharded params, sharded grads, optimizer state, unsharded params now/peak."""
        shards = [h.shard for u in self.units for h in u.handles]
        return {"params": tensor_bytes(shards), "grads": tensor_bytes(s.grad for s in shards),
                "optimizer": optimizer_state_bytes(optimizer) if optimizer is not None else 0,
                "unsharded_now": self.memory.current, "unsharded_peak": self.memory.peak}

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The unsharded state dict on every rank, on CPU: the keys and shapes of the wrapped module's."""
        return SD.full_state_dict(self)

    def load_full_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Load a full state dict (strict); each rank keeps only its shards. No communication."""
        SD.load_full_state_dict(self, state_dict)

    def state_dict(self, *args, **kwargs):  # the familiar call gives the familiar keys
        return self.full_state_dict()

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        if not strict or assign:
            raise ValueError("FSDP.load_state_dict supports strict=True, assign=False only")
        self.load_full_state_dict(state_dict)

    def __getattr__(self, name: str):  # attributes of the wrapped module read through, as in PyTorch
        try:
            return super().__getattr__(name)
        except AttributeError:
            inner = self.__dict__.get("_modules", {}).get("module")
            if inner is None:
                raise
            return getattr(inner, name)


# --- planning: which unit owns which parameter (pure, before any collective) ------------------------

class _Entry:
    """A parameter to flatten: the tensor, its names (tied), and every (module, attribute) holding it."""

    def __init__(self, param: nn.Parameter):
        self.param, self.names, self.owners = param, [], []


class _Plan:
    def __init__(self, units, state_dict_keys):
        self.units, self.state_dict_keys = units, state_dict_keys


def _wrap_classes(wrap, module: nn.Module) -> tuple[type, ...]:
    wrap = (wrap,) if isinstance(wrap, type) else tuple(wrap or ())
    for cls in wrap:
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            raise ValueError(f"wrap must hold nn.Module classes, got {cls!r}")
        if not any(isinstance(m, cls) for name, m in module.named_modules() if name):
            raise ValueError(f"wrap class {cls.__name__} matches no submodule of {type(module).__name__}")
    return wrap


def _plan_units(module: nn.Module, wrap: tuple[type, ...]) -> _Plan:
    unit_names = [""] + [n for n, m in module.named_modules() if n and isinstance(m, wrap)]
    owner_unit: dict[int, str] = {}
    per_unit: dict[str, dict[int, _Entry]] = {u: {} for u in unit_names}
    for fqn, p in module.named_parameters(remove_duplicate=False):
        mod_path, _, attr = fqn.rpartition(".")
        unit = max((u for u in unit_names if u == "" or mod_path == u or mod_path.startswith(u + ".")), key=len)
        if owner_unit.setdefault(id(p), unit) != unit:
            first = next(e for e in per_unit[owner_unit[id(p)]].values() if e.param is p).names[0]
            raise ValueError(f"parameter {fqn} is tied to {first}, which is in another FSDP unit "
                             f"({owner_unit[id(p)] or 'root'} vs {unit or 'root'}); tied parameters must "
                             f"live in one unit: wrap their common parent instead")
        entry = per_unit[unit].setdefault(id(p), _Entry(p))
        entry.names.append(fqn)
        entry.owners.append((module.get_submodule(mod_path), attr))
    units = []
    for u in unit_names:
        groups: dict[tuple[bool, torch.dtype], list[_Entry]] = {}
        for e in per_unit[u].values():
            groups.setdefault((e.param.requires_grad, e.param.dtype), []).append(e)
        ordered = dict(sorted(groups.items(), key=lambda kv: not kv[0][0]))  # trainable first
        if ordered:
            units.append((u, module.get_submodule(u), ordered))
    if not units:
        raise ValueError(f"{type(module).__name__} has no parameters to shard")
    if units[0][0] != "":  # the root unit exists even without parameters of its own
        units.insert(0, ("", module, {}))
    params = {fqn for fqn, _ in module.named_parameters(remove_duplicate=False)}
    buffers = {fqn for fqn, _ in module.named_buffers(remove_duplicate=False)}
    keys = list(module.state_dict().keys())
    extra = [k for k in keys if k not in params and k not in buffers]
    if extra:
        raise ValueError(f"state dict entries that are neither parameters nor buffers are not supported: {extra}")
    return _Plan(units, keys)


def _full_flat(entries, layout: FlatLayout, dtype, device, init_fn) -> torch.Tensor:
    """The unit's whole flat buffer: copied from the parameters, or built by `init_fn` on meta ones."""
    if not any(e.param.is_meta for e in entries):
        return flatten([e.param.detach() for e in entries], layout, dtype=dtype, device=device)
    if init_fn is None:
        raise ValueError(f"parameter {entries[0].names[0]} is on the meta device: pass param_init_fn")
    full = torch.zeros(layout.padded_numel, dtype=dtype, device=device)
    for e, info in zip(entries, layout.params):
        view = full[info.offset:info.offset + info.numel].view(info.shape)
        init_fn(e.names[0], view)
    return full


def _check_same_model_everywhere(strategy, shard_size, plan, device) -> None:
    """Compare a hash of the unit plan across ranks, so mismatched models fail here with a clear error
    instead of hanging or silently mixing shards in the first AllGather."""
    parts = [strategy.name, shard_size]
    for name, _, groups in plan.units:
        parts.append((name, [(k[0], str(k[1]), [(e.names, tuple(e.param.shape)) for e in v])
                             for k, v in groups.items()]))
    digest = int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:7], "big")
    mine = torch.tensor([digest], dtype=torch.int64, device=device)
    everyone = torch.empty(dist.get_world_size(), dtype=torch.int64, device=device)
    getattr(dist, "all_gather_single", dist.all_gather_into_tensor)(everyone, mine)
    differ = [r for r, d in enumerate(everyone.tolist()) if d != everyone[0].item()]
    if differ:
        raise ValueError(f"ranks {differ} wrap a different model, wrap set or strategy than rank 0 "
                         f"(every rank must build the same FSDP)")
