"""Lesson 04's exercises: ZeRO-1 written by the learner, in its two halves.

1. `zero1_shard(params, make_optimizer, group)`: flatten the parameters into one buffer padded
   to a multiple of n, keep this rank's slice as a flat parameter, and build the optimizer on it alone.
   Judged by the optimizer state each rank holds after a step (about 1/n of one process's) and by
   training with the reference step.
2. `zero1_step(params, shard, opt, group)`: ReduceScatter (AVG) the flat gradient into the shard's
   gradient, step the shard, AllGather the updated shards and copy them into the parameters. Judged by
   CommLog (one ReduceScatter and one AllGather of the padded flat bytes) and by parity.

Parity is with one process training on the whole batch, with SGD and momentum (a wrong averaging factor
changes its steps) and AdamW with eps=1e-3 (a larger eps keeps rounding noise on near-zero gradients
from moving weights), at worlds 2, 3 and 4. The trial GPT has 17,675 parameters, which 2, 3 and 4 ranks
all have to pad.
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
from fsdp_mini.course.exercise import CodeExercise, NotYet, Verdict, summed_not_averaged
from fsdp_mini.course.language import num, tr
from fsdp_mini.course.models import GPT, GPTConfig, make_batch
from fsdp_mini.course.train import local_rows, train
from fsdp_mini.run import launch
from fsdp_mini.memory import optimizer_state_bytes

__all__ = ["ZERO1_SHARD", "ZERO1_STEP", "zero1_shard", "zero1_step", "TRIAL_CFG", "WORLDS"]

TRIAL_CFG = GPTConfig(vocab_size=63, n_embd=25, n_head=5)  # 17,675 parameters: odd, and not a multiple of 3
WORLDS = (2, 3, 4)
BATCH, STEPS = 12, 3
OPTIMIZERS = {
    "SGD": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
    "AdamW": (torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1, "eps": 1e-3}),
}
_TIMEOUT_S = 60


# --- reference solutions (the lesson's folded solutions are these functions' source) ------------------

def zero1_shard(params: list[nn.Parameter], make_optimizer, group=None):
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    size = math.ceil(flat.numel() / n)  # every rank's share, rounded up...
    # ...so the buffer is padded at its end
    flat = torch.cat([flat, flat.new_zeros(n * size - flat.numel())])
    # this rank's slice, and nothing else
    shard = nn.Parameter(flat[rank * size:(rank + 1) * size].clone())
    return shard, make_optimizer([shard])  # optimizer state for 1/n of the parameters


def zero1_step(
    params: list[nn.Parameter], shard: nn.Parameter, opt: torch.optim.Optimizer, group=None
) -> None:
    n = dist.get_world_size(group)
    flat_grad = torch.cat([p.grad.reshape(-1) for p in params])
    # the padding
    flat_grad = torch.cat([flat_grad, flat_grad.new_zeros(n * shard.numel() - flat_grad.numel())])
    shard.grad = torch.empty_like(shard)
    # this rank's slice of the average
    C.reduce_scatter_tensor(shard.grad, flat_grad, C.AVG, group=group)
    opt.step()  # updates the shard only
    flat = torch.empty(n * shard.numel(), dtype=shard.dtype)
    C.all_gather_into_tensor(flat, shard.detach(), group=group)  # every rank's updated slice
    offset = 0
    with torch.no_grad():
        for p in params:  # the flat buffer's padding, at its end, is left out
            p.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


# --- plausible mistakes, which the judges must catch (tests/course/test_exercise.py) -------------------------

def _shard_but_optimize_everything(params, make_optimizer, group=None):
    shard, _ = zero1_shard(params, make_optimizer, group)
    return shard, make_optimizer([shard, *params])  # state for the whole model on every rank


def _shard_unequal_slices(params, make_optimizer, group=None):
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    shard = nn.Parameter(flat.tensor_split(n)[rank].clone())  # no padding: the slices differ by one element
    return shard, make_optimizer([shard])


def _shard_floor_division(params, make_optimizer, group=None):
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    size = flat.numel() // n  # floor: n equal slices, but the last numel % n elements are in none of them
    shard = nn.Parameter(flat[rank * size:(rank + 1) * size].clone())
    return shard, make_optimizer([shard])


def _shard_floor_padding(params, make_optimizer, group=None):
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    size = flat.numel() // n  # floor, then "padding" up to n * size: a negative number of zeros
    flat = torch.cat([flat, flat.new_zeros(n * size - flat.numel())])
    shard = nn.Parameter(flat[rank * size:(rank + 1) * size].clone())
    return shard, make_optimizer([shard])


def _shard_strided(params, make_optimizer, group=None):
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    size = math.ceil(flat.numel() / n)
    flat = torch.cat([flat, flat.new_zeros(n * size - flat.numel())])
    shard = nn.Parameter(flat[rank::n].clone())  # every n-th element: not the slice a ReduceScatter delivers
    return shard, make_optimizer([shard])


def _step_all_reduce(params, shard, opt, group=None):
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    flat_grad = torch.cat([p.grad.reshape(-1) for p in params])
    flat_grad = torch.cat([flat_grad, flat_grad.new_zeros(n * shard.numel() - flat_grad.numel())])
    C.all_reduce(flat_grad, C.AVG, group=group)  # DDP's AllReduce, then keeps a quarter of it
    shard.grad = flat_grad[rank * shard.numel():(rank + 1) * shard.numel()].clone()
    opt.step()
    flat = torch.empty(n * shard.numel(), dtype=shard.dtype)
    C.all_gather_into_tensor(flat, shard.detach(), group=group)
    _copy_back(params, flat)


def _step_no_all_gather(params, shard, opt, group=None):
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    flat_grad = torch.cat([p.grad.reshape(-1) for p in params])
    flat_grad = torch.cat([flat_grad, flat_grad.new_zeros(n * shard.numel() - flat_grad.numel())])
    shard.grad = torch.empty_like(shard)
    C.reduce_scatter_tensor(shard.grad, flat_grad, C.AVG, group=group)
    opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in params])  # only this rank's own slice gets updated
    flat = torch.cat([flat, flat.new_zeros(n * shard.numel() - flat.numel())])
    flat[rank * shard.numel():(rank + 1) * shard.numel()] = shard.detach()
    _copy_back(params, flat)


def _step_sum_not_average(params, shard, opt, group=None):
    n = dist.get_world_size(group)
    flat_grad = torch.cat([p.grad.reshape(-1) for p in params])
    flat_grad = torch.cat([flat_grad, flat_grad.new_zeros(n * shard.numel() - flat_grad.numel())])
    shard.grad = torch.empty_like(shard)
    C.reduce_scatter_tensor(shard.grad, flat_grad, group=group)  # SUM, the default: n times too large
    opt.step()
    flat = torch.empty(n * shard.numel(), dtype=shard.dtype)
    C.all_gather_into_tensor(flat, shard.detach(), group=group)
    _copy_back(params, flat)


def _copy_back(params, flat):
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


# --- what the judges run -------------------------------------------------------------------------------

@dataclass(frozen=True)
class RankResult:
    """One rank's training: final weights, its shard's size, its optimizer state bytes after the first
    step, per step the collectives CommLog saw (op, bytes), what its shard holds and its first gradient."""

    state: dict | None
    shard_numel: int = 0
    state_bytes: int = 0
    steps: tuple[tuple[tuple[str, int], ...], ...] = ()
    not_yet: bool = False
    raised: str = ""  # what the learner's zero1_shard raised, when it asked for negative padding
    layout: str = "slice"  # what the shard holds: "slice" (the right one), "strided" or "other"
    first_grad: torch.Tensor | None = None  # shard.grad after the first step's ReduceScatter


def _num_params() -> int:
    return sum(p.numel() for p in GPT(TRIAL_CFG).parameters())


@functools.cache
def first_gradient() -> torch.Tensor:
    """One process's gradient of the whole batch at the first step, flat, in parameter order."""
    model = GPT(TRIAL_CFG)
    model(*make_batch(TRIAL_CFG, BATCH, 0)).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


