"""Lesson 09's exercises: the three mechanisms of per-parameter sharding, written by the learner.

1. `dim0_shard(full, rank, world)`: which rows of a parameter a rank keeps. Judged against what
   `fsdp_mini.fully_shard` really holds on each rank, at worlds 2, 3 and 4, on shapes that do not divide.
2. `unshard(chunks, shapes, group)`: copy-in, one AllGather, copy-out. Run on real ranks; judged by the
   gathered values and by CommLog (one AllGather of the padded bytes for the whole unit).
3. `reduce_grads(grads, group)`: the mirror for gradients: one averaged ReduceScatter that leaves each
   rank its chunk of every gradient. Judged against the average of every rank's gradients, and CommLog.

The trial shapes are awkward on purpose: 61 rows (prime), a bias of 7, a weight with fewer rows than
ranks (some ranks hold nothing) and a 3-D tensor.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn

from fsdp_mini import collectives as C
from fsdp_mini.comm_log import CommLog
from fsdp_mini.course.exercise import (CodeExercise, NotYet, Verdict, one_collective_problem,
                                        summed_not_averaged)
from fsdp_mini.course.language import num, tr
from fsdp_mini.launch import launch

__all__ = ["DIM0_SHARD", "UNSHARD", "REDUCE_GRADS", "dim0_shard", "unshard", "reduce_grads", "TRIAL_SHAPES", "WORLDS"]

TRIAL_SHAPES = ((61, 30), (7,), (3, 5), (2, 3, 4))
WORLDS = (2, 3, 4)
_TIMEOUT_S = 60


# --- reference solutions (the lesson's folded solutions are these functions' source) ------------------

def dim0_shard(full: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    rows = math.ceil(full.shape[0] / world)  # every rank's share, rounded up
    start = min(rank * rows, full.shape[0])
    return full[start:start + rows]  # the last ranks may get fewer rows, or none


def unshard(chunks: list[torch.Tensor], shapes: list[torch.Size], group=None) -> list[torch.Tensor]:
    n = dist.get_world_size(group)
    padded = []
    # copy-in: pad every chunk to the same rows on every rank
    for chunk, shape in zip(chunks, shapes):
        rows = math.ceil(shape[0] / n)
        piece = chunk.new_zeros((rows, *shape[1:]))
        piece[:chunk.shape[0]] = chunk
        padded.append(piece.reshape(-1))
    row = torch.cat(padded)  # this rank's row of the gathered buffer
    gathered = torch.empty((n, row.numel()), dtype=row.dtype)
    # one AllGather for the whole unit
    C.all_gather_into_tensor(gathered.view(-1), row, group=group)
    fulls, offset = [], 0
    # copy-out: parameter i is column block i, rank after rank
    for piece, shape in zip(padded, shapes):
        block = gathered[:, offset:offset + piece.numel()]
        fulls.append(block.reshape(-1, *shape[1:])[:shape[0]])
        offset += piece.numel()
    return fulls


def reduce_grads(grads: list[torch.Tensor], group=None) -> list[torch.Tensor]:
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    blocks = []
    # each gradient padded to n equal chunks; row j of the view: what rank j will own
    for g in grads:
        rows = math.ceil(g.shape[0] / n)
        padded = g.new_zeros((n * rows, *g.shape[1:]))
        padded[:g.shape[0]] = g
        blocks.append(padded.view(n, -1))
    # rank by rank: [rank 0's chunks | rank 1's chunks | ...]
    send = torch.cat(blocks, dim=1).reshape(-1)
    mine = torch.empty(send.numel() // n, dtype=send.dtype)
    # one ReduceScatter, averaged over ranks
    C.reduce_scatter_tensor(mine, send, C.AVG, group=group)
    out, offset = [], 0
    for g, block in zip(grads, blocks):
        rows = math.ceil(g.shape[0] / n)
        chunk = mine[offset:offset + block.shape[1]].view(rows, *g.shape[1:])
        # drop this rank's padding rows
        out.append(chunk[:max(0, min(rows, g.shape[0] - rank * rows))])
        offset += block.shape[1]
    return out


# --- plausible mistakes, which the judges must catch (tests/test_exercise.py) ------------------------

def _shard_floor_split(full, rank, world):
    return full.tensor_split(world)[rank]  # sizes differ by one row: not the rows FSDP2 keeps


def _shard_torch_chunk(full, rank, world):
    return full.chunk(world)[rank]  # torch.chunk returns fewer chunks than ranks for short tensors


def _unshard_one_gather_per_parameter(chunks, shapes, group=None):
    n = dist.get_world_size(group)
    fulls = []
    for chunk, shape in zip(chunks, shapes):
        rows = math.ceil(shape[0] / n)
        piece = chunk.new_zeros((rows, *shape[1:]))
        piece[:chunk.shape[0]] = chunk
        out = torch.empty((n * rows, *shape[1:]), dtype=chunk.dtype)
        C.all_gather_into_tensor(out, piece, group=group)
        fulls.append(out[:shape[0]])
    return fulls


def _unshard_parameter_major_copy_out(chunks, shapes, group=None):
    n = dist.get_world_size(group)
    padded = []
    for chunk, shape in zip(chunks, shapes):
        piece = chunk.new_zeros((math.ceil(shape[0] / n), *shape[1:]))
        piece[:chunk.shape[0]] = chunk
        padded.append(piece.reshape(-1))
    row = torch.cat(padded)
    gathered = torch.empty(n * row.numel(), dtype=row.dtype)
    C.all_gather_into_tensor(gathered, row, group=group)
    fulls, offset = [], 0
    for piece, shape in zip(padded, shapes):  # reads the buffer as if it held parameter after parameter
        fulls.append(gathered[offset:offset + n * piece.numel()].view(-1, *shape[1:])[:shape[0]])
        offset += n * piece.numel()
    return fulls


def _reduce_parameter_major(grads, group=None):
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    flat = []
    for g in grads:
        rows = math.ceil(g.shape[0] / n)
        padded = g.new_zeros((n * rows, *g.shape[1:]))
        padded[:g.shape[0]] = g
        flat.append(padded.reshape(-1))
    send = torch.cat(flat)  # parameter after parameter: rank r receives a slice, not its chunk of each
    mine = torch.empty(send.numel() // n, dtype=send.dtype)
    C.reduce_scatter_tensor(mine, send, C.AVG, group=group)
    out, offset = [], 0
    for g in grads:
        rows = math.ceil(g.shape[0] / n)
        size = rows * math.prod(g.shape[1:])
        out.append(mine[offset:offset + size].view(rows, *g.shape[1:])[:max(0, min(rows, g.shape[0] - rank * rows))])
        offset += size
    return out


def _reduce_with_all_reduce(grads, group=None):
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    out = []
    for g in grads:
        total = g.clone()
        C.all_reduce(total, C.AVG, group=group)  # right values, but every rank receives everything
        out.append(dim0_shard(total, rank, n))
    return out


def _reduce_sum_not_average(grads, group=None):
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    blocks = []
    for g in grads:
        rows = math.ceil(g.shape[0] / n)
        padded = g.new_zeros((n * rows, *g.shape[1:]))
        padded[:g.shape[0]] = g
        blocks.append(padded.view(n, -1))
    send = torch.cat(blocks, dim=1).reshape(-1)
    mine = torch.empty(send.numel() // n, dtype=send.dtype)
    C.reduce_scatter_tensor(mine, send, group=group)  # SUM, the default: n times too large
    out, offset = [], 0
    for g, block in zip(grads, blocks):
        rows = math.ceil(g.shape[0] / n)
        out.append(mine[offset:offset + block.shape[1]].view(rows, *g.shape[1:])[:max(0, min(rows, g.shape[0] - rank * rows))])
        offset += block.shape[1]
    return out


# --- what the judges run on each rank ------------------------------------------------------------------

@dataclass(frozen=True)
class RankOutcome:
    """What one rank's trial returned: the learner's tensors and the collectives CommLog saw (op, bytes);
    `not_yet` when the function's body still raises NotImplementedError."""

    tensors: tuple | None
    collectives: tuple[tuple[str, int], ...] = ()
    not_yet: bool = False
    bad_return: str = ""


