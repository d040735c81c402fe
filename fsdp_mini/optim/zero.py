"""ZeRO stage 1: shard only the optimizer state, between DDP's all-reduce and its optimizer step.

DDP averages gradients with one all-reduce, and a ring all-reduce is a reduce-scatter followed by an
all-gather. ZeRO-1 (Rajbhandari et al., 2020) moves the optimizer step in between the two halves:

    DDP:     all_reduce(grads)   -> every rank steps on all parameters (full optimizer state)
    ZeRO-1:  reduce_scatter(grads, AVG) -> rank r steps on its 1/n shard -> all_gather(params)

The bytes on the wire are the same as DDP's (two halves of one all-reduce), but each rank keeps optimizer
state (Adam's two moments: 2x the parameters) for only 1/n of the parameters. The parameters and the
gradients stay replicated, so the model is an ordinary module, with no wrapping and no communication in
backward; sharding the gradients too is ZeRO-2, sharding the parameters ZeRO-3 (FSDP's FULL_SHARD).

What `p.grad` holds, and so what `torch.nn.utils.clip_grad_norm_` and a logged gradient norm see:

    plain model:     after backward, this rank's OWN gradient (its rows of the batch); the average of the
                     ranks' gradients exists only inside step(), and only this rank's 1/n of it. Clip with
                     `opt.clip_grad_norm_(max_norm)`, which averages first and returns the global norm;
                     torch's clip_grad_norm_ on these gradients would use this rank's norm, so step()
                     refuses gradients that were changed in place after backward and differ between ranks.
    DDP-wrapped:     after backward, the global average (DDP's AllReduce ran in backward), the same on every
                     rank: torch's clip_grad_norm_ is exact, and step() only takes its slice (no second
                     average, no ReduceScatter).

Either way, `backward -> clip -> step` trains exactly like one process on the global batch.

Like `torch.distributed.optim.ZeroRedundancyOptimizer` this is a `torch.optim.Optimizer`: LR schedulers
accept it, `param_groups` are the model's parameters in the groups given (dicts with their own options
work, and `add_param_group`), and the state dict is one process's (`consolidate_state_dict(to)` gathers it
on one rank, `state_dict()` there returns it; `load_state_dict` takes it on every rank, at any world size).
The model must start identical on every rank (seed it, or load the same checkpoint): as with PyTorch's,
nothing is broadcast at construction.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from fsdp_mini.collectives import AVG, IMPLS, all_gather_into_tensor, reduce_scatter_tensor
from fsdp_mini.fsdp.flat_param import FlatLayout, flatten, unflatten_views
from fsdp_mini.grad_norm import clip_sharded_grads_
from fsdp_mini.parallel.data_parallel import fingerprint
from fsdp_mini.memory import optimizer_state_bytes
from fsdp_mini.rank_environment import require_distributed
from fsdp_mini.torch_internals import version_of
from fsdp_mini.weak_hooks import weak_hook

__all__ = ["ZeroRedundancyOptimizer", "FlatShard", "GradientState"]


class GradientState(Enum):
    """Where the gradient that the next step() uses is, between backward and step()."""

    IN_PARAMS = "in p.grad"  # backward's: each rank's own, or averaged already by DDP (step() tells which)
    IN_SHARDS = "in the shards"  # averaged into the shards' .grad already, by clip_grad_norm_


@dataclass
class FlatShard:
    """The trainable parameters of one parameter group and one dtype, flattened into one buffer padded to
    a multiple of n (`layout`), and this rank's slice of that buffer (`shard`, what the inner optimizer
    steps on). One ReduceScatter and one AllGather of the buffer per step."""

    group: int  # index into param_groups
    params: list[torch.Tensor]
    layout: FlatLayout
    shard: nn.Parameter

    @property
    def dtype(self) -> torch.dtype:
        return self.shard.dtype

    @torch.no_grad()
    def copy_from_params(self, rank: int) -> None:
        """Refresh the shard from the parameters' values (its pieces of them): the model, not the shard, is
        where the weights live, so a `model.load_state_dict` between steps is what the next step updates."""
        for piece in self.layout.pieces(rank):
            p = self.params[self.layout.params.index(piece.param)]
            self.shard[piece.shard_offset:piece.shard_offset + piece.numel].copy_(p.reshape(-1)[piece.start:piece.end])


def _unique_tensors(params, where: str) -> list[torch.Tensor]:
    """`params` as a list, each tensor once (tied weights, or a list given twice), in order."""
    if isinstance(params, torch.Tensor):
        raise ValueError(f"{where} must be an iterable of tensors, e.g. model.parameters(), not one tensor")
    params = list(params)
    if not all(isinstance(p, torch.Tensor) for p in params):
        raise ValueError(f"{where} must be tensors, e.g. model.parameters()")
    return list({id(p): p for p in params}.values())


def _param_groups(params) -> list[dict]:
    """Tensors or option dicts, as the list of groups torch.optim.Optimizer takes, each tensor once."""
    if isinstance(params, torch.Tensor):
        raise ValueError("params must be an iterable of tensors, e.g. model.parameters(), not one tensor")
    params = list(params)
    if params and all(isinstance(p, dict) for p in params):
        for g in params:
            if "params" not in g:
                raise ValueError(f"a parameter group needs 'params', got the keys {sorted(g)}")
        return [{**g, "params": _unique_tensors(g["params"], "a group's 'params'")} for g in params]
    if any(isinstance(p, dict) for p in params):
        raise ValueError("params must be all tensors or all parameter-group dicts, not a mix")
    return [{"params": _unique_tensors(params, "params")}]


def _pytorch_options(group, defaults: dict):
    """PyTorch's ZeroRedundancyOptimizer's own keywords, taken out of `defaults` (which go to the inner
    optimizer): `process_group` is `group` under PyTorch's name; its two layouts of the step are refused."""
    if "process_group" in defaults:
        if group is not None:
            raise ValueError("pass the process group once: group= or PyTorch's name for it, process_group=")
        group = defaults.pop("process_group")
    for option, why in [("overlap_with_ddp", "the step runs in step(), after backward"),
                        ("parameters_as_bucket_view", "the shards are flat buffers already, and the parameters "
                                                      "stay the model's own tensors")]:
        if defaults.pop(option, False):
            raise ValueError(f"{option}=True is PyTorch's ZeroRedundancyOptimizer's option, not supported here: {why}")
    return group


