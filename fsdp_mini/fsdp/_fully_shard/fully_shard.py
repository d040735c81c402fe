"""`fully_shard`: per-parameter sharding, PyTorch FSDP2's design and API, written from scratch.

    for block in model.blocks:
        fully_shard(block)              # bottom-up: each block is a unit...
    fully_shard(model)                  # ...then the root takes the parameters left over
    opt = torch.optim.AdamW(model.parameters())   # named parameters, each a DTensor of this rank's rows

`fully_shard(module)` returns the same module object. Its class becomes `FSDP<Class>`, a subclass that adds
FSDP2's methods (`FSDPModule`), and every parameter it manages becomes an `nn.Parameter` holding a
`DTensor`: this rank's dim-0 chunk, under the parameter's own name (`fsdp_mini.fsdp._fully_shard.fsdp_param`). One unit's
parameters are gathered with one AllGather and their gradients reduced with one ReduceScatter
(`fsdp_mini.fsdp._fully_shard.fsdp_param_group`). The schedule is the flat design's (`fsdp_mini.fsdp.fully_sharded_data_parallel`):

    pre-forward    AllGather the unit (waiting for it if prefetched), swap the gathered parameters in
    post-forward   reshard_after_forward=True: free them; False: keep them; k: keep a 1/k share
    pre-backward   AllGather again if freed; prefetch the unit that backward reaches next
    post-backward  ReduceScatter the gradients (async); the previous unit's is done: replica AllReduce
    end of backward  wait for every reduction, so that `opt.step()` sees the sharded gradients
    recomputation    activation checkpointing runs a unit's forward again inside its backward: the hooks
                     leave a unit in PRE_BACKWARD alone (FSDP2 does the same), so no extra AllGather

`mesh`: a DeviceMesh, 1-D (shard over it) or 2-D (replicate over dim 0, shard over dim 1: HSDP); by
default the whole world. The outermost `fully_shard`ed module to run forward is the root: it keeps its
parameters from forward into backward and queues the end-of-backward work. Forward prefetches the unit
that runs next (from the second forward on, in the order the first one recorded); on a GPU, FSDP2 gets
that overlap for free, since the CPU runs ahead of the GPU and issues the next unit's AllGather while
this one computes; gloo ranks do not run ahead, so fsdp_mini issues it explicitly, as its flat design
does. Backward prefetches, as FSDP2 does, the unit whose forward ended just before this one's in this
step (the root's ends last, so the root prefetches the last block as soon as backward starts; a head
called again after the previous chunk's backward ended prefetches nothing). `set_modules_to_forward_prefetch` and
`set_modules_to_backward_prefetch` set both orders by hand; an empty list means what it means in FSDP2:
no forward prefetch, and backward's default (FSDP2 cannot turn backward prefetch off, _fsdp_state.py:384).

A unit over several modules (`fully_shard([norm, head])`) whose forward ran only some of them (a chunked loss:
the model's forward stops after the norm, the head runs later on chunks of its output) is completed by the
root's post-forward, as FSDP2 does: resharded, recorded, and gathered again when backward reaches the root's
output. Each standalone call of the rest (the head on a chunk) gathers the unit, prefetches nothing, and
ends on its inputs' gradients: one AllGather and one ReduceScatter per chunk, as in FSDP2.

The optimizer steps on DTensors: every op of its per-parameter loop dispatches through DTensor, so on a
CPU (where PyTorch does not pick it by default) pass `foreach=True` to the optimizer, one dispatch for
all parameters: measured ~6x faster for AdamW on the course's GPT.
"""
from __future__ import annotations

import functools
import warnings
import weakref

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor, Replicate, Shard

from fsdp_mini import collectives as C
from fsdp_mini.fsdp.compile_boundary import dynamo_disable as _dynamo_disable
from fsdp_mini.fsdp.compile_boundary import skipped_by_dynamo as _skipped_by_dynamo
from fsdp_mini.parallel.data_parallel import (GradientSync, broadcast_from_rank0, check_same_everywhere, check_same_values,
                                              refuse_deepcopy)
from fsdp_mini.collective_calls import in_forward
from fsdp_mini.fsdp._fully_shard.fsdp_param import FSDPParam
from fsdp_mini.fsdp._fully_shard.fsdp_param_group import FSDPParamGroup, post_forward_shards
from fsdp_mini.fsdp.grad_reduction import ReductionQueue
from fsdp_mini.fsdp.groups import MeshInfo
from fsdp_mini.fsdp.full_state import check_full_state_dict
from fsdp_mini.memory import MemoryTracker, step_memory_stats
from fsdp_mini.fsdp.mixed_precision import MixedPrecisionPolicy
from fsdp_mini.nested import map_tensors, tensors_in
from fsdp_mini.fsdp.replaced_params import mark_replaced, wrapper_of
from fsdp_mini.rank_environment import get_device, require_distributed
from fsdp_mini.fsdp.states import TrainingState
from fsdp_mini.torch_internals import in_backward, queue_after_backward
from fsdp_mini.fsdp.units import ExecutionOrder, unit_label

__all__ = ["fully_shard", "FSDPModule", "FSDPState", "UnshardHandle", "register_fsdp_forward_method", "state_of",
           "default_mesh", "gathered_memory", "memory_stats", "full_state_dict", "load_full_state_dict"]

_STATE_ATTR = "_fsdp_state"  # where a module keeps its FSDPState: in its own __dict__, so it lives and dies with it
# id(sharded parameter) -> weak reference to the state whose unit holds it (to name the holder in an error):
# weak, so that no table keeps a model alive, and keyed by id, since a weak reference to the parameter
# itself would stop `module.to()` from swapping it; an entry goes when its state does
_HOLDERS: dict[int, weakref.ref] = {}
# id(original parameter) -> (a weak reference to it, its unit's label), while the caller still holds it (a
# parameter tied into a module sharded later must name the unit that took it); the entry goes with it
_MANAGED: dict[int, tuple[weakref.ref, str]] = {}
_DEFAULT_MESH: dict[int, object] = {}
_FSDP_CLASSES: dict[tuple[type, type], type] = {}  # (a module's class, the mixin) -> its subclass (`_fsdp_class`)


