"""Lesson 05's exercises: two of a flat parameter's state changes, written by the learner against
`fsdp_mini.fsdp.flat_param.FlatLayout`.

1. `unshard_flat(shard, layout, group)`: AllGather this rank's padded shard into the full flat buffer and
   return each original parameter as a view of it. Judged on real ranks against what `fsdp_mini.FSDP`'s
   own handle holds after its unshard, by storage sharing (views of one buffer the size of the padded
   flat parameter: a copy per parameter would double the unit's memory) and by CommLog (one AllGather of
   the padded bytes).
2. `reduce_gradient(flat_grad, layout, group)`: pad this rank's full flat gradient, ReduceScatter it with
   AVG and return this rank's gradient shard. Judged against the `shard.grad` that `fsdp_mini.FSDP`
   produces for the same model and per-rank data, and by CommLog (one ReduceScatter of the padded bytes).
   Every rank's data is known, so a wrong shard is read against the whole averaged gradient: the verdict
   says which elements it holds (padding at the front, a shifted window) or by what factor it is off.

The trial unit has 59 elements (prime): at worlds 2, 3 and 4 it never divides, so padding always matters,
and shard boundaries fall inside parameters.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn

from fsdp_mini import collectives as C
from fsdp_mini.comm_log import CommLog
from fsdp_mini.course.exercise import (CodeExercise, NotYet, Verdict, one_collective_problem,
                                       summed_not_averaged)
from fsdp_mini.course.language import num, tr
from fsdp_mini.fsdp.flat_param import FlatLayout
from fsdp_mini.run import launch

__all__ = ["UNSHARD_FLAT", "REDUCE_GRADIENT", "unshard_flat", "reduce_gradient", "trial_unit", "WORLDS"]

WORLDS = (2, 3, 4)
_TIMEOUT_S = 60


# --- reference solutions (the lesson's folded solutions are these functions' source) ------------------

def unshard_flat(shard: torch.Tensor, layout: FlatLayout, group=None) -> list[torch.Tensor]:
    full = shard.new_empty(layout.padded_numel)  # n equal shards side by side, padding included
    C.all_gather_into_tensor(full, shard, group=group)  # one AllGather for the whole unit
    # views: no copy
    return [full[p.offset:p.offset + p.numel].view(p.shape) for p in layout.params]


def reduce_gradient(flat_grad: torch.Tensor, layout: FlatLayout, group=None) -> torch.Tensor:
    padded = flat_grad.new_zeros(layout.padded_numel)  # zero padding: n equal chunks
    padded[:layout.numel] = flat_grad
    shard = flat_grad.new_empty(layout.shard_numel)
    # average over ranks, keep chunk `rank`
    C.reduce_scatter_tensor(shard, padded, C.AVG, group=group)
    return shard


# --- plausible mistakes, which the judges must catch (tests/course/test_exercise.py) -------------------------

def _unshard_copies(shard, layout, group=None):
    full = shard.new_empty(layout.padded_numel)
    C.all_gather_into_tensor(full, shard, group=group)
    return [full[p.offset:p.offset + p.numel].clone().view(p.shape) for p in layout.params]  # a copy each


def _unshard_with_all_reduce(shard, layout, group=None):
    full = shard.new_zeros(layout.padded_numel)  # zeros everywhere but this rank's shard, then sum
    lo, hi = layout.shard_range(dist.get_rank(group))
    full[lo:hi] = shard
    C.all_reduce(full, group=group)
    return [full[p.offset:p.offset + p.numel].view(p.shape) for p in layout.params]


def _unshard_unpadded(shard, layout, group=None):
    full = shard.new_empty(layout.numel)  # the parameters' elements only: no room for the padding
    C.all_gather_into_tensor(full, shard, group=group)
    return [full[p.offset:p.offset + p.numel].view(p.shape) for p in layout.params]


def _reduce_sum(flat_grad, layout, group=None):
    padded = flat_grad.new_zeros(layout.padded_numel)
    padded[:layout.numel] = flat_grad
    shard = flat_grad.new_empty(layout.shard_numel)
    C.reduce_scatter_tensor(shard, padded, group=group)  # SUM, the default: n times too large
    return shard


def _reduce_floor_without_padding(flat_grad, layout, group=None):
    n = dist.get_world_size(group)
    size = layout.numel // n  # rounds down, and drops the tail instead of padding it
    shard = flat_grad.new_empty(size)
    C.reduce_scatter_tensor(shard, flat_grad[:n * size].contiguous(), C.AVG, group=group)
    return shard


def _reduce_front_padding(flat_grad, layout, group=None):
    padded = flat_grad.new_zeros(layout.padded_numel)
    padded[layout.padding:] = flat_grad  # the zeros first: every element moves by the padding
    shard = flat_grad.new_empty(layout.shard_numel)
    C.reduce_scatter_tensor(shard, padded, C.AVG, group=group)
    return shard


def _reduce_averaged_twice(flat_grad, layout, group=None):
    padded = flat_grad.new_zeros(layout.padded_numel)
    padded[:layout.numel] = flat_grad
    shard = flat_grad.new_empty(layout.shard_numel)
    C.reduce_scatter_tensor(shard, padded, C.AVG, group=group)
    return shard / dist.get_world_size(group)  # AVG has divided by n already


def _reduce_with_all_reduce(flat_grad, layout, group=None):
    padded = flat_grad.new_zeros(layout.padded_numel)
    padded[:layout.numel] = flat_grad
    C.all_reduce(padded, C.AVG, group=group)  # right values, but every rank receives everything
    lo, hi = layout.shard_range(dist.get_rank(group))
    return padded[lo:hi]


# --- the trial unit and what each rank runs ------------------------------------------------------------

def trial_unit() -> nn.Module:
    """A unit of 59 elements (prime, so no world divides it): Linear(4, 7), Tanh, Linear(7, 3)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 7), nn.Tanh(), nn.Linear(7, 3))


