"""A checkpoint directory is either complete and exactly as written, or loading it says what is wrong.

torch.distributed.checkpoint (DCP) writes one `.distcp` file per rank into the target directory and then,
last, rank 0 writes `.metadata`: which piece of which tensor lies at which bytes of which file. On its
own that leaves two failures silent:

- Damage after the save. DCP reads whatever bytes lie at the recorded offsets: a flipped bit on a disk or
  in a copy loads as wrong weights (16 flipped bytes in one shard gave a loss of 964 instead of 4.55),
  and a damaged `.metadata` fails with a bare `UnpicklingError`.
- A crash during the save. Written in place over an older checkpoint, a crash after the data files but
  before `.metadata` leaves the old metadata describing the new data: training resumes, silently, with
  new weights under the old step.

So a save takes three steps here (`save_atomically`), and a load checks before it fills anything:

1. Staging. Every rank writes into a fresh sibling directory, `.NAME.saving`, never into NAME itself.
   DCP's file writer, extended (`ChecksummingWriter`), reads back every piece this rank wrote (from the
   page cache, right after writing it) and computes its CRC-32, on a thread, while the rank waits anyway
   for the disk's fsync and then for the other ranks: the save hardly waits for it. Rank 0 gathers the
   checksums and writes `manifest.json`: each file's size, each piece's key, byte range and CRC-32, and
   the size and CRC-32 of `.metadata`; the manifest carries the CRC-32 of its own body. It is written
   last, after every rank has written and `.metadata` is complete.
2. Commit, by rank 0 alone: the old checkpoint (if any) is renamed to `.NAME.replaced`, the staging
   directory to NAME, and then the old one is deleted. A rename is atomic, so at every instant NAME is
   the old checkpoint, or the complete new one, or, between the two renames, absent: then the old one
   is whole under `.NAME.replaced`, loading NAME says so, and the next save puts it back first. Every
   rank returns only once the commit is done, and all raise together if it failed.
3. Loading (`open_checkpoint`, then `verify_pieces`): the manifest against its own checksum, then
   `.metadata`'s bytes against the manifest before they are unpickled, then every piece the load will
   read, each file by one rank and the verdicts shared, before any tensor of the model or the optimizer
   is touched. A mismatch names the file and the piece.

Why CRC-32: it catches every burst of up to 32 flipped bits and all but 2^-32 of other damage, which is
what disks and transfers do to files; it is no defence against someone who alters a file on purpose (a
signature is). zlib's is the fastest checksum in Python's standard library: about 2 GB/s here.

A checkpoint cannot run code. A CRC proves integrity, not origin: whoever wrote a checkpoint also wrote
its manifest. And a pickle runs whatever it names: PyTorch's own DCP reader unpickles `.metadata` with
plain `pickle.load` and every non-tensor item (`optim.param_groups`, `extra_state`) with
`torch.load(weights_only=False)`, so a checkpoint from an untrusted source executes its author's code
when it is loaded. Here, unlike in PyTorch, every pickle of the load is restricted:

- `.metadata` is read by `open_checkpoint` with an unpickler that resolves only DCP's metadata classes and
  the few harmless globals they pickle (torch.Size, dtypes, layouts, paths; `_METADATA_GLOBALS`); any other
  global is an UnsafeCheckpointError naming it, raised before the global is even imported. DCP's load then
  takes that metadata object from `OpenedCheckpoint.reader()` instead of unpickling the file again.
- The non-tensor items go through `WeightsOnlyLoadPlanner`: `torch.load(weights_only=True)`, PyTorch's own
  restricted unpickler (tensors, plain containers and numbers, and what `torch.serialization.
  add_safe_globals` allows); a refusal is an UnsafeCheckpointError naming the item and the global.
- Tensors DCP already reads with `torch.load(weights_only=True)`; the manifest is JSON.
"""
from __future__ import annotations

import copy
import enum
import io
import json
import mmap
import os
import pickle
import shutil
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from fsdp_mini.torch_internals import DCP_METADATA_GLOBALS, storage_location