def state_of(module: nn.Module) -> "FSDPState":
    """The FSDP state of a module that `fully_shard` was applied to."""
    state = _state_or_none(module)
    if state is None:
        raise ValueError(f"{type(module).__name__} is not managed by fully_shard")
    return state


def _state_or_none(module: nn.Module) -> "FSDPState | None":
    return module.__dict__.get(_STATE_ATTR)


def gathered_memory(module: nn.Module) -> MemoryTracker:
    """The tracker of gathered (unsharded) parameter bytes, live and peak, shared by every unit on the
    module's mesh: its units' `gathered_memory`, the flat design's `FSDP.gathered_memory`."""
    group = state_of(module).group
    if group is None:
        raise ValueError(f"{type(module).__name__} manages no parameters of its own")
    return group.gathered_memory


def memory_stats(module: nn.Module, optimizer=None) -> dict[str, int]:
    """This rank's bytes, as `FSDP.memory_stats` reports them: sharded parameters and gradients (local
    chunks), optimizer state (local chunks), gathered parameters now and at their peak."""
    return step_memory_stats(list(module.parameters()), optimizer, gathered_memory(module))


def default_mesh():
    """A 1-D DeviceMesh over the whole world on this rank's device, created once per process group."""
    from torch.distributed.device_mesh import init_device_mesh

    key = id(dist.group.WORLD)
    if key not in _DEFAULT_MESH:
        _DEFAULT_MESH[key] = init_device_mesh(get_device().type, (dist.get_world_size(),))
    return _DEFAULT_MESH[key]


class UnshardHandle:
    """What `FSDPModule.unshard(async_op=True)` returns: `wait()` ends the gather."""

    def __init__(self, group: FSDPParamGroup | None):
        self._group = group

    def wait(self) -> None:
        if self._group is not None:
            self._group.wait_for_unshard()
            self._group = None


class FSDPModule:
    """The methods a module gains from `fully_shard` (the names of PyTorch's FSDP2)."""

    def __deepcopy__(self, memo):
        refuse_deepcopy("fully_shard")

    def unshard(self, async_op: bool = False) -> UnshardHandle | None:
        """Gather this unit's parameters now (e.g. before a custom use outside forward)."""
        group = state_of(self).group
        if group is not None:
            group.unshard(async_op=True)
        handle = UnshardHandle(group)
        if async_op:
            return handle
        handle.wait()
        return None

    def reshard(self) -> None:
        """Free this unit's gathered parameters."""
        group = state_of(self).group
        if group is not None:
            group.reshard()

    def set_requires_gradient_sync(self, requires_gradient_sync: bool, *, recurse: bool = True) -> None:
        """False: backward keeps accumulating unsharded gradients without communication (gradient
        accumulation); the first backward with True reduces all of it. `recurse`: every unit below too."""
        for state in _states_below(self, recurse):
            if state.group is not None:
                state.group.requires_gradient_sync = bool(requires_gradient_sync)

    def set_reshard_after_forward(self, reshard_after_forward: bool, *, recurse: bool = True) -> None:
        """Change whether units free their parameters after forward (True) or keep them (False)."""
        for state in _states_below(self, recurse):
            if not isinstance(reshard_after_forward, bool):
                raise ValueError("set_reshard_after_forward takes True or False")
            if state.group is not None:
                state.group.reshard_after_forward = reshard_after_forward
                state.group.post_forward_shards = None
                state.group.auto_reshard_after_forward = False

    def _apply(self, *args, **kwargs):
        """`module.to(dtype)`, `.double()`, `.to_empty(device=...)`: reshard first, convert, then adopt the
        converted shards as the unit's parameters (FSDP2 overrides `nn.Module._apply` the same way)."""
        group = state_of(self).group
        if group is not None:
            group.reshard()
        out = super()._apply(*args, **kwargs)
        if group is not None:
            with torch.no_grad():
                group.reset_sharded_params()
        return out

    def set_requires_all_reduce(self, requires_all_reduce: bool, *, recurse: bool = True) -> None:
        """HSDP: False reduce-scatters gradients inside the shard group but holds them back from the
        all-reduce across replicas; the next backward with True adds them in, so accumulated micro-batches
        cross nodes once (gradient accumulation with less inter-node traffic)."""
        for state in _states_below(self, recurse):
            if state.group is not None:
                state.group.all_reduce_grads = bool(requires_all_reduce)

    def set_is_last_backward(self, is_last_backward: bool) -> None:
        """False: the next backward does not wait for its gradient reductions (micro-batching: they finish
        in a later backward); the last backward (True, the default) waits for all of them, so the optimizer
        step sees every gradient."""
        state_of(self).is_last_backward = bool(is_last_backward)

    def set_reshard_after_backward(self, reshard_after_backward: bool, *, recurse: bool = True) -> None:
        """False: keep the parameters gathered after backward (with gradient accumulation, the next
        micro-batch's forward then needs no AllGather), at the cost of holding them; True (default) frees."""
        for state in _states_below(self, recurse):
            if state.group is not None:
                state.group.reshard_after_backward = bool(reshard_after_backward)

    def set_gradient_divide_factor(self, factor: float) -> None:
        """Divide the summed gradients by `factor` instead of averaging over the ranks (e.g. by the global
        number of tokens). The reduction sums, then divides: gloo has no pre-multiplied sum, so FSDP2's
        version of this call fails on CPU, while this one works on both backends."""
        if not isinstance(factor, (int, float)) or isinstance(factor, bool) or factor <= 0:
            raise ValueError(f"the gradient divide factor must be a positive number, got {factor!r}")
        group = state_of(self).group
        if group is not None:
            group.divide_factor = float(factor)

    def set_reduce_scatter_divide_factor(self, factor: float) -> None:
        """FSDP2's former name of `set_gradient_divide_factor`, deprecated there (a DeprecationWarning, the
        same message) and here."""
        warnings.warn("Use `set_gradient_divide_factor` instead", DeprecationWarning, stacklevel=2)
        self.set_gradient_divide_factor(factor)

    def set_force_sum_reduction_for_comms(self, enable: bool) -> None:
        """True: the collectives only sum (ReduceScatter, and AllReduce across replicas), and the chunks are
        divided by the number of ranks (or the divide factor) afterwards, as FSDP2 does when asked (NCCL's
        zero-copy transfers need sums). On gloo this is also how FSDP2's `set_gradient_divide_factor` can
        run: with sums forced it needs no pre-multiplied sum."""
        group = state_of(self).group
        if group is not None:
            group.force_sum_reduction_for_comms = bool(enable)

    def set_all_reduce_hook(self, hook, *, stream=None) -> None:
        """Call `hook(reduced)` on each of this unit's reduced gradient chunks (flat, in the reduce dtype),
        after the ReduceScatter (and with replicas, after their AllReduce), before any division by a divide
        factor and before the chunks become the parameters' gradients; the hook may change it in place (e.g.
        all-reduce it over a group of its own). FSDP2's call, at the same point. `stream`: FSDP2 runs the
        hook on that CUDA stream; fsdp_mini has no side streams and runs it where it waits for the
        reduction, so it only checks, as FSDP2 does, that no stream is given with replicas (HSDP)."""
        if not callable(hook):
            raise ValueError(f"set_all_reduce_hook takes a callable, got {type(hook).__name__}")
        group = state_of(self).group
        if group is None:
            return
        if stream is not None and group.mesh_info.replicate_mesh_size > 1:
            raise ValueError("stream cannot be set when using native HSDP")
        group.all_reduce_hook = hook

    def set_unshard_in_backward(self, unshard_in_backward: bool) -> None:
        """False: backward does not gather this unit's parameters (neither for its own backward nor as a
        prefetch), for a unit whose backward needs no parameter values, e.g. an embedding (its weight's
        gradient is built from the token ids and the output gradient). Its gradients are reduced as usual."""
        group = state_of(self).group
        if group is not None:
            group.unshard_in_backward = bool(unshard_in_backward)

    def reset_iter_state(self) -> None:
        """After an exception aborted a forward or a backward (on every rank), call this on the root module
        and train on: it waits for the collectives in flight, reshards every unit and forgets the step's
        bookkeeping (which units ran, the post-forward order, the end of backward queued). The failed
        step's gradients are lost, the unreduced and the held-back ones too: a gradient accumulation
        sequence starts again. FSDP2's method; on a unit that is not the root, a RuntimeError. FSDP2's
        docstring promises the same loss, but its code keeps the gathered parameters' gradients, so there
        an unsynced micro-batch (or what a failed backward produced) still enters the next synced step,
        unseen by zero_grad(); fsdp_mini drops them (tests/library/test_fsdp2_differential.py)."""
        state_of(self).reset_iter_state()

    def set_modules_to_forward_prefetch(self, modules: list) -> None:
        """In forward, right after this unit's AllGather is issued, issue these units' too (instead of the
        default: the unit that runs next in forward; [] for none)."""
        state_of(self).forward_prefetch = [_checked_state(m) for m in modules]

    def set_modules_to_backward_prefetch(self, modules: list) -> None:
        """In backward, right after this unit's AllGather is issued, issue these units' too (instead of
        the default: the unit whose forward ended just before this one's). An empty list is the default
        again, as in FSDP2 (`default_prefetch = len(self._states_to_backward_prefetch) == 0`,
        torch/distributed/fsdp/_fully_shard/_fsdp_state.py:384): a script moved between the two prefetches
        the same units."""
        state_of(self).backward_prefetch = [_checked_state(m) for m in modules] or None


