"""What a rank's memory holds while the engines run, measured: the tracker of gathered bytes and byte counts.

`MemoryTracker` counts the bytes of unsharded parameters that an FSDP engine really holds at each moment and
their peak (its listeners, `MemoryChange`, let a lesson or a ledger follow every change);
`tensor_bytes` and `optimizer_state_bytes` sum what parameters, gradients and an optimizer really allocated
(a DTensor counts its local shard); `step_memory_stats` is the one dict both designs report.

Counts are bytes; `fsdp_mini.byte_format` prints them (decimal units, as in the ZeRO paper). The paper's
arithmetic itself, the estimate these measurements are set beside, lives in `fsdp_mini.estimates`, which the
engines never import.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch.distributed.tensor import DTensor

__all__ = ["MemoryTracker", "MemoryChange", "ListenerHandle", "tensor_bytes", "optimizer_state_bytes",
           "step_memory_stats"]


@dataclass(frozen=True)
class MemoryChange:
    """One `alloc` or `free` seen by a `MemoryTracker`: `kind` is "alloc" or "free", `label` what was
    allocated (an FSDP flat parameter's label), `current` the tracked bytes right after."""

    kind: str
    label: str
    nbytes: int
    current: int


class MemoryTracker:
    """Live and peak bytes of one kind of buffer, counted where the engine allocates and frees them.

    Tracked, not guessed: FSDP calls `alloc` when it materialises a unit's gathered parameters and
    `free` when it releases them, so `peak` is the largest amount of unsharded parameter memory that
    was ever alive at once on this rank (for FULL_SHARD with prefetch: about two units, not the model).

    `listen(fn)` calls `fn(MemoryChange)` after every alloc and free until the returned handle's
    `remove()`: how a timeline (`fsdp_mini.course.trace`) sees each gather and free as it happens.
    """

    def __init__(self) -> None:
        self.current = 0
        self.peak = 0
        self._listeners: dict[int, Callable[[MemoryChange], None]] = {}
        self._next_id = 0

    def alloc(self, nbytes: int, label: str = "") -> None:
        if nbytes < 0:
            raise ValueError(f"cannot allocate {nbytes} bytes")
        self.current += nbytes
        self.peak = max(self.peak, self.current)
        self._tell("alloc", label, nbytes)

    def free(self, nbytes: int, label: str = "") -> None:
        if nbytes < 0:
            raise ValueError(f"cannot free {nbytes} bytes")
        if nbytes > self.current:
            raise RuntimeError(f"freeing {nbytes} bytes but only {self.current} are tracked")
        self.current -= nbytes
        self._tell("free", label, nbytes)

    def listen(self, fn: Callable[[MemoryChange], None]) -> "ListenerHandle":
        """Call `fn` with each later `MemoryChange`; `handle.remove()` stops it."""
        key, self._next_id = self._next_id, self._next_id + 1
        self._listeners[key] = fn
        return ListenerHandle(lambda: self._listeners.pop(key, None))

    def _tell(self, kind: str, label: str, nbytes: int) -> None:
        if self._listeners:
            change = MemoryChange(kind, label, nbytes, self.current)
            for fn in list(self._listeners.values()):
                fn(change)

    def reset_peak(self) -> None:
        self.peak = self.current

    def __repr__(self) -> str:
        return f"MemoryTracker(current={self.current}, peak={self.peak})"


class ListenerHandle:
    """What `MemoryTracker.listen` returns: `remove()` unsubscribes (idempotent)."""

    def __init__(self, remove: Callable[[], object]):
        self._remove = remove

    def remove(self) -> None:
        self._remove()


def tensor_bytes(tensors) -> int:
    """Bytes this rank holds for the given tensors (None entries are skipped): of a DTensor, its local
    shard, not the global tensor it describes."""
    return sum(_local(t).numel() * _local(t).element_size() for t in tensors if t is not None)


def _local(t):
    return t.to_local() if isinstance(t, DTensor) else t


def optimizer_state_bytes(optimizer) -> int:
    """Bytes of every tensor in a torch optimizer's state (Adam: exp_avg, exp_avg_sq, step)."""
    return tensor_bytes(v for state in optimizer.state.values() for v in state.values()
                        if hasattr(v, "element_size"))


def step_memory_stats(params, optimizer, tracker: MemoryTracker) -> dict[str, int]:
    """This rank's bytes, as both designs report them (`FSDP.memory_stats`, `fully_shard.memory_stats`):
    sharded parameters and their gradients (local shards), optimizer state, and the gathered parameters
    now and at their peak (`tracker`)."""
    params = list(params)
    return {"params": tensor_bytes(params), "grads": tensor_bytes(p.grad for p in params),
            "optimizer": optimizer_state_bytes(optimizer) if optimizer is not None else 0,
            "unsharded_now": tracker.current, "unsharded_peak": tracker.peak}
