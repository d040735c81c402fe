"""`replicate`: DDP as a composable API, PyTorch's `torch.distributed._composable.replicate`, from scratch.

    for block in model.blocks:
        fully_shard(block)          # the blocks: sharded, gathered per unit, gradients reduce-scattered
    replicate(model)                # the rest (embeddings, norms, head): whole on every rank, AllReduce
    opt = torch.optim.AdamW(model.parameters())   # DTensor shards for the blocks, plain tensors elsewhere

Why a function and not a wrapper: `DistributedDataParallel(model)` puts the model inside another module
(`ddp.module`), so its names, its class and its methods are no longer the model's, and it cannot share a
model with `fully_shard`, which changes the model in place. `replicate(module)` also works in place: it
returns the same module, whose class becomes `Replicate<Class>` (PyTorch's older name: `DDP<Class>`),
a subclass that adds `set_requires_gradient_sync` (and DDP's `no_sync()`); the parameters stay the
module's own plain tensors under their own names.

What it reduces, and when: every trainable parameter of the module except those of submodules that
`fully_shard` manages (their gradients are reduce-scattered by their units; a submodule reachable under
two names is skipped under both, so nothing is reduced twice) and those of `ignored_modules`. It collects
them at the first forward, not at the call, as PyTorch does, so `fully_shard` may be applied to the blocks
before or after `replicate(model)`. Then it does what PyTorch's replicate does: it builds a DDP
over a list of those parameters, here fsdp_mini's `DistributedDataParallel` (the one source of the bucket
rule, the hooks and the end-of-backward wait): rank 0's values are broadcast, gradients are averaged in
buckets of `bucket_cap_mb` MiB, each bucket's AllReduce starts during backward as soon as it is full.

PyTorch 2.13 has two replicates, and this is the first (torch/distributed/_composable/replicate.py: it
skips fully_shard'ed subtrees at :42, drops their parameters reached by other paths at :91-92, builds
`DistributedDataParallel(self._param_list)` at :116, offers `set_requires_gradient_sync` at :166). The
second, `_composable/replicate_with_fsdp.py`, is FSDP2's machinery with a replicate-only mesh: its
parameters become `DTensor`s with a `Replicate()` placement and its gradients travel in one AllReduce per
replicated module once backward is done with it, as FSDP2 reduces a unit, not in DDP's buckets
(fsdp/_fully_shard/_fsdp_collectives.py:634, "HSDP or DDP/replicate"). Both train TinyLM beside
`fully_shard` to the same weights as this one (tests/library/test_replicate.py); the class name
`Replicate<Class>` is the second's, the plain parameters and the buckets the first's. fsdp_mini has the
second too, applied per block as PyTorch's is: `fsdp_mini._composable.replicate_with_fsdp.replicate`.

PyTorch's `replicate(module, ignored_modules=None, **kwargs)` passes its keyword arguments on to DDP; the
ones fsdp_mini's DDP has are spelt out here (`device_id`, `bucket_cap_mb`, `process_group`, plus `impl`).
Like PyTorch's DDP over a parameter list, it leaves buffers alone (no broadcast), and
`set_requires_gradient_sync(False)` pauses only these parameters' AllReduce: units of `fully_shard` inside
have their own switch (`FSDPModule.set_requires_gradient_sync`), as in PyTorch.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor

from fsdp_mini import collectives as C
from fsdp_mini.parallel.data_parallel import GradientSync, check_same_everywhere
from fsdp_mini.parallel.ddp import DistributedDataParallel
from fsdp_mini.fsdp._fully_shard.fully_shard import FSDPModule
from fsdp_mini.parallel.grad_buckets import check_bucket_cap_mb
from fsdp_mini.rank_environment import get_device, require_distributed

__all__ = ["replicate", "ReplicateModule", "ReplicateState", "replicated_parameters"]

# The state lives in the module's own __dict__ (as PyTorch's composable APIs keep theirs): a global weak-keyed
# table would hold the module alive through its state, which refers back to it.
_STATE_KEY = "_fsdp_mini_replicate_state"


@dataclass
class ReplicateState:
    """What `replicate` keeps for a module: its arguments, the gradient-sync switch, and (from the first
    forward on) the DDP over the replicated parameters; `ddp is None` means not initialised yet."""

    module: nn.Module
    kind: str  # the module's class name before replicate, for messages
    ignored_modules: tuple[nn.Module, ...]
    bucket_cap_mb: float
    impl: str
    process_group: object
    requires_gradient_sync: bool = True
    names: list[str] = field(default_factory=list)  # the replicated parameters, in registration order
    ddp: DistributedDataParallel | None = None

    @property
    def initialised(self) -> bool:
        return self.ddp is not None

    def lazy_init(self) -> None:
        """The first forward: collect the parameters left outside `fully_shard` units, check that every
        rank replicates the same ones (a tiny AllGather, before any real collective), then let fsdp_mini's
        DDP broadcast rank 0's values and hook them."""
        named = _replicated(self.module, self.ignored_modules)
        what = self.kind
        if not named:
            raise ValueError(f"replicate: {what} has no trainable parameters left outside fully_shard units and "
                             f"ignored_modules at its first forward: there is nothing to all-reduce "
                             f"(fully_shard the blocks, replicate the module that holds the rest)")
        device = get_device()
        off = [name for name, p in named if p.device != device]
        if off:
            raise ValueError(f"replicate: {what}'s parameters {off[:3]} are not on this rank's device {device}: "
                             f"move the model there first")
        check_same_everywhere([(name, tuple(p.shape), str(p.dtype)) for name, p in named],
                              f"set of parameters to replicate ({what})",
                              " (every rank must build the same model and apply fully_shard and replicate to the "
                              "same modules)", group=self.process_group, device=device)
        self.names = [name for name, _ in named]
        # PyTorch's replicate builds its DDP over an nn.ParameterList of these parameters: the same trick.
        self.ddp = DistributedDataParallel(nn.ParameterList([p for _, p in named]), bucket_cap_mb=self.bucket_cap_mb,
                                           impl=self.impl, group=self.process_group)
        self.ddp.requires_gradient_sync = self.requires_gradient_sync

    def set_requires_gradient_sync(self, value: bool) -> None:
        self.requires_gradient_sync = bool(value)
        if self.ddp is not None:
            self.ddp.requires_gradient_sync = self.requires_gradient_sync


