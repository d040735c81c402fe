"""Pictures of collectives: each rank's tensor before and after an op, bytes sent per rank, predicted time.

`plot_collective` draws every rank's tensor as a row of cells, before and after the op. A cell's colour
says where its value came from: rank r's colour for a value that rank r owned, stripes of several colours
for a reduction (the value is a sum over those ranks), a grey "?" where the op leaves nothing defined
(the non-root buffers after `reduce`).
"""
from __future__ import annotations

from typing import Mapping, Sequence

from fsdp_mini.course.language import tr
from fsdp_mini.course.viz import figure, rank_color
from fsdp_mini.course.viz.style import SMALL, TEXT, TITLE

__all__ = ["OPS", "ALGO_COLORS", "algorithm_label", "cell_sources", "integers", "plot_collective",
           "plot_bytes_sent", "plot_predicted_times"]

OPS = ("broadcast", "reduce", "all_reduce", "all_gather", "reduce_scatter")
ALGO_COLORS = {"naive": "#C44E52", "ring": "#4C72B0", "tree": "#8C8C8C"}
_ALGO_STYLES = {"naive": "-", "ring": "-", "tree": "--"}
_CELL = 0.42  # inches per cell


def algorithm_label(name: str) -> str:
    """The legend label of an all-reduce algorithm, in the current language."""
    labels = {"naive": tr("naive (through rank 0)", "наивный (через ранг 0)"),
              "ring": tr("ring", "кольцо"), "tree": tr("tree", "дерево")}
    return labels.get(name, name)


def integers(values: Sequence[float] | None) -> list[int] | None:
    """A rank's tensor as lesson 1's tables print it: its integer-valued floats as integers ([1.0, 2.0] ->
    [1, 2]), so that a table reads like the pictures and the prose; None (a buffer `reduce` leaves
    undefined) stays None. Refuses a value with a fraction rather than round it away."""
    if values is None:
        return None
    if not all(float(v).is_integer() for v in values):
        raise ValueError(f"integers() takes integer-valued floats, got {list(values)}")
    return [int(v) for v in values]