def _checked_state(module) -> "FSDPState":
    if not isinstance(module, FSDPModule):
        raise ValueError(f"expected modules that fully_shard was applied to, got {type(module).__name__}")
    return state_of(module)


def _states_below(module, recurse: bool) -> list["FSDPState"]:
    mods = module.modules() if recurse else [module]
    return [s for s in map(_state_or_none, mods) if s is not None]


class _InputsGradReady(torch.autograd.Function):
    """Identity on a unit's inputs in forward; in backward it runs once the gradients with respect to
    those inputs are computed, i.e. when backward is done with the unit (FSDP2's RegisterPostBackward)."""

    @staticmethod
    def forward(ctx, state, *tensors):
        ctx.state = state
        return tensors

    @staticmethod
    def backward(ctx, *grads):
        ctx.state.inputs_grad_ready()
        return (None, *grads)


class FSDPState:
    """The hooks of one `fully_shard`ed module, and (for the root) the step's bookkeeping. The unit's
    parameters, their settings and their life in a step are its `FSDPParamGroup`'s (None for a module
    with no parameters of its own); the state routes the module's hooks to it, and routes the inputs
    that require grad through `_InputsGradReady`, which tells the group when their gradients are done."""

    def __init__(self, module: nn.Module, group: FSDPParamGroup | None, mp: MixedPrecisionPolicy,
                 modules: list[nn.Module] | None = None):
        self.module, self.group, self.mp = module, group, mp
        # `fully_shard([a, b])`: one unit over several modules; its post-forward waits for the last of them
        self.modules = modules or [module]
        self.to_run_forward: set[int] = set()  # ids of this pass's modules that have not run forward yet
        # ids of the unit's modules that ran in this root forward, over all its calls: a module run again
        # after the unit's forward ended (a block reused) starts a call that the others never finish, and
        # only the modules that never ran bring no gradient (`_force_complete_incomplete_states`)
        self.ran_forward: set[int] = set()
        self.is_last_backward = True  # the root's: wait for the reductions at the end of backward
        self.forward_prefetch: list[FSDPState] | None = None  # None: the next unit in the recorded order
        self.backward_prefetch: list[FSDPState] | None = None
        self.is_root: bool | None = None
        self.root: FSDPState | None = None
        # the root's bookkeeping
        self.forward_order = ExecutionOrder()  # units by their first pre-forward (forward prefetch)
        # every unit's post-forward of this step, in order, a unit once per call (FSDP2's
        # `post_forward_order`): backward prefetches the unit whose forward ended before this one's, so
        # the root, whose forward ends last, prefetches the last block as soon as backward starts
        self.post_forward_order: list[FSDPParamGroup] = []
        self.backward_queued = False
        # between the root's pre-forward and post-forward: only then does a unit's forward know which unit
        # runs next (forward prefetch); a unit called standalone afterwards (a chunked loss's head) does not
        self.forward_running = False
        # every state under the root (itself included), in `named_modules()` pre-order (FSDP2's
        # `all_states`): the root's post-forward completes the units whose forward ran only in part
        self.all_states: list[FSDPState] = []
        self.reductions = ReductionQueue()  # the root's: every unit's reduction in flight

    # --- lazy initialisation at the root -----------------------------------------------------------

    def _lazy_init(self) -> None:
        """The first forward: this module is the root; every unit below learns it, and its label (its
        path from the root: "layers.0", "root"), which CommLog and the memory tracker show."""
        self.is_root, self.root = True, self
        labelled = set()
        for path, m in self.module.named_modules():
            state = _state_or_none(m)
            if state is not None and not any(s is state for s in self.all_states):
                self.all_states.append(state)
            if state is not None and state.group is not None and id(state) not in labelled:
                # a unit over several modules is labelled by the first one's path
                state.group.lazy_init(unit_label(path), state is self, self.reductions)
                labelled.add(id(state))
            if state is not None and state is not self:
                if state.is_root:
                    raise ValueError("fully_shard's root changed: the module that ran forward first "
                                     "contains another root")
                state.is_root, state.root = False, self

    def reset_iter_state(self) -> None:
        """`FSDPModule.reset_iter_state`: the root, every unit below it, back to IDLE and sharded."""
        if self.is_root is False:
            raise RuntimeError("reset_iter_state must be called on the root FSDP module")
        states = {id(s): s for s in map(_state_or_none, self.module.modules()) if s is not None}
        for state in states.values():
            state.to_run_forward.clear()
            state.ran_forward.clear()
            if state.group is not None:
                state.group.reset_iter_state()
        self.reductions.clear()
        self.post_forward_order.clear()
        self.backward_queued = self.forward_running = False
        in_forward(False)

    # --- forward -----------------------------------------------------------------------------------

    @_dynamo_disable
    def pre_forward(self, module, args, kwargs):
        if self.group is not None and self.group.training_state is TrainingState.PRE_BACKWARD:
            return args, kwargs  # activation checkpointing's recomputation: pre-backward gathered the unit
        if self.is_root is None:
            self._lazy_init()
        root = self.root
        args, kwargs = self.mp.cast_inputs(args, kwargs)
        if self is root:  # the collectives until the root's post-forward belong to forward
            in_forward(True)
            root.forward_running = True
            for state in root.all_states:  # what standalone calls since the last forward ran is not this forward's
                state.ran_forward.clear()
        root.forward_order.join(self)  # first run of this unit (a unit skipped so far joins late)
        if len(self.modules) > 1:
            if not self.to_run_forward:  # the first of the unit's modules in this forward
                self.to_run_forward = {id(m) for m in self.modules}
            elif self.group is not None and self.group.training_state is TrainingState.FORWARD:
                if torch.is_grad_enabled() and not root.backward_queued:
                    args, kwargs = self._hook_inputs(args, kwargs)
                return args, kwargs  # gathered by the unit's first module already
        if self.group is not None:
            self.group.pre_forward([s.group for s in self._forward_prefetch_targets() if s.group is not None])
            # a recomputation during backward (a checkpointed span of several units) builds a graph that
            # autograd discards: hooking its inputs would leave a call that backward never finishes
            if torch.is_grad_enabled() and not root.backward_queued:
                args, kwargs = self._hook_inputs(args, kwargs)
        return args, kwargs

    def _forward_prefetch_targets(self) -> list["FSDPState"]:
        """The units to gather ahead: those set by hand, or the next unit with parameters in the order the
        first forward recorded (nothing during that first forward, whose order is still being learnt)."""
        if self.forward_prefetch is not None:
            return self.forward_prefetch
        if self.root.backward_queued or not self.root.forward_running:
            return []  # a standalone call (a chunked loss's head): what runs after it is not known
        following = self.root.forward_order.after(self)
        return next(([s] for s in following if s.group is not None), [])

    def _hook_inputs(self, args, kwargs):
        """Route the inputs that require grad through `_InputsGradReady`, to learn when backward is done."""
        flat = [t for t in tensors_in((args, kwargs)) if t.requires_grad]
        if not flat:
            return args, kwargs
        self.group.hooked_calls += 1
        replaced = dict(zip(map(id, flat), _InputsGradReady.apply(self, *flat)))
        return map_tensors(lambda t: replaced.get(id(t), t), (args, kwargs))

    def inputs_grad_ready(self) -> None:
        # still in FORWARD: a call that ran only part of a unit over several modules (its post-forward never
        # came, nor its pre-backward): FSDP2's "partial group backward" (FSDPParamGroup.post_backward)
        partial = len(self.modules) > 1 and self.group.training_state is TrainingState.FORWARD
        self.group.inputs_grad_ready(partial)

    @_dynamo_disable
    def post_forward(self, module, args, out):
        if self.group is not None and self.group.training_state is TrainingState.PRE_BACKWARD:
            return out  # a recomputation inside the unit's backward: keep the parameters it is about to use
        root = self.root
        if len(self.modules) > 1:
            self.to_run_forward.discard(id(module))
            if self._records_post_forward():
                self.ran_forward.add(id(module))
            if self.to_run_forward:
                # the unit's other modules still run forward with these parameters, or never do in this
                # call (a chunked loss's head called alone): no post-forward, no pre-backward hook, as in
                # FSDP2 (_register_group_forward_hooks, _fsdp_state.py:585); the root's post-forward completes a
                # unit left so (`_force_complete_incomplete_states`), and a standalone call's backward ends on
                # its inputs' gradients (FSDPParamGroup.inputs_grad_ready)
                return self.mp.cast_output(out)
        self._register_pre_backward_hook(out)
        if self.is_root:
            in_forward(False)
        if self.group is not None:
            follows = self._backward_follows(out)
            self.group.post_forward(root.post_forward_order if follows and self._records_post_forward() else None,
                                    follows)
        if self.is_root:
            out = self._force_complete_incomplete_states(out)
            self.forward_running = False
        return self.mp.cast_output(out)

    @staticmethod
    def _records_post_forward() -> bool:
        """A recomputation inside backward is no post-forward: it is not recorded; nor is a no-grad forward
        (FSDP2 records it too, and an evaluation loop without backward then grows its list forever)."""
        return torch.is_grad_enabled() and not in_backward()

    @staticmethod
    def _backward_follows(out) -> bool:
        """Whether a backward can reach the unit through this forward's output (no: under no_grad, in a
        no-grad method such as `generate()` whose hooks run outside its no_grad, or a frozen unit fed
        inputs that need no gradient). A unit no backward reaches is freed and not recorded: backward's
        prefetch would gather it for nothing (FSDP1 skips it too: `_needs_pre_backward_unshard`)."""
        return torch.is_grad_enabled() and any(t.requires_grad for t in tensors_in(out))

    def _register_pre_backward_hook(self, out) -> None:
        for t in tensors_in(out):
            if t.requires_grad:
                t.register_hook(self._pre_backward)

    def _force_complete_incomplete_states(self, out):
        """The root's forward is over, and a unit over several modules ran only some of them (a model whose
        forward stops before the head: `fully_shard([norm, head])` with only the norm run): end that unit's
        forward now, as FSDP2's root does (_fsdp_state.py:364, `_force_complete_incomplete_states`): reshard
        it, record its post-forward, and hook the root's output so that backward gathers it again. The
        parameters of the modules that did not run get no gradient in that backward, which then ends
        without them (`FSDPParamGroup.params_not_run`). Deepest first, as FSDP2 (`reversed(all_states)`)."""
        record = self._records_post_forward()
        for state in reversed(self.all_states):
            if state is self or not state.to_run_forward:
                continue
            if state.group is not None and record:
                not_run = {id(sub) for m in state.modules if id(m) not in state.ran_forward for sub in m.modules()}
                state.group.params_not_run = {id(p) for p in state.group.params
                                              if all(id(owner) in not_run for owner, _ in p.owners)}
            if state.group is not None:
                follows = self._backward_follows(out)
                state.group.post_forward(self.post_forward_order if record and follows else None, follows)
            state._register_pre_backward_hook(out)
            out = state.mp.cast_output(out)
            state.to_run_forward.clear()
        for state in self.all_states:
            state.ran_forward.clear()
        return out

    # --- backward ----------------------------------------------------------------------------------

    @_dynamo_disable
    def _pre_backward(self, grad):
        root = self.root
        if not root.backward_queued:
            root.backward_queued = True
            queue_after_backward(root._finish_backward)
        if self.group is not None:
            explicit = self.backward_prefetch
            prefetch = None if explicit is None else [s.group for s in explicit if s.group is not None]
            self.group.pre_backward(root.post_forward_order, prefetch)

    @_dynamo_disable
    def _finish_backward(self) -> None:
        """End of backward: reduce what post-backward did not (unused parameters, accumulated gradients),
        wait for every reduction, free every gathered unit."""
        groups = [state.group for state in self.forward_order if state.group is not None]
        for group in groups:
            group.reduce_at_end()
        if self.is_last_backward:
            self.reductions.wait_all()
            self.post_forward_order.clear()  # FSDP2 forgets the step's order after its last backward only
        for group in groups:
            group.finalize_backward(wait=self.is_last_backward)
        for state in self.all_states:  # a standalone call of part of a unit (a chunked loss's head) left it
            state.to_run_forward.clear()
        self.backward_queued = False


