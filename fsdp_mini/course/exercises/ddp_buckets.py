"""Lesson 03's exercises: DDP's gradient buckets and gradient accumulation, written by the learner.

1. `on_grad_ready(b, param)`: the hook backward calls when a parameter's gradient is ready. It counts the
   gradient into its bucket and, when the bucket is complete, starts the bucket's async AllReduce (AVG).
2. `finish_backward(b)`: after backward, wait for every bucket and copy the averages back into `p.grad`.
3. `accumulate_gradients(model, opt, micro_batches)`: one optimizer step over several micro-batches, with
   `no_sync()` so that the gradients are averaged across ranks once, not once per micro-batch.

Each is judged on real ranks (worlds 2, 3 and 4) by parity with one process training on the whole batch,
with SGD and momentum (its step is proportional to the gradient, so a wrong averaging factor shows, where
Adam would hide it), and by CommLog: one AllReduce per bucket per step, carrying the model's gradient bytes.
The other exercise's half comes from the reference, so each judge tests one thing.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn

from fsdp_mini import collectives as C
from fsdp_mini.comm_log import CommLog
from fsdp_mini.course.exercise import CodeExercise, NotYet, Verdict, summed_not_averaged
from fsdp_mini.course.language import num, tr
from fsdp_mini.course.models import GPT, GPTConfig, make_batch
from fsdp_mini.course.train import local_rows, train
from fsdp_mini.parallel.ddp import DistributedDataParallel, plan_buckets
from fsdp_mini.run import launch

__all__ = ["Buckets", "BUCKET_HOOK", "FINISH_BACKWARD", "ACCUMULATE", "on_grad_ready", "finish_backward",
           "accumulate_gradients", "CAP_MB", "WORLDS"]

CFG = GPTConfig()
CAP_MB = 0.02  # the lesson's cap: four buckets for the course GPT
WORLDS = (2, 3, 4)
BATCH, STEPS = 24, 2  # 24 rows split over 2, 3 and 4 ranks, and into 2 micro-batches on each
MICRO = 2
_TIMEOUT_S = 60


@dataclass
class Buckets:
    """What the hook and the end of backward share: bucket i's parameters (in the order backward produces
    their gradients), how many of its gradients have arrived, and the AllReduces in flight as
    (bucket index, flat buffer, work), in the order they started."""

    params: list[list[nn.Parameter]]
    group: object = None
    arrived: list[int] = field(default_factory=list)
    in_flight: list[tuple[int, torch.Tensor, object]] = field(default_factory=list)

    def __post_init__(self):
        self._where = {id(p): i for i, ps in enumerate(self.params) for p in ps}
        self.reset()

    def bucket_of(self, param: torch.Tensor) -> int:
        """The index of the bucket that holds `param`."""
        return self._where[id(param)]

    def reset(self) -> None:
        """Before each backward: no gradient arrived, nothing in flight."""
        self.arrived = [0] * len(self.params)
        self.in_flight = []


# --- reference solutions (the lesson's folded solutions are these functions' source) ------------------

def on_grad_ready(b: Buckets, param: nn.Parameter) -> None:
    i = b.bucket_of(param)
    b.arrived[i] += 1
    # the bucket's last gradient: send the whole bucket at once
    if b.arrived[i] == len(b.params[i]):
        flat = torch.cat([p.grad.reshape(-1) for p in b.params[i]])
        # returns at once; backward goes on
        work = C.all_reduce(flat, C.AVG, group=b.group, async_op=True)
        b.in_flight.append((i, flat, work))


def finish_backward(b: Buckets) -> None:
    for i, flat, work in b.in_flight:
        work.wait()  # the average is in `flat` only once the AllReduce is complete
        for p, avg in zip(b.params[i], flat.split([p.numel() for p in b.params[i]])):
            p.grad.copy_(avg.view_as(p))


def accumulate_gradients(model: DistributedDataParallel, opt: torch.optim.Optimizer,
                         micro_batches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    k = len(micro_batches)
    for x, y in micro_batches[:-1]:
        with model.no_sync():  # accumulate locally: no AllReduce for these backwards
            (model(x, y) / k).backward()  # the mean over the micro-batches, not their sum
    x, y = micro_batches[-1]
    # the last backward averages everything accumulated, bucket by bucket
    (model(x, y) / k).backward()
    opt.step()
    opt.zero_grad()


# --- plausible mistakes, which the judges must catch (tests/course/test_exercise.py) -------------------------

def _hook_sum_not_average(b, param):
    i = b.bucket_of(param)
    b.arrived[i] += 1
    if b.arrived[i] == len(b.params[i]):
        flat = torch.cat([p.grad.reshape(-1) for p in b.params[i]])
        b.in_flight.append((i, flat, C.all_reduce(flat, group=b.group, async_op=True)))  # SUM: n times too large


def _hook_one_all_reduce_per_parameter(b, param):
    i = b.bucket_of(param)
    b.arrived[i] += 1
    C.all_reduce(param.grad, C.AVG, group=b.group)  # right values, but one call per tensor, blocking backward
    if b.arrived[i] == len(b.params[i]):  # hand the already averaged bucket to the end of backward
        b.in_flight.append((i, torch.cat([p.grad.reshape(-1) for p in b.params[i]]), _Done()))


def _hook_only_the_first_bucket(b, param):
    i = b.bucket_of(param)
    b.arrived[i] += 1
    if i == 0 and b.arrived[i] == len(b.params[i]):  # the other buckets never leave
        flat = torch.cat([p.grad.reshape(-1) for p in b.params[i]])
        b.in_flight.append((i, flat, C.all_reduce(flat, C.AVG, group=b.group, async_op=True)))


class _Done:
    """A finished work (what a wrong hook hands the reference end of backward after waiting itself)."""

    def wait(self):
        return True


def _finish_without_waiting(b):
    for i, flat, _work in b.in_flight:  # copies whatever the buffer holds now: the average is not there yet
        for p, avg in zip(b.params[i], flat.split([p.numel() for p in b.params[i]])):
            p.grad.copy_(avg.view_as(p))


def _finish_without_copying_back(b):
    for _i, _flat, work in b.in_flight:
        work.wait()  # the average lands in the flat buffer, and p.grad keeps this rank's own gradient


def _finish_in_the_wrong_order(b):
    for i, flat, work in b.in_flight:
        work.wait()
        params = b.params[i][::-1]  # registration order instead of the bucket's order
        for p, avg in zip(params, flat.split([p.numel() for p in params])):
            p.grad.copy_(avg.view_as(p))


def _accumulate_syncing_every_micro_batch(model, opt, micro_batches):
    for x, y in micro_batches:  # right gradients, but an AllReduce of every bucket per micro-batch
        (model(x, y) / len(micro_batches)).backward()
    opt.step()
    opt.zero_grad()


def _accumulate_never_syncing(model, opt, micro_batches):
    with model.no_sync():  # the last backward too: every rank steps on its own gradient
        for x, y in micro_batches:
            (model(x, y) / len(micro_batches)).backward()
    opt.step()
    opt.zero_grad()


def _accumulate_summing_the_losses(model, opt, micro_batches):
    for x, y in micro_batches[:-1]:
        with model.no_sync():
            model(x, y).backward()  # the gradient of the sum: k times the mean's
    model(*micro_batches[-1]).backward()
    opt.step()
    opt.zero_grad()


# --- what the judges run -------------------------------------------------------------------------------

def _sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


@dataclass(frozen=True)
class RankResult:
    """One rank's training: its final weights, the gradients after the first step's synchronisation,
    per step the collectives CommLog saw complete (op, bytes), this rank's own first gradients and how
    far its first step moved the weights."""

    state: dict | None
    first_grads: dict | None = None
    steps: tuple[tuple[tuple[str, int], ...], ...] = ()
    not_yet: bool = False
    own_grads: dict | None = None  # this rank's own gradients at the first step, before any averaging
    first_step: dict | None = None  # how far the first optimizer step moved each weight


@functools.cache
def one_process() -> tuple[dict, dict]:
    """The reference: one process trains on the whole batch; its final weights and first gradients."""
    model = GPT(CFG)
    x, y = make_batch(CFG, BATCH, 0)
    model(x, y).backward()
    first = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    train(model, _sgd(model.parameters()), CFG, STEPS, BATCH, shard_batch=False)
    return model.state_dict(), first


@functools.cache
def one_process_first_step() -> dict:
    """How far one process's first SGD step on the whole batch moves each weight."""
    model = GPT(CFG)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    train(model, _sgd(model.parameters()), CFG, 1, BATCH, shard_batch=False)
    return {n: p.detach() - start[n] for n, p in model.named_parameters()}