def _title(op: str, root: int) -> str:
    return {"broadcast": f"broadcast(src={root})", "reduce": f"reduce(dst={root}, SUM)",
            "all_reduce": "all_reduce(SUM)", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter(SUM)"}[op]


def cell_sources(op: str, n: int, length: int, root: int = 0) -> list[list]:
    """Where each cell of each rank's result comes from after `op` on n ranks with `length` cells per
    rank: an int (that rank's value), a tuple of ranks (their sum) or None (not defined by the op)."""
    everyone = tuple(range(n))
    if op == "broadcast":
        return [[root] * length for _ in range(n)]
    if op == "reduce":
        return [[everyone] * length if r == root else [None] * length for r in range(n)]
    if op in ("all_reduce", "reduce_scatter"):
        return [[everyone] * length for _ in range(n)]
    if op == "all_gather":
        if length % n:
            raise ValueError(f"all_gather output of {length} cells is not {n} equal chunks")
        return [[j // (length // n) for j in range(length)] for _ in range(n)]
    raise ValueError(f"unknown op {op!r}; valid: {', '.join(OPS)}")


def _fmt(value) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) else str(value)


def _draw_rows(ax, rows, sources, chunk: int | None) -> None:
    """One row per rank (rank 0 on top), one square cell per element."""
    from matplotlib.patches import Rectangle

    n = len(rows)
    width = max(len(s) for s in sources)
    for rank, (values, srcs) in enumerate(zip(rows, sources)):
        y = n - 1 - rank
        for j in range(len(srcs)):
            value = None if values is None else values[j]
            src = srcs[j]
            if src is None or value is None:
                ax.add_patch(Rectangle((j, y), 1, 1, facecolor="#F2F2F2", edgecolor="#BBBBBB", hatch="///",
                                       linewidth=0.8))
                ax.text(j + 0.5, y + 0.5, "?", ha="center", va="center", fontsize=TITLE, color="#888888")
                continue
            ranks = src if isinstance(src, tuple) else (src,)
            for k, r in enumerate(ranks):  # stripes: a sum shows every rank that contributed
                ax.add_patch(Rectangle((j + k / len(ranks), y), 1 / len(ranks), 1, facecolor=rank_color(r),
                                       edgecolor="none"))
            ax.add_patch(Rectangle((j, y), 1, 1, facecolor="none", edgecolor="white", linewidth=1.5))
            boxed = len(ranks) > 1
            ax.text(j + 0.5, y + 0.5, _fmt(value), ha="center", va="center", fontsize=TEXT,
                    color="black" if boxed else "white", fontweight="bold",
                    bbox=dict(boxstyle="round,pad=0.15", facecolor="white", edgecolor="none", alpha=0.85)
                    if boxed else None)
    if chunk and chunk < width:
        for x in range(chunk, width, chunk):
            ax.plot([x, x], [-0.1, n + 0.1], color="black", linewidth=1.6)
    ax.set_xlim(-0.05, width + 0.05)
    ax.set_ylim(-0.05, n + 0.05)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([n - 1 - r + 0.5 for r in range(n)])
    ax.set_yticklabels([tr(f"rank {r}", f"ранг {r}") for r in range(n)])
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)


def plot_collective(before: Sequence[Sequence[float]], after: Sequence[Sequence[float] | None], op: str,
                    root: int = 0, title: str | None = None):
    """Every rank's tensor before and after collective `op`: `before[r]` and `after[r]` are rank r's
    values (lists of numbers, as `tensor.tolist()` gives); `after[r] = None` for a buffer the op leaves
    undefined. `root` is broadcast's src or reduce's dst. Returns the figure (two axes: before, after)."""
    n = len(before)
    if len(after) != n:
        raise ValueError(f"before has {n} ranks, after has {len(after)}")
    len_before = max(len(b) for b in before)
    len_after = max((len(a) for a in after if a is not None), default=len_before)
    chunk = min(len_before, len_after)
    fig, axes = figure(width=_CELL * (len_before + len_after) + 2.6, height=_CELL * n + 1.3, ncols=2,
                       gridspec_kw={"width_ratios": [len_before, len_after]})
    _draw_rows(axes[0], before, [[r] * len(b) for r, b in enumerate(before)], chunk)
    _draw_rows(axes[1], after, cell_sources(op, n, len_after, root), chunk)
    axes[1].set_yticklabels([])
    axes[0].set_title(tr("before", "до"), fontsize=TITLE)
    axes[1].set_title(tr("after", "после"), fontsize=TITLE)
    fig.suptitle(title or _title(op, root), fontsize=TITLE, fontfamily="monospace")
    notes = []
    if op in ("reduce", "all_reduce", "reduce_scatter"):
        notes.append(tr("stripes: a sum over those ranks", "полоски: сумма по этим рангам"))
    if op == "reduce" or any(a is None for a in after):
        notes.append(tr("?: not defined by the op", "?: операция не определяет"))
    if notes:
        fig.text(0.5, 0.02, "   ·   ".join(notes), ha="center", fontsize=SMALL, color="#555555")
    fig.tight_layout(rect=(0, 0.06, 1, 0.95))
    return fig


def plot_bytes_sent(sent: Mapping[str, Sequence[int]], nbytes: int | None = None, title: str | None = None):
    """Grouped bars: `sent[algorithm][r]` = bytes rank r sent (e.g. `CommLog.sent`), one group per rank.

    With `nbytes` (S, the tensor's size) each bar is labelled in multiples of S and a dotted line marks S.
    """
    algos = list(sent)
    n = max(len(v) for v in sent.values())
    fig, ax = figure(width=max(5.5, 1.1 * n + 2.5), height=3.4)
    width = 0.8 / len(algos)
    for i, algo in enumerate(algos):
        xs = [r - 0.4 + width * (i + 0.5) for r in range(len(sent[algo]))]
        ax.bar(xs, sent[algo], width=width * 0.92, color=ALGO_COLORS.get(algo, rank_color(i)),
               label=algorithm_label(algo))
        for x, v in zip(xs, sent[algo]):
            text = f"{v / nbytes:.3g} S" if nbytes else f"{v:,}"
            ax.text(x, v, text, ha="center", va="bottom", fontsize=SMALL)
    if nbytes:
        ax.axhline(nbytes, color="black", linestyle=":", linewidth=1)
        ax.text(n - 0.45, nbytes, "S", va="bottom", ha="right", fontsize=TEXT)
    ax.set_xticks(range(n))
    ax.set_xticklabels([tr(f"rank {r}", f"ранг {r}") for r in range(n)])
    ax.set_ylabel(tr("bytes sent by the rank", "байт отправил ранг"))
    top = max(max(v) for v in sent.values())
    ax.set_ylim(0, top * 1.18)
    ax.set_title(title or tr(f"one all-reduce at n = {n}: bytes sent per rank",
                             f"один AllReduce при n = {n}: байты, отправленные каждым рангом"), fontsize=TITLE)
    ax.legend(fontsize=SMALL, frameon=False, loc="upper right")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig


def plot_predicted_times(ns: Sequence[int], panels: Mapping[str, Mapping[str, Sequence[float]]]):
    """Predicted seconds vs group size, log-log: one axis per panel (`panels[title][algorithm]` = times
    for each n in `ns`, e.g. from `fsdp_mini.course.cost.predict`), drawn in milliseconds."""
    fig, axes = figure(width=4.2 * len(panels) + 0.6, height=3.5, ncols=len(panels), squeeze=False)
    ticks = [t for t in (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024) if min(ns) <= t <= max(ns)]
    for ax, (panel, curves) in zip(axes[0], panels.items()):
        for algo, times in curves.items():
            wide = algo == "naive"  # drawn wider, so it still shows where the ring's line covers it
            ax.plot(ns, [t * 1e3 for t in times], _ALGO_STYLES.get(algo, "-"), color=ALGO_COLORS.get(algo),
                    linewidth=4 if wide else 1.8, alpha=0.8 if wide else 1.0, label=algorithm_label(algo))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(t) for t in ticks])
        ax.set_xlabel(tr("ranks n", "число рангов n"))
        ax.set_ylabel(tr("predicted time, ms", "предсказанное время, мс"))
        ax.set_title(panel, fontsize=TITLE)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=SMALL, frameon=False)
    fig.tight_layout()
    return fig