def trial_tensor(shape, index: int, rank: int = 0) -> torch.Tensor:
    """A deterministic tensor for trial parameter `index` (and, for gradients, rank `rank`)."""
    g = torch.Generator().manual_seed(1000 * rank + index)
    return torch.randn(shape, generator=g)


def _as_tensors(out, count: int) -> tuple[tuple | None, str]:
    if not isinstance(out, (list, tuple)) or len(out) != count or not all(isinstance(t, torch.Tensor) for t in out):
        return None, tr(f"return a list of {count} tensors, one per parameter (got {type(out).__name__})",
                        f"верните список из {count} тензоров, по одному на параметр (получено: {type(out).__name__})")
    return tuple(t.detach().clone() for t in out), ""


def _run_on_rank(fn, make_input) -> RankOutcome:
    rank, n = dist.get_rank(), dist.get_world_size()
    inputs = make_input(rank, n)
    with CommLog() as log:
        try:
            out = fn(*inputs, None)
        except NotImplementedError:
            return RankOutcome(None, not_yet=True)
    tensors, problem = _as_tensors(out, len(TRIAL_SHAPES))
    return RankOutcome(tensors, tuple((r.op, r.nbytes) for r in log.records), bad_return=problem)


def _unshard_input(rank: int, n: int):
    fulls = [trial_tensor(s, i) for i, s in enumerate(TRIAL_SHAPES)]
    return [dim0_shard(f, rank, n).clone() for f in fulls], [f.shape for f in fulls]


