"""Flight records as lesson 10 shows them: PyTorch's own flight recorder run on gloo ranks beside
fsdp_mini's, on the same hang (fsdp_mini's verdicts in Russian: `fsdp_mini.course.readings`).

PyTorch 2.13 records every collective of every process group, gloo included, in one ring buffer per
process (`TORCH_FR_BUFFER_SIZE` entries, 2000 by default: torch/csrc/distributed/c10d/FlightRecorder.hpp).
On NCCL a watchdog thread writes that buffer to a file when a collective times out
(`TORCH_NCCL_DUMP_ON_TIMEOUT=1`); gloo has no such watchdog, so a gloo rank dumps it itself:
`torch._C._distributed_c10d._dump_fr_trace()` returns the pickle that `fr_trace` reads, and the place
to call it is the `finally` around the training loop, which runs once the group's timeout has turned the
hang into an exception.

`record_both(fn, world, folder)` forks `world` gloo ranks with a short process-group timeout; each runs
`fn` with fsdp_mini's recorder mirrored into `folder/fsdp_mini` and, in its `finally`, PyTorch's record
dumped into `folder/pytorch`. A rank that dies (os._exit, a segfault, gloo's abort on a size mismatch,
the OOM killer) dumps nothing: its record lived in its memory. `fr_trace(folder)` runs PyTorch's
analyzer on the dumps (what `python -m torch.distributed.flight_recorder.fr_trace` runs, its `main`, here
in this process) and `first_finding` reads its first finding.

One repair on the way out: torch 2.13's gloo backend registers its group with the recorder before the
group has a name (distributed_c10d.py sets `options.group_name` after constructing `ProcessGroupGloo`),
so a gloo dump's `pg_config` holds one nameless group and `fr_trace` stops with a `KeyError`.
`dump_trace` writes the groups this rank knows, by name, as NCCL's dumps have them.
"""
from __future__ import annotations

import contextlib
import datetime
import faulthandler
import functools
import gc
import io
import logging
import os
import pickle
import re
import signal
import sys
import time
import traceback
from multiprocessing import get_context

import torch
import torch.distributed as dist

from fsdp_mini.flight_recorder import RECORDER, find_divergence, load_run, record_path
from fsdp_mini.run import frozen_heap
from fsdp_mini.runtime import STARTUP_TIMEOUT, wait_for_every_rank

__all__ = ["BUFFER_ENV", "dump_trace", "record_both", "fsdp_mini_verdict", "fr_trace", "first_finding"]


BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"  # entries per process; TORCH_NCCL_TRACE_BUFFER_SIZE is its old name


def _groups() -> dict[str, dict[str, str]]:
    """Every process group this rank knows, as fr_trace's pg_config wants them: by name, its
    description and its global ranks."""
    config = {}
    for group, name in dist.distributed_c10d._world.pg_names.items():
        ranks = dist.get_process_group_ranks(group)
        config[name] = {"name": name, "desc": group.group_desc, "ranks": str(sorted(ranks))}
    return config


def dump_trace(folder: str, rank: int) -> str:
    """Write this rank's PyTorch flight record to `folder/rank_<rank>` (the name fr_trace expects:
    a common prefix, then the rank). Returns the path."""
    dump = pickle.loads(torch._C._distributed_c10d._dump_fr_trace())
    dump["pg_config"] = _groups()  # see the module's docstring: gloo registers a nameless group
    path = os.path.join(folder, f"rank_{rank}")
    with open(path, "wb") as f:
        pickle.dump(dump, f)
    return path


