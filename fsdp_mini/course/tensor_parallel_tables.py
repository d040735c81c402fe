"""Lesson 12's tables: what `fsdp_mini.course.scaling`, the planner and the lesson's ranks return, as rows for
`fsdp_mini.course.show.show`, in the units the lesson reads (milliseconds, GiB, shapes, plan names).

Why a module: converting seconds to milliseconds, naming a collective or spelling a plan's name is not what a
cell teaches; the cell shows the call and the asserts, and hands these rows to `show`. The keys are the
columns' headers in `fsdp_mini.course.messages` (a key with no entry, such as "GPU", prints as it is).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from fsdp_mini.comm_log import CommRecord
from fsdp_mini.course.language import get_language
from fsdp_mini.course.planner import GiB
from fsdp_mini.course.scaling import HidingRow, MeshLayout, PlannerRow
from fsdp_mini.course.show import text

__all__ = ["OP_NAMES", "hiding_rows", "block_gather_rows", "block_cost_rows", "qkv_spans", "traffic_rows", "layout_rows",
           "plan_label", "planner_rows", "plan_on_gpus", "best_plan_rows"]

OP_NAMES = {"all_reduce": "AllReduce", "all_gather": "AllGather", "reduce_scatter": "ReduceScatter"}


def hiding_rows(rows: Iterable[HidingRow]) -> list[dict]:
    """`fsdp_scaling`'s rows: tokens a GPU gets and needs, and the times in milliseconds."""
    return [{"GPU": r.gpus, "tokens_each_gpu_gets": round(r.tokens_per_gpu),
             "tokens_to_hide_gather": r.tokens_to_hide, "unit_forward_ms": 1e3 * r.forward_s,
             "unit_all_gather_ms": 1e3 * r.gather_s, "ring_latency_ms": 1e3 * r.latency_s,
             "ring_bytes_ms": 1e3 * r.bandwidth_s, "gather_hides": r.hides}
            for r in rows]


def block_gather_rows(rows: Iterable[PlannerRow]) -> list[dict]:
    """The planner's forward of one block and FSDP's AllGather of one block, in milliseconds."""
    return [{"GPU": r.gpus, "block_forward_ms": 1e3 * r.result.time.collectives["block_forward_s"],
             "unit_all_gather_ms": 1e3 * r.result.time.collectives["fsdp_all_gather_per_block_s"]}
            for r in rows]


def block_cost_rows(rows: Iterable[PlannerRow]) -> list[dict]:
    """Why a layout wins, per block: its forward, FSDP's AllGather of the block (which must hide behind the
    previous block's forward) and TP's collectives of the block's forward (on the critical path), in ms."""
    return [{"parallel_layout": plan_label(r.plan), "GPU": r.gpus,
             "block_forward_ms": 1e3 * r.result.time.collectives["block_forward_s"],
             "unit_all_gather_ms": 1e3 * r.result.time.collectives["fsdp_all_gather_per_block_s"],
             "tp_forward_ms": 1e3 * r.result.time.collectives["tp_per_block_forward_s"]}
            for r in rows]


def qkv_spans(indices: Sequence[int], c: int, names: Sequence[str] = ("q", "k", "v")) -> str:
    """Rows of a fused [q; k; v] weight (each c rows) as the matrices' spans: "q[0:15] k[0:15] v[0:15]"."""
    spans = []
    for s, name in enumerate(names):
        mine = [i - s * c for i in indices if s * c <= i < (s + 1) * c]
        if mine:
            spans.append(f"{name}[{mine[0]}:{mine[-1] + 1}]")
    return " ".join(spans)


def traffic_rows(groups: Mapping[str, Sequence[CommRecord]]) -> list[dict]:
    """One row per group of CommLog records ({message key: records}): what they are, how many calls, the
    bytes of the tensors (S) and the bytes this rank sent."""
    rows = []
    for key, records in groups.items():
        ops = Counter(OP_NAMES[r.op] for r in records)
        rows.append({"traffic": text(key), "collective_calls": len(records),
                     "collective_counts": ", ".join(f"{n} {op}" for op, n in sorted(ops.items())),
                     "message_bytes": sum(r.nbytes for r in records),
                     "bytes_sent": sum(r.sent for r in records)})
    return rows


def layout_rows(layouts: Iterable[MeshLayout]) -> list[dict]:
    """`mesh_layout`'s answers: the mesh, the parameters a GPU holds, the bytes each link carries per step."""
    return [{"tp": m.tp, "dp": m.dp, "params_per_gpu": m.params_per_rank,
             "nvlink_per_step": m.sent_on("NVLink"), "network_per_step": m.sent_on("network")}
            for m in layouts]


def plan_label(plan: str | None) -> str:
    """A plan's name as the lesson prints it: "TP8 x FSDP" in English, "TP8 × FSDP" in Russian; a dash for
    none."""
    if plan is None:
        return "\u2014"
    return plan.replace(" x ", " \u00d7 ") if get_language() == "ru" else plan


def planner_rows(plans: Iterable[PlannerRow]) -> list[dict]:
    """The planner's verdict on plans that run: local batch, peak memory, step time, MFU, whether it fits."""
    return [{"model_name": p.model, "GPU": p.gpus, "parallel_layout": plan_label(p.plan),
             "batch": p.result.layout.local_batch, "peak_gib_per_gpu": p.result.memory.peak_reserved / GiB,
             "step_seconds": p.result.time.step_s, "MFU": p.mfu, "fits_in_memory": p.fits} for p in plans]


def plan_on_gpus(p: PlannerRow) -> str:
    """A plan on a cluster size, in a sentence: "Llama-2-7B FSDP on 4,096 GPUs"."""
    return text("plan_on_gpus", model=p.model, plan=plan_label(p.plan), gpus=p.gpus)


def best_plan_rows(best: Mapping[tuple[str, int], PlannerRow | None], models: Sequence[str]) -> list[dict]:
    """`best_plans`' answer as a table: one row per GPU count, one column per model."""
    gpus = sorted({g for _, g in best})
    return [{"cluster_gpus": g, **{m: plan_label(best[m, g].plan if best[m, g] else None) for m in models}}
            for g in gpus]
