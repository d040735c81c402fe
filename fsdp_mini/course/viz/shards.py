"""The flat buffer of a unit, drawn: which parameter occupies which range, where the shards begin and
end, and the padding at the tail. Deterministic: it draws a `FlatLayout`, nothing measured.

`unit_layouts(model, wrap, n)` gives the layouts that `FSDP(model, wrap=wrap)` would build over `n`
ranks, without starting any process, by the engine's own planner (`fsdp_mini.fsdp.plan`).
"""
from __future__ import annotations

from fsdp_mini.fsdp.flat_param import FlatLayout
from fsdp_mini.fsdp.plan import plan_units
from fsdp_mini.course.language import get_language, tr
from fsdp_mini.course.viz import figure
from fsdp_mini.course.viz.style import SMALL, TEXT, TITLE

__all__ = ["PARAM_COLORS", "unit_layouts", "describe_pieces", "plot_flat_layout", "plot_gather_buffer"]

PARAM_COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C",
                "#CCB974", "#64B5CD", "#1F3A5F", "#7F3C1B", "#2D6A4F", "#8E1B2B", "#4B3A70", "#5A4632")
PAD_COLOR = "#C44E52"


def unit_layouts(model, wrap, n: int) -> dict[str, FlatLayout]:
    """The flat layouts FSDP builds for `model` wrapped with `wrap` over shard groups of `n` ranks, keyed
    by the label the engine gives each flat parameter ("root", "blocks.0", "blocks.0 (frozen)", ...),
    in the engine's order: the engine's own plan (`fsdp_mini.fsdp.plan`). Pure: no process group needed."""
    return {fp.label: fp.layout(n) for unit in plan_units(model, wrap).units for fp in unit.flat_params}


def describe_pieces(layout: FlatLayout, rank: int) -> list[str]:
    """Shard `rank`'s pieces as lines: which elements of which parameter, at which offset of the shard."""
    lo, hi = layout.shard_range(rank)
    lines = []
    for p in layout.pieces(rank):
        # the interval is Python's slice notation, left as code; the counts are numbers of the lesson's language
        whole = "" if p.numel == p.param.numel else tr(f" of {_num(p.param.numel)}", f" из {_num(p.param.numel)}")
        lines.append(f"{p.param.names[0]:<26} [{p.start:>5}, {p.end:>5}){whole:<9} -> "
                     + tr("shard offset", "смещение в шарде") + f" {_num(p.shard_offset)}")
    used = sum(p.numel for p in layout.pieces(rank))
    if used < hi - lo:
        lines.append(tr(f"{'padding':<26} {_num(hi - lo - used)} elements", f"{'паддинг':<26} элементов: {_num(hi - lo - used)}"))
    return lines


def _num(x: int) -> str:
    """12,345 in English, 12 345 (narrow no-break space) in Russian."""
    text = f"{x:,}"
    return text.replace(",", "\u202f") if get_language() == "ru" else text


def _without_common_prefix(names: list[str]) -> list[str]:
    parts = [n.split(".") for n in names]
    k = 0
    while all(len(p) > k + 1 and p[k] == parts[0][k] for p in parts):
        k += 1
    return [".".join(p[k:]) for p in parts]


