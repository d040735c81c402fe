"""Who holds what, and what crosses nodes: the grid of shard and replica groups, how one unit's elements
are split over ranks (fsdp_mini's flat buffer vs FSDP2's per-parameter dim-0 shards), and the bytes and
predicted time of one step inside and across nodes (from `fsdp_mini.course.cluster`).

Everything is computed from plain numbers (world size, shard size, shapes), so the pictures are the
same on every run; a rank keeps its colour `rank_color(r)` as in every other plot of the course.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

from fsdp_mini.fsdp.groups import grid
from fsdp_mini.course.language import tr
from fsdp_mini.course.viz import figure, rank_color
from fsdp_mini.course.viz.style import SMALL, TEXT, TITLE

__all__ = ["LINK_COLORS", "plot_grid", "shard_segments", "plot_shard_layouts", "plot_step_comm", "plot_shard_size_sweep",
           "who_holds_what", "plot_who_holds_what"]

LINK_COLORS = {"intra": "#4C72B0", "inter": "#C44E52"}
_PAD_COLOR = "#D9D9D9"


def plot_grid(world_size: int, shard_size: int, gpus_per_node: int | None = None, title: str | None = None):
    """The ranks as a grid of `world_size // shard_size` rows and `shard_size` columns, each rank in its
    colour with the shard it holds: a row is a shard group (AllGather, ReduceScatter), a column a
    replica group (AllReduce of one gradient shard); dashed boxes are nodes of `gpus_per_node` ranks."""
    from matplotlib.patches import FancyBboxPatch, Rectangle

    rows, cols = grid(world_size, shard_size)
    nrows, ncols = len(rows), len(cols)
    fig, ax = figure(width=1.1 * (ncols + 3.1) + 0.2, height=1.1 * (nrows + 0.75) + 0.45)
    for i, row in enumerate(rows):
        y = nrows - 1 - i
        ax.add_patch(FancyBboxPatch((-0.42, y - 0.40), ncols - 0.16, 0.80, boxstyle="round,pad=0.02,rounding_size=0.15",
                                    facecolor="#EEF1F6", edgecolor="#9AA7BD", linewidth=1.0, zorder=0))
        ax.text(-0.55, y, tr(f"shard group {i}\n{row}", f"группа шардирования {i}\n{row}"), ha="right",
                va="center", fontsize=TEXT)
        for j, rank in enumerate(row):
            ax.add_patch(Rectangle((j - 0.32, y - 0.32), 0.64, 0.64, facecolor=rank_color(rank), edgecolor="white",
                                   linewidth=1.5, zorder=2))
            ax.text(j, y + 0.07, tr(f"rank {rank}", f"ранг {rank}"), ha="center", va="center", fontsize=TEXT,
                    color="white", fontweight="bold", zorder=3)
            ax.text(j, y - 0.16, tr(f"shard {j}", f"шард {j}"), ha="center", va="center", fontsize=SMALL,
                    color="white", zorder=3)
    for j, col in enumerate(cols):
        if nrows > 1:
            ax.plot([j, j], [0, nrows - 1], color="#444444", linewidth=3.0, solid_capstyle="butt", zorder=1)
        ax.text(j, -0.62, tr(f"replica group\n{col}", f"группа реплик\n{col}"), ha="center", va="top", fontsize=SMALL)
    if gpus_per_node:
        for node in range(world_size // gpus_per_node):
            ranks = range(node * gpus_per_node, (node + 1) * gpus_per_node)
            cells = [(r % shard_size, nrows - 1 - r // shard_size) for r in ranks]
            x0, x1 = min(c[0] for c in cells), max(c[0] for c in cells)
            y0, y1 = min(c[1] for c in cells), max(c[1] for c in cells)
            ax.add_patch(Rectangle((x0 - 0.47, y0 - 0.45), x1 - x0 + 0.94, y1 - y0 + 0.90, facecolor="none",
                                   edgecolor="black", linewidth=1.1, linestyle="--", zorder=4))
            ax.text(x1 + 0.55, (y0 + y1) / 2, tr(f"node {node}", f"узел {node}"), ha="left", va="center",
                    fontsize=TEXT)
    ax.set_xlim(-2.8, ncols + (0.3 if gpus_per_node else -0.35))
    ax.set_ylim(-1.2, nrows - 0.45)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(title or tr(f"world_size {world_size}, shard_size {shard_size}: rows gather and scatter, "
                             f"columns all-reduce",
                             f"world_size {world_size}, shard_size {shard_size}: строки — AllGather и "
                             f"ReduceScatter, столбцы — AllReduce"), fontsize=TEXT)
    fig.tight_layout()
    return fig


def shard_segments(shapes: Sequence[Sequence[int]], n: int, layout: str) -> list[tuple[int, int, int | None]]:
    """How one unit's elements (its parameters of `shapes`, concatenated in order) are split over `n`
    ranks, as (start, end, rank) runs; rank None is padding.

    layout "flat": fsdp_mini's flat buffer, padded to a multiple of n and cut into n equal pieces, which
    may start and end inside a parameter. layout "dim0": FSDP2's, each parameter cut on its first
    dimension into chunks of ceil(rows / n) rows (`torch.chunk`), so every parameter is split, the last
    ranks may get fewer rows or none. Only the real elements are listed for dim0 (FSDP2 pads each local
    shard to the chunk size when it gathers, which this picture does not show).
    """
    if layout not in ("flat", "dim0"):
        raise ValueError(f"layout must be 'flat' or 'dim0', got {layout!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    numels = [math.prod(s) for s in shapes]
    total = sum(numels)
    if layout == "flat":
        per = -(-total // n)
        out = [(r * per, min((r + 1) * per, total), r) for r in range(n) if r * per < total]
        if per * n > total:
            out.append((total, per * n, None))
        return out
    out, offset = [], 0
    for shape, numel in zip(shapes, numels):
        rows = shape[0] if len(shape) else 1
        inner = numel // rows if rows else 0
        chunk = -(-rows // n)
        for r in range(n):
            lo, hi = r * chunk, min((r + 1) * chunk, rows)
            if lo < hi:
                out.append((offset + lo * inner, offset + hi * inner, r))
        offset += numel
    return out


def plot_shard_layouts(params: Sequence[tuple[str, Sequence[int]]], n: int, title: str | None = None):
    """One unit's elements as a bar, once per layout: fsdp_mini's flat buffer (top) and FSDP2's dim-0
    shards (bottom), each run in the colour of the rank that holds it; thin lines mark where each of
    `params` (name, shape) begins, and the larger ones are named below."""
    from matplotlib.patches import Rectangle

    names = [name for name, _ in params]
    shapes = [tuple(shape) for _, shape in params]
    numels = [math.prod(s) for s in shapes]
    total = sum(numels)
    flat = shard_segments(shapes, n, "flat")
    padded = flat[-1][1]
    fig, ax = figure(width=9.0, height=2.9)
    rows = [(1.25, flat, tr("fsdp_mini: one flat buffer,\nn equal pieces", "fsdp_mini: один плоский буфер,\nn равных чанков")),
            (0.0, shard_segments(shapes, n, "dim0"),
             tr("FSDP2: every parameter\ncut on dim 0", "FSDP2: каждый параметр\nрезан по dim 0"))]
    for y, segments, label in rows:
        for start, end, rank in segments:
            ax.add_patch(Rectangle((start, y), end - start, 0.8, facecolor=_PAD_COLOR if rank is None else rank_color(rank),
                                   edgecolor="none", hatch="///" if rank is None else None))
        ax.text(-0.01 * padded, y + 0.4, label, ha="right", va="center", fontsize=TEXT)
    offset = 0
    for name, numel in zip(names, numels):
        for y in (1.25, 0.0):
            ax.plot([offset, offset], [y, y + 0.8], color="black", linewidth=0.7)
        if numel >= 0.05 * total:
            ax.text(offset + numel / 2, -0.12, name, ha="center", va="top", fontsize=SMALL, rotation=0)
        offset += numel
    for y in (1.25, 0.0):
        ax.plot([total, total], [y, y + 0.8], color="black", linewidth=0.7)
    handles = [Rectangle((0, 0), 1, 1, facecolor=rank_color(r)) for r in range(n)]
    labels = [tr(f"rank {r}", f"ранг {r}") for r in range(n)]
    if padded > total:
        handles.append(Rectangle((0, 0), 1, 1, facecolor=_PAD_COLOR, hatch="///"))
        labels.append(tr("padding", "паддинг"))
    ax.legend(handles, labels, fontsize=SMALL, frameon=False, ncol=len(labels), loc="upper center",
              bbox_to_anchor=(0.5, 1.16))
    ax.set_xlim(0, padded * 1.005)
    ax.set_ylim(-0.55, 2.2)
    ax.set_yticks([])
    ax.set_xlabel(tr(f"element of the unit ({total} parameters)", f"элемент юнита ({total} параметров)"),
                  fontsize=TEXT)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    if title:
        ax.set_title(title, fontsize=TITLE, pad=24)
    fig.tight_layout()
    return fig


def plot_step_comm(networks: Mapping[str, Mapping[str, object]], unit: float = 1e9, title: str | None = None):
    """Two panels, one bar group per strategy. Left: bytes one rank sends per step, split into what goes over
    NVLink and what its network card carries (from the first network: bytes do not depend on bandwidth). Right:
    predicted seconds of communication per step on each network, side by side. `networks[name][strategy]` is a
    `fsdp_mini.course.cluster.StepComm` (`sent_nvlink`, `sent_network`, `seconds`)."""
    names = list(networks)
    first = networks[names[0]]
    labels = list(first)
    fig, axes = figure(width=max(8.0, 2.2 * len(labels) + 3.5), height=3.5, ncols=2)
    left, right = axes
    nvlink = [first[k].sent_nvlink / unit for k in labels]
    card = [first[k].sent_network / unit for k in labels]
    left.bar(labels, nvlink, color=LINK_COLORS["intra"], width=0.6, label=tr("over NVLink", "по NVLink"))
    left.bar(labels, card, bottom=nvlink, color=LINK_COLORS["inter"], width=0.6,
             label=tr("over its network card", "через свою сетевую карту"))
    for x, (a, b) in enumerate(zip(nvlink, card)):
        left.text(x, a + b, f"{a + b:.3g}", ha="center", va="bottom", fontsize=TEXT)
        left.text(x, a + b / 2, f"{b:.2g}", ha="center", va="center", fontsize=SMALL, color="white")
    left.set_ylim(0, max(a + b for a, b in zip(nvlink, card)) * 1.4)
    left.set_ylabel(tr("GB sent per rank per step", "ГБ на ранг за шаг"), fontsize=TEXT)
    left.legend(fontsize=SMALL, frameon=False, loc="upper left")
    width = 0.8 / len(names)
    shades = ("#55A868", "#DD8452", "#8172B2", "#937860")  # not the link colours of the left panel
    tops = []
    for i, name in enumerate(names):
        xs = [x - 0.4 + width * (i + 0.5) for x in range(len(labels))]
        seconds = [networks[name][k].seconds for k in labels]
        tops += seconds
        right.bar(xs, seconds, width=width * 0.95, color=shades[i % len(shades)], label=name)
        for x, sec in zip(xs, seconds):
            right.text(x, sec, f"{sec:.2g}", ha="center", va="bottom", fontsize=SMALL)
    right.set_xticks(range(len(labels)))
    right.set_xticklabels(labels)
    right.set_ylim(0, max(tops) * 1.3)
    right.set_ylabel(tr("communication, s per step", "обмен данными, с за шаг"), fontsize=TEXT)
    right.legend(fontsize=SMALL, frameon=False, loc="upper left")
    for ax in axes:
        ax.tick_params(axis="x", labelsize=8.5)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    if title:
        fig.suptitle(title, fontsize=TITLE)
    fig.tight_layout()
    return fig


def plot_shard_size_sweep(sizes: Sequence[int], memory: Sequence[float], steps: Sequence[object],
                          gpus_per_node: int, unit: float = 1e9):
    """Memory and predicted communication against the shard group size: `memory[i]` bytes per rank
    (e.g. `estimate_memory(...).total`) and `steps[i]` (a `fsdp_mini.course.cluster.StepComm`) for shard_size
    `sizes[i]`; a dotted line marks one node. Shard size 1 is DDP, the whole world is FULL_SHARD."""
    fig, (left, right) = figure(width=9.0, height=3.4, ncols=2)
    left.plot(sizes, [m / unit for m in memory], "o-", color="#55A868")
    for x, m in zip(sizes, memory):
        left.text(x, m / unit * 1.15, f"{m / unit:.3g}", ha="center", va="bottom", fontsize=SMALL)
    left.set_yscale("log")
    left.set_ylim(min(memory) / unit / 1.6, max(memory) / unit * 2.5)
    left.set_ylabel(tr("model states, GB per rank", "состояния модели, ГБ на ранг"), fontsize=TEXT)
    intra = [s.intra_seconds for s in steps]
    inter = [s.inter_seconds for s in steps]
    width = [0.55 * x for x in sizes]  # equal widths on a log axis
    right.bar(sizes, intra, width=width, color=LINK_COLORS["intra"], label=tr("inside a node", "внутри узла"))
    right.bar(sizes, inter, width=width, bottom=intra, color=LINK_COLORS["inter"],
              label=tr("across nodes", "между узлами"))
    right.set_ylabel(tr("predicted communication, s per step", "предсказанное время обмена данными, с за шаг"), fontsize=TEXT)
    right.set_ylim(0, max(a + b for a, b in zip(intra, inter)) * 1.2)
    right.legend(fontsize=SMALL, frameon=False, loc="upper left")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(sizes))
        ax.set_xticklabels([str(x) for x in sizes])
        ax.set_xlabel("shard_size", fontsize=TEXT)
        ax.axvline(gpus_per_node, color="black", linestyle=":", linewidth=1)
        ax.text(gpus_per_node * 1.08, ax.get_ylim()[1], tr("one node", "один узел"), fontsize=SMALL, va="top")
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig


# --- who holds what: the course's strategies side by side ---------------------------------------------

_STATE_COLORS = {"params": "#4C72B0", "grads": "#DD8452", "optimizer": "#55A868"}  # as in viz.memory
_STATES = ("params", "grads", "optimizer")


def who_holds_what(world_size: int = 4, shard_size: int = 2) -> dict[str, dict]:
    """DDP, ZeRO-1, ZeRO-2, FSDP and HSDP (shard groups of `shard_size`) on `world_size` ranks, from
    `fsdp_mini.fsdp.strategy_facts.facts`: for each, the shard group size `group`, `held[rank][state]` = the part
    (start, end) of the whole state that the rank holds, as fractions, and `travels`: the collectives of one
    step as (op, state, times, group kind, fraction of the state per call)."""
    from fsdp_mini.fsdp.strategy import ShardingStrategy
    from fsdp_mini.fsdp.strategy_facts import ZERO1, facts, shard_group_size_with_zero1

    strategies = {"DDP": (ShardingStrategy.NO_SHARD, None), "ZeRO-1": (ZERO1, None),
                  "ZeRO-2": (ShardingStrategy.SHARD_GRAD_OP, None), "FSDP": (ShardingStrategy.FULL_SHARD, None),
                  "HSDP": (ShardingStrategy.HYBRID_SHARD, shard_size)}
    out = {}
    for name, (strategy, size) in strategies.items():
        f = facts(strategy)
        group = shard_group_size_with_zero1(strategy, world_size, size)
        held = {rank: {state: ((rank % group) / group, (rank % group + 1) / group) if state in f.sharded else (0.0, 1.0)
                       for state in _STATES} for rank in range(world_size)}
        if group == 1:
            travels = [("all_reduce", "grads", 1, "replica", 1.0)]
        else:
            travels = [("reduce_scatter", "grads", 1, "shard", 1.0),
                       ("all_gather", "params", f.all_gathers_per_step, "shard", 1.0)]
            if f.hybrid and group < world_size:
                travels.append(("all_reduce", "grads", 1, "replica", 1 / group))
        out[name] = {"strategy": strategy, "group": group, "held": held, "travels": travels}
    return out


def _fraction(part: float) -> str:
    return "1" if part == 1 else f"1/{round(1 / part)}"


def plot_who_holds_what(world_size: int = 4, shard_size: int = 2, title: str | None = None):
    """One panel per strategy of `who_holds_what`: a row per rank, a bar per model state (parameters,
    gradients, optimizer state) whose filled part is what that rank holds (1, 1/n or 1/shard_size, at its
    shard's place), and under the panel what one step sends and over which group. Deterministic."""
    from matplotlib.patches import Patch, Rectangle

    table = who_holds_what(world_size, shard_size)
    names = list(table)
    fig, axes = figure(width=2.05 * len(names) + 0.6, height=0.42 * world_size + 2.3, ncols=len(names))
    state_names = {"params": tr("parameters", "параметры"), "grads": tr("gradients", "градиенты"),
                   "optimizer": tr("optimizer state", "состояние оптимизатора")}
    op_names = {"all_gather": "AllGather", "reduce_scatter": "ReduceScatter", "all_reduce": "AllReduce"}
    what = {"params": tr("params", "параметров"), "grads": tr("grads", "градиентов")}
    for ax, name in zip(axes, names):
        entry = table[name]
        for rank in range(world_size):
            y = world_size - 1 - rank
            for j, state in enumerate(_STATES):
                x0 = j * 1.2
                ax.add_patch(Rectangle((x0, y - 0.3), 1.0, 0.6, facecolor="#F2F2F2", edgecolor="#BBBBBB",
                                       linewidth=0.6))
                start, end = entry["held"][rank][state]
                ax.add_patch(Rectangle((x0 + start, y - 0.3), end - start, 0.6, facecolor=_STATE_COLORS[state],
                                       edgecolor="none"))
                if rank == 0:
                    ax.text(x0 + 0.5, world_size - 0.55, _fraction(end - start), ha="center", va="bottom", fontsize=SMALL)
        if 1 < entry["group"] < world_size:  # shard groups: a line between them
            for k in range(1, world_size // entry["group"]):
                y = world_size - k * entry["group"] - 0.5
                ax.plot([-0.1, 3.5], [y, y], color="black", linestyle="--", linewidth=0.9)
        lines = []
        for op, state, times, kind, part in entry["travels"]:
            where = (tr("in a shard group", "в группе шардирования") if kind == "shard"
                     else tr("across replicas", "между репликами"))
            count = f"{times}× " if times > 1 else ""
            amount = "" if part == 1 else f" ({_fraction(part)})"
            lines.append(f"{count}{op_names[op]} {what[state]}{amount}\n  {where}")
        ax.text(-0.1, -0.75, "\n".join(lines), ha="left", va="top", fontsize=SMALL)
        group = entry["group"]
        suffix = f" ({world_size // group}×{group})" if 1 < group < world_size else ""
        ax.set_title(f"{name}{suffix}", fontsize=TEXT)
        ax.set_xlim(-0.15, 3.55)
        ax.set_ylim(-3.0, world_size + 0.1)
        ax.set_yticks([world_size - 1 - r for r in range(world_size)],
                      [tr(f"rank {r}", f"ранг {r}") for r in range(world_size)] if ax is axes[0] else [], fontsize=SMALL)
        ax.set_xticks([])
        for side in ("top", "right", "bottom", "left"):
            ax.spines[side].set_visible(False)
        ax.tick_params(axis="y", length=0)
    handles = [Patch(color=_STATE_COLORS[s], label=state_names[s]) for s in _STATES]
    fig.legend(handles=handles, fontsize=SMALL, frameon=False, ncol=3, loc="upper center", bbox_to_anchor=(0.5, 0.93))
    fig.suptitle(title or tr(f"{world_size} ranks: what each rank holds (filled) and what one step sends",
                             f"{world_size} ранга: что хранит каждый ранг (закрашено) и что передаёт шаг"),
                 fontsize=TITLE)
    fig.tight_layout(rect=(0, 0, 1, 0.86))
    return fig
