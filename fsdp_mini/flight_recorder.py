"""Each rank's last collectives, so that a hang can say *where* the ranks went different ways.

The usual distributed failure is not an exception but a hang: one rank skips a collective (a block
skipped by data-dependent control flow, one batch fewer, `state_dict()` on rank 0 only), and every rank
then waits in a different one until a timeout. The stacks show where each rank waits, but not why. So
every rank records the collectives it issues in a short ring buffer (as PyTorch's NCCL flight recorder
does): per process group a sequence number, the op, the group's ranks, the tensors' shapes and dtype, and
the caller's CommLog scope (the FSDP unit) and phase. A point-to-point message's group is its (source,
destination) pair, numbered per channel (its tag), and its send and its receive count as the same call. Put side by side, the ranks' records name the first
collective where they differ:

    rank 1 waits in AllGather #17 (blocks.2, forward) while ranks 0, 2, 3 wait in ReduceScatter #17
    (blocks.3, backward)

`RECORDER` (one per process) hears of every collective `fsdp_mini.collectives` issues: it subscribes to
the calls (`fsdp_mini.collective_calls`) when this module is imported, as `fsdp_mini.launch` and
`fsdp_mini.init()` do; about 10 microseconds per collective, under 1% of a step, so it is always on. It which mirrors itself into a memory-mapped file:
under `fsdp_mini.launch` in the launch's folder, whose records the caller reads when a rank fails or the
ranks time out (the verdict is in its error); under torchrun in a folder of its own per run
(`default_folder`, or `$FSDP_MINI_FLIGHT_DIR` when it is set), which `fsdp_mini.init()` attaches and names
in the error of a rank that fails (`install_verdict_hook`). `python -m fsdp_mini diagnose DIR` prints the
same verdict from the files, also for ranks that were killed or hang.

The first line of a verdict names the cause, as far as the records can tell. Collectives alone cannot tell
a rank that raised or died from one that took another path: both issued fewer. So each rank under torchrun
also leaves an *end record* in its file (`Ending`: it finished, exited with a code, raised an exception of
its own, or failed inside a collective), and its header names its process, which the reader checks is
gone. An exception of a rank's own comes first (a collective that failed after it is its consequence), then
a rank that died without an end record (killed: the OOM killer, a signal), then the divergence; every rank
gone without an end record is an interrupted run (killed with its agent), not a divergence. A run whose
ranks all end well removes its folder (`remove_if_ended_well`); a failed run's stays for `diagnose`.

Every file starts with a header naming its run (an id all ranks of a run share), its rank and the world
size: a folder used by several runs (a 3-rank job, then a 2-rank job) holds files of both, and the
verdict is made from the newest run's files alone; the others are named as stale, never mixed in.
"""
from __future__ import annotations

import atexit
import contextlib
import enum
import fcntl
import json
import mmap
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections import deque
from dataclasses import dataclass, field

import torch.distributed as dist

from fsdp_mini.collective_calls import CollectiveCall, subscribe

__all__ = ["Entry", "FlightRecorder", "RECORDER", "find_divergence", "diagnose", "load_run", "Run",
           "record_path", "new_run_id", "default_folder", "install_verdict_hook", "failure_note", "FLIGHT_DIR_ENV",
           "CAPACITY", "Ending", "End", "recorded", "raised_in_a_collective", "remove_if_ended_well", "FLIGHT_ROOT"]

CAPACITY = 64  # collectives kept per rank: a few steps of a small model; divergence shows up at once
FLIGHT_DIR_ENV = "FSDP_MINI_FLIGHT_DIR"
_OP_NAMES = {"all_reduce": "AllReduce", "reduce_scatter": "ReduceScatter", "all_gather": "AllGather",
             "broadcast": "Broadcast", "send": "Send", "recv": "Recv"}


