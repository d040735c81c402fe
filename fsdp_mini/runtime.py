"""Inside one rank: start torch.distributed, pick the device, end cleanly.

Everything a training script calls in its own process, whoever started it (`fsdp_mini.launch` from a
notebook, `torchrun` from a shell, or a plain `python script.py` as a world of one):

    rank, world = fsdp_mini.init(timeout=60)  # reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT (env://)
    device = fsdp_mini.get_device()     # cuda:LOCAL_RANK under NCCL, cpu under gloo
    ...
    fsdp_mini.finish()                  # under torchrun: end the rank without interpreter shutdown

The names of the environment variables are torchrun's (`torch.distributed.run`). What a rank is (its
node-local index, its device, whether torch.distributed is up) is read in `fsdp_mini.rank_environment`, which
the engines import instead of this module, so that the engine, the launcher and checkpoints agree on what a
node is and the engines load nothing of launching.

Under torchrun, `init()` also does for a rank what `launch` does for its children: the rank dies with
its agent (a killed torchrun leaves no training processes behind), and its collectives are recorded in a
folder of its own run, so that a rank that fails says why: its own exception, a peer that died, or where the
ranks diverged (`fsdp_mini.flight_recorder`). Rank 0 says where that folder is when the run starts
(`$TMPDIR/fsdp_mini_flight/<run id>`, or FSDP_MINI_FLIGHT_DIR); a run whose ranks all end well removes its
own folder, a failed run's stays for `python -m fsdp_mini diagnose`.
"""
from __future__ import annotations

import ctypes
import dataclasses
import datetime
import enum
import os
import signal
import sys
import tempfile
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout

from fsdp_mini.rank_environment import (BACKENDS, default_backend, get_device, local_rank, local_world_size,
                                       require_distributed, under_torchrun)

__all__ = ["init", "finish", "get_device", "under_torchrun", "require_distributed", "local_world_size", "default_backend",
           "check_backend", "BACKENDS", "STARTUP_TIMEOUT", "wait_for_every_rank", "Launcher", "launcher", "mark_launched",
           "die_with_parent", "RankFinished"]


def check_backend(backend: str | None, world_size: int = 1, ranks_per_node: int | None = None) -> str:
    """The backend to use: `backend`, or the default one; a clear error for an unknown name or too
    few GPUs, before any process starts."""
    backend = default_backend() if backend is None else backend
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: use one of {BACKENDS} or None (auto)")
    if backend == "nccl":
        needed = min(world_size, ranks_per_node or world_size)
        available = torch.cuda.device_count()
        if available < needed:
            raise ValueError(f"backend 'nccl' needs {needed} GPUs (one per rank), this machine has {available}")
    return backend


class Launcher(enum.Enum):
    """What started this process as a rank; `finish()` and `init()` act on it."""

    SCRIPT = "a plain script"        # nothing: `init()` forms a world of one
    TORCHRUN = "torchrun"            # torchrun's agent, or another launcher of the env:// convention
    LAUNCH = "fsdp_mini.launch"   # forked by `launch`, which owns the rank's start and end


_launched = False  # set in the ranks that `launch` forks (`mark_launched`)


def mark_launched() -> None:
    """Called by `launch` in each rank it forks: `finish()` then ends the rank's function, not the process."""
    global _launched
    _launched = True


def launcher() -> Launcher:
    """What started this rank (see `Launcher`)."""
    if _launched:
        return Launcher.LAUNCH
    return Launcher.TORCHRUN if under_torchrun() else Launcher.SCRIPT


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (a Ctrl-C'd notebook under `launch`, a killed
    torchrun agent): a rank without its launcher would otherwise train on, or wait in a collective, forever."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the launcher's own clean-up still runs
        pass


def init(backend: str | None = None, timeout: float = 600.0) -> tuple[int, int]:
    """Initialise `torch.distributed` from torchrun's environment; return `(rank, world_size)`.

    Under `torchrun` it reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT (the `env://`
    convention). Run as a plain script (none of them set) it forms a world of one process, so the same
    script works everywhere. Inside `launch`, or when the process group exists already, it changes
    nothing (`timeout` does not apply) and returns `(rank, world_size)` all the same.

    timeout: seconds a collective may wait for its peers before it fails. A hang (a rank that skipped a
        collective) then ends in an error after `timeout`, and under torchrun that error says where the
        ranks diverged: each rank's flight record is mirrored into a folder of this run (FSDP_MINI_FLIGHT_DIR
        when set, else one under the temporary directory), which the error names.
        A peer that starts late is not a hang: `init` first waits for every rank (up to STARTUP_TIMEOUT,
        or `timeout` if longer), where `init_process_group(timeout=...)` alone fails a rank whose peer
        arrives more than `timeout` seconds after it (ranks import torch at different speeds).
    Under torchrun the rank also dies with its agent (`die_with_parent`).
    """
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if not dist.is_initialized():
        backend = check_backend(backend)
        kwargs: dict[str, Any] = {"timeout": datetime.timedelta(seconds=timeout)}
        if "RANK" in os.environ:
            if "TORCHELASTIC_RUN_ID" in os.environ:  # started by torchrun's agent: no orphan if it dies
                die_with_parent()
            store, rank, world = _every_rank_started(max(kwargs["timeout"], STARTUP_TIMEOUT))
            store.set_timeout(kwargs["timeout"])
            kwargs.update(store=store, rank=rank, world_size=world)
        else:  # a plain `python script.py`: a world of one, no port needed
            folder = tempfile.mkdtemp(prefix="fsdp_mini_")
            kwargs.update(init_method=f"file://{folder}/store", rank=0, world_size=1)
            os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
        if backend == "nccl":
            torch.cuda.set_device(local_rank())
        dist.init_process_group(backend, **kwargs)
        _record_flight()
    return dist.get_rank(), dist.get_world_size()