__all__ = ["CheckpointError", "CorruptCheckpointError", "IncompleteCheckpointError", "UnsafeCheckpointError",
           "SaveStep", "ChecksummingWriter", "OpenedCheckpoint", "InPlaceLoadPlanner", "WeightsOnlyLoadPlanner", "save_atomically",
           "open_checkpoint", "verify_pieces",
           "crc32_of_ranges", "staging_path", "replaced_path", "MANIFEST", "METADATA"]

MANIFEST = "manifest.json"
METADATA = ".metadata"  # DCP's name for its metadata file
MANIFEST_FORMAT = "fsdp_mini checkpoint manifest 1"


class CheckpointError(RuntimeError):
    """A checkpoint directory that cannot be loaded as it is; the message says why and what to do."""


class CorruptCheckpointError(CheckpointError):
    """The files differ from what the save wrote: one is missing or truncated, or a checksum differs."""


class IncompleteCheckpointError(CheckpointError):
    """No committed checkpoint where one was expected: the save that should have written it was interrupted."""


class UnsafeCheckpointError(CheckpointError):
    """A pickle in the checkpoint names a global that a checkpoint has no need of: unpickling it could run
    code (a crafted checkpoint does exactly that), so it is refused before that global is resolved."""


class SaveStep(enum.Enum):
    """The points of a save between which a crash leaves a different state on disk (NAME: the target)."""

    BEFORE_DATA = "staging directory ready, nothing written"  # NAME: the old checkpoint
    AFTER_DATA = "data and .metadata staged, no manifest yet"  # NAME: the old checkpoint
    BEFORE_COMMIT = "staging complete with its manifest, not renamed yet"  # NAME: the old checkpoint
    BETWEEN_RENAMES = "old one renamed away, new one not in place yet"  # NAME absent, the old one whole aside
    BEFORE_CLEANUP = "new one in place, old one not deleted yet"  # NAME: the new checkpoint


def _reached(step: SaveStep) -> None:
    """Called at each step of a save; does nothing. Tests replace it to crash a rank at that point."""


def staging_path(path: str | os.PathLike) -> Path:
    """Where a save into `path` writes before it commits: a hidden sibling, on the same file system."""
    path = Path(os.path.abspath(path))
    return path.parent / f".{path.name}.saving"


def replaced_path(path: str | os.PathLike) -> Path:
    """Where the old checkpoint waits, during a commit, between being renamed away and being deleted."""
    path = Path(os.path.abspath(path))
    return path.parent / f".{path.name}.replaced"


def _is_checkpoint_file(name: str) -> bool:
    """A file DCP or this module writes into a checkpoint directory."""
    return name.endswith(".distcp") or name in (METADATA, f"{METADATA}.tmp", MANIFEST, f"{MANIFEST}.tmp") \
        or (name.startswith("__") and name.endswith((METADATA, f"{METADATA}.tmp")))  # DCP's per-rank metadata


def _entries(directory: Path) -> tuple[list[str], list[str]]:
    """(checkpoint files, other entries) of `directory`; both empty when it does not exist."""
    if not directory.is_dir():
        return [], []
    names = sorted(os.listdir(directory))
    return [n for n in names if _is_checkpoint_file(n)], [n for n in names if not _is_checkpoint_file(n)]


