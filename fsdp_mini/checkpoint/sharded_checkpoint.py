"""Sharded checkpoints through torch.distributed.checkpoint (DCP): every rank writes only what it holds.

    save_checkpoint("ckpt/step_100", model, optimizer, extra_state={"step": 100})  # collective: every rank
    extra = load_checkpoint("ckpt/step_100", model, optimizer)  # any world size and strategy; {"step": 100}

A full state dict (`fsdp_mini.checkpoint.state_dict`) gathers the whole model onto every rank: simple, but the
model must fit on one rank, and the ranks wait while it is written. A sharded checkpoint writes what
each rank already has, in parallel, with no gather at all. The catch is that a rank's shard is a slice
of a *flat buffer* whose layout depends on the unit plan, the world size and the strategy: written as
such, it would load back only into exactly the same configuration.

So the flat shards are never written as such. Each original parameter is shown to DCP under its own
name and shape (the keys and shapes of the wrapped module's `state_dict()`) as a `BoxedTensor`
(`fsdp_mini.checkpoint.sharded_boxes`): the global tensor is the parameter, and this rank's boxes are the parts of
it that its flat shard holds. A shard holds elements [start, end) of a flattened parameter
(`FlatLayout.pieces`); in the parameter's own shape that range is a few rectangular boxes (a partial
row, whole rows, a partial row: at most 2 * ndim - 1 of them), each a contiguous run of the flat shard,
so each box is a *view* of `h.sharded_param`: saving copies nothing, loading writes straight into the shard. DCP's metadata file records
which box of which parameter lies in which file. Loading describes the *loading* layout the same way,
and DCP reads, for every box this rank needs, the overlapping parts of the saved boxes: a checkpoint
saved at N ranks with strategy S loads at M ranks with strategy S', and even into a plain module
(`dcp.load(module.state_dict(), ...)`), because its tensors have the module's own names and shapes.

Why not DTensor: a DTensor's shards are the even `torch.chunk` pieces of a device mesh, and FSDP's
pieces are arbitrary runs of a flat buffer that cross parameter boundaries. Nor the sharded tensor of
`torch.distributed._shard`, a list of boxes with owners that PyTorch's FSDP (v1) uses for its
SHARDED_STATE_DICT: PyTorch deprecates it. DCP's own metadata is just a list of chunks (offsets, sizes)
per tensor, whoever wrote them, so fsdp_mini hands DCP its boxes through its own planners
(`BoxesSavePlanner`, `BoxesLoadPlanner`, DCP's extension point): each rank describes only its own boxes,
with no communication, and the file is the one FSDP (v1)'s sharded tensors would have written.

Who writes what. With HYBRID_SHARD (and NO_SHARD) every shard exists once per replica group, and every
replica offers its boxes: the layouts are deterministic, so the replicas of a box offer it under the
same (name, offsets), and DCP's save-plan deduplication keeps one of them, giving each box to the rank
with the least to write so far. So each element is written once (DCP's plan validation checks that:
no overlap, full cover), and the writing is spread over all ranks, not over one replica group only.
Buffers and the optimizer's scalar states (Adam's `step`) are replicated plain tensors, deduplicated
the same way. A tied parameter (`head.weight is embed.weight`) is written under each of its names, as
`dcp.save(module.state_dict())` writes it, so that PyTorch's own loaders find every key a plain module's
`state_dict()` has; its optimizer state is written once, under its first name, as PyTorch's
`get_optimizer_state_dict` names it. A load reads a tied parameter through its first name (a checkpoint
that holds it only there, as fsdp_mini wrote it before, loads too). Every rank loads its own pieces.

Optimizer state (a torch optimizer over `model.parameters()`, i.e. over the flat shards): each state
tensor shaped like the shard (Adam's exp_avg, exp_avg_sq; SGD's momentum_buffer) is cut into the same
boxes, under `optim.<parameter name>.<state name>`, so it reshards like the parameter; a scalar state is
stored per original parameter too (every parameter of a flat shard shares its step); `param_groups` is
one pickled object, `optim.param_groups`: each group's hyperparameters, and under 'params' the original
names of its parameters (a flat shard's group: the names of the parameters in it), as PyTorch's
`get_optimizer_state_dict` stores them. A load matches groups by those names, not by position, so an
optimizer built with its groups in another order gets each group's own hyperparameters; a group whose
parameters match no saved group is an error (a checkpoint without names, written before, loads by
position). A fresh optimizer has no state tensors to load into, so `load_checkpoint` first creates them as
torch.distributed.checkpoint.state_dict does: one `step()` on zero gradients with lr 0.

What cannot go wrong silently (`fsdp_mini.checkpoint.integrity`): a save writes into a staging directory
and renames it into place only when it is complete, so a crash leaves the old checkpoint or the new one,
never a mix; every piece written is checksummed, and a load verifies the checksums before it fills any
tensor, so damaged files are an error naming the file and the piece, never wrong weights. Unlike
PyTorch's DCP reader, a load runs no code from the checkpoint: `.metadata` and the pickled items are read
with restricted unpicklers (UnsafeCheckpointError names what was refused). The rest of a
training run's state (the step, the LR scheduler's `state_dict()`, RNG states) travels in `extra_state`,
saved per rank beside the tensors: a resume needs no side file.
"""
from __future__ import annotations

