"""Lesson 12's sequence-parallel exercise: the learner writes the pair that ends a row-parallel region under
sequence parallelism (Korthikanti et al.'s ḡ), on fsdp_mini's collectives.

`reduce_scatter_to_sequence(partial, group)`: `partial` is this rank's (batch, seq, hidden) partial sum, the
output of its slice of a row-parallel layer; return the summed output at this rank's positions only,
(batch, seq / n, hidden): a ReduceScatter along the sequence (dim 1) in forward, and in backward an
AllGather of the gradient, which the layer before needs for the whole sequence. The judge requires an
autograd Function (an in-place collective outside one gives right values and no backward of its own),
runs the pair at worlds 2 and 4 after a row-parallel product, compares the output and the gradients of
the input slice and the weight slice with one process's, and counts the collectives in each direction
with CommLog: exactly one ReduceScatter forward and one AllGather backward, each of the whole activation.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from fsdp_mini.collectives import all_gather_into_tensor, all_reduce, reduce_scatter_tensor
from fsdp_mini.comm_log import CommLog
from fsdp_mini.course.exercise import CodeExercise, NotYet, Verdict
from fsdp_mini.course.exercises.tensor_parallel import NOT_AN_AUTOGRAD_FUNCTION, through_autograd_function
from fsdp_mini.course.language import num, tr
from fsdp_mini.run import launch

__all__ = ["REDUCE_SCATTER_TO_SEQUENCE", "reduce_scatter_to_sequence", "SP_WORLDS"]

SP_WORLDS = (2, 4)
_B, _T, _IN, _OUT = 4, 8, 8, 6  # 8 positions: 4 or 2 per rank; batch 4, so a cut of the wrong dim also fits
_TIMEOUT_S = 60
TOL = dict(rtol=1e-5, atol=1e-6)


# --- the reference solution (the lesson's folded solution is its source) --------------------------------

def reduce_scatter_to_sequence(partial, group):
    class ReduceScatterToSequence(torch.autograd.Function):
        @staticmethod
        def forward(ctx, partial):
            n = dist.get_world_size(group)
            # fsdp_mini's collectives cut dim 0: bring the sequence (dim 1) to the front
            front = partial.transpose(0, 1).contiguous()
            mine = torch.empty(front.shape[0] // n, *front.shape[1:])
            reduce_scatter_tensor(mine, front, group=group)  # summed over ranks, my positions
            return mine.transpose(0, 1).contiguous()

        @staticmethod
        def backward(ctx, grad):
            n = dist.get_world_size(group)
            front = grad.transpose(0, 1).contiguous()
            whole = torch.empty(n * front.shape[0], *front.shape[1:])
            # every rank's positions, in rank order
            all_gather_into_tensor(whole, front, group=group)
            return whole.transpose(0, 1).contiguous()

    return ReduceScatterToSequence.apply(partial)


# --- plausible mistakes, which the judge must catch (tests/course/test_exercise_sequence_parallel.py) ----------

def _all_reduce_then_keep_mine(partial, group):
    class AllReduceThenKeepMine(torch.autograd.Function):
        @staticmethod
        def forward(ctx, partial):
            summed = partial.clone()
            all_reduce(summed, group=group)  # the right values, twice the bytes of a ReduceScatter
            n, r = dist.get_world_size(group), dist.get_rank(group)
            return summed.chunk(n, dim=1)[r].contiguous()

        @staticmethod
        def backward(ctx, grad):
            n = dist.get_world_size(group)
            front = grad.transpose(0, 1).contiguous()
            whole = torch.empty(n * front.shape[0], *front.shape[1:])
            all_gather_into_tensor(whole, front, group=group)
            return whole.transpose(0, 1).contiguous()

    return AllReduceThenKeepMine.apply(partial)


def _gather_on_the_batch_dim(partial, group):
    class GatherOnTheBatchDim(torch.autograd.Function):
        @staticmethod
        def forward(ctx, partial):
            n = dist.get_world_size(group)
            front = partial.transpose(0, 1).contiguous()
            mine = torch.empty(front.shape[0] // n, *front.shape[1:])
            reduce_scatter_tensor(mine, front, group=group)
            return mine.transpose(0, 1).contiguous()

        @staticmethod
        def backward(ctx, grad):
            n = dist.get_world_size(group)
            whole = torch.empty(n * grad.shape[0], *grad.shape[1:])
            all_gather_into_tensor(whole, grad.contiguous(), group=group)  # stacked along the batch
            return whole.view(grad.shape[0], -1, grad.shape[2])  # the right shape, the values misplaced

    return GatherOnTheBatchDim.apply(partial)


def _scatter_on_the_batch_dim(partial, group):
    class ScatterOnTheBatchDim(torch.autograd.Function):
        @staticmethod
        def forward(ctx, partial):
            n = dist.get_world_size(group)
            mine = torch.empty(partial.shape[0] // n, *partial.shape[1:])
            reduce_scatter_tensor(mine, partial.contiguous(), group=group)  # dim 0 is the batch
            return mine

        @staticmethod
        def backward(ctx, grad):
            n = dist.get_world_size(group)
            whole = torch.empty(n * grad.shape[0], *grad.shape[1:])
            all_gather_into_tensor(whole, grad.contiguous(), group=group)
            return whole

    return ScatterOnTheBatchDim.apply(partial)


def _no_backward(partial, group):
    n = dist.get_world_size(group)
    front = partial.transpose(0, 1).contiguous()
    mine = torch.empty(front.shape[0] // n, *front.shape[1:])
    reduce_scatter_tensor(mine, front, group=group)  # a plain collective: autograd sees nothing
    return mine.transpose(0, 1).contiguous()


def _backward_keeps_the_shard(partial, group):
    class BackwardKeepsTheShard(torch.autograd.Function):
        @staticmethod
        def forward(ctx, partial):
            n = dist.get_world_size(group)
            front = partial.transpose(0, 1).contiguous()
            mine = torch.empty(front.shape[0] // n, *front.shape[1:])
            reduce_scatter_tensor(mine, front, group=group)
            return mine.transpose(0, 1).contiguous()

        @staticmethod
        def backward(ctx, grad):  # the gradient of this rank's positions, zeros elsewhere: no AllGather
            n, r = dist.get_world_size(group), dist.get_rank(group)
            whole = torch.zeros(grad.shape[0], n * grad.shape[1], grad.shape[2])
            whole[:, r * grad.shape[1]:(r + 1) * grad.shape[1]] = grad
            return whole

    return BackwardKeepsTheShard.apply(partial)


# --- the judge ----------------------------------------------------------------------------------------------

def _full_trial():
    g = torch.Generator().manual_seed(28)
    x, w = (torch.randn(shape, generator=g) for shape in ((_B, _T, _IN), (_OUT, _IN)))
    probe = torch.randn((_B, _T, _OUT), generator=g)  # the loss is (out * probe).sum(): every output counts
    return x, w, probe


def _one_process():
    x, w, probe = (t.clone() for t in _full_trial())
    x.requires_grad_(True)
    w.requires_grad_(True)
    out = x @ w.t()
    (out * probe).sum().backward()
    return out.detach(), x.grad, w.grad


def _run(fn):
    """On each rank: its slice of a row-parallel product, the learner's pair, a loss on this rank's positions."""
    n, r = dist.get_world_size(), dist.get_rank()
    x, w, probe = _full_trial()
    x_shard = x.chunk(n, dim=-1)[r].clone().requires_grad_(True)  # this rank's input features
    w_shard = w.chunk(n, dim=1)[r].clone().requires_grad_(True)  # the matching columns of the weight
    partial = x_shard @ w_shard.t()
    with CommLog() as forward:
        try:
            out = fn(partial, None)
        except NotImplementedError:
            return None
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (_B, _T // n, _OUT):
        return dict(shape=tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__)
    res = dict(out=out.detach(), function=through_autograd_function(out),
               fwd=[(rec.op, rec.nbytes) for rec in forward.records], bwd=[], backward_error=None)
    if not out.requires_grad:
        res["grads"] = [torch.zeros_like(x_shard), torch.zeros_like(w_shard)]
        return res
    with CommLog() as backward:
        try:
            (out * probe.chunk(n, dim=1)[r]).sum().backward()
        except RuntimeError as e:
            res["backward_error"] = str(e).strip().splitlines()[0]
    res["bwd"] = [(rec.op, rec.nbytes) for rec in backward.records]
    res["grads"] = [t.grad if t.grad is not None else torch.zeros_like(t) for t in (x_shard, w_shard)]
    return res


_OPS = {"all_gather": "AllGather", "reduce_scatter": "ReduceScatter", "all_reduce": "AllReduce"}


def _seen(ops) -> str:
    unit = tr("B", "Б")
    return ", ".join(f"{_OPS.get(op, op)} ({num(nbytes)} {unit})" for op, nbytes in ops) or tr("none", "ни одной")


def _judge(fn) -> Verdict:
    want_out, gx, gw = _one_process()
    activation = 4 * _B * _T * _OUT  # the whole (batch, seq, hidden) fp32 tensor: what each collective moves
    for world in SP_WORLDS:
        where = tr(f"world {world}, ", f"число рангов {world}, ")
        results = launch(_run, world, args=(fn,), timeout=_TIMEOUT_S)
        if any(res is None for res in results):
            raise NotYet
        for rank, res in enumerate(results):
            if "shape" in res:
                return Verdict.wrong(where + tr(
                    f"rank {rank}: return this rank's positions of the summed output, shape {(_B, _T // world, _OUT)} "
                    f"(the sequence is dim 1); got {res['shape']}",
                    f"ранг {rank}: верните позиции этого ранга из суммированного выхода, форма "
                    f"{(_B, _T // world, _OUT)} (последовательность — измерение 1); получено {res['shape']}"))
            mine = want_out.chunk(world, dim=1)[rank]
            if not torch.allclose(res["out"], mine, **TOL):
                return Verdict.wrong(where + tr(
                    f"rank {rank}: the output differs from one process's at this rank's positions (the ranks' partial "
                    f"sums added, positions {rank * _T // world}..{(rank + 1) * _T // world - 1} kept)",
                    f"ранг {rank}: выход отличается от выхода одного процесса на позициях этого ранга (частичные суммы "
                    f"рангов сложены, оставлены позиции {rank * _T // world}..{(rank + 1) * _T // world - 1})"))
            if not res["function"]:
                return Verdict.wrong(where + tr(f"rank {rank}: the output is right, but ",
                                                f"ранг {rank}: выход верен, но ") + tr(*NOT_AN_AUTOGRAD_FUNCTION))
            if res["backward_error"]:
                return Verdict.wrong(where + tr(f"rank {rank}: backward failed: ",
                                                f"ранг {rank}: backward упал: ") + res["backward_error"])
            seen = tr(f"CommLog saw in forward: {_seen(res['fwd'])}; in backward: {_seen(res['bwd'])}",
                      f"CommLog увидел в forward: {_seen(res['fwd'])}; в backward: {_seen(res['bwd'])}")
            for name, got, full in (("the input slice", res["grads"][0], gx.chunk(world, dim=-1)[rank]),
                                    ("the weight slice", res["grads"][1], gw.chunk(world, dim=1)[rank])):
                if not torch.allclose(got, full, **TOL):
                    hint = tr(" (the right numbers in the wrong places: gather the gradient along the sequence, dim 1, "
                              "in rank order)", " (верные числа не на своих местах: собирайте градиент по "
                              "последовательности, измерению 1, в порядке рангов)") if torch.allclose(
                        got.flatten().sort().values, full.flatten().sort().values, **TOL) else ""
                    name_ru = {"the input slice": "среза входа", "the weight slice": "среза весов"}[name]
                    return Verdict.wrong(where + tr(
                        f"rank {rank}: the gradient of {name} differs from one process's{hint}; {seen}",
                        f"ранг {rank}: градиент {name_ru} отличается от градиента одного процесса{hint}; {seen}"))
            if res["fwd"] != [("reduce_scatter", activation)] or res["bwd"] != [("all_gather", activation)]:
                return Verdict.wrong(where + tr(
                    f"rank {rank}: the pair is one ReduceScatter forward and one AllGather backward, each of the whole "
                    f"activation ({num(activation)} B), the two halves of TP's AllReduce; {seen}",
                    f"ранг {rank}: пара — это один ReduceScatter в forward и один AllGather в backward, каждый "
                    f"на всю активацию ({num(activation)} Б), две половины AllReduce из TP; {seen}"))
    return Verdict.right(tr(
        "At 2 and 4 ranks each rank's positions of the output and the gradients of the input and weight slices equal "
        "one process's, with one ReduceScatter in forward and one AllGather in backward: the bytes of one AllReduce.",
        "На 2 и 4 рангах позиции выхода каждого ранга и градиенты срезов входа и весов совпадают с одним процессом: "
        "один ReduceScatter в forward и один AllGather в backward, столько же байтов, сколько у одного "
        "AllReduce."))


REDUCE_SCATTER_TO_SEQUENCE = CodeExercise(
    "12.reduce_scatter_to_sequence", _judge, reduce_scatter_to_sequence,
    (_all_reduce_then_keep_mine, _gather_on_the_batch_dim, _scatter_on_the_batch_dim, _no_backward,
     _backward_keeps_the_shard))
