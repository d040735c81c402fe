"""Lesson 07's exercises: hybrid sharding's grid and its gradient sync, written by the learner.

1. `groups_for(world, shard_size)`: the shard groups (rows) and replica groups (columns) of the grid, as
   lists of global ranks. Judged against `fsdp_mini.fsdp.groups.grid` for small, awkward and real sizes (8 nodes
   of 8, 16 nodes of 8), with a verdict that says which group breaks which rule (a shard group leaving its
   node, a replica group mixing different shards); then the learner's groups carry a HYBRID_SHARD
   gradient sync on 4 real ranks (2 nodes of 2), which must leave every rank the global average.
2. `hybrid_reduce(grad, shard_group, replica_group)`: that sync itself, ReduceScatter in the node, then
   AllReduce of the shard across nodes. Run on real ranks at 2x2, 2 nodes of 3 and 3 nodes of 2 (so the
   two kinds of group differ in size); judged by parity with one process (the average of every rank's
   gradient) and by CommLog: which collective ran in which group, with how many bytes.
"""
from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from fsdp_mini import collectives as C
from fsdp_mini.comm_log import CommLog
from fsdp_mini.course.exercise import CodeExercise, NotYet, Verdict, summed_not_averaged
from fsdp_mini.course.language import num, tr
from fsdp_mini.fsdp.groups import grid, make_groups
from fsdp_mini.run import launch

__all__ = ["GROUPS_FOR", "HYBRID_REDUCE", "groups_for", "hybrid_reduce", "GRID_CASES", "REDUCE_GRIDS"]

GRID_CASES = ((4, 2), (8, 4), (6, 3), (6, 2), (4, 1), (4, 4), (64, 8), (128, 8))  # (world, shard_size)
REDUCE_GRIDS = ((4, 2), (6, 3), (6, 2))  # (world, shard_size): 2x2, 2 nodes of 3, 3 nodes of 2
_ROWS_PER_RANK = 7  # a gradient of shard_size * 7 elements: each rank's shard has 7
_TIMEOUT_S = 60


# --- reference solutions (the lesson's folded solutions are these functions' source) ------------------

def groups_for(world: int, shard_size: int) -> tuple[list[list[int]], list[list[int]]]:
    nodes = world // shard_size
    # rows
    shard_groups = [[node * shard_size + i for i in range(shard_size)] for node in range(nodes)]
    # columns
    replica_groups = [[node * shard_size + i for node in range(nodes)] for i in range(shard_size)]
    return shard_groups, replica_groups


