"""Which chunk sits where after each step of a ring collective: the schedule of `collectives`, on paper.

Pure Python, no torch.distributed: the pictures of lesson 2 are drawn from it, and the tests check it
message by message against what `ring_reduce_scatter` and `ring_all_gather` really send.

n ranks stand in a ring (rank r sends to r+1 and receives from r-1, mod n); the tensor is cut into n
chunks. A state says, for every rank and chunk, *whose contributions* the newest value that rank holds
for that chunk contains: `state[rank][chunk]` is a frozenset of ranks.

- Reduce-scatter, n-1 steps: at step s rank r sends its running sum of chunk (r-s-1) mod n to the
  right; the receiver adds its own part. Afterwards rank r holds chunk r summed over all n ranks.
- All-gather, n-1 steps: at step s rank r forwards chunk (r-s) mod n (at first the one it owns) to the
  right; the receiver's copy is replaced. Afterwards every rank holds every finished chunk.
- All-reduce = reduce-scatter, then all-gather: 2(n-1) steps, each moving one chunk per rank.

During an all-reduce's all-gather, a rank still holds the partial sums that reduce-scatter left behind
(in the real code they are scratch buffers); each is overwritten when the finished chunk arrives.
"""
from __future__ import annotations

from typing import NamedTuple

__all__ = ["Message", "RingStep", "initial_state", "reduce_scatter_step", "all_gather_step",
           "ring_reduce_scatter_schedule", "ring_all_gather_schedule", "ring_all_reduce_schedule",
           "format_contributors"]

State = tuple[tuple[frozenset, ...], ...]


class Message(NamedTuple):
    """One chunk sent at one ring step: from `src` to `dst` (= src+1 mod n), carrying the sum of the
    contributions of `ranks`."""

    src: int
    dst: int
    chunk: int
    ranks: frozenset


class RingStep(NamedTuple):
    """One step of a schedule: `phase` is "start", "reduce_scatter" or "all_gather", `step` counts from 0
    within the phase, `messages` are the sends of this step (one per rank), `state` is after them."""

    phase: str
    step: int
    messages: tuple[Message, ...]
    state: State


def _check_n(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n (ring size) must be an integer >= 1, got {n!r}")


def initial_state(n: int) -> State:
    """Before any step: every rank holds its own contribution to every chunk."""
    _check_n(n)
    return tuple(tuple(frozenset({r}) for _ in range(n)) for r in range(n))


def _apply(state: State, messages: list[Message], add: bool) -> State:
    rows = [list(row) for row in state]
    for m in messages:  # every message reads the state from before the step: all sends happen at once
        rows[m.dst][m.chunk] = (m.ranks | state[m.dst][m.chunk]) if add else m.ranks
    return tuple(tuple(row) for row in rows)


def reduce_scatter_step(state: State, step: int) -> tuple[tuple[Message, ...], State]:
    """Reduce-scatter step `step`: rank r sends chunk (r-step-1) mod n, the receiver adds its part."""
    n = len(state)
    msgs = [Message(r, (r + 1) % n, (r - step - 1) % n, state[r][(r - step - 1) % n]) for r in range(n)]
    return tuple(msgs), _apply(state, msgs, add=True)


def all_gather_step(state: State, step: int) -> tuple[tuple[Message, ...], State]:
    """All-gather step `step`: rank r forwards chunk (r-step) mod n, the receiver's copy is replaced."""
    n = len(state)
    msgs = [Message(r, (r + 1) % n, (r - step) % n, state[r][(r - step) % n]) for r in range(n)]
    return tuple(msgs), _apply(state, msgs, add=False)


def ring_reduce_scatter_schedule(n: int) -> list[RingStep]:
    """The start and the n-1 reduce-scatter steps; in the last state rank r owns the full chunk r."""
    state = initial_state(n)
    steps = [RingStep("start", 0, (), state)]
    for s in range(n - 1):
        msgs, state = reduce_scatter_step(state, s)
        steps.append(RingStep("reduce_scatter", s, msgs, state))
    return steps


def ring_all_gather_schedule(n: int, start: State | None = None) -> list[RingStep]:
    """The start and the n-1 all-gather steps. By default rank r starts with only its own chunk r
    (contributions {r}; the other chunks empty), as in a plain all-gather; pass the last state of a
    reduce-scatter to continue an all-reduce."""
    _check_n(n)
    if start is None:
        start = tuple(tuple(frozenset({r}) if c == r else frozenset() for c in range(n)) for r in range(n))
    if len(start) != n or any(len(row) != n for row in start):
        raise ValueError(f"start must be an {n} x {n} state")
    state = tuple(tuple(frozenset(x) for x in row) for row in start)
    steps = [RingStep("start", 0, (), state)]
    for s in range(n - 1):
        msgs, state = all_gather_step(state, s)
        steps.append(RingStep("all_gather", s, msgs, state))
    return steps


def ring_all_reduce_schedule(n: int) -> list[RingStep]:
    """The start, n-1 reduce-scatter steps, then n-1 all-gather steps: 2(n-1) steps in all."""
    rs = ring_reduce_scatter_schedule(n)
    return rs + ring_all_gather_schedule(n, rs[-1].state)[1:]


def format_contributors(ranks, n: int) -> str:
    """"0+1+2" for a partial sum, "Σ" once all n ranks contributed, "" for nothing."""
    ranks = sorted(ranks)
    if n > 1 and len(ranks) == n:
        return "Σ"
    return "+".join(str(r) for r in ranks)
