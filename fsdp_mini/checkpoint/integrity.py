"""A checkpoint directory is either complete and exactly as written, or loading it says what is wrong.

DCP (torch.distributed.checkpoint) writes one `.distcp` file per rank, then rank 0 writes `.metadata`: which
piece of which tensor lies at which bytes of which file. Alone, it leaves its user exposed. Flipped bytes in
a piece load silently as wrong weights (16 bytes flipped in one shard: a loss of 964 instead of 4.55). A
truncated or deleted file fails only when the read reaches it, and `FileSystemReader.read_data` fills each
tensor as it reads it (torch 2.13, filesystem.py), so the model may be half loaded by then; a truncated one
fails with a bare EOFError, a damaged `.metadata` with a bare UnpicklingError. A save in place over an older
checkpoint that crashes before `.metadata` (written last, `FileSystemWriter.finish`) leaves the old metadata
over the files rewritten so far, which load without an error. And DCP unpickles `.metadata` with plain
`pickle.load`, the non-tensor items (`optim.param_groups`, `extra_state`) with `torch.load(weights_only=False)`:
a crafted checkpoint runs its author's code (tests/library/test_checkpoint_integrity.py runs DCP on both:
the flipped bytes and the crafted pickles).

1. `save_atomically`: every rank writes into a fresh sibling, `.NAME.saving`, through `ChecksummingWriter`
   (DCP's file writer, which also takes the CRC-32 of every piece this rank wrote). Rank 0 writes
   `manifest.json` last (each file's size, each piece's bytes and CRC-32, `.metadata`'s size and CRC-32,
   and the CRC-32 of its own body), then commits: the old checkpoint is renamed to `.NAME.replaced`, the
   staging directory to NAME, and the old one deleted. Renames are atomic: NAME is the old checkpoint, or
   the complete new one, or (between the renames) absent with the old one whole aside, which loading NAME
   says and the next save undoes. All ranks return or raise together.
2. `open_checkpoint` (every rank, no collective): the manifest against its own checksum, `.metadata`'s
   bytes against the manifest, then `.metadata` unpickled allowing only DCP's metadata classes; DCP's load
   gets that object through `OpenedCheckpoint.reader()` rather than unpickling the file again.
3. `verify_pieces` (collective): every piece the load will read, each file by one rank, the verdicts
   shared, before any tensor is filled. A mismatch names the file and the piece.
4. `WeightsOnlyLoadPlanner`: the non-tensor items through `torch.load(weights_only=True)`.

CRC-32 catches every burst of up to 32 flipped bits and all but 2^-32 of other damage, what disks and copies
do, at about 2 GB/s (zlib). It proves integrity, not origin: whoever wrote a checkpoint wrote its manifest,
which is why the unpickling is restricted with or without `verify`.
"""
from __future__ import annotations

import contextlib
import copy
import enum
import io
import json
import mmap
import os
import pickle
import re
import shutil
import zlib
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
           "SaveStep", "ChecksummingWriter", "save_atomically", "OpenedCheckpoint", "open_checkpoint", "verify_pieces",
           "InPlaceLoadPlanner", "WeightsOnlyLoadPlanner", "weights_only_refusal", "staging_path", "replaced_path",
           "MANIFEST", "METADATA"]

MANIFEST = "manifest.json"
METADATA = ".metadata"  # DCP's name for its metadata file


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
    return path.with_name(f".{path.name}.saving")


def replaced_path(path: str | os.PathLike) -> Path:
    """Where the old checkpoint waits, during a commit, between being renamed away and being deleted."""
    path = Path(os.path.abspath(path))
    return path.with_name(f".{path.name}.replaced")


def _entries(directory: Path) -> tuple[list[str], list[str]]:
    """(files DCP or this module writes, other entries) of `directory`; both empty when it does not exist."""
    names = sorted(os.listdir(directory)) if directory.is_dir() else []
    ours = [n for n in names if re.fullmatch(r".*\.distcp|(__\d+)?\.metadata(\.tmp)?|manifest\.json(\.tmp)?", n)]
    return ours, [n for n in names if n not in ours]


def _fsync_dir(directory: Path) -> None:
    """Make the renames and new names in `directory` durable (DCP syncs the files, not the directory)."""
    with contextlib.suppress(OSError):  # where a directory cannot be opened or synced (Windows, some file systems)
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# --- checksums ---------------------------------------------------------------------------------------

