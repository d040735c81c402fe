"""Lesson 12's exercises: tensor parallelism written by the learner.

1. `row_parallel_forward(x_shard, weight_shard, bias, group)`: the forward of a row-parallel Linear, given
   this rank's slice of the input features and the matching columns of the weight (the bias is whole on
   every rank). Run on real ranks (worlds 2 and 4) and judged by parity with one process, for the output and
   for the gradients of the input slice, the weight slice and the bias, and by CommLog: which AllReduces ran
   in forward and which in backward.
2. `dp_tp_layout(world_size, gpus_per_node, tp)`: the ranks of a 3-D mesh ("replicate", "shard", "tp"),
   TP x HSDP: one replica per node, sharded over gpus_per_node / tp ranks, each a TP group of tp; the learner
   decides which dimension crosses the nodes (ranks numbered node by node). Any grid DeviceMesh accepts (a
   tensor, nested lists) is taken. The judge checks on paper, for 8 ranks on 2 nodes and larger clusters,
   that every TP group and every shard group sits inside a node, then builds a DeviceMesh from it on 4 real
   ranks (2 nodes of 2, tp 2), runs one TP x HSDP step of the course GPT, reads from the flight recorder
   which ranks each TP collective and each AllGather / ReduceScatter ran over, and compares the result
   with one process's.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from fsdp_mini.collectives import all_reduce
from fsdp_mini.comm_log import CommLog
from fsdp_mini.course.exercise import CodeExercise, NotYet, Verdict
from fsdp_mini.course.language import num, tr
from fsdp_mini.course.models import GPT, GPTConfig, make_batch
from fsdp_mini.course.train import local_rows
from fsdp_mini.course.tensor_parallel_plan import gpt_tp_plan
from fsdp_mini.flight_recorder import RECORDER
from fsdp_mini.fsdp._fully_shard.fully_shard import full_state_dict, fully_shard
from fsdp_mini.run import launch
from fsdp_mini.tensor.parallel.parallelize import gather_tensor_parallel, parallelize_module
from fsdp_mini.tensor.parallel.tp_operators import (TP_LABEL, copy_to_tensor_model_parallel_region,
                                                    reduce_from_tensor_model_parallel_region)

__all__ = ["ROW_PARALLEL_FORWARD", "DP_TP_LAYOUT", "row_parallel_forward", "dp_tp_layout", "ROW_WORLDS",
           "LAYOUT_CASES", "through_autograd_function", "NOT_AN_AUTOGRAD_FUNCTION"]

ROW_WORLDS = (2, 4)
_B, _T, _IN, _OUT = 3, 4, 8, 6  # input features 8: 4 or 2 per rank
LAYOUT_CASES = ((8, 4, 2), (8, 4, 1), (8, 4, 4), (16, 8, 2), (16, 8, 4), (64, 8, 2), (12, 6, 3))  # (world, gpus/node, tp)
_TIMEOUT_S = 60
TOL = dict(rtol=1e-5, atol=1e-6)


# --- reference solutions (the lesson's folded solutions are these functions' source) ------------------

def row_parallel_forward(x_shard: torch.Tensor, weight_shard: torch.Tensor, bias: torch.Tensor,
                         group) -> torch.Tensor:
    # this rank's input features times its columns: a partial sum of the output
    partial = x_shard @ weight_shard.t()
    # g: AllReduce in forward; in backward the output's gradient is already whole
    out = reduce_from_tensor_model_parallel_region(partial, group)
    return out + bias  # once, after the sum


def dp_tp_layout(world_size: int, gpus_per_node: int, tp: int) -> torch.Tensor:
    # ranks are numbered node by node: node i is the block of gpus_per_node consecutive ranks.
    # One node is one replica (HSDP's shard group x the TP groups): TP innermost, then the
    # shard group; the replicate dimension, outermost, is the only one that crosses nodes
    nodes, shard = world_size // gpus_per_node, gpus_per_node // tp
    return torch.arange(world_size).reshape(nodes, shard, tp)


# --- plausible mistakes, which the judges must catch (tests/course/test_exercise.py) --------------------------

def _in_place_all_reduce(x_shard, weight_shard, bias, group):
    partial = x_shard @ weight_shard.t()
    all_reduce(partial, group=group)  # right values, but no autograd node: only c10d's deprecated fallthrough
    return partial + bias


def _bias_on_every_rank(x_shard, weight_shard, bias, group):
    return reduce_from_tensor_model_parallel_region(x_shard @ weight_shard.t() + bias, group)  # bias tp times


def _no_all_reduce(x_shard, weight_shard, bias, group):
    return x_shard @ weight_shard.t() + bias  # each rank keeps its partial sum


def _all_reduce_in_backward(x_shard, weight_shard, bias, group):
    partial = x_shard @ weight_shard.t()
    return copy_to_tensor_model_parallel_region(partial, group) + bias  # f instead of g


def _all_reduce_both_ways(x_shard, weight_shard, bias, group):
    partial = reduce_from_tensor_model_parallel_region(x_shard @ weight_shard.t(), group)
    return copy_to_tensor_model_parallel_region(partial, group) + bias  # and the gradient summed again


def _layout_shard_across_nodes(world_size, gpus_per_node, tp):
    nodes, shard = world_size // gpus_per_node, gpus_per_node // tp
    # the right shape, but the shard group takes one rank from each node and a replica lives in one node
    return [[[s * gpus_per_node + r * tp + t for t in range(tp)] for s in range(shard)] for r in range(nodes)]


def _layout_tp_across_nodes(world_size, gpus_per_node, tp):
    nodes, shard = world_size // gpus_per_node, gpus_per_node // tp
    per = world_size // tp  # the TP group strided over the whole cluster: one rank per node
    return [[[t * per + r * shard + s for t in range(tp)] for s in range(shard)] for r in range(nodes)]


def _layout_two_dims(world_size, gpus_per_node, tp):
    dp = world_size // tp
    return [[i * tp + j for j in range(tp)] for i in range(dp)]  # last lesson's (dp, tp): FSDP over every node


def _layout_fsdp_over_all_nodes(world_size, gpus_per_node, tp):
    return torch.arange(world_size).reshape(1, world_size // tp, tp)  # one replica: the shard group spans nodes


def _layout_repeats_a_rank(world_size, gpus_per_node, tp):
    nodes, shard = world_size // gpus_per_node, gpus_per_node // tp
    return [[[r * shard + s + t for t in range(tp)] for s in range(shard)] for r in range(nodes)]  # overlaps


# --- exercise 1: row_parallel_forward -------------------------------------------------------------------

def through_autograd_function(out: torch.Tensor) -> bool:
    """Whether `out`'s autograd graph passes through a `torch.autograd.Function` (a custom node). A collective
    called on a tensor that needs a gradient, outside one, leaves no node: its forward values are right and
    backward passes through it only by PyTorch's deprecated c10d autograd fallthrough, which warns that the
    gradients may be silently wrong. A communication operator must be a Function, with its backward."""
    stack, seen = [out.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, torch.autograd.function.BackwardCFunction):
            return True
        stack.extend(next_node for next_node, _ in node.next_functions)
    return False


NOT_AN_AUTOGRAD_FUNCTION = (
    "autograd does not see the collective: called on a tensor that needs a gradient, outside a "
    "torch.autograd.Function, it leaves no node in the graph, and backward gets through it only by PyTorch's "
    "deprecated c10d fallthrough, which warns of silently wrong gradients; write the pair as an autograd "
    "Function, forward and backward",
    "autograd не видит коллективную операцию: вызванная на тензоре, которому нужен градиент, вне "
    "torch.autograd.Function, она не оставляет узла в графе, и backward проходит сквозь неё только через "
    "устаревший сквозной путь c10d, который предупреждает о незаметно неверных градиентах; запишите пару как "
    "autograd Function с forward и backward")

def _full_trial():
    g = torch.Generator().manual_seed(12)
    x, w, b = (torch.randn(shape, generator=g) for shape in ((_B, _T, _IN), (_OUT, _IN), (_OUT,)))
    probe = torch.randn((_B, _T, _OUT), generator=g)  # the loss is (out * probe).sum(): every output counts
    return x, w, b, probe


def _one_process():
    x, w, b, probe = (t.clone() for t in _full_trial())
    for t in (x, w, b):
        t.requires_grad_(True)
    out = x @ w.t() + b
    (out * probe).sum().backward()
    return out.detach(), x.grad, w.grad, b.grad


def _run_row_parallel(fn):
    n, r = dist.get_world_size(), dist.get_rank()
    x, w, b, probe = _full_trial()
    x_shard = x.chunk(n, dim=-1)[r].clone().requires_grad_(True)  # this rank's input features
    w_shard = w.chunk(n, dim=1)[r].clone().requires_grad_(True)  # the matching columns of the weight
    bias = b.clone().requires_grad_(True)
    with CommLog() as forward:
        try:
            out = fn(x_shard, w_shard, bias, None)
        except NotImplementedError:
            return None
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (_B, _T, _OUT):
        return ("shape", tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__)
    with CommLog() as backward:
        if out.requires_grad:
            (out * probe).sum().backward()
    grads = [t.grad if t.grad is not None else torch.zeros_like(t) for t in (x_shard, w_shard, bias)]
    return (out.detach(), grads, [rec.op for rec in forward.records], [rec.op for rec in backward.records],
            through_autograd_function(out))


def _ar(ops) -> str:
    return num(sum(op == "all_reduce" for op in ops))


def _judge_row_parallel(fn) -> Verdict:
    want_out, gx, gw, gb = _one_process()
    for world in ROW_WORLDS:
        where = tr(f"world {world}, ", f"число рангов {world}, ")
        results = launch(_run_row_parallel, world, args=(fn,), timeout=_TIMEOUT_S)
        if any(res is None for res in results):
            raise NotYet
        for rank, res in enumerate(results):
            if res[0] == "shape":
                return Verdict.wrong(where + tr(
                    f"rank {rank}: return the layer's whole output, shape {(_B, _T, _OUT)}; got {res[1]}",
                    f"ранг {rank}: верните весь выход слоя, форма {(_B, _T, _OUT)}; получено {res[1]}"))
            out, (got_x, got_w, got_b), fwd, bwd, as_function = res
            seen = tr(f"CommLog saw {_ar(fwd)} AllReduce(s) in forward and {_ar(bwd)} in backward",
                      f"CommLog увидел AllReduce: {_ar(fwd)} в forward и {_ar(bwd)} в backward")
            if not torch.allclose(out, want_out, **TOL):
                diff = out - want_out
                bias_extra = torch.allclose(diff, (world - 1) * _full_trial()[2].expand_as(diff), **TOL)
                why = tr(f" (it differs by exactly {world - 1} x the bias: the bias was counted {world} times)",
                         f" (разница ровно {world - 1} × bias: смещение учтено {world} раз)") if bias_extra else \
                    tr(" (it holds only this rank's input features' share of the sum)",
                       " (в нём только доля суммы от входных признаков этого ранга)") if not any(
                        op == "all_reduce" for op in fwd) else ""
                return Verdict.wrong(where + tr(f"rank {rank}: the output differs from one process's{why}; {seen}",
                                                f"ранг {rank}: выход отличается от выхода одного процесса{why}; {seen}"))
            if any(op == "all_reduce" for op in fwd) and not as_function:
                return Verdict.wrong(where + tr(f"rank {rank}: the output is right, but ",
                                                f"ранг {rank}: выход верен, но ") + tr(*NOT_AN_AUTOGRAD_FUNCTION)
                                     + tr(" (Megatron's g)", " (g из Megatron)"))
            n = world
            for name, got, full in (("x_shard", got_x, gx.chunk(n, dim=-1)[rank]),
                                    ("weight_shard", got_w, gw.chunk(n, dim=1)[rank]), ("bias", got_b, gb)):
                if not torch.allclose(got, full, **TOL):
                    ratio = got.norm().item() / max(full.norm().item(), 1e-30)
                    return Verdict.wrong(where + tr(
                        f"rank {rank}: the gradient of {name} is {num(ratio, 2)} times one process's "
                        f"(the output is right); {seen}",
                        f"ранг {rank}: градиент {name} в {num(ratio, 2)} раза больше, чем у одного процесса "
                        f"(выход верен); {seen}"))
            if len(fwd) != 1 or fwd[0] != "all_reduce" or bwd:
                return Verdict.wrong(where + tr(f"rank {rank}: a row-parallel layer needs one AllReduce per step "
                                                f"(through fsdp_mini's collectives); {seen}",
                                                f"ранг {rank}: слою с разбиением по строкам нужен один AllReduce за шаг "
                                                f"(через коллективные операции fsdp_mini); {seen}"))
    return Verdict.right(tr("At 2 and 4 ranks the output and the gradients of the input slice, the weight slice and "
                            "the bias equal one process's, with one AllReduce in forward and none in backward.",
                            "На 2 и 4 рангах выход и градиенты среза входа, среза весов и смещения совпадают с "
                            "одним процессом: один AllReduce в forward и ни одного в backward."))


# --- exercise 2: dp_tp_layout -------------------------------------------------------------------------

TRIAL_CFG = GPTConfig()
_BATCH = 8
DIMS = ("replicate", "shard", "tp")
REAL_CASE = (4, 2, 2)  # 4 real ranks as 2 nodes of 2, tp 2: a replica per node, its shard group of 1


def _where(world: int, gpus_per_node: int, tp: int) -> str:
    return tr(f"{world} ranks, {gpus_per_node} GPUs per node, tp {tp}: ",
              f"{world} рангов, {gpus_per_node} GPU на узел, tp {tp}: ")


def _as_mesh(out, world: int, gpus_per_node: int, tp: int) -> tuple[torch.Tensor | None, str]:
    """The learner's grid as DeviceMesh would take it (a tensor or nested lists of ints, or anything
    torch.as_tensor turns into an integer tensor), with the shape (replicate, shard, tp) and every rank once."""
    where = _where(world, gpus_per_node, tp)
    nodes, shard = world // gpus_per_node, gpus_per_node // tp
    try:
        grid = torch.as_tensor(out)
    except (TypeError, ValueError, RuntimeError):
        grid = None
    if grid is None or grid.dtype.is_floating_point or grid.dtype.is_complex or grid.dtype == torch.bool:
        return None, where + tr(
            "return the mesh's ranks as DeviceMesh takes them: a tensor or nested lists of ints, "
            f"got {type(out).__name__}" + (f" of {grid.dtype}" if grid is not None else ""),
            "верните ранги сетки так, как их принимает DeviceMesh: тензор или вложенные списки целых чисел, "
            f"получено {type(out).__name__}" + (f" с {grid.dtype}" if grid is not None else ""))
    want = (nodes, shard, tp)
    if tuple(grid.shape) != want:
        return None, where + tr(
            f"the mesh has three dimensions (replicate, shard, tp) of sizes {want}: {nodes} replicas (as many as "
            f"nodes), each sharded over {shard} ranks, each of those a TP group of {tp}; yours has shape "
            f"{tuple(grid.shape)}",
            f"у сетки три измерения (replicate, shard, tp) размеров {want}: {nodes} реплик (по числу узлов), "
            f"каждая шардирована на {shard} рангов, и каждый из них — группа TP из {tp}; у вашей форма "
            f"{tuple(grid.shape)}")
    ranks = sorted(grid.flatten().tolist())
    if ranks != list(range(world)):
        twice = sorted({r for r in ranks if ranks.count(r) > 1})
        missing = sorted(set(range(world)) - set(ranks))
        return None, where + tr(f"every rank 0..{world - 1} must appear exactly once (more than once: {twice[:6]}, "
                                f"missing: {missing[:6]})",
                                f"каждый ранг 0..{world - 1} должен встречаться ровно один раз (повторяются: "
                                f"{twice[:6]}, нет: {missing[:6]})")
    return grid.long(), ""


def _nodes(ranks, gpus_per_node: int) -> list[int]:
    """The nodes `ranks` run on (ranks numbered node by node)."""
    return sorted({int(r) // gpus_per_node for r in ranks})


def _groups(grid: torch.Tensor, dim: int) -> list[list[int]]:
    """The groups along mesh dimension `dim`: the ranks that differ only in that coordinate."""
    return grid.movedim(dim, -1).reshape(-1, grid.shape[dim]).tolist()


def _node_problem(grid: torch.Tensor, world: int, gpus_per_node: int, tp: int) -> str:
    where = _where(world, gpus_per_node, tp)
    for group in _groups(grid, 2):
        if len(_nodes(group, gpus_per_node)) > 1:
            return where + tr(
                f"your TP group {group} spans nodes {_nodes(group, gpus_per_node)}: its AllReduces, four per block "
                f"per step, each a whole activation, would cross the network",
                f"ваша группа TP {group} занимает узлы {_nodes(group, gpus_per_node)}: её AllReduce, четыре на блок "
                f"за шаг, каждый на целую активацию, шли бы по сети")
    for group in _groups(grid, 1):
        if len(_nodes(group, gpus_per_node)) > 1:
            return where + tr(
                f"your shard group {group} spans nodes {_nodes(group, gpus_per_node)}: FSDP's AllGather and "
                f"ReduceScatter of every unit, every step, would cross the network; HSDP shards inside a node and "
                f"sends across only one AllReduce of each gradient shard, over the replicate dimension",
                f"ваша группа шардирования {group} занимает узлы {_nodes(group, gpus_per_node)}: AllGather и "
                f"ReduceScatter каждого юнита на каждом шаге шли бы по сети; HSDP шардирует внутри узла, а по "
                f"сети отправляет только один AllReduce каждого шарда градиента, по измерению replicate")
    return ""


def _layout_step(grid):
    """On each rank: a DeviceMesh ("replicate", "shard", "tp") from the grid, the course GPT under TP over
    "tp" and fully_shard over ("replicate", "shard") (HSDP), one SGD step on this replica-and-shard's rows; the
    loss, the full weights, and the groups (global ranks) of the TP AllReduces and of FSDP's collectives."""
    from torch.distributed.device_mesh import DeviceMesh

    mesh = DeviceMesh("cpu", grid, mesh_dim_names=DIMS)
    model = GPT(TRIAL_CFG)
    parallelize_module(model, mesh["tp"], gpt_tp_plan(TRIAL_CFG, mesh["tp"].size()))
    dp = mesh["replicate", "shard"]
    for block in model.blocks:
        fully_shard(block, mesh=dp)
    fully_shard(model, mesh=dp)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rows = mesh["replicate"].get_local_rank() * mesh["shard"].size() + mesh["shard"].get_local_rank()
    x, y = (local_rows(t, rows, dp.size()) for t in make_batch(TRIAL_CFG, _BATCH))
    loss = model(x, y)
    loss.backward()
    opt.step()
    # the flight recorder has each collective's label and the global ranks of its group
    groups = sorted({(e.op, e.label.startswith(TP_LABEL), tuple(e.group)) for e in RECORDER.entries()})
    return loss.item(), gather_tensor_parallel(model, full_state_dict(model)), groups


