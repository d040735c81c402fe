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

__all__ = ["free_storage", "refill_storage", "restore_version", "version_of", "FreedParameter"]


def free_storage(tensor: torch.Tensor) -> None:
    """Give the tensor's memory back; the tensor object (and every view of it) stays, pointing at none."""
    tensor.untyped_storage().resize_(0)


def refill_storage(tensor: torch.Tensor, nbytes: int) -> None:
    """Give the tensor its `nbytes` of memory back (uninitialised: the caller writes it before use)."""
    tensor.untyped_storage().resize_(nbytes)


class FreedParameter(torch.Tensor):
    """What a module of the flat design holds in place of a parameter while its unit is resharded.

    The parameters a module computes with are views of its unit's gathered buffer; between steps that
    buffer's storage is freed, and any read of such a view (printing `model.module.head.weight`, say) reads
    freed memory: a segmentation fault, in PyTorch's FSDP1 too. So while the storage is freed the module
    holds this instead, and the handle puts the view back when it gathers again. Its shape, dtype and device
    are the parameter's; anything that needs its values is a RuntimeError saying where the values are."""

    _METADATA = {torch.Tensor.size, torch.Tensor.dim, torch.Tensor.numel, torch.Tensor.shape.__get__,
                 torch.Tensor.dtype.__get__, torch.Tensor.ndim.__get__, torch.Tensor.requires_grad.__get__,
                 torch.Tensor.is_floating_point}

    @staticmethod
    def __new__(cls, like: torch.Tensor, name: str):
        freed = torch.empty(like.shape, dtype=like.dtype, device="meta").as_subclass(cls)
        freed.param_name, freed.param_device = name, like.device
        return freed

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in cls._METADATA:
            return super().__torch_function__(func, types, args, kwargs)
        if func is torch.Tensor.device.__get__:
            return args[0].param_device
        name = next(a.param_name for a in args if isinstance(a, FreedParameter))
        raise RuntimeError(f"{name} is sharded now: FSDP frees a unit's gathered parameters between uses, so the "
                           f"module holds no values for it. Read parameters inside `with model.summon_full_params():`, "
                           f"or take the whole state with model.full_state_dict() (fsdp_mini.full_state_dict(model))")
