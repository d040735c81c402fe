"""The report of `python -m fsdp_mini bench`: medians and ratios per case, the results table, the
performance targets (each named by what it promises, with its measured value), and the plot.

Pure post-processing of `measure.run`'s results (or of a saved `--json` file): nothing here measures.
"""
from __future__ import annotations

import statistics

from fsdp_mini.course.bench.cases import SIZES, model_numel, parse_case
from fsdp_mini.course.train import hybrid_shard_size
from fsdp_mini.course.bench.measure import PHASES
from fsdp_mini.course.language import tr
from fsdp_mini.byte_format import format_bytes

__all__ = ["summarize", "table", "targets", "targets_text", "judge_by_size", "plot", "SMOKE_SIZES"]

# Sizes for a smoke test of the bench itself: a step of a few milliseconds is mostly fixed costs (Python,
# hooks, a collective's latency), not what the targets are about, so their targets are shown, not judged.
SMOKE_SIZES = frozenset({"tiny"})


def summarize(results: list[dict]) -> list[dict]:
    """One row per (world, size, case): medians and ratios, from the raw results of `run`."""
    rows = []
    for res in results:
        world, size = res["world_size"], res["size"]
        for key, phases in res["times"].items():
            case = parse_case(key)
            mem = res["memory"].get(key, {})
            name = case.name
            if "HYBRID" in case.strategy:
                s = hybrid_shard_size(world)
                name += f" ({world // s}x{s})"
            rows.append({"world_size": world, "size": size, "case": key, "name": name,
                         **{f"{p}_s": statistics.median(phases[p]) for p in PHASES}, "times": phases["step"],
                         **{k: v for k, v in mem.items() if k not in ("records", "units")}})
        by = {r["case"]: r for r in rows if r["world_size"] == world and r["size"] == size}
        for r in by.values():
            case = parse_case(r["case"])
            twin = by.get(case.twin) if case.twin else None
            r["vs_twin"] = r["step_s"] / twin["step_s"] if twin else None
            r["twin"] = case.twin if twin else None
            r["vs_fsdp2"] = r["step_s"] / by["fsdp2:reshard"]["step_s"] if "fsdp2:reshard" in by else None
            r["vs_ddp"] = r["step_s"] / by["ddp"]["step_s"] if "ddp" in by else None
    return rows


def _fmt(v, spec: str, missing: str = "-") -> str:
    return missing if v is None else format(v, spec)


def table(rows: list[dict]) -> str:
    """The results table: one block per (size, world size)."""
    head = (f"{'case':<34}{'step ms':>9}{'x twin':>8}{'x FSDP2':>8}{'x DDP':>7}{'sent/step':>11}"
            f"{'state/rank':>11}{'gathered':>10}{'peak alloc':>11}{'RSS peak':>10}")
    lines = []
    for key in dict.fromkeys((r["size"], r["world_size"]) for r in rows):
        block = [r for r in rows if (r["size"], r["world_size"]) == key]
        numel = model_numel(key[0])
        lines += ["", f"{key[0]} GPT ({numel:,} parameters), world size {key[1]}, global batch "
                  f"{SIZES[key[0]][1]}, median of {len(block[0]['times'])} steps", head, "-" * len(head)]
        for r in block:
            b = lambda k: format_bytes(r[k]) if r.get(k) is not None else "-"  # noqa: E731
            lines.append(f"{r['name']:<34}{r['step_s'] * 1e3:>9.1f}{_fmt(r['vs_twin'], '.2f'):>8}"
                         f"{_fmt(r['vs_fsdp2'], '.2f'):>8}{_fmt(r['vs_ddp'], '.2f'):>7}{b('sent'):>11}"
                         f"{b('model_state'):>11}{b('unsharded_peak'):>10}{b('peak_alloc'):>11}{b('rss_peak'):>10}")
    lines += ["", "x twin: step time / the PyTorch peer's (NO_SHARD: DDP; SHARD_GRAD_OP: FSDP2 reshard=False; "
              "the others: FSDP2 reshard=True)",
              "sent/step: bytes one rank sends per step (ring model); state/rank: parameters + gradients + "
              "optimizer state kept per rank;",
              "gathered: fsdp_mini's peak of unsharded parameters; peak alloc: profiled peak of allocated bytes "
              "in a step; RSS peak: growth of the process's peak RSS"]
    return "\n".join(lines[1:])


