"""CommLog: what every collective sent, and when.

FSDP is a schedule of collectives, so the course's main instrument is a log of them. Every collective
issued through `fsdp_mini.collectives` (hand-written ring ops and wrappers of the builtins alike) is a
`fsdp_mini.collective_calls.CollectiveCall`; this module listens to them and, when one completes,
appends a `CommRecord` to each active `CommLog` of its process:

    with CommLog() as log:
        ring_all_reduce(t)
    print(log.table())

`nbytes` is S, the full tensor (all-reduce: the tensor; reduce-scatter: its input; all-gather: its
output). `sent` is what this rank put on the wire: counted send by send for the hand-written ops, and
the ring model for builtins, whose algorithm we cannot see (`fsdp_mini.ring_model.ring_model_sent`,
re-exported here: all-reduce 2(n-1)·ceil(numel/n) elements, reduce-scatter and all-gather (n-1)/n·S).
`scope` (the label of the calls issued inside) lives with the calls and is re-exported here.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from fsdp_mini.collective_calls import CollectiveCall, scope, subscribe
from fsdp_mini.ring_model import ring_model_sent

__all__ = ["CommLog", "CommRecord", "ring_model_sent", "scope"]

_active: list["CommLog"] = []
_lock = threading.Lock()


@dataclass(frozen=True)
class CommRecord:
    op: str  # "all_reduce", "reduce_scatter", "all_gather", or point to point "send" / "recv"
    impl: str  # "ring", "naive" (hand-written) or "builtin" (torch.distributed)
    nbytes: int  # S: the full tensor
    sent: int  # bytes this rank sent
    group_size: int
    rank: int  # global rank of the process that logged it
    start: float  # time.time() at issue
    end: float  # time.time() when it was complete (waited, for async ops)
    label: str = ""  # the caller's `scope(...)` at issue time, e.g. an FSDP unit's name

    @property
    def seconds(self) -> float:
        return self.end - self.start


class _Listener:
    """CommLog's ear on the collectives: a completed call becomes a record in every active log."""

    @staticmethod
    def issued(call: CollectiveCall, tensors: tuple) -> None:
        return None

    @staticmethod
    def completed(call: CollectiveCall, note: None) -> None:
        if not _active:
            return
        rec = CommRecord(call.op, call.impl, call.nbytes, call.sent, call.group_size, call.rank,
                         call.start, time.time(), call.label)
        with _lock:
            for log in _active:
                log.records.append(rec)


subscribe(_Listener)


@dataclass
class CommLog:
    """Context manager collecting `CommRecord`s of this process; nest or reuse freely."""

    records: list[CommRecord] = field(default_factory=list)

    def __enter__(self) -> "CommLog":
        with _lock:
            _active.append(self)
        return self

    def __exit__(self, *exc) -> None:
        with _lock:
            _active.remove(self)

    def summary(self) -> dict[tuple[str, str], dict[str, int]]:
        """Per (op, impl): number of calls, total S bytes, total bytes this rank sent."""
        out: dict[tuple[str, str], dict[str, int]] = {}
        for r in self.records:
            row = out.setdefault((r.op, r.impl), {"calls": 0, "nbytes": 0, "sent": 0})
            row["calls"] += 1
            row["nbytes"] += r.nbytes
            row["sent"] += r.sent
        return out

    @property
    def sent(self) -> int:
        """All bytes this rank sent."""
        return sum(r.sent for r in self.records)

    def table(self) -> str:
        """A plain-text summary, one row per (op, impl), byte counts exact."""
        lines = [f"{'op':<16}{'impl':<9}{'calls':>6}{'S bytes':>14}{'sent bytes':>14}"]
        for (op, impl), row in sorted(self.summary().items()):
            lines.append(f"{op:<16}{impl:<9}{row['calls']:>6}{row['nbytes']:>14,}{row['sent']:>14,}")
        return "\n".join(lines)