def _listed(items: list[str], limit: int = 6) -> str:
    more = f", ... ({len(items) - limit} more)" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def _fsync_dir(directory: Path) -> None:
    """Make the renames and new names in `directory` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_file(file: Path) -> None:
    """Flush a written file to the disk (fsync applies to the file, through any descriptor of it)."""
    fd = os.open(file, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- checksums ---------------------------------------------------------------------------------------

def crc32_of_ranges(file: str | os.PathLike, ranges: list[tuple[int, int]]) -> list[int]:
    """The CRC-32 of each byte range (offset, length) of `file`. A range past the end raises EOFError.

    Through a memory map: zlib reads the page cache directly, with no copy (a third faster than reading
    into a buffer here), and releases the GIL while it runs."""
    if not ranges:
        return []
    with open(file, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        end = max(offset + length for offset, length in ranges)
        if end > size:
            raise EOFError(f"{file} is {size} bytes, a piece ends at byte {end}")
        if size == 0:
            return [0] * len(ranges)
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)
            try:
                return [zlib.crc32(view[offset:offset + length]) for offset, length in ranges]
            finally:
                view.release()  # before the map closes: an exported view would keep it open


def _hex(crc: int) -> str:
    return f"{crc:08x}"


def _piece_name(key: str, offsets) -> str:
    return f"{key!r} (box at {tuple(offsets)})" if offsets else repr(key)


class ChecksummingWriter(dcp.FileSystemWriter):
    """DCP's file writer that also computes the CRC-32 of every piece this rank wrote.

    Once DCP has written this rank's files, each piece is read back from the page cache and checksummed.
    Reading back checks what is in the file, not what was meant to go there (DCP writes each tensor as a
    small `torch.save` archive, not as its raw bytes). The checksums cost CPU time only, so they run on a
    thread while the rank waits anyway: for the disk, which this writer flushes itself (fsync, what
    DCP's `sync_files` does, but after the write rather than inside it, so the two overlap), and then
    for the other ranks and rank 0's `.metadata`. `checksums()` waits for them and returns (file sizes,
    pieces), a piece being {file, key, box offsets, byte offset, length, CRC-32}.
    """

    def __init__(self, path: str | os.PathLike):
        super().__init__(path, overwrite=False, sync_files=False)  # synced below, beside the checksums
        self._checksums: Future | None = None

    def write_data(self, plan, planner):
        future = super().write_data(plan, planner)
        written = [(r.index, r.storage_data) for r in future.wait()]  # DCP's file writer has written already
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-crc32")
        self._checksums = pool.submit(self._checksum, written)
        pool.shutdown(wait=False)  # the thread ends when its one task does
        for name in sorted({storage_location(info)[0] for _, info in written}):
            _fsync_file(Path(self.path) / name)
        return future

    def finish(self, metadata, results) -> None:
        super().finish(metadata, results)
        _fsync_file(Path(self.path) / METADATA)

    def _checksum(self, written) -> tuple[dict[str, int], list[dict[str, Any]]]:
        by_file: dict[str, list] = {}
        for index, info in written:
            name, offset, length = storage_location(info)
            by_file.setdefault(name, []).append((index, offset, length))
        sizes, pieces = {}, []
        for name, items in by_file.items():
            file = Path(self.path) / name
            sizes[name] = file.stat().st_size
            crcs = crc32_of_ranges(file, [(offset, length) for _, offset, length in items])
            for (index, offset, length), crc in zip(items, crcs):
                pieces.append({"file": name, "key": index.fqn,
                               "offsets": None if index.offset is None else list(index.offset),
                               "at": offset, "bytes": length, "crc32": _hex(crc)})
        return sizes, pieces

    def checksums(self) -> tuple[dict[str, int], list[dict[str, Any]]]:
        """(size of each file this rank wrote, its pieces with their CRC-32), once they are computed."""
        return ({}, []) if self._checksums is None else self._checksums.result()


# --- the manifest --------------------------------------------------------------------------------------

def _canonical(body: dict) -> bytes:
    """The bytes the manifest's checksum covers: the same for the writer's dict and the reader's parse."""
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def _write_manifest(staging: Path, gathered: list[tuple[dict[str, int], list[dict[str, Any]]]]) -> None:
    files: dict[str, dict[str, Any]] = {}
    for sizes, pieces in gathered:
        for name, size in sizes.items():
            files.setdefault(name, {"size": size, "pieces": []})
        for piece in pieces:
            files[piece["file"]]["pieces"].append({k: v for k, v in piece.items() if k != "file"})
    metadata = (staging / METADATA).read_bytes()
    body = {"format": MANIFEST_FORMAT, "checksum": "crc32", "world_size": len(gathered),
            "metadata": {"file": METADATA, "size": len(metadata), "crc32": _hex(zlib.crc32(metadata))},
            "files": {name: files[name] for name in sorted(files)}}
    text = json.dumps({"crc32": _hex(zlib.crc32(_canonical(body))), "body": body}, indent=1)
    tmp = staging / f"{MANIFEST}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, staging / MANIFEST)
    _fsync_dir(staging)


