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

Sequence parallelism (Korthikanti et al., 2022) splits each of those AllReduces into its two halves. An
AllReduce is a ReduceScatter followed by an AllGather; between the two halves, each rank holds 1/tp of the
sequence, and that is where the replicated work between the TP regions (LayerNorm, dropout, the residual
add) runs, on 1/tp of the positions and storing 1/tp of the activations. The paper renames the pair:

    g   gather_from_sequence_parallel_region        forward: AllGather      backward: ReduceScatter
    ḡ   reduce_scatter_to_sequence_parallel_region  forward: ReduceScatter  backward: AllGather

`g` enters a column-parallel region from sequence shards (each rank needs the whole sequence; the gradients
it computes for it are partial sums, so backward adds them and keeps each rank's positions); `ḡ` leaves a
row-parallel region into sequence shards (the partial sums are added and each rank keeps its positions;
backward, the next region needs the whole gradient). The same bytes as the AllReduce they replace: a ring
ReduceScatter plus a ring AllGather of S bytes send what one ring AllReduce of S sends, 2(n-1)/n S.
Two more move between replicated and sequence-sharded tensors outside the TP regions (a replicated
embedding's output, a replicated head's input), where every rank computes the same gradient:

    scatter_to_sequence_parallel_region                 forward: keep own chunk   backward: AllGather
    gather_from_sequence_parallel_region(tensor_parallel_output_grad=False)
                                                        forward: AllGather        backward: keep own chunk

What a column-parallel layer keeps for backward is where the two implementations differ. PyTorch's
(`ColwiseParallel(input_layouts=Shard(1))`: the AllGather, then the product) keeps the gathered input, the
whole sequence, for its weight's gradient, as TP keeps its replicated input: SP then divides only what lies
between the TP regions. Megatron-LM's (`LinearWithGradAccumulationAndAsyncCommunication` with
`sequence_parallel=True`) keeps only the input's shard and all-gathers it again in backward: one more
AllGather per column-parallel layer and step, and every activation of the block divided by tp
(Korthikanti et al.'s `sbh/t (34 + 5as/h)`). `all_gather_linear` is that layer:

    all_gather_linear   forward: AllGather, product, keep the shard
                        backward: AllGather again (the weight's gradient), ReduceScatter (the input's)

The sequence is dim 1 of a (batch, seq, hidden) tensor, PyTorch's `Shard(1)` (Megatron keeps (seq, batch,
hidden) and shards dim 0, which needs no copy: fsdp_mini's collectives work on dim 0, so another dim is
moved to the front and back). Its length must be a multiple of the group's size: the error says so before
anything is sent, on every rank of the group alike.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from fsdp_mini import collectives as C
from fsdp_mini.collective_calls import scope

__all__ = ["copy_to_tensor_model_parallel_region", "reduce_from_tensor_model_parallel_region",
           "CopyToTensorParallelRegion", "ReduceFromTensorParallelRegion", "TP_LABEL",
           "gather_from_sequence_parallel_region", "reduce_scatter_to_sequence_parallel_region",
           "scatter_to_sequence_parallel_region", "GatherFromSequenceParallelRegion",
           "ReduceScatterToSequenceParallelRegion", "ScatterToSequenceParallelRegion", "AllGatherLinear",
           "all_gather_linear", "GATHERED_AGAIN"]

GATHERED_AGAIN = "gathered again"  # the CommLog label's suffix of all_gather_linear's backward AllGather

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


# --- sequence parallelism: the AllReduce's two halves ---------------------------------------------------

def _group_size_and_rank(group) -> tuple[int, int]:
    return dist.get_world_size(group), dist.get_rank(group)


def _sequence_dim(x: torch.Tensor, dim: int, n: int) -> int:
    """`dim` as a non-negative index of `x`, after checking that `n` ranks can share it evenly."""
    d = dim % x.dim() if -x.dim() <= dim < x.dim() else None
    if d is None:
        raise ValueError(f"sequence parallelism: dim {dim} does not exist in a tensor of shape {tuple(x.shape)}")
    if x.shape[d] % n:
        raise ValueError(f"sequence parallelism: dim {d} of a tensor of shape {tuple(x.shape)} has {x.shape[d]} "
                         f"positions, not a multiple of the {n} ranks of the tensor-parallel group")
    return d


def _all_gather(x: torch.Tensor, dim: int, group, label: str) -> torch.Tensor:
    """Every rank's piece of the sequence, concatenated along `dim` in rank order."""
    n, _ = _group_size_and_rank(group)
    front = x.movedim(dim, 0).contiguous()  # fsdp_mini's AllGather concatenates along dim 0
    out = torch.empty((n * front.shape[0], *front.shape[1:]), dtype=x.dtype, device=x.device)
    with scope(label):
        C.all_gather_into_tensor(out, front, group=group)
    return out.movedim(0, dim).contiguous()