@dataclass(frozen=True)
class Entry:
    """One collective as this rank issued it."""

    seq: int  # this rank's n-th collective in `group` (1-based): ranks of a group must agree on each
    op: str
    group: tuple[int, ...]  # the global ranks of the process group
    shapes: tuple[tuple[int, ...], ...]
    dtype: str
    label: str  # the caller's CommLog scope, e.g. an FSDP unit
    phase: str  # "forward", "backward" or ""
    done: bool = False
    channel: int = 0  # a point-to-point message's tag: a pair's messages are numbered per channel

    def signature(self) -> tuple:
        """What ranks of a group must agree on at the same sequence number. A point-to-point pair's group is
        (source, destination): its n-th send and its n-th receive agree when they move the same tensor."""
        op = "send/recv" if self.op in ("send", "recv") else self.op
        return (op, self.shapes, self.dtype, self.label, self.phase)

    def describe(self, with_shapes: bool = False) -> str:
        where = ", ".join(x for x in (self.label, self.phase) if x)
        text = f"{_OP_NAMES.get(self.op, self.op)} #{self.seq}" + (f" ({where})" if where else "")
        if with_shapes:
            text += f" of {', '.join(str(tuple(s)) for s in self.shapes)} {self.dtype}"
        return text


class Ending(enum.Enum):
    """How a rank's process ended, as its end record says (no end record: it died, or still runs)."""

    FINISHED = "finished"  # `fsdp_mini.finish(0)`, or the script returned
    EXITED = "exited"  # `fsdp_mini.finish(code)` with a code other than 0
    RAISED = "raised"  # an exception of its own (a bad batch, a shape error): a cause
    FAILED_IN_COLLECTIVE = "failed in a collective"  # raised by a collective (a timeout, a peer gone): a consequence
    STOPPED = "stopped"  # SIGTERM: torchrun's agent stops the other ranks once one has failed


@dataclass(frozen=True)
class End:
    """A rank's end record: how it ended, when (its clock), and what (the exception's line, the exit code)."""

    how: Ending
    at: float
    what: str = ""

    def headline(self, rank: int) -> str:
        """The sentence `launch` writes for the same end of a rank that failed or exited."""
        if self.how is Ending.EXITED:
            return f"rank {rank} exited with code {self.what} (fsdp_mini.finish or sys.exit)"
        return f"rank {rank} failed: {self.what}"


_TORCH_DIR = os.path.dirname(os.path.dirname(dist.__file__)).replace(os.sep, "/") + "/"


