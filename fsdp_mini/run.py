"""Start N ranks, collect their results, fail fast.

`launch(fn, world_size)` is this course's stand-in for `torchrun`: it forks `world_size` processes,
initialises `torch.distributed` in each (gloo on CPU, NCCL with one GPU per rank), runs `fn(*args)` and
returns the results in rank order. Forking (not spawning) is what lets `fn` be a function defined in a
notebook cell: the children inherit it, nothing is pickled on the way in, and start-up takes ~0.1 s
because torch is already imported.

Why so much care about failure: in distributed code the usual failure is not an exception but a hang.
One rank raises, the others wait forever in their next collective. Here the first error (with its rank
and original traceback) is raised in the caller within seconds and every other rank is killed; a
collective that some rank skipped ends in a `LaunchTimeout` after `timeout` seconds that shows where each
stuck rank was waiting. The error's first line names the cause: a rank's own exception ("rank 1 failed:
ValueError: ..."), or a rank that died without a word (killed by a signal, `os._exit`), by its signal or
exit code, before where the ranks' collectives diverged, which follows from it; where ranks only failed
inside collectives (a timeout, a crash in gloo), the divergence comes first. No child outlives `launch`.

Under `torchrun` the same worker runs unchanged: call `fsdp_mini.init()` first and end the script with
`fsdp_mini.finish()` (both in `fsdp_mini.runtime`, which is all a rank needs; this module is the caller's).
A function that ends with `finish()` also works here: the rank's result is then None.

Rendezvous uses a `file://` store in a fresh temporary folder rather than a TCP port: no port can
collide between launches in a row or in parallel, and it avoids a 5 s reverse-DNS stall that TCPStore
showed in a few percent of runs on our machines.
"""
from __future__ import annotations

import contextlib
import datetime
import faulthandler
import gc
import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from multiprocessing import get_context
from multiprocessing.connection import wait
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from fsdp_mini.flight_recorder import (RECORDER, find_divergence, load_run, new_run_id, raised_in_a_collective,
                                       record_path)
from fsdp_mini.runtime import check_backend, die_with_parent, mark_launched
from fsdp_mini.torch_internals import warm_dynamo

__all__ = ["launch", "LaunchError", "LaunchTimeout", "frozen_heap"]
_LOG_TAIL_LINES = 40
_GRACE_S = 1.0  # after a first error: time to collect the others and pick the earliest
_PG_TIMEOUT_MARGIN_S = 30.0
_STACK_WAIT_S = 5.0  # after asking hung ranks for their stacks: the longest wait for the dumps to land


class LaunchError(RuntimeError):
    """A rank failed. `.rank` is the first rank that failed; `.remote_traceback` is its traceback;
    `.verdict` is where the ranks' collectives diverged ("ranks diverged: ...", "" when they agree)."""

    def __init__(self, message: str, rank: int | None = None, remote_traceback: str = "", verdict: str = ""):
        super().__init__(message)
        self.rank = rank
        self.remote_traceback = remote_traceback
        self.verdict = verdict


class LaunchTimeout(LaunchError, TimeoutError):
    """Ranks did not finish within `timeout` seconds: usually ranks that disagree on collectives."""


def _log_path(folder: str, rank: int, name: str) -> str:
    """Where rank `rank`'s captured stream `name` ("stdout" or "stderr") is written."""
    return os.path.join(folder, f"rank{rank}.{name}")


def _redirect_output(folder: str, rank: int) -> None:
    """Send this rank's stdout/stderr (Python and C level alike) to per-rank log files.

    At the file-descriptor level, so that warnings printed by gloo or C++ code land in the same place
    under Jupyter, nbval and a terminal; the parent replays the logs in rank order.
    """
    for fd, name in ((1, "stdout"), (2, "stderr")):
        log = os.open(_log_path(folder, rank, name), os.O_WRONLY | os.O_CREAT, 0o644)
        os.dup2(log, fd)
        os.close(log)