import io
import math
import os
import pickle
from contextlib import contextmanager
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from torch.distributed.tensor import DTensor

from fsdp_mini.checkpoint.integrity import (CheckpointError, CorruptCheckpointError, IncompleteCheckpointError,
                                            UnsafeCheckpointError, WeightsOnlyLoadPlanner, open_checkpoint,
                                            save_atomically, verify_pieces, weights_only_refusal)
from fsdp_mini.flight_recorder import recorded
from fsdp_mini.fsdp._fully_shard.fully_shard import FSDPModule
from fsdp_mini.rank_environment import require_distributed
from fsdp_mini.checkpoint.sharded_boxes import Box, BoxedTensor, BoxesLoadPlanner, BoxesSavePlanner
from fsdp_mini.checkpoint.state_dict import flat_wrappers, own_state, sharding_design
from fsdp_mini.checkpoint.zero_checkpoint import is_replicated, replicated_state_dict, unwrapped

__all__ = ["save_checkpoint", "load_checkpoint", "sharded_state_dict", "CheckpointLoadPlanner", "CheckpointError",
           "CorruptCheckpointError", "IncompleteCheckpointError", "UnsafeCheckpointError"]

OPTIM_PREFIX = "optim."
PARAM_GROUPS_KEY = "optim.param_groups"
EXTRA_STATE_PREFIX = "extra_state/rank"  # + the rank that saved it; a '/' no module's state-dict key contains


# --- geometry: a flat range of a parameter as rectangular boxes --------------------------------------

