"""Lesson 06's prefetch exercise: the order in which backward reaches the units, written by the learner.

`backward_prefetch_order(forward_order)` receives the unit names in the order the first forward ran them
(what `FSDP.forward_order` records) and returns the order backward will reach them. The judge plugs the
answer into a real `fsdp_mini.FSDP`: backward's prefetch reads the step's post-forward order (the unit
whose forward ended just before is the one backward reaches next), so between the logged step's forward
and its backward the judge puts the answer there, reversed (`_use_as_post_forward_order`). It runs the
step on two ranks with prefetch on, and judges what happened: with `Trace` (when each unit's backward
compute began) and CommLog (when each AllGather was issued), every unit's backward AllGather must be
issued before the unit that runs just before it in backward starts computing (it was prefetched), and
the gathered peak must not exceed the library's own.

Two models: the course's GPT, and one whose forward calls its stages out of their definition order, so
an answer that sorts names instead of reading the recorded order is caught.
"""
from __future__ import annotations

import functools

import torch
import torch.distributed as dist
import torch.nn as nn

from fsdp_mini.comm_log import CommLog
from fsdp_mini.course.exercise import CodeExercise, Verdict
from fsdp_mini.course.language import num, tr
from fsdp_mini.run import launch

__all__ = ["BACKWARD_ORDER", "backward_prefetch_order", "REGATHERED", "regathered_in_backward", "Shuffled", "MODELS"]

_TIMEOUT_S = 90
_WORLD = 2


# --- the reference solution (the lesson's folded solution is its source) -------------------------------

def backward_prefetch_order(forward_order: list[str]) -> list[str]:
    # the root ran first: embeddings... and its head runs last in forward
    root, *units = forward_order
    # the loss's gradient reaches the head (root) first, then units in reverse
    return [root] + units[::-1]


# --- plausible mistakes, which the judge must catch (tests/course/test_exercise.py) ---------------------------

def _order_reversed_whole(forward_order):
    return forward_order[::-1]  # backward is forward reversed... including the root, which runs at both ends


def _order_as_forward(forward_order):
    return list(forward_order)  # backward replays forward


def _order_by_name(forward_order):
    root, *units = forward_order
    return [root] + sorted(units, reverse=True)  # reverse by name, not by what forward did


# --- the models --------------------------------------------------------------------------------------------

class Stage(nn.Module):
    """One unit of `Shuffled`: a residual Linear + tanh."""

    def __init__(self, width: int):
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, h):
        return h + torch.tanh(self.lin(h))


class Shuffled(nn.Module):
    """A model whose forward calls its stages in the order `ORDER`, not 0, 1, 2, 3: the recorded forward
    order is the only source of truth about which unit runs when."""

    ORDER = (2, 0, 3, 1)

    def __init__(self, width: int = 16):
        super().__init__()
        self.inp = nn.Linear(6, width)
        self.layers = nn.ModuleList(Stage(width) for _ in self.ORDER)
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        h = self.inp(x)
        for i in self.ORDER:
            h = self.layers[i](h)
        return self.head(h).pow(2).mean()


def _gpt():
    from fsdp_mini.course.models import GPT, Block, GPTConfig
    cfg = GPTConfig(n_layer=4)
    return GPT(cfg), (Block,)


def _shuffled():
    torch.manual_seed(0)
    return Shuffled(), (Stage,)


MODELS = {"GPT": _gpt, "Shuffled": _shuffled}


def _loss(name: str, model, step: int):
    rank, world = dist.get_rank(), dist.get_world_size()
    if name == "GPT":
        from fsdp_mini.course.models import GPTConfig, make_batch
        from fsdp_mini.course.train import local_rows
        x, y = (local_rows(t, rank, world) for t in make_batch(GPTConfig(n_layer=4), 8, step=step))
        return model(x, y)
    return model(torch.randn(4, 6, generator=torch.Generator().manual_seed(10 * step + rank)))


def _step(name: str, model, step: int):
    _loss(name, model, step).backward()