def _child(fn, args, rank, world_size, local_world_size, backend, timeout, folder, run, capture, conn):
    die_with_parent()  # a Ctrl-C'd notebook, a killed test: no rank outlives the caller
    mark_launched()  # `fsdp_mini.finish()` now ends `fn`, not this process
    os.setpgrp()  # own process group: the parent can kill grandchildren (e.g. DataLoader workers)
    if capture:
        _redirect_output(folder, rank)
    # Python-level streams onto fds 1/2: a forked Jupyter kernel's own streams must not be used here.
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    if faulthandler.is_enabled():
        # The caller's fatal-error handler (pytest enables one) writes to a copy of the caller's stderr
        # taken before the fork: a rank that aborts (gloo aborts on mismatched sizes) would print its
        # "Fatal Python error: Aborted" and every thread's stack into the caller's terminal, even when
        # the failure is expected and reported. Onto this rank's stderr instead: with capture, its log,
        # whose last lines are in the LaunchError that names the rank.
        faulthandler.enable(file=sys.stderr, all_threads=True)
    # Dump every thread's Python stack on SIGUSR1: the parent asks before killing a hung rank.
    faulthandler.register(signal.SIGUSR1, file=2, all_threads=True)
    # The collectives this rank issues, mirrored into a file the parent reads if ranks diverge.
    RECORDER.reset()
    RECORDER.attach(record_path(folder, rank), run=run, rank=rank, world=world_size)
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank % local_world_size),
        LOCAL_WORLD_SIZE=str(local_world_size), GROUP_RANK=str(rank // local_world_size),
    )
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # The forked child inherits the parent's thread pool: set it, an env var alone is read too late.
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank % local_world_size)
        dist.init_process_group(
            backend, init_method=f"file://{folder}/store", rank=rank, world_size=world_size,
            # Longer than the caller's deadline, so that a hang is reported by the caller, with stacks.
            timeout=datetime.timedelta(seconds=timeout + _PG_TIMEOUT_MARGIN_S),
        )
        try:
            result = fn(*args)
        except SystemExit as exc:  # `fsdp_mini.finish(code)` or `sys.exit(code)` at the end of `fn`
            if exc.code not in (None, 0):
                raise
            result = None
        try:
            payload = pickle.dumps(("ok", result))
        except Exception as exc:  # noqa: BLE001 - say which rank returned what
            raise TypeError(f"the return value of rank {rank} cannot be pickled: {exc}") from exc
        ok = True
    except SystemExit as exc:  # a non-zero exit code: the rank ended on purpose, and says so
        payload = pickle.dumps(("exit", time.time(), exc.code, traceback.format_exc()))
        ok = False
    except BaseException as exc:  # noqa: BLE001 - everything is reported to the parent
        payload = pickle.dumps(("error", time.time(), f"{type(exc).__name__}: {exc}", traceback.format_exc(),
                                raised_in_a_collective(exc)))
        ok = False
    sys.stdout.flush()
    sys.stderr.flush()
    # Plain pickle bytes, not torch's multiprocessing pickler: its shared-memory tensors can vanish
    # when this process exits right after sending.
    conn.send_bytes(payload)
    conn.close()
    if ok:
        # Stay alive until the parent has every result: a rank that exits early would break the
        # collectives its peers are still in ("Connection closed by peer") and hide the real problem.
        while True:
            time.sleep(3600)
    os._exit(1)  # skip atexit handlers inherited from the parent (pytest, Jupyter)


# ---------------------------------------------------------------------------------------------------
# In the caller


def _warm_lazy_imports() -> None:
    """Import in the parent what every rank would otherwise import lazily after the fork.

    A torch optimizer's first `step()` imports `torch._dynamo`: 1-6 s on a busy 2-core machine, paid
    again by every forked rank of every launch. Imported once here, the ranks inherit it for free.
    """
    try:
        warm_dynamo()
    except Exception:  # an optional speed-up: never a reason to fail a launch
        pass