def hybrid_reduce(grad: torch.Tensor, shard_group, replica_group) -> torch.Tensor:
    n = dist.get_world_size(shard_group)
    shard = torch.empty(grad.numel() // n, dtype=grad.dtype)
    # inside the node: the node's average
    C.reduce_scatter_tensor(shard, grad, C.AVG, group=shard_group)
    # across nodes, only the shard: the global average
    C.all_reduce(shard, C.AVG, group=replica_group)
    return shard


# --- plausible mistakes, which the judges must catch (tests/course/test_exercise.py) --------------------------

def _groups_swapped(world, shard_size):
    rows = [list(range(r, r + shard_size)) for r in range(0, world, shard_size)]
    cols = [list(range(c, world, shard_size)) for c in range(shard_size)]
    return cols, rows  # columns as shard groups: every AllGather crosses the network


def _groups_consecutive_replicas(world, shard_size):
    replicas = world // shard_size
    rows = [list(range(r, r + shard_size)) for r in range(0, world, shard_size)]
    return rows, [list(range(r, r + replicas)) for r in range(0, world, replicas)]  # neighbours, not a column


def _groups_stride_replicas(world, shard_size):
    replicas = world // shard_size
    rows = [list(range(r, r + shard_size)) for r in range(0, world, shard_size)]
    return rows, [list(range(c, world, replicas)) for c in range(shard_size)]  # stride: replicas, not shard_size


def _reduce_only_in_node(grad, shard_group, replica_group):
    n = dist.get_world_size(shard_group)
    shard = torch.empty(grad.numel() // n, dtype=grad.dtype)
    C.reduce_scatter_tensor(shard, grad, C.AVG, group=shard_group)  # the node's average, never the world's
    return shard


def _reduce_whole_gradient_over_world(grad, shard_group, replica_group):
    n, rank = dist.get_world_size(shard_group), dist.get_rank(shard_group)
    total = grad.clone()
    C.all_reduce(total, C.AVG)  # DDP's AllReduce over every rank: the whole gradient crosses nodes
    return total.chunk(n)[rank].clone()


def _reduce_whole_gradient_across_nodes_first(grad, shard_group, replica_group):
    n = dist.get_world_size(shard_group)
    total = grad.clone()
    C.all_reduce(total, C.AVG, group=replica_group)  # across nodes before sharding: n times the bytes
    shard = torch.empty(grad.numel() // n, dtype=grad.dtype)
    C.reduce_scatter_tensor(shard, total, C.AVG, group=shard_group)
    return shard


def _reduce_sum(grad, shard_group, replica_group):
    n = dist.get_world_size(shard_group)
    shard = torch.empty(grad.numel() // n, dtype=grad.dtype)
    C.reduce_scatter_tensor(shard, grad, group=shard_group)  # SUM, the default
    C.all_reduce(shard, group=replica_group)
    return shard


def _reduce_scatter_sums(grad, shard_group, replica_group):
    n = dist.get_world_size(shard_group)
    shard = torch.empty(grad.numel() // n, dtype=grad.dtype)
    C.reduce_scatter_tensor(shard, grad, group=shard_group)  # SUM, the default: only this one sums
    C.all_reduce(shard, C.AVG, group=replica_group)
    return shard


# --- exercise 1: groups_for ---------------------------------------------------------------------------

def _as_groups(out, world: int, shard_size: int, what: str) -> tuple[list[list[int]] | None, str]:
    """The learner's list of groups if it is one (lists of ints that cover every rank once), else a problem."""
    where = tr(f"world {world}, shard_size {shard_size}: ", f"число рангов {world}, shard_size {shard_size}: ")
    if not isinstance(out, (list, tuple)) or not all(
            isinstance(g, (list, tuple)) and all(isinstance(r, int) for r in g) for g in out):
        return None, where + tr(f"the {what} should be a list of lists of ranks",
                                f"{what} — это список списков рангов")
    ranks = sorted(r for g in out for r in g)
    if ranks != list(range(world)):
        missing = sorted(set(range(world)) - set(ranks))
        twice = sorted({r for r in ranks if ranks.count(r) > 1})
        return None, where + tr(
            f"the {what} must hold every rank 0..{world - 1} exactly once (missing {missing[:6]}, "
            f"more than once {twice[:6]})",
            f"{what} должны содержать каждый ранг 0..{world - 1} ровно один раз (нет {missing[:6]}, "
            f"повторяются {twice[:6]})")
    return [sorted(g) for g in out], ""


def _grid_problem(fn, world: int, shard_size: int) -> str:
    """"" when `fn` gives the grid's groups for (world, shard_size), else which group breaks which rule."""
    where = tr(f"world {world}, shard_size {shard_size}: ", f"число рангов {world}, shard_size {shard_size}: ")
    out = fn(world, shard_size)
    if not isinstance(out, (list, tuple)) or len(out) != 2:
        return where + tr("return two lists: (shard groups, replica groups)",
                          "верните два списка: (группы шардирования, группы реплик)")
    shards, problem = _as_groups(out[0], world, shard_size, tr("shard groups", "группы шардирования"))
    if problem:
        return problem
    replicas, problem = _as_groups(out[1], world, shard_size, tr("replica groups", "группы реплик"))
    if problem:
        return problem
    node = lambda r: r // shard_size  # noqa: E731 (ranks are numbered node by node, shard_size per node)
    for g in shards:
        nodes = sorted({node(r) for r in g})
        if len(nodes) > 1:
            return where + tr(
                f"your shard group {_short(g)} takes ranks from nodes {_short(nodes)} (torchrun numbers ranks "
                f"node by node, {shard_size} per node): its AllGathers and ReduceScatters would cross the network",
                f"ваша группа шардирования {_short(g)} берёт ранги с узлов {_short(nodes)} (torchrun нумерует "
                f"ранги узел за узлом, по {shard_size} на узел): её AllGather и ReduceScatter пошли бы по сети")
        if len(g) != shard_size:
            return where + tr(f"your shard group {_short(g)} has {len(g)} ranks, not a node's {shard_size}",
                              f"в вашей группе шардирования {_short(g)} {len(g)} рангов, а не {shard_size}, "
                              f"как на узле")
    for g in replicas:
        positions = sorted({r % shard_size for r in g})
        if len(positions) > 1:
            a, b = (next(r for r in g if r % shard_size == p) for p in positions[:2])
            return where + tr(
                f"ranks {a} and {b} of your replica group {_short(g)} hold different shards (shard {a % shard_size} "
                f"and shard {b % shard_size} of their shard groups): AllReducing them would add unrelated numbers",
                f"ранги {a} и {b} вашей группы реплик {_short(g)} хранят разные шарды (шард {a % shard_size} и "
                f"шард {b % shard_size} своих групп шардирования): AllReduce сложил бы несвязанные числа")
        if len(g) != world // shard_size:
            return where + tr(f"your replica group {_short(g)} has {len(g)} ranks, but there are "
                              f"{world // shard_size} nodes, each with one copy of that shard",
                              f"в вашей группе реплик {_short(g)} {len(g)} рангов, а узлов {world // shard_size}, "
                              f"и на каждом есть копия этого шарда")
    rows, cols = grid(world, shard_size)
    if sorted(shards) != rows or sorted(replicas) != cols:  # the rules above imply it; the library decides
        return where + tr("your groups differ from fsdp_mini.fsdp.groups.grid's", "ваши группы отличаются от "
                                                                             "fsdp_mini.fsdp.groups.grid")
    return ""


def _short(ranks: list[int]) -> str:
    return str(ranks) if len(ranks) <= 6 else "[" + ", ".join(map(str, ranks[:4])) + f", ... {ranks[-1]}]"


def trial_grad(rank: int, numel: int) -> torch.Tensor:
    """Rank `rank`'s deterministic gradient of `numel` elements."""
    return torch.randn(numel, generator=torch.Generator().manual_seed(100 + rank))


def _sync_with_groups(rows: list[list[int]], cols: list[list[int]]) -> torch.Tensor:
    """On each rank: create the given groups (every rank every group, in order), then HYBRID_SHARD's
    gradient sync over them with the library's reference; returns this rank's shard."""
    rank = dist.get_rank()
    mine = {}
    for kind, groups in (("shard", rows), ("replica", cols)):
        for ranks in groups:
            pg = dist.new_group(ranks)
            if rank in ranks:
                mine[kind] = pg
    numel = len(rows[0]) * _ROWS_PER_RANK
    return hybrid_reduce(trial_grad(rank, numel), mine["shard"], mine["replica"])


def global_average_shards(world: int, shard_size: int) -> list[torch.Tensor]:
    """What one process computes: the average of every rank's gradient, cut into the shard groups' chunks."""
    numel = shard_size * _ROWS_PER_RANK
    return list(torch.stack([trial_grad(r, numel) for r in range(world)]).mean(0).chunk(shard_size))


def _judge_groups_for(fn) -> Verdict:
    for world, shard_size in GRID_CASES:
        problem = _grid_problem(fn, world, shard_size)
        if problem:
            return Verdict.wrong(problem)
    world, shard_size = 4, 2  # HYBRID_SHARD on 2 nodes of 2, over the learner's own groups
    rows, cols = (sorted(sorted(g) for g in groups) for groups in fn(world, shard_size))
    got = launch(_sync_with_groups, world, args=(rows, cols), local_world_size=shard_size, timeout=_TIMEOUT_S)
    want = global_average_shards(world, shard_size)
    for rank, shard in enumerate(got):
        if not torch.allclose(shard, want[rank % shard_size], rtol=1e-5, atol=1e-6):
            return Verdict.wrong(tr(
                f"world 4 on 2 nodes: after a ReduceScatter in your shard groups and an AllReduce in your replica "
                f"groups, rank {rank} does not hold the global average of its shard",
                f"4 ранга на 2 узлах: после ReduceScatter в ваших группах шардирования и AllReduce в ваших "
                f"группах реплик ранг {rank} не хранит глобальное среднее своего шарда"))
    return Verdict.right(tr(
        f"Your groups are fsdp_mini's grid for all {len(GRID_CASES)} layouts (up to 16 nodes of 8), and on 4 real "
        f"ranks they turn a ReduceScatter plus an AllReduce into the global average.",
        f"Ваши группы совпадают с сеткой fsdp_mini во всех {len(GRID_CASES)} раскладках (до 16 узлов по 8), а на "
        f"4 настоящих рангах ReduceScatter и AllReduce в них дают глобальное среднее."))


# --- exercise 2: hybrid_reduce ------------------------------------------------------------------------

def _run_hybrid_reduce(fn, shard_size: int):
    """On each rank: the learner's sync of this rank's gradient, and what CommLog saw (op, group size, bytes)."""
    groups = make_groups(shard_size)
    grad = trial_grad(dist.get_rank(), shard_size * _ROWS_PER_RANK)
    with CommLog() as log:
        try:
            out = fn(grad.clone(), groups.shard_process_group, groups.replicate_process_group)
        except NotImplementedError:
            return None
    seen = tuple((r.op, r.group_size, r.nbytes) for r in log.records)
    return (out.detach().clone() if isinstance(out, torch.Tensor) else type(out).__name__), seen


def _comm_problem(seen, world: int, shard_size: int, rank: int) -> str:
    """"" when CommLog saw one ReduceScatter of the whole gradient in the shard group, then one AllReduce of
    the shard in the replica group; else what it saw that HYBRID_SHARD does not do."""
    replicas, grad_bytes = world // shard_size, shard_size * _ROWS_PER_RANK * 4
    where = tr(f"world {world} ({replicas} nodes of {shard_size}), rank {rank}: ",
               f"число рангов {world} ({replicas} узла по {shard_size}), ранг {rank}: ")
    names = {"all_reduce": "AllReduce", "reduce_scatter": "ReduceScatter", "all_gather": "AllGather"}
    listed = ", ".join(tr(f"{names.get(op, op)} over {size} ranks ({num(b)} B)",
                          f"{names.get(op, op)} по {size} рангам ({num(b)} Б)") for op, size, b in seen) \
        or tr("nothing", "ничего")
    for op, size, nbytes in seen:
        if size == world:
            return where + tr(f"an {names.get(op, op)} over all {world} ranks ({num(nbytes)} B) crosses nodes; "
                              f"CommLog saw: {listed}",
                              f"{names.get(op, op)} по всем {world} рангам ({num(nbytes)} Б) идёт между узлами; "
                              f"CommLog увидел: {listed}")
    shard_bytes = grad_bytes // shard_size
    for op, size, nbytes in seen:
        if op == "all_reduce" and size == replicas and nbytes != shard_bytes:
            return where + tr(
                f"the AllReduce across nodes carried {num(nbytes)} B, {num(nbytes / shard_bytes, 1)} times this "
                f"rank's shard of the gradient; CommLog saw: {listed}",
                f"AllReduce между узлами передал {num(nbytes)} Б, в {num(nbytes / shard_bytes, 1)} раза больше "
                f"шарда градиента этого ранга; CommLog увидел: {listed}")
    if [(op, size) for op, size, _ in seen] != [("reduce_scatter", shard_size), ("all_reduce", replicas)]:
        return where + tr(
            f"the gradient needs one ReduceScatter inside the node ({shard_size} ranks) and then one AllReduce "
            f"across nodes ({replicas} ranks), through fsdp_mini.collectives; CommLog saw: {listed}",
            f"градиенту нужен один ReduceScatter внутри узла ({shard_size} ранга) и затем один AllReduce между "
            f"узлами ({replicas} ранга), через fsdp_mini.collectives; CommLog увидел: {listed}")
    reduce_scatters = [s for s in seen if s[0] == "reduce_scatter"]
    if reduce_scatters[0][2] != grad_bytes:
        return where + tr(f"the ReduceScatter moved {num(reduce_scatters[0][2])} B, not the whole gradient's "
                          f"{num(grad_bytes)} B", f"ReduceScatter передал {num(reduce_scatters[0][2])} Б, а не "
                                                  f"{num(grad_bytes)} Б всего градиента")
    return ""


@functools.cache
def _node_average_shards(world: int, shard_size: int) -> tuple[torch.Tensor, ...]:
    """Each rank's shard averaged over its node only: what a sync that never leaves the node gives."""
    numel = shard_size * _ROWS_PER_RANK
    return tuple(torch.stack([trial_grad(r, numel) for r in range(node * shard_size, (node + 1) * shard_size)])
                 .mean(0).chunk(shard_size)[rank % shard_size]
                 for node in range(world // shard_size) for rank in range(node * shard_size, (node + 1) * shard_size))


def _which_collective_summed(got: torch.Tensor, expected: torch.Tensor, world: int, shard_size: int) -> str:
    """" (…)" naming which of the two collectives summed when `got` is the average times its group's size,
    "" otherwise: a ReduceScatter and an AllReduce sum unless asked to average (C.AVG)."""
    replicas = world // shard_size
    rule = tr("a collective sums unless asked to average (C.AVG)",
              "коллективная операция суммирует, если не попросить её усреднить (C.AVG)")
    if summed_not_averaged(got, expected, world):
        return tr(f" ({num(float(world), 1)} times the average: both collectives summed; {rule})",
                  f" (в {num(float(world), 1)} раза больше среднего: обе операции просуммировали; {rule})")
    if shard_size == replicas and summed_not_averaged(got, expected, shard_size):
        return tr(f" ({num(float(shard_size), 1)} times the average: one of the two collectives summed; {rule})",
                  f" (в {num(float(shard_size), 1)} раза больше среднего: одна из двух операций просуммировала;"
                  f" {rule})")
    if summed_not_averaged(got, expected, shard_size):
        return tr(f" ({num(float(shard_size), 1)} times the average: the ReduceScatter within the node summed;"
                  f" {rule})",
                  f" (в {num(float(shard_size), 1)} раза больше среднего: просуммировал ReduceScatter внутри "
                  f"узла; {rule})")
    if summed_not_averaged(got, expected, replicas):
        return tr(f" ({num(float(replicas), 1)} times the average: the AllReduce across nodes summed; {rule})",
                  f" (в {num(float(replicas), 1)} раза больше среднего: просуммировал AllReduce между узлами;"
                  f" {rule})")
    return ""


def _judge_hybrid_reduce(fn) -> Verdict:
    for world, shard_size in REDUCE_GRIDS:
        outcomes = launch(_run_hybrid_reduce, world, args=(fn, shard_size), local_world_size=shard_size,
                          timeout=_TIMEOUT_S)
        if any(o is None for o in outcomes):
            raise NotYet
        want = global_average_shards(world, shard_size)
        where = tr(f"world {world} ({world // shard_size} nodes of {shard_size}), ",
                   f"число рангов {world} ({world // shard_size} узла по {shard_size}), ")
        for rank, (got, seen) in enumerate(outcomes):
            expected = want[rank % shard_size]
            if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
                shape = tuple(got.shape) if isinstance(got, torch.Tensor) else got
                return Verdict.wrong(where + tr(
                    f"rank {rank}: return this rank's shard of the gradient, {expected.numel()} elements "
                    f"(1/{shard_size} of it); got {shape}",
                    f"ранг {rank}: верните шард градиента этого ранга, {expected.numel()} элементов "
                    f"(1/{shard_size} градиента); получено {shape}"))
            if not torch.allclose(got, expected, rtol=1e-5, atol=1e-6):
                if torch.allclose(got, _node_average_shards(world, shard_size)[rank], rtol=1e-5, atol=1e-6):
                    why = tr(f" (it is the average over its own node's {shard_size} ranks only)",
                             f" (это среднее только по {shard_size} рангам его узла)")
                else:
                    why = _which_collective_summed(got, expected, world, shard_size)
                return Verdict.wrong(where + tr(
                    f"rank {rank}: its shard is not the average of that shard over all {world} ranks{why}",
                    f"ранг {rank}: его шард не равен среднему этого шарда по всем {world} рангам{why}"))
            problem = _comm_problem(seen, world, shard_size, rank)
            if problem:
                return Verdict.wrong(problem)
    return Verdict.right(tr(
        "Every rank holds the global average of its shard, and only a shard crossed nodes (2x2, 2x3, 3x2).",
        "Каждый ранг хранит глобальное среднее своего шарда, и между узлами прошёл только шард (2x2, 2x3, 3x2)."))


GROUPS_FOR = CodeExercise("07.groups_for", _judge_groups_for, groups_for,
                          (_groups_swapped, _groups_consecutive_replicas, _groups_stride_replicas))
HYBRID_REDUCE = CodeExercise("07.hybrid_reduce", _judge_hybrid_reduce, hybrid_reduce,
                             (_reduce_only_in_node, _reduce_whole_gradient_over_world,
                              _reduce_whole_gradient_across_nodes_first, _reduce_sum,
                              _reduce_scatter_sums))
