"""Every private PyTorch name fsdp_mini uses, each in one place with the reason it is needed.

A private name can change in any torch release. Keeping them here means one file to read when torch is
upgraded, and `tests/library/test_torch_internals.py` calls each one, so a release that drops or changes one
fails there, by name, instead of somewhere deep inside a training step. PyTorch's own FSDP uses the same
ones (FSDP1 and FSDP2, torch 2.13), which is why they are safe enough to rely on.
"""
from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor
# pytree flattens and rebuilds nested inputs and outputs (tuples, dicts, namedtuples): a private module, public
# in practice (FSDP2 and HuggingFace rely on it); fsdp_mini.nested is its one user.
from torch.utils import _pytree as pytree

__all__ = ["pytree", "new_dtensor", "registered_parameter", "set_registered_parameter", "unregister_parameter",
           "set_registered_buffer", "warm_dynamo", "storage_location", "DCP_METADATA_GLOBALS", "version_of",
           "restore_version", "queue_after_backward", "chunk_cat_into", "dtensor_spec", "in_backward",
           "save_own_state"]


def version_of(tensor: torch.Tensor) -> int:
    """The tensor's version counter (`Tensor._version`): how many in-place writes it has had, which autograd
    compares with the count it saw when it saved the tensor."""
    return tensor._version


def restore_version(tensor: torch.Tensor, version: int) -> None:
    """Set `tensor`'s version counter back to `version`. Refilling a freed gathered buffer is an in-place
    write that bumps the counter, and autograd then refuses the tensors it saved from that buffer in
    forward, although their values are the same again. FSDP1 and FSDP2 restore the counter the same way
    (`torch._C._autograd._unsafe_set_version_counter`)."""
    torch._C._autograd._unsafe_set_version_counter((tensor,), (version,))


def chunk_cat_into(tensors: list[torch.Tensor], num_chunks: int, out: torch.Tensor) -> None:
    """Pad each tensor's dim 0 to `num_chunks` equal chunks and write chunk r of every tensor, in order, into
    row r of `out`, casting to its dtype: one kernel for a unit's gradients before its ReduceScatter
    (`torch._chunk_cat`, what FSDP2's `foreach_reduce` calls), instead of a pad and a concatenation each."""
    torch._chunk_cat(tensors, dim=0, num_chunks=num_chunks, out=out)


def dtensor_spec(tensor: DTensor):
    """A DTensor's placement spec (`DTensor._spec`), kept so that gradients can be wrapped as DTensors of the
    same layout with the DTensor constructor, without `DTensor.from_local`'s checks and autograd node on
    every step (FSDP2 builds its gradients from the spec the same way)."""
    return tensor._spec


def queue_after_backward(callback) -> None:
    """Run `callback` once the current backward has finished (`Variable._execution_engine.queue_callback`),
    called from inside a backward hook. Both engines end a step there: wait for the last reductions and free
    what is still gathered. FSDP1 and FSDP2 use the same call; no public API has this moment."""
    torch.autograd.Variable._execution_engine.queue_callback(callback)


def in_backward() -> bool:
    """Whether autograd is running a backward on this thread now (`torch._C._current_graph_task_id`, -1
    outside one): how the flight recorder and the memory ledger tell a backward's collectives and
    allocations from a forward's, which no public API tells."""
    return torch._C._current_graph_task_id() != -1


def new_dtensor(local: torch.Tensor, spec) -> DTensor:
    """A DTensor of `local` with the layout `spec` (from `dtensor_spec`), through DTensor's own constructor
    (`DTensor(local, spec, requires_grad=...)`, which PyTorch documents as private: use `from_local`). Each
    step's gradient shard is wrapped this way: no checks and no autograd node, ~20x cheaper than
    `DTensor.from_local` on CPU, paid per parameter per step; FSDP2 builds its gradients the same way."""
    return DTensor(local, spec, requires_grad=False)


# A module's parameters and buffers live in its `_parameters` / `_buffers` dicts. Both FSDP designs swap
# what a module sees (the sharded parameter, the gathered one, a flat view) several times a step, and must do
# it without `nn.Module.__setattr__`, which refuses a plain tensor where a Parameter was and runs its checks
# on every swap; FSDP1 and FSDP2 write the same dicts.

def registered_parameter(module: torch.nn.Module, name: str):
    """What `module._parameters[name]` holds now (a DTensor, a gathered Parameter, a plain view)."""
    return module._parameters[name]


def set_registered_parameter(module: torch.nn.Module, name: str, tensor: torch.Tensor) -> None:
    """Put `tensor` in the module's parameter slot `name`: a plain swap, no `__setattr__` checks."""
    module._parameters[name] = tensor


def unregister_parameter(module: torch.nn.Module, name: str) -> None:
    """Remove parameter `name` from the module (it becomes a plain attribute, set afterwards)."""
    del module._parameters[name]


def set_registered_buffer(module: torch.nn.Module, name: str, tensor: torch.Tensor) -> None:
    """Replace buffer `name` (materialised from the meta device, or moved) keeping it registered, with its
    persistence as it was: `register_buffer` would reset that."""
    module._buffers[name] = tensor


def save_own_state(module: torch.nn.Module, destination: dict, prefix: str) -> None:
    """Put `module`'s own entries of its state dict (its parameters, persistent buffers and extra state, not
    its children's) into `destination` under `prefix`, as they are (`nn.Module._save_to_state_dict` with
    keep_vars): what `state_dict()` does for one module before it recurses. A model that holds FSDP parts
    lists its own tensors this way, without the FSDP parts' `state_dict()`, which would gather them."""
    module._save_to_state_dict(destination, prefix, True)


def warm_dynamo() -> None:
    """Import `torch._dynamo` now: a torch optimizer's first `step()` imports it lazily (1-6 s on a busy
    machine), and `launch` imports it once in the parent so that forked ranks inherit it."""
    import torch._dynamo  # noqa: F401


def storage_location(info) -> tuple[str, int, int]:
    """(file, offset, length) of one item of a DCP checkpoint: the fields of the file system writer's
    `_StorageInfo` (torch/distributed/checkpoint/filesystem.py), private, which `Metadata.storage_data` and
    each `WriteResult.storage_data` hold; the checkpoint's checksums cover exactly these bytes."""
    return info.relative_path, info.offset, info.length


def _dcp_metadata_globals() -> frozenset:
    from torch.distributed.checkpoint import metadata as dcp_metadata

    return frozenset(
        {("torch.distributed.checkpoint.metadata", cls.__name__) for cls in (
            dcp_metadata.Metadata, dcp_metadata.MetadataIndex, dcp_metadata.StorageMeta,
            dcp_metadata.TensorProperties, dcp_metadata.TensorStorageMetadata, dcp_metadata.BytesStorageMetadata,
            dcp_metadata.ChunkStorageMetadata)}
        | {("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"),
           ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
           ("torch", "Size"), ("torch.serialization", "_get_layout"), ("collections", "OrderedDict")}
        | {("pathlib", cls) for cls in ("Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath",
                                        "PureWindowsPath")})


# Every global that DCP's pickled `.metadata` names: its dataclasses (`metadata.py`), the file reader's private
# `_StorageInfo` (where each item lies) and `_MEM_FORMAT_ENCODING`, and what their fields hold: torch.Size, a
# layout (pickled through the private `torch.serialization._get_layout`, a lookup by name), the checkpoint_id
# path. Each is harmless to call with any arguments: a constructor of plain data or a lookup.
# `fsdp_mini.checkpoint.integrity` unpickles `.metadata` allowing these only.
DCP_METADATA_GLOBALS = _dcp_metadata_globals()
