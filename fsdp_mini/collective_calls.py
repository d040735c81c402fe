"""A collective call in flight, and who hears of it: the collectives publish, the diagnostics subscribe.

Every collective issued through `fsdp_mini.collectives` (the hand-written ring ops and the wrappers of
torch's builtins), and any other hand-written one (the course's naive AllReduce), is a `CollectiveCall`:
made when it is issued, with what its caller says about it (`scope`: the FSDP unit or bucket; its phase:
"backward" inside autograd's backward, "forward" while an engine says a model's forward runs), counted up
in `sent` while it sends, and `finish`ed when it is complete. Each listener hears of both moments:

    CommLog (fsdp_mini.comm_log)                   a record of every completed call, per active log
    the flight recorder (fsdp_mini.flight_recorder) each rank's last calls, to find where ranks diverged

Each subscribes when its module is imported, so the engines import neither: they label their calls
(`scope`, `in_forward`) and issue them, and a script that never opens a CommLog or launches ranks never
loads the diagnostics (`import fsdp_mini.fsdp` does not). A listener's `issued(call, tensors)` returns
its own note on the call, which its `completed(call, note)` gets back.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Protocol

from fsdp_mini.torch_internals import in_backward

__all__ = ["CollectiveCall", "CallListener", "scope", "in_forward", "subscribe"]

_scope = threading.local()
_forward = [False]  # whether an engine said a model's forward is running (process-wide, as the model is)
_listeners: list["CallListener"] = []


class CallListener(Protocol):
    def issued(self, call: "CollectiveCall", tensors: tuple) -> object: ...

    def completed(self, call: "CollectiveCall", note: object) -> None: ...


def subscribe(listener: CallListener) -> None:
    """Hear of every call issued from now on (once, however often subscribed)."""
    if listener not in _listeners:
        _listeners.append(listener)


@contextmanager
def scope(label: str):
    """Label the collectives issued inside (e.g. an FSDP unit's name); CommLog and the flight recorder
    show it."""
    previous = getattr(_scope, "label", "")
    _scope.label = label
    try:
        yield
    finally:
        _scope.label = previous


def in_forward(running: bool) -> None:
    """The engines say when a model's (root) forward starts and ends, so that the calls in between are
    in phase "forward" (autograd says when a backward runs)."""
    _forward[0] = running


class CollectiveCall:
    """One collective in flight: made when it is issued (its time, the caller's `scope` and phase are
    taken then, and every listener hears of it), counted up in `sent` while it sends, and told to
    `finish()` when it is complete. `group`: the group's global ranks; `tensors`: what it sends or
    receives, shown to the listeners at issue (their shapes and dtype), not kept. `channel`: a point-to-point
    message's tag (0 for collectives): messages of one pair are matched in order within their channel."""

    __slots__ = ("op", "impl", "nbytes", "group_size", "rank", "group", "start", "label", "phase", "sent",
                 "channel", "_notes")

    def __init__(self, op: str, impl: str, nbytes: int, group_size: int, rank: int, sent: int = 0,
                 group: tuple[int, ...] = (), tensors: tuple = (), channel: int = 0):
        self.op, self.impl, self.nbytes, self.group_size, self.rank = op, impl, nbytes, group_size, rank
        self.group, self.sent, self.channel = group, sent, channel
        self.start = time.time()
        self.label = getattr(_scope, "label", "")
        self.phase = "backward" if in_backward() else ("forward" if _forward[0] else "")
        self._notes = [(listener, listener.issued(self, tensors)) for listener in _listeners]

    def finish(self) -> None:
        for listener, note in self._notes:
            listener.completed(self, note)
