"""Timelines of an FSDP step: per rank, the compute (from `fsdp_mini.course.trace.Trace`) above the collectives
(from `CommLog`), and the gathered-parameter memory event by event; and the strategy trade-off bars.

A collective's bar runs from its issue to the moment the engine waited for it (`CommRecord.start` to
`.end`): for an async op that is "in flight, or done and not yet waited for", which is what decides
whether a unit has to stall. Collectives in flight at the same time are drawn on separate lanes.
Timeline plots show measured times, so a lesson's cell that draws one starts with `# NBVAL_IGNORE_OUTPUT`;
`plot_gathered_memory` and `plot_tradeoff` use no times and are deterministic.
"""
from __future__ import annotations

from fsdp_mini.course.language import tr
from fsdp_mini.plan import unit_of_label
from fsdp_mini.course.viz import figure

__all__ = ["OP_COLORS", "KIND_COLORS", "short_label", "comm_lanes", "plot_timeline", "plot_timelines",
           "plot_gathered_memory", "plot_tradeoff"]

OP_COLORS = {"all_gather": "#4C72B0", "reduce_scatter": "#DD8452", "all_reduce": "#8172B3"}
KIND_COLORS = {"forward": "#55A868", "backward": "#C44E52"}
_SERIES_COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3")


def _op_name(op: str) -> str:
    return {"all_gather": "AllGather", "reduce_scatter": "ReduceScatter", "all_reduce": "AllReduce"}.get(op, op)


def _kind_name(kind: str) -> str:
    return {"forward": tr("forward", "прямой проход"), "backward": tr("backward", "обратный проход")}.get(kind, kind)


def short_label(label: str) -> str:
    """"blocks.3" -> "b3", "root" -> "root": what fits inside a bar."""
    label = unit_of_label(label)
    head, _, tail = label.rpartition(".")
    return f"{head[0]}{tail}" if head and tail.isdigit() else label


def comm_lanes(records) -> list[int]:
    """A lane for each record (in the given order) such that records sharing a lane never overlap in
    time: the first lane free at the record's issue."""
    order = sorted(range(len(records)), key=lambda i: records[i].start)
    lane_end: list[float] = []
    lanes = [0] * len(records)
    for i in order:
        r = records[i]
        lane = next((k for k, end in enumerate(lane_end) if end <= r.start), len(lane_end))
        if lane == len(lane_end):
            lane_end.append(r.end)
        else:
            lane_end[lane] = r.end
        lanes[i] = lane
    return lanes


def _draw(ax, records, spans, t0: float, text_min: float) -> list[tuple[float, str]]:
    """Draw one panel; return the y ticks (position, label)."""
    ranks = sorted({r.rank for r in records} | {s.rank for s in spans})
    ticks, y = [], 0.0
    for rank in reversed(ranks):  # rank 0 on top
        mine = [r for r in records if r.rank == rank]
        lanes = comm_lanes(mine)
        n_lanes = max(lanes, default=-1) + 1
        for r, lane in zip(mine, lanes):
            yy = y + (n_lanes - 1 - lane) * 0.5
            x0, w = (r.start - t0) * 1e3, max((r.end - r.start) * 1e3, 1e-3)
            ax.barh(yy, w, left=x0, height=0.42, color=OP_COLORS.get(r.op, "#8C8C8C"), edgecolor="white",
                    linewidth=0.5)
            if w >= text_min:
                ax.text(x0 + w / 2, yy, short_label(r.label), ha="center", va="center", fontsize=6, color="white")
        if n_lanes:
            ticks.append((y + (n_lanes - 1) * 0.25, tr(f"rank {rank}: comm", f"ранг {rank}: связь")))
        y += max(n_lanes, 1) * 0.5 + 0.2
        for s in (s for s in spans if s.rank == rank):
            x0, w = (s.start - t0) * 1e3, max((s.end - s.start) * 1e3, 1e-3)
            ax.barh(y, w, left=x0, height=0.6, color=KIND_COLORS.get(s.kind, "#8C8C8C"), edgecolor="white",
                    linewidth=0.5)
            if w >= text_min:
                ax.text(x0 + w / 2, y, short_label(s.label), ha="center", va="center", fontsize=6, color="white")
        ticks.append((y, tr(f"rank {rank}: compute", f"ранг {rank}: счёт")))
        y += 1.0
    return ticks