def _read_manifest(path: Path) -> dict[str, Any]:
    """The manifest's body, checked against its own checksum."""
    try:
        envelope = json.loads((path / MANIFEST).read_bytes())
        body, stated = envelope["body"], envelope["crc32"]
        intact = _hex(zlib.crc32(_canonical(body))) == stated
    except (ValueError, KeyError, TypeError):  # not JSON (UnicodeDecodeError is a ValueError), or not ours
        intact = False
    if not intact:
        raise CorruptCheckpointError(f"checkpoint {path} is damaged: its {MANIFEST} does not match its own "
                                     "checksum, so none of the checksums in it can be trusted")
    if body.get("format") != MANIFEST_FORMAT:
        raise CheckpointError(f"checkpoint {path}: its {MANIFEST} has the format {body.get('format')!r}, this "
                              f"fsdp_mini reads {MANIFEST_FORMAT!r}")
    return body


# --- saving --------------------------------------------------------------------------------------------

def _check_target(path: Path, overwrite: bool) -> None:
    """Every rank, before any collective: may a save replace what is at `path`?"""
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"{path} is a file: a checkpoint is a directory")
    ours, others = _entries(path)
    if others:
        raise FileExistsError(f"{path} holds files that are not a checkpoint's ({_listed(others)}): a save "
                              "replaces the whole directory, so it writes only to a new or empty directory "
                              "or over a checkpoint")
    old = ours or (not path.exists() and _entries(replaced_path(path))[0])
    if old and not overwrite:
        raise FileExistsError(f"a checkpoint already exists at {path}: pass overwrite=True to replace it "
                              "(the old one is kept until the new one is complete)")


def _on_rank0(step: Callable[[], None], doing: str) -> None:
    """Run `step` on rank 0 only and tell every rank how it went, so that all return or raise together:
    a failure on rank 0 (a full disk, a permission) cannot leave the others waiting in a collective."""
    error: BaseException | None = None
    if dist.get_rank() == 0:
        try:
            step()
        except Exception as exc:  # noqa: BLE001 - reported to every rank, then raised here as it is
            error = exc
    box = [None if error is None else f"{type(error).__name__}: {error}"]
    dist.broadcast_object_list(box, src=0)
    if error is not None:
        raise error
    if box[0] is not None:
        raise CheckpointError(f"{doing} failed on rank 0: {box[0]}")


def _prepare(path: Path) -> None:
    """Rank 0, before anything is written: put back an old checkpoint that a save interrupted between its
    renames left aside, drop what interrupted saves left behind, and create a fresh staging directory."""
    staging, replaced = staging_path(path), replaced_path(path)
    if not path.exists() and _entries(replaced)[0]:
        os.rename(replaced, path)
    elif replaced.exists():
        shutil.rmtree(replaced)  # NAME holds the newer checkpoint: this one was about to be deleted
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)


def _commit(path: Path, gathered) -> None:
    """Rank 0, once every rank has written: the manifest, then the two renames, then the old one deleted."""
    staging, replaced = staging_path(path), replaced_path(path)
    failed = [g for g in gathered if isinstance(g, str)]
    if failed:
        raise CheckpointError("; ".join(failed) + f" (nothing was committed: {path} is as it was)")
    _write_manifest(staging, gathered)
    _reached(SaveStep.BEFORE_COMMIT)
    had_old = path.exists()
    if had_old:
        os.rename(path, replaced)
    _reached(SaveStep.BETWEEN_RENAMES)
    try:
        os.rename(staging, path)
    except OSError:
        if had_old:  # put the old one back rather than leave NAME absent
            os.rename(replaced, path)
        raise
    _fsync_dir(path.parent)
    _reached(SaveStep.BEFORE_CLEANUP)
    shutil.rmtree(replaced, ignore_errors=True)