def raised_in_a_collective(exc: BaseException) -> bool:
    """Whether `exc` was raised by a collective (gloo's timeout, "Connection closed by peer": the
    consequence of another rank's failure) rather than by the rank's own code (a ValueError, a shape error
    in a block, which is the cause). Told by where it was raised: a RuntimeError raised inside torch on its
    way through torch.distributed (innermost frames: a collective, or a DTensor's functional collective,
    which waits in torch/_ops.py) or in fsdp_mini.collectives (bad arguments there raise ValueError or
    TypeError), or an error raised while handling one (a checkpoint's RuntimeError wrapping DCP's)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, dist.DistError):
            return True
        if isinstance(exc, RuntimeError) and exc.__traceback__ is not None:
            frames = [f.filename.replace(os.sep, "/") for f in traceback.extract_tb(exc.__traceback__)]
            if frames[-1].endswith("/fsdp_mini/collectives.py"):
                return True
            for name in reversed(frames):  # the frames inside torch it was raised through, innermost first
                if not name.startswith(_TORCH_DIR):
                    break
                if name.startswith(_TORCH_DIR + "distributed/"):
                    return True
        exc = exc.__cause__ or exc.__context__
    return False


def _process_start(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot, /proc/PID/stat), to tell it from a later process
    with the same pid; None where there is no /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[19]) if fields[0] not in ("Z", "X") else None


def _gone(header: dict) -> bool:
    """Whether the process that wrote a record file is known to have ended: its pid ran on this host and
    no longer runs, or runs a later process (another start time), or is a zombie. Unknown (a file from
    another host, or without a pid): False."""
    pid = header.get("pid")
    if not pid or header.get("host") != socket.gethostname() or not os.path.isdir("/proc/self"):
        return False
    started = _process_start(pid)
    return started is None or started != header.get("pid_start", started)


class FlightRecorder:
    """The last `capacity` collectives of this process, in issue order.

    Kept in memory, and, once `attach`ed to a file, also in that file through a memory map: each entry
    is written into its slot of a fixed-size ring as it is issued and again when it completes. A memory
    write costs no system call, and the file outlives the process: the record of a rank that aborted
    inside a collective (gloo aborts on mismatched shapes) or was killed can still be read."""

    def __init__(self, capacity: int = CAPACITY):
        self.capacity = capacity
        self._entries: deque[_Token] = deque(maxlen=capacity)
        self._seq: dict[tuple[int, ...], int] = {}
        self._issued = 0
        self._lock = threading.Lock()
        self._map: mmap.mmap | None = None
        self.ended: Ending | None = None  # the end record written into it, if any
        self.enabled = True  # False only to measure what recording costs (the bench's `:norecord` cases)

    def attach(self, path: str, run: str = "", rank: int | None = None, world: int | None = None) -> None:
        """Mirror the record into `path`: a header slot naming the run (`run`, shared by every rank of
        one run: `new_run_id`), `rank`, `world` and this process (pid, host, start time: whether it is
        gone), then `capacity` slots of `_SLOT` bytes, then the slot of the end record (`end`)."""
        size = (self.capacity + 2) * _SLOT
        pid = os.getpid()
        header = json.dumps({"run": run, "rank": rank, "world": world, "started": time.time(), "pid": pid,
                             "host": socket.gethostname(), "pid_start": _process_start(pid)}).encode()
        with open(path, "wb") as f:
            f.truncate(size)
            f.write(header[:_SLOT].ljust(_SLOT, b" "))
        with open(path, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), size)
        self.ended = None

    def end(self, how: Ending, what: str = "") -> None:
        """Write this process's end record (once: the first end is the one that counts, e.g. an uncaught
        exception's, not the interpreter's exit after it). `what`: the exception's line or the exit code."""
        if self._map is None or self.ended is not None:
            return
        self.ended = how
        what = what.splitlines()[0] if what else ""
        for cut in (400, 200, 80, 0):
            data = json.dumps({"end": how.value, "at": time.time(), "what": what[:cut]}).encode()
            if len(data) < _SLOT:
                break
        start = (self.capacity + 1) * _SLOT
        self._map[start:start + _SLOT] = data.ljust(_SLOT, b" ")

    def issued(self, call: CollectiveCall, tensors: tuple) -> "_Token | None":
        """A call was issued (`fsdp_mini.collective_calls`' listener): record it."""
        return self.issue(call.op, call.group, tensors, call.label, call.phase, call.channel)

    def completed(self, call: CollectiveCall, token: "_Token | None") -> None:
        self.complete(token)

    def issue(self, op: str, group: tuple[int, ...], tensors, label: str, phase: str = "",
              channel: int = 0) -> "_Token | None":
        """Record a collective at issue time; returns the token that `complete` takes. On the hot path
        of every collective, so it only stores plain values; `entries()` builds the `Entry` objects."""
        if not self.enabled:
            return None
        with self._lock:
            key = (group, channel)
            seq = self._seq[key] = self._seq.get(key, 0) + 1
            token = _Token((seq, op, group, tuple(tuple(t.shape) for t in tensors),
                            str(tensors[0].dtype)[6:] if tensors else "", label, phase, channel),
                           self._issued % self.capacity, self._issued)
            self._issued += 1
            self._entries.append(token)
            if self._map is not None:
                self._write(token)
        return token

    def complete(self, token: "_Token | None") -> None:
        if token is None:
            return
        token.done = True
        # in the file, flip the entry's `"done": false` in place, unless its slot went to a newer entry
        if self._map is not None and token.done_at and self._issued - token.number <= self.capacity:
            self._map[token.done_at:token.done_at + 5] = b"true "

    def _write(self, token: "_Token") -> None:
        seq, op, group, shapes, dtype, label, phase, channel = token.fields
        data = (f'{{"n": {token.number}, "seq": {seq}, "op": "{op}", "group": {list(group)}, "channel": {channel}, '
                f'"shapes": {[list(s) for s in shapes]}, "dtype": "{dtype}", "label": {json.dumps(label)}, '
                f'"phase": "{phase}", "done": false}}').encode()
        if len(data) < _SLOT:  # an entry too long to fit is left out of the file, not the memory
            start = (token.slot + 1) * _SLOT  # slot 0 is the header
            self._map[start:start + _SLOT] = data.ljust(_SLOT, b" ")
            token.done_at = start + len(data) - len(b"false}")

    def entries(self) -> list[Entry]:
        with self._lock:
            return [Entry(*t.fields[:7], done=t.done, channel=t.fields[7]) for t in self._entries]

    def reset(self) -> None:
        """Forget everything and detach (a forked rank starts from an empty record, not its parent's)."""
        with self._lock:
            self._entries.clear()
            self._seq.clear()
            self._issued = 0
            self._map = None
            self.ended = None