def _own_gradients(x, y) -> dict:
    """This rank's gradients on its own rows, from a fresh (seeded, so identical) model: what p.grad holds
    before any averaging."""
    model = GPT(CFG)
    model(x, y).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def _rows(step: int):
    rank, world = dist.get_rank(), dist.get_world_size()
    return [local_rows(t, rank, world) for t in make_batch(CFG, BATCH, step)]


def _bucketed_run(hook, finish) -> RankResult:
    """Train STEPS steps with buckets driven by `hook` (on every parameter) and `finish` (after backward)."""
    model = GPT(CFG)
    by_name = dict(model.named_parameters())
    b = Buckets([[by_name[n] for n in bucket.names] for bucket in plan_buckets(model, CAP_MB)])
    for ps in b.params:
        for p in ps:
            p.register_post_accumulate_grad_hook(lambda param: hook(b, param))
    opt, steps, first = _sgd(model.parameters()), [], None
    own = _own_gradients(*_rows(0))
    try:
        for step in range(STEPS):
            x, y = _rows(step)
            b.reset()
            with CommLog() as log:
                model(x, y).backward()
                finish(b)
            steps.append(tuple((r.op, r.nbytes) for r in log.records))
            if first is None:
                first = {n: p.grad.clone() for n, p in model.named_parameters()}
            opt.step()
            opt.zero_grad()
    except NotImplementedError:
        return RankResult(None, not_yet=True)
    return RankResult(model.state_dict(), first, tuple(steps), own_grads=own)