@contextlib.contextmanager
def frozen_heap():
    """Fork processes inside this block with the caller's objects frozen (`gc.freeze`), as Python's gc
    documentation advises before a fork.

    A forked rank inherits every object of its parent (torch, a Jupyter kernel, a pytest worker: up to a
    million), and each full collection in the rank, `gc.collect()` or Python's own, walked all of them and
    wrote to each one's header, so the kernel also copied every page of the parent's heap into the rank:
    0.3 to 0.8 s a collection here. Frozen, they are skipped; the rank's own objects are collected as before.
    The caller gets its objects back unfrozen when the block ends, so its own collections are unchanged. A
    caller that froze objects itself (a server before it forks workers, say) keeps its state as it was."""
    if gc.get_freeze_count():  # the caller manages freezing: not ours to undo
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _validate(fn, world_size, args, timeout, local_world_size) -> None:
    if not callable(fn):
        raise ValueError(f"fn must be callable, got {type(fn).__name__}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
    if not isinstance(args, (tuple, list)):
        raise ValueError(f"args must be a tuple of positional arguments, got {type(args).__name__}")
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if not isinstance(local_world_size, int) or local_world_size < 1 or world_size % local_world_size:
        raise ValueError(f"local_world_size ({local_world_size!r}) must be >= 1 and divide world_size ({world_size})")


def _tail(folder: str, rank: int, name: str, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        with open(_log_path(folder, rank, name), errors="replace") as f:
            text = f.read()
    except FileNotFoundError:
        return ""
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])


def _replay_logs(folder: str, world_size: int) -> None:
    """Print what each rank wrote, grouped by rank, in rank order: deterministic in a notebook."""
    for name, stream in (("stdout", sys.stdout), ("stderr", sys.stderr)):
        for rank in range(world_size):
            text = _tail(folder, rank, name, lines=10**9)
            if text:
                prefix = f"[rank {rank}] " if world_size > 1 else ""
                stream.write("".join(f"{prefix}{line}\n" for line in text.splitlines()))
        stream.flush()


def _kill(procs) -> None:
    """Kill each rank's whole process group, then reap it."""
    for p in procs:
        if p.pid is not None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    for p in procs:
        p.join(5)


@dataclass(frozen=True)
class _Failure:
    """How one rank failed, as the caller learnt it."""

    at: float  # when (the rank's clock); 0.0 for a rank that died without a word: the likeliest cause
    headline: str  # one sentence that names the rank
    remote_traceback: str = ""
    # raised by a collective, or a crash inside one: said after the divergence verdict. Else (its own
    # exception, killed from outside, exited) the cause, said before it.
    consequence: bool = False


# Signals a process raises on itself when it crashes (gloo aborts on mismatched sizes): usually inside a
# collective that went wrong, so the divergence verdict, when there is one, comes before the signal.
_CRASHES = {signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL}


def _ended_silently(rank: int, exitcode: int | None) -> _Failure:
    """A rank whose process ended without a report: killed by a signal (negative exit code) or exited."""
    if exitcode is not None and exitcode < 0:
        try:
            sig = signal.Signals(-exitcode)
        except ValueError:
            return _Failure(0.0, f"rank {rank} was killed by signal {-exitcode}")
        return _Failure(0.0, f"rank {rank} was killed by signal {-exitcode} ({sig.name})", consequence=sig in _CRASHES)
    return _Failure(0.0, f"rank {rank} exited with code {exitcode} without reporting (os._exit?)")


def _failure_message(failure: _Failure, rank: int, verdict: str, folder: str, capture: bool) -> str:
    """The first line names the cause: the rank's own end when it was killed or exited, or its own
    exception (a ValueError, a shape error), then where the ranks diverged, which follows from it; for an
    error raised by a collective or a crash inside one, usually the divergence's consequence, the verdict
    first."""
    first = [verdict, failure.headline] if failure.consequence else [failure.headline, verdict]
    parts = [line for line in first if line]
    if failure.remote_traceback:
        parts.append(f"--- traceback of rank {rank} ---\n{failure.remote_traceback.rstrip()}")
    if capture:
        for name in ("stdout", "stderr"):
            tail = _tail(folder, rank, name)
            if tail:
                parts.append(f"--- last lines of rank {rank}'s {name} ---\n{tail}")
    return "\n".join(parts)


