"""The gathered parameters' storage, freed after use and refilled before the next, in both designs.

Freeing is `untyped_storage().resize_(0)`, not dropping the tensor: autograd saved the gathered tensors
(or views of them) for backward, and they must become valid again when the storage is refilled before
backward. Refilling writes in place, which bumps the version counter autograd checks; the values are the
ones autograd saved, so the counter is restored after the write (`torch_internals.restore_version`), as
PyTorch's FSDP does.
"""
from __future__ import annotations

import torch

from fsdp_mini.torch_internals import restore_version, version_of

__all__ = ["free_storage", "refill_storage", "restore_version", "version_of"]


def free_storage(tensor: torch.Tensor) -> None:
    """Give the tensor's memory back; the tensor object (and every view of it) stays, pointing at none."""
    tensor.untyped_storage().resize_(0)


def refill_storage(tensor: torch.Tensor, nbytes: int) -> None:
    """Give the tensor its `nbytes` of memory back (uninitialised: the caller writes it before use)."""
    tensor.untyped_storage().resize_(nbytes)