def _legend(ax, ops, kinds) -> None:
    from matplotlib.patches import Patch

    handles = [Patch(color=KIND_COLORS[k], label=_kind_name(k)) for k in KIND_COLORS if k in kinds]
    handles += [Patch(color=OP_COLORS[o], label=_op_name(o)) for o in OP_COLORS if o in ops]
    ax.legend(handles=handles, fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def plot_timelines(panels: dict, title: str | None = None, width: float = 9.0):
    """`panels[name] = (records, spans)`: one panel per name, stacked, on a shared time axis in ms, each
    panel starting at its own first event. Records and spans of every rank go together in one list."""
    names = list(panels)
    heights = []
    for name in names:
        records, spans = panels[name]
        ranks = {r.rank for r in records} | {s.rank for s in spans}
        heights.append(max(1, len(ranks)) * 1.1 + 0.6)
    fig, axes = figure(width=width, height=sum(heights) + 0.6, nrows=len(names), sharex=True,
                       gridspec_kw={"height_ratios": heights})
    axes = [axes] if len(names) == 1 else list(axes)
    longest = max((max([r.end for r in rec] + [s.end for s in sp]) - min([r.start for r in rec] + [s.start for s in sp]))
                  * 1e3 for rec, sp in panels.values() if rec or sp) if any(r or s for r, s in panels.values()) else 1.0
    ops, kinds = set(), set()
    for ax, name in zip(axes, names):
        records, spans = panels[name]
        ops |= {r.op for r in records}
        kinds |= {s.kind for s in spans}
        starts = [r.start for r in records] + [s.start for s in spans]
        ticks = _draw(ax, records, spans, min(starts) if starts else 0.0, text_min=longest / 40)
        ax.set_yticks([p for p, _ in ticks], [t for _, t in ticks], fontsize=7)
        ax.set_title(name, fontsize=9, loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[-1].set_xlabel(tr("time since the step's first event, ms", "время от первого события шага, мс"))
    _legend(axes[0], ops, kinds)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_timeline(records, spans=(), title: str | None = None, width: float = 9.0):
    """One step's timeline: per rank, a compute lane (forward / backward of each unit) and lanes of
    collectives (AllGather / ReduceScatter of each unit), in ms from the step's first event."""
    return plot_timelines({title or "": (list(records), list(spans))}, width=width)


def plot_gathered_memory(series: dict, unit: float = 1e3, unit_name: str = "kB", title: str | None = None,
                         marks: dict[str, float] | None = None):
    """`series[name]` = one rank's `Trace.memory` events: gathered-parameter bytes after each alloc and
    free, against the event's number (not its time, so the picture is the same in every run).
    `marks[text] = bytes` draws horizontal reference lines (e.g. "root + 1 block")."""
    from matplotlib.ticker import MaxNLocator

    fig, ax = figure(width=7.5, height=3.4)
    top, longest = 0.0, 1
    for i, (name, events) in enumerate(series.items()):
        color = _SERIES_COLORS[i % len(_SERIES_COLORS)]
        ys = [0.0] + [e.current / unit for e in events]
        ax.step(range(len(ys)), ys, where="post", color=color, label=name, linewidth=1.6)
        peak = max(ys)
        ax.annotate(f"{peak:.4g}", (ys.index(peak), peak), textcoords="offset points", xytext=(-3, 3),
                    ha="right", fontsize=8, color=color)
        top, longest = max(top, peak), max(longest, len(ys) - 1)
    for text, value in (marks or {}).items():
        ax.axhline(value / unit, color="#8C8C8C", linestyle=":", linewidth=1)
        ax.text(longest, value / unit, text, fontsize=7, color="#555555", va="bottom", ha="right")
        top = max(top, value / unit)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(tr("event number (each gather and each free)", "номер события (каждый сбор и каждое освобождение)"))
    ax.set_ylabel(tr(f"gathered parameters, {unit_name}", f"собранные параметры, {unit_name}"))
    ax.set_ylim(0, top * 1.35)
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, frameon=False, loc="upper left", ncol=min(3, len(series)))
    fig.tight_layout()
    return fig


def plot_tradeoff(memory: dict[str, float], comm: dict[str, float], calls: dict[str, int] | None = None,
                  unit: float = 1e3, unit_name: str = "kB", title: str | None = None):
    """Two bar groups side by side, one bar per setup in each: peak gathered-parameter bytes (`memory`)
    and bytes of all-gathers per step (`comm`); `calls[setup]` is written under its comm bar's value."""
    fig, (left, right) = figure(width=8.0, height=3.4, ncols=2)
    names = list(memory)
    colors = [_SERIES_COLORS[i % len(_SERIES_COLORS)] for i in range(len(names))]
    for ax, values, ylabel, heading in (
            (left, memory, tr(f"{unit_name} per rank", f"{unit_name} на ранг"),
             tr("memory: peak of gathered parameters", "память: пик собранных параметров")),
            (right, comm, tr(f"{unit_name} per step", f"{unit_name} за шаг"),
             tr("communication: AllGather bytes per step", "связь: байты AllGather за шаг"))):
        heights = [values[n] / unit for n in names]
        ax.bar(names, heights, color=colors, width=0.6)
        for x, (n, h) in enumerate(zip(names, heights)):
            text = f"{h:.4g}"
            if ax is right and calls is not None:
                text += "\n" + tr(f"{calls[n]} calls", f"вызовов: {calls[n]}")
            ax.text(x, h, text, ha="center", va="bottom", fontsize=8)
        ax.set_ylim(top=max(heights) * 1.3)
        ax.set_ylabel(ylabel)
        ax.set_title(heading, fontsize=9)
        ax.tick_params(axis="x", labelsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