def launch(
    fn: Callable[..., Any],
    world_size: int,
    args: Sequence[Any] = (),
    backend: str | None = None,
    timeout: float = 120.0,
    local_world_size: int | None = None,
    capture_output: bool = True,
) -> list[Any]:
    """Run `fn(*args)` on `world_size` ranks with `torch.distributed` initialised; results in rank order.

    backend: "gloo" (CPU processes), "nccl" (one GPU per rank) or None: NCCL when CUDA is available.
    timeout: seconds for the whole run; also the process group's timeout, so a collective that some
        rank never joins fails instead of hanging.
    local_world_size: ranks per simulated node (default: all on one node). Sets LOCAL_RANK,
        LOCAL_WORLD_SIZE and GROUP_RANK as torchrun would on several nodes, e.g. for hybrid sharding.
    capture_output: collect each rank's stdout/stderr and print them after the run, grouped by rank
        (what a notebook wants); False lets ranks write straight to the terminal, as under torchrun.

    Raises ValueError for bad arguments before any process starts, `LaunchError` naming the first
    failing rank with its traceback, `LaunchTimeout` when ranks do not finish in time.
    """
    local_world_size = world_size if local_world_size is None else local_world_size
    _validate(fn, world_size, args, timeout, local_world_size)
    backend = check_backend(backend, world_size, local_world_size)
    if backend == "nccl" and torch.cuda.is_initialized():
        raise ValueError("CUDA is already initialised in this process, so ranks cannot be forked from it: "
                         "call launch() before touching the GPU, or run the script under torchrun")

    _warm_lazy_imports()
    ctx = get_context("fork")  # explicit: Python 3.14 changes the default start method
    folder = tempfile.mkdtemp(prefix="fsdp_mini_launch_")
    run = new_run_id()  # every rank's flight record names this launch
    procs, conns = [], []
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        with frozen_heap():
            for rank in range(world_size):
                recv_end, send_end = ctx.Pipe(duplex=False)
                p = ctx.Process(
                    target=_child, name=f"fsdp_mini-rank{rank}", daemon=True,
                    args=(fn, tuple(args), rank, world_size, local_world_size, backend, timeout,
                          folder, run, capture_output, send_end),
                )
                p.start()
                send_end.close()
                procs.append(p)
                conns.append(recv_end)
        results = _collect(procs, conns, timeout, folder, capture_output)
        if capture_output:
            _replay_logs(folder, world_size)
        return results
    finally:
        _kill(procs)
        for c in conns:
            c.close()
        shutil.rmtree(folder, ignore_errors=True)


def _collect(procs, conns, timeout, folder, capture) -> list[Any]:
    """Wait for every rank's report; raise on the first failure or at the deadline."""
    world_size = len(procs)
    results: dict[int, Any] = {}
    errors: dict[int, _Failure] = {}
    pending = {c: r for r, c in enumerate(conns)}
    sentinels = {p.sentinel: r for r, p in enumerate(procs)}
    deadline = time.monotonic() + timeout
    first_error_at = None
    while pending:
        now = time.monotonic()
        until = deadline if first_error_at is None else min(deadline, first_error_at + _GRACE_S)
        if now >= until:
            break
        ready = wait(list(pending) + [s for s, r in sentinels.items() if r in pending.values()], until - now)
        for obj in ready:
            rank = pending.get(obj, sentinels.get(obj))
            conn = conns[rank]
            if conn not in pending or (obj is not conn and conn.poll()):
                continue  # already handled, or its report is waiting on the pipe
            pending.pop(conn)
            try:
                msg = pickle.loads(conn.recv_bytes()) if obj is conn else None
            except EOFError:  # the pipe closed with nothing in it
                msg = None
            if msg is None:
                procs[rank].join(1)
                errors[rank] = _ended_silently(rank, procs[rank].exitcode)
            elif msg[0] == "ok":
                results[rank] = msg[1]
            elif msg[0] == "exit":
                _, at, code, remote_tb = msg
                errors[rank] = _Failure(at, f"rank {rank} exited with code {code} (fsdp_mini.finish or sys.exit)",
                                        remote_tb)
            else:
                _, at, headline, remote_tb, in_collective = msg
                errors[rank] = _Failure(at, f"rank {rank} failed: {headline}", remote_tb, consequence=in_collective)
        if errors and first_error_at is None:
            first_error_at = time.monotonic()
    if errors:
        # The rank that failed first on its own is the cause; the others typically report "Connection closed
        # by peer" (a consequence, even when it came first: a rank that raised takes a moment to report).
        rank = min(errors, key=lambda r: (errors[r].consequence, errors[r].at))
        failure = errors[rank]
        verdict = _divergence(folder, len(procs))
        msg = _failure_message(failure, rank, verdict, folder, capture)
        others = sorted(set(errors) - {rank})
        if others:
            msg += f"\n(ranks {others} failed after it; ranks still running were killed)"
        raise LaunchError(msg, rank=rank, remote_traceback=failure.remote_traceback, verdict=verdict)
    if pending:
        verdict = _divergence(folder, len(procs))
        error = _timeout_error(procs, sorted(pending.values()), sorted(results), timeout, folder, capture)
        if verdict:
            error = LaunchTimeout(f"{verdict}\n{error}", rank=error.rank, verdict=verdict)
        raise error
    return [results[r] for r in range(world_size)]