def fully_shard(module: nn.Module | list[nn.Module], *, mesh=None, reshard_after_forward: bool | int | None = None,
                shard_placement_fn=None, mp_policy: MixedPrecisionPolicy | None = None,
                ignored_params: set | None = None, impl: str = "builtin",
                sync_module_states: bool = False) -> nn.Module | list[nn.Module]:
    """Shard `module`'s parameters (those not in an already sharded submodule) dim-0-wise over `mesh`.

    Apply it bottom-up: to each block, then to the model. Returns `module` itself, now an `FSDPModule`.
    A list of modules makes one unit of all of them (one AllGather, one ReduceScatter, gathered before the
    first of them runs forward and freed after the last), and returns the list, as in FSDP2.
    `reshard_after_forward`: True frees the gathered parameters after forward (ZeRO-3), False keeps them
    until backward is done (ZeRO-2), an int k keeps a 1/k share, so backward gathers from k ranks only
    (as in FSDP2, k=1 is False, with a warning, and k = the shard group's size is True).
    None (the default, as in FSDP2) is True for every unit but the root, which keeps its parameters:
    backward needs them first. An explicit True on the root frees them too, as FSDP2 does.
    `shard_placement_fn(param)`: `Shard(d)` to split that parameter along dim d instead of 0 (evenly: the
    shard group's size must divide it, as FSDP2 requires), or None for the default `Shard(0)`; its DTensor
    and its state dict entry are then placed `Shard(d)`. FSDP2's argument (its `ShardPlacementResult`, a
    mesh per parameter, is not supported).
    `mp_policy`: `MixedPrecisionPolicy`. `impl`: "builtin" (torch.distributed) or "ring" (fsdp_mini's).
    `ignored_params`: parameters left alone, whole on every rank and never reduced (e.g. norms kept
    replicated; their gradients are the caller's to all-reduce), as FSDP2's argument of the same name.
    A module built on the meta device can be sharded as it is, then materialised and initialised:
    `fully_shard(...)`, `model.to_empty(device=...)`, then `reset_parameters()` (or any init) on the
    DTensor parameters, as in FSDP2.
    Every rank must start from the same values: by default this is checked (a ValueError names the ranks
    and the first differing parameter); `sync_module_states=True` copies rank 0's instead (fsdp_mini's
    addition: FSDP2 expects you to load the same weights everywhere). Meta parameters have no values yet:
    nothing is checked for them.
    Collective over the mesh (every rank calls it in the same order); bad input is a ValueError first.
    """
    return apply_units(module, mesh=mesh, reshard_after_forward=reshard_after_forward,
                       shard_placement_fn=shard_placement_fn, mp_policy=mp_policy, ignored_params=ignored_params,
                       impl=impl, sync_module_states=sync_module_states)