@functools.cache
def one_process(opt_name: str) -> tuple[dict, int]:
    """One process on the whole batch: the final weights, and its optimizer's state bytes."""
    cls, kwargs = OPTIMIZERS[opt_name]
    model = GPT(TRIAL_CFG)
    opt = cls(model.parameters(), **kwargs)
    train(model, opt, TRIAL_CFG, STEPS, BATCH, shard_batch=False)
    return model.state_dict(), optimizer_state_bytes(opt)


def _zero1_run(shard_fn, step_fn, opt_name: str) -> RankResult:
    cls, kwargs = OPTIMIZERS[opt_name]
    rank, world = dist.get_rank(), dist.get_world_size()
    model = GPT(TRIAL_CFG)  # seeded: the same weights on every rank, as ZeRO-1 requires
    params = list(model.parameters())
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    try:
        try:
            shard, opt = shard_fn(params, functools.partial(cls, **kwargs), None)
            numel, raised = shard.numel(), ""
        except RuntimeError as e:  # a negative padding: every rank fails alike, so all answer here
            if "negative dimension" not in str(e):
                raise
            numel, raised = -1, f"{type(e).__name__}: {str(e).strip().splitlines()[0]}"
        sizes = [torch.zeros(1, dtype=torch.long) for _ in range(world)]
        dist.all_gather(sizes, torch.tensor([numel]))  # outside CommLog: the judge's own question
        if raised or any(int(t) < 0 for t in sizes):
            return RankResult(None, raised=raised or "RuntimeError")
        if len({int(t) for t in sizes}) > 1 or numel * world < flat.numel():  # no ReduceScatter could work
            return RankResult(None, numel)
        padded = torch.cat([flat, flat.new_zeros(world * numel - flat.numel())])
        held = shard.detach().reshape(-1)
        layout = ("slice" if torch.equal(held, padded[rank * numel:(rank + 1) * numel])
                  else "strided" if torch.equal(held, padded[rank::world]) else "other")
        if layout != "slice":  # its training would only say "wrong weights"
            return RankResult(None, numel, layout=layout)
        steps, state_bytes, first_grad = [], 0, None
        for step in range(STEPS):
            x, y = (local_rows(t, rank, world) for t in make_batch(TRIAL_CFG, BATCH, step))
            model(x, y).backward()
            with CommLog() as log:
                step_fn(params, shard, opt, None)
            steps.append(tuple((r.op, r.nbytes) for r in log.records))
            if step == 0 and shard.grad is not None:
                first_grad = shard.grad.detach().clone()
            state_bytes = state_bytes or optimizer_state_bytes(opt)
            model.zero_grad()
            opt.zero_grad()
    except NotImplementedError:
        return RankResult(None, not_yet=True)
    return RankResult(model.state_dict(), numel, state_bytes, tuple(steps), first_grad=first_grad)


