"""Every private PyTorch name fsdp_mini uses, each in one place with the reason it is needed.

A private name can change in any torch release. Keeping them here means one file to read when torch is
upgraded, and `tests/library/test_torch_internals.py` calls each one, so a release that drops or changes one
fails there, by name, instead of somewhere deep inside a training step. PyTorch's own FSDP uses the same
ones (FSDP1 and FSDP2, torch 2.13), which is why they are safe enough to rely on.
"""
from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor

# `torch.distributed.checkpoint` saves an arbitrary set of boxes per rank only through the deprecated
# ShardedTensor (a DTensor's shards must be the even pieces of a device mesh; the flat design's are not),
# so fsdp_mini.checkpoint builds them. Re-exported from here so that no other module names the package.
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor, ShardedTensorMetadata
from torch.distributed._shard.sharded_tensor.metadata import TensorProperties

__all__ = ["version_of", "restore_version", "queue_after_backward", "chunk_cat_into", "dtensor_spec", "in_backward", "ShardMetadata", "Shard",
           "ShardedTensor", "ShardedTensorMetadata", "TensorProperties"]


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