STARTUP_TIMEOUT = default_pg_timeout  # how long `init` waits for every rank to start: PyTorch's default


def _every_rank_started(wait: datetime.timedelta) -> tuple[dist.Store, int, int]:
    """The `env://` rendezvous (what `init_process_group` does with it), then `wait_for_every_rank` on its
    store (rank 0's own store already waits for every rank to connect; torchrun's agent store does not)."""
    try:
        store, rank, world = next(dist.rendezvous("env://", timeout=wait))
        wait_for_every_rank(store, world, wait)
    except dist.DistError as e:
        raise RuntimeError(f"rank {os.environ['RANK']}: not all {os.environ['WORLD_SIZE']} ranks reached "
                           f"fsdp_mini.init() within {wait.total_seconds():g} s; the others did not start or failed before it "
                           f"({str(e).splitlines()[0]})") from None
    return store, rank, world


def wait_for_every_rank(store: dist.Store, world: int, wait: datetime.timedelta) -> None:
    """A barrier on `store`, before a process group exists: returns once `world` ranks have called it, so that
    a short group timeout meant for hangs does not fail a rank whose peers start late. Counting arrivals (not
    a key per rank) keeps it a barrier when a script calls it again on the same store (torchrun's store
    outlives a group)."""
    arrived = store.add("fsdp_mini/started", 1)
    round_ = (arrived - 1) // world
    if arrived % world == 0:  # the last rank of this round opens it for everyone
        store.set(f"fsdp_mini/started/{round_}", "")
    store.wait([f"fsdp_mini/started/{round_}"], wait)


@dataclasses.dataclass(frozen=True)
class _FlightFolder:
    """Where this torchrun rank's flight record is, and whether the run may remove the folder (its own, not
    one that FSDP_MINI_FLIGHT_DIR chose)."""

    path: str
    tidy: bool


_flight: _FlightFolder | None = None  # set by `_record_flight`


def _record_flight() -> None:
    """Mirror this rank's collectives into its run's folder, and make a failing rank print the verdict.

    On in every world of several ranks (FSDP_MINI_FLIGHT_DIR chooses the folder), and in a world of one
    only when FSDP_MINI_FLIGHT_DIR asks for it. The run id comes from rank 0 (one small broadcast), so that
    every rank's file says which run it belongs to, and so does the default folder's name. A chosen folder
    is kept; the run's own is removed by the last rank to end well (`finish()`, or the script's end).
    The flight recorder is imported here, when a run starts recording: a script that never does never
    loads it (`import fsdp_mini.fsdp` does not), and importing it subscribes it to the collectives."""
    from fsdp_mini.flight_recorder import (FLIGHT_DIR_ENV, RECORDER, default_folder, install_verdict_hook, new_run_id,
                                           record_path)

    rank, world = dist.get_rank(), dist.get_world_size()
    chosen = os.environ.get(FLIGHT_DIR_ENV)
    if world == 1 and not chosen:
        return
    run = [new_run_id() if rank == 0 else None]
    if world > 1:
        dist.broadcast_object_list(run, src=0, device=get_device())
    folder = chosen or default_folder(run[0])
    os.makedirs(folder, exist_ok=True)
    RECORDER.attach(record_path(folder, rank), run=run[0], rank=rank, world=world)
    global _flight
    _flight = _FlightFolder(folder, tidy=not chosen)
    install_verdict_hook(folder, rank, tidy=not chosen)
    if rank == 0:
        kept = "kept" if chosen else "removed if every rank ends well"
        sys.stderr.write(f"fsdp_mini: this run's flight records go to {folder} ({kept}; "
                         f"python -m fsdp_mini diagnose {folder})\n")
        sys.stderr.flush()


class RankFinished(SystemExit):
    """How `finish()` ends a rank's function inside `launch`, which then reports the exit code (0: the
    rank's result is None) and ends the process itself."""


def finish(exit_code: int = 0) -> None:
    """End a torchrun rank: destroy the process group, flush the output and exit with `exit_code`.

    Why not simply return: gloo's worker threads drop a finished collective's tensors a moment after
    `wait()` has returned. If the interpreter is already shutting down by then, that drop needs the GIL,
    the thread is killed and the rank dies with SIGABRT ("terminate called without an active
    exception"), after all its work was done; here it hit about 1 run in 15 of a 2-rank torchrun demo.
    `os._exit` skips the interpreter's shutdown, so there is nothing to race with. Never returns.

    Under torchrun it first writes the rank's end record (finished, or exited with `exit_code`), which a
    failing peer's note and `diagnose` read; the last rank to finish well removes the run's flight folder.

    Inside `launch` the same script works: `finish()` raises `RankFinished`, which ends the rank's
    function; the process, its group and its exit are `launch`'s.
    """
    if launcher() is Launcher.LAUNCH:
        raise RankFinished(exit_code)
    if _flight is not None:  # recording (`_record_flight`): the end record, and the folder removed if all ended well
        from fsdp_mini.flight_recorder import RECORDER, Ending, remove_if_ended_well

        RECORDER.end(Ending.FINISHED if exit_code == 0 else Ending.EXITED, str(exit_code))
        if _flight.tidy and RECORDER.ended is Ending.FINISHED:
            remove_if_ended_well(_flight.path)
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code)
