"""Every layout for one model, one cluster and one global batch, ranked by tokens/s per GPU, with why the
others lose.

The global batch (sequences per step) is the one the given layout trains: local batch x data-parallel ranks.
Each candidate spreads it its own way: HSDP replicas over whole nodes, TP of 1, 2, 4 or 8 inside a node
(with and without SP), CP of 1, 2, 4 or 8, every checkpointing mode; the local batch follows from the
data-parallel ranks left (a candidate that cannot split the batch evenly is skipped), and every number of
micro-batches that divides it (gradient accumulation: fewer sequences in flight, more FSDP collectives per
step; the given layout's micro-batches are only its starting point); float8 and compile stay as given.

Ranked by the memory verdict first (`memory.MemoryBreakdown.fit_verdict`): the layouts that fit even with the
planner's largest memory error, fastest first, then the undecided ones, which a measurement must confirm; the
layouts that do not fit get no rank. Why a candidate loses: it does not fit (short by how much, or inside the
memory error of the capacity), it is undecided, or, against the winner, the largest of its extra seconds:
exposed communication (which collectives), recomputation, or smaller matrix products on each GPU.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import product

from fsdp_mini.course.planner import Plan, plan
from fsdp_mini.course.planner.calibration import CALIBRATION, Calibration
from fsdp_mini.course.planner.hardware import GPU, GiB
from fsdp_mini.course.planner.layout import Checkpointing, Layout
from fsdp_mini.course.planner.models import ModelSpec

__all__ = ["Candidate", "candidates", "compare", "describe"]


@dataclass(frozen=True)
class Candidate:
    """A ranked layout: its plan, its rank among those that fit (None: it does not fit), why it loses."""

    plan: Plan
    rank: int | None
    why: str


def describe(layout: Layout) -> str:
    """A layout in one short line: degrees, batch and checkpointing."""
    parts = [f"FSDP {layout.dp_shard}"]
    if layout.dp_replicate > 1:
        parts.insert(0, f"HSDP {layout.dp_replicate}x")
    if layout.tp > 1:
        sp = ("+SP (Megatron)" if layout.sp_variant == "megatron" else "+SP") if layout.sp else ""
        parts.append(f"TP {layout.tp}{sp}{' overlapped' if layout.tp_overlap else ''}")
    if layout.cp > 1:
        parts.append(f"CP {layout.cp}")
    micro = f" in {layout.micro_batches} micro-batches" if layout.micro_batches > 1 else ""
    micro += " (sync the last)" if layout.no_sync else ""
    return " ".join(parts) + f", batch {layout.local_batch}{micro}, AC {layout.ac.value}"


def candidates(model: ModelSpec, layout: Layout) -> list[Layout]:
    """Every well-formed layout of the same GPUs and global batch (see the module's docstring)."""
    sequences = layout.local_batch * layout.dp
    nodes = max(1, layout.gpus // layout.gpus_per_node)
    out = []
    for replicate in [r for r in range(1, nodes + 1) if nodes % r == 0]:
        for tp in (1, 2, 4, 8):
            for sp in ((False, True) if tp > 1 else (False,)):
                for cp in (1, 2, 4, 8):
                    for ac in Checkpointing:
                        if layout.gpus % (replicate * tp * cp) or tp > layout.gpus_per_node:
                            continue
                        dp = layout.gpus // (tp * cp)
                        if sequences % dp:
                            continue
                        local = sequences // dp
                        for micro_batches in (m for m in range(1, local + 1) if local % m == 0):
                            for no_sync, overlap in product((False, True) if micro_batches > 1 else (False,),
                                                            (False, True) if tp > 1 else (False,)):
                                try:
                                    c = replace(layout, dp_replicate=replicate, tp=tp, sp=sp, cp=cp, ac=ac,
                                                local_batch=local, micro_batches=micro_batches, no_sync=no_sync,
                                                tp_overlap=overlap)
                                    model.check_tp(tp)
                                except ValueError:
                                    continue
                                out.append(c)
    return out


def _why(loser: Plan, winner: Plan) -> str:
    if not loser.memory.fits:
        return f"short by {loser.memory.short_by / GiB:.1f} GiB"
    if loser.memory.fit_verdict == "does not fit":
        return "over capacity within the memory error"
    if loser.memory.fit_verdict == "undecided":
        return "undecided: measure its memory first"
    if loser.time.tokens_per_s_per_gpu >= 0.995 * winner.time.tokens_per_s_per_gpu:
        return "as fast as the first (within 0.5 %)"
    extra = {k: loser.time.parts[k] - winner.time.parts.get(k, 0.0) for k in loser.time.parts}
    name, seconds = max(extra.items(), key=lambda kv: kv[1])
    share = seconds / loser.time.step_s * 100
    if "exposed" in name:
        return f"communication exposed: {name.replace(' (exposed)', '')} +{share:.0f} % of its step"
    return f"{name} +{share:.0f} % of its step"


def compare(model: ModelSpec, gpu: GPU, layout: Layout, calibration: Calibration = CALIBRATION) -> list[Candidate]:
    """Every candidate layout planned: those that fit first, fastest first, then those that do not."""
    layout.check(model, gpu)
    plans = []
    for c in candidates(model, layout):
        try:
            plans.append(plan(model, gpu, c, calibration))
        except ValueError:
            continue
    surely = {"fits": 0, "undecided": 1}
    fitting = sorted((p for p in plans if p.memory.fit_verdict in surely),
                     key=lambda p: (surely[p.memory.fit_verdict], -p.time.tokens_per_s_per_gpu))
    short = sorted((p for p in plans if p.memory.fit_verdict not in surely),
                   key=lambda p: (p.memory.short_by, p.memory.likely_peak[0]))
    out = [Candidate(p, i + 1, "fastest" if i == 0 else _why(p, fitting[0])) for i, p in enumerate(fitting)]
    return out + [Candidate(p, None, _why(p, fitting[0] if fitting else p)) for p in short]