def _reduce_scatter(x: torch.Tensor, dim: int, group, label: str) -> torch.Tensor:
    """The ranks' tensors summed, this rank's 1/n of `dim` kept."""
    n, _ = _group_size_and_rank(group)
    front = x.movedim(dim, 0).contiguous()
    out = torch.empty((front.shape[0] // n, *front.shape[1:]), dtype=x.dtype, device=x.device)
    with scope(label):
        C.reduce_scatter_tensor(out, front, C.SUM, group=group)
    return out.movedim(0, dim).contiguous()


def _own_chunk(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    n, rank = _group_size_and_rank(group)
    return x.chunk(n, dim=dim)[rank].contiguous()


class GatherFromSequenceParallelRegion(torch.autograd.Function):
    """Korthikanti et al.'s `g`: AllGather forward (the whole sequence from the ranks' shards), and backward
    either a ReduceScatter (`tensor_parallel_output_grad=True`: a column-parallel layer follows, each rank's
    gradient is a partial sum) or this rank's chunk of the gradient (False: replicated work follows, every
    rank computed the same whole gradient)."""

    @staticmethod
    def forward(ctx, x, group, label, dim, tensor_parallel_output_grad):
        ctx.group, ctx.label, ctx.dim, ctx.partial = group, label, dim, tensor_parallel_output_grad
        return _all_gather(x, dim, group, label)

    @staticmethod
    def backward(ctx, grad):
        if ctx.partial:
            return _reduce_scatter(grad, ctx.dim, ctx.group, ctx.label), None, None, None, None
        return _own_chunk(grad, ctx.dim, ctx.group), None, None, None, None


class ReduceScatterToSequenceParallelRegion(torch.autograd.Function):
    """Korthikanti et al.'s `ḡ`: ReduceScatter forward (the partial sums of a row-parallel layer added, each
    rank keeping its positions), AllGather backward (the gradient of the whole sequence, for the region
    before, which every rank computes whole)."""

    @staticmethod
    def forward(ctx, x, group, label, dim):
        ctx.group, ctx.label, ctx.dim = group, label, dim
        return _reduce_scatter(x, dim, group, label)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, ctx.dim, ctx.group, ctx.label), None, None, None


class ScatterToSequenceParallelRegion(torch.autograd.Function):
    """From a replicated tensor to this rank's sequence shard: keep its chunk (nothing sent), AllGather the
    gradient in backward (each rank has the gradient of its own positions only)."""

    @staticmethod
    def forward(ctx, x, group, label, dim):
        ctx.group, ctx.label, ctx.dim = group, label, dim
        return _own_chunk(x, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, ctx.dim, ctx.group, ctx.label), None, None, None


def gather_from_sequence_parallel_region(x: torch.Tensor, group, label: str = TP_LABEL, dim: int = 1,
                                         tensor_parallel_output_grad: bool = True) -> torch.Tensor:
    """`g`: the whole sequence from this rank's shard `x` (AllGather along `dim`); backward ReduceScatter, or
    this rank's chunk with `tensor_parallel_output_grad=False` (Megatron's argument of the same name)."""
    d = _sequence_dim(x, dim, _group_size_and_rank(group)[0])
    return GatherFromSequenceParallelRegion.apply(x, group, label, d, tensor_parallel_output_grad)


def reduce_scatter_to_sequence_parallel_region(x: torch.Tensor, group, label: str = TP_LABEL,
                                               dim: int = 1) -> torch.Tensor:
    """`ḡ`: the ranks' partial sums added, this rank's 1/tp of the sequence kept; AllGather in backward."""
    d = _sequence_dim(x, dim, _group_size_and_rank(group)[0])
    return ReduceScatterToSequenceParallelRegion.apply(x, group, label, d)


def scatter_to_sequence_parallel_region(x: torch.Tensor, group, label: str = TP_LABEL, dim: int = 1) -> torch.Tensor:
    """A replicated `x`'s chunk of the sequence for this rank (no communication); AllGather in backward."""
    d = _sequence_dim(x, dim, _group_size_and_rank(group)[0])
    return ScatterToSequenceParallelRegion.apply(x, group, label, d)


class AllGatherLinear(torch.autograd.Function):
    """Megatron-LM's column-parallel product under sequence parallelism: the input's shard all-gathered, times
    this rank's rows of the weight; autograd keeps the shard, not the whole sequence. Backward gathers the
    sequence again for the weight's gradient (its CommLog label ends in `GATHERED_AGAIN`) and reduce-scatters
    the input's gradient, a partial sum over the ranks' rows, to this rank's positions."""

    @staticmethod
    def forward(ctx, x, weight, bias, group, label, dim):
        ctx.group, ctx.label, ctx.dim, ctx.has_bias = group, label, dim, bias is not None
        # the shard, 1/tp of what the gathered input would keep; nothing when the weight is frozen (as F.linear)
        ctx.save_for_backward(x if ctx.needs_input_grad[1] else None, weight)
        return F.linear(_all_gather(x, dim, group, label), weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[1]:
            whole = _all_gather(x, ctx.dim, ctx.group, f"{ctx.label} {GATHERED_AGAIN}")
            grad_weight = grad.reshape(-1, grad.shape[-1]).t() @ whole.reshape(-1, whole.shape[-1])
        if ctx.needs_input_grad[0]:
            grad_x = _reduce_scatter(grad @ weight, ctx.dim, ctx.group, ctx.label)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad.reshape(-1, grad.shape[-1]).sum(0)
        return grad_x, grad_weight, grad_bias, None, None, None


def all_gather_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, group,
                      label: str = TP_LABEL, dim: int = 1) -> torch.Tensor:
    """`F.linear` of the whole sequence from this rank's shard `x` (AllGather along `dim`), keeping only the shard
    for backward, which gathers it again: Megatron-LM's sequence-parallel column-parallel layer."""
    d = _sequence_dim(x, dim, _group_size_and_rank(group)[0])
    return AllGatherLinear.apply(x, weight, bias, group, label, d)
