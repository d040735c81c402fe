"""Time and bandwidth against message size: the alpha-beta model's curves and a benchmark's measurements.

`plot_times` draws predicted times as lines and measured ones as markers, on log-log axes; `plot_bandwidth`
draws the two bandwidths of nccl-tests, algbw = S / t and busbw = algbw x bus factor, from the rows of
`fsdp_mini.course.bench_collectives.worker`, one curve per implementation.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from fsdp_mini.course.language import tr
from fsdp_mini.course.viz import figure
from fsdp_mini.course.viz.style import SMALL, TITLE

__all__ = ["IMPL_COLORS", "size_label", "impl_label", "plot_times", "plot_bandwidth"]

IMPL_COLORS = {"builtin": "#4C72B0", "ring": "#DD8452", "naive": "#C44E52", "tree": "#55A868"}
_CYCLE = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C")


def size_label(nbytes: float) -> str:
    """4096 -> "4 KiB", 1048576 -> "1 MiB" (binary units, in the current language)."""
    units = ((2**30, tr("GiB", "ГиБ")), (2**20, tr("MiB", "МиБ")), (2**10, tr("KiB", "КиБ")))
    for scale, name in units:
        if nbytes >= scale:
            return f"{nbytes / scale:g}".replace(".", tr(".", ",")) + f" {name}"
    return f"{nbytes:g} " + tr("B", "Б")


def impl_label(impl: str) -> str:
    return {"builtin": tr("torch builtin (gloo)", "встроенная в torch (gloo)"),
            "ring": tr("fsdp_mini ring", "кольцо fsdp_mini"),
            "naive": tr("naive (via rank 0)", "наивная (через ранг 0)"),
            "tree": tr("binary tree", "двоичное дерево")}.get(impl, impl)


def _ranks_ru(n: int) -> str:
    """The Russian plural: 1 ранг, 2 ранга, 5 рангов, 21 ранг."""
    if n % 10 == 1 and n % 100 != 11:
        return "ранг"
    return "ранга" if 2 <= n % 10 <= 4 and not 12 <= n % 100 <= 14 else "рангов"


def _size_axis(ax, sizes: Sequence[float]) -> None:
    ax.set_xscale("log", base=2)
    ticks = sorted(set(sizes))
    if len(ticks) > 8:  # keep the labels readable: every other size, always the last one
        ticks = ticks[::-1][::2][::-1]
    ax.set_xticks(ticks)
    ax.set_xticklabels([size_label(s) for s in ticks], fontsize=SMALL)
    ax.minorticks_off()
    ax.set_xlabel(tr("message size S", "размер сообщения S"))


def _log_y(ax) -> None:
    """A logarithmic y axis labelled with plain numbers (0.5, 1, 2, 5 ...) rather than powers of ten."""
    import math

    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    lo, hi = ax.get_ylim()
    decades = math.log10(hi / lo) if lo > 0 and hi > lo else 0.0
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if decades < 2.5 else (1.0,)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _colors(labels, colors: Mapping[str, str] | None) -> dict[str, str]:
    colors = dict(colors or {})
    for i, label in enumerate(labels):
        colors.setdefault(label, _CYCLE[i % len(_CYCLE)])
    return colors


def plot_times(sizes: Sequence[float], lines: Mapping[str, Sequence[float]] | None = None,
               points: Mapping[str, Sequence[float]] | None = None, title: str | None = None,
               colors: Mapping[str, str] | None = None, unit: float = 1e-3, unit_name: str | None = None):
    """Seconds against bytes, log-log: `lines[label]` (e.g. a model) as lines, `points[label]` (e.g.
    medians of a benchmark) as markers, both at `sizes`. A label in both gets one colour; pass `colors`
    to choose them. Times are shown in `unit` seconds (default milliseconds)."""
    lines, points = dict(lines or {}), dict(points or {})
    if not lines and not points:
        raise ValueError("nothing to plot: give lines or points")
    for label, ys in {**lines, **points}.items():
        if len(ys) != len(sizes):
            raise ValueError(f"{label!r} has {len(ys)} values for {len(sizes)} sizes")
    unit_name = unit_name or tr("ms", "мс")
    colors = _colors(list(dict.fromkeys([*lines, *points])), colors)
    fig, ax = figure(width=6.4, height=3.6)
    for label, ys in lines.items():
        ax.plot(sizes, [y / unit for y in ys], "-", color=colors[label], label=label, linewidth=1.8)
    for label, ys in points.items():
        ax.plot(sizes, [y / unit for y in ys], "o", color=colors[label], markersize=5,
                label=None if label in lines else label)
    _log_y(ax)
    _size_axis(ax, sizes)
    ax.set_ylabel(tr(f"time, {unit_name}", f"время, {unit_name}"))
    ax.grid(True, which="major", alpha=0.3)
    if title:
        ax.set_title(title, fontsize=TITLE)
    ax.legend(fontsize=SMALL, frameon=False)
    fig.tight_layout()
    return fig


def plot_bandwidth(rows: Sequence[Mapping], op: str = "all_reduce", title: str | None = None, log: bool = True):
    """algbw (left) and busbw (right) in GB/s against size, one curve per `impl` of `op`, from the rows
    of `bench_collectives.worker` (keys size, op, impl, world_size, algbw, busbw). Where the two are
    equal (a bus factor of 1: an all-reduce on 2 ranks) one panel says so instead of two identical ones.
    With `log` the bandwidth axis is logarithmic too: latency-bound sizes then show as a straight rising
    line."""
    rows = [r for r in rows if r["op"] == op]
    if not rows:
        raise ValueError(f"no rows for op {op!r}")
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    n = rows[0]["world_size"]
    if all(r["busbw"] == r["algbw"] for r in rows):
        fig, ax = figure(width=6.4, height=3.4)
        panels = [(ax, "algbw", tr("algbw = busbw (bus factor 1)", "algbw = busbw (bus factor 1)"))]
    else:
        fig, axes = figure(width=9.0, height=3.4, ncols=2, sharey=True)
        panels = [(axes[0], "algbw", tr("algbw = S / t", "algbw = S / t")),
                  (axes[1], "busbw", tr("busbw = algbw × bus factor", "busbw = algbw × bus factor"))]
    axes = [ax for ax, _, _ in panels]
    for ax, key, name in panels:
        for i, impl in enumerate(impls):
            mine = sorted((r["size"], r[key]) for r in rows if r["impl"] == impl)
            ax.plot([s for s, _ in mine], [b / 1e9 for _, b in mine], "o-", markersize=4, linewidth=1.6,
                    color=IMPL_COLORS.get(impl, _CYCLE[i % len(_CYCLE)]), label=impl_label(impl))
        _size_axis(ax, [r["size"] for r in rows])
        ax.set_title(name, fontsize=TITLE)
        ax.grid(True, alpha=0.3)
    if log:  # after every panel is drawn: they share the y axis
        _log_y(axes[0])
    axes[0].set_ylabel(tr("GB/s", "ГБ/с"))
    axes[0].legend(fontsize=SMALL, frameon=False)
    fig.suptitle(title or tr(f"{op}, {n} ranks", f"{op}, {n} {_ranks_ru(n)}"), fontsize=TITLE)
    fig.tight_layout()
    return fig