def _accumulate_run(fn) -> RankResult:
    model = DistributedDataParallel(GPT(CFG), bucket_cap_mb=CAP_MB)
    opt, steps, moved = _sgd(model.parameters()), [], None
    start = {n: p.detach().clone() for n, p in model.module.named_parameters()}
    try:
        for step in range(STEPS):
            x, y = _rows(step)
            micro = list(zip(x.chunk(MICRO), y.chunk(MICRO)))
            with CommLog() as log:
                fn(model, opt, micro)
            steps.append(tuple((r.op, r.nbytes) for r in log.records))
            if moved is None:
                moved = {n: p.detach() - start[n] for n, p in model.module.named_parameters()}
    except NotImplementedError:
        return RankResult(None, not_yet=True)
    return RankResult(model.module.state_dict(), None, tuple(steps), first_step=moved)


def _on_ranks(run, args, world: int) -> list[RankResult]:
    results = launch(run, world, args=args, timeout=_TIMEOUT_S)
    if any(r.not_yet for r in results):
        raise NotYet
    return results


def _expected_collectives() -> tuple[int, int]:
    """Buckets per step, and the model's gradient bytes (what all of them carry together)."""
    model = GPT(CFG)
    return len(plan_buckets(model, CAP_MB)), 4 * sum(p.numel() for p in model.parameters())


