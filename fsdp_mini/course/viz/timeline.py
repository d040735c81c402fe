"""Timelines of an FSDP step: per rank, the compute (from `fsdp_mini.course.trace.Trace`) above the collectives
(from `CommLog`), and the gathered-parameter memory event by event; and the strategy trade-off bars.

A collective's bar runs from its issue to the moment the engine waited for it (`CommRecord.start` to
`.end`): for an async op that is "in flight, or done and not yet waited for", which is what decides
whether a unit has to stall. Collectives in flight at the same time are drawn on separate lanes.
Timeline plots show measured times, so a lesson's cell that draws one starts with `# NBVAL_IGNORE_OUTPUT`;
`plot_gathered_memory` and `plot_tradeoff` use no times and are deterministic, and so is `plot_ideal_step`:
an idealised schedule computed from durations, to read the measured timelines against.
"""
from __future__ import annotations

from dataclasses import dataclass

from fsdp_mini.course.language import get_language, tr
from fsdp_mini.course.trace import unit_of_label
from fsdp_mini.course.viz import figure
from fsdp_mini.course.viz.style import SMALL, TEXT, TITLE

__all__ = ["OP_COLORS", "KIND_COLORS", "short_label", "comm_lanes", "plot_timeline", "plot_timelines",
           "plot_gathered_memory", "plot_tradeoff", "IdealEvent", "ideal_step", "plot_ideal_step"]

OP_COLORS = {"all_gather": "#4C72B0", "reduce_scatter": "#DD8452", "all_reduce": "#8172B3"}
KIND_COLORS = {"forward": "#55A868", "backward": "#C44E52"}
_SERIES_COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3")


def _op_name(op: str) -> str:
    return {"all_gather": "AllGather", "reduce_scatter": "ReduceScatter", "all_reduce": "AllReduce"}.get(op, op)


def _kind_name(kind: str) -> str:
    return kind  # forward and backward: Latin in both languages (lessons/ru/STYLE.md)


def _g(x: float, digits: int = 6) -> str:
    """`x` with `digits` significant digits, a decimal comma in Russian."""
    text = f"{x:.{digits}g}"
    return text.replace(".", ",") if get_language() == "ru" else text


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
                ax.text(x0 + w / 2, yy, short_label(r.label), ha="center", va="center", fontsize=SMALL, color="white")
        if n_lanes:
            ticks.append((y + (n_lanes - 1) * 0.25, tr(f"rank {rank}: comm", f"ранг {rank}: обмен данными")))
        y += max(n_lanes, 1) * 0.5 + 0.2
        for s in (s for s in spans if s.rank == rank):
            x0, w = (s.start - t0) * 1e3, max((s.end - s.start) * 1e3, 1e-3)
            ax.barh(y, w, left=x0, height=0.6, color=KIND_COLORS.get(s.kind, "#8C8C8C"), edgecolor="white",
                    linewidth=0.5)
            if w >= text_min:
                ax.text(x0 + w / 2, y, short_label(s.label), ha="center", va="center", fontsize=SMALL, color="white")
        ticks.append((y, tr(f"rank {rank}: compute", f"ранг {rank}: вычисления")))
        y += 1.0
    return ticks