def save_atomically(path: str | os.PathLike, write: Callable[[dcp.FileSystemWriter], Any], *,
                    overwrite: bool) -> None:
    """Collective: `write(writer)` (every rank: a `dcp.save` through `writer`) into a staging directory,
    checksummed, then committed to `path` as described in this module's docstring.

    Raises FileExistsError, before any collective, when `path` holds a checkpoint and not `overwrite`,
    or holds files that are not a checkpoint's (they would be deleted with the old checkpoint).
    """
    path = Path(os.path.abspath(path))
    _check_target(path, overwrite)
    _on_rank0(lambda: _prepare(path), f"preparing to save {path}")
    _reached(SaveStep.BEFORE_DATA)
    writer = ChecksummingWriter(staging_path(path))
    write(writer)
    _reached(SaveStep.AFTER_DATA)
    try:
        mine: Any = writer.checksums()
    except Exception as exc:  # noqa: BLE001 - sent to rank 0, which then fails the save on every rank
        mine = f"checksumming on rank {dist.get_rank()} failed: {type(exc).__name__}: {exc}"
    gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    _on_rank0(lambda: _commit(path, gathered), f"committing the checkpoint {path}")


# --- loading -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class OpenedCheckpoint:
    """A checkpoint's DCP metadata (checked against the manifest) and the manifest's body (None when
    the load does not verify)."""

    path: Path
    metadata: Any  # torch.distributed.checkpoint.metadata.Metadata
    manifest: dict[str, Any] | None

    def reader(self) -> dcp.FileSystemReader:
        """DCP's file reader for this checkpoint, handing DCP this (checked, safely unpickled) metadata
        rather than unpickling `.metadata` again with plain pickle."""
        return _OpenedReader(self)


class _OpenedReader(dcp.FileSystemReader):
    def __init__(self, opened: OpenedCheckpoint):
        super().__init__(opened.path)
        self._metadata = opened.metadata

    def read_metadata(self, *args: Any, **kwargs: Any):
        if kwargs.get("rank") is not None:  # DCP's fallback to per-rank metadata: not what was checked
            raise FileNotFoundError("only the checkpoint's global .metadata is read")
        metadata = copy.copy(self._metadata)
        metadata.storage_meta = replace(metadata.storage_meta or dcp_metadata.StorageMeta(),
                                        load_id=self.load_id)  # what FileSystemReader.read_metadata records
        return metadata


class InPlaceLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner restricted to what fsdp_mini's loads need: a flat state dict, loaded in
    place. With flatten_sharded_tensors, DefaultLoadPlanner loads into a copy of the dict, so an item would
    never reach the caller's dict (DCP's default planner has that trap too when flatten_state_dict is
    False); asking for either is a ValueError naming the planner."""

    def __init__(self, flatten_state_dict: bool = False, flatten_sharded_tensors: bool = False,
                 allow_partial_load: bool = False):
        if flatten_state_dict or flatten_sharded_tensors:
            raise ValueError(f"{type(self).__name__} loads a flat state dict in place: flatten_state_dict and "
                             "flatten_sharded_tensors must be False")
        super().__init__(False, False, allow_partial_load)


class WeightsOnlyLoadPlanner(InPlaceLoadPlanner):
    """DCP's default load planner (flat, in place), but a non-tensor item (`optim.param_groups`, `extra_state`, an
    optimizer's plain value) is unpickled with `torch.load(weights_only=True)` instead of
    `weights_only=False`: plain containers, numbers, strings and tensors load, anything that could run
    code is an UnsafeCheckpointError naming the item and the global (allow a class of your own with
    `torch.serialization.add_safe_globals`)."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        key = read_item.dest_index.fqn
        try:
            loaded = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as exc:
            why = next((line.strip() for line in str(exc).splitlines() if "Unsupported" in line), str(exc))
            raise UnsafeCheckpointError(f"rank {dist.get_rank() if dist.is_initialized() else 0}: the checkpoint's "
                                        f"item {key!r} was refused by torch.load(weights_only=True), since "
                                        f"unpickling it could run code: {why}") from exc
        self.state_dict[key] = loaded


