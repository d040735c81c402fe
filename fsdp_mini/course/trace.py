"""Trace: when each FSDP unit computes, so a timeline can show compute next to the collectives.

`CommLog` records the collectives; `Trace` records the other half of a timeline, the compute:

    with CommLog() as log, Trace(model) as trace:
        model(x, y).backward()
    trace.spans   # [Span(rank, label, kind, start, end)], kind "forward" or "backward"
    trace.memory  # [MemoryEvent(rank, label, kind, nbytes, current, time)]: every gather's alloc, every free
    log.records   # the collectives, on the same clock (time.time())

`label` is the unit's name as the engine labels its collectives ("blocks.0", "root"), so a span and
the all-gather that fed it carry the same label. What counts as a unit's compute:

- a wrapped unit (a `Block`): its module's forward; in backward, from the moment the gradient reaches
  its output until the gradients of its parameters (or of its input) are complete;
- the root: the modules that own the root's parameters directly (for the GPT: the embeddings, the final
  LayerNorm and the head), one span per module and pass.

The hooks are placed around FSDP's own: forward starts after FSDP's pre-forward (the all-gather has been
waited for) and ends before its post-forward (the free); backward starts after FSDP's pre-backward and
ends when the last parameter's gradient arrives, before FSDP's ReduceScatter is issued. So a span is the
unit's compute alone, not the communication around it.

`trace.memory` comes from the engine's own `MemoryTracker` (`model.gathered_memory`): the trace listens
to it (`MemoryTracker.listen`) while it is active, so every gather's alloc and every free arrives with the
flat parameter's label, and `model.memory_stats()` is unaffected. Its order, like the order of issue of the collectives
(`issue_order`), is the program's order, hence the same in every run; the times are not. Only this
rank's events are recorded: return them from each rank and put them together in the parent.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn

from fsdp_mini.memory import MemoryChange
from fsdp_mini.nested import tensors_in

__all__ = ["Span", "MemoryEvent", "Trace", "compute_modules", "issue_order", "sequence", "by_unit", "event_name",
           "unit_of_label"]


def unit_of_label(label: str) -> str:
    """The unit label inside a flat-parameter label (`fsdp_mini.fsdp.plan` appends " (frozen)" or " (<dtype>)"
    to the unit's): "blocks.0 (frozen)" -> "blocks.0", so a timeline folds a unit's flat parameters into one row."""
    return label.split(" (", 1)[0]


@dataclass(frozen=True)
class Span:
    """One stretch of compute: `kind` "forward" or "backward" of unit `label` on global rank `rank`,
    from `start` to `end` (time.time(), the clock of `CommRecord`). `module` is the module's path."""

    rank: int
    label: str
    kind: str
    start: float
    end: float
    module: str = ""

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class MemoryEvent:
    """Flat parameter `label` allocated ("alloc", when its gather is issued) or freed ("free") `nbytes`
    of gathered parameters on rank `rank`; `current` is the rank's gathered bytes right after."""

    rank: int
    label: str
    kind: str
    nbytes: int
    current: int
    time: float


def _grad_tensors(obj):
    return [t for t in tensors_in(obj) if t.requires_grad]


def compute_modules(model) -> list[tuple[str, str, nn.Module, list[torch.Tensor]]]:
    """(label, module path, module, its trainable parameter tensors) for every module whose compute a
    `Trace` records: each wrapped unit's module, and the root's modules that own root parameters."""
    out = []
    paths = {id(m): name for name, m in model.module.named_modules()}
    for unit in model.units:
        label = unit.label
        if not unit.is_root:
            leaves = [leaf for h in unit.handles if h.requires_grad for leaf in h.leaves]
            out.append((label, label, unit.module, leaves))  # an inner unit's label is its module's path
            continue
        owned: dict[int, tuple[nn.Module, list[torch.Tensor]]] = {}
        for h in unit.handles:
            for leaf, owners in zip(h.leaves, h.owners):
                for module, _ in owners:
                    entry = owned.setdefault(id(module), (module, []))
                    if h.requires_grad and all(t is not leaf for t in entry[1]):
                        entry[1].append(leaf)
        order = {id(m): i for i, (_, m) in enumerate(model.module.named_modules())}
        for module, leaves in sorted(owned.values(), key=lambda e: order[id(e[0])]):
            out.append((label, paths[id(module)], module, leaves))
    return out


class _Call:
    """One forward call of a traced module, and what its backward has seen so far."""

    __slots__ = ("label", "path", "fwd_start", "fwd_end", "bwd_start", "bwd_ends", "waiting")

    def __init__(self, label, path, leaves):
        self.label, self.path = label, path
        self.fwd_start, self.fwd_end, self.bwd_start = time.time(), None, None
        self.bwd_ends: list[float] = []
        self.waiting = {id(t) for t in leaves}  # parameters whose gradient has not arrived yet


class Trace:
    """Context manager recording this rank's compute spans of every unit of an FSDP `model`."""

    def __init__(self, model):
        self.model = model
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self._calls: list[_Call] = []
        self._handles = []
        self._open: dict[int, _Call] = {}  # module id -> its latest forward call
        self._active = False
        self._listener = None  # our subscription to the engine's MemoryTracker
        self.memory: list[MemoryEvent] = []

    def _memory_event(self, change: MemoryChange) -> None:
        if self._active and change.nbytes:
            self.memory.append(MemoryEvent(self.rank, change.label, change.kind, change.nbytes, change.current,
                                           time.time()))

    # --- hooks -------------------------------------------------------------------------------------

    def _pre_forward(self, label, path, leaves, module, args):
        if self._active:
            call = _Call(label, path, leaves)
            self._calls.append(call)
            self._open[id(module)] = call
            for t in _grad_tensors(args):  # the gradient reaching an input ends this module's backward
                t.register_hook(self._ender(call))

    def _post_forward_first(self, module, args, out):  # runs before FSDP's post-forward (the free)
        call = self._open.get(id(module))
        if self._active and call is not None and call.fwd_end is None:
            call.fwd_end = time.time()

    def _post_forward_last(self, module, args, out):  # runs after it: its pre-backward hook comes first
        call = self._open.get(id(module))
        if self._active and call is not None:
            for t in _grad_tensors(out):
                t.register_hook(self._starter(call))

    def _starter(self, call):
        def hook(grad):
            if self._active and call.bwd_start is None:
                call.bwd_start = time.time()
        return hook

    def _ender(self, call):
        def hook(grad):
            if self._active:
                call.bwd_ends.append(time.time())
        return hook

    def _on_param_grad(self, leaf, modules):
        def hook(grad):  # a tensor hook on a leaf runs before its gradient is accumulated
            if not self._active:
                return
            now = time.time()
            for m in modules:
                call = self._open.get(id(m))
                if call is not None and id(leaf) in call.waiting:
                    call.waiting.discard(id(leaf))
                    if not call.waiting:
                        call.bwd_ends.append(now)
        return hook

    # --- context -----------------------------------------------------------------------------------

    def __enter__(self) -> "Trace":
        users: dict[int, tuple[torch.Tensor, list[nn.Module]]] = {}
        for label, path, module, leaves in compute_modules(self.model):
            self._handles.append(module.register_forward_pre_hook(
                lambda m, a, label=label, path=path, leaves=leaves: self._pre_forward(label, path, leaves, m, a)))
            self._handles.append(module.register_forward_hook(self._post_forward_first, prepend=True))
            self._handles.append(module.register_forward_hook(self._post_forward_last))
            for leaf in leaves:
                users.setdefault(id(leaf), (leaf, []))[1].append(module)
        for leaf, modules in users.values():
            self._handles.append(leaf.register_hook(self._on_param_grad(leaf, modules)))
        self._listener = self.model.gathered_memory.listen(self._memory_event)
        self._active = True
        return self

    def __exit__(self, *exc) -> None:
        self._active = False
        for h in self._handles:
            h.remove()
        self._handles = []
        if self._listener is not None:
            self._listener.remove()
            self._listener = None

    @property
    def spans(self) -> list[Span]:
        """Forward and backward spans, in order of their start."""
        out = []
        for c in self._calls:
            if c.fwd_end is not None:
                out.append(Span(self.rank, c.label, "forward", c.fwd_start, c.fwd_end, c.path))
            if c.bwd_start is not None:
                ends = [t for t in c.bwd_ends if t >= c.bwd_start]
                if ends:
                    out.append(Span(self.rank, c.label, "backward", c.bwd_start, min(ends), c.path))
        return sorted(out, key=lambda s: s.start)


def issue_order(records, rank: int | None = None) -> list[tuple[str, str]]:
    """(op, label) of the collectives in the order they were *issued*. A CommLog appends a record when
    the op is complete (waited for), so the list itself is in order of completion; this sorts by the
    time of issue. `rank`: only that rank's records (default: all, which is one rank's own log)."""
    mine = [r for r in records if rank is None or r.rank == rank]
    return [(r.op, r.label) for r in sorted(mine, key=lambda r: r.start)]


def sequence(records, spans=(), memory=(), rank: int = 0) -> list[tuple[str, str]]:
    """One rank's step as (what, label) in time order: each collective when issued ("all_gather",
    "reduce_scatter", "all_reduce"), each compute span when it starts ("forward", "backward"), each
    free of gathered parameters ("free"). Consecutive spans of one unit and kind (the root's modules)
    are merged into one entry; frozen flat parameters' labels are folded into their unit's."""
    events = [(r.start, r.op, r.label) for r in records if r.rank == rank]
    events += [(s.start, s.kind, s.label) for s in spans if s.rank == rank]
    events += [(m.time, "free", m.label) for m in memory if m.rank == rank and m.kind == "free"]
    out: list[tuple[str, str]] = []
    for _, what, label in sorted(events, key=lambda e: e[0]):
        entry = (what, unit_of_label(label))
        if not out or out[-1] != entry or what not in ("forward", "backward", "free"):
            out.append(entry)
    return out


def by_unit(seq) -> list[tuple[str, list[str]]]:
    """Group a `sequence` into runs of one unit: [("root", ["all_gather", "forward"]), ("blocks.0",
    ["all_gather", "forward", "free"]), ...], a new run whenever the unit changes."""
    out: list[tuple[str, list[str]]] = []
    for what, label in seq:
        if out and out[-1][0] == label:
            out[-1][1].append(what)
        else:
            out.append((label, [what]))
    return out


def event_name(what: str) -> str:
    """A `sequence` event as a lesson prints it: collectives by their op name, compute and "free" in the
    lesson's language ("forward" and "backward" stay Latin in Russian too, as in the Russian lessons' prose and the
    timeline plots' legend: lessons/ru/STYLE.md)."""
    from fsdp_mini.course.language import tr

    names = {"forward": "forward", "backward": "backward",
             "free": tr("free", "освобождение")}
    return names.get(what, what)