def _crc32s(file: Path, ranges: list[tuple[int, int]]) -> list[str]:
    """The CRC-32 of each byte range (offset, length) of `file`, in hex. Through a memory map: zlib reads
    the page cache with no copy and without the GIL. A range past the end is checksummed as far as it goes
    (and so differs from the save's)."""
    with open(file, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:  # mmap refuses an empty file
            return [f"{0:08x}"] * len(ranges)
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped, memoryview(mapped) as view:
            return [f"{zlib.crc32(view[at:at + length]):08x}" for at, length in ranges]


class ChecksummingWriter(dcp.FileSystemWriter):
    """DCP's file writer (files synced to disk) that also takes the CRC-32 of every piece this rank wrote,
    read back from the page cache: what is in the file, not what was meant to go there. Inside DCP's write
    step, so a failure is reported by DCP on every rank; it lengthens the save by about a second per 1-2 GB
    this rank wrote (zlib's CRC-32 here). `files`: the manifest's entry of each file this rank wrote,
    {"size", "pieces": [{key, box offsets, byte offset "at", "bytes", "crc32"}]}."""

    def __init__(self, path: str | os.PathLike):
        super().__init__(path, overwrite=False)
        self.files: dict[str, dict[str, Any]] = {}

    def write_data(self, plan, planner):
        future = super().write_data(plan, planner)
        written = [(r.index, *storage_location(r.storage_data)) for r in future.wait()]  # written and synced
        for name in sorted({name for _, name, _, _ in written}):
            items = [(index, at, length) for index, n, at, length in written if n == name]
            crcs = _crc32s(Path(self.path) / name, [(at, length) for _, at, length in items])
            self.files[name] = {"size": (Path(self.path) / name).stat().st_size, "pieces": [
                {"key": index.fqn, "offsets": None if index.offset is None else list(index.offset),
                 "at": at, "bytes": length, "crc32": crc} for (index, at, length), crc in zip(items, crcs)]}
        return future


# --- the manifest --------------------------------------------------------------------------------------

def _crc32_of_body(body: dict) -> str:
    """The manifest's own checksum, over a canonical encoding: the same for the written dict and the parsed one."""
    return f"{zlib.crc32(json.dumps(body, sort_keys=True, separators=(',', ':')).encode()):08x}"


def _write_manifest(staging: Path, gathered: list[dict[str, dict[str, Any]]]) -> None:
    metadata = (staging / METADATA).read_bytes()
    body = {"format": "fsdp_mini checkpoint manifest 1",
            "metadata": {"size": len(metadata), "crc32": f"{zlib.crc32(metadata):08x}"},
            "files": dict(sorted(item for files in gathered for item in files.items()))}
    tmp = staging / f"{MANIFEST}.tmp"
    with open(tmp, "w") as f:
        json.dump({"crc32": _crc32_of_body(body), "body": body}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, staging / MANIFEST)
    _fsync_dir(staging)


def _read_manifest(path: Path) -> dict[str, Any]:
    """The manifest's body, checked against its own checksum."""
    try:
        envelope = json.loads((path / MANIFEST).read_bytes())
        if _crc32_of_body(envelope["body"]) == envelope["crc32"]:
            return envelope["body"]
    except (ValueError, KeyError, TypeError):  # not JSON (UnicodeDecodeError is a ValueError), or not ours
        pass
    raise CorruptCheckpointError(f"checkpoint {path} is damaged: its {MANIFEST} does not match its own "
                                 "checksum, so none of the checksums in it can be trusted")


# --- saving --------------------------------------------------------------------------------------------

def _check_target(path: Path, overwrite: bool) -> None:
    """Every rank, before any collective: may a save replace what is at `path`?"""
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"{path} is a file: a checkpoint is a directory")
    ours, others = _entries(path)
    if others:
        raise FileExistsError(f"{path} holds files that are not a checkpoint's ({', '.join(others[:6])}): a save "
                              "replaces the whole directory, so it writes only to a new or empty directory "
                              "or over a checkpoint")
    if (ours or (not path.exists() and _entries(replaced_path(path))[0])) and not overwrite:
        raise FileExistsError(f"a checkpoint already exists at {path}: pass overwrite=True to replace it "
                              "(the old one is kept until the new one is complete)")


def _on_rank0(step: Callable[[], None], doing: str) -> None:
    """Run `step` on rank 0 only and tell every rank how it went, so that all return or raise together:
    a failure on rank 0 (a full disk, a permission) cannot leave the others waiting in a collective."""
    error: Exception | None = None
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
    for leftover in (replaced, staging):  # a replaced one still there: NAME holds the newer checkpoint
        if leftover.exists():
            shutil.rmtree(leftover)
    staging.mkdir(parents=True)


