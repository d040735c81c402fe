"""One parameter of the per-parameter design (FSDP2's): its dim-0 shard, and its gathered copy.

    sharded:    module.weight = nn.Parameter(DTensor)   this rank's rows of the weight, under its own name
    unsharded:  module.weight = nn.Parameter(tensor)    the whole weight, while its unit computes

Each rank keeps the rows `torch.chunk` gives it: chunks of c = ceil(rows / n) rows, so the last ranks may
hold fewer rows or none. For the AllGather every rank's chunk is padded to exactly c rows (zeros), so
that all ranks send the same number of bytes; `padded_shard` holds that padded chunk and the sharded
parameter (what the optimizer steps on, what `state_dict()` returns) is a `DTensor` whose local tensor
is a view of its first rows. A `DTensor` records how the whole parameter is laid out over the mesh
(`placements`: `Shard(0)` over the shard dimension, `Replicate()` over replicas), which is what lets
`torch.distributed.checkpoint` reshard it on load and what PyTorch's own FSDP2 stores.

The unsharded parameter is a plain `nn.Parameter` in the compute dtype, created once and reused: its
storage is freed on reshard (`resize_(0)`) and refilled on unshard, so the tensors autograd saved stay
valid, as in the flat design (`fsdp_mini.flat_param_handle`). Its gradient is what backward produces;
`FSDPParamGroup` reduce-scatters it into `sharded_grad`.

The collectives themselves belong to the unit (`fsdp_mini.fsdp_param_group`): one AllGather and one
ReduceScatter for all the parameters of a unit, through a flat buffer that each parameter copies its
rows into (copy-in) and out of (copy-out). This module says which bytes of that buffer are whose.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor, Replicate, Shard

__all__ = ["FSDPParam"]


class FSDPParam:
    """One original parameter: where it lives in the module, its padded dim-0 shard, its gathered copy."""

    def __init__(self, name: str, owners: list[tuple[nn.Module, str]], param: nn.Parameter, mesh, shard_rank: int,
                 shard_size: int, compute_dtype: torch.dtype, device: torch.device):
        if param.dim() == 0:
            raise ValueError(f"parameter {name} is a 0-dim tensor: per-parameter sharding splits dim 0, "
                             f"so give it at least one dimension (e.g. shape (1,))")
        self.name, self.owners, self.mesh = name, owners, mesh
        self.shape, self.dtype, self.requires_grad = param.shape, param.dtype, param.requires_grad
        self.compute_dtype = compute_dtype if param.is_floating_point() else param.dtype
        self.n = shard_size
        self.rows = param.shape[0]
        self.chunk_rows = math.ceil(self.rows / shard_size)  # every rank's padded share
        self.row_numel = math.prod(param.shape[1:])
        self.shard_numel = self.chunk_rows * self.row_numel
        start = min(shard_rank * self.chunk_rows, self.rows)
        self.row_start = start  # this rank's first row of the parameter
        self.local_rows = max(0, min(self.rows, start + self.chunk_rows) - start)
        self.padded_shard = torch.zeros((self.chunk_rows, *param.shape[1:]), dtype=param.dtype, device=device)
        with torch.no_grad():
            self.padded_shard[:self.local_rows].copy_(param.detach()[start:start + self.local_rows])
        local = self.padded_shard[:self.local_rows]
        placements = [Shard(0)] if mesh.ndim == 1 else [Replicate(), Shard(0)]
        self.sharded = nn.Parameter(DTensor.from_local(local, mesh, placements, run_check=False, shape=param.shape,
                                                       stride=_contiguous_stride(param.shape)),
                                    requires_grad=param.requires_grad)
        self.placements = placements
        self.unsharded: nn.Parameter | None = None
        self.nbytes = math.prod(self.shape) * torch.empty((), dtype=self.compute_dtype).element_size()
        self.grad_ready = False
        self.to_sharded()

    # --- which tensor the module sees ------------------------------------------------------------------

    def _set_on_owners(self, tensor: torch.Tensor) -> None:
        for module, attr in self.owners:
            module._parameters[attr] = tensor  # no nn.Module.__setattr__ checks: a plain swap, as FSDP2 does

    def to_sharded(self) -> None:
        """The module's attribute is the sharded DTensor parameter (between steps, after reshard)."""
        self._set_on_owners(self.sharded)

    def to_unsharded(self) -> None:
        """The module's attribute is the gathered parameter (while its unit computes)."""
        self._set_on_owners(self.unsharded)

    # --- the gathered copy -----------------------------------------------------------------------------

    def alloc_unsharded(self) -> None:
        """Give the gathered parameter its storage (created on first use, refilled after each free)."""
        if self.unsharded is None:
            tensor = torch.empty(self.shape, dtype=self.compute_dtype, device=self.padded_shard.device)
            self.unsharded = nn.Parameter(tensor, requires_grad=self.requires_grad)
        else:
            self.unsharded.untyped_storage().resize_(self.nbytes)

    def free_unsharded(self) -> None:
        self.unsharded.untyped_storage().resize_(0)

    def copy_out(self, gathered: torch.Tensor, offset: int, length: int) -> None:
        """Fill the gathered parameter from the AllGather's output, viewed as (n, per-rank length) in the
        flat buffer's dtype: this parameter's padded chunk is elements [offset, offset + length) of every
        rank's row. Chunks in rank order are the rows in order, padding last, so it is one copy."""
        version = self.unsharded._version
        dst = self.unsharded.detach().view(-1)
        if gathered.dtype == torch.uint8:  # a unit with several dtypes travels as bytes
            dst = dst.view(torch.uint8)
        with torch.no_grad():
            dst.copy_(gathered[:, offset:offset + length].reshape(-1)[:dst.numel()])
        # the values are those autograd saved in forward: restore the counter, as the flat design does
        torch._C._autograd._unsafe_set_version_counter((self.unsharded,), (version,))

    def copy_in(self, as_bytes: bool) -> torch.Tensor:
        """This rank's padded chunk, flat, in the compute dtype (or as bytes): the AllGather's input."""
        src = self.padded_shard.detach().to(self.compute_dtype).reshape(-1)
        return src.view(torch.uint8) if as_bytes else src

    def post_forward_chunk(self, k: int, j: int, as_bytes: bool) -> torch.Tensor:
        """Share j of k of the gathered parameter (rows padded to k equal chunks), flat, copied: what a
        rank keeps between forward and backward with `reshard_after_forward=k`."""
        rows = math.ceil(self.rows / k)
        out = torch.zeros(rows * self.row_numel, dtype=self.compute_dtype, device=self.padded_shard.device)
        flat = self.unsharded.detach().reshape(-1)
        lo, hi = min(j * rows, self.rows) * self.row_numel, min((j + 1) * rows, self.rows) * self.row_numel
        out[:hi - lo].copy_(flat[lo:hi])
        return out.view(torch.uint8) if as_bytes else out

    # --- gradients -------------------------------------------------------------------------------------

    def padded_grad(self, dtype: torch.dtype) -> torch.Tensor:
        """The unsharded gradient (zeros if backward gave none) padded to n * chunk_rows rows, in `dtype`,
        and taken off the unsharded parameter: the rows rank r receives are chunk r."""
        grad = self.unsharded.grad
        self.unsharded.grad = None
        out = torch.zeros((self.n * self.chunk_rows, *self.shape[1:]), dtype=dtype, device=self.padded_shard.device)
        if grad is not None:
            out[:self.rows].copy_(grad)
        return out

    def accumulate_sharded_grad(self, reduced: torch.Tensor) -> None:
        """Set, or add to (gradient accumulation without sync), the sharded parameter's gradient from
        this rank's reduced chunk (padded rows dropped), as a DTensor like the parameter."""
        local = reduced.view(self.chunk_rows, *self.shape[1:])[:self.local_rows].to(self.dtype)
        if self.sharded.grad is None:
            self.sharded.grad = DTensor.from_local(local.clone(), self.mesh, self.placements, run_check=False,
                                                   shape=self.shape, stride=_contiguous_stride(self.shape))
        else:
            self.sharded.grad.to_local().add_(local)

    def has_unsharded_grad(self) -> bool:
        return self.unsharded is not None and self.unsharded.grad is not None

    def __repr__(self) -> str:
        return (f"FSDPParam({self.name}, shape={tuple(self.shape)}, rows {self.local_rows}/{self.chunk_rows} "
                f"of {self.rows} here)")


def _contiguous_stride(shape) -> tuple[int, ...]:
    stride, acc = [], 1
    for size in reversed(shape):
        stride.append(acc)
        acc *= size
    return tuple(reversed(stride))