def apply_units(module, *, mesh, reshard_after_forward, shard_placement_fn, mp_policy, ignored_params, impl,
                sync_module_states, replicate: "tuple[str, type] | None" = None):
    """`fully_shard`, or with `replicate` = (its name, its module class) FSDP2's replicate
    (`fsdp_mini._composable.replicate_with_fsdp`): the same units and lifecycle over a replicate-only mesh, each
    parameter a whole `Replicate()` DTensor, gradients averaged by one AllReduce per unit, no AllGather."""
    api = replicate[0] if replicate else "fully_shard"
    require_distributed(api)
    modules = list(module) if isinstance(module, (list, tuple)) else [module]
    if not modules:
        raise ValueError(f"{api} was given an empty list of modules")
    for m in modules:
        if not isinstance(m, nn.Module):
            raise ValueError(f"{api} takes an nn.Module or a list of them, got {type(m).__name__}")
        if isinstance(m, FSDPModule):
            which = "replicate" if type(m).__name__.startswith("Replicate") else "fully_shard"
            raise ValueError(f"{which} was already applied to this {type(m).__name__}: apply {api} once per module, "
                             f"bottom-up (blocks first, then their parent)")
        flat = next((sub for sub in m.modules() if isinstance(sub, GradientSync)), None)
        if flat is not None:
            raise ValueError(f"{api} was given a module wrapped by {type(flat).__name__} (fsdp_mini's flat "
                             f"FSDP or DDP, or replicate): the two designs do not mix; apply fully_shard to the plain "
                             f"model (beside replicate: fully_shard the blocks, replicate their parent)")
        if wrapper_of(m) is not None:
            raise ValueError(f"{api} was given a {type(m).__name__} inside a model wrapped by "
                             f"{wrapper_of(m)} (fsdp_mini's flat design, which holds its parameters in flat "
                             f"shards): the two designs do not mix; apply fully_shard to the plain model")
    mp = mp_policy if mp_policy is not None else MixedPrecisionPolicy()
    if not isinstance(mp, MixedPrecisionPolicy):
        raise ValueError(f"mp_policy must be a MixedPrecisionPolicy, got {type(mp_policy).__name__}")
    C.check_impl(impl)
    mesh = default_mesh() if mesh is None else mesh
    _check_mesh(mesh)
    if replicate:  # a replicate-only mesh: no shard group (no AllGather, no ReduceScatter), the AllReduce
        if mesh.ndim != 1:  # across it (FSDP2's DDPMeshInfo, _fsdp_common.py)
            raise ValueError(f"replicate takes a 1-D DeviceMesh (the ranks to replicate over), got {mesh.ndim} "
                             f"dimensions: pass the mesh's replicate dimension, e.g. mesh['replicate']")
        mesh_info = MeshInfo(None, 1, 0, mesh.get_group(0) if mesh.size() > 1 else None, mesh.size(), mesh)
    else:
        mesh_info = MeshInfo.from_mesh(mesh)
    reshard, post_forward_size = _check_reshard_after_forward(reshard_after_forward, mesh_info.shard_mesh_size)

    ignored = {id(p) for p in (ignored_params or ())}
    if any(not isinstance(p, nn.Parameter) for p in (ignored_params or ())):
        raise ValueError("ignored_params must be a set of the module's nn.Parameter objects")
    params = _managed_params(modules, ignored)
    shard_dims = [_shard_dim(shard_placement_fn, name, p, mesh_info.shard_mesh_size) for name, _, p in params]
    if post_forward_size and any(shard_dims):
        raise ValueError(f"reshard_after_forward={reshard_after_forward} (keep a 1/k share) needs every parameter "
                         f"sharded along dim 0, but shard_placement_fn placed some along another dimension")
    device = get_device()
    description = [(name, tuple(p.shape), str(p.dtype), p.requires_grad, d) for (name, _, p), d in
                   zip(params, shard_dims)]
    kinds = ", ".join(type(m).__name__ for m in modules)
    # Over the mesh's ranks only, one dimension's groups after the other (together: the whole mesh): on a
    # 2-D (dp, tp) world the ranks of another dp group hold other tensor-parallel slices, and may differ.
    mesh_groups = [mesh.get_group(d) for d in range(mesh.ndim)]
    for mesh_group in mesh_groups:
        check_same_everywhere((description, tuple(mesh.mesh.shape), str(reshard_after_forward)),
                              f"module to {api} ({kinds})",
                              " (every rank must apply fully_shard to the same modules, in the same order)",
                              group=mesh_group, device=device)
    buffers = [b for m in modules for b in _own_buffers(m)]
    values = [(name, t) for name, t in [(name, p) for name, _, p in params] + buffers if not t.is_meta]
    for mesh_group in mesh_groups:
        if sync_module_states:
            broadcast_from_rank0([t for _, t in values], group=mesh_group)
        else:
            check_same_values(values, group=mesh_group, device=device, where=f" of the {kinds} passed to {api}")
    label = _label(modules[0])
    group = None
    if params:
        fsdp_params = []
        for (name, owners, p), shard_dim in zip(params, shard_dims):
            fsdp_params.append(FSDPParam(name, owners, p, mesh, mesh_info.shard_mesh_rank, mesh_info.shard_mesh_size,
                                         mp, device, shard_dim, (Replicate(),) if replicate else None))
            ref = weakref.ref(p, lambda r, key=id(p): _MANAGED.pop(key) if _MANAGED.get(key, (None,))[0] is r else None)
            _MANAGED[id(p)] = (ref, label)
        mark_replaced([p for _, _, p in params])  # an optimizer built before this fails at its first step
        pf = post_forward_shards(mesh_info, post_forward_size) if post_forward_size else None
        group = FSDPParamGroup(fsdp_params, label, mesh_info, impl, MemoryTracker(),
                               reshard in (None, True), pf)
        group.auto_reshard_after_forward = reshard_after_forward is None
    state = FSDPState(modules[0], group, mp, modules)
    if group is not None:
        _register_state_dict_hooks(state)
    if group is not None:
        keys = [id(p.sharded_param) for p in group.params]
        ref = weakref.ref(state, lambda r, keys=keys: [_HOLDERS.pop(k) for k in keys if _HOLDERS.get(k) is r])
        _HOLDERS.update(dict.fromkeys(keys, ref))
    _share_gathered_memory(state)
    for m in modules:
        m.__dict__[_STATE_ATTR] = state
        m.register_forward_pre_hook(_skipped_by_dynamo(state.pre_forward), prepend=True, with_kwargs=True)
        m.register_forward_hook(_skipped_by_dynamo(state.post_forward))
        prefix, mixin = (replicate[0].capitalize(), replicate[1]) if replicate else ("FSDP", FSDPModule)
        m.__class__ = _fsdp_class(type(m), prefix, mixin)
    return module