def trial_input(rank: int) -> torch.Tensor:
    """Rank `rank`'s batch: every rank gets different rows, so the average of gradients is not any one's."""
    return torch.randn(5, 4, generator=torch.Generator().manual_seed(100 + rank))


@dataclass(frozen=True)
class RankOutcome:
    """One rank's trial: the learner's tensors and the library's, the storage facts of the learner's
    (one shared storage? its bytes, each tensor's offset in it), the collectives CommLog saw."""

    got: tuple | None
    want: tuple
    collectives: tuple[tuple[str, int], ...] = ()
    shared_storage: bool = False
    storage_nbytes: int = 0
    offsets: tuple[int, ...] = ()
    not_yet: bool = False
    bad_return: str = ""
    averaged: torch.Tensor | None = None  # reduce_gradient: the whole flat gradient averaged over ranks


def _fsdp_unit():
    from fsdp_mini.fsdp.fully_sharded_data_parallel import FSDP  # imported where used: the module list stays light
    model = FSDP(trial_unit())
    return model, model.handles[0]


def _run_unshard(fn) -> RankOutcome:
    model, handle = _fsdp_unit()
    shard = handle.sharded_param.detach().clone()
    with CommLog() as log:
        try:
            out = fn(shard, handle.layout, None)
        except NotImplementedError:
            return RankOutcome(None, (), not_yet=True)
    model.units[0].unshard()
    want = tuple(leaf.detach().clone() for leaf in handle.leaves)
    count = len(handle.layout.params)
    if not isinstance(out, (list, tuple)) or len(out) != count or not all(isinstance(t, torch.Tensor) for t in out):
        return RankOutcome(None, want, bad_return=tr(
            f"return a list of {count} tensors, one per parameter (got {type(out).__name__})",
            f"верните список из {count} тензоров, по одному на параметр (получено: {type(out).__name__})"))
    ptrs = {t.untyped_storage().data_ptr() for t in out}
    return RankOutcome(tuple(t.detach().clone() for t in out), want, tuple((r.op, r.nbytes) for r in log.records),
                       shared_storage=len(ptrs) == 1, storage_nbytes=out[0].untyped_storage().nbytes(),
                       offsets=tuple(t.storage_offset() for t in out))


def _flat_gradient(layout: FlatLayout, rank: int) -> torch.Tensor:
    """Rank `rank`'s own full gradient of the trial unit, flattened in the layout's order (no padding)."""
    local = trial_unit()
    local(trial_input(rank)).sum().backward()
    grads = dict(local.named_parameters())
    return torch.cat([grads[p.names[0]].grad.reshape(-1) for p in layout.params])


def _run_reduce(fn) -> RankOutcome:
    rank, world = dist.get_rank(), dist.get_world_size()
    model, handle = _fsdp_unit()
    model(trial_input(rank)).sum().backward()  # the library leaves the averaged gradient in shard.grad
    flat = _flat_gradient(handle.layout, rank)  # this rank's own full gradient, as one process computes it
    # every rank's data is known: the whole averaged gradient, to say which elements a wrong shard holds
    averaged = sum(_flat_gradient(handle.layout, r) for r in range(world)) / world
    with CommLog() as log:
        try:
            out = fn(flat, handle.layout, None)
        except NotImplementedError:
            return RankOutcome(None, (), not_yet=True)
    want = (handle.sharded_param.grad.detach().clone(),)
    if not isinstance(out, torch.Tensor):
        return RankOutcome(None, want, bad_return=tr(
            f"return this rank's gradient shard, one tensor (got {type(out).__name__})",
            f"верните шард градиента этого ранга, один тензор (получено: {type(out).__name__})"))
    return RankOutcome((out.detach().clone(),), want, tuple((r.op, r.nbytes) for r in log.records),
                       averaged=averaged)


