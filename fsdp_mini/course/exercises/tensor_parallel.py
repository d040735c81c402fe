"""Lesson 12's exercises: tensor parallelism written by the learner.

1. `row_parallel_forward(x_shard, weight_shard, bias, group)`: the forward of a row-parallel Linear, given
   this rank's slice of the input features and the matching columns of the weight (the bias is whole on
   every rank). Run on real ranks (worlds 2 and 4) and judged by parity with one process, for the output and
   for the gradients of the input slice, the weight slice and the bias, and by CommLog: which AllReduces ran
   in forward and which in backward.
2. `dp_tp_layout(world_size, gpus_per_node, tp)`: the rank grid of a 2-D mesh, dp rows of tp ranks, each row
   a tensor-parallel group, laid out so that every TP group sits inside one node (ranks numbered node by
   node). The judge builds a DeviceMesh from it on 4 real ranks (2 nodes of 2), runs one TP x fully_shard
   step of the course GPT, checks with CommLog and the flight recorder that every TP AllReduce's group lies
   inside a node and that the result equals one process's, then checks larger layouts on paper.
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
from fsdp_mini.course.tensor_parallel_plan import parallelize_gpt
from fsdp_mini.flight_recorder import RECORDER
from fsdp_mini.fully_shard import full_state_dict
from fsdp_mini.launch import launch
from fsdp_mini.tensor_parallel import gather_tensor_parallel
from fsdp_mini.tp_operators import (TP_LABEL, copy_to_tensor_model_parallel_region,
                                    reduce_from_tensor_model_parallel_region)

__all__ = ["ROW_PARALLEL_FORWARD", "DP_TP_LAYOUT", "row_parallel_forward", "dp_tp_layout", "ROW_WORLDS",
           "LAYOUT_CASES", "through_autograd_function", "NOT_AN_AUTOGRAD_FUNCTION"]

ROW_WORLDS = (2, 4)
_B, _T, _IN, _OUT = 3, 4, 8, 6  # input features 8: 4 or 2 per rank
LAYOUT_CASES = ((8, 4, 2), (8, 4, 4), (16, 8, 2), (16, 8, 8), (64, 8, 4), (6, 3, 3))  # (world, gpus/node, tp)
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


def dp_tp_layout(world_size: int, gpus_per_node: int, tp: int) -> list[list[int]]:
    dp = world_size // tp
    # row i is a TP group: tp consecutive ranks, and ranks are numbered node by node
    return [[i * tp + j for j in range(tp)] for i in range(dp)]


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


def _layout_transposed(world_size, gpus_per_node, tp):
    dp = world_size // tp
    return [[i + j * dp for j in range(tp)] for i in range(dp)]  # TP groups strided across nodes


def _layout_repeats_a_rank(world_size, gpus_per_node, tp):
    dp = world_size // tp
    return [[i + j for j in range(tp)] for i in range(dp)]  # rows overlap: rank 1 twice


def _layout_rows_are_nodes(world_size, gpus_per_node, tp):
    nodes = world_size // gpus_per_node
    return [[n * gpus_per_node + j for j in range(gpus_per_node)] for n in range(nodes)]  # a node per row


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
    "torch.autograd.Function, она не оставляет узла в графе, и обратный проход проходит сквозь неё только через "
    "устаревший сквозной путь c10d, который предупреждает о незаметно неверных градиентах; запишите пару как "
    "autograd Function, прямой и обратный проход")

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
                      f"CommLog увидел AllReduce: {_ar(fwd)} в прямом проходе и {_ar(bwd)} в обратном")
            if not torch.allclose(out, want_out, **TOL):
                diff = out - want_out
                bias_extra = torch.allclose(diff, (world - 1) * _full_trial()[2].expand_as(diff), **TOL)
                why = tr(f" (it differs by exactly {world - 1} x the bias: the bias was counted {world} times)",
                         f" (разница ровно {world - 1} x bias: смещение учтено {world} раз)") if bias_extra else \
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
                                                f"ранг {rank}: слою с разрезом по строкам нужен один AllReduce за шаг "
                                                f"(через коллективные операции fsdp_mini); {seen}"))
    return Verdict.right(tr("At 2 and 4 ranks the output and the gradients of the input slice, the weight slice and "
                            "the bias equal one process's, with one AllReduce in forward and none in backward.",
                            "На 2 и 4 рангах выход и градиенты среза входа, среза весов и смещения совпадают с "
                            "одним процессом: один AllReduce в прямом проходе и ни одного в обратном."))


# --- exercise 2: dp_tp_layout ---------------------------------------------------------------------------

TRIAL_CFG = GPTConfig()
_BATCH = 8


def _as_grid(out, world: int, gpus_per_node: int, tp: int) -> tuple[list[list[int]] | None, str]:
    where = tr(f"world {world}, {gpus_per_node} GPUs per node, tp {tp}: ",
               f"число рангов {world}, {gpus_per_node} GPU на узел, tp {tp}: ")
    dp = world // tp
    if not isinstance(out, (list, tuple)) or not all(
            isinstance(row, (list, tuple)) and all(isinstance(r, int) and not isinstance(r, bool) for r in row)
            for row in out):
        return None, where + tr("return a list of lists of ranks (dp rows of tp ranks)",
                                "верните список списков рангов (dp строк по tp рангов)")
    if len(out) != dp or any(len(row) != tp for row in out):
        return None, where + tr(f"the grid should have {dp} rows (dp) of {tp} ranks (tp); yours has "
                                f"{len(out)} rows of {sorted({len(row) for row in out})} ranks",
                                f"в сетке должно быть {dp} строк (dp) по {tp} рангов (tp); в вашей "
                                f"{len(out)} строк по {sorted({len(row) for row in out})} рангов")
    ranks = sorted(r for row in out for r in row)
    if ranks != list(range(world)):
        twice = sorted({r for r in ranks if ranks.count(r) > 1})
        missing = sorted(set(range(world)) - set(ranks))
        return None, where + tr(f"every rank 0..{world - 1} must appear exactly once (more than once: {twice[:6]}, "
                                f"missing: {missing[:6]})",
                                f"каждый ранг 0..{world - 1} должен встречаться ровно один раз (повторяются: "
                                f"{twice[:6]}, нет: {missing[:6]})")
    return [list(row) for row in out], ""


def _nodes(ranks, gpus_per_node: int) -> list[int]:
    """The nodes `ranks` run on (ranks numbered node by node)."""
    return sorted({r // gpus_per_node for r in ranks})


def _node_problem(grid, world: int, gpus_per_node: int, tp: int) -> str:
    for row in grid:
        nodes = _nodes(row, gpus_per_node)
        if len(nodes) > 1:
            return tr(f"world {world}, {gpus_per_node} GPUs per node, tp {tp}: your TP group {row} spans nodes "
                      f"{nodes}: its two AllReduces per block, forward and backward, would cross the network",
                      f"число рангов {world}, {gpus_per_node} GPU на узел, tp {tp}: ваша TP-группа {row} "
                      f"занимает узлы {nodes}: её два AllReduce на блок, в прямом и обратном проходе, шли бы по сети")
    return ""


def _layout_step(grid):
    """On each rank: a DeviceMesh from the grid, the course GPT under TP x fully_shard, one SGD step; the loss,
    the full weights, what CommLog saw, and the groups (global ranks) of the TP AllReduces."""
    from torch.distributed.device_mesh import DeviceMesh

    mesh = DeviceMesh("cpu", torch.tensor(grid), mesh_dim_names=("dp", "tp"))
    model = parallelize_gpt(GPT(TRIAL_CFG), mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = (local_rows(t, mesh["dp"].get_local_rank(), mesh["dp"].size()) for t in make_batch(TRIAL_CFG, _BATCH))
    with CommLog() as log:
        loss = model(x, y)
        loss.backward()
    opt.step()
    # CommLog has each collective's label and group size; the flight recorder also its group's global ranks
    tp_groups = sorted({e.group for e in RECORDER.entries() if e.label.startswith(TP_LABEL)})
    tp_ops = [(rec.op, rec.group_size) for rec in log.records if rec.label.startswith(TP_LABEL)]
    return loss.item(), gather_tensor_parallel(model, full_state_dict(model)), tp_ops, tp_groups


def _one_process_step():
    model = GPT(TRIAL_CFG)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(*make_batch(TRIAL_CFG, _BATCH))
    loss.backward()
    opt.step()
    return loss.item(), model.state_dict()


def _judge_layout(fn) -> Verdict:
    world, gpus_per_node, tp = 4, 2, 2
    grid, problem = _as_grid(fn(world, gpus_per_node, tp), world, gpus_per_node, tp)
    if problem:
        return Verdict.wrong(problem)
    results = launch(_layout_step, world, args=(grid,), local_world_size=gpus_per_node, timeout=_TIMEOUT_S)
    want_loss, want = _one_process_step()
    where = tr("4 ranks on 2 nodes, tp 2: ", "4 ранга на 2 узлах, tp 2: ")
    losses = []
    for rank, (loss, weights, tp_ops, tp_groups) in enumerate(results):
        blocks = TRIAL_CFG.n_layer
        if tp_ops != [("all_reduce", tp)] * (4 * blocks):
            return Verdict.wrong(where + tr(f"rank {rank}: CommLog saw {len(tp_ops)} TP collectives, not "
                                            f"{4 * blocks} AllReduces over {tp} ranks",
                                            f"ранг {rank}: CommLog увидел {len(tp_ops)} TP-операций, а не "
                                            f"{4 * blocks} AllReduce по {tp} рангам"))
        for group in tp_groups:
            nodes = _nodes(group, gpus_per_node)
            if len(nodes) > 1:
                return Verdict.wrong(where + tr(
                    f"rank {rank}'s TP AllReduces ran in the group {list(group)}, which spans nodes {nodes}: "
                    f"{4 * blocks} AllReduces per step crossed the network",
                    f"TP-операции AllReduce ранга {rank} шли в группе {list(group)}, а она занимает узлы {nodes}: "
                    f"{4 * blocks} AllReduce за шаг шли по сети"))
        for name, value in want.items():
            if not torch.allclose(weights[name], value, **TOL):
                return Verdict.wrong(where + tr(f"rank {rank}: after one step {name} differs from one process's",
                                                f"ранг {rank}: после одного шага {name} отличается от одного "
                                                f"процесса"))
        losses.append(loss)
    if abs(sum(losses) / len(losses) - want_loss) > 1e-5 * abs(want_loss):
        return Verdict.wrong(where + tr("the ranks' mean loss differs from one process's",
                                        "средний лосс рангов отличается от лосса одного процесса"))
    for case in LAYOUT_CASES:
        grid, problem = _as_grid(fn(*case), *case)
        if problem or _node_problem(grid, *case):
            return Verdict.wrong(problem or _node_problem(grid, *case))
    return Verdict.right(tr(
        f"On 4 real ranks every TP AllReduce stayed inside its node and one step equals one process's; "
        f"the {len(LAYOUT_CASES)} larger layouts (up to 64 ranks) keep TP inside nodes too.",
        f"На 4 настоящих рангах каждый TP AllReduce остался внутри своего узла, а шаг совпал с одним процессом; "
        f"в {len(LAYOUT_CASES)} раскладках побольше (до 64 рангов) TP тоже не выходит за узел."))


ROW_PARALLEL_FORWARD = CodeExercise("12.row_parallel_forward", _judge_row_parallel, row_parallel_forward,
                                    (_bias_on_every_rank, _no_all_reduce, _all_reduce_in_backward,
                                     _all_reduce_both_ways, _in_place_all_reduce))
DP_TP_LAYOUT = CodeExercise("12.dp_tp_layout", _judge_layout, dp_tp_layout,
                            (_layout_transposed, _layout_repeats_a_rank, _layout_rows_are_nodes))