def _legend(ax, ops, kinds) -> None:
    from matplotlib.patches import Patch

    handles = [Patch(color=KIND_COLORS[k], label=_kind_name(k)) for k in KIND_COLORS if k in kinds]
    handles += [Patch(color=OP_COLORS[o], label=_op_name(o)) for o in OP_COLORS if o in ops]
    ax.legend(handles=handles, fontsize=SMALL, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))


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
        ax.set_yticks([p for p, _ in ticks], [t for _, t in ticks], fontsize=SMALL)
        ax.set_title(name, fontsize=TEXT, loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[-1].set_xlabel(tr("time since the step's first event, ms", "время от первого события шага, мс"))
    _legend(axes[0], ops, kinds)
    if title:
        fig.suptitle(title, fontsize=TITLE)
    fig.tight_layout()
    return fig


def plot_timeline(records, spans=(), title: str | None = None, width: float = 9.0):
    """One step's timeline: per rank, a compute lane (forward / backward of each unit) and lanes of
    collectives (AllGather / ReduceScatter of each unit), in ms from the step's first event."""
    return plot_timelines({title or "": (list(records), list(spans))}, width=width)


def plot_gathered_memory(series: dict, unit: float = 1e3, unit_name: str | None = None, title: str | None = None,
                         marks: dict[str, float] | None = None):
    """`series[name]` = one rank's `Trace.memory` events: gathered-parameter bytes after each alloc and
    free, against the event's number (not its time, so the picture is the same in every run).
    `marks[text] = bytes` draws horizontal reference lines (e.g. "root + 1 block")."""
    from matplotlib.ticker import MaxNLocator

    unit_name = unit_name or tr("kB", "кБ")
    fig, ax = figure(width=7.5, height=3.4)
    top, longest = 0.0, 1
    for i, (name, events) in enumerate(series.items()):
        color = _SERIES_COLORS[i % len(_SERIES_COLORS)]
        ys = [0.0] + [e.current / unit for e in events]
        ax.step(range(len(ys)), ys, where="post", color=color, label=name, linewidth=1.6)
        peak = max(ys)
        ax.annotate(_g(peak, 4), (ys.index(peak), peak), textcoords="offset points", xytext=(-3, 3),
                    ha="right", fontsize=SMALL, color=color)
        top, longest = max(top, peak), max(longest, len(ys) - 1)
    for text, value in (marks or {}).items():
        ax.axhline(value / unit, color="#8C8C8C", linestyle=":", linewidth=1)
        ax.text(longest, value / unit, text, fontsize=SMALL, color="#555555", va="bottom", ha="right")
        top = max(top, value / unit)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(tr("event number (each gather and each free)", "номер события (каждый сбор и каждое освобождение)"))
    ax.set_ylabel(tr(f"gathered parameters, {unit_name}", f"собранные параметры, {unit_name}"))
    ax.set_ylim(0, top * 1.35)
    if title:
        ax.set_title(title, fontsize=TITLE)
    ax.legend(fontsize=SMALL, frameon=False, loc="upper left", ncol=min(3, len(series)))
    fig.tight_layout()
    return fig


def plot_tradeoff(memory: dict[str, float], comm: dict[str, float], calls: dict[str, int] | None = None,
                  unit: float = 1e3, unit_name: str | None = None, title: str | None = None):
    """Two bar groups side by side, one bar per setup in each: peak gathered-parameter bytes (`memory`)
    and bytes of all-gathers per step (`comm`); `calls[setup]` is written under its comm bar's value."""
    unit_name = unit_name or tr("kB", "кБ")
    fig, (left, right) = figure(width=8.0, height=3.4, ncols=2)
    names = list(memory)
    colors = [_SERIES_COLORS[i % len(_SERIES_COLORS)] for i in range(len(names))]
    for ax, values, ylabel, heading in (
            (left, memory, tr(f"{unit_name} per rank", f"{unit_name} на ранг"),
             tr("memory: peak of gathered parameters", "память: пик собранных параметров")),
            (right, comm, tr(f"{unit_name} per step", f"{unit_name} за шаг"),
             tr("communication: AllGather bytes per step", "обмен данными: байты AllGather за шаг"))):
        heights = [values[n] / unit for n in names]
        ax.bar(names, heights, color=colors, width=0.6)
        for x, (n, h) in enumerate(zip(names, heights)):
            text = _g(h, 4)
            if ax is right and calls is not None:
                text += "\n" + tr(f"{calls[n]} calls", f"вызовов: {calls[n]}")
            ax.text(x, h, text, ha="center", va="bottom", fontsize=SMALL)
        ax.set_ylim(top=max(heights) * 1.3)
        ax.set_ylabel(ylabel)
        ax.set_title(heading, fontsize=TEXT)
        ax.tick_params(axis="x", labelsize=8)
    if title:
        fig.suptitle(title, fontsize=TITLE)
    fig.tight_layout()
    return fig


# --- an idealised step: computed from durations, not measured ----------------------------------------


@dataclass(frozen=True)
class IdealEvent:
    """One bar of `ideal_step`: `lane` "comm" or "compute", `what` an op ("all_gather", "reduce_scatter") or a
    kind ("forward", "backward"), the unit's index, and start/end in time units."""

    lane: str
    what: str
    unit: int
    start: float
    end: float


def ideal_step(prefetch: bool, units: int = 2, gather: float = 1.0, forward: float = 1.0, backward: float = 2.0,
               reduce: float = 1.0) -> list[IdealEvent]:
    """The schedule of one FULL_SHARD step of `units` units on an idealised rank with two lanes that run at
    the same time, one for collectives and one for compute, each doing one thing at a time (as a GPU's
    communication and compute streams do). A unit's hook issues its own AllGather when the unit is reached
    (after the previous unit's compute); with `prefetch` it also issues the next unit's. A unit computes
    once its AllGather has arrived; after its backward its ReduceScatter is issued. Durations in the same
    arbitrary unit; every unit is gathered in forward and again in backward."""
    events: list[IdealEvent] = []
    comm_free, clock = 0.0, 0.0

    def collective(op, unit, issued, duration):
        nonlocal comm_free
        start = max(issued, comm_free)
        comm_free = start + duration
        events.append(IdealEvent("comm", op, unit, start, comm_free))
        return comm_free

    for kind, order, duration in (("forward", list(range(units)), forward),
                                  ("backward", list(reversed(range(units))), backward)):
        arrived: dict[int, float] = {}
        for k, unit in enumerate(order):
            if unit not in arrived:
                arrived[unit] = collective("all_gather", unit, clock, gather)
            if prefetch and k + 1 < len(order):
                arrived[order[k + 1]] = collective("all_gather", order[k + 1], clock, gather)
            start = max(clock, arrived[unit])
            clock = start + duration
            events.append(IdealEvent("compute", kind, unit, start, clock))
            if kind == "backward":
                collective("reduce_scatter", unit, clock, reduce)
    return events


def plot_ideal_step(prefetch_off_and_on=(False, True), units: int = 2, gather: float = 1.0, forward: float = 1.0,
                    backward: float = 2.0, reduce: float = 1.0, title: str | None = None):
    """One panel per value of `prefetch_off_and_on`: `ideal_step`'s schedule on two lanes (collectives
    below, compute above), the compute lane's waits hatched, the step's end marked. Deterministic."""
    from matplotlib.patches import Patch

    schedules = [ideal_step(p, units, gather, forward, backward, reduce) for p in prefetch_off_and_on]
    longest = max(e.end for events in schedules for e in events)
    fig, axes = figure(width=9.0, height=1.25 * len(schedules) + 1.1, nrows=len(schedules), sharex=True)
    axes = [axes] if len(schedules) == 1 else list(axes)
    lanes = {"comm": 0.0, "compute": 1.0}
    for ax, prefetch, events in zip(axes, prefetch_off_and_on, schedules):
        for e in events:
            color = OP_COLORS[e.what] if e.lane == "comm" else KIND_COLORS[e.what]
            ax.barh(lanes[e.lane], e.end - e.start, left=e.start, height=0.6, color=color, edgecolor="white",
                    linewidth=0.8)
            ax.text((e.start + e.end) / 2, lanes[e.lane], tr(f"unit {e.unit}", f"юнит {e.unit}"), ha="center",
                    va="center", fontsize=SMALL, color="white")
        compute = sorted((e for e in events if e.lane == "compute"), key=lambda e: e.start)
        clock = 0.0
        for e in compute:  # where compute waits for a collective
            if e.start > clock:
                ax.barh(lanes["compute"], e.start - clock, left=clock, height=0.6, facecolor="none",
                        edgecolor="#8C8C8C", hatch="///", linewidth=0)
            clock = e.end
        end = max(e.end for e in events)
        ax.axvline(end, color="black", linestyle=":", linewidth=1)
        ax.set_yticks([lanes["comm"], lanes["compute"]],
                      [tr("communication", "обмен данными"), tr("compute", "вычисления")], fontsize=SMALL)
        ax.set_ylim(-0.55, 1.55)
        heading = tr("prefetch on" if prefetch else "no prefetch", "с предвыборкой" if prefetch else "без предвыборки")
        ax.set_title(tr(f"{heading}: the step takes {_g(end)}", f"{heading}: шаг длится {_g(end)}"), fontsize=TEXT,
                     loc="left")
        ax.grid(axis="x", alpha=0.3)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    axes[-1].set_xlim(0, longest * 1.02)
    axes[-1].set_xlabel(tr(f"time (one AllGather takes {_g(gather)})", f"время (один AllGather длится {_g(gather)})"))
    handles = [Patch(color=KIND_COLORS[k], label=_kind_name(k)) for k in KIND_COLORS]
    handles += [Patch(color=OP_COLORS[o], label=_op_name(o)) for o in ("all_gather", "reduce_scatter")]
    handles.append(Patch(facecolor="none", edgecolor="#8C8C8C", hatch="///", label=tr("compute waits", "вычисления ждут")))
    axes[0].legend(handles=handles, fontsize=SMALL, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    if title:
        fig.suptitle(title, fontsize=TITLE)
    fig.tight_layout()
    return fig