def _memory_problem(results: list[RankResult], world: int, opt_name: str) -> str:
    numel = _num_params()
    sizes = [r.shard_numel for r in results]
    if len(set(sizes)) > 1:
        return tr(f"world {world}: the shards differ in size across ranks ({sizes} elements), and a ReduceScatter "
                  f"hands every rank an equal slice of the flat buffer",
                  f"число рангов {world}: шарды на рангах разного размера ({sizes} элементов), а ReduceScatter выдаёт "
                  f"каждому рангу равный срез плоского буфера")
    if sizes[0] * world < numel:
        floor = tr(f": a share of {num(numel)} // {world} rounds down, and the flat buffer must be padded to a "
                   f"multiple of {world} that holds every parameter" if sizes[0] == numel // world else "",
                   f": доля {num(numel)} // {world} округляется вниз, а плоский буфер нужно дополнить паддингом до "
                   f"кратного {world}, вмещающего все параметры" if sizes[0] == numel // world else "")
        return tr(f"world {world}: {world} shards of {num(sizes[0])} elements hold {num(world * sizes[0])} of the "
                  f"{num(numel)} parameters; the remainder, {num(numel - world * sizes[0])}, belongs to no rank{floor}",
                  f"число рангов {world}: {world} шарда по {num(sizes[0])} элементов вмещают {num(world * sizes[0])} из "
                  f"{num(numel)} параметров; остаток, {num(numel - world * sizes[0])}, не достаётся ни одному "
                  f"рангу{floor}")
    for rank, r in enumerate(results):
        if r.layout != "slice":
            every = f"{rank}, {rank + world}, {rank + 2 * world}, …"
            strided = tr(f" (it holds elements {every})", f" (в нём элементы {every})") if r.layout == "strided" else ""
            return tr(f"world {world}, rank {rank}: your shard does not hold elements {num(rank * sizes[0])} to "
                      f"{num((rank + 1) * sizes[0] - 1)} of the flat, padded buffer, the slice a ReduceScatter hands "
                      f"rank {rank}{strided}",
                      f"число рангов {world}, ранг {rank}: в вашем шарде не элементы с {num(rank * sizes[0])} по "
                      f"{num((rank + 1) * sizes[0] - 1)} плоского буфера с паддингом — а именно этот срез "
                      f"ReduceScatter выдаёт рангу {rank}{strided}")
    _, full = one_process(opt_name)
    per_element = full / numel
    for rank, r in enumerate(results):
        if r.state_bytes > per_element * sizes[0] + 64:
            more = (tr(" (more than the whole model's: the optimizer was given more than the shard)",
                       " (больше, чем у всей модели: оптимизатор получил не только шард)")
                    if r.state_bytes > full else "")
            return tr(f"world {world}, rank {rank}: {opt_name} holds {num(r.state_bytes)} B of state on this rank, "
                      f"one process holds {num(full)} B for the whole model: a rank should hold about 1/{world} of "
                      f"it{more}",
                      f"число рангов {world}, ранг {rank}: {opt_name} держит на этом ранге {num(r.state_bytes)} Б состояния, "
                      f"один процесс на всю модель — {num(full)} Б; рангу положено около 1/{world} этого{more}")
    return ""


def _comm_problem(results: list[RankResult], world: int) -> str:
    padded = 4 * world * results[0].shard_numel
    for rank, r in enumerate(results):
        for step, seen in enumerate(r.steps, 1):
            ops = [op for op, _ in seen]
            if ops != ["reduce_scatter", "all_gather"]:
                return tr(f"world {world}, rank {rank}, step {step}: a ZeRO-1 step needs one ReduceScatter, then one "
                          f"AllGather (through fsdp_mini.collectives); CommLog saw {ops}",
                          f"число рангов {world}, ранг {rank}, шаг {step}: шагу ZeRO-1 нужны один ReduceScatter и затем "
                          f"один AllGather (через fsdp_mini.collectives); CommLog увидел {ops}")
            for op, nbytes in seen:
                if nbytes != padded:
                    return tr(f"world {world}, rank {rank}: the {op} carried {num(nbytes)} B, not the padded flat "
                              f"buffer's {num(padded)} B",
                              f"число рангов {world}, ранг {rank}: {op} передал {num(nbytes)} Б, а не {num(padded)} Б "
                              f"плоского буфера с паддингом")
    return ""


def _gradient_problem(results: list[RankResult], world: int, opt_name: str) -> str:
    full = first_gradient()
    numel = results[0].shard_numel
    padded = torch.cat([full, full.new_zeros(world * numel - full.numel())])
    for rank, r in enumerate(results):
        want = padded[rank * numel:(rank + 1) * numel]
        if r.first_grad is None or r.first_grad.shape != want.shape:
            continue  # the weights' parity says what is wrong
        if not torch.allclose(r.first_grad, want, rtol=1e-5, atol=1e-6):
            hint = (tr(f" ({num(float(world), 1)} times the average: a ReduceScatter sums unless asked to average)",
                       f" (в {num(float(world), 1)} раза больше среднего: ReduceScatter суммирует, если не попросить "
                       f"усреднить)") if summed_not_averaged(r.first_grad, want, world) else "")
            return tr(f"world {world}, rank {rank}, {opt_name}: after the first step, shard.grad is not this rank's "
                      f"slice of the whole batch's gradient{hint}",
                      f"число рангов {world}, ранг {rank}, {opt_name}: после первого шага shard.grad — не срез этого ранга "
                      f"из градиента всего батча{hint}")
    return ""


def _parity_problem(results: list[RankResult], world: int, opt_name: str) -> str:
    want, _ = one_process(opt_name)
    for rank, r in enumerate(results):
        for name, w in want.items():
            if not torch.allclose(r.state[name], w, rtol=1e-5, atol=1e-6):
                gap = (r.state[name] - w).abs().max().item()
                return tr(f"world {world}, rank {rank}, {opt_name}: after {STEPS} steps {name} differs from one "
                          f"process's training on the whole batch by up to {gap:.1e}",
                          f"число рангов {world}, ранг {rank}, {opt_name}: после {STEPS} шагов {name} отличается от "
                          f"обучения в одном процессе на всём батче на величину до {gap:.1e}")
    return ""


def _judge(shard_fn, step_fn) -> Verdict:
    for world in WORLDS:
        for opt_name in OPTIMIZERS:
            results = launch(_zero1_run, world, args=(shard_fn, step_fn, opt_name), timeout=_TIMEOUT_S)
            if any(r.not_yet for r in results):
                raise NotYet
            raised = next(((rank, r.raised) for rank, r in enumerate(results) if r.raised), None)
            if raised:
                return Verdict.wrong(tr(
                    f"world {world}, rank {raised[0]}: your function raised {raised[1]}: the padding came out "
                    f"negative, so {world} shards of your size hold fewer elements than the parameters have (a "
                    f"share rounded down)",
                    f"число рангов {world}, ранг {raised[0]}: ваша функция выбросила {raised[1]}: паддинг получился "
                    f"отрицательным, то есть {world} шарда вашего размера вмещают меньше элементов, чем есть "
                    f"параметров (доля округлена вниз)"))
            problem = (_memory_problem(results, world, opt_name) or _comm_problem(results, world)
                       or _gradient_problem(results, world, opt_name) or _parity_problem(results, world, opt_name))
            if problem:
                return Verdict.wrong(problem)
    return Verdict.right(tr("At worlds 2, 3 and 4, with SGD and AdamW, every rank trains like one process, keeps "
                            "1/n of the optimizer state, and sends one ReduceScatter and one AllGather per step.",
                            "При 2, 3 и 4 рангах, с SGD и AdamW, каждый ранг обучается как один процесс, "
                            "хранит 1/n состояния оптимизатора и делает за шаг один ReduceScatter и один AllGather."))


def _judge_shard(fn) -> Verdict:
    return _judge(fn, zero1_step)


def _judge_step(fn) -> Verdict:
    return _judge(zero1_shard, fn)


ZERO1_SHARD = CodeExercise("04.zero1_shard", _judge_shard, zero1_shard,
                           (_shard_but_optimize_everything, _shard_unequal_slices, _shard_floor_division,
                            _shard_floor_padding, _shard_strided))
ZERO1_STEP = CodeExercise("04.zero1_step", _judge_step, zero1_step,
                          (_step_all_reduce, _step_no_all_gather, _step_sum_not_average))