def _missing(path: Path) -> Exception:
    """Why there is no checkpoint directory at `path`, as precisely as the leftovers of a save tell."""
    staging, replaced = staging_path(path), replaced_path(path)
    if path.exists():
        return NotADirectoryError(f"{path} is a file, not a checkpoint directory")
    if _entries(replaced)[0]:
        new = f", and the new one, complete, in {staging}" if (staging / MANIFEST).exists() else ""
        return IncompleteCheckpointError(
            f"no checkpoint at {path}: a save_checkpoint(overwrite=True) was interrupted between its two renames. "
            f"The previous checkpoint is whole in {replaced}{new}; the next save to {path} puts the previous one "
            f"back first, or rename one of them to {path} yourself")
    if staging.exists():
        return IncompleteCheckpointError(f"no checkpoint at {path}: the save into it was interrupted before it "
                                         f"committed (its partial files are in {staging})")
    return FileNotFoundError(f"no checkpoint at {path}: the directory does not exist")


def _is_tensor_attribute(module: str, name: str) -> bool:
    """`torch.float32` and friends: a dtype, layout or memory format is pickled as the global naming it."""
    return module == "torch" and isinstance(vars(torch).get(name), (torch.dtype, torch.layout, torch.memory_format))


class _MetadataUnpickler(pickle.Unpickler):
    """pickle's Unpickler restricted to DCP's metadata ("Restricting Globals" in Python's pickle docs): a
    pickle can call only the globals it resolves, so refusing every other one refuses any code."""

    def __init__(self, file, path: Path):
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str):
        if (module, name) in DCP_METADATA_GLOBALS or _is_tensor_attribute(module, name):
            return super().find_class(module, name)
        raise UnsafeCheckpointError(
            f"checkpoint {self.path}: its {METADATA} asks for the global {module}.{name}, which is not one of DCP's "
            "metadata classes: refused, since unpickling it could run code (a checkpoint from an untrusted "
            "source can be crafted to). PyTorch's own DCP reader would unpickle it")


def _unpickle_metadata(path: Path, data: bytes):
    try:
        metadata = _MetadataUnpickler(io.BytesIO(data), path).load()
    except UnsafeCheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - damaged bytes raise anything from UnpicklingError to MemoryError
        raise CorruptCheckpointError(f"checkpoint {path} is damaged: its {METADATA} cannot be read "
                                     f"({type(exc).__name__}: {exc})") from exc
    if not (hasattr(metadata, "state_dict_metadata") and hasattr(metadata, "storage_data")):
        raise CorruptCheckpointError(f"checkpoint {path} is damaged: its {METADATA} holds a "
                                     f"{type(metadata).__name__}, not DCP's metadata")
    return metadata