def _fsdp_class(cls: type, prefix: str = "FSDP", mixin: type = FSDPModule) -> type:
    """`FSDP<cls>`, the subclass of `cls` that adds `FSDPModule`'s methods, made once per class: every block of
    a model then has one class, as in FSDP2 (`cls_to_fsdp_cls`, torch/distributed/fsdp/_fully_shard/
    _fully_shard.py:55, filled by `_apply_to_module`, _fsdp_init.py:404). torch.compile guards on a module's
    class: with a new class per block, each block of a compiled model compiled its own graph, and past
    Dynamo's `recompile_limit` (8) the other blocks ran eagerly, with a logged warning only (a 10-block
    TinyLM: 8 graphs, 8 of its 10 blocks compiled; FSDP2: 1 graph, all 10)."""
    if (cls, mixin) not in _FSDP_CLASSES:  # `replicate_with_fsdp` makes Replicate<cls> with ReplicateModule
        _FSDP_CLASSES[cls, mixin] = type(f"{prefix}{cls.__name__}", (mixin, cls), {})
    return _FSDP_CLASSES[cls, mixin]


def _share_gathered_memory(state: "FSDPState") -> None:
    """Bottom-up, the module sharded last is the outermost: its units and every unit below it share one
    tracker of gathered bytes (the root's, once it runs), so `gathered_memory(model)` sees the whole
    model's peak, and two models never share one."""
    below = {id(s): s for m in state.modules for s in map(_state_or_none, m.modules()) if s is not None}
    groups = [s.group for s in [state, *below.values()] if s.group is not None]
    if groups:
        tracker = state.group.gathered_memory if state.group is not None else MemoryTracker()
        for g in groups:
            g.gathered_memory = tracker