def _one_process_step():
    model = GPT(TRIAL_CFG)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(*make_batch(TRIAL_CFG, _BATCH))
    loss.backward()
    opt.step()
    return loss.item(), model.state_dict()


def _judge_layout(fn) -> Verdict:
    for case in LAYOUT_CASES + (REAL_CASE,):  # on paper first: a wrong layout fails before any process starts
        grid, problem = _as_mesh(fn(*case), *case)
        if problem or _node_problem(grid, *case):
            return Verdict.wrong(problem or _node_problem(grid, *case))
    world, gpus_per_node, tp = REAL_CASE
    grid, _ = _as_mesh(fn(*REAL_CASE), *REAL_CASE)
    results = launch(_layout_step, world, args=(grid,), local_world_size=gpus_per_node, timeout=_TIMEOUT_S)
    want_loss, want = _one_process_step()
    where = tr("4 real ranks on 2 nodes, tp 2: ", "4 настоящих ранга на 2 узлах, tp 2: ")
    losses = []
    for rank, (loss, weights, groups) in enumerate(results):
        for op, is_tp, group in groups:
            nodes = _nodes(group, gpus_per_node)
            if (is_tp or op != "all_reduce") and len(nodes) > 1:
                return Verdict.wrong(where + tr(f"rank {rank}: a {'TP ' if is_tp else ''}{op} ran in the group "
                                                f"{list(group)}, which spans nodes {nodes}",
                                                f"ранг {rank}: {'TP-операция ' if is_tp else ''}{op} шла в группе "
                                                f"{list(group)}, а она занимает узлы {nodes}"))
        for name, value in want.items():
            if not torch.allclose(weights[name], value, **TOL):
                return Verdict.wrong(where + tr(f"rank {rank}: after one step {name} differs from one process's",
                                                f"ранг {rank}: после одного шага {name} отличается от одного "
                                                f"процесса"))
        losses.append(loss)
    if abs(sum(losses) / len(losses) - want_loss) > 1e-5 * abs(want_loss):
        return Verdict.wrong(where + tr("the ranks' mean loss differs from one process's",
                                        "средний лосс рангов отличается от лосса одного процесса"))
    return Verdict.right(tr(
        f"In {len(LAYOUT_CASES) + 1} layouts (up to {max(c[0] for c in LAYOUT_CASES)} ranks) every TP group and "
        f"every shard group sits inside a node and only the replicate dimension crosses nodes; on 4 real ranks "
        f"DeviceMesh took your grid, TP ran inside each node and one TP x HSDP step equals one process's.",
        f"В {len(LAYOUT_CASES) + 1} раскладках (до {max(c[0] for c in LAYOUT_CASES)} рангов) каждая группа TP и "
        f"каждая группа шардирования лежат внутри узла, и узлы пересекает только измерение replicate; на 4 "
        f"настоящих рангах DeviceMesh принял вашу сетку, TP работал внутри каждого узла, а шаг TP × HSDP совпал "
        f"с одним процессом."))


ROW_PARALLEL_FORWARD = CodeExercise("12.row_parallel_forward", _judge_row_parallel, row_parallel_forward,
                                    (_bias_on_every_rank, _no_all_reduce, _all_reduce_in_backward,
                                     _all_reduce_both_ways, _in_place_all_reduce))
DP_TP_LAYOUT = CodeExercise("12.dp_tp_layout", _judge_layout, dp_tp_layout,
                            (_layout_shard_across_nodes, _layout_tp_across_nodes, _layout_two_dims,
                             _layout_fsdp_over_all_nodes, _layout_repeats_a_rank))