class ReplicateModule(GradientSync):
    """The methods a module gains from `replicate` (PyTorch's `set_requires_gradient_sync`; `no_sync()` as
    in DDP). A `GradientSync` like fsdp_mini's DDP and flat FSDP, so `fully_shard` refuses a module that
    contains it: its parameters would be sharded and all-reduced at once."""

    @property
    def requires_gradient_sync(self) -> bool:
        return _state(self).requires_gradient_sync

    @requires_gradient_sync.setter
    def requires_gradient_sync(self, value: bool) -> None:
        _state(self).set_requires_gradient_sync(value)

    def set_requires_gradient_sync(self, requires_gradient_sync: bool) -> None:
        """False: the next backwards accumulate the replicated parameters' gradients locally, without
        communication (gradient accumulation); the first backward with True averages all of it. Units of
        `fully_shard` inside keep their own switch, as in PyTorch."""
        _state(self).set_requires_gradient_sync(requires_gradient_sync)


def _state(module: nn.Module) -> ReplicateState:
    state = vars(module).get(_STATE_KEY)
    if state is None:
        raise ValueError(f"{type(module).__name__} is not managed by replicate")
    return state


def replicated_parameters(module: nn.Module) -> list[str]:
    """The names of the parameters `replicate` all-reduces for `module` ([] before its first forward)."""
    return list(_state(module).names)


