"""Where a training step's memory peak comes from, by kind, and a budget that fails loudly.

`estimate_memory` answers "do the model states fit?"; a step then runs out of memory anyway, because on
top of the sharded states it holds gathered units (one being computed, one prefetched), unsharded
gradients, and the activations that forward saves for backward. The ledger follows one step as it runs
and keeps, at every change, the bytes of each kind on this rank:

    parameters        the sharded parameters (local shards)
    gradients         the sharded gradients
    optimizer state   what the optimizer allocated (exp_avg, exp_avg_sq, ...)
    gathered          unsharded parameters of the units being computed (and the root, kept gathered)
    prefetch          the unit gathered ahead of time (the newest of two or more gathered blocks)
    activations       tensors autograd saved for backward and has not yet released

so its `peak` says which kind made the peak and in which phase (forward, backward, optimizer step).
With `budget=` it raises `MemoryBudgetExceeded` the moment the total passes the budget, naming the
largest consumer: a configuration that would not fit fails at once with the reason, not with an
allocator's out-of-memory message twenty minutes in.

Counted, not measured from the allocator: bytes of tensors this rank holds for each kind (each storage
once), the same numbers on a CPU or a GPU. Allocator caching and fragmentation come on top.

    with MemoryLedger(model, optimizer) as ledger:
        model(x, y).backward(); optimizer.step(); optimizer.zero_grad()
    print(ledger.table())
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn

from fsdp_mini.fsdp.fully_sharded_data_parallel import FSDP
from fsdp_mini.fsdp._fully_shard.fully_shard import FSDPModule, gathered_memory, state_of
from fsdp_mini.byte_format import format_bytes
from fsdp_mini.memory import MemoryChange, optimizer_state_bytes, tensor_bytes
from fsdp_mini.torch_internals import in_backward

__all__ = ["MemoryLedger", "MemoryBudgetExceeded", "LedgerSnapshot", "KINDS", "PHASES"]

KINDS = ("parameters", "gradients", "optimizer state", "gathered", "prefetch", "activations")
PHASES = ("forward", "backward", "optimizer step")


@dataclass(frozen=True)
class LedgerSnapshot:
    """The bytes of each kind at one moment, and the phase it belongs to."""

    phase: str
    bytes: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.bytes.values())

    def largest(self) -> tuple[str, int]:
        return max(self.bytes.items(), key=lambda kv: kv[1])


class MemoryBudgetExceeded(MemoryError):
    """A step needed more than the ledger's budget; `.snapshot` is the moment it went over."""

    def __init__(self, snapshot: LedgerSnapshot, budget: int):
        kind, nbytes = snapshot.largest()
        super().__init__(
            f"memory budget of {format_bytes(budget)} exceeded in {snapshot.phase}: {format_bytes(snapshot.total)} "
            f"held, the largest part {kind} ({format_bytes(nbytes)}); "
            + ", ".join(f"{k} {format_bytes(v)}" for k, v in snapshot.bytes.items() if v))
        self.snapshot, self.budget = snapshot, budget


class _Saved:
    """What the saved-tensors hook stores instead of a tensor: the tensor, and a note to the ledger when
    autograd drops it (after its backward node ran)."""

    __slots__ = ("tensor", "ledger", "key")

    def __init__(self, tensor: torch.Tensor, ledger: "MemoryLedger", key: int):
        self.tensor, self.ledger, self.key = tensor, ledger, key

    def __del__(self):
        self.ledger._release(self.key)


@dataclass
class _Live:
    """Saved activations alive now: each storage once, with how many saved tensors share it."""

    refs: dict[int, int] = field(default_factory=dict)
    sizes: dict[int, int] = field(default_factory=dict)
    nbytes: int = 0