def _hyperparameters(group: dict) -> dict:
    return {k: v for k, v in group.items() if k != "params"}


def _copy_hyperparameters(source: list[dict], target: list[dict]) -> None:
    """Copy every option but 'params' group by group: the model-facing groups, which an LR scheduler
    writes, and the inner optimizer's, which step() reads, stay one set of values."""
    for src, dst in zip(source, target, strict=True):
        dst.update(_hyperparameters(src))


class ZeroRedundancyOptimizer(torch.optim.Optimizer):
    """Wrap `optimizer_class` so that this rank holds optimizer state for 1/n of `params` only.

    `params`: tensors or parameter-group dicts, as for any torch optimizer; `**defaults`: the options of
    `optimizer_class` (lr, weight_decay, ...). `group`: the process group (default: all ranks); `impl`:
    "builtin" (torch.distributed) or "ring" (fsdp_mini's ring). Each parameter group's trainable parameters
    are grouped by dtype, and each (group, dtype) is flattened into one buffer padded to a multiple of n
    (`flat_shards`); this rank's slice of it is a flat `nn.Parameter` that the inner optimizer (`optim`,
    one group per parameter group) steps on. `state` is the inner optimizer's: this rank's 1/n.

    See the module doc for what `p.grad` holds and how to clip gradients.
    """

    def __init__(self, params, optimizer_class: type[torch.optim.Optimizer], group=None,
                 impl: str = "builtin", **defaults):
        if impl not in IMPLS:
            raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
        group = _pytorch_options(group, defaults)
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)):
            raise ValueError(f"optimizer_class must be a torch.optim.Optimizer subclass, got {optimizer_class!r}")
        groups = _param_groups(params)
        if not any(p.requires_grad for g in groups for p in g["params"]):
            raise ValueError("no parameters that require grad: nothing to optimize")
        require_distributed("ZeroRedundancyOptimizer")
        self.group, self.impl, self.optimizer_class = group, impl, optimizer_class
        self.world_size, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.flat_shards: list[FlatShard] = []
        self.optim: torch.optim.Optimizer | None = None  # built once Optimizer.__init__ has added the groups
        self._grads = GradientState.IN_PARAMS
        self._after_backward: dict[torch.Tensor, tuple[weakref.ref, int]] = {}  # param -> (its grad, version)
        self._consolidated: dict[str, Any] | None = None
        super().__init__(groups, defaults)  # calls add_param_group for each group
        self.optim = optimizer_class(
            [{**_hyperparameters(g), "params": self._shards_of(i)} for i, g in enumerate(self.param_groups)],
            **defaults)
        _copy_hyperparameters(self.optim.param_groups, self.param_groups)  # the class's defaults (betas, ...)

    def add_param_group(self, param_group: dict) -> None:
        """Add a group of parameters (with its own options) and shard it. Every rank must call it."""
        param_group = {**param_group, "params": _unique_tensors(param_group["params"], "a group's 'params'")}
        super().add_param_group(param_group)
        index = len(self.param_groups) - 1
        self._shard_group(index)
        if self.optim is not None:
            self.optim.add_param_group({**_hyperparameters(self.param_groups[index]),
                                        "params": self._shards_of(index)})
            _copy_hyperparameters(self.optim.param_groups[index:], self.param_groups[index:])

    def _shard_group(self, index: int) -> None:
        """Flatten parameter group `index`'s trainable parameters, one buffer per dtype, and keep this rank's
        slice of each as a new flat parameter: the inner optimizer will see these slices only."""
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for p in self.param_groups[index]["params"]:
            if p.requires_grad:  # a frozen parameter never changes: no shard, no state
                by_dtype.setdefault(p.dtype, []).append(p)
        for dtype, ps in by_dtype.items():
            names = [(f"group{index}.{dtype}.{i}",) for i in range(len(ps))]
            layout = FlatLayout(names, [p.shape for p in ps], self.world_size)
            lo, hi = layout.shard_range(self.rank)
            with torch.no_grad():
                shard = flatten([p.detach() for p in ps], layout)[lo:hi].clone()
            self.flat_shards.append(FlatShard(index, ps, layout, nn.Parameter(shard)))
            for p in ps:  # it only notes p.grad's version, for step(): no communication in backward
                p.register_post_accumulate_grad_hook(weak_hook(self._on_gradient_accumulated))

    def _shards_of(self, index: int) -> list[nn.Parameter]:
        return [fs.shard for fs in self.flat_shards if fs.group == index]

    @property
    def state(self):
        """The inner optimizer's state: keyed by this rank's flat shards, about 1/n of one process's."""
        return self.optim.state if getattr(self, "optim", None) is not None else self._unused_state

    @state.setter
    def state(self, value) -> None:  # torch.optim.Optimizer.__init__ sets one; the inner optimizer's is used
        self._unused_state = value

    # --- the step: ReduceScatter, step the shard, AllGather ------------------------------------------

    @torch.no_grad()
    def step(self, closure=None):
        """Average gradients into this rank's shards, step the shards, gather the updated parameters."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # 1. ReduceScatter: this rank's 1/n of the averaged gradient (unless clip_grad_norm_ did it already)
        if self._grads is GradientState.IN_PARAMS:
            self._shard_gradients()
        # 2. the optimizer step, on this rank's shards only: from the weights as they are now (a
        #    model.load_state_dict since the last step counts), with the options an LR scheduler set
        for fs in self.flat_shards:
            fs.copy_from_params(self.rank)
        _copy_hyperparameters(self.param_groups, self.optim.param_groups)
        self.optim.step()
        # 3. AllGather: every rank's updated slice, copied into the parameters
        for fs in self.flat_shards:
            flat = torch.empty(fs.layout.padded_numel, dtype=fs.dtype, device=fs.shard.device)
            all_gather_into_tensor(flat, fs.shard.detach(), self.group, impl=self.impl)
            for p, view in zip(fs.params, unflatten_views(flat, fs.layout)):
                p.copy_(view)
        self._grads = GradientState.IN_PARAMS
        return loss

    def _shard_gradients(self) -> None:
        """Put this rank's slice of the global-batch gradient into each shard's `.grad`: the first half
        of DDP's AllReduce (ReduceScatter, AVG) of the ranks' own gradients, or, when they are averaged
        already (a DDP-wrapped model), just this rank's slice of them, so they are not averaged twice."""
        flat_grads = [flatten([p.grad for p in fs.params], fs.layout, dtype=fs.dtype, device=fs.shard.device)
                      for fs in self.flat_shards]
        averaged = self._averaged_already(flat_grads)
        for fs, flat_grad in zip(self.flat_shards, flat_grads):
            if averaged:  # DDP's AllReduce averaged them in backward: this rank's slice, no second average
                lo, hi = fs.layout.shard_range(self.rank)
                fs.shard.grad = flat_grad[lo:hi].clone()
            else:  # each rank's own gradient: the ReduceScatter keeps this rank's 1/n of the average
                fs.shard.grad = torch.empty_like(fs.shard)
                reduce_scatter_tensor(fs.shard.grad, flat_grad, AVG, self.group, impl=self.impl)
        self._grads = GradientState.IN_SHARDS

    # --- what p.grad holds: each rank's own gradient, or the average -----------------------------------

    def _on_gradient_accumulated(self, p: torch.Tensor) -> None:
        """Hook: backward has just accumulated `p.grad`. Remember which tensor and which version it is, so
        that step() can tell a gradient changed in place since (clipped, or averaged by DDP) from
        backward's own."""
        self._after_backward[p] = (weakref.ref(p.grad), version_of(p.grad))

    def _changed_since_backward(self, p: torch.Tensor) -> bool:
        seen = self._after_backward.get(p)
        return p.grad is not None and seen is not None and seen[0]() is p.grad and version_of(p.grad) != seen[1]

    def _averaged_already(self, flat_grads: list[torch.Tensor]) -> bool:
        """Whether the gradients are the global average already, the same on every rank (a DDP-wrapped
        model). Only asked when they were changed in place after backward (DDP's AllReduce writes them;
        so does a clip): backward's own gradients are this rank's. One small collective then: every rank's
        fingerprint of its gradient bits. Equal everywhere: averaged. Different: they were changed in place
        while they were each rank's own, e.g. clipped with this rank's norm, and the result would not be one
        process's: refused, on every rank alike."""
        if not any(self._changed_since_backward(p) for fs in self.flat_shards for p in fs.params):
            return False
        mine = torch.stack([fingerprint(g) for g in flat_grads]).flatten().to(flat_grads[0].device)
        everyone = torch.empty(self.world_size * mine.numel(), dtype=mine.dtype, device=mine.device)
        all_gather_into_tensor(everyone, mine, self.group, impl=self.impl)
        if (everyone.view(self.world_size, -1) == mine).all():
            return True
        raise RuntimeError(
            f"rank {dist.get_rank()}: the gradients were changed in place between backward and step() (by "
            "torch.nn.utils.clip_grad_norm_ or clip_grad_value_?) while they differ between ranks. With a plain "
            "model, p.grad holds this rank's own gradient until step() averages it, so a norm or a clip computed "
            "from it is this rank's, not the global batch's, and the step would not be one process's. Clip with "
            "this optimizer's clip_grad_norm_(max_norm) instead (it averages first and returns the global norm), "
            "or wrap the model in DistributedDataParallel, whose p.grad is the average after backward. "
            "(To scale every gradient by a constant, scale the loss instead.)")

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip the gradient of the global batch to `max_norm` and return its norm, as one process's
        `torch.nn.utils.clip_grad_norm_` would (the same signature as FSDP's `clip_grad_norm_`).

        Collective; call it between backward and step(), on every rank. It averages the gradients into the
        shards now (the ReduceScatter that step() would start with, which step() then skips), computes the
        norm from every rank's shard (one all-reduce of a scalar, `fsdp_mini.grad_norm`), and scales the
        shards' gradients. The
        model's `p.grad` are left as they are (a plain model's: this rank's own).
        """
        if self._grads is GradientState.IN_PARAMS:
            self._shard_gradients()
        grads = [fs.shard.grad for fs in self.flat_shards]
        group = self.group if self.group is not None else dist.group.WORLD
        return clip_sharded_grads_(grads, max_norm, norm_type, group, self.impl)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the model's gradients (what backward fills) and the shards' (what step filled)."""
        super().zero_grad(set_to_none)
        for fs in self.flat_shards:
            if fs.shard.grad is not None:
                if set_to_none:
                    fs.shard.grad = None
                else:
                    fs.shard.grad.zero_()
        self._after_backward.clear()
        self._grads = GradientState.IN_PARAMS

    def optimizer_state_bytes(self) -> int:
        """Bytes of this rank's optimizer state tensors: about 1/n of an unsharded optimizer's."""
        return optimizer_state_bytes(self.optim)

    # --- one process's state dict, at any world size ---------------------------------------------------

    def _index_of(self) -> dict[torch.Tensor, int]:
        """Each parameter's index in a state dict: its position across param_groups, as torch numbers them."""
        return {p: i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}

    def consolidate_state_dict(self, to: int = 0) -> None:
        """Gather the whole optimizer state on rank `to` (of `group`), where state_dict() then returns it as
        one process's optimizer would: per-parameter state under each parameter's index. Collective: every
        rank must call it. Each state tensor is AllGathered, so every rank holds a full copy for a moment."""
        if not 0 <= to < self.world_size:
            raise ValueError(f"to={to} is not a rank of a group of {self.world_size}")
        _copy_hyperparameters(self.param_groups, self.optim.param_groups)
        index_of, state = self._index_of(), {}
        for fs in self.flat_shards:
            for key, value in self.optim.state.get(fs.shard, {}).items():
                if torch.is_tensor(value) and value.shape == fs.shard.shape:
                    full = torch.empty(fs.layout.padded_numel, dtype=value.dtype, device=value.device)
                    all_gather_into_tensor(full, value.detach().contiguous(), self.group, impl=self.impl)
                    per_param = [v.clone() for v in unflatten_views(full, fs.layout)]
                else:  # a scalar (Adam's step) or an object: the same on every rank
                    per_param = [value.clone() if torch.is_tensor(value) else value for _ in fs.params]
                for p, v in zip(fs.params, per_param):
                    state.setdefault(index_of[p], {})[key] = v
        if self.rank != to:
            self._consolidated = None
            return
        groups = [{**_hyperparameters(g), "params": [index_of[p] for p in g["params"]]} for g in self.param_groups]
        self._consolidated = {"state": dict(sorted(state.items())), "param_groups": groups}

    def state_dict(self) -> dict[str, Any]:
        """One process's optimizer state dict, on the rank that consolidate_state_dict(to) gathered it on."""
        if self._consolidated is None:
            raise RuntimeError(
                f"rank {self.rank}: optimizer state has not been consolidated on this rank. Call "
                f"consolidate_state_dict(to={self.rank}) on all ranks first, if you meant to save the global state")
        return self._consolidated

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load one process's optimizer state dict (from state_dict() after consolidate_state_dict, at any
        world size, or from an unsharded optimizer over the same parameter groups): every rank keeps its
        slice. No communication."""
        saved_groups = state_dict["param_groups"]
        sizes = [len(g["params"]) for g in saved_groups]
        if sizes != [len(g["params"]) for g in self.param_groups]:
            raise ValueError(f"the state dict's parameter groups hold {sizes} parameters, this optimizer's "
                             f"{[len(g['params']) for g in self.param_groups]}")
        saved_index = {}  # our parameter -> its index in the state dict
        for ours, saved in zip(self.param_groups, saved_groups):
            saved_index.update(zip(ours["params"], saved["params"]))
        saved_state = state_dict["state"]
        inner_state, inner_index = {}, {}
        for fs in self.flat_shards:
            inner_index[fs.shard] = len(inner_index)
            states = [saved_state.get(saved_index[p], saved_state.get(str(saved_index[p]))) or {}
                      for p in fs.params]
            keys = list(dict.fromkeys(k for s in states for k in s))
            lo, hi = fs.layout.shard_range(self.rank)
            shard_state = {}
            for key in keys:
                values = [s.get(key) for s in states]
                if _elementwise(values, fs.params, key):
                    flat = flatten([None if v is None else v.to(fs.dtype) for v in values], fs.layout,
                                   dtype=fs.dtype, device=fs.shard.device)
                    shard_state[key] = flat[lo:hi].clone()
                else:
                    shard_state[key] = next(v for v in values if v is not None)
            if shard_state:
                inner_state[inner_index[fs.shard]] = shard_state
        inner_groups = [{**_hyperparameters(saved), "params": [inner_index[s] for s in self._shards_of(i)]}
                        for i, saved in enumerate(saved_groups)]
        self.optim.load_state_dict({"state": inner_state, "param_groups": inner_groups})
        _copy_hyperparameters(saved_groups, self.param_groups)
        _copy_hyperparameters(self.param_groups, self.optim.param_groups)

    def __repr__(self) -> str:
        shards = ", ".join(f"group {fs.group} {fs.dtype}: {fs.layout}" for fs in self.flat_shards)
        return f"ZeroRedundancyOptimizer({self.optimizer_class.__name__}, impl={self.impl!r}, {shards})"


def _elementwise(values: list, params: list[torch.Tensor], key: str) -> bool:
    """Whether state `key` holds one value per element of its parameter (Adam's exp_avg), not one per
    parameter (Adam's step): shaped like a parameter that is not itself a scalar."""
    pairs = [(v, p) for v, p in zip(values, params) if torch.is_tensor(v)]
    if any(p.dim() > 0 and v.shape == p.shape for v, p in pairs):
        return True
    return bool(pairs) and all(p.dim() == 0 for _, p in pairs) and key != "step"