class _Token:
    """A collective in flight: its fields (Entry's, but `done`), its slot in the file and issue number,
    and where its `done` flag sits in the file (0: not in the file)."""

    __slots__ = ("fields", "slot", "number", "done", "done_at")

    def __init__(self, fields: tuple, slot: int, number: int):
        self.fields, self.slot, self.number, self.done, self.done_at = fields, slot, number, False, 0


_SLOT = 512  # bytes per entry in the file


RECORDER = FlightRecorder()
subscribe(RECORDER)


@contextlib.contextmanager
def recorded(op: str, label: str = ""):
    """Record a collective operation that `fsdp_mini.collectives` does not issue, as one entry of the
    default group: a sharded checkpoint's save or load, whose collectives (DCP's plans, the commit's
    `broadcast_object_list`) are torch.distributed's own. Every rank must call it, as every rank must call
    the operation; a rank that calls it alone then waits in `save_checkpoint #N` by name, where without it
    the verdict said it "issued no collective #N". Also a decorator. Records nothing outside a process group."""
    if not dist.is_initialized():
        yield
        return
    token = RECORDER.issue(op, tuple(range(dist.get_world_size())), (), label)
    yield
    RECORDER.complete(token)  # not on an exception: the operation did not complete on this rank


def record_path(folder: str, rank: int) -> str:
    return os.path.join(folder, f"rank{rank}.flight")