def _register_state_dict_hooks(state: "FSDPState") -> None:
    """On every module that holds one of the unit's parameters: before `state_dict()` and
    `load_state_dict()`, reshard (the keys then hold the sharded DTensors, even after a forward that kept
    the unit gathered); after `load_state_dict()`, adopt what it put in place (`assign=True`). FSDP2
    registers the same three hooks."""
    group = state.group

    def to_sharded(*_args, **_kwargs) -> None:
        if group.training_state is TrainingState.IDLE:
            group.reshard()

    by_module: dict[int, tuple[nn.Module, list[FSDPParam]]] = {}
    for p in group.params:
        module = p.owners[0][0]
        by_module.setdefault(id(module), (module, []))[1].append(p)
    def adopt(owned: list[FSDPParam]):
        def hook(_module, _incompatible_keys) -> None:
            for p in owned:
                p.reset_sharded_param()
        return hook

    for module, owned in by_module.values():
        module.register_state_dict_pre_hook(to_sharded)
        module.register_load_state_dict_pre_hook(to_sharded)
        module.register_load_state_dict_post_hook(adopt(owned))


def _params_by_tensor(model: nn.Module) -> dict[int, FSDPParam]:
    """id(sharded parameter) -> its FSDPParam, for every unit in `model`."""
    out = {}
    for m in model.modules():
        if isinstance(m, FSDPModule) and state_of(m).group is not None:
            out.update({id(p.sharded_param): p for p in state_of(m).group.params})
    return out