def open_checkpoint(path: str | os.PathLike, verify: bool = True) -> OpenedCheckpoint:
    """Read a checkpoint's manifest and metadata, checking both (no collective: every rank reads them).

    Raises IncompleteCheckpointError for a save that never committed (no metadata, or `path` missing
    with an interrupted save's leftovers beside it), CorruptCheckpointError for a damaged or missing
    manifest or `.metadata`, and CheckpointError for a checkpoint without a manifest unless not `verify`
    (one written by plain `dcp.save`: nothing to verify it against).
    """
    path = Path(os.path.abspath(path))
    if not path.is_dir():
        raise _missing(path)
    ours, _ = _entries(path)
    staged = path.name.startswith(".") and path.name.endswith(".saving")
    manifest = _read_manifest(path) if MANIFEST in ours else None
    if manifest is None and METADATA not in ours:
        if staged:
            why = "it is the staging directory of a save that did not commit"
        elif ours:
            why = (f"it has data files ({_listed(ours)}) but no {METADATA} and no {MANIFEST}: the save that wrote "
                   "them was interrupted")
        else:
            why = "it is empty: no save finished there"
        raise IncompleteCheckpointError(f"no complete checkpoint at {path}: {why}")
    if manifest is None and verify:
        raise CheckpointError(f"checkpoint {path} has no {MANIFEST}, so its contents cannot be verified: it was "
                              f"written by plain dcp.save (or an older fsdp_mini), or its {MANIFEST} was deleted. "
                              "load_checkpoint(..., verify=False) loads it unverified")
    if METADATA not in ours:
        raise CorruptCheckpointError(f"checkpoint {path} is damaged: its {METADATA} is missing, though its "
                                     f"{MANIFEST} lists it (deleted after the save?)")
    data = (path / METADATA).read_bytes()
    if manifest is not None and verify:
        expected = manifest["metadata"]
        if len(data) != expected["size"] or _hex(zlib.crc32(data)) != expected["crc32"]:
            raise CorruptCheckpointError(
                f"checkpoint {path} is damaged: its {METADATA} is {len(data)} bytes with CRC-32 "
                f"{_hex(zlib.crc32(data))}, the save wrote {expected['size']} bytes with CRC-32 {expected['crc32']}")
    return OpenedCheckpoint(path, _unpickle_metadata(path, data), manifest if verify else None)


def _check_file(path: Path, name: str, items: list, listed: dict[str, Any] | None) -> list[str]:
    """What is wrong with the pieces `items` (index, byte offset, length) of one file; [] if nothing."""
    if listed is None:
        return [f"{name} is not in the {MANIFEST}"]
    file = path / name
    try:
        size = file.stat().st_size
    except FileNotFoundError:
        return [f"{name} is missing"]
    if size != listed["size"]:
        how = "truncated" if size < listed["size"] else "grown"
        return [f"{name} is {size} bytes, the save wrote {listed['size']} ({how})"]
    recorded = {p["at"]: p for p in listed["pieces"]}
    crcs = crc32_of_ranges(file, [(offset, length) for _, offset, length in items])
    problems = []
    for (index, offset, length), crc in zip(items, crcs):
        piece = recorded.get(offset)
        where = f"{name}, piece {_piece_name(index.fqn, index.offset)} at bytes {offset}-{offset + length}"
        if piece is None or piece["bytes"] != length or piece["key"] != index.fqn:
            problems.append(f"{where}: not in the {MANIFEST}")
        elif _hex(crc) != piece["crc32"]:
            problems.append(f"{where}: CRC-32 {_hex(crc)}, the save wrote {piece['crc32']}")
    return problems


def verify_pieces(opened: OpenedCheckpoint, wanted: Callable[[str], bool]) -> None:
    """Collective: check every piece whose key is `wanted` against the manifest, before anything is loaded.

    The files are shared out among the ranks (each file checked by one), and the verdicts gathered, so
    that every rank raises the same CorruptCheckpointError, naming each damaged file and piece, or none
    does. A no-op for a checkpoint opened without verification.
    """
    if opened.manifest is None:
        return
    by_file: dict[str, list] = {}
    for index, info in opened.metadata.storage_data.items():
        if wanted(index.fqn):
            name, offset, length = storage_location(info)
            by_file.setdefault(name, []).append((index, offset, length))
    rank, world = dist.get_rank(), dist.get_world_size()
    problems: list[str] = []
    for name in sorted(by_file)[rank::world]:
        try:
            problems += _check_file(opened.path, name, by_file[name], opened.manifest["files"].get(name))
        except Exception as exc:  # noqa: BLE001 - an unreadable file is a verdict, not a reason to hang the others
            problems.append(f"{name} cannot be read ({type(exc).__name__}: {exc})")
    everyone: list[list[str] | None] = [None] * world
    dist.all_gather_object(everyone, problems)
    problems = sorted(p for found in everyone for p in found)
    if problems:
        more = f"; ... ({len(problems) - 5} more)" if len(problems) > 5 else ""
        raise CorruptCheckpointError(f"checkpoint {opened.path} is damaged, nothing was loaded: "
                                     + "; ".join(problems[:5]) + more)