def _grads_input(rank: int, n: int):
    return ([trial_tensor(s, i, rank) for i, s in enumerate(TRIAL_SHAPES)],)


def _on_ranks(fn, make_input, world: int) -> list[RankOutcome]:
    outcomes = launch(_run_on_rank, world, args=(fn, make_input), timeout=_TIMEOUT_S)
    if any(o.not_yet for o in outcomes):
        raise NotYet
    return outcomes


def _padded_bytes(world: int) -> int:
    """The unit's gathered bytes: every parameter padded to `world` chunks of ceil(rows / world) rows."""
    return sum(world * math.ceil(s[0] / world) * math.prod(s[1:]) for s in TRIAL_SHAPES) * 4


def _collectives_verdict(outcome: RankOutcome, op: str, world: int, rank: int) -> str:
    """"" when CommLog saw exactly one `op` of the unit's padded bytes, else what it saw instead."""
    return one_collective_problem(outcome.collectives, op, _padded_bytes(world), world, rank,
                                  ("the unit's padded", "юнита с паддингом"))


# --- exercise 1: dim0_shard, against what fully_shard holds ------------------------------------------

def _fully_shard_locals() -> list[torch.Tensor]:
    """This rank's local shards of the trial parameters, as `fsdp_mini.fully_shard` keeps them."""
    from fsdp_mini.fully_shard import fully_shard  # imported where used: the module list stays light
    module = nn.Module()
    for i, shape in enumerate(TRIAL_SHAPES):
        module.register_parameter(f"p{i}", nn.Parameter(trial_tensor(shape, i)))
    fully_shard(module)
    return [module.get_parameter(f"p{i}").to_local().detach().clone() for i in range(len(TRIAL_SHAPES))]


@functools.cache
def library_shards(world: int) -> tuple[list[torch.Tensor], ...]:
    """What fully_shard holds on each rank of a `world`-rank run (computed once per process)."""
    return tuple(launch(_fully_shard_locals, world, timeout=_TIMEOUT_S))


def _judge_dim0_shard(fn) -> Verdict:
    for world in WORLDS:
        held = library_shards(world)
        for rank in range(world):
            for i, shape in enumerate(TRIAL_SHAPES):
                mine = fn(trial_tensor(shape, i), rank, world)
                if mine is None:
                    raise NotYet
                want = held[rank][i]
                if not isinstance(mine, torch.Tensor) or mine.shape != want.shape:
                    got = tuple(mine.shape) if isinstance(mine, torch.Tensor) else type(mine).__name__
                    return Verdict.wrong(tr(
                        f"world {world}, rank {rank}, parameter of shape {shape}: fully_shard keeps a shard of "
                        f"shape {tuple(want.shape)} on this rank, yours is {got}",
                        f"мир из {world}, ранг {rank}, параметр формы {shape}: fully_shard хранит на этом ранге "
                        f"шард формы {tuple(want.shape)}, у вас {got}"))
                if not torch.equal(mine, want):
                    return Verdict.wrong(tr(
                        f"world {world}, rank {rank}, parameter of shape {shape}: the right number of rows, "
                        f"but not the rows fully_shard keeps",
                        f"мир из {world}, ранг {rank}, параметр формы {shape}: строк столько, сколько нужно, "
                        f"но это не те строки, что хранит fully_shard"))
    return Verdict.right(tr("Your shards are fully_shard's on every rank of worlds 2, 3 and 4.",
                            "Ваши шарды совпадают с шардами fully_shard на каждом ранге миров из 2, 3 и 4."))


# --- exercise 2: unshard ---------------------------------------------------------------------------------

