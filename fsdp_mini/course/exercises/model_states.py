"""Lesson 00's exercises: where training memory goes, counted by the learner.

1. `model_state_bytes(model, optimizer)`: the bytes of a real model's parameters, gradients and optimizer
   state after one AdamW step. Judged against `fsdp_mini.memory.tensor_bytes` and `optimizer_state_bytes`
   on three models chosen so that the easy shortcuts fail: the course's GPT (its head is tied to the token
   embedding: one tensor, counted once), the same GPT in bf16 with a frozen parameter (no gradient, and no
   Adam state either), and a small float64 MLP with a frozen weight.
2. `bytes_per_rank(num_params, world, strategy)`: the per-rank bytes of each model state under mixed-precision
   Adam for DDP and the three ZeRO stages. Judged against `fsdp_mini.estimate_memory` over a table of 24 cases,
   most of them with parameter counts that the world size does not divide (a shard is rounded up).

Both are single-process arithmetic: the lesson is about what is counted, before anything is communicated.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from fsdp_mini.course.exercise import CodeExercise, Verdict
from fsdp_mini.course.language import num, tr
from fsdp_mini.course.models import GPT, GPTConfig, make_batch
from fsdp_mini.memory import optimizer_state_bytes, tensor_bytes
from fsdp_mini.estimates import estimate_memory
from fsdp_mini.fsdp.strategy_facts import sharded_states

__all__ = ["MODEL_STATE_BYTES", "BYTES_PER_RANK", "model_state_bytes", "bytes_per_rank", "STRATEGIES", "CASES"]

STATES = ("params", "grads", "optimizer")
STRATEGIES = ("NO_SHARD", "ZERO1", "SHARD_GRAD_OP", "FULL_SHARD")
# (parameters, world): the ZeRO paper's model, counts no world divides, fewer parameters than ranks, one rank
_SIZES = ((7_500_000_000, 64), (1_300_000_001, 8), (17_675, 3), (17_675, 4), (3, 8), (1_000, 1))
CASES = tuple((p, n, s) for p, n in _SIZES for s in STRATEGIES)


# --- reference solutions (the lesson's folded solutions are these functions' source) ------------------

def model_state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    # each tensor once, even when two modules share it (a tied head)
    params = list(model.parameters())
    return {
        # bytes: elements times the dtype's size
        "params": sum(p.numel() * p.element_size() for p in params),
        # not frozen
        "grads": sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None),
        # exp_avg, exp_avg_sq and step
        "optimizer": sum(t.numel() * t.element_size() for state in optimizer.state.values()
                         for t in state.values() if torch.is_tensor(t)),
    }


def bytes_per_rank(num_params: int, world: int, strategy: str) -> dict[str, int]:
    sharded = {"NO_SHARD": (), "ZERO1": ("optimizer",), "SHARD_GRAD_OP": ("optimizer", "grads"),
               "FULL_SHARD": ("optimizer", "grads", "params")}[strategy]
    # bf16 weight, bf16 gradient, fp32 master + 2 moments
    per_element = {"params": 2, "grads": 2, "optimizer": 12}
    share = -(-num_params // world)  # ceil: every rank's shard has the same, rounded-up size
    return {
        state: (share if state in sharded else num_params) * nbytes
        for state, nbytes in per_element.items()
    }


# --- plausible mistakes, which the judges must catch (tests/course/test_exercise.py) -------------------------

def _count_tied_twice(model, optimizer):
    counted = model_state_bytes(model, optimizer)
    params = [p for _, p in model.named_parameters(remove_duplicate=False)]  # the tied head counted again
    counted["params"] = sum(p.numel() * p.element_size() for p in params)
    counted["grads"] = sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
    return counted


def _count_elements(model, optimizer):
    params = list(model.parameters())
    return {"params": sum(p.numel() for p in params),  # elements, not bytes
            "grads": sum(p.grad.numel() for p in params if p.grad is not None),
            "optimizer": sum(t.numel() for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t))}


def _count_frozen_grads(model, optimizer):
    counted = model_state_bytes(model, optimizer)
    # a gradient's bytes for every parameter, frozen ones too (they have none)
    counted["grads"] = sum(p.numel() * p.element_size() for p in model.parameters())
    return counted


def _forget_step_counter(model, optimizer):
    counted = model_state_bytes(model, optimizer)
    counted["optimizer"] = sum(s[k].numel() * s[k].element_size() for s in optimizer.state.values()
                               for k in ("exp_avg", "exp_avg_sq"))  # the moments only
    return counted


def _optimizer_from_the_formula(model, optimizer):
    counted = model_state_bytes(model, optimizer)
    tensors = list(model.parameters())  # 2 moments + a 4-byte step for every parameter, frozen ones too
    counted["optimizer"] = 2 * counted["params"] + 4 * len(tensors)
    return counted


def _shard_by_floor(num_params, world, strategy):
    sharded = {"NO_SHARD": (), "ZERO1": ("optimizer",), "SHARD_GRAD_OP": ("optimizer", "grads"),
               "FULL_SHARD": ("optimizer", "grads", "params")}[strategy]
    share = num_params // world  # floor: the remainder's parameters live on no rank
    per_element = {"params": 2, "grads": 2, "optimizer": 12}
    return {s: (share if s in sharded else num_params) * b for s, b in per_element.items()}


def _zero1_shards_grads(num_params, world, strategy):
    sharded = {"NO_SHARD": (), "ZERO1": ("optimizer", "grads"), "SHARD_GRAD_OP": ("optimizer", "grads"),
               "FULL_SHARD": ("optimizer", "grads", "params")}[strategy]  # ZeRO-1 taken for ZeRO-2
    share = -(-num_params // world)
    per_element = {"params": 2, "grads": 2, "optimizer": 12}
    return {s: (share if s in sharded else num_params) * b for s, b in per_element.items()}


def _no_master_copy(num_params, world, strategy):
    counted = bytes_per_rank(num_params, world, strategy)
    counted["optimizer"] = counted["optimizer"] * 8 // 12  # momentum and variance, but no fp32 master weight
    return counted


# --- what the judges run -------------------------------------------------------------------------------

def _trial_models():
    """(description, model, optimizer) after one AdamW step each: a tied GPT in fp32; the same GPT in bf16
    with its position embedding frozen; a float64 MLP with its first weight frozen."""
    cfg = GPTConfig(vocab_size=63, n_embd=25, n_head=5)
    tied = GPT(cfg)
    frozen = GPT(cfg).to(torch.bfloat16)
    frozen.pos_emb.weight.requires_grad_(False)
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(7, 5), nn.ReLU(), nn.Linear(5, 3)).double()
    mlp[0].weight.requires_grad_(False)
    trials = []
    for label, model in ((tr("the GPT (fp32, tied head)", "GPT (fp32, связанная голова)"), tied),
                         (tr("the GPT in bf16 with a frozen position embedding",
                             "GPT в bf16 с замороженным позиционным эмбеддингом"), frozen),
                         (tr("a float64 MLP with a frozen weight", "MLP во float64 с замороженным весом"), mlp)):
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
        if model is mlp:
            model(torch.randn(4, 7, dtype=torch.float64)).square().mean().backward()
        else:
            model(*make_batch(cfg, 4)).backward()
        opt.step()
        trials.append((label, model, opt))
    return trials


def _names(state: str) -> str:
    return {"params": tr("parameters", "параметров"), "grads": tr("gradients", "градиентов"),
            "optimizer": tr("optimizer state", "состояния оптимизатора")}[state]


def _not_a_dict(got) -> str:
    if not isinstance(got, dict) or set(got) != set(STATES):
        keys = sorted(got) if isinstance(got, dict) else type(got).__name__
        return tr(f"return a dict with the keys 'params', 'grads' and 'optimizer'; got {keys}",
                  f"верните dict с ключами 'params', 'grads' и 'optimizer'; получено {keys}")
    return ""


def _what_went_wrong(model, opt, state: str, got: int, want: int) -> str:
    """The mistake behind a wrong count, when it is one of the usual ones ("" otherwise)."""
    params = list(model.parameters())
    named_twice = [p for _, p in model.named_parameters(remove_duplicate=False)]
    frozen = [p for p in params if p.grad is None]
    tensors = {"params": params, "grads": [p.grad for p in params if p.grad is not None],
               "optimizer": [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]}[state]
    if sum(t.numel() for t in tensors) == got and got != want:
        return tr(" (that is the number of elements: a tensor's bytes are its elements times element_size())",
                  " (это число элементов: байты тензора — это его элементы, умноженные на element_size())")
    if state in ("params", "grads") and len(named_twice) > len(params):
        twice = sum(p.numel() * p.element_size() for p in named_twice if state == "params" or p.grad is not None)
        if got == twice:
            return tr(" (the tied head's weight is the token embedding's tensor: you counted it twice)",
                      " (вес связанной головы — это тот же тензор, что и эмбеддинг токенов: вы посчитали его "
                      "дважды)")
    if state == "grads" and frozen and got == want + sum(p.numel() * p.element_size() for p in frozen):
        return tr(" (you counted a gradient for the frozen parameter too; it has none)",
                  " (вы посчитали градиент и для замороженного параметра; у него градиента нет)")
    steps = [s["step"] for s in opt.state.values() if torch.is_tensor(s.get("step"))]
    if state == "optimizer" and got == want - sum(t.numel() * t.element_size() for t in steps):
        return tr(" (Adam's step counters are missing: one 4-byte tensor per optimized parameter)",
                  " (не хватает счётчиков шагов Adam: по 4-байтному тензору на каждый оптимизируемый параметр)")
    if state == "optimizer" and frozen and got > want:
        return tr(" (the frozen parameter has no optimizer state: AdamW allocates it only for a parameter that "
                  "gets a gradient)",
                  " (у замороженного параметра нет состояния оптимизатора: AdamW выделяет его только для "
                  "параметра, который получает градиент)")
    return ""


def _judge_model_state_bytes(fn) -> Verdict:
    for label, model, opt in _trial_models():
        params = list(model.parameters())
        want = {"params": tensor_bytes(params), "grads": tensor_bytes(p.grad for p in params),
                "optimizer": optimizer_state_bytes(opt)}
        got = fn(model, opt)
        if problem := _not_a_dict(got):
            return Verdict.wrong(problem)
        for state in STATES:
            if got[state] != want[state]:
                more = got[state] > want[state]
                why = _what_went_wrong(model, opt, state, got[state], want[state])
                return Verdict.wrong(tr(
                    f"{label}: you counted {num(got[state])} B of {_names(state)}, "
                    f"{'more' if more else 'less'} than its tensors really hold{why}",
                    f"{label}: вы насчитали {num(got[state])} Б {_names(state)}, "
                    f"{'больше' if more else 'меньше'}, чем на самом деле занимают его тензоры{why}"))
    return Verdict.right(tr("On all three models (tied weights, bf16 with a frozen parameter, a float64 MLP) your "
                            "counts match the bytes of the tensors themselves.",
                            "На всех трёх моделях (связанные веса, bf16 с замороженным параметром, MLP во float64) "
                            "ваши подсчёты совпадают с байтами самих тензоров."))


_PER_ELEMENT = {"params": 2, "grads": 2, "optimizer": 12}


def _what_per_rank_went_wrong(num_params: int, world: int, strategy: str, state: str, got: int) -> str:
    """The mistake behind a wrong per-rank count, when it is one of the usual ones ("" otherwise)."""
    sharded = state in sharded_states(strategy)
    b, ceil, floor = _PER_ELEMENT[state], -(-num_params // world), num_params // world
    if sharded and got == floor * b and floor != ceil:
        return tr(f" (a share of {num(num_params)} // {world} = {num(floor)} elements: {world} such shards hold "
                  f"{num(world * floor)}, and the remaining parameters ({num_params - world * floor}) belong to "
                  f"no rank)",
                  f" (доля {num(num_params)} // {world} = {num(floor)} элементов: {world} таких шардов вмещают "
                  f"{num(world * floor)}, а оставшиеся параметры ({num_params - world * floor}) не достаются ни "
                  f"одному рангу)")
    what, it = {"params": ("параметры", "их"), "grads": ("градиенты", "их"),
                "optimizer": ("состояние оптимизатора", "его")}[state]
    if world > 1 and not sharded and got in (ceil * b, floor * b):
        return tr(f" (you sharded the {_names(state)}, which {strategy} keeps whole on every rank)",
                  f" (вы шардировали {what}, а {strategy} хранит {it} целиком на каждом ранге)")
    if world > 1 and sharded and got == num_params * b:
        return tr(f" (you kept the {_names(state)} whole, which {strategy} shards)",
                  f" (вы храните {what} целиком, а {strategy} {it} шардирует)")
    elements = ceil if sharded else num_params
    if elements and got % elements == 0 and got // elements != b:
        return tr(f" ({got // elements} B per element of {_names(state)}; mixed-precision Adam keeps {b})",
                  f" ({got // elements} Б на элемент {_names(state)}; Adam в смешанной точности хранит {b})")
    return ""


def _judge_bytes_per_rank(fn) -> Verdict:
    for num_params, world, strategy in CASES:
        est = estimate_memory(num_params, world, strategy)
        got = fn(num_params, world, strategy)
        if problem := _not_a_dict(got):
            return Verdict.wrong(problem)
        for state in STATES:
            want = getattr(est, state)
            if got[state] != want:
                more = got[state] > want
                why = _what_per_rank_went_wrong(num_params, world, strategy, state, got[state])
                return Verdict.wrong(tr(
                    f"{strategy}, {num(num_params)} parameters over {world} ranks: {num(got[state])} B of "
                    f"{_names(state)} per rank is {'more' if more else 'less'} than a rank holds{why}",
                    f"{strategy}, {num(num_params)} параметров на {world} рангах: {num(got[state])} Б "
                    f"{_names(state)} на ранг — {'больше' if more else 'меньше'}, чем хранит ранг{why}"))
    return Verdict.right(tr(f"All {len(CASES)} cases match estimate_memory, state by state.",
                            f"Все {len(CASES)} случая совпадают с estimate_memory по каждому состоянию."))


MODEL_STATE_BYTES = CodeExercise("00.model_state_bytes", _judge_model_state_bytes, model_state_bytes,
                                 (_count_tied_twice, _count_elements, _count_frozen_grads, _forget_step_counter,
                                  _optimizer_from_the_formula))
BYTES_PER_RANK = CodeExercise("00.bytes_per_rank", _judge_bytes_per_rank, bytes_per_rank,
                              (_shard_by_floor, _zero1_shards_grads, _no_master_copy))