def _rank(fn, rank, world, folder, timeout_s, buffer_size):
    log = os.open(os.path.join(folder, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT, 0o644)
    os.dup2(log, 1)  # gloo's C++ warnings, and any print, go to this rank's log, not the notebook
    os.dup2(log, 2)
    # Python's streams onto fds 1/2: a forked Jupyter kernel's own streams would reach the notebook
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    if faulthandler.is_enabled():  # the caller's handler (pytest's) would print a rank's abort on its terminal
        faulthandler.enable(file=sys.stderr, all_threads=True)  # into this rank's log instead, as launch does
    os.environ[BUFFER_ENV] = str(buffer_size)  # read when this process creates its first group
    torch.set_num_threads(1)
    RECORDER.reset()
    RECORDER.attach(record_path(os.path.join(folder, "fsdp_mini"), rank))
    store = dist.FileStore(os.path.join(folder, "store"), world)
    wait_for_every_rank(store, world, STARTUP_TIMEOUT)  # a rank that starts late is not the hang recorded
    store.set_timeout(datetime.timedelta(seconds=timeout_s))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the timeout (or a peer's exit) that ends a hang
        print(f"rank {rank}: {type(e).__name__}: {e}", flush=True)
    finally:
        dump_trace(os.path.join(folder, "pytorch"), rank)  # no watchdog on gloo: dump it ourselves
    os._exit(0)  # not through gloo's teardown, which can abort while a peer still waits


def record_both(fn, world: int, folder: str, timeout_s: float = 3.0, buffer_size: int = 2000) -> dict:
    """Run `fn` on `world` forked gloo ranks whose default group times out after `timeout_s`; both
    recorders on. Returns {rank: exit code} (0 for a rank that ran to its dump)."""
    for sub in ("fsdp_mini", "pytorch"):
        os.makedirs(os.path.join(folder, sub), exist_ok=True)
    ctx = get_context("fork")
    sys.stdout.flush()
    sys.stderr.flush()
    procs = [ctx.Process(target=_rank, args=(fn, r, world, folder, timeout_s, buffer_size))
             for r in range(world)]
    with frozen_heap():  # as launch forks: a rank's full collection skips what it inherited
        for p in procs:
            p.start()
    deadline = time.monotonic() + 3 * timeout_s + 20
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():  # stuck outside any collective: not what this is for, but never leave it
            os.kill(p.pid, signal.SIGKILL)
            p.join()
    return {r: p.exitcode for r, p in enumerate(procs)}


def fsdp_mini_verdict(folder: str, world: int) -> str | None:
    """fsdp_mini's verdict on the run recorded in `folder` (lesson 10's table prints the same)."""
    return find_divergence(load_run(os.path.join(folder, "fsdp_mini")).records, world=world)


@functools.cache
def _analyzer():
    """fr_trace's `main` and the logger its report goes to, imported once. Its import logs a notice when
    `tabulate` is missing, through a handler it binds to the stderr of that moment: the notice is
    dropped, and the handler bound back to this process's stderr."""
    with contextlib.redirect_stderr(io.StringIO()):
        from torch.distributed.flight_recorder.components.fr_logger import FlightRecorderLogger
        from torch.distributed.flight_recorder.fr_trace import main
    logger = FlightRecorderLogger().logger
    for handler in _stream_handlers(logger):
        handler.setStream(sys.stderr)
    return main, logger


def _stream_handlers(logger: logging.Logger) -> list[logging.StreamHandler]:
    return [h for h in logger.handlers if isinstance(h, logging.StreamHandler)]


def fr_trace(folder: str) -> str:
    """What `python -m torch.distributed.flight_recorder.fr_trace DIR` prints for the dumps in
    `folder/pytorch` after its import's notice: its report, or the error it stops with (e.g. a rank
    whose dump is missing) and its traceback from `main` on. Runs fr_trace's `main` in this process, its
    log caught on the way; a fresh Python would cost two CPU-seconds of `import torch` per call. `main`
    turns the garbage collector off while it reads the dumps (a script's shortcut): it is turned back on."""
    main, logger = _analyzer()
    log = io.StringIO()
    handlers = _stream_handlers(logger)
    streams = [handler.stream for handler in handlers]
    for handler in handlers:
        handler.setStream(log)
    propagate, logger.propagate = logger.propagate, False  # its records only in its own handler, as in a script
    collecting = gc.isenabled()
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            main([os.path.join(folder, "pytorch")])
    except Exception as e:  # noqa: BLE001 - the error it stops with is part of what it prints
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code is not main.__code__:  # this function's frame: not fr_trace's
            tb = tb.tb_next
        log.write("".join(traceback.format_exception(type(e), e, tb)))
    finally:
        for handler, stream in zip(handlers, streams):
            handler.setStream(stream)
        logger.propagate = propagate
        if collecting:
            gc.enable()
    return out.getvalue() + log.getvalue()


def first_finding(report: str) -> dict:
    """The first thing an fr_trace report finds, in fields that do not depend on the order in which it
    read the ranks' files (it takes the first file it reads as the expected collective, and the
    directory's order is the file system's): `kind` ("missing dumps", "not joined", "mismatch" or
    "none"), `seq`, `collective`, `ranks` (missing), `errors` (error types), `values` (the differing
    op types or input sizes, sorted)."""
    missing = re.search(r"Missing dump files from ranks \{([\d, ]+)\}", report)
    if missing:
        return {"kind": "missing dumps", "ranks": sorted(int(r) for r in missing.group(1).split(","))}
    head = re.search(r"^(Not all ranks joining collective, sequence number: (\d+)|"
                     r"Collective sequence number: (\d+) has errors)$", report, re.M)
    if not head:
        return {"kind": "none"}
    block = report[head.start():]
    block = block[:block.index("collective stack trace")] if "collective stack trace" in block else block
    collective = re.search(r"^collective: (.*)$", block, re.M).group(1)
    if head.group(2):
        ranks = re.search(r"^missing ranks: \{([\d, ]+)\}", block, re.M).group(1)
        return {"kind": "not joined", "seq": int(head.group(2)), "collective": collective,
                "ranks": sorted(int(r) for r in ranks.split(","))}
    errors = sorted(set(re.findall(r"Error type: (\w+)", block)))
    values = set()
    for a, b in re.findall(r"Expected (?:collective type|input sizes): '([^']*)' does not match found "
                           r"(?:collective type|input sizes): '([^']*)'", block):
        values |= {a, b}
    return {"kind": "mismatch", "seq": int(head.group(3)), "collective": collective, "errors": errors,
            "values": sorted(values)}
