"""Two observations -> the differences between them, each in words a person can act on.

Per rank, step by step ("wrap" first): both raising is agreement (unless the unsharded model runs that
step: then fsdp_mini is compared with it, see `raw_differences`) (messages may differ: PyTorch's are
often cryptic where fsdp_mini's explain); one raising is a difference; otherwise every field of the
step's event is compared: floats and tensors to a tolerance (AdamW eps=1e-3 and SGD keep fp32 runs within
1e-4; bf16 within 3e-2 of each tensor's scale: `_tol`), keys, dtypes, shapes, None-gradients, collective counts and load_state_dict's
return value exactly. The first difference per (step, field) is kept, with the first rank that shows it.
Differences listed in `known.KNOWN` are set apart with their reason, not reported as findings.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from differential import known


@dataclass(frozen=True)
class Difference:
    step: int          # the description's step index: -1 is "wrap", len(steps) "end"
    op: str
    field: str         # "raises", "losses", "state", "collectives", ...
    text: str
    rank: int = 0
    against: str = "torch"  # or "plain": the unsharded model, the reference where PyTorch raised

    @property
    def signature(self) -> tuple[str, ...]:
        """What the minimiser keeps while shrinking: the same kind of difference in the same kind of step
        (for an error: the same side raising the same exception type)."""
        raised = self.text.split(":")[0] if self.field == "raises" else ""
        return (self.op, self.field, self.against, raised)

    def __str__(self) -> str:
        vs = "" if self.against == "torch" else " [vs the unsharded model]"
        return f"step {self.step} ({self.op}) {self.field}, rank {self.rank}{vs}: {self.text}"


def _tol(bf16: bool) -> dict:
    """fp32 to 1e-4. bf16 to 3e-2, and in a tensor to 3e-2 of its largest value (`scaled`): one rounding of a
    bf16 gradient is 1/256 of the gradient's scale, not of an element that sums to little, and the unsharded
    model rounds in another order (the whole batch in one backward, where the ranks average per-rank gradients
    over ranks and micro-batches); a program found so (seed 67429934: momentum buffers one bf16 step apart where
    contributions cancel) agrees to 1e-12 in float64."""
    return dict(rtol=3e-2, atol=3e-2, scaled=True) if bf16 else dict(rtol=1e-4, atol=1e-5)


def _tensor_diff(a: torch.Tensor, b: torch.Tensor, tol: dict) -> str | None:
    if a.dtype != b.dtype:
        return f"dtype {a.dtype} vs {b.dtype}"
    if a.shape != b.shape:
        return f"shape {tuple(a.shape)} vs {tuple(b.shape)}"
    if a.dtype == torch.bool or not (a.is_floating_point() or a.is_complex()):
        return None if torch.equal(a, b) else f"values {a.flatten()[:6].tolist()} vs {b.flatten()[:6].tolist()}"
    x, y = a.double(), b.double()
    rtol, atol = tol["rtol"], tol["atol"]
    if tol.get("scaled") and y.numel():
        atol *= max(1.0, float(y.abs().nan_to_num(0, 0, 0).max()))
    if torch.allclose(x, y, rtol=rtol, atol=atol, equal_nan=True):
        return None
    err = (x - y).abs().nan_to_num(nan=float("inf")).max().item()
    return f"values differ by up to {err:.3g} (e.g. {x.flatten()[:3].tolist()} vs {y.flatten()[:3].tolist()})"


def _value_diff(a, b, tol: dict) -> str | None:
    if torch.is_tensor(a) and torch.is_tensor(b):
        return _tensor_diff(a, b, tol)
    if isinstance(a, dict) and isinstance(b, dict):
        only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
        if only_a or only_b:
            return f"keys only in fsdp_mini: {only_a[:8]}; only in torch: {only_b[:8]}"
        for k in sorted(a):
            why = _value_diff(a[k], b[k], tol)
            if why:
                return f"{k}: {why}"
        return None
    if isinstance(a, float) and isinstance(b, float):
        same = (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=tol["rtol"], abs_tol=tol["atol"])
        return None if same else f"{a:.6g} vs {b:.6g}"
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b) and \
            all(isinstance(x, float) for x in list(a) + list(b)):
        whys = [_value_diff(x, y, tol) for x, y in zip(a, b)]
        return None if not any(whys) else f"{[round(x, 6) for x in a]} vs {[round(y, 6) for y in b]}"
    return None if a == b else f"{a!r} vs {b!r}"


def _collectives_diff(a: dict, b: dict) -> str | None:
    """Every kind whose count differs (a missing kind is 0): "all_gather 5 vs 6, all_reduce 1 vs 2"."""
    parts = [f"{k} {a.get(k, 0)} vs {b.get(k, 0)}" for k in sorted(set(a) | set(b)) if a.get(k, 0) != b.get(k, 0)]
    return ", ".join(parts) or None


def _bf16_from(desc: dict) -> int:
    """The first step index from which the program computes in bf16 (past the end if never)."""
    for i, s in enumerate(desc["steps"]):
        if s["op"] == "to" and s["dtype"] == "bfloat16":
            return i
    return len(desc["steps"]) + 1


def pairwise(desc: dict, ours: list, theirs: list, name: str, since: int = -2) -> list[Difference]:
    """fsdp_mini's events against `name`'s ("torch", or "plain": the unsharded model), rank by rank, from
    step `since` on (the plain reference: from where PyTorch raised; it issues no FSDP collectives)."""
    found: dict[tuple, Difference] = {}
    bf16_from = _bf16_from(desc)
    them = "torch" if name == "torch" else "the unsharded model"
    for rank, (a_events, b_events) in enumerate(zip(ours, theirs)):
        for a, b in zip(a_events, b_events):
            k = a.get("i", 0)
            if k < since:
                continue
            op = a["op"] if a["op"] == b["op"] else f"{a['op']}|{b['op']}"
            ea, eb = a.get("error"), b.get("error")
            if ea or eb:
                if eb and not ea and name == "plain":
                    break  # the reference itself cannot run this step (e.g. DCP with unused parameters)
                if not (ea and eb):
                    text = f"fsdp_mini raised {ea}; {them} did not" if ea else f"{them} raised {eb}; fsdp_mini did not"
                    found.setdefault((k, "raises"), Difference(k, op, "raises", text, rank, name))
                break
            for field in sorted((set(a) | set(b)) - {"op", "i"}):
                if field not in a or field not in b or (field == "collectives" and name != "torch"):
                    continue
                why = (_collectives_diff(a[field], b[field]) if field == "collectives" else
                       _value_diff(a[field], b[field], _tol(k >= bf16_from)))
                if why:
                    found.setdefault((k, field), Difference(k, op, field, why, rank, name))
    return sorted(found.values(), key=lambda d: (d.step, d.field))


def raw_differences(desc: dict, obs: dict) -> list[Difference]:
    """fsdp_mini against PyTorch; where the unsharded model ran too (obs has "plain": PyTorch raised, or
    the two computed different values), also fsdp_mini against it, from the step where PyTorch raised (from
    the start if it did not): when both FSDPs raise and the plain model does not, fsdp_mini goes on where
    PyTorch cannot, or one of them computes something else, the plain model says what the result should
    have been."""
    found = pairwise(desc, obs["fsdp_mini"], obs["torch"], "torch")
    if "plain" in obs:
        torch_errors = [e["i"] for events in obs["torch"] for e in events if "error" in e and "i" in e]
        found += pairwise(desc, obs["fsdp_mini"], obs["plain"], "plain", since=min(torch_errors, default=-2))
    return found


def differences(desc: dict, obs: dict) -> tuple[list[Difference], list[tuple[Difference, str]]]:
    """(findings, [(known difference, its reason)])."""
    findings, expected = [], []
    for d in raw_differences(desc, obs):
        reason = known.reason_for(desc, d)
        if reason:
            expected.append((d, reason))
        else:
            findings.append(d)
    return findings, expected
