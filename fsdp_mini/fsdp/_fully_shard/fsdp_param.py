"""One parameter of the per-parameter design (FSDP2's): its dim-0 shard, and its gathered copy.

    sharded_param:  module.weight = nn.Parameter(DTensor)   this rank's rows of the weight, under its own name
    unsharded:      module.weight = nn.Parameter(tensor)    the whole weight, while its unit computes

Each rank keeps the rows `torch.chunk` gives it: chunks of c = ceil(rows / n) rows, so the last ranks may
hold fewer rows or none. For the AllGather every rank's chunk is padded to exactly c rows (zeros), so
that all ranks send the same number of bytes; `padded_shard` holds that padded chunk and the sharded
parameter (what the optimizer steps on, what `state_dict()` returns) is a `DTensor` whose local tensor
is a view of its first rows. A `DTensor` records how the whole parameter is laid out over the mesh
(`placements`: `Shard(0)` over the shard dimension, `Replicate()` over replicas), which is what lets
`torch.distributed.checkpoint` reshard it on load and what PyTorch's own FSDP2 stores.

The unsharded parameter is a plain `nn.Parameter` in the compute dtype, created once and reused: its
storage is freed on reshard (`resize_(0)`) and refilled on unshard, so the tensors autograd saved stay
valid, as in the flat design (`fsdp_mini.fsdp.flat_param_handle`). Its gradient is what backward produces;
`FSDPParamGroup` reduce-scatters it into `sharded_grad`.

The collectives themselves belong to the unit (`fsdp_mini.fsdp._fully_shard.fsdp_param_group`): one AllGather and one
ReduceScatter for all the parameters of a unit, through a flat buffer that each parameter copies its
rows into (copy-in) and out of (copy-out). This module says which bytes of that buffer are whose.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor, Replicate, Shard

from fsdp_mini.fsdp.full_state import gather_shards
from fsdp_mini.fsdp.gathered_storage import free_storage, refill_storage, restore_version, version_of
from fsdp_mini.fsdp.mixed_precision import MixedPrecisionPolicy
from fsdp_mini.torch_internals import dtensor_spec, new_dtensor, registered_parameter, set_registered_parameter

__all__ = ["FSDPParam"]


@dataclass(frozen=True)
class CopyOutViews:
    """Where copy-out writes, for one layout of the AllGather's output (per-rank chunk length, dtype): the
    parameter's first chunks as a (chunks, length) view, and the start of the next chunk (`tail`; None
    when the chunks divide the rows evenly). Views of the gathered parameter's storage, made on its first
    gather: they stay valid across its frees and refills, so each copy-out is one or two copies."""

    whole: torch.Tensor
    tail: torch.Tensor | None


class FSDPParam:
    """One original parameter: where it lives in the module, its padded dim-0 shard, its gathered copy."""

    def __init__(self, name: str, owners: list[tuple[nn.Module, str]], param: nn.Parameter, mesh, shard_rank: int,
                 shard_size: int, mp_policy: MixedPrecisionPolicy, device: torch.device, shard_dim: int = 0,
                 placements: tuple | None = None):
        """`mp_policy`: the unit's `MixedPrecisionPolicy` (which dtype the parameter is gathered in).
        `shard_dim`: the dimension to split (`fully_shard`'s `shard_placement_fn`); 0 by default.
        `placements`: the DTensor's, when not sharding's (FSDP2's replicate: `(Replicate(),)` on a 1-D mesh,
        shard_size 1)."""
        if param.dim() == 0:
            raise ValueError(f"parameter {name} is a 0-dim tensor: per-parameter sharding splits dim 0, "
                             f"so give it at least one dimension (e.g. shape (1,))")
        self.name, self.owners, self.mesh, self.device = name, owners, mesh, device
        self.mp_policy = mp_policy
        self.shape = param.shape
        self.n, self.shard_dim = shard_size, shard_dim
        rows = self.as_shard_rows(param.detach())  # the rows the ranks split: the parameter itself for Shard(0)
        self.rows = rows.shape[0]
        self.chunk_rows = math.ceil(self.rows / shard_size)  # every rank's padded share
        self.row_numel = math.prod(rows.shape[1:])
        self.shard_numel = self.chunk_rows * self.row_numel
        self.padded_shape = (self.chunk_rows, *rows.shape[1:])
        start = min(shard_rank * self.chunk_rows, self.rows)
        self.row_start = start  # this rank's first row of the parameter
        self.local_rows = max(0, min(self.rows, start + self.chunk_rows) - start)
        self.placements = placements or ((Shard(shard_dim),) if mesh.ndim == 1 else (Replicate(), Shard(shard_dim)))
        self.unsharded: nn.Parameter | None = None
        self.grad_hooked = False  # the unit's post-accumulate-grad hook is on the current `unsharded`
        self.accumulated_grad: torch.Tensor | None = None  # unsynced micro-batches' sum, in the reduce dtype
        self.grad_ready = False
        local = rows[start:start + self.local_rows]
        self.sharded_param = nn.Parameter(self._padded_dtensor(local), requires_grad=param.requires_grad)
        self._adopt_sharded()
        self.to_sharded()

    def _padded_dtensor(self, local: torch.Tensor) -> DTensor:
        """A DTensor of this rank's rows whose local tensor is a view of `padded_shard`: this rank's chunk
        padded to `chunk_rows` rows (zeros), what the AllGather sends. On the meta device while the module
        is (`fully_shard` before `to_empty`), then on this rank's device."""
        device = local.device if local.is_meta else self.device
        self.padded_shard = torch.zeros(self.padded_shape, dtype=local.dtype, device=device)
        with torch.no_grad():
            self.padded_shard[:self.local_rows].copy_(local)
        return DTensor.from_local(self.padded_shard[:self.local_rows], self.mesh, self.placements, run_check=False,
                                  shape=self.shape, stride=_contiguous_stride(self.shape))

    def as_shard_rows(self, full: torch.Tensor) -> torch.Tensor:
        """The whole parameter (or its gradient) as the rows the ranks split into dim-0 chunks, in order:
        itself for dim-0 sharding; for `Shard(d)` (`shard_placement_fn`, an even split) the n chunks of dim
        d stacked along dim 0 (a copy), so that chunk r of the rows is rank r's chunk of dim d, as FSDP2
        arranges a gradient before its ReduceScatter (`torch.cat(torch.chunk(grad, n, dim=d))`)."""
        if self.shard_dim == 0:
            return full
        return torch.cat(full.chunk(self.n, dim=self.shard_dim), dim=0)

    def _adopt_sharded(self) -> None:
        """Derive what depends on the sharded parameter's dtype: the compute dtype (the policy's, for a
        floating-point parameter), the AllGather's input, the gradient's spec, the gathered bytes."""
        self.dtype = self.sharded_param.dtype
        compute = self.mp_policy.compute_dtype(self.dtype)
        if self.unsharded is not None and self.unsharded.dtype != compute:
            self.unsharded, self.grad_hooked = None, False  # recreated in the new dtype at the next gather
        self.compute_dtype = compute
        self.reduce_dtype = self.mp_policy.gradient_reduce_dtype(self.dtype)  # the one rule, `_Precision`'s
        # what each step's gradient DTensor is built from: the parameter's own spec (mesh, placements, global
        # shape), so a new gradient costs one constructor call instead of `DTensor.from_local`'s checks and
        # autograd function (~20x slower on CPU, paid per parameter per step). FSDP2 does the same.
        self.grad_spec = dtensor_spec(self.sharded_param)
        self.flat_shard = self.padded_shard.view(-1)  # the AllGather's input when no dtype cast is needed
        self.nbytes = math.prod(self.shape) * torch.empty((), dtype=self.compute_dtype).element_size()

    @property
    def requires_grad(self) -> bool:
        """Read from the sharded parameter each time: freezing or unfreezing it after `fully_shard` counts
        from the next gather on, as in FSDP2."""
        return self.sharded_param.requires_grad

    def reset_sharded_param(self) -> None:
        """Adopt what now stands in the parameter's place: `load_state_dict(..., assign=True)` puts a new
        parameter there, `module.to(dtype)` swaps the old one's contents. Re-pad its local rows into a new
        `padded_shard` (unless they already are a view of it) and keep that parameter object, so the module,
        the optimizer built afterwards and the next AllGather all see the same tensor (FSDP2's
        `reset_sharded_param`)."""
        module, attr = self.owners[0]
        new = registered_parameter(module, attr)
        if not isinstance(new, DTensor) or tuple(new.shape) != tuple(self.shape) \
                or tuple(new.placements) != self.placements:
            raise ValueError(f"parameter {self.name} of a fully_shard module was replaced by a "
                             f"{type(new).__name__} of shape {tuple(new.shape)}: it must be a DTensor of shape "
                             f"{tuple(self.shape)} placed {list(self.placements)} (load a sharded state dict, e.g. "
                             f"model.state_dict() or torch.distributed.checkpoint's)")
        local = new.to_local()
        same = (local.dtype == self.padded_shard.dtype and local.numel() > 0
                and local.untyped_storage().data_ptr() == self.padded_shard.untyped_storage().data_ptr())
        if not same:
            replacement = nn.Parameter(self._padded_dtensor(local.detach()), requires_grad=new.requires_grad)
            if isinstance(new, nn.Parameter):
                torch.utils.swap_tensors(new, replacement)  # keep the object that the caller put there
            else:
                new = replacement
        self.sharded_param = new
        self._adopt_sharded()
        self.to_sharded()

    # --- which tensor the module sees ------------------------------------------------------------------

    def _set_on_owners(self, tensor: torch.Tensor) -> None:
        for module, attr in self.owners:
            set_registered_parameter(module, attr, tensor)  # no nn.Module.__setattr__ checks, as FSDP2 does

    def to_sharded(self) -> None:
        """The module's attribute is the sharded DTensor parameter (between steps, after reshard)."""
        self._set_on_owners(self.sharded_param)

    def to_unsharded(self) -> None:
        """The module's attribute is the gathered parameter (while its unit computes), with the sharded
        parameter's `requires_grad` as it is now: a unit gathered early (prefetched in an evaluation pass,
        say) and frozen since must not compute gradients."""
        if self.unsharded.requires_grad != self.requires_grad:
            self.unsharded.requires_grad_(self.requires_grad)
        self._set_on_owners(self.unsharded)

    # --- the gathered copy -----------------------------------------------------------------------------

    def alloc_all_gather_outputs(self) -> None:
        """Give the gathered parameter its storage (created on first use, refilled after each free); its
        `requires_grad` is the sharded parameter's, read when it takes the module's place (`to_unsharded`)."""
        if self.unsharded is None:
            tensor = torch.empty(self.shape, dtype=self.compute_dtype, device=self.device)
            self.unsharded = nn.Parameter(tensor, requires_grad=self.requires_grad)
            # copy-out's destination, made once: a flat view of the same storage stays valid across the
            # frees and refills, and it shares the parameter's version counter (see `copy_out`)
            self.unsharded_flat = tensor.view(-1)
            self.copy_out_views: dict[tuple[int, torch.dtype], CopyOutViews] = {}
        else:
            refill_storage(self.unsharded, self.nbytes)

    def free_unsharded_param(self) -> None:
        free_storage(self.unsharded)

    def copy_out(self, gathered: torch.Tensor, offset: int, length: int) -> None:
        """Fill the gathered parameter from the AllGather's output, viewed as (n, per-rank length) in the
        flat buffer's dtype: this parameter's padded chunk is elements [offset, offset + length) of every
        rank's row. Chunks in rank order are the rows in order, padding last, so the parameter is its
        first chunks whole and then the start of the next one: one or two strided copies, no temporary."""
        version = version_of(self.unsharded)
        block = gathered.narrow(1, offset, length)  # (n, length): row r is rank r's chunk
        if self.shard_dim:  # chunk r is slice r of dim d: one strided copy into the parameter seen as chunks
            src = block if block.dtype == self.compute_dtype else block.contiguous().view(self.compute_dtype)
            self._shard_dim_view().copy_(src.unflatten(1, self.padded_shape))
            restore_version(self.unsharded, version)
            return
        dst = self.copy_out_views.get((length, gathered.dtype)) or self._make_copy_out_views(length, gathered.dtype)
        whole = dst.whole.shape[0]
        dst.whole.copy_(block if whole == block.shape[0] else block[:whole])
        if dst.tail is not None:
            dst.tail.copy_(block[whole, :dst.tail.numel()])
        # the values are those autograd saved in forward: restore the counter, as the flat design does
        restore_version(self.unsharded, version)

    def _shard_dim_view(self) -> torch.Tensor:
        """The gathered parameter as (n, *shard shape) for sharding along dim d: dim d split into (n, d/n)
        and the n moved first, so that [r] is rank r's chunk (a view, no copy)."""
        d, shape = self.shard_dim, list(self.shape)
        return self.unsharded_flat.view(shape[:d] + [self.n, shape[d] // self.n] + shape[d + 1:]).movedim(d, 0)

    def _make_copy_out_views(self, length: int, dtype: torch.dtype) -> "CopyOutViews":
        flat = self.unsharded_flat.view(dtype)  # a unit with several dtypes travels as bytes
        whole, rest = divmod(flat.numel(), length) if length else (0, 0)
        views = CopyOutViews(flat[:whole * length].view(whole, length), flat[whole * length:] if rest else None)
        self.copy_out_views[(length, dtype)] = views
        return views

    def copy_in(self, as_bytes: bool) -> torch.Tensor:
        """This rank's padded chunk, flat, in the compute dtype (or as bytes): the AllGather's input."""
        src = self.flat_shard if self.compute_dtype == self.dtype else self.flat_shard.to(self.compute_dtype)
        return src.view(torch.uint8) if as_bytes else src

    def post_forward_chunk(self, k: int, j: int, as_bytes: bool) -> torch.Tensor:
        """Share j of k of the gathered parameter (rows padded to k equal chunks), flat, copied: what a
        rank keeps between forward and backward with `reshard_after_forward=k`."""
        rows = math.ceil(self.rows / k)
        out = torch.empty(rows * self.row_numel, dtype=self.compute_dtype, device=self.device)
        flat = self.unsharded.detach().reshape(-1)
        lo, hi = min(j * rows, self.rows) * self.row_numel, min((j + 1) * rows, self.rows) * self.row_numel
        out[:hi - lo].copy_(flat[lo:hi])
        out[hi - lo:].zero_()  # the padding rows only
        return out.view(torch.uint8) if as_bytes else out

    # --- gradients -------------------------------------------------------------------------------------

    def take_unsharded_grad(self) -> torch.Tensor | None:
        """The gradient to reduce, taken off the gathered parameter: this backward's, added to what unsynced
        backwards accumulated; None when there is neither (a parameter the forward did not use keeps no
        gradient, as in FSDP2 and DDP, so AdamW neither decays it nor advances its state)."""
        grad = None
        if self.unsharded is not None:
            grad, self.unsharded.grad = self.unsharded.grad, None
        accumulated, self.accumulated_grad = self.accumulated_grad, None
        if accumulated is None:
            return grad
        if grad is not None:
            accumulated += grad
        return accumulated

    def accumulate_unsharded_grad_if_needed(self, reduce_dtype: torch.dtype | None) -> None:
        """A backward without gradient sync: keep this backward's gradient for the next reduction. In the
        reduce dtype when it differs from the compute dtype (bf16 compute, fp32 reduce): micro-batches then
        add up in fp32, not in bf16, where 256 + 1 is 256 (FSDP2's `unsharded_accumulated_grad`)."""
        grad = self.unsharded.grad if self.unsharded is not None else None
        if grad is None:
            return
        if self.accumulated_grad is not None:
            self.accumulated_grad += grad
        elif reduce_dtype is not None and grad.dtype != reduce_dtype:
            self.accumulated_grad = grad.to(reduce_dtype)
        else:
            return  # same dtype: autograd keeps adding into the gathered parameter's .grad
        self.unsharded.grad = None

    def accumulate_sharded_grad(self, reduced: torch.Tensor) -> None:
        """Set, or add to (gradient accumulation without sync), the sharded parameter's gradient from
        this rank's reduced chunk (padded rows dropped), as a DTensor like the parameter. The gradient
        is a view of the ReduceScatter's output (no copy), as the flat design's shard gradient is."""
        local = reduced[:self.local_rows * self.row_numel].view(self.local_rows, *self.padded_shape[1:])
        if local.dtype != self.dtype:
            local = local.to(self.dtype)
        if self.sharded_param.grad is None:
            self.sharded_param.grad = new_dtensor(local, self.grad_spec)
        else:
            self.sharded_param.grad.to_local().add_(local)

    def drop_unsharded_grads(self) -> None:
        """Forget this step's unreduced gradient and what unsynced micro-batches accumulated (after a failed
        step: `FSDPModule.reset_iter_state`)."""
        self.accumulated_grad = None
        if self.unsharded is not None:
            self.unsharded.grad = None

    def has_unsharded_grad(self) -> bool:
        return self.accumulated_grad is not None or (self.unsharded is not None and self.unsharded.grad is not None)

    # --- full state dict -----------------------------------------------------------------------------

    def gather_full(self) -> torch.Tensor:
        """The whole parameter, on CPU, in its own dtype: an AllGather of the padded chunks over the shard
        dimension of the mesh (collective), padding cut off."""
        full = gather_shards(self.padded_shard, self.mesh.get_group(self.mesh.ndim - 1) if self.n > 1 else None)
        full = full[:self.rows]
        if self.shard_dim:  # the rows are dim d's chunks, stacked: put them side by side again
            full = torch.cat(full.chunk(self.n), dim=self.shard_dim)
        return full.to("cpu", copy=True)

    def load_full(self, full: torch.Tensor) -> None:
        """Copy this rank's rows of the whole parameter into its shard (no communication)."""
        with torch.no_grad():
            rows = self.as_shard_rows(full)
            self.padded_shard[:self.local_rows].copy_(rows[self.row_start:self.row_start + self.local_rows])

    def __repr__(self) -> str:
        return (f"FSDPParam({self.name}, shape={tuple(self.shape)}, rows {self.local_rows}/{self.chunk_rows} "
                f"of {self.rows} here)")


def _contiguous_stride(shape) -> tuple[int, ...]:
    stride, acc = [], 1
    for size in reversed(shape):
        stride.append(acc)
        acc *= size
    return tuple(reversed(stride))