def replicate(module: nn.Module, ignored_modules=None, *, device_id: int | torch.device | None = None,
              bucket_cap_mb: float = 25, process_group=None, impl: str = "builtin") -> nn.Module:
    """Replicate `module` over the ranks of `process_group` (default: all), in place: its trainable
    parameters outside `fully_shard` units and `ignored_modules` stay plain tensors on every rank and
    their gradients are averaged with bucketed AllReduces that overlap backward (see the module doc).

    Returns `module` itself, now a `ReplicateModule`. `device_id`: None or this rank's device (an int is a
    CUDA index), as PyTorch's replicate takes it; fsdp_mini picks the device itself (`get_device`).
    `bucket_cap_mb`, `process_group`: DDP's. `impl`: "builtin" or "ring" (fsdp_mini's ring AllReduce).
    The parameters are collected and rank 0's values broadcast at the first forward (PyTorch's replicate
    also initialises then). Bad input is a ValueError here, before any collective.
    """
    require_distributed("replicate")
    if not isinstance(module, nn.Module):
        raise ValueError(f"replicate takes an nn.Module, got {type(module).__name__}")
    what = type(module).__name__
    if isinstance(module, FSDPModule):
        raise ValueError(f"replicate was given a {what} managed by fully_shard: a module is either sharded or "
                         f"replicated; fully_shard the blocks and replicate their parent")
    for path, sub in module.named_modules():
        if isinstance(sub, ReplicateModule):
            where = f"to {path}" if path else "to this module"
            raise ValueError(f"replicate was already applied {where} ({type(sub).__name__}): its parameters would "
                             f"be all-reduced twice. To replicate each block and the root as FSDP2's replicate does "
                             f"(a unit per block, DTensor parameters), use fsdp_mini._composable.replicate_with_fsdp.replicate")
        if isinstance(sub, GradientSync):
            raise ValueError(f"replicate was given a module wrapped by {type(sub).__name__} (fsdp_mini's flat FSDP "
                             f"or DDP), which already synchronises its gradients: apply replicate to the plain model")
    ignored = _check_ignored_modules(module, ignored_modules)
    _check_device_id(device_id)
    check_bucket_cap_mb(bucket_cap_mb)
    C.check_impl(impl)
    if not _replicated(module, ignored):
        raise ValueError(f"replicate was given a {what} with no trainable parameters outside fully_shard units and "
                         f"ignored_modules: there is nothing to all-reduce")
    state = ReplicateState(module, what, ignored, bucket_cap_mb, impl, process_group)
    vars(module)[_STATE_KEY] = state

    def pre_forward(_module, _args) -> None:
        if not state.initialised:
            state.lazy_init()

    module.register_forward_pre_hook(pre_forward)
    cls = type(module)
    module.__class__ = type(f"Replicate{cls.__name__}", (ReplicateModule, cls), {})
    return module


def _replicated(module: nn.Module, ignored_modules: tuple[nn.Module, ...]) -> list[tuple[str, nn.Parameter]]:
    """(name, parameter) of what replicate all-reduces: every trainable parameter once (tied ones under
    their first name), skipping the subtrees of `fully_shard`ed modules and of `ignored_modules`, and any
    parameter of a `fully_shard`ed module reached under another path (as PyTorch's `_collect_params`)."""
    sharded = {id(p) for m in module.modules() if isinstance(m, FSDPModule) for p in m.parameters()}
    skipped = {id(m) for m in ignored_modules}
    out: dict[int, tuple[str, nn.Parameter]] = {}

    def visit(m: nn.Module, prefix: str) -> None:
        if isinstance(m, FSDPModule) or id(m) in skipped:
            return
        for name, p in m.named_parameters(recurse=False):
            if p.requires_grad and id(p) not in sharded and not isinstance(p, DTensor):
                out.setdefault(id(p), (prefix + name, p))
        for name, child in m.named_children():
            visit(child, f"{prefix}{name}.")

    visit(module, "")
    return list(out.values())


def _check_ignored_modules(module: nn.Module, ignored_modules) -> tuple[nn.Module, ...]:
    if ignored_modules is None:
        return ()
    if isinstance(ignored_modules, nn.Module):
        raise ValueError("ignored_modules must be an iterable of modules (e.g. [model.norm]), got a module")
    ignored = tuple(ignored_modules)
    mine = {id(m) for m in module.modules()}
    for m in ignored:
        if not isinstance(m, nn.Module) or id(m) not in mine:
            raise ValueError(f"ignored_modules must hold submodules of the {type(module).__name__} given to replicate, "
                             f"got {type(m).__name__}")
    return ignored


def _check_device_id(device_id) -> None:
    """PyTorch's replicate takes an int or a torch.device; here it must name the rank's own device."""
    if device_id is None:
        return
    if isinstance(device_id, bool) or not isinstance(device_id, (int, torch.device)):
        raise ValueError(f"device_id must be an int or a torch.device, got {type(device_id).__name__}")
    device = get_device()
    wanted = torch.device("cuda", device_id) if isinstance(device_id, int) else device_id
    same = wanted.type == device.type and (wanted.index is None or device.index is None or wanted.index == device.index)
    if not same:
        raise ValueError(f"device_id {device_id} is not this rank's device {device} (rank {dist.get_rank()}): "
                         f"fsdp_mini places each rank itself; pass None or that device")