def _commit(path: Path, gathered) -> None:
    """Rank 0, once every rank has written: the manifest, then the two renames, then the old one deleted."""
    staging, replaced = staging_path(path), replaced_path(path)
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
    checksummed, then committed to `path` (see the module's docstring). Before any collective, a
    FileExistsError when `path` holds a checkpoint and not `overwrite`, or files that are not a checkpoint's."""
    path = Path(os.path.abspath(path))
    _check_target(path, overwrite)
    # rank 0 rearranges the directory next (puts back an old checkpoint a crash left aside, drops leftovers): no
    # rank may still be reading it, or it finds a directory vanish between looking and listing
    dist.barrier()
    _on_rank0(lambda: _prepare(path), f"preparing to save {path}")
    _reached(SaveStep.BEFORE_DATA)
    writer = ChecksummingWriter(staging_path(path))
    write(writer)
    _reached(SaveStep.AFTER_DATA)
    gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(writer.files, gathered, dst=0)
    _on_rank0(lambda: _commit(path, gathered), f"committing the checkpoint {path}")


# --- loading -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class OpenedCheckpoint:
    """A checkpoint's DCP metadata (checked against the manifest, safely unpickled) and the manifest's body
    (None when the load does not verify)."""

    path: Path
    metadata: dcp_metadata.Metadata
    manifest: dict[str, Any] | None

    def reader(self) -> dcp.FileSystemReader:
        """DCP's file reader for this checkpoint, handing DCP this metadata rather than unpickling
        `.metadata` again with plain pickle."""
        return _OpenedReader(self)


class _OpenedReader(dcp.FileSystemReader):
    def __init__(self, opened: OpenedCheckpoint):
        super().__init__(opened.path)
        self._metadata = opened.metadata

    def read_metadata(self, *args: Any, **kwargs: Any) -> dcp_metadata.Metadata:
        metadata = copy.copy(self._metadata)  # with this load's id, as FileSystemReader.read_metadata records it
        metadata.storage_meta = replace(metadata.storage_meta or dcp_metadata.StorageMeta(), load_id=self.load_id)
        return metadata


class InPlaceLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner on a flat state dict, loaded in place. Flattening is off, and not offered:
    with flatten_sharded_tensors DefaultLoadPlanner loads into a copy of the dict, and with flatten_state_dict
    `optim.param_groups` would be split into one entry per value."""

    def __init__(self, *, allow_partial_load: bool = False):
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False,
                         allow_partial_load=allow_partial_load)


def weights_only_refusal(exc: pickle.UnpicklingError) -> str:
    """The line of `torch.load(weights_only=True)`'s refusal that names the global it refused."""
    return next((line.strip() for line in str(exc).splitlines() if "Unsupported" in line), str(exc))


class WeightsOnlyLoadPlanner(InPlaceLoadPlanner):
    """A non-tensor item (`optim.param_groups`, `extra_state`, an optimizer's plain value) unpickled with
    `torch.load(weights_only=True)`, not DCP's `weights_only=False`: tensors, plain containers, numbers and
    strings load; anything that could run code is an UnsafeCheckpointError naming the item and the global
    (allow a class of your own with `torch.serialization.add_safe_globals`)."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        key = read_item.dest_index.fqn
        try:
            self.state_dict[key] = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as exc:
            raise UnsafeCheckpointError(f"rank {dist.get_rank() if dist.is_initialized() else 0}: the checkpoint's "
                                        f"item {key!r} was refused by torch.load(weights_only=True), since "
                                        f"unpickling it could run code: {weights_only_refusal(exc)}") from exc


class _MetadataUnpickler(pickle.Unpickler):
    """pickle's Unpickler restricted to DCP's metadata ("Restricting Globals" in Python's pickle docs): a
    pickle can call only the globals it resolves, so refusing every other one refuses any code. Allowed:
    DCP_METADATA_GLOBALS, and the dtypes, layouts and memory formats pickled as `torch.<name>`."""

    def find_class(self, module: str, name: str):
        if (module, name) in DCP_METADATA_GLOBALS or (module == "torch" and isinstance(
                vars(torch).get(name), (torch.dtype, torch.layout, torch.memory_format))):
            return super().find_class(module, name)
        raise UnsafeCheckpointError(
            f"its {METADATA} asks for the global {module}.{name}, which is not one of DCP's metadata classes: "
            "refused, since unpickling it could run code (a checkpoint from an untrusted source can be crafted "
            "to). PyTorch's own DCP reader would unpickle it")


def open_checkpoint(path: str | os.PathLike, verify: bool = True) -> OpenedCheckpoint:
    """Read a checkpoint's manifest and metadata, checking both (no collective: every rank reads them).

    Raises IncompleteCheckpointError where no save committed (no `.metadata` and no manifest, or `path`
    missing beside an interrupted save's leftovers), CorruptCheckpointError for a damaged manifest or a
    damaged or missing `.metadata`, UnsafeCheckpointError for a `.metadata` that would run code, and
    CheckpointError for a checkpoint without a manifest (plain `dcp.save`'s) unless not `verify`.
    """
    path = Path(os.path.abspath(path))
    if not path.is_dir():  # as precisely as the leftovers of a save tell
        if _entries(replaced_path(path))[0]:
            raise IncompleteCheckpointError(
                f"no checkpoint at {path}: a save_checkpoint(overwrite=True) was interrupted between its two renames. "
                f"The previous checkpoint is whole in {replaced_path(path)}; the next save to {path} puts it back "
                f"first, or rename it to {path} yourself")
        if staging_path(path).exists():
            raise IncompleteCheckpointError(f"no checkpoint at {path}: the save into it was interrupted before it "
                                            f"committed (its partial files are in {staging_path(path)})")
        raise FileNotFoundError(f"no checkpoint directory at {path}")
    has_manifest, has_metadata = (path / MANIFEST).exists(), (path / METADATA).exists()
    if not has_manifest and not has_metadata:
        raise IncompleteCheckpointError(f"no complete checkpoint at {path}: it has no {METADATA} and no {MANIFEST} "
                                        "(the save there was interrupted, or none was made)")
    if not has_manifest and verify:
        raise CheckpointError(f"checkpoint {path} has no {MANIFEST}, so its contents cannot be verified (written "
                              "by plain dcp.save?): load_checkpoint(..., verify=False) loads it unverified")
    manifest = _read_manifest(path) if verify else None
    if not has_metadata:
        raise CorruptCheckpointError(f"checkpoint {path} is damaged: its {METADATA} is missing")
    data = (path / METADATA).read_bytes()
    crc, saved = f"{zlib.crc32(data):08x}", manifest and manifest["metadata"]
    if saved and (len(data), crc) != (saved["size"], saved["crc32"]):
        raise CorruptCheckpointError(f"checkpoint {path} is damaged: its {METADATA} is {len(data)} bytes with "
                                     f"CRC-32 {crc}, the save wrote {saved['size']} with {saved['crc32']}")
    try:
        metadata = _MetadataUnpickler(io.BytesIO(data)).load()
        if not isinstance(metadata, dcp_metadata.Metadata):
            raise TypeError(f"it holds a {type(metadata).__name__}, not DCP's Metadata")
    except UnsafeCheckpointError as exc:
        raise UnsafeCheckpointError(f"checkpoint {path}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - damaged bytes raise anything from UnpicklingError to MemoryError
        raise CorruptCheckpointError(f"checkpoint {path} is damaged: its {METADATA} cannot be read "
                                     f"({type(exc).__name__}: {exc})") from exc
    return OpenedCheckpoint(path, metadata, manifest)


def _check_file(path: Path, name: str, items: list, listed: dict[str, Any] | None) -> list[str]:
    """What is wrong with the pieces `items` (index, byte offset, length) of one file; [] if nothing."""
    if listed is None:
        return [f"{name} is not in the {MANIFEST}"]
    try:
        size = (path / name).stat().st_size
    except FileNotFoundError:
        return [f"{name} is missing"]
    if size != listed["size"]:
        return [f"{name} is {size} bytes, the save wrote {listed['size']} "
                f"({'truncated' if size < listed['size'] else 'grown'})"]
    saved = {(p["at"], p["bytes"]): p["crc32"] for p in listed["pieces"]}
    crcs = _crc32s(path / name, [(at, length) for _, at, length in items])
    return [f"{name}, piece {index.fqn!r}{'' if index.offset is None else f' (box at {tuple(index.offset)})'} at "
            f"bytes {at}-{at + length}: CRC-32 {crc}, the save wrote {saved.get((at, length), 'no such piece')}"
            for (index, at, length), crc in zip(items, crcs) if saved.get((at, length)) != crc]


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
            name, at, length = storage_location(info)
            by_file.setdefault(name, []).append((index, at, length))
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
