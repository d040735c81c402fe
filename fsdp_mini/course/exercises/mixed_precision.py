"""Lesson 06's mixed-precision exercise: the cast policy, written by the learner.

`policy_dtypes(dtype, policy)` says, for a flat parameter of `dtype` under a `MixedPrecision` policy, the
dtype it is gathered and computed in and the dtype its gradients are reduced in. The judge plugs the
answer into a real `fsdp_mini.FSDP` (a `MixedPrecision` whose two public methods ask the learner's
function) and trains one step on three ranks of a unit that also holds an int64 parameter, under
bf16 compute with fp32 reduction and under bf16 alone. It compares with the library's own policy: the
dtype and exact values of the gathered int64 parameter (a bf16 copy of 1,234,567 is 1,236,992), the
compute dtype of the float weights, every collective's bytes in CommLog (bf16 on the wire is half), and
the loss. Then it asks the remaining cases (float16, float64, complex, policies with a field unset).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from fsdp_mini.comm_log import CommLog
from fsdp_mini.course.exercise import CodeExercise, Verdict
from fsdp_mini.course.language import num, tr
from fsdp_mini.run import launch
from fsdp_mini.fsdp.mixed_precision import MixedPrecision

__all__ = ["CAST_POLICY", "policy_dtypes", "MixedUnit", "POLICIES"]

_TIMEOUT_S = 60
_WORLD = 3
BF16, FP32 = torch.bfloat16, torch.float32
POLICIES = ((BF16, FP32), (BF16, None))  # (param_dtype, reduce_dtype) of the FSDP runs
_GRID_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.bool,
                torch.complex64)
_GRID_POLICIES = ((None, None), (BF16, None), (BF16, FP32), (None, FP32), (torch.float16, torch.float64))


# --- the reference solution (the lesson's folded solution is its source) -------------------------------

def policy_dtypes(dtype: torch.dtype, policy: MixedPrecision) -> tuple[torch.dtype, torch.dtype]:
    # token ids, counters, complex rotations: a bf16 copy would be wrong
    if not dtype.is_floating_point:
        return dtype, dtype
    compute = policy.param_dtype or dtype  # unset: compute in the parameter's own dtype
    return compute, policy.reduce_dtype or compute  # unset: reduce in the compute dtype


# --- plausible mistakes, which the judge must catch (tests/course/test_exercise.py) ---------------------------

def _cast_everything(dtype, policy):
    compute = policy.param_dtype or dtype  # integer parameters too
    return compute, policy.reduce_dtype or compute


def _reduce_in_compute_dtype(dtype, policy):
    if not dtype.is_floating_point:
        return dtype, dtype
    compute = policy.param_dtype or dtype
    return compute, compute  # reduce_dtype ignored: averaging many ranks in bf16


def _reduce_falls_back_to_own_dtype(dtype, policy):
    if not dtype.is_floating_point:
        return dtype, dtype
    return policy.param_dtype or dtype, policy.reduce_dtype or dtype  # unset reduce_dtype: fp32, not bf16


# --- the trial unit and what each rank runs ------------------------------------------------------------

class MixedUnit(nn.Module):
    """59 float32 elements (Linear(4, 7), Tanh, Linear(7, 3)) and a frozen int64 parameter of 5 values
    that bf16 cannot hold exactly, added (mod 5) to the output."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(4, 7), nn.Linear(7, 3)
        self.lookup = nn.Parameter(torch.tensor([1_234_567, 3, 2**40 + 1, 77_777, 9]), requires_grad=False)

    def forward(self, x):
        out = self.b(torch.tanh(self.a(x)))
        return out + (self.lookup[:3] % 5).to(out.dtype)


@dataclass(frozen=True)
class _LearnersPolicy(MixedPrecision):
    """A MixedPrecision whose two public methods ask the learner's `rule(dtype, policy)`."""

    rule: Callable | None = None

    def _plain(self) -> MixedPrecision:
        return MixedPrecision(**{f.name: getattr(self, f.name) for f in fields(MixedPrecision)})

    def compute_dtype(self, dtype):
        return self.rule(dtype, self._plain())[0]

    def gradient_reduce_dtype(self, dtype):
        return self.rule(dtype, self._plain())[1]


def _run(fn, param_dtype, reduce_dtype) -> dict:
    from fsdp_mini.fsdp.fully_sharded_data_parallel import FSDP
    policy = (MixedPrecision(param_dtype, reduce_dtype) if fn is None
              else _LearnersPolicy(param_dtype, reduce_dtype, rule=fn))
    model = FSDP(MixedUnit(), mixed_precision=policy)
    with model.summon_full_params():
        lookup = model.module.lookup.detach().clone()
        weight = str(model.module.a.weight.dtype)
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(100 + dist.get_rank()))
    loss, error = float("nan"), ""
    with CommLog() as log:
        try:
            objective = model(x).float().pow(2).mean()
            objective.backward()
            loss = objective.item()
        except Exception as e:  # the learner's policy broke the step: report it as a finding
            error = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
    return dict(lookup=lookup, weight=weight, loss=loss, error=error,
                collectives=sorted((r.op, r.label, r.nbytes) for r in log.records))