def new_run_id() -> str:
    """A fresh run id: its start time (so that ids sort by age), then random hex (unique)."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:8]


FLIGHT_ROOT = "fsdp_mini_flight"  # under the temporary directory: a folder per torchrun run


def default_folder(run: str) -> str:
    """Where a torchrun job's ranks write their records when FSDP_MINI_FLIGHT_DIR is not set: a folder
    per run under the temporary directory (each node's own; about 33 KB per rank), removed when every
    rank ends well (`remove_if_ended_well`), kept when the run fails."""
    return os.path.join(tempfile.gettempdir(), FLIGHT_ROOT, run)


@dataclass(frozen=True)
class Run:
    """The records of one run found in a folder, and the files of other runs that were left out."""

    run: str  # the run id ("" for files written without one)
    world: int | None  # the world size the ranks wrote in their headers (None: not written)
    records: dict[int, list[Entry]] = field(default_factory=dict)  # rank -> entries, in issue order
    stale: dict[str, tuple[str, int | None]] = field(default_factory=dict)  # file -> (its run, its world)
    ends: dict[int, End] = field(default_factory=dict)  # rank -> its end record, for ranks that wrote one
    gone: frozenset[int] = frozenset()  # ranks whose process is known to have ended (it ran on this host)

    def died(self) -> list[int]:
        """Ranks whose process is gone without an end record: killed (a signal, the OOM killer) or os._exit."""
        return [r for r in sorted(self.records) if r not in self.ends and r in self.gone]

    def missing(self) -> list[int]:
        """Ranks of this run's world with no record file here (a rank that never started, another node's)."""
        return [r for r in range(self.world or 0) if r not in self.records]


def _read_file(path: str) -> tuple[dict, list[Entry], End | None]:
    """(header, entries in issue order, end record or None) of one record file; a file without a header
    (written before runs had ids) gets an empty one. A slot that does not parse (never written, or being
    written as the process died) is skipped."""
    with open(path, "rb") as f:
        data = f.read()
    header, rows, end = {}, [], None
    for start in range(0, len(data), _SLOT):
        try:
            row = json.loads(data[start:start + _SLOT])
        except ValueError:
            continue
        if "run" in row:
            header = row
        elif "end" in row:
            end = End(Ending(row["end"]), row["at"], row["what"])
        else:
            rows.append(row)
    rows.sort(key=lambda row: row.pop("n"))
    return header, [Entry(**{**row, "group": tuple(row["group"]), "shapes": tuple(tuple(x) for x in row["shapes"])})
                    for row in rows], end


def load_run(folder: str) -> Run:
    """The newest run's records in `folder` (files `rank<r>.flight`); files of other runs are left out and
    listed in `Run.stale`. The newest run is the one whose header says it started last."""
    runs: dict[str, dict] = {}
    for name in sorted(os.listdir(folder)):
        if not (name.startswith("rank") and name.endswith(".flight") and name[4:-7].isdigit()):
            continue
        header, entries, end = _read_file(os.path.join(folder, name))
        run = runs.setdefault(header.get("run", ""), {"started": 0.0, "world": None, "files": {}, "ends": {},
                                                      "gone": set()})
        run["started"] = max(run["started"], header.get("started") or 0.0)
        run["world"] = header.get("world") or run["world"]
        run["files"][name] = entries
        rank = int(name[4:-7])
        if end is not None:
            run["ends"][rank] = end
        elif _gone(header):
            run["gone"].add(rank)
    if not runs:
        return Run("", None)
    newest = max(runs, key=lambda r: (runs[r]["started"], len(runs[r]["files"])))
    stale = {name: (run, info["world"]) for run, info in runs.items() if run != newest for name in info["files"]}
    chosen = runs[newest]
    return Run(newest, chosen["world"], {int(name[4:-7]): e for name, e in chosen["files"].items()}, stale,
               chosen["ends"], frozenset(chosen["gone"]))


def _ranks(ranks) -> str:
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def find_divergence(records: dict[int, list[Entry]], world: int | None = None) -> str | None:
    """The first collective where the ranks of a group differ, as one sentence; None if they agree.

    Within each process group, the members' entries are compared sequence number by sequence number
    (entries that fell out of a ring buffer are skipped). A member with no entry at that number issued
    fewer collectives in the group: it waits elsewhere, finished, or died. Of all groups, the divergence
    with the lowest sequence number is reported (ties: the larger group). `world`: the number of ranks
    (default: the ranks with a record), to tell the whole world's group from a subgroup."""
    world = len(records) if world is None else world
    found: list[tuple[int, int, str]] = []
    channels = {(e.group, e.channel) for entries in records.values() for e in entries}  # p2p: one per tag
    for group, channel in channels:
        members = [r for r in group if r in records]
        by_rank = {r: {e.seq: e for e in records[r] if (e.group, e.channel) == (group, channel)}
                   for r in members}
        oldest = max((min(s) for s in by_rank.values() if s), default=1)  # older ones may have been dropped
        newest = max((max(s) for s in by_rank.values() if s), default=0)
        for seq in range(oldest, newest + 1):
            at = {r: by_rank[r].get(seq) for r in members}
            signatures = {e.signature() if e else None for e in at.values()}
            if len(signatures) > 1:
                found.append((seq, -len(group), _describe(seq, at, by_rank, world)))
                break
    return min(found)[2] if found else None


def _describe(seq: int, at: dict[int, Entry | None], by_rank: dict[int, dict[int, Entry]], world: int) -> str:
    kinds: dict[tuple | None, list[int]] = {}
    for rank, entry in at.items():
        kinds.setdefault(entry.signature() if entry else None, []).append(rank)
    present = [at[ranks[0]] for sig, ranks in kinds.items() if sig is not None]
    shapes_differ = len({e.op for e in present}) == 1 and len({(e.shapes, e.dtype) for e in present}) > 1
    parts = []
    # the odd one out first (the smallest set of ranks that agree), ranks that issued something before
    # ranks that issued nothing
    for sig, ranks in sorted(kinds.items(), key=lambda kv: (len(kv[1]), kv[0] is None, kv[1])):
        if sig is None:
            last = [max(by_rank[r].values(), key=lambda e: e.seq) for r in ranks if by_rank[r]]
            after = f" (its last: {last[0].describe()})" if len(ranks) == 1 and last else ""
            parts.append(f"{_ranks(ranks)} issued no collective #{seq}{after}")
        else:
            entry = at[ranks[0]]
            verb = "issued" if entry.done else ("waits in" if len(ranks) == 1 else "wait in")
            parts.append(f"{_ranks(ranks)} {verb} {entry.describe(with_shapes=shapes_differ)}")
    group = next(e.group for e in present)
    where = "" if group == tuple(range(world)) else f" (in the group of ranks {list(group)})"
    return parts[0] + " while " + " and ".join(parts[1:]) + where