def targets(rows: list[dict], results: list[dict]) -> list[dict]:
    """The performance targets fsdp_mini holds itself to, each with the measured value, the limit and
    whether it is met: step time against PyTorch's FSDP2 and DDP, state per rank against DDP's / N,
    gathered memory against two units, and prefetch against none."""
    out = []
    units = {(res["world_size"], res["size"], k): m.get("units", []) for res in results for k, m in res["memory"].items()}

    def get(world, size, key):
        return next((r for r in rows if r["world_size"] == world and r["size"] == size and r["case"] == key), None)

    for world, size in dict.fromkeys((r["world_size"], r["size"]) for r in rows):
        full, fsdp2 = get(world, size, "mini:FULL_SHARD"), get(world, size, "fsdp2:reshard")
        no_shard, ddp = get(world, size, "mini:NO_SHARD"), get(world, size, "ddp")
        off, compute = get(world, size, "mini:FULL_SHARD:noprefetch"), get(world, size, "compute")
        per_param = get(world, size, "fully_shard:reshard")
        unrecorded = get(world, size, "mini:FULL_SHARD:norecord")
        where = f"{size}, world {world}"
        first = len(out)
        if full and fsdp2 and world == 2:
            v = full["step_s"] / fsdp2["step_s"]
            out.append(dict(target="FULL_SHARD step <= 0.9x FSDP2 (world 2)", where=where, value=v, limit=0.9, met=v <= 0.9))
        if per_param and fsdp2:
            v = per_param["step_s"] / fsdp2["step_s"]
            out.append(dict(target="fully_shard step <= FSDP2's", where=where, value=v, limit=1.0, met=v <= 1.0))
        if per_param and full:
            v = per_param["step_s"] / full["step_s"]
            out.append(dict(target="fully_shard step <= 1.15x flat FULL_SHARD", where=where, value=v, limit=1.15,
                            met=v <= 1.15))
        if full and unrecorded:
            v = full["step_s"] / unrecorded["step_s"]
            out.append(dict(target="flight recorder costs <= 3% of a FULL_SHARD step", where=where, value=v,
                            limit=1.03, met=v <= 1.03))
        if no_shard and ddp:
            v = no_shard["step_s"] / ddp["step_s"]
            out.append(dict(target="NO_SHARD step <= 1.1x DDP", where=where, value=v, limit=1.1, met=v <= 1.1))
        if full and no_shard and full.get("model_state") and no_shard.get("model_state"):
            v = full["model_state"] * world / no_shard["model_state"] - 1
            out.append(dict(target="FULL_SHARD state/rank <= NO_SHARD's / N + 1%", where=where, value=v,
                            limit=0.01, met=v <= 0.01))
        u = sorted(units.get((world, size, "mini:FULL_SHARD"), []), reverse=True)
        if full and full.get("unsharded_peak") is not None and len(u) >= 2:
            v = full["unsharded_peak"] / (u[0] + u[1])
            out.append(dict(target="FULL_SHARD gathered peak <= two largest units", where=where, value=v,
                            limit=1.0, met=v <= 1.0))
        if full and off:
            share = 1 - compute["step_s"] / off["step_s"] if compute else None
            v = full["step_s"] / off["step_s"]
            out.append(dict(target="prefetch on faster than off", where=where, value=v, limit=1.0, met=v < 1.0,
                            comm_share=share))
        for item in out[first:]:
            item["size"] = size
    return out