def _reshard_all(model: nn.Module) -> None:
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()  # the module then shows its sharded parameters, under their names


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The per-parameter design's full state dict: the model's own keys, each parameter gathered whole
    (`FSDPParam.gather_full`, once even when tied), everything on CPU. Collective."""
    _reshard_all(model)
    by_id, gathered, out = _params_by_tensor(model), {}, {}
    for name, t in model.state_dict(keep_vars=True).items():
        p = by_id.get(id(t))
        if p is None:  # a buffer, or a parameter outside every unit (replicated)
            out[name] = t.detach().to("cpu", copy=True)
            continue
        if id(p) not in gathered:
            gathered[id(p)] = p.gather_full()
        out[name] = gathered[id(p)]
    return out


def load_full_state_dict(model: nn.Module, state_dict: dict[str, torch.Tensor]) -> None:
    """Load a full state dict (strict, checked before anything is copied); each rank keeps its rows of
    each parameter (`FSDPParam.load_full`). No communication."""
    _reshard_all(model)
    own = model.state_dict(keep_vars=True)
    check_full_state_dict({name: tuple(t.shape) for name, t in own.items()}, state_dict)
    by_id = _params_by_tensor(model)
    with torch.no_grad():
        for name, t in own.items():
            p = by_id.get(id(t))
            if p is None:
                t.copy_(state_dict[name])
            else:
                p.load_full(state_dict[name])


def register_fsdp_forward_method(module: nn.Module, method_name: str) -> None:
    """Make `module.<method_name>` (e.g. a HuggingFace model's `generate`) gather and free parameters as
    `forward` does, so it can run on a sharded model. A no-op for a module without fully_shard."""
    if not isinstance(module, FSDPModule):
        return
    if not hasattr(module, method_name):
        raise ValueError(f"{type(module).__name__} has no method {method_name!r}")
    method = getattr(module, method_name)
    state = state_of(module)

    @functools.wraps(method)
    def wrapped(*args, **kwargs):
        args, kwargs = state.pre_forward(module, args, kwargs)
        return state.post_forward(module, args, method(*args, **kwargs))

    setattr(module, method_name, wrapped)


# --- checks and bookkeeping -------------------------------------------------------------------------

def _check_mesh(mesh) -> None:
    from torch.distributed.device_mesh import DeviceMesh

    if not isinstance(mesh, DeviceMesh):
        raise ValueError(f"mesh must be a torch.distributed.device_mesh.DeviceMesh, got {type(mesh).__name__}")
    if mesh.ndim not in (1, 2):
        raise ValueError(f"mesh must be 1-D (shard) or 2-D (replicate, shard), got {mesh.ndim} dimensions")
    if dist.get_rank() not in mesh.mesh.flatten().tolist():
        raise ValueError(f"rank {dist.get_rank()} is not in the mesh {mesh.mesh.tolist()}: every rank that calls "
                         f"fully_shard must be in its mesh")
    if mesh.device_type != get_device().type:
        raise ValueError(f"mesh is on {mesh.device_type!r} but this rank computes on {get_device().type!r}")


def _check_reshard_after_forward(value, shard_size: int) -> tuple[bool | None, int | None]:
    """(free after forward: None for FSDP2's default, True or False; k to keep a 1/k share, else None). An
    int is checked to divide the shard group and read as FSDP2 reads it: 1 is 'reshard to one rank',
    i.e. keep everything gathered (False, with a warning, since 1 == True in Python), and the shard
    group's size is True (torch/distributed/fsdp/_fully_shard/_fsdp_init.py, _get_post_forward_mesh_info)."""
    if value is None or isinstance(value, bool):
        return value, None
    if not isinstance(value, int) or value < 1 or shard_size % value:
        raise ValueError(f"reshard_after_forward must be None, True, False or a positive divisor of the shard group "
                         f"size {shard_size}, got {value!r}")
    if value == 1:
        warnings.warn("reshard_after_forward=1 (int) means resharding parameters to world size 1, i.e. keeping "
                      "them gathered as reshard_after_forward=False, instead of reshard_after_forward=True (bool)",
                      stacklevel=3)
        return False, None
    if value == shard_size:
        return True, None
    return False, value


def _shard_dim(shard_placement_fn, name: str, param: nn.Parameter, shard_size: int) -> int:
    """The dimension `shard_placement_fn` shards `param` along (0 without one, or when it returns None),
    checked as FSDP2 checks it: a `Shard`, a dimension of the parameter, and an even split for d > 0."""
    if shard_placement_fn is None:
        return 0
    placement = shard_placement_fn(param)
    if placement is None:
        return 0
    if not isinstance(placement, Shard):
        raise ValueError(f"shard_placement_fn must return a Shard placement or None, got {placement!r} for "
                         f"parameter {name}")
    d = placement.dim + param.ndim if placement.dim < 0 else placement.dim
    if not 0 <= d < param.ndim:
        raise ValueError(f"shard_placement_fn returned Shard({placement.dim}) for parameter {name} of shape "
                         f"{tuple(param.shape)}, which has no such dimension")
    if d > 0 and param.shape[d] % shard_size:
        raise ValueError(f"shard_placement_fn returned Shard({d}) for parameter {name} of shape "
                         f"{tuple(param.shape)}: sharding along a dimension other than 0 must be even, and "
                         f"{param.shape[d]} is not divisible by the shard group size {shard_size}")
    return d


def _label(module: nn.Module) -> str:
    """A unit's label until the root names it by its path at the first forward."""
    return type(module).__name__


def _inner_units(module: nn.Module) -> list[str]:
    """Paths of the submodules that are already units (bottom-up: their parameters are theirs)."""
    return [name for name, m in module.named_modules() if name and isinstance(m, FSDPModule)]


def _own_buffers(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The module's buffers outside submodules that are already units (those were checked there)."""
    inner_units = _inner_units(module)
    return [(name, b) for name, b in module.named_buffers()
            if not any(name.startswith(u + ".") for u in inner_units)]


def _managed_params(modules: list[nn.Module], ignored: set[int] = frozenset()
                    ) -> list[tuple[str, list[tuple[nn.Module, str]], nn.Parameter]]:
    """(first name, every (module, attribute) holding it, tensor) of the parameters this call manages:
    all of the modules', except those inside submodules that are already units and those in `ignored`
    (ids). Errors for a parameter already sharded (top-down order) or shared with another unit."""
    out: dict[int, tuple[str, list, nn.Parameter]] = {}
    for module in modules:
        _collect_params(module, ignored, out)
    return list(out.values())


def _shared_error(fqn: str, module: nn.Module, other_unit: str) -> ValueError:
    """A parameter of `module` (a shared submodule's, or a tied one) already belongs to another unit."""
    return ValueError(f"parameter {fqn} is shared with another unit ({other_unit}, which holds it already) than "
                      f"the {type(module).__name__} given here: a parameter must belong to one fully_shard unit. "
                      f"Apply fully_shard to both modules as one unit (fully_shard([module_a, module_b])) or to a "
                      f"module containing every use (PyTorch's FSDP2 asks the same)")


def _collect_params(module: nn.Module, ignored: set[int], out: dict) -> None:
    inner_units = _inner_units(module)
    for fqn, p in module.named_parameters(remove_duplicate=False):
        owner_path, _, attr = fqn.rpartition(".")
        inside = next((u for u in inner_units if owner_path == u or owner_path.startswith(u + ".")), None)
        if inside is not None:
            continue
        if id(p) in ignored:
            continue
        if isinstance(p, DTensor):
            ref = _HOLDERS.get(id(p))
            holder = ref() if ref is not None else None
            if holder is not None and not any(fp.sharded_param is p for fp in holder.group.params):
                holder = None  # the id of a parameter gone (or replaced by `assign=True` loading)
            if holder is None or any(sub is module for m in holder.modules for sub in m.modules()):
                raise ValueError(f"parameter {fqn} is already sharded: apply fully_shard bottom-up (submodules "
                                 f"first, then their parents), not to a module inside an already sharded one")
            raise _shared_error(fqn, module, holder.group.label)  # bottom-up, but a sibling unit holds it
        ref, unit = _MANAGED.get(id(p), (None, ""))
        if ref is not None and ref() is p:
            raise _shared_error(fqn, module, unit)
        entry = out.setdefault(id(p), (fqn, [], p))
        entry[1].append((module.get_submodule(owner_path), attr))
