"""Mixed precision for FSDP: compute in a low-precision copy, keep the fp32 shard as the master.

Why it fits FSDP so well: the all-gathered parameters are a temporary copy anyway, so gathering them
in bf16 halves both the AllGather bytes and the unsharded memory, while the optimizer keeps updating
the fp32 shard it owns. Gradients come out of backward in the compute dtype and are cast to
`reduce_dtype` before the ReduceScatter: averaging many ranks' gradients in bf16 loses precision, so
fp32 reduction is the common choice. `MixedPrecision` has FSDP1's fields, `MixedPrecisionPolicy` FSDP2's.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from fsdp_mini.nested import map_tensors

__all__ = ["MixedPrecision", "MixedPrecisionPolicy", "cast_floating"]


@dataclass(frozen=True)
class _Precision:
    """What both designs' policies share: the two dtypes, their check, and the rule for each parameter.
    Only floating-point parameters are cast: an integer or complex parameter keeps its dtype, as in
    PyTorch (a bf16 copy of token ids or of a complex rotation would be silently wrong)."""

    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_dtype") and value is not None and not (
                    isinstance(value, torch.dtype) and value.is_floating_point):
                raise ValueError(f"{type(self).__name__}.{f.name} must be a floating-point torch.dtype, got {value!r}")

    def compute_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype a parameter of `dtype` is gathered and computed in."""
        return (self.param_dtype or dtype) if dtype.is_floating_point else dtype

    def gradient_reduce_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype the gradient of a parameter of `dtype` is reduced in."""
        return (self.reduce_dtype or self.compute_dtype(dtype)) if dtype.is_floating_point else dtype

    def _cast(self, args, kwargs, cast: bool):
        if self.param_dtype is not None and cast:
            return cast_floating((args, kwargs), self.param_dtype)
        return args, kwargs


@dataclass(frozen=True)
class MixedPrecision(_Precision):
    """The flat design's policy (`FSDP(mixed_precision=...)`): PyTorch FSDP1's fields and defaults
    (`torch.distributed.fsdp.MixedPrecision`, torch/distributed/fsdp/api.py).

    `param_dtype`: dtype of gathered parameters and of compute (None: the parameters' own dtype).
    `reduce_dtype`: dtype in which gradients are reduced (None: `param_dtype`).
    `buffer_dtype`: floating-point buffers are cast to it when the model is wrapped (None: leave them);
    a full state dict gives them back in their own dtype, as FSDP1's does.
    `keep_low_precision_grads`: FSDP1 can leave the gradient shard in the reduce dtype for an optimizer
    that runs in low precision; fsdp_mini always hands the optimizer the fp32 shard's gradient in the
    shard's dtype, so True is refused (a ValueError), not ignored.
    `cast_forward_inputs`: every unit casts its floating-point inputs to `param_dtype` (FSDP1: every FSDP
    instance). `cast_root_forward_inputs`: the wrapper casts the inputs of the root forward (FSDP1's
    default, True). FSDP1 has no `output_dtype`: cast the output yourself, or use `fully_shard`'s policy."""

    buffer_dtype: torch.dtype | None = None
    keep_low_precision_grads: bool = False
    cast_forward_inputs: bool = False
    cast_root_forward_inputs: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.keep_low_precision_grads:
            raise ValueError("MixedPrecision.keep_low_precision_grads=True is not supported: fsdp_mini's optimizer "
                             "always sees the gradient shard in the fp32 shard's dtype")

    def cast_inputs(self, args, kwargs, root: bool):
        """A forward's floating-point inputs in `param_dtype`: the root's when `cast_root_forward_inputs` or
        `cast_forward_inputs` says so (FSDP1 casts in its root pre-forward, then in every pre-forward),
        an inner unit's when `cast_forward_inputs` does."""
        return self._cast(args, kwargs, self.cast_forward_inputs or (root and self.cast_root_forward_inputs))


@dataclass(frozen=True)
class MixedPrecisionPolicy(_Precision):
    """The per-parameter design's policy (`fully_shard(mp_policy=...)`), PyTorch FSDP2's fields.

    `param_dtype`: dtype of the gathered parameters and of compute (None: each parameter's own).
    `reduce_dtype`: dtype of the gradient reduction (None: `param_dtype`, or the parameter's own).
    `output_dtype`: cast the module's floating-point outputs to it (None: leave them).
    `cast_forward_inputs`: cast the module's floating-point inputs to `param_dtype`.
    """

    output_dtype: torch.dtype | None = None
    cast_forward_inputs: bool = True

    def cast_inputs(self, args, kwargs):
        """The module's floating-point inputs in `param_dtype`, when `cast_forward_inputs` says so."""
        return self._cast(args, kwargs, self.cast_forward_inputs)

    def cast_output(self, out):
        """The module's floating-point outputs in `output_dtype`, when it is set."""
        return out if self.output_dtype is None else cast_floating(out, self.output_dtype)


def cast_floating(obj, dtype: torch.dtype):
    """`obj` (nested tuples, lists, dicts) with its floating-point tensors cast to `dtype`; integer
    tensors (token ids, masks) are left alone, as PyTorch's `cast_forward_inputs` does."""
    return map_tensors(lambda t: t.to(dtype) if t.is_floating_point() else t, obj)