def plot_flat_layout(layouts, titles=None, names=None, width: float = 9.0):
    """One row per `FlatLayout` (a list, or one layout): the flat buffer from element 0 to
    `padded_numel`, each parameter a coloured range, the padding hatched, dashed lines at the shard
    boundaries and each shard's rank and range written above it. `names`: legend labels per parameter
    (default: each parameter's first name, without the prefix that all of them share, e.g. "blocks.0.")."""
    from matplotlib.patches import Patch

    layouts = [layouts] if isinstance(layouts, FlatLayout) else list(layouts)
    titles = list(titles) if titles is not None else [None] * len(layouts)
    fig, axes = figure(width=width, height=1.45 * len(layouts) + 0.9, nrows=len(layouts))
    axes = [axes] if len(layouts) == 1 else list(axes)
    legend = {}
    for ax, layout, title in zip(axes, layouts, titles):
        labels = list(names) if names is not None else _without_common_prefix([p.names[0] for p in layout.params])
        for i, p in enumerate(layout.params):
            color = PARAM_COLORS[i % len(PARAM_COLORS)]
            ax.barh(0, p.numel, left=p.offset, height=0.8, color=color, edgecolor="white", linewidth=0.3)
            label = labels[i]
            legend.setdefault(label, color)
            if p.numel >= layout.padded_numel / 10:
                ax.text(p.offset + p.numel / 2, 0, label, ha="center", va="center", fontsize=SMALL, color="white")
        if layout.padding:
            ax.barh(0, layout.padding, left=layout.numel, height=0.8, facecolor="white", edgecolor=PAD_COLOR,
                    hatch="////", linewidth=0.8)
            ax.annotate(tr(f"padding: {layout.padding}", f"паддинг: {layout.padding}"),
                        (layout.padded_numel, -0.4), xytext=(0, -13), textcoords="offset points", ha="right",
                        va="top", fontsize=SMALL, color=PAD_COLOR,
                        arrowprops={"arrowstyle": "->", "color": PAD_COLOR, "linewidth": 0.8})
        for r in range(layout.n):
            lo, hi = layout.shard_range(r)
            if r:
                ax.axvline(lo, color="black", linestyle="--", linewidth=1)
            ax.text((lo + hi) / 2, 0.55, tr(f"rank {r}: [{_num(lo)}, {_num(hi)})", f"ранг {r}: [{_num(lo)}; {_num(hi)})"),
                    ha="center", va="bottom", fontsize=SMALL)
        ax.set_xlim(0, layout.padded_numel)
        ax.set_ylim(-0.6, 1.0)
        ax.set_yticks([])
        for side in ("left", "right", "top"):
            ax.spines[side].set_visible(False)
        ax.set_title(title if title is not None else
                     tr(f"{_num(layout.numel)} elements over {layout.n} shards of {_num(layout.shard_numel)}",
                        f"элементов: {_num(layout.numel)}; шардов: {layout.n}, по {_num(layout.shard_numel)} в каждом"),
                     fontsize=TEXT, loc="left")
        ax.tick_params(axis="x", labelsize=7)
    axes[-1].set_xlabel(tr("element of the flat buffer", "элемент плоского буфера"))
    handles = [Patch(color=c, label=n) for n, c in legend.items()]
    handles.append(Patch(facecolor="white", edgecolor=PAD_COLOR, hatch="////", label=tr("padding", "паддинг")))
    axes[0].legend(handles=handles, fontsize=SMALL, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.15))
    fig.tight_layout()
    return fig


def plot_gather_buffer(params, n: int, title: str | None = None):
    """The per-parameter design's AllGather buffer for one unit: n rows, one per rank, each the rank's
    padded dim-0 chunks side by side (copy-in); parameter i is column block i, read rank after rank
    (copy-out). `params`: (name, shape) pairs. Padding rows are hatched. Small parameters are drawn
    wider than their share (at least a tenth of the largest), so that every one stays visible."""
    import math

    from matplotlib.patches import Rectangle

    fig, ax = figure(width=9.0, height=0.55 * n + 1.6)
    numels = [math.ceil(shape[0] / n) * math.prod(shape[1:]) for _, shape in params]
    widths = [max(w, 0.1 * max(numels)) for w in numels]
    offset = 0
    for i, ((name, shape), width) in enumerate(zip(params, widths)):
        rows_per_rank = math.ceil(shape[0] / n)
        for rank in range(n):
            real = max(0, min(rows_per_rank, shape[0] - rank * rows_per_rank))  # rows of the parameter here
            filled = width * real / rows_per_rank
            y = n - 1 - rank
            color = PARAM_COLORS[i % len(PARAM_COLORS)]
            ax.add_patch(Rectangle((offset, y), filled, 0.8, facecolor=color, edgecolor="white", linewidth=0.5))
            if filled < width:
                ax.add_patch(Rectangle((offset + filled, y), width - filled, 0.8, facecolor="white",
                                       edgecolor=color, hatch="///", linewidth=0.5))
        ax.text(offset + width / 2, n + 0.05, f"{name}\n{tuple(shape)}", ha="center", va="bottom", fontsize=SMALL)
        offset += width
    for rank in range(n):
        ax.text(-0.01 * offset, n - 1 - rank + 0.4, tr(f"rank {rank}", f"ранг {rank}"), ha="right", va="center",
                fontsize=TEXT)
    ax.set_xlim(0, offset)
    ax.set_ylim(-0.3, n + 1.0)
    ax.set_yticks([])
    ax.set_xticks([])
    ax.set_xlabel(tr("a rank's row: its padded chunks, parameter after parameter (small ones drawn wider)",
                     "строка ранга: его чанки с паддингом, параметр за параметром (малые нарисованы шире)"),
                  fontsize=TEXT)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    if title:
        ax.set_title(title, fontsize=TITLE)
    fig.tight_layout()
    return fig