def judge_by_size(items: list[dict]) -> tuple[list[dict], str]:
    """The targets with `judged` set (False at a smoke-test size, `SMOKE_SIZES`), and the note that says
    why, when some are not judged ("" otherwise)."""
    judged = [dict(t, judged=t.get("size", t["where"].split(",")[0]) not in SMOKE_SIZES) for t in items]
    smoke = sorted({t["where"].split(",")[0] for t in judged if not t["judged"]})
    note = (f"{', '.join(smoke)}: a smoke-test size, too small for these targets to mean anything (a step of "
            "a few ms is mostly fixed costs); values shown, not judged (n/a)") if smoke else ""
    return judged, note


def targets_text(items: list[dict]) -> str:
    """One line per target: met, MISSED, or n/a when it is not judged (`judge_by_size`)."""
    lines = []
    for t in items:
        value = f"{100 * t['value']:+.2f}%" if t["limit"] == 0.01 else f"{t['value']:.2f}x"
        limit = "1%" if t["limit"] == 0.01 else f"{t['limit']:g}x"
        extra = f" (communication ~{100 * t['comm_share']:.0f}% of a step without prefetch)" \
            if t.get("comm_share") is not None else ""
        verdict = "n/a   " if not t.get("judged", True) else "met   " if t["met"] else "MISSED"
        lines.append(f"{verdict} {t['target']:<46} {t['where']:<18} {value:>8} "
                     f"(limit {limit}){extra}")
    return "\n".join(lines)


def plot(rows: list[dict], path: str) -> None:
    """A PNG, one row of panels per (size, world size), one bar per case: step time split into forward,
    backward and optimizer step (left); per-rank peak allocated bytes in a step, with the model state
    kept between steps drawn inside it (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys((r["size"], r["world_size"]) for r in rows))
    fig, axes = plt.subplots(len(groups), 2, figsize=(12, 1.2 + 0.33 * len(set(r["case"] for r in rows)) * len(groups) + 0.8 * len(groups)),
                             squeeze=False)
    phases = (("forward_s", "forward", "#4C72B0"), ("backward_s", "backward", "#DD8452"),
              ("optimizer_s", tr("optimizer step", "шаг оптимизатора"), "#55A868"))
    for g, (size, world) in enumerate(groups):
        block = [r for r in rows if (r["size"], r["world_size"]) == (size, world)]
        ys = range(len(block))
        ax = axes[g][0]
        left = [0.0] * len(block)
        for field, label, color in phases:
            width = [r.get(field, 0.0) * 1e3 for r in block]
            ax.barh(ys, width, left=left, color=color, label=label if g == 0 else None)
            left = [a + b for a, b in zip(left, width)]
        ax.scatter([r["step_s"] * 1e3 for r in block], ys, marker="|", color="black", s=200, zorder=3,
                   label=tr("step (median)", "шаг (медиана)") if g == 0 else None)
        ax.set_yticks(ys, [r["name"] for r in block], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(tr("ms per step (medians)", "мс на шаг (медианы)"))
        ax.set_title(tr(f"{size} GPT, {world} ranks: step time", f"GPT {size}, рангов: {world}; время шага"), fontsize=9)
        ax = axes[g][1]
        ax.barh(ys, [(r.get("peak_alloc") or 0) / 1e6 for r in block], color="#C9D5E8",
                label=tr("peak allocated in a step", "пик выделенной памяти за шаг") if g == 0 else None)
        ax.barh(ys, [(r.get("model_state") or 0) / 1e6 for r in block], height=0.4, color="#4C72B0",
                label=tr("params + grads + optimizer state", "параметры + градиенты + состояние оптимизатора") if g == 0 else None)
        ax.set_yticks(ys, [r["name"] for r in block], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(tr("MB per rank", "МБ на ранг"))
        ax.set_title(tr(f"{size} GPT, {world} ranks: memory", f"GPT {size}, рангов: {world}; память"), fontsize=9)
    handles = [h for ax in axes[0] for h in ax.get_legend_handles_labels()[0]]
    fig.legend(handles, [h.get_label() for h in handles], loc="lower center", ncol=len(handles), fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0.7 / fig.get_figheight(), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