def _divergence(folder: str, world_size: int) -> str:
    """The first collective where the ranks differ, from the flight records every rank mirrors into
    `folder` (readable even for a rank that aborted or hangs): the first line of a failure's message,
    or its second, under the rank that raised, was killed or exited (`_failure_message`)."""
    try:
        verdict = find_divergence(load_run(folder).records, world=world_size)
    except (OSError, ValueError, KeyError, TypeError):  # no verdict: the rest of the message stands
        return ""
    return f"ranks diverged: {verdict}" if verdict else ""


def _stack_of_fn(dump: str) -> str:
    """Cut a faulthandler dump below `_child`: the frames under it are the launcher's, forked from the
    caller, and say nothing about the hang."""
    out, skipping = [], False
    for line in dump.splitlines():
        if line.lstrip().startswith(("Thread 0x", "Current thread 0x")):
            skipping = False
        elif os.path.basename(__file__) in line and "in _child" in line:
            skipping = True
        if not skipping:
            out.append(line)
    return "\n".join(out)


def _ask_for_stacks(procs, stuck, folder, capture) -> None:
    """Send each stuck rank SIGUSR1 (its faulthandler dumps every thread's stack to its stderr) and, when
    that is a log, wait until each dump has landed: its log grew, then stopped growing. On a loaded machine
    a rank can take a second to be scheduled, and a fixed pause read stacks that were not written yet."""
    def size(rank):
        try:
            return os.path.getsize(_log_path(folder, rank, "stderr"))
        except OSError:
            return 0

    before, signalled = {r: size(r) for r in stuck}, set()
    for r in stuck:
        try:
            os.kill(procs[r].pid, signal.SIGUSR1)
            signalled.add(r)
        except ProcessLookupError:
            pass
    last, deadline = dict(before), time.monotonic() + (_STACK_WAIT_S if capture else 0.3)
    while signalled and time.monotonic() < deadline:
        time.sleep(0.05)
        for r in sorted(signalled):
            now = size(r)
            if before[r] < now == last[r] or not procs[r].is_alive():
                signalled.discard(r)
            last[r] = now


def _timeout_error(procs, stuck, done, timeout, folder, capture) -> LaunchTimeout:
    """Ask each stuck rank for its Python stack (faulthandler), then describe where it waits."""
    _ask_for_stacks(procs, stuck, folder, capture)
    lines = [f"ranks {stuck} did not finish within {timeout:g} s"
             + (f" (ranks {done} returned)" if done else "")
             + ": do all ranks call the same collectives in the same order?"]
    if capture:
        for r in stuck:
            tail = _stack_of_fn(_tail(folder, r, "stderr", lines=60))
            if tail:
                lines.append(f"--- rank {r}, last lines of stderr (its stack) ---\n{tail}")
    return LaunchTimeout("\n".join(lines), rank=stuck[0])