def _use_as_post_forward_order(model, order: list[str]) -> None:
    """The learner's backward order as the step's post-forward order, reversed: backward prefetches, for
    each unit, the one recorded just before it (`UnitLifecycle._backward_prefetch`)."""
    by_name = {u.label: u for u in model.units}
    model.post_forward_order[:] = [by_name[n] for n in reversed(order)]
    for unit in model.units:
        unit.post_forward_indices[:] = [i for i, u in enumerate(model.post_forward_order) if u is unit]


def _run(name: str, order: list[str] | None) -> dict:
    """One step to learn the forward order, one logged step (with `order`, the learner's backward order
    plugged in between its forward and its backward)."""
    from fsdp_mini.course.trace import Trace
    from fsdp_mini.fsdp.fully_sharded_data_parallel import FSDP
    module, wrap = MODELS[name]()
    model = FSDP(module, wrap=wrap, prefetch=True)
    _step(name, model, 0)
    model.gathered_memory.reset_peak()
    dist.barrier()
    with CommLog() as log, Trace(model) as trace:
        loss = _loss(name, model, 1)
        backward = [u.label for u in reversed(model.post_forward_order)]  # the order backward reaches them
        if order is not None:
            _use_as_post_forward_order(model, order)
        loss.backward()
    return dict(forward=[u.label for u in model.forward_order.units], backward=backward,
                gathers=[(r.label, r.start) for r in log.records if r.op == "all_gather"],
                backward_starts=[(s.label, s.start) for s in trace.spans if s.kind == "backward"],
                peak=model.gathered_memory.peak)


@functools.cache
def library_run(name: str) -> tuple[dict, ...]:
    """The library's own recorded orders and gathered peak for model `name` (computed once per process)."""
    return tuple(launch(_run, _WORLD, args=(name, None), timeout=_TIMEOUT_S))


def _judge(fn) -> Verdict:
    for name in MODELS:
        truth = library_run(name)
        forward, backward = truth[0]["forward"], truth[0]["backward"]
        answer = fn(list(forward))
        if not isinstance(answer, (list, tuple)) or sorted(map(str, answer)) != sorted(forward):
            return Verdict.wrong(tr(
                f"{name}: return the unit names you were given ({forward}), each once, in the order backward "
                f"reaches them; got {answer!r}",
                f"{name}: верните данные вам имена юнитов ({forward}), каждое по разу, в том порядке, в каком "
                f"до них доходит backward; получено {answer!r}"))
        runs = launch(_run, _WORLD, args=(name, list(answer)), timeout=_TIMEOUT_S)
        for rank, res in enumerate(runs):
            for before, after in zip(backward, backward[1:]):
                issued = max(t for label, t in res["gathers"] if label == after)
                began = min(t for label, t in res["backward_starts"] if label == before)
                if issued > began:
                    return Verdict.wrong(tr(
                        f"{name} (forward order {forward}), rank {rank}: {after} was not prefetched: its "
                        f"backward AllGather was issued only after {before}'s backward had begun, so backward "
                        f"waited for it",
                        f"{name} (порядок forward {forward}), ранг {rank}: {after} не был выбран заранее: его "
                        f"AllGather в backward запущен, только когда backward {before} уже начался, и backward "
                        f"его ждал"))
            if res["peak"] > truth[rank]["peak"]:
                return Verdict.wrong(tr(
                    f"{name}, rank {rank}: gathered parameters peaked at {num(res['peak'])} B, above the "
                    f"{num(truth[rank]['peak'])} B of a unit computing plus one prefetched: some unit was "
                    f"gathered long before backward needed it",
                    f"{name}, ранг {rank}: пик собранных параметров {num(res['peak'])} Б, больше "
                    f"{num(truth[rank]['peak'])} Б (вычисляемый юнит плюс один выбранный заранее): какой-то юнит "
                    f"собран задолго до того, как он понадобился backward"))
    return Verdict.right(tr("Plugged into FSDP, your order prefetched every unit in time in both models, with the "
                            "library's gathered peak.",
                            "Подключённый к FSDP, ваш порядок вовремя выбирал каждый юнит заранее в обеих моделях, "
                            "с тем же пиком собранных параметров, что у библиотеки."))


BACKWARD_ORDER = CodeExercise("06.backward_prefetch_order", _judge, backward_prefetch_order,
                              (_order_reversed_whole, _order_as_forward, _order_by_name))