def _waiting(records: dict[int, list[Entry]]) -> dict[int, Entry]:
    """Each rank's last collective that had not completed when the record was read, if any."""
    waiting = {r: next((e for e in reversed(es) if not e.done), None) for r, es in records.items()}
    return {r: e for r, e in waiting.items() if e is not None}


def _notes(run: Run) -> list[str]:
    """What the verdict did not use: files of other runs, ranks of this run with no file."""
    notes = []
    by_run: dict[tuple[str, int | None], list[str]] = {}
    for name, key in sorted(run.stale.items(), key=lambda kv: int(kv[0][4:-7])):
        by_run.setdefault(key, []).append(name)
    for (other, world), names in by_run.items():
        of = f" of {world} ranks" if world else ""
        notes.append(f"(ignored {', '.join(names)}: from an earlier run{of}, {other or 'without a run id'})")
    if run.missing():
        notes.append(f"(no record of {_ranks(run.missing())}; this run had {run.world} ranks)")
    return notes


def _died(ranks: list[int]) -> str:
    their = "its process" if len(ranks) == 1 else "their processes"
    return f"{_ranks(ranks)} died: {their} ended without an end record (killed by a signal, or os._exit?)"


def _cause(run: Run, divergence_prefix: str) -> list[str]:
    """The verdict's lines, the cause first (see the module's docstring for the order); [] when the
    records name no cause (the ranks agree and none failed on its own, died or diverged)."""
    records = run.records
    divergence = find_divergence(records, world=run.world or max(records) + 1)
    diverged = [divergence_prefix + divergence] if divergence else []
    own = sorted((e.at, r) for r, e in run.ends.items() if e.how in (Ending.RAISED, Ending.EXITED))
    died = run.died()
    if own:  # a rank's own exception (or exit code) is the story; what its peers' collectives did follows from it
        first = run.ends[own[0][1]]
        later = [r for _, r in own[1:]]
        same = [r for r in later if (run.ends[r].how, run.ends[r].what) == (first.how, first.what)]
        lines = [first.headline(own[0][1])]
        if same:
            lines.append(f"({_ranks(same)} failed the same way)")
        lines += [run.ends[r].headline(r) for r in later if r not in same]
        return lines + ([_died(died)] if died else []) + diverged
    if died and len(died) == len(records):  # nobody failed, everybody vanished: killed from outside
        return [f"the run was interrupted: no rank left an end record ({_ranks(died)}; killed together, "
                f"e.g. with their agent?)"]
    if died:
        return [_died(died)] + diverged
    return diverged


def diagnose(folder: str) -> str:
    """The verdict from the ranks' record files in `folder` (what `python -m fsdp_mini diagnose` prints):
    its first line names the cause (a rank's exception, a rank that died, where the ranks diverged, or
    that the run was interrupted); lines after it, if any, what followed from it and what was left out."""
    run = load_run(folder)
    records = run.records
    if not records:
        return f"no flight records (rank<r>.flight) in {folder}"
    lines = _cause(run, divergence_prefix="ranks diverged: ")
    if lines and lines[0].startswith("ranks diverged: "):
        lines[0] = lines[0].removeprefix("ranks diverged: ")  # the verdict alone, as find_divergence says it
    if not lines:
        stuck = _waiting(records)
        if not stuck:
            lines = [f"ranks {sorted(records)} agree on every recorded collective, and none is waiting in one"]
        else:
            lines = ["the ranks agree on every recorded collective; waiting: "
                     + "; ".join(f"rank {r} in {e.describe()}" for r, e in sorted(stuck.items()))]
    return "\n".join([*lines, *_notes(run)])


