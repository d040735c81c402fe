"""Megatron-LM's two operators of tensor parallelism, `f` and `g`, as autograd Functions on fsdp_mini's
collectives (so CommLog and the flight recorder see every AllReduce, labelled).

A tensor-parallel MLP is `Y = g(gelu(f(X) A_r) B_r)`: every rank of the TP group holds the whole input X,
a block of columns A_r of the first weight and the matching block of rows B_r of the second one.

    f  copy_to_tensor_model_parallel_region       forward: identity     backward: AllReduce
    g  reduce_from_tensor_model_parallel_region   forward: AllReduce    backward: identity

Why each backward is what it is (the two are conjugate: each one's backward is the other's forward):

- `f` enters a column-parallel region. Forward: X is already whole on every rank, nothing to send.
  Backward: rank r's part of the graph used X only through its own columns A_r, so the gradient it
  computes for X is a partial sum, dL/dX = sum over r of dL/dY_r A_r^T; the AllReduce adds the ranks'
  parts, and every rank then has the whole dL/dX to pass on to the replicated layers before (a LayerNorm,
  the residual stream, the embeddings), which then get the same gradients on every rank.
- `g` leaves a row-parallel region. Forward: each rank multiplied its slice of the features by its rows
  B_r, a partial sum of the output; the AllReduce adds them, so every rank holds the whole output.
  Backward: the output was replicated, so each rank's dL/dY already is the whole gradient, and the
  gradient of a sum with respect to each term is that same gradient: identity, no communication.

Per transformer block (attention, then MLP) that is one `g` AllReduce per region in forward and one `f`
AllReduce per region in backward: 2 + 2, each of batch x seq x hidden elements.
"""
from __future__ import annotations

import torch

from fsdp_mini import collectives as C
from fsdp_mini.comm_log import scope

__all__ = ["copy_to_tensor_model_parallel_region", "reduce_from_tensor_model_parallel_region",
           "CopyToTensorParallelRegion", "ReduceFromTensorParallelRegion", "TP_LABEL"]

TP_LABEL = "tensor parallel"  # every TP AllReduce's CommLog label starts with it: "tensor parallel attn.proj"


def _all_reduce(tensor: torch.Tensor, group, label: str) -> torch.Tensor:
    out = tensor.contiguous().clone()  # never reduce into a tensor autograd saved or the caller still holds
    with scope(label):
        C.all_reduce(out, C.SUM, group=group)
    return out


class CopyToTensorParallelRegion(torch.autograd.Function):
    """Megatron's `f`: identity forward, AllReduce (SUM) backward. The input is whole on every rank; the
    gradient each rank computes for it covers only its own shard of the layer, so the ranks add them."""

    @staticmethod
    def forward(ctx, x, group, label):
        ctx.group, ctx.label = group, label
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, ctx.group, ctx.label), None, None


class ReduceFromTensorParallelRegion(torch.autograd.Function):
    """Megatron's `g`: AllReduce (SUM) forward, identity backward. Each rank's output is a partial sum;
    after the AllReduce the output is whole and replicated, so its gradient is already whole too."""

    @staticmethod
    def forward(ctx, x, group, label):
        return _all_reduce(x, group, label)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


def copy_to_tensor_model_parallel_region(x: torch.Tensor, group, label: str = TP_LABEL) -> torch.Tensor:
    """`f`: enter a column-parallel region (identity now, AllReduce of the gradient in backward)."""
    return CopyToTensorParallelRegion.apply(x, group, label)


def reduce_from_tensor_model_parallel_region(x: torch.Tensor, group, label: str = TP_LABEL) -> torch.Tensor:
    """`g`: leave a row-parallel region (AllReduce now, identity in backward)."""
    return ReduceFromTensorParallelRegion.apply(x, group, label)