def _judge_unshard(fn) -> Verdict:
    fulls = [trial_tensor(s, i) for i, s in enumerate(TRIAL_SHAPES)]
    for world in WORLDS:
        for rank, outcome in enumerate(_on_ranks(fn, _unshard_input, world)):
            if outcome.bad_return:
                return Verdict.wrong(outcome.bad_return)
            for i, (got, want) in enumerate(zip(outcome.tensors, fulls)):
                if got.shape != want.shape:
                    return Verdict.wrong(tr(
                        f"world {world}, rank {rank}: parameter {i} should come back with shape {tuple(want.shape)}, "
                        f"it has {tuple(got.shape)}",
                        f"мир из {world}, ранг {rank}: параметр {i} должен вернуться формы {tuple(want.shape)}, "
                        f"а у него {tuple(got.shape)}"))
                if not torch.equal(got, want):
                    bad = (got != want).reshape(want.shape[0], -1).any(dim=1).nonzero().flatten().tolist()
                    owners = sorted({row // math.ceil(want.shape[0] / world) for row in bad})
                    return Verdict.wrong(tr(
                        f"world {world}, rank {rank}: parameter {i} {tuple(want.shape)} is wrong in rows {bad[:6]}"
                        f"{'...' if len(bad) > 6 else ''}, the rows that ranks {owners} hold",
                        f"мир из {world}, ранг {rank}: параметр {i} {tuple(want.shape)} неверен в строках {bad[:6]}"
                        f"{'...' if len(bad) > 6 else ''}, тех, что хранят ранги {owners}"))
            problem = _collectives_verdict(outcome, "all_gather", world, rank)
            if problem:
                return Verdict.wrong(problem)
    return Verdict.right(tr("Every rank rebuilt every parameter with one AllGather, at worlds 2, 3 and 4.",
                            "Каждый ранг собрал каждый параметр одним AllGather в мирах из 2, 3 и 4."))


# --- exercise 3: reduce_grads ----------------------------------------------------------------------------

def _judge_reduce_grads(fn) -> Verdict:
    for world in WORLDS:
        averages = [torch.stack([trial_tensor(s, i, r) for r in range(world)]).mean(0)
                    for i, s in enumerate(TRIAL_SHAPES)]
        for rank, outcome in enumerate(_on_ranks(fn, _grads_input, world)):
            if outcome.bad_return:
                return Verdict.wrong(outcome.bad_return)
            for i, (got, avg) in enumerate(zip(outcome.tensors, averages)):
                want = dim0_shard(avg, rank, world)
                if got.shape != want.shape:
                    return Verdict.wrong(tr(
                        f"world {world}, rank {rank}: its chunk of gradient {i} {tuple(avg.shape)} has shape "
                        f"{tuple(want.shape)} (the rows the rank keeps, padding dropped); yours is {tuple(got.shape)}",
                        f"мир из {world}, ранг {rank}: его чанк градиента {i} {tuple(avg.shape)} имеет форму "
                        f"{tuple(want.shape)} (строки, которые хранит ранг, без паддинга); у вас {tuple(got.shape)}"))
                if not torch.allclose(got, want, rtol=1e-5, atol=1e-6):
                    hint = (tr(f" ({num(float(world), 1)} times the average: a ReduceScatter sums unless asked to "
                               f"average)",
                               f" (в {num(float(world), 1)} раза больше среднего: ReduceScatter суммирует, если не "
                               f"попросить усреднить)") if summed_not_averaged(got, want, world) else "")
                    return Verdict.wrong(tr(
                        f"world {world}, rank {rank}: its chunk of gradient {i} {tuple(avg.shape)} is not the "
                        f"average of every rank's rows{hint}",
                        f"мир из {world}, ранг {rank}: его чанк градиента {i} {tuple(avg.shape)} не равен среднему "
                        f"этих строк по всем рангам{hint}"))
            problem = _collectives_verdict(outcome, "reduce_scatter", world, rank)
            if problem:
                return Verdict.wrong(problem)
    return Verdict.right(tr("Each rank got the average of its rows of every gradient, from one ReduceScatter.",
                            "Каждый ранг получил среднее своих строк каждого градиента одним ReduceScatter."))


DIM0_SHARD = CodeExercise("09.dim0_shard", _judge_dim0_shard, dim0_shard, (_shard_floor_split, _shard_torch_chunk))
UNSHARD = CodeExercise("09.unshard", _judge_unshard, unshard,
                       (_unshard_one_gather_per_parameter, _unshard_parameter_major_copy_out))
REDUCE_GRADS = CodeExercise("09.reduce_grads", _judge_reduce_grads, reduce_grads,
                            (_reduce_parameter_major, _reduce_with_all_reduce, _reduce_sum_not_average))
