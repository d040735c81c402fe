"""Every case of a parametrized distributed test in one launch of the world, each test keeping its asserts.

A test parametrized over N cases that called `launch` per case started the same world N times: fork, gloo
rendezvous, the scenario's first-call costs, and teardown, for what is one world with one setup.
`run_cases(fn, cases, world_size)` runs `fn(case)` for every case, one after the other, in a single launch,
and keeps the per-rank results; each parametrized test then reads its own case and asserts on it as before
(the number of tests and of asserts is unchanged). Identical calls in other tests (a reference run several
tests compare against) reuse the same results instead of launching again: the cases are deterministic
(seeded models, seeded batches), so a second launch could only repeat them.

A case that raises stops the launch (a rank's exception ends `launch` with a `LaunchError` naming the rank);
the error names the case, and every test of the group reports it: ranks that went on to the next case could
otherwise pair their collectives with a peer still inside the failed one.
"""
from __future__ import annotations

from typing import Any, Callable, Hashable, Sequence

from fsdp_mini import launch

__all__ = ["run_cases"]

_DONE: dict[tuple, dict[Hashable, list[Any]] | BaseException] = {}


def _each_case(fn: Callable[..., Any], cases: tuple, star: bool) -> list[Any]:
    """On one rank: fn(case) (fn(*case) with star) for every case, in order; an exception says which case
    raised it."""
    results = []
    for case in cases:
        try:
            results.append(fn(*case) if star else fn(case))
        except BaseException as exc:
            exc.add_note(f"(in case {case!r} of {getattr(fn, '__name__', fn)!r}, run by tests/launch_cases.py)")
            raise
    return results


def run_cases(fn: Callable[..., Any], cases: Sequence[Hashable], world_size: int, *, timeout: float = 150.0,
              local_world_size: int | None = None, star: bool = False) -> dict[Hashable, list[Any]]:
    """{case: [rank 0's fn(case), rank 1's, ...]} from one launch of `world_size` ranks, remembered per
    (fn, cases, world): a later call with the same arguments returns the same results (or raises the same
    error) without launching. star: each case is a tuple of fn's positional arguments, fn(*case).
    `timeout` bounds the whole launch (below pytest's 180 s per test)."""
    cases = tuple(cases)
    key = (fn, cases, world_size, local_world_size, star)
    if key not in _DONE:
        try:
            per_rank = launch(_each_case, world_size, args=(fn, cases, star), timeout=timeout,
                              local_world_size=local_world_size)
            _DONE[key] = {case: [rank[i] for rank in per_rank] for i, case in enumerate(cases)}
        except Exception as exc:  # noqa: BLE001 - remembered: every test of the group reports it
            _DONE[key] = exc
    done = _DONE[key]
    if isinstance(done, BaseException):
        raise done.with_traceback(None)
    return done