@functools.cache
def library_run(param_dtype, reduce_dtype) -> tuple[dict, ...]:
    """What FSDP with the library's own MixedPrecision does (computed once per process)."""
    return tuple(launch(_run, _WORLD, args=(None, param_dtype, reduce_dtype), timeout=_TIMEOUT_S))


def _name(dtype) -> str:
    return str(dtype).replace("torch.", "") if dtype is not None else "None"


def _policy_text(param_dtype, reduce_dtype) -> str:
    return f"MixedPrecision(param_dtype={_name(param_dtype)}, reduce_dtype={_name(reduce_dtype)})"


def _judge(fn) -> Verdict:
    first = fn(torch.float32, MixedPrecision(BF16, FP32))  # a stub raises NotImplementedError here: "not yet"
    if not (isinstance(first, (tuple, list)) and len(first) == 2 and all(isinstance(d, torch.dtype) for d in first)):
        return Verdict.wrong(tr(f"return two torch.dtypes (compute, reduce), got {first!r}",
                                f"верните два torch.dtype (вычисления, редукция), получено {first!r}"))
    for param_dtype, reduce_dtype in POLICIES:
        policy = _policy_text(param_dtype, reduce_dtype)
        truth = library_run(param_dtype, reduce_dtype)
        for rank, (res, want) in enumerate(zip(launch(_run, _WORLD, args=(fn, param_dtype, reduce_dtype),
                                                      timeout=_TIMEOUT_S), truth)):
            where = tr(f"under {policy}, rank {rank}", f"при {policy}, ранг {rank}")
            got_lookup = res["lookup"]
            if got_lookup.dtype != want["lookup"].dtype or not torch.equal(got_lookup.double(), want["lookup"].double()):
                return Verdict.wrong(tr(
                    f"{where}: the int64 parameter `lookup` was gathered as {_name(got_lookup.dtype)}: its value "
                    f"{num(int(want['lookup'][0]))} came back as {num(int(got_lookup[0].double()))}",
                    f"{where}: int64-параметр `lookup` собран как {_name(got_lookup.dtype)}: его значение "
                    f"{num(int(want['lookup'][0]))} вернулось как {num(int(got_lookup[0].double()))}"))
            if res["weight"] != want["weight"]:
                return Verdict.wrong(tr(f"{where}: the float32 weights were gathered and computed in "
                                        f"{res['weight'].replace('torch.', '')}",
                                        f"{where}: веса float32 собраны и вычислялись в "
                                        f"{res['weight'].replace('torch.', '')}"))
            if res["error"]:
                return Verdict.wrong(tr(f"{where}: the training step failed: {res['error']}",
                                        f"{where}: шаг обучения упал: {res['error']}"))
            mine, theirs = {(o, lab): b for o, lab, b in res["collectives"]}, {(o, lab): b for o, lab, b in want["collectives"]}
            for key in sorted(theirs):
                if mine.get(key) != theirs[key]:
                    op = {"all_gather": "AllGather", "reduce_scatter": "ReduceScatter"}.get(key[0], key[0])
                    return Verdict.wrong(tr(
                        f"{where}: the {op} of '{key[1]}' moved {num(mine.get(key, 0))} B, where the policy's "
                        f"fields ask for {num(theirs[key])} B: it travelled in the wrong dtype",
                        f"{where}: {op} для '{key[1]}' передал {num(mine.get(key, 0))} Б, а поля политики "
                        f"требуют {num(theirs[key])} Б: данные шли не в том типе"))
            if abs(res["loss"] - want["loss"]) > 1e-6 * abs(want["loss"]):
                return Verdict.wrong(tr(f"{where}: the loss {res['loss']:.6g} differs from the library's {want['loss']:.6g}",
                                        f"{where}: лосс {res['loss']:.6g} отличается от библиотечного {want['loss']:.6g}"))
    for param_dtype, reduce_dtype in _GRID_POLICIES:
        policy = MixedPrecision(param_dtype, reduce_dtype)
        for dtype in _GRID_DTYPES:
            want = (policy.compute_dtype(dtype), policy.gradient_reduce_dtype(dtype))
            got = tuple(fn(dtype, policy))
            if got != want:
                return Verdict.wrong(tr(
                    f"a {_name(dtype)} parameter under {_policy_text(param_dtype, reduce_dtype)}: your policy "
                    f"computes in {_name(got[0])} and reduces in {_name(got[1])}, not what the policy's fields and "
                    f"MixedPrecision's docstring ask for",
                    f"параметр {_name(dtype)} при {_policy_text(param_dtype, reduce_dtype)}: ваша политика "
                    f"вычисляет в {_name(got[0])} и редуцирует в {_name(got[1])}, а не так, как требуют поля "
                    f"политики и docstring MixedPrecision"))
    return Verdict.right(tr("Plugged into FSDP, your policy gathers bf16 (half the bytes), reduces as asked and "
                            "leaves integer parameters exact; every other case agrees too.",
                            "Подключённая к FSDP, ваша политика собирает в bf16 (вдвое меньше байт), редуцирует "
                            "как просили и не трогает целочисленные параметры; остальные случаи тоже сходятся."))


CAST_POLICY = CodeExercise("06.policy_dtypes", _judge, policy_dtypes,
                           (_cast_everything, _reduce_in_compute_dtype, _reduce_falls_back_to_own_dtype))
