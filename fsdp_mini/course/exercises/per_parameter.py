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
from fsdp_mini.run import LaunchError, launch

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


# --- plausible mistakes, which the judges must catch (tests/course/test_exercise.py) ------------------------

def _shard_floor_split(full, rank, world):
    return full.tensor_split(world)[rank]  # sizes differ by one row: not the rows FSDP2 keeps


def _shard_torch_chunk(full, rank, world):
    return full.chunk(world)[rank]  # torch.chunk returns fewer chunks than ranks for short tensors


def _shard_floor_rows(full, rank, world):
    rows = full.shape[0] // world  # rounded down: the rows left over belong to no rank
    return full[rank * rows:(rank + 1) * rows]


def _shard_padded(full, rank, world):
    rows = math.ceil(full.shape[0] / world)
    shard = full.new_zeros((rows, *full.shape[1:]))  # the share padded with zeros: padding is the gather's
    mine = full[rank * rows:(rank + 1) * rows]
    shard[:mine.shape[0]] = mine
    return shard


def _shard_strided(full, rank, world):
    return full[rank::world]  # round robin: every world-th row, not a block of consecutive rows


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


def _padded_chunks(chunks, shapes, n: int) -> list[torch.Tensor]:
    """The planted mistakes' copy-in, done right: each chunk padded to ceil(rows / n) rows, flat."""
    padded = []
    for chunk, shape in zip(chunks, shapes):
        piece = chunk.new_zeros((math.ceil(shape[0] / n), *shape[1:]))
        piece[:chunk.shape[0]] = chunk
        padded.append(piece.reshape(-1))
    return padded


def _unshard_parameter_major_copy_out(chunks, shapes, group=None):
    n = dist.get_world_size(group)
    padded = _padded_chunks(chunks, shapes, n)
    row = torch.cat(padded)
    gathered = torch.empty(n * row.numel(), dtype=row.dtype)
    C.all_gather_into_tensor(gathered, row, group=group)
    fulls, offset = [], 0
    for piece, shape in zip(padded, shapes):  # reads the buffer as if it held parameter after parameter
        fulls.append(gathered[offset:offset + n * piece.numel()].view(-1, *shape[1:])[:shape[0]])
        offset += n * piece.numel()
    return fulls


def _unshard_no_padding(chunks, shapes, group=None):
    n = dist.get_world_size(group)
    row = torch.cat([c.reshape(-1) for c in chunks])  # unpadded: a rank with fewer rows sends less
    gathered = torch.empty(n * row.numel(), dtype=row.dtype)
    C.all_gather_into_tensor(gathered, row, group=group)
    fulls, offset = [], 0
    for shape in shapes:
        fulls.append(gathered[offset:offset + math.prod(shape)].view(shape))
        offset += math.prod(shape)
    return fulls


def _unshard_keeps_padding(chunks, shapes, group=None):
    n = dist.get_world_size(group)
    padded = _padded_chunks(chunks, shapes, n)
    row = torch.cat(padded)
    gathered = torch.empty((n, row.numel()), dtype=row.dtype)
    C.all_gather_into_tensor(gathered.view(-1), row, group=group)
    fulls, offset = [], 0
    for piece, shape in zip(padded, shapes):  # the padding rows are returned with the parameter
        fulls.append(gathered[:, offset:offset + piece.numel()].reshape(-1, *shape[1:]))
        offset += piece.numel()
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