def failure_note(folder: str, rank: int, exc: BaseException | None = None) -> str:
    """What a rank that fails with `exc` should add to its error, from the records in `folder`: the cause
    (a rank's own exception, a rank that died, where the ranks diverged: `diagnose`'s order), or, when the
    records name none and `exc` was raised inside a collective, where this rank waited; then where the
    records are. "" when the records say nothing about this failure (an error outside any collective on
    ranks that agree)."""
    run = load_run(folder)
    if not run.records:
        return ""
    lines = _cause(run, divergence_prefix="ranks diverged: ")
    waiting = _waiting(run.records)
    if not lines and rank in waiting and (exc is None or raised_in_a_collective(exc)):
        lines = [f"the ranks agree on every recorded collective; rank {rank} failed in "
                 f"{waiting[rank].describe()} (a peer died or stalls inside it?)"]
    if not lines:
        return ""
    lines.append(f"this run's flight records are in {folder} (python -m fsdp_mini diagnose {folder})")
    return "\n".join(f"fsdp_mini: {line}" for line in lines)


def _settle(folder: str, patience_s: float = 1.0) -> None:
    """Wait (at most `patience_s`) until every rank of the run in `folder` wrote an end record or is gone:
    a peer killed a moment ago closes its connections before its process is reaped."""
    deadline = time.monotonic() + patience_s
    while time.monotonic() < deadline:
        run = load_run(folder)
        if all(r in run.ends or r in run.gone for r in run.records):
            return
        time.sleep(0.05)


def remove_if_ended_well(folder: str) -> bool:
    """Remove `folder` if every rank with a record in it ended well (an end record FINISHED) and it holds
    no other run's files; True if removed. Each rank calls it once it has written its end record: under a
    lock, so the last one to end sees every end record. A failed run's folder stays for `diagnose`."""
    try:
        lock = open(os.path.join(folder, ".lock"), "w")
    except OSError:  # removed already, or not ours to write
        return False
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.isdir(folder):
            return False
        run = load_run(folder)
        if (not run.records or run.stale
                or any(r not in run.ends or run.ends[r].how is not Ending.FINISHED for r in run.records)):
            return False
        shutil.rmtree(folder, ignore_errors=True)
    if os.path.basename(os.path.dirname(folder)) == FLIGHT_ROOT:  # the runs' parent folder, once it is empty
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(folder))
    return True


def install_verdict_hook(folder: str, rank: int, tidy: bool = False) -> None:
    """Make an uncaught exception of this rank also say what the flight records in `folder` say
    (`failure_note`): under torchrun each rank that fails prints the cause with its traceback, not only
    gloo's "Timed out waiting". Before that, the rank writes its end record (RAISED, or FAILED_IN_COLLECTIVE
    for a collective's error: `raised_in_a_collective`), which its peers' notes and `diagnose` read. Wraps
    the current `sys.excepthook` (torch.distributed's, which prefixes each line with the rank).

    At the interpreter's exit, a rank with no end record yet writes FINISHED (the script returned); with
    `tidy` (the run's own folder, not a chosen one) the last rank to end well removes the folder. On
    SIGTERM (torchrun's agent stopping the ranks that are left once one failed) it writes STOPPED, then dies
    of the signal as before: a rank stopped while it computed is not taken for one that died."""
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        try:
            in_collective = raised_in_a_collective(exc)
            RECORDER.end(Ending.FAILED_IN_COLLECTIVE if in_collective else Ending.RAISED,
                         f"{exc_type.__name__}: {exc}")
            if in_collective:
                _settle(folder)
            note = failure_note(folder, rank, exc)
        except Exception:  # noqa: BLE001 - the records are a help; the original error must still be shown
            note = ""
        if note and hasattr(exc, "add_note"):  # Python 3.11+: printed under the error's message
            exc.add_note(note)
            note = ""
        previous(exc_type, exc, tb)
        if note:
            sys.stderr.write(note + "\n")
            sys.stderr.flush()

    def at_exit():
        RECORDER.end(Ending.FINISHED)
        if tidy and RECORDER.ended is Ending.FINISHED:
            remove_if_ended_well(folder)

    def stopped(signum, frame):
        RECORDER.end(Ending.STOPPED, signal.Signals(signum).name)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    sys.excepthook = hook
    atexit.register(at_exit)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:  # never replace a handler of the script's own
        signal.signal(signal.SIGTERM, stopped)