def _comm_problem(result: RankResult, world: int, rank: int, what: str, count_hint=None) -> str:
    """"" when every step saw one AllReduce per bucket carrying the model's gradient bytes, else what it saw;
    `count_hint(calls, buckets)` says what a wrong number of calls means in this exercise."""
    buckets, nbytes = _expected_collectives()
    for step, seen in enumerate(result.steps, 1):
        ops = sorted({op for op, _ in seen})
        total = sum(b for _, b in seen)
        if ops not in ([], ["all_reduce"]):
            return tr(f"world {world}, rank {rank}, step {step}: DDP only needs AllReduces, CommLog saw {ops}",
                      f"число рангов {world}, ранг {rank}, шаг {step}: DDP нужны только AllReduce, CommLog увидел {ops}")
        if len(seen) != buckets:
            hint = count_hint(len(seen), buckets) if count_hint else ""
            return tr(f"world {world}, rank {rank}, step {step}: {what}, CommLog saw {len(seen)} completed "
                      f"AllReduce calls for {buckets} buckets{hint}",
                      f"число рангов {world}, ранг {rank}, шаг {step}: {what} CommLog увидел завершённых вызовов "
                      f"AllReduce: {len(seen)}, а бакетов {buckets}{hint}")
        if total != nbytes:
            return tr(f"world {world}, rank {rank}, step {step}: the AllReduces carried {num(total)} B, the model's "
                      f"gradients are {num(nbytes)} B",
                      f"число рангов {world}, ранг {rank}, шаг {step}: AllReduce передали {num(total)} Б, а градиенты "
                      f"модели занимают {num(nbytes)} Б")
    return ""


def _parity_problem(result: RankResult, world: int, rank: int) -> str:
    want, first = one_process()
    if result.first_grads is not None:
        for name, g in result.first_grads.items():
            if not torch.allclose(g, first[name], rtol=1e-5, atol=1e-6):
                hint = (tr(f" ({num(float(world), 1)} times the average: the ranks' gradients were summed; an "
                           f"AllReduce sums unless asked to average, and fsdp_mini's AVG divides in work.wait())",
                           f" (в {num(float(world), 1)} раза больше среднего: градиенты рангов сложены; AllReduce "
                           f"суммирует, если не попросить усреднить, а AVG в fsdp_mini делит в work.wait())")
                        if summed_not_averaged(g, first[name], world) else _first_grad_hint(result, name))
                return tr(f"world {world}, rank {rank}: after the first backward, the gradient of {name} is not the "
                          f"whole batch's gradient{hint}",
                          f"число рангов {world}, ранг {rank}: после первого backward градиент {name} не равен градиенту "
                          f"всего батча{hint}")
    if result.first_step is not None:
        moved, due = (torch.cat([d[n].reshape(-1) for n in sorted(result.first_step)])
                      for d in (result.first_step, one_process_first_step()))
        if not torch.allclose(moved, due, rtol=1e-4, atol=1e-7):
            hint = (tr(f" ({num(moved.norm().item() / due.norm().item(), 1)} times as far: the {MICRO} "
                       f"micro-batches' gradients were added up, not averaged)",
                       f" (в {num(moved.norm().item() / due.norm().item(), 1)} раза дальше: градиенты {MICRO} "
                       f"микробатчей сложены, а не усреднены)") if summed_not_averaged(moved, due, MICRO) else "")
            return tr(f"world {world}, rank {rank}: the first optimizer step moved the weights differently from one "
                      f"process's first step on the whole batch{hint}",
                      f"число рангов {world}, ранг {rank}: первый шаг оптимизатора сдвинул веса не так, как первый шаг "
                      f"одного процесса на всём батче{hint}")
    for name, w in want.items():
        if not torch.allclose(result.state[name], w, rtol=1e-5, atol=1e-6):
            gap = (result.state[name] - w).abs().max().item()
            return tr(f"world {world}, rank {rank}: after {STEPS} SGD steps, {name} differs from one process's "
                      f"training on the whole batch by up to {gap:.1e}",
                      f"число рангов {world}, ранг {rank}: после {STEPS} шагов SGD {name} отличается от обучения в одном "
                      f"процессе на всём батче на величину до {gap:.1e}")
    return ""