def _reduce_keeps_padding(grads, group=None):
    n = dist.get_world_size(group)
    blocks = []
    for g in grads:
        padded = g.new_zeros((n * math.ceil(g.shape[0] / n), *g.shape[1:]))
        padded[:g.shape[0]] = g
        blocks.append(padded.view(n, -1))
    send = torch.cat(blocks, dim=1).reshape(-1)
    mine = torch.empty(send.numel() // n, dtype=send.dtype)
    C.reduce_scatter_tensor(mine, send, C.AVG, group=group)
    out, offset = [], 0
    for g, block in zip(grads, blocks):  # every rank's chunk returned padded, rows of zeros included
        out.append(mine[offset:offset + block.shape[1]].view(-1, *g.shape[1:]))
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


class _Diverged(Exception):
    """The ranks called one collective with different sizes (launch's flight recorder named it)."""


def _on_ranks(fn, make_input, world: int) -> list[RankOutcome]:
    try:
        outcomes = launch(_run_on_rank, world, args=(fn, make_input), timeout=_TIMEOUT_S)
    except LaunchError as e:
        if "diverged" in str(e):
            raise _Diverged(str(e).strip().splitlines()[0]) from e
        raise
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
    from fsdp_mini.fsdp._fully_shard.fully_shard import fully_shard  # imported where used: the module list stays light
    module = nn.Module()
    for i, shape in enumerate(TRIAL_SHAPES):
        module.register_parameter(f"p{i}", nn.Parameter(trial_tensor(shape, i)))
    fully_shard(module)
    return [module.get_parameter(f"p{i}").to_local().detach().clone() for i in range(len(TRIAL_SHAPES))]


@functools.cache
def library_shards(world: int) -> tuple[list[torch.Tensor], ...]:
    """What fully_shard holds on each rank of a `world`-rank run (computed once per process)."""
    return tuple(launch(_fully_shard_locals, world, timeout=_TIMEOUT_S))


def _rows_of(mine: torch.Tensor, full: torch.Tensor) -> list[int]:
    """Which rows of `full` the learner's shard holds, row by row (-1: a row that is not one of them)."""
    rows = full.reshape(full.shape[0], -1)
    return [next((j for j in range(rows.shape[0]) if torch.equal(rows[j], r)), -1)
            for r in mine.reshape(mine.shape[0], -1)]


def _dim0_problem(fn, full: torch.Tensor, wants: list[torch.Tensor], world: int) -> str:
    """"" when `fn` gives every rank of `world` the shard fully_shard keeps (`wants`), else what is wrong."""
    shape, n_rows = tuple(full.shape), full.shape[0]
    where = tr(f"world {world}, parameter of shape {shape}", f"число рангов {world}, параметр формы {shape}")
    mine = []
    for rank in range(world):
        try:
            got = fn(full, rank, world)
        except IndexError as e:
            chunks = len(torch.chunk(full, world))
            if chunks > rank:
                raise
            return tr(
                f"{where}: rank {rank}'s call raised IndexError ({e}): torch.chunk (and Tensor.chunk) returns "
                f"fewer than n chunks when the rows do not fill n chunks of ⌈rows / n⌉ rows: {n_rows} rows "
                f"make {chunks} chunks for {world} ranks, so rank {rank} got no chunk to index; fully_shard "
                f"gives such a rank {wants[rank].shape[0]} rows",
                f"{where}: вызов для ранга {rank} выбросил IndexError ({e}): torch.chunk (и Tensor.chunk) "
                f"возвращает меньше n чанков, если строк не хватает на n чанков по ⌈rows / n⌉ строк: из "
                f"{n_rows} строк получается чанков: {chunks}, а рангов {world}, так что рангу {rank} чанка не "
                f"досталось; fully_shard даёт такому рангу строк: {wants[rank].shape[0]}")
        if got is None:
            raise NotYet
        if not isinstance(got, torch.Tensor):
            return tr(f"{where}, rank {rank}: return a tensor, the rank's rows (got {type(got).__name__})",
                      f"{where}, ранг {rank}: верните тензор, строки ранга (получено: {type(got).__name__})")
        mine.append(got)
    got_rows, want_rows = [m.shape[0] if m.dim() else 0 for m in mine], [w.shape[0] for w in wants]
    for rank, (got, want) in enumerate(zip(mine, wants)):
        if got.shape == want.shape:
            continue
        said = tr(f"{where}, rank {rank}: fully_shard keeps a shard of shape {tuple(want.shape)} on this rank, "
                  f"yours is {tuple(got.shape)}",
                  f"{where}, ранг {rank}: fully_shard хранит на этом ранге шард формы {tuple(want.shape)}, "
                  f"у вас {tuple(got.shape)}")
        if got.shape[1:] != want.shape[1:]:
            hint = tr("a shard cuts dim 0 only and keeps the other dimensions whole",
                      "шард режет только dim 0, остальные измерения остаются целыми")
        elif got_rows[rank] > want_rows[rank] and torch.count_nonzero(got[want_rows[rank]:]) == 0 \
                and (want_rows[rank] == 0 or torch.equal(got[:want_rows[rank]], want)):
            hint = tr("your shard ends in rows of zeros: padding belongs to the AllGather's buffer, a rank keeps "
                      "only the parameter's real rows",
                      "ваш шард заканчивается строками нулей: паддинг нужен только в буфере AllGather, ранг "
                      "хранит лишь настоящие строки параметра")
        elif sum(got_rows) != n_rows:
            hint = tr(f"your {world} shards hold {sum(got_rows)} rows between them, the parameter has {n_rows}: "
                      f"every row must belong to exactly one rank",
                      f"ваши {world} шарда вместе содержат {sum(got_rows)} строк, а у параметра их {n_rows}: "
                      f"каждая строка должна принадлежать ровно одному рангу")
        elif max(got_rows) - min(got_rows) <= 1:
            hint = tr(f"your shares {got_rows} split the rows as evenly as possible, like tensor_split; "
                      f"fully_shard's are torch.chunk's, {want_rows}",
                      f"ваши доли {got_rows} делят строки как можно ровнее, как tensor_split; у fully_shard "
                      f"доли как у torch.chunk: {want_rows}")
        else:
            hint = tr(f"your shares of the rows, rank by rank, are {got_rows}; fully_shard's are {want_rows}",
                      f"ваши доли строк по рангам: {got_rows}; у fully_shard: {want_rows}")
        return f"{said} ({hint})"
    for rank, (got, want) in enumerate(zip(mine, wants)):
        if torch.equal(got, want):
            continue
        rows = _rows_of(got, full)
        if -1 in rows:
            hint = tr("some of them are not rows of the parameter", "некоторые из них вообще не строки параметра")
        elif any(b != a + 1 for a, b in zip(rows, rows[1:])):
            hint = tr(f"it holds rows {rows[:5]}{'...' if len(rows) > 5 else ''} of the parameter: a rank "
                      f"keeps one block of consecutive rows",
                      f"в нём строки {rows[:5]}{'...' if len(rows) > 5 else ''} параметра: ранг хранит один "
                      f"блок идущих подряд строк")
        else:
            hint = tr(f"it starts at row {rows[0]}: rank {rank}'s block comes after the rows of ranks 0 to "
                      f"{rank - 1}" if rank else f"it starts at row {rows[0]}: rank 0's block comes first",
                      f"он начинается со строки {rows[0]}: блок ранга {rank} идёт после строк рангов с 0 по "
                      f"{rank - 1}" if rank else f"он начинается со строки {rows[0]}: блок ранга 0 идёт первым")
        return tr(f"{where}, rank {rank}: the right number of rows, but not the rows fully_shard keeps ({hint})",
                  f"{where}, ранг {rank}: строк столько, сколько нужно, но это не те строки, что хранит "
                  f"fully_shard ({hint})")
    return ""


def _judge_dim0_shard(fn) -> Verdict:
    for world in WORLDS:
        held = library_shards(world)
        for i, shape in enumerate(TRIAL_SHAPES):
            problem = _dim0_problem(fn, trial_tensor(shape, i), [held[r][i] for r in range(world)], world)
            if problem:
                return Verdict.wrong(problem)
    return Verdict.right(tr("Your shards are fully_shard's on every rank of worlds 2, 3 and 4.",
                            "Ваши шарды совпадают с шардами fully_shard на каждом ранге миров из 2, 3 и 4."))


# --- exercise 2: unshard ---------------------------------------------------------------------------------

def _diverged_verdict(world: int, op: str, message: str) -> Verdict:
    return Verdict.wrong(tr(
        f"world {world}: the ranks called {op} with inputs of different sizes ({message}); a collective needs "
        f"the same number of elements from every rank, also from a rank whose chunks have fewer rows, or none",
        f"число рангов {world}: ранги вызвали {op} со входами разного размера ({message}); коллективной операции "
        f"нужно одинаковое число элементов от каждого ранга, в том числе от ранга, у чьих чанков меньше строк "
        f"или нет ни одной"))


def _judge_unshard(fn) -> Verdict:
    fulls = [trial_tensor(s, i) for i, s in enumerate(TRIAL_SHAPES)]
    for world in WORLDS:
        try:
            outcomes = _on_ranks(fn, _unshard_input, world)
        except _Diverged as e:
            return _diverged_verdict(world, "AllGather", str(e))
        for rank, outcome in enumerate(outcomes):
            if outcome.bad_return:
                return Verdict.wrong(outcome.bad_return)
            for i, (got, want) in enumerate(zip(outcome.tensors, fulls)):
                rows = math.ceil(want.shape[0] / world)
                if got.shape != want.shape:
                    padded = (got.shape == (world * rows, *want.shape[1:]) and world * rows != want.shape[0]
                              and torch.equal(got[:want.shape[0]], want))
                    hint = tr(" (the padding rows are still at its end)", " (в конце остались строки паддинга)")
                    return Verdict.wrong(tr(
                        f"world {world}, rank {rank}: parameter {i} should come back with shape {tuple(want.shape)}, "
                        f"it has {tuple(got.shape)}",
                        f"число рангов {world}, ранг {rank}: параметр {i} должен вернуться формы {tuple(want.shape)}, "
                        f"а у него {tuple(got.shape)}") + (hint if padded else ""))
                if not torch.equal(got, want):
                    bad = (got != want).reshape(want.shape[0], -1).any(dim=1).nonzero().flatten().tolist()
                    owners = sorted({row // rows for row in bad})
                    hint = tr(f": rank 0's chunk came back right, so copy-out reads the chunks of ranks {owners} "
                              f"from the wrong place in the gathered buffer (it has one row per rank, each "
                              f"holding that rank's chunks of every parameter)",
                              f": чанк ранга 0 вернулся верным, значит, copy-out читает чанки рангов {owners} не "
                              f"из того места собранного буфера (в нём по строке на ранг, и в каждой — чанки этого "
                              f"ранга для всех параметров)") if 0 not in owners else ""
                    return Verdict.wrong(tr(
                        f"world {world}, rank {rank}: parameter {i} {tuple(want.shape)} is wrong in rows {bad[:6]}"
                        f"{'...' if len(bad) > 6 else ''}, the rows that ranks {owners} hold",
                        f"число рангов {world}, ранг {rank}: параметр {i} {tuple(want.shape)} неверен в строках {bad[:6]}"
                        f"{'...' if len(bad) > 6 else ''}, тех, что хранят ранги {owners}") + hint)
            problem = _collectives_verdict(outcome, "all_gather", world, rank)
            if problem:
                return Verdict.wrong(problem)
    return Verdict.right(tr("Every rank rebuilt every parameter with one AllGather, at worlds 2, 3 and 4.",
                            "Каждый ранг собрал каждый параметр одним AllGather при 2, 3 и 4 рангах."))


# --- exercise 3: reduce_grads ----------------------------------------------------------------------------

def _judge_reduce_grads(fn) -> Verdict:
    for world in WORLDS:
        averages = [torch.stack([trial_tensor(s, i, r) for r in range(world)]).mean(0)
                    for i, s in enumerate(TRIAL_SHAPES)]
        try:
            outcomes = _on_ranks(fn, _grads_input, world)
        except _Diverged as e:
            return _diverged_verdict(world, "ReduceScatter", str(e))
        for rank, outcome in enumerate(outcomes):
            if outcome.bad_return:
                return Verdict.wrong(outcome.bad_return)
            right = []  # the gradients whose chunk came back right on this rank
            for i, (got, avg) in enumerate(zip(outcome.tensors, averages)):
                want = dim0_shard(avg, rank, world)
                if got.shape == want.shape and torch.allclose(got, want, rtol=1e-5, atol=1e-6):
                    right.append(i)
                    continue
                if got.shape != want.shape:
                    return Verdict.wrong(tr(
                        f"world {world}, rank {rank}: its chunk of gradient {i} {tuple(avg.shape)} has shape "
                        f"{tuple(want.shape)} (the rows the rank keeps, padding dropped); yours is {tuple(got.shape)}",
                        f"число рангов {world}, ранг {rank}: его чанк градиента {i} {tuple(avg.shape)} имеет форму "
                        f"{tuple(want.shape)} (строки, которые хранит ранг, без паддинга); у вас {tuple(got.shape)}"))
                if not torch.allclose(got, want, rtol=1e-5, atol=1e-6):
                    hint = (tr(f" ({num(float(world), 1)} times the average: a ReduceScatter sums unless asked to "
                               f"average)",
                               f" (в {num(float(world), 1)} раза больше среднего: ReduceScatter суммирует, если не "
                               f"попросить усреднить)") if summed_not_averaged(got, want, world) else "")
                    if not hint and right:
                        hint = tr(f" (the chunks of gradients {right} came back right, gradient {i}'s did not: "
                                  f"the part of the buffer that the ReduceScatter leaves rank {rank} must hold "
                                  f"its chunk of every gradient)",
                                  f" (чанки градиентов {right} вернулись верными, а чанк градиента {i} — нет: часть "
                                  f"буфера, которую ReduceScatter оставляет рангу {rank}, должна содержать его "
                                  f"чанк каждого градиента)")
                    return Verdict.wrong(tr(
                        f"world {world}, rank {rank}: its chunk of gradient {i} {tuple(avg.shape)} is not the "
                        f"average of every rank's rows{hint}",
                        f"число рангов {world}, ранг {rank}: его чанк градиента {i} {tuple(avg.shape)} не равен среднему "
                        f"этих строк по всем рангам{hint}"))
            problem = _collectives_verdict(outcome, "reduce_scatter", world, rank)
            if problem:
                return Verdict.wrong(problem)
    return Verdict.right(tr("Each rank got the average of its rows of every gradient, from one ReduceScatter.",
                            "Каждый ранг получил среднее своих строк каждого градиента одним ReduceScatter."))


DIM0_SHARD = CodeExercise("09.dim0_shard", _judge_dim0_shard, dim0_shard,
                          (_shard_floor_split, _shard_torch_chunk, _shard_floor_rows, _shard_padded,
                           _shard_strided))
UNSHARD = CodeExercise("09.unshard", _judge_unshard, unshard,
                       (_unshard_one_gather_per_parameter, _unshard_parameter_major_copy_out,
                        _unshard_no_padding, _unshard_keeps_padding))
REDUCE_GRADS = CodeExercise("09.reduce_grads", _judge_reduce_grads, reduce_grads,
                            (_reduce_parameter_major, _reduce_with_all_reduce, _reduce_sum_not_average,
                             _reduce_keeps_padding))