def _boxes(shape: tuple[int, ...], start: int, end: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Elements [start, end) of a row-major tensor of `shape`, as boxes (offsets, sizes) in flat order.

    Each box fixes its leading indices, spans a range of one dimension and all of the later ones, so it
    is contiguous in memory: the next (volume) elements of the flat range, viewed with `sizes`.
    """
    if start >= end:
        return []
    if len(shape) == 1:
        return [((start,), (end - start,))]
    inner = math.prod(shape[1:])
    first, last = start // inner, (end - 1) // inner

    def within(row, lo, hi):
        return [((row,) + off, (1,) + size) for off, size in _boxes(shape[1:], lo, hi)]

    if first == last:
        return within(first, start - first * inner, end - first * inner)
    out = []
    if start % inner:
        out += within(first, start % inner, inner)
        first += 1
    full_end = end // inner
    if first < full_end:
        out.append(((first,) + (0,) * (len(shape) - 1), (full_end - first,) + tuple(shape[1:])))
    if end % inner:
        out += within(full_end, 0, end % inner)
    return out


def _saved_shape(info) -> tuple[int, ...]:
    """The shape a parameter has in the checkpoint: its own, except that a 0-d one is stored as (1,), so
    that its one element is a box like any other (and as fsdp_mini has always stored it)."""
    return tuple(info.shape) if len(info.shape) else (1,)


class _HandleBoxes:
    """Where each box of each parameter of one flat handle lies in this rank's flat shard.

    `boxes[name]` lists this rank's boxes of that parameter (offsets, sizes, offset in the flat shard); shared
    by the parameters and every optimizer state of the handle, which are all laid out the same way. The
    other ranks' boxes are theirs to describe: DCP's coordinator gathers every rank's plan.
    """

    def __init__(self, h, shard_rank: int, prefix: str = ""):
        self.params = {prefix + info.names[0]: info for info in h.layout.params}
        self.boxes: dict[str, list[Box]] = {name: [] for name in self.params}
        for piece in h.layout.pieces(shard_rank):
            at = piece.shard_offset
            for offsets, sizes in _boxes(_saved_shape(piece.param), piece.start, piece.end):
                self.boxes[prefix + piece.param.names[0]].append(Box(offsets, sizes, at))
                at += math.prod(sizes)

    def boxed(self, flat: torch.Tensor) -> dict[str, BoxedTensor]:
        """One BoxedTensor per parameter whose boxes are views of `flat` (this rank's flat shard, or an
        optimizer state shaped like it); one with no piece here has no boxes (other ranks write it)."""
        return {name: BoxedTensor(flat, self.boxes[name], _saved_shape(info))
                for name, info in self.params.items()
                if info.numel}  # a parameter without elements: there is nothing to place


# --- building the state dict DCP sees ----------------------------------------------------------------

def _design(model) -> str:
    """"replicated" (a plain or DistributedDataParallel model, under ZeRO-1: `fsdp_mini.checkpoint.zero_checkpoint`),
    else `fsdp_mini.checkpoint.state_dict`'s verdict: "per-parameter" (fully_shard on the model or on some of its
    modules only) or "flat" (an FSDP wrapper, or a module that holds FSDP parts); anything else is a ValueError."""
    return "replicated" if is_replicated(model) else sharding_design(model)


def _layout_plans(model) -> list[tuple[Any, _HandleBoxes]]:
    """For each handle of each FSDP part of `model` (the model itself, or the parts a holder has), where this
    rank's boxes live, under the part's key prefix."""
    return [(h, _HandleBoxes(h, wrapper.mesh_info.shard_mesh_rank, prefix))
            for prefix, wrapper in flat_wrappers(model) for h in wrapper.handles]


def _first_names(state: dict[str, Any]) -> dict[int, str]:
    """id -> first name of each tensor in a state dict (a tied tensor is listed under each of its names)."""
    first: dict[int, str] = {}
    for name, t in state.items():
        if torch.is_tensor(t):
            first.setdefault(id(t), name)
    return first


def _plain_optimizer_state(sd: dict[str, Any], finish: list, state: dict, name: str, saving: bool) -> None:
    """The optimizer state of a parameter every rank holds whole (a per-parameter model's unsharded part, a
    holder's own parameters beside its FSDP parts) or a DTensor: tensors go in as they are (DCP writes a
    replicated one once and loads it in place); a scalar and a plain value are put back after the read."""
    for key, value in state.items():
        full_key = f"{OPTIM_PREFIX}{name}.{key}"
        if isinstance(value, DTensor) or (torch.is_tensor(value) and value.numel() > 1):
            sd[full_key] = value
        elif torch.is_tensor(value):
            sd[full_key] = value if saving else torch.empty_like(value)
            if not saving:
                finish.append(lambda v=value, k=full_key: v.copy_(sd[k]))
        else:
            sd[full_key] = value if saving else None
            if not saving:
                finish.append(lambda s=state, key=key, k=full_key: s.__setitem__(key, sd[k]))


def _per_param_state_dict(model, optimizer, saving: bool):
    """The per-parameter design's dict for DCP: its parameters are DTensors already (this rank's rows,
    with the layout over the mesh), so they go in as they are, each under its first name (a tied one's other
    names are added by `sharded_state_dict`, for both designs); optimizer states shaped like a parameter
    are DTensors too. With fully_shard on some modules only, the rest (the root's own parameters, say) are
    plain tensors that every rank holds whole: DCP writes each once and loads it in place on every rank."""
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()
    sd: dict[str, Any] = {}
    name_of: dict[int, str] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) in name_of:
            continue  # tied: loaded through its first name
        name_of[id(t)] = name
        sd[name] = t.detach() if isinstance(t, DTensor) else t
    finish: list[Callable[[], Any]] = []
    if optimizer is None:
        return sd, [], finish
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in name_of:
                raise ValueError("the optimizer holds a tensor that is not one of this model's parameters: build "
                                 "it over model.parameters() after fully_shard")
            _plain_optimizer_state(sd, finish, optimizer.state.get(p, {}), name_of[id(p)], saving)
    sd[PARAM_GROUPS_KEY] = _param_groups(model, optimizer) if saving else None
    return sd, [], finish


def _param_names(model) -> dict[int, list[str]]:
    """The original (first) names behind each tensor an optimizer over `model.parameters()` holds: a
    parameter's own name in the per-parameter design and in a replicated model (plain or DDP, under ZeRO-1),
    the names of the parameters in a flat shard."""
    if _design(model) != "flat":
        return {id(p): [name] for name, p in unwrapped(model).named_parameters()}
    names = {id_: [name] for id_, name in _first_names(own_state(model)).items()}  # a holder's own parameters
    return names | {id(h.sharded_param): [prefix + info.names[0] for info in h.layout.params]
                    for prefix, wrapper in flat_wrappers(model) for h in wrapper.handles}


def _group_names(model, optimizer) -> list[list[str]]:
    """For each of `optimizer`'s param groups, the original names of its parameters."""
    names = _param_names(model)
    return [[n for p in group["params"] for n in names[id(p)]] for group in optimizer.param_groups]


def _param_groups(model, optimizer) -> list[dict[str, Any]]:
    """`optim.param_groups` as saved: each group's hyperparameters, and under 'params' the original names of
    its parameters (as PyTorch's `get_optimizer_state_dict` stores them), by which a load finds it again."""
    return [{**{k: v for k, v in group.items() if k != "params"}, "params": names}
            for group, names in zip(optimizer.param_groups, _group_names(model, optimizer))]


def _aliases(state: dict[str, Any]) -> dict[str, str]:
    """Every further name of a tensor a state dict lists under several names, with its first name."""
    first = _first_names(state)
    return {name: first[id(t)] for name, t in state.items() if torch.is_tensor(t) and first[id(t)] != name}


def _tied_names(model) -> dict[str, str]:
    """Every further name of a tied tensor, with its first name (`{"head.weight": "embed.weight"}`)."""
    if _design(model) != "flat":
        return _aliases(unwrapped(model).state_dict(keep_vars=True))
    return {**_aliases(own_state(model)),  # a holder's own tensors, tied among themselves
            **{prefix + alias: prefix + info.names[0] for prefix, wrapper in flat_wrappers(model)
               for h in wrapper.handles for info in h.layout.params for alias in info.names[1:]}}


def _listed(items: list[str], limit: int = 12) -> str:
    more = f", ... ({len(items) - limit} more)" if len(items) > limit else ""
    return "[" + ", ".join(items[:limit]) + more + "]"


def _matched_param_groups(path, saved: list[dict[str, Any]], names: list[list[str]]) -> list[dict[str, Any]]:
    """For each of this optimizer's param groups (given by its parameters' `names`), the hyperparameters
    of the saved group that holds exactly those parameters; a ValueError if any group has no such match.

    A checkpoint whose groups carry no names (written before they did) is matched by position."""
    if len(saved) != len(names):
        raise ValueError(f"checkpoint {os.fspath(path)} does not match the optimizer: the checkpoint's optimizer "
                         f"has {len(saved)} param groups, this one {len(names)}")
    hyper = [{k: v for k, v in group.items() if k != "params"} for group in saved]
    if not all("params" in group for group in saved):
        return hyper
    by_names: dict[frozenset[str], list[int]] = {}
    for i, group in enumerate(saved):
        by_names.setdefault(frozenset(group["params"]), []).append(i)  # several only for empty groups
    matched, unmatched = [], []
    for i, group in enumerate(names):
        candidates = by_names.get(frozenset(group), [])
        if candidates:
            matched.append(hyper[candidates.pop(0)])
        else:
            unmatched.append(i)
    if unmatched:
        where = {n: i for i, group in enumerate(saved) for n in group["params"]}

        def described(i: int) -> str:
            group = names[i]
            held = sorted({where[n] for n in group if n in where})
            absent = [repr(n) for n in group if n not in where]
            return (f"group {i} holds {_listed([repr(n) for n in group], 6)} ({len(group)} parameters), which the "
                    f"checkpoint has in its groups {held}" + (f" and not at all: {_listed(absent, 6)}" if absent else ""))

        theirs = "; ".join(f"{i}: {_listed([repr(n) for n in group['params']], 6)} ({len(group['params'])})"
                           for i, group in enumerate(saved))
        raise ValueError(f"checkpoint {os.fspath(path)}: this optimizer's param groups do not match the checkpoint's "
                         f"by parameter name: {'; '.join(described(i) for i in unmatched)}. The checkpoint's groups: "
                         f"{theirs}")
    return matched


def _set_param_groups(optimizer, hyperparameters: list[dict[str, Any]]) -> None:
    for group, hyper in zip(optimizer.param_groups, hyperparameters):
        group.update(hyper)


def _state_dict(model, optimizer, saving: bool):
    """The flat dict handed to DCP; for loading also the steps to run just before the read (zero the
    optimizer states that are read piecewise, so their padding stays zero) and just after it (move the
    values that are not views, scalars and objects, into place)."""
    design = _design(model)
    if design == "replicated":  # plain or DDP, with a ZeroRedundancyOptimizer: fsdp_mini.checkpoint.zero_checkpoint
        sd, prepare, finish = replicated_state_dict(model, optimizer, saving, OPTIM_PREFIX)
        if optimizer is not None:
            sd[PARAM_GROUPS_KEY] = _param_groups(model, optimizer) if saving else None
        return sd, prepare, finish
    require_distributed("a sharded checkpoint")
    if design == "per-parameter":  # fully_shard on the root, or on some of its modules only
        return _per_param_state_dict(model, optimizer, saving)
    plans = _layout_plans(model)
    sd: dict[str, Any] = {}
    prepare: list[Callable[[], Any]] = []
    finish: list[Callable[[], Any]] = []
    for h, boxes in plans:
        sd.update(boxes.boxed(h.sharded_param.detach()))
        for name, info in boxes.params.items():
            if info.numel == 0:  # no boxes: a plain empty tensor keeps the key (and its shape) in the file
                sd[name] = torch.empty(tuple(info.shape), dtype=h.sharded_param.dtype, device=h.sharded_param.device)
    for prefix, wrapper in flat_wrappers(model):
        persistent = set(wrapper.state_dict_keys)
        for name, buf in wrapper.module.named_buffers(remove_duplicate=False):
            if name in persistent:
                sd[prefix + name] = buf  # replicated: DCP writes it once and loads it in place on every rank
    own = own_state(model)  # a holder's own parameters and buffers beside its FSDP parts: replicated, like buffers
    own_names = _first_names(own)
    sd.update({name: t.detach() for name, t in own.items() if torch.is_tensor(t) and own_names[id(t)] == name})
    if optimizer is None:
        return sd, prepare, finish

    by_id = {id(h.sharded_param): (h, boxes) for h, boxes in plans}
    for p in (p for group in optimizer.param_groups for p in group["params"]):
        if id(p) in own_names:
            _plain_optimizer_state(sd, finish, optimizer.state.get(p, {}), own_names[id(p)], saving)
            continue
        if id(p) not in by_id:
            raise ValueError("the optimizer holds a tensor that is not one of this model's parameters or FSDP "
                             "flat shards: build it over model.parameters() after wrapping")
        h, boxes = by_id[id(p)]
        names = list(boxes.params)
        for key, value in optimizer.state.get(p, {}).items():
            if torch.is_tensor(value) and value.shape == p.shape:
                prepare.append(value.zero_)
                sd.update({f"{OPTIM_PREFIX}{n}.{key}": t for n, t in boxes.boxed(value.detach()).items()})
            elif torch.is_tensor(value) and value.numel() == 1:
                # Replicated scalar, one copy per original parameter so that it survives a new unit plan.
                keys = [f"{OPTIM_PREFIX}{n}.{key}" for n in names]
                if saving:
                    sd.update({k: value for k in keys})
                else:
                    sd.update({k: torch.empty_like(value) for k in keys})
                    finish.append(lambda v=value, ks=keys: v.copy_(sd[_first_read(sd, ks)]))
            elif torch.is_tensor(value):
                raise ValueError(f"optimizer state {key!r} of shape {tuple(value.shape)} is neither shaped like "
                                 f"its parameter shard {tuple(p.shape)} nor a scalar: it cannot be resharded")
            else:  # a plain Python value: a pickled object
                keys = [f"{OPTIM_PREFIX}{n}.{key}" for n in names]
                sd.update({k: value if saving else None for k in keys})
                if not saving:
                    finish.append(lambda s=optimizer.state[p], key=key, ks=keys: s.__setitem__(key, sd[_first_read(sd, ks)]))
    sd[PARAM_GROUPS_KEY] = _param_groups(model, optimizer) if saving else None
    return sd, prepare, finish


def _first_read(sd: dict[str, Any], keys: list[str]) -> str:
    """The first of a flat parameter's copies of one scalar state that the load reads (`_drop_saved_fresh`
    may have left out those of parameters the saved optimizer never stepped)."""
    return next(k for k in keys if k in sd)


def sharded_state_dict(model, optimizer=None) -> dict[str, Any]:
    """What `save_checkpoint` hands to `dcp.save`: original names and shapes (a tied tensor under each of
    its names), values that are views of this rank's shards (`BoxedTensor`s of the flat design and of ZeRO-1's
    optimizer states, or the per-parameter design's DTensors), replicated buffers and scalars, and
    `optim.param_groups`.

    For your own DCP calls (another storage writer, `dcp.async_save`); save it with
    `fsdp_mini.checkpoint.sharded_boxes.BoxesSavePlanner()`: DCP's default planner, which also writes BoxedTensors and
    keeps the dict flat (it is flat already, and `optim.param_groups` stays one object). No communication.
    """
    sd = _state_dict(model, optimizer, saving=True)[0]
    for alias, first in _tied_names(model).items():  # a tied tensor under each of its names
        sd[alias] = sd[first]
    return sd


# --- save and load -----------------------------------------------------------------------------------

@contextmanager
def _as_runtime_error(doing: str, path):
    """DCP reports a failure on any rank as a CheckpointException on every rank (no hang), but that is a
    BaseException, which `except Exception` in a training loop would not catch: re-raise it as an
    ordinary RuntimeError, with DCP's per-rank tracebacks in the message; or, when a rank found the
    checkpoint itself at fault (an UnsafeCheckpointError), that error, on every rank."""
    try:
        yield
    except CheckpointException as exc:
        ours = [e for _, (e, _) in sorted(exc.failures.items()) if isinstance(e, CheckpointError)]
        if ours:  # what is wrong with the checkpoint itself (an unsafe item), as the first rank that met it said
            raise ours[0] from exc
        raise RuntimeError(f"{doing} the checkpoint {os.fspath(path)} failed: {exc}") from exc


class CheckpointLoadPlanner(BoxesLoadPlanner, WeightsOnlyLoadPlanner):
    """What `load_checkpoint` reads with: BoxedTensors filled in place (`BoxesLoadPlanner`), pickled items
    unpickled with `torch.load(weights_only=True)` (`WeightsOnlyLoadPlanner`); a flat dict, loaded in place
    (flattening would split `optim.param_groups` into one entry per value)."""


def _check_extra_state(extra_state) -> None:
    """Before any collective: the training state must be a dict that torch.save can write."""
    if not isinstance(extra_state, dict):
        raise TypeError(f"extra_state must be a dict (e.g. {{'step': ..., 'scheduler': sched.state_dict()}}), "
                        f"got {type(extra_state).__name__}")
    _check_loadable("extra_state", extra_state)


def _check_loadable(what: str, value) -> None:
    """Before any collective: a pickled item must load back through `torch.load(weights_only=True)`, the only
    way `load_checkpoint` reads one, or the save would write a checkpoint that cannot be loaded."""
    buffer = io.BytesIO()
    try:
        torch.save(value, buffer)
    except Exception as exc:  # noqa: BLE001 - whatever pickling raises, said before any rank writes
        raise TypeError(f"{what} cannot be saved: {type(exc).__name__}: {exc}") from exc
    buffer.seek(0)
    try:
        torch.load(buffer, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise TypeError(f"{what} would not load back: load_checkpoint reads pickled items with "
                        f"torch.load(weights_only=True), so that a checkpoint cannot run code, and it refuses this "
                        f"one ({weights_only_refusal(exc)}). Keep to tensors, numbers, strings and containers, or allow "
                        "the class with torch.serialization.add_safe_globals (in the loading process too)") from exc


def save_checkpoint(path: str | os.PathLike, model, optimizer=None, *, overwrite: bool = False,
                    extra_state: dict[str, Any] | None = None) -> None:
    """Write a sharded checkpoint of `model` (and `optimizer`'s state, and `extra_state`) to the directory `path`.

    Collective: every rank must call it. Each rank writes a file of its pieces (replicated pieces once,
    by one of their replicas) and rank 0 the metadata that says where every piece of every parameter
    is. Nothing is gathered: no rank ever holds more than its shards.

    extra_state: the rest of the training state, a dict of what `torch.load(weights_only=True)` reads back:
    tensors, numbers, strings, containers (the step, the LR scheduler's `state_dict()`,
    `torch.get_rng_state()`, ...). Each rank's is saved, and `load_checkpoint` returns it. Anything else
    (and any optimizer hyperparameter that would not load back) is a TypeError before any collective.

    Nothing is written into `path` itself until the end. The ranks write into `.NAME.saving` beside it;
    each rank checksums (CRC-32) every piece it wrote, and rank 0, once every rank has written, writes
    `manifest.json` (the checksums of the pieces and of the metadata). Then rank 0 commits: it renames
    an old checkpoint at `path` to `.NAME.replaced`, renames `.NAME.saving` to `path`, and deletes the old
    one; every rank returns once this is done. A crash before the first rename leaves the old checkpoint
    (or none) at `path`, untouched; after the second, the new one, complete. Between the two, `path` is
    absent and the old checkpoint whole under `.NAME.replaced`: loading `path` says so, and the next save
    puts the old one back first. Never a mix of the two.
    A checkpoint at `path` is a FileExistsError (before any collective) unless `overwrite`; so is a
    directory holding other files, which replacing it would delete. An empty directory is fine.
    """
    sd = sharded_state_dict(model, optimizer)
    for key, value in sd.items():
        if not (torch.is_tensor(value) or isinstance(value, BoxedTensor)):  # param groups or plain values
            _check_loadable(repr(key), value)
    if extra_state is not None:
        _check_extra_state(extra_state)
        sd[f"{EXTRA_STATE_PREFIX}{dist.get_rank()}"] = extra_state

    def write(writer) -> None:
        with _as_runtime_error("saving", path):
            dcp.save(sd, storage_writer=writer, planner=BoxesSavePlanner())

    with recorded("save_checkpoint"):  # its collectives in one flight-record entry: a rank alone in it is named
        save_atomically(path, write, overwrite=overwrite)


def _check_against_checkpoint(path, metadata, sd: dict[str, Any], tied: set[str], optimizer: bool) -> None:
    """Compare keys and shapes with the checkpoint's metadata before reading anything, so a different
    model (or optimizer) fails with every mismatch named, and the model untouched, rather than with DCP's
    first one. The checkpoint's optimizer keys are unexpected only when an `optimizer` is loaded: then a
    state this optimizer does not have (Adam's moments, loaded into SGD) is an error, not dropped."""
    saved = metadata.state_dict_metadata
    missing = [k for k in sd if k not in saved]
    unexpected = sorted(k for k in saved if k not in sd and k not in tied and not k.startswith(EXTRA_STATE_PREFIX)
                        and (optimizer or not k.startswith(OPTIM_PREFIX)))  # file order varies
    shapes = []
    for key, value in sd.items():
        md = saved.get(key)
        if not (isinstance(md, TensorStorageMetadata) and (torch.is_tensor(value) or isinstance(value, BoxedTensor))):
            continue
        size = tuple(value.size())
        if tuple(md.size) != size:
            shapes.append(f"{key}: {tuple(md.size)} in the checkpoint, {size} here")
    if missing or unexpected or shapes:
        problems = []
        if missing:
            problems.append(f"missing keys {_listed([repr(k) for k in missing])}")
        if unexpected:
            problems.append(f"unexpected keys {_listed([repr(k) for k in unexpected])}")
        if shapes:
            problems.append(f"shape mismatches {_listed(shapes)}")

        def states(keys) -> str:  # the state names of optim.<parameter>.<state>
            return ", ".join(sorted({k.rsplit(".", 1)[1] for k in keys
                                     if k.startswith(OPTIM_PREFIX) and k != PARAM_GROUPS_KEY})) or "none"

        hint = ""
        if PARAM_GROUPS_KEY in missing:
            hint = " (was it saved without the optimizer?)"
        elif any(k.startswith(OPTIM_PREFIX) for k in missing + unexpected):
            hint = f" (the checkpoint's optimizer state is {states(saved)}; this optimizer's: {states(sd)})"
        raise ValueError(f"checkpoint {os.fspath(path)} does not match the model: {', '.join(problems)}{hint}")


def _extra_state_key(metadata) -> str | None:
    """The key of the extra_state this rank gets back: its own when the checkpoint was saved at this
    world size, else rank 0's (per-rank state such as an RNG's cannot follow the ranks to a new world
    size, and the step or a scheduler's state is the same on every rank); None when none was saved."""
    saved = {k for k in metadata.state_dict_metadata if k.startswith(EXTRA_STATE_PREFIX)}
    if not saved:
        return None
    own = f"{EXTRA_STATE_PREFIX}{dist.get_rank()}"
    return own if len(saved) == dist.get_world_size() and own in saved else f"{EXTRA_STATE_PREFIX}0"


def _init_optimizer_state(optimizer) -> list[torch.Tensor]:
    """Create a fresh optimizer's state tensors, so that DCP has something to load into: one step on
    zero gradients with every lr at 0, which leaves the parameters as they are (as
    torch.distributed.checkpoint.state_dict does). Grads and lrs are put back afterwards. A frozen parameter
    gets state too: one frozen after training has its state in the checkpoint (and one without any there is
    left fresh again by `_keep_fresh_where_saved_fresh`). Returns the parameters whose state this created,
    for `_drop_state_on_error` to undo should the load be refused."""
    params = [p for g in optimizer.param_groups for p in g["params"] if p.is_floating_point() or p.is_complex()]
    created = [p for p in params if not optimizer.state.get(p)]
    if not created:
        return []
    grads = [p.grad for p in params]
    lrs = [g["lr"] for g in optimizer.param_groups]
    try:
        for p in params:
            p.grad = torch.zeros_like(p)
        for g in optimizer.param_groups:
            g["lr"] = g["lr"] * 0 if torch.is_tensor(g["lr"]) else 0.0
        optimizer.step()
    finally:
        for g, lr in zip(optimizer.param_groups, lrs):
            g["lr"] = lr
        for p, grad in zip(params, grads):
            p.grad = grad
    return created


def _drop_saved_fresh(sd: dict[str, Any], metadata) -> None:
    """Leave out of the load the optimizer keys of a parameter that has no optimizer state at all in the
    checkpoint (the saved optimizer never stepped it: an unused branch got no gradient), where this model
    keeps its state together with stepped ones: a flat parameter's state is one tensor, so a new unit plan
    can put a never-stepped parameter beside trained ones. Its part keeps what the loading step made (zeros,
    as `prepare` leaves them): a fresh state, as `_keep_fresh_where_saved_fresh` gives a whole parameter."""
    saved = metadata.state_dict_metadata
    if PARAM_GROUPS_KEY not in saved:  # saved without an optimizer: `_check_against_checkpoint` says so
        return
    stepped = _with_saved_state(saved)
    for key in [k for k in sd if k.startswith(OPTIM_PREFIX) and k != PARAM_GROUPS_KEY and k not in saved]:
        if key.rsplit(".", 1)[0] not in stepped:
            del sd[key]


def _with_saved_state(saved) -> set[str]:
    """`optim.<name>` of every parameter the checkpoint holds any optimizer state for (a key
    `optim.<name>.<state>`)."""
    return {k.rsplit(".", 1)[0] for k in saved if k.startswith(OPTIM_PREFIX) and k != PARAM_GROUPS_KEY}


def _keep_fresh_where_saved_fresh(model, optimizer, created: list[torch.Tensor], metadata) -> list[torch.Tensor]:
    """Drop the state `_init_optimizer_state` just created for a parameter that has no optimizer state at all in
    the checkpoint: the saved optimizer had not stepped it yet (a checkpoint written before the first step),
    or kept none for it (SGD without momentum), and a fresh optimizer is what it loads as (PyTorch's
    `set_optimizer_state_dict` keeps the state of its loading step instead: AdamW's step 1 with zero moments;
    tests/differential/known.py). A parameter with any state saved (another optimizer's, say) keeps the created
    state, and a mismatch is named by `_check_against_checkpoint`. Returns the parameters whose state stays."""
    saved, names = metadata.state_dict_metadata, _param_names(model)
    if PARAM_GROUPS_KEY not in saved:  # saved without an optimizer: `_check_against_checkpoint` says so
        return created
    stepped = _with_saved_state(saved)
    kept = []
    for p in created:
        keys = [f"{OPTIM_PREFIX}{n}" for n in names.get(id(p), [])]
        if keys and not any(k in stepped for k in keys):
            del optimizer.state[p]
        else:
            kept.append(p)
    return kept


@contextmanager
def _drop_state_on_error(optimizer, created: list[torch.Tensor]):
    """Checks that fail after `_init_optimizer_state` leave the optimizer as it was: without that state."""
    try:
        yield
    except BaseException:
        for p in created:
            optimizer.state.pop(p, None)
        raise


def _read_objects(opened, keys: list[str]) -> dict[str, Any]:
    """Collective: the checkpoint's pickled items under `keys` (param groups, extra_state, an optimizer's
    plain values), read before any tensor is written, so that they can be checked first, and each through
    `torch.load(weights_only=True)` (WeightsOnlyLoadPlanner): an item that could run code is refused."""
    objects = {key: None for key in keys}
    with _as_runtime_error("loading", opened.path):
        dcp.load(objects, storage_reader=opened.reader(), planner=CheckpointLoadPlanner())
    return objects


def load_checkpoint(path: str | os.PathLike, model, optimizer=None, *, verify: bool = True) -> dict[str, Any]:
    """Fill `model`'s shards (and `optimizer`'s state and hyperparameters) in place from a checkpoint
    written by `save_checkpoint`, at any world size and with any strategy; return its `extra_state`.

    Collective: every rank must call it. Each rank reads only the parts of the saved pieces that overlap
    its own shard. Strict, and checked before any tensor of the model or the optimizer is written: a
    ValueError names every key missing from the checkpoint, every parameter of the checkpoint this model
    lacks, every shape that differs, every optimizer state the checkpoint has and this optimizer does not
    (Adam's moments loaded into SGD) or the reverse, and a param group whose parameters match no saved
    group by name (groups are matched by their parameters' names, not by position). A fresh optimizer is
    left without state then. Optimizer keys in the checkpoint are ignored when `optimizer` is None.

    Verified before any tensor is filled: the manifest, the metadata and every piece this load reads
    are checked against the checksums of the save (each file by one rank). Damage is a
    CorruptCheckpointError naming the file and the piece; a save that never completed (no metadata, or
    `path` missing beside an interrupted save's leftovers) an IncompleteCheckpointError; both leave the
    model and the optimizer as they were. `verify=False` skips the checksums, e.g. to load a checkpoint
    written by plain `dcp.save`, which has no manifest.

    Runs no code from the checkpoint, with or without `verify` (a difference from PyTorch's DCP reader,
    which unpickles with plain pickle): `.metadata` is unpickled allowing only DCP's metadata classes, and
    the pickled items (param groups, extra_state) with `torch.load(weights_only=True)`; anything else is
    an UnsafeCheckpointError naming what was refused, before any tensor is written.

    Returns the `extra_state` this rank saved (at another world size, rank 0's), {} when none was.
    """
    opened = open_checkpoint(path, verify=verify)  # every rank, no collective: a damaged or unsafe one fails here
    model_only = _state_dict(model, None, saving=False)[0]  # (a ValueError if `model` is not sharded)
    tied = set(_tied_names(model))  # read through their first names
    _check_against_checkpoint(path, opened.metadata, model_only, tied, optimizer=False)  # the model first
    with recorded("load_checkpoint", "verify"):  # a flight-record entry, as in save_checkpoint
        verify_pieces(opened, wanted=lambda key: optimizer is not None or not key.startswith(OPTIM_PREFIX))
    created: list[torch.Tensor] = []
    if optimizer is not None:
        _state_dict(model, optimizer, saving=False)  # the optimizer's parameters are the model's, before stepping it
        created = _init_optimizer_state(optimizer)
        created = _keep_fresh_where_saved_fresh(model, optimizer, created, opened.metadata)
    with _drop_state_on_error(optimizer, created):
        sd, prepare, finish = _state_dict(model, optimizer, saving=False)
        if optimizer is not None:
            _drop_saved_fresh(sd, opened.metadata)
        _check_against_checkpoint(path, opened.metadata, sd, tied, optimizer=optimizer is not None)
        extra_key = _extra_state_key(opened.metadata)
        objects = [key for key, value in sd.items() if value is None] + ([] if extra_key is None else [extra_key])
        if objects:
            with recorded("load_checkpoint", "objects"):
                sd.update(_read_objects(opened, objects))
        if optimizer is not None:
            groups = _matched_param_groups(path, sd[PARAM_GROUPS_KEY], _group_names(model, optimizer))
    # Checked: from here on, the model and the optimizer are written.
    for step in prepare:
        step()
    if _design(model) == "flat":
        for _, wrapper in flat_wrappers(model):
            wrapper.reshard()  # the gathered copies would be stale: drop them (as load_full_state_dict does)
    read = set(objects)
    tensors = {key: value for key, value in sd.items() if key not in read}
    with torch.no_grad(), _as_runtime_error("loading", path), recorded("load_checkpoint", "read"):
        dcp.load(tensors, storage_reader=opened.reader(), planner=CheckpointLoadPlanner())
        for step in finish:
            step()
    if optimizer is not None:
        _set_param_groups(optimizer, groups)
    return {} if extra_key is None else sd[extra_key]