def _what_the_shard_holds(got: torch.Tensor, want: torch.Tensor, averaged: torch.Tensor, layout: FlatLayout,
                          rank: int) -> str:
    """Why a gradient shard of the right size differs from FSDP's: averaged twice, padding at the front,
    or a window of the averaged gradient at another offset. "" when none of these explains it."""
    world = layout.n
    lo = rank * layout.shard_numel
    if torch.allclose(got * world, want, rtol=1e-5, atol=1e-6):
        return tr(f" (1/{world} of FSDP's: averaged twice; the ReduceScatter with AVG has divided by n already)",
                  f" (1/{world} от значения FSDP: усреднено дважды; ReduceScatter с AVG уже поделил на n)")
    front = torch.cat([averaged.new_zeros(layout.padding), averaged])[lo:lo + layout.shard_numel]
    if layout.padding and torch.allclose(got, front, rtol=1e-5, atol=1e-6):
        return tr(f" (your padding comes first: every element moves by the padding ({layout.padding}) and "
                  f"each rank's chunk holds its neighbour's elements; the layout pads at the end, after the "
                  f"last parameter)",
                  f" (у вас паддинг стоит в начале: каждый элемент сдвигается на длину паддинга "
                  f"({layout.padding}), и чанк ранга захватывает чужие элементы; раскладка дополняет нулями "
                  f"конец, после последнего параметра)")
    padded = torch.cat([averaged, averaged.new_zeros(layout.padding)])
    for start in range(padded.numel() - got.numel() + 1):
        if start != lo and torch.allclose(got, padded[start:start + got.numel()], rtol=1e-5, atol=1e-6):
            return tr(f" (your shard holds elements {start}..{start + got.numel() - 1} of the averaged flat "
                      f"gradient; rank {rank}'s shard is elements {lo}..{lo + layout.shard_numel - 1})",
                      f" (ваш шард содержит элементы {start}..{start + got.numel() - 1} усреднённого плоского "
                      f"градиента; шард ранга {rank} — элементы {lo}..{lo + layout.shard_numel - 1})")
    return ""


def _on_ranks(run, fn, world: int) -> list[RankOutcome]:
    outcomes = launch(run, world, args=(fn,), timeout=_TIMEOUT_S)
    if any(o.not_yet for o in outcomes):
        raise NotYet
    return outcomes


@functools.cache
def trial_layout(world: int) -> FlatLayout:
    """The trial unit's flat layout over `world` ranks, as FSDP plans it (no process needed)."""
    from fsdp_mini.course.viz.shards import unit_layouts
    return unit_layouts(trial_unit(), (), world)["root"]


def _collectives_verdict(outcome: RankOutcome, op: str, world: int, rank: int) -> str:
    """"" when CommLog saw exactly one `op` of the unit's padded bytes, else what it saw instead."""
    layout = trial_layout(world)
    return one_collective_problem(
        outcome.collectives, op, layout.padded_numel * 4, world, rank,
        (f"the padded flat parameter's ({layout.numel} elements padded to {layout.padded_numel})",
         f"плоского параметра с паддингом ({layout.numel} элементов, с паддингом {layout.padded_numel})"))


# --- exercise 1: unshard_flat ----------------------------------------------------------------------------