class MemoryLedger:
    """Follow one or more steps of `model` (an `FSDP` or a `fully_shard` model) and `optimizer`; `peak`
    is the snapshot with the most bytes, `peaks[phase]` the largest per phase."""

    def __init__(self, model: nn.Module, optimizer=None, budget: int | None = None):
        if isinstance(model, FSDP):
            self.tracker = model.gathered_memory
        elif isinstance(model, FSDPModule):
            self.tracker = gathered_memory(model)
        else:
            raise ValueError(f"MemoryLedger follows an FSDP or fully_shard model, got {type(model).__name__}")
        if budget is not None and budget <= 0:
            raise ValueError(f"budget must be a positive number of bytes, got {budget}")
        self.model, self.optimizer, self.budget = model, optimizer, budget
        self._params = [p for p in model.parameters()]
        self._gathered: dict[str, int] = {}  # label -> bytes, in gathering order
        self._gathered_ptrs: set[int] | None = None  # addresses of the gathered buffers; None: to recompute
        self._live = _Live()
        self._in_step = False
        self.peak: LedgerSnapshot | None = None
        self.peaks: dict[str, LedgerSnapshot] = {}

    # --- events ---------------------------------------------------------------------------------------

    def __enter__(self) -> "MemoryLedger":
        self._gathered, self._gathered_ptrs = {}, None  # gathers while not listening went unseen
        self._listener = self.tracker.listen(self._on_gather)
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda saved: saved.tensor)
        self._hooks.__enter__()
        self._step_hooks = []
        if self.optimizer is not None:
            self._step_hooks = [self.optimizer.register_step_pre_hook(lambda *a: self._stepping(True)),
                                self.optimizer.register_step_post_hook(lambda *a: self._stepping(False))]
        self._note()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
        self._listener.remove()
        for h in self._step_hooks:
            h.remove()

    def _on_gather(self, change: MemoryChange) -> None:
        self._gathered_ptrs = None  # a buffer was filled or freed: its address may have changed
        if change.kind == "alloc":
            self._gathered[change.label] = self._gathered.get(change.label, 0) + change.nbytes
        else:
            left = self._gathered.get(change.label, 0) - change.nbytes
            if left > 0:
                self._gathered[change.label] = left
            else:
                self._gathered.pop(change.label, None)
        self._note()

    def _gathered_storages(self) -> set[int]:
        """Addresses of the gathered (unsharded) parameter buffers right now. Asked for every saved tensor,
        so kept until the tracker reports the next gather or free (the only times an address changes)."""
        if self._gathered_ptrs is not None:
            return self._gathered_ptrs
        if isinstance(self.model, FSDP):
            tensors = [h.unsharded for h in self.model.handles]
        else:
            tensors = [p.unsharded for m in self.model.modules() if isinstance(m, FSDPModule)
                       and state_of(m).group is not None for p in state_of(m).group.params if p.unsharded is not None]
        self._gathered_ptrs = {t.untyped_storage().data_ptr() for t in tensors}
        return self._gathered_ptrs

    def _pack(self, t: torch.Tensor):
        key = t.untyped_storage().data_ptr()
        if isinstance(t, nn.Parameter) or (t.is_leaf and t.requires_grad) or key in self._gathered_storages():
            # a gathered parameter, or a view of one (a weight's transpose), saved for backward: a model
            # state, counted under gathered. Its buffer is freed when the unit reshards, so counting it
            # here would also make a later activation at the same address look already counted.
            return _Saved(t, self, -1)
        live = self._live
        if key not in live.refs:
            live.refs[key], live.sizes[key] = 0, t.untyped_storage().nbytes()
            live.nbytes += live.sizes[key]
        live.refs[key] += 1
        self._note()
        return _Saved(t, self, key)

    def _release(self, key: int) -> None:
        live = self._live
        if key == -1 or key not in live.refs:
            return
        live.refs[key] -= 1
        if live.refs[key] == 0:
            live.nbytes -= live.sizes.pop(key)
            del live.refs[key]

    def _stepping(self, running: bool) -> None:
        self._in_step = running
        self._note()

    # --- snapshots ------------------------------------------------------------------------------------

    def snapshot(self) -> LedgerSnapshot:
        """The bytes of each kind now."""
        if self._in_step:
            phase = "optimizer step"
        else:
            phase = "backward" if in_backward() else "forward"
        blocks = [label for label in self._gathered if label != "root"]
        prefetch = self._gathered[blocks[-1]] if len(blocks) >= 2 else 0
        return LedgerSnapshot(phase, {
            "parameters": tensor_bytes(self._params),
            "gradients": tensor_bytes(p.grad for p in self._params),
            "optimizer state": optimizer_state_bytes(self.optimizer) if self.optimizer is not None else 0,
            "gathered": sum(self._gathered.values()) - prefetch,
            "prefetch": prefetch,
            "activations": self._live.nbytes,
        })

    def _note(self) -> None:
        snap = self.snapshot()
        if self.peak is None or snap.total > self.peak.total:
            self.peak = snap
        best = self.peaks.get(snap.phase)
        if best is None or snap.total > best.total:
            self.peaks[snap.phase] = snap
        if self.budget is not None and snap.total > self.budget:
            raise MemoryBudgetExceeded(snap, self.budget)

    def table(self) -> str:
        """Each phase's peak, by kind, in bytes; the step's peak marked."""
        phases = [p for p in PHASES if p in self.peaks]
        lines = [f"{'':<17}" + "".join(f"{p:>16}" for p in phases)]
        for kind in KINDS + ("total",):
            row = [self.peaks[p].total if kind == "total" else self.peaks[p].bytes[kind] for p in phases]
            lines.append(f"{kind:<17}" + "".join(f"{v:>16,}" for v in row))
        lines.append(f"peak: {self.peak.total:,} B in {self.peak.phase}, largest part {self.peak.largest()[0]}")
        return "\n".join(lines)