# --- exercise 3: which units backward gathers again ----------------------------------------------------------
#
# The lesson's table counts AllGathers for one model; this exercise asks for the rule behind the count, per
# unit and per strategy, and the judge runs the strategies on `Shuffled`, a model the lesson never counted.

_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD")


def regathered_in_backward(strategy, forward_order: list[str]) -> list[str]:
    from fsdp_mini.fsdp.strategy import ShardingStrategy
    if strategy is not ShardingStrategy.FULL_SHARD:
        # SHARD_GRAD_OP keeps every unit gathered until backward; NO_SHARD never gathers at all
        return []
    root, *units = forward_order
    # each freed after its forward; the root's backward begins as its forward ends: kept
    return units


def _regathered_all(strategy, forward_order):
    from fsdp_mini.fsdp.strategy import ShardingStrategy
    # the root is freed after forward like the others
    return list(forward_order) if strategy is ShardingStrategy.FULL_SHARD else []


def _regathered_unless_no_shard(strategy, forward_order):
    from fsdp_mini.fsdp.strategy import ShardingStrategy
    root, *units = forward_order
    return units if strategy is not ShardingStrategy.NO_SHARD else []  # SHARD_GRAD_OP frees too


def _regathered_never(strategy, forward_order):
    return []  # prefetch already gathered them


def _gathered_in_backward(strategy_name: str) -> dict:
    """One recorded step, one logged step of `Shuffled` under `strategy_name`: the forward order and the
    units gathered a second time in the step (for backward: prefetch may issue that AllGather just before
    backward's first span begins, so the count tells, not the time)."""
    from fsdp_mini.fsdp.fully_sharded_data_parallel import FSDP
    from fsdp_mini.fsdp.strategy import ShardingStrategy
    module, wrap = _shuffled()
    model = FSDP(module, ShardingStrategy[strategy_name], wrap=wrap, prefetch=True)
    _step("Shuffled", model, 0)
    dist.barrier()
    with CommLog() as log:
        _step("Shuffled", model, 1)
    gathers = [r.label for r in log.records if r.op == "all_gather"]
    return dict(forward=[u.label for u in model.forward_order.units],
                regathered=sorted({label for label in gathers if gathers.count(label) > 1}))


@functools.cache
def _library_regathered(strategy_name: str) -> dict:
    return launch(_gathered_in_backward, _WORLD, args=(strategy_name,), timeout=_TIMEOUT_S)[0]


def _judge_regathered(fn) -> Verdict:
    from fsdp_mini.fsdp.strategy import ShardingStrategy
    for name in _STRATEGIES:
        truth = _library_regathered(name)
        forward = truth["forward"]
        answer = fn(ShardingStrategy[name], list(forward))
        if not isinstance(answer, (list, tuple)) or not set(map(str, answer)) <= set(forward) \
                or len(set(map(str, answer))) != len(answer):
            return Verdict.wrong(tr(
                f"{name}: return some of the unit names you were given ({forward}), each at most once; got {answer!r}",
                f"{name}: верните часть данных вам имён юнитов ({forward}), каждое не больше одного раза; "
                f"получено {answer!r}"))
        said, saw = set(map(str, answer)), set(truth["regathered"])
        if said != saw:
            missing, extra = sorted(saw - said), sorted(said - saw)
            parts = ([tr(f"backward did gather {missing} again", f"backward снова собрал {missing}")] if missing else []) \
                + ([tr(f"{extra} were still gathered when backward reached them",
                       f"{extra} ещё были собраны, когда до них дошёл backward")] if extra else [])
            return Verdict.wrong(tr(f"{name}, model Shuffled (forward order {forward}): ",
                                    f"{name}, модель Shuffled (порядок forward {forward}): ") + "; ".join(parts))
    return Verdict.right(tr("Under all three strategies, backward gathered again exactly the units you named.",
                            "При всех трёх стратегиях backward снова собрал ровно те юниты, что вы назвали."))


REGATHERED = CodeExercise("06.regathered_in_backward", _judge_regathered, regathered_in_backward,
                          (_regathered_all, _regathered_unless_no_shard, _regathered_never))