def _judge_unshard(fn) -> Verdict:
    for world in WORLDS:
        layout = trial_layout(world)
        for rank, o in enumerate(_on_ranks(_run_unshard, fn, world)):
            if o.bad_return:
                return Verdict.wrong(o.bad_return)
            for p, got, want in zip(layout.params, o.got, o.want):
                if got.shape != want.shape or not torch.equal(got, want):
                    what = (tr(f"has shape {tuple(got.shape)}, the handle's view {tuple(want.shape)}",
                               f"имеет форму {tuple(got.shape)}, а вид handle — {tuple(want.shape)}")
                            if got.shape != want.shape else
                            tr("differs from what FSDP's handle holds after its unshard",
                               "отличается от того, что держит handle FSDP после своего unshard"))
                    return Verdict.wrong(tr(f"world {world}, rank {rank}: parameter {p.names[0]} {what}",
                                            f"число рангов {world}, ранг {rank}: параметр {p.names[0]} {what}"))
            if not o.shared_storage:
                return Verdict.wrong(tr(
                    f"world {world}, rank {rank}: the values are right, but the parameters do not share one "
                    f"storage: each is a copy, so the unit's gathered memory doubles and freeing the flat buffer "
                    f"would not free them",
                    f"число рангов {world}, ранг {rank}: значения верны, но параметры не делят одно хранилище: каждый — "
                    f"копия, так что память собранного юнита удваивается, а освобождение плоского буфера их не "
                    f"освободит"))
            if o.storage_nbytes != layout.padded_numel * 4 or o.offsets != tuple(p.offset for p in layout.params):
                return Verdict.wrong(tr(
                    f"world {world}, rank {rank}: the parameters share a storage of {num(o.storage_nbytes)} B at "
                    f"offsets {list(o.offsets)}: they should be views of the gathered flat buffer itself "
                    f"({num(layout.padded_numel * 4)} B), where the layout places them",
                    f"число рангов {world}, ранг {rank}: параметры делят хранилище в {num(o.storage_nbytes)} Б со "
                    f"смещениями {list(o.offsets)}: они должны быть видами самого собранного плоского буфера "
                    f"({num(layout.padded_numel * 4)} Б), там, где их располагает раскладка"))
            problem = _collectives_verdict(o, "all_gather", world, rank)
            if problem:
                return Verdict.wrong(problem)
    return Verdict.right(tr("At worlds 2, 3 and 4 your views hold what FSDP's handle holds, in one padded buffer "
                            "filled by one AllGather.",
                            "При 2, 3 и 4 рангах ваши виды содержат то же, что handle FSDP, в одном буфере с "
                            "паддингом, заполненном одним AllGather."))


# --- exercise 2: reduce_gradient -------------------------------------------------------------------------

def _judge_reduce(fn) -> Verdict:
    for world in WORLDS:
        for rank, o in enumerate(_on_ranks(_run_reduce, fn, world)):
            if o.bad_return:
                return Verdict.wrong(o.bad_return)
            got, want = o.got[0], o.want[0]
            if got.shape != want.shape:
                layout = trial_layout(world)
                floor = (tr(f" ({layout.numel} // {world}: rounding down drops the last elements; round up and "
                            f"pad the flat gradient to {layout.padded_numel})",
                            f" ({layout.numel} // {world}: при округлении вниз последние элементы теряются; "
                            f"округлите вверх и дополните плоский градиент до {layout.padded_numel})")
                         if got.numel() == layout.numel // world else "")
                return Verdict.wrong(tr(
                    f"world {world}, rank {rank}: FSDP's gradient shard has {want.numel()} elements, yours "
                    f"has shape {tuple(got.shape)}{floor}",
                    f"число рангов {world}, ранг {rank}: шард градиента у FSDP — {want.numel()} элементов, у вас "
                    f"форма {tuple(got.shape)}{floor}"))
            if not torch.allclose(got, want, rtol=1e-5, atol=1e-6):
                hint = (tr(f" ({num(float(world), 1)} times FSDP's: a ReduceScatter sums unless asked to average)",
                           f" (в {num(float(world), 1)} раза больше, чем у FSDP: ReduceScatter суммирует, если не "
                           f"попросить усреднить)") if summed_not_averaged(got, want, world)
                        else _what_the_shard_holds(got, want, o.averaged, trial_layout(world), rank))
                return Verdict.wrong(tr(
                    f"world {world}, rank {rank}: your gradient shard is not the shard.grad FSDP produces for "
                    f"the same data{hint}",
                    f"число рангов {world}, ранг {rank}: ваш шард градиента не равен shard.grad, который FSDP получает "
                    f"на тех же данных{hint}"))
            problem = _collectives_verdict(o, "reduce_scatter", world, rank)
            if problem:
                return Verdict.wrong(problem)
    return Verdict.right(tr("At worlds 2, 3 and 4 each rank's shard is FSDP's shard.grad, from one ReduceScatter.",
                            "При 2, 3 и 4 рангах шард каждого ранга равен shard.grad у FSDP, и получен одним "
                            "ReduceScatter."))


UNSHARD_FLAT = CodeExercise("05.unshard_flat", _judge_unshard, unshard_flat,
                            (_unshard_copies, _unshard_with_all_reduce, _unshard_unpadded))
REDUCE_GRADIENT = CodeExercise("05.reduce_gradient", _judge_reduce, reduce_gradient,
                               (_reduce_sum, _reduce_floor_without_padding, _reduce_with_all_reduce,
                                _reduce_front_padding, _reduce_averaged_twice))