def _first_grad_hint(result: RankResult, name: str) -> str:
    """Why a first gradient is wrong, when it is still the rank's own or holds other parameters' averages."""
    if result.own_grads is not None and torch.allclose(result.first_grads[name], result.own_grads[name]):
        return tr(" (it is still this rank's own gradient: the average never reached p.grad)",
                  " (это всё ещё собственный градиент ранга: среднее так и не попало в p.grad)")
    _, first = one_process()
    names = next(b.names for b in plan_buckets(GPT(CFG), CAP_MB) if name in b.names)
    got, due = (torch.cat([g[n].reshape(-1) for n in names]) for g in (result.first_grads, first))
    if torch.allclose(got.sort().values, due.sort().values, rtol=1e-5, atol=1e-6):
        return tr(" (its bucket holds the right averages, but in the wrong parameters: the flat buffer was cut in "
                  "another order than the one it was filled in)",
                  " (в его бакете верные средние, но не в тех параметрах: плоский буфер разрезан не в том порядке, "
                  "в каком его заполняли)")
    return ""


def _judge(run, args, what: str, count_hint=None) -> Verdict:
    for world in WORLDS:
        for rank, result in enumerate(_on_ranks(run, args, world)):
            problem = (_comm_problem(result, world, rank, what, count_hint)
                       or _parity_problem(result, world, rank))
            if problem:
                return Verdict.wrong(problem)
    return Verdict.right(tr("At worlds 2, 3 and 4 every rank trains like one process, with one AllReduce per "
                            "bucket per step.",
                            "При 2, 3 и 4 рангах каждый ранг обучается как один процесс, с одним "
                            "AllReduce на бакет за шаг."))


def _hook_calls(calls: int, buckets: int) -> str:
    if calls == len(list(GPT(CFG).parameters())):
        return tr(": one AllReduce per parameter, where a bucket's gradients go in one AllReduce",
                  ": по AllReduce на каждый параметр, а градиенты бакета должны уходить одним AllReduce")
    if 0 < calls < buckets:
        return tr(": some buckets were never sent", ": часть бакетов так и не отправлена")
    return ""


def _finish_calls(calls: int, buckets: int) -> str:
    if calls < buckets:
        return tr(" (CommLog counts an AllReduce as completed once its work.wait() has returned)",
                  " (CommLog считает AllReduce завершённым, когда вернулся его work.wait())")
    return ""


def _accumulate_calls(calls: int, buckets: int) -> str:
    if calls == MICRO * buckets:
        return tr(f": every bucket was AllReduced after each of the {MICRO} backwards, not once per step",
                  f": каждый бакет прошёл AllReduce после каждого из {MICRO} backward, а не раз за шаг")
    if calls == 0:
        return tr(": every backward ran inside no_sync(), so no gradient was ever averaged across the ranks",
                  ": все backward прошли внутри no_sync(), и градиенты так и не усреднились между рангами")
    return ""


def _judge_hook(fn) -> Verdict:
    return _judge(_bucketed_run, (fn, finish_backward), tr("by the end of backward", "к концу backward"),
                  _hook_calls)


def _judge_finish(fn) -> Verdict:
    return _judge(_bucketed_run, (on_grad_ready, fn), tr("before the optimizer step", "до шага оптимизатора"),
                  _finish_calls)


def _judge_accumulate(fn) -> Verdict:
    return _judge(_accumulate_run, (fn,), tr(f"in one step of {MICRO} micro-batches",
                                             f"за один шаг из {MICRO} микробатчей"), _accumulate_calls)


BUCKET_HOOK = CodeExercise("03.on_grad_ready", _judge_hook, on_grad_ready,
                           (_hook_sum_not_average, _hook_one_all_reduce_per_parameter, _hook_only_the_first_bucket))
FINISH_BACKWARD = CodeExercise("03.finish_backward", _judge_finish, finish_backward,
                               (_finish_without_waiting, _finish_without_copying_back, _finish_in_the_wrong_order))
ACCUMULATE = CodeExercise("03.accumulate_gradients", _judge_accumulate, accumulate_gradients,
                          (_accumulate_syncing_every_micro_batch, _accumulate_never_syncing,
                           _accumulate_summing_the_losses))
