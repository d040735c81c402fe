"""Ring pictures: one panel per step of a ring collective, ranks as columns, chunks as rows.

Each cell is what a rank holds for a chunk: its text names the ranks whose contributions are summed in
it ("0+2+3", or "Σ" once all n are in), and a strip of squares along its bottom shows the same in the
ranks' colours. Cells with the full sum are tinted green. An arrow goes from every cell sent at that step
to the cell it lands in, one column to the right; the last rank's arrow leaves on the right and comes
back in on the left, where rank 0 receives it (the ring closes).
"""
from __future__ import annotations

from typing import Sequence

from fsdp_mini.course.language import tr
from fsdp_mini.course.ring_schedule import RingStep, format_contributors
from fsdp_mini.course.viz import figure, rank_color
from fsdp_mini.course.viz.style import TEXT, TITLE

__all__ = ["plot_ring_steps", "step_title", "DONE_COLOR"]

DONE_COLOR = "#D5EDD0"  # a chunk summed over every rank
_EMPTY_COLOR = "#F2F2F2"  # nothing there yet (a plain all-gather's missing chunks)
_OFF_COLOR = "#E4E4E4"  # a rank whose contribution is not in the cell
_GAP = 0.55  # between rank columns: room for the arrows


def step_title(step: RingStep, n: int) -> str:
    """"reduce-scatter, step 2 of 3" (or "start"), in the current language."""
    if step.phase == "start":
        if n > 1 and any(len(ranks) == n for row in step.state for ranks in row):  # an all-reduce's middle
            return tr("after ReduceScatter", "после ReduceScatter")
        return tr("start", "начало")
    name = {"reduce_scatter": "ReduceScatter", "all_gather": "AllGather"}[step.phase]
    return tr(f"{name}, step {step.step + 1} of {n - 1}", f"{name}, шаг {step.step + 1} из {n - 1}")


def _x(rank: int) -> float:
    return rank * (1 + _GAP)


def _panel(ax, step: RingStep, n: int, fade_incomplete: bool, first: bool) -> None:
    from matplotlib.patches import FancyArrowPatch, Rectangle

    sent = {(m.src, m.chunk): m for m in step.messages}
    for rank, row in enumerate(step.state):
        for chunk, ranks in enumerate(row):
            x, y = _x(rank), chunk
            done = n > 1 and len(ranks) == n
            faded = fade_incomplete and not done and bool(ranks)
            face = DONE_COLOR if done else ("white" if ranks else _EMPTY_COLOR)
            m = sent.get((rank, chunk))
            edge, lw = (rank_color(rank), 2.6) if m else ("#9A9A9A", 0.8)
            ax.add_patch(Rectangle((x, y), 1, 1, facecolor=face, edgecolor=edge, linewidth=lw, zorder=2))
            alpha = 0.3 if faded else 1.0
            ax.text(x + 0.5, y + 0.42, format_contributors(ranks, n), ha="center", va="center",
                    fontsize=TITLE if done else (9 if len(ranks) < 3 else 7.5), alpha=alpha, zorder=3,
                    fontweight="bold" if done else "normal")
            if ranks:
                w = 0.8 / n
                for k in range(n):
                    ax.add_patch(Rectangle((x + 0.1 + k * w, y + 0.74), w * 0.9, 0.16, linewidth=0, zorder=3,
                                           facecolor=rank_color(k) if k in ranks else _OFF_COLOR, alpha=alpha))
    for m in step.messages:
        y = m.chunk + 0.5
        style = dict(arrowstyle="-|>", mutation_scale=11, color=rank_color(m.src), linewidth=1.6, zorder=4)
        if m.dst == m.src + 1:
            ax.add_patch(FancyArrowPatch((_x(m.src) + 1.02, y), (_x(m.dst) - 0.02, y), **style))
        else:  # the ring closes: out on the right, back in on the left
            ax.add_patch(FancyArrowPatch((_x(m.src) + 1.02, y), (_x(m.src) + 1 + _GAP, y), **style))
            ax.add_patch(FancyArrowPatch((_x(m.dst) - _GAP, y), (_x(m.dst) - 0.02, y), **style))
    for rank in range(n):
        ax.text(_x(rank) + 0.5, -0.12, tr(f"rank {rank}", f"ранг {rank}"), ha="center", va="bottom",
                fontsize=TEXT, color=rank_color(rank), fontweight="bold")
    if first:
        for chunk in range(n):
            ax.text(-_GAP - 0.05, chunk + 0.5, tr(f"chunk {chunk}", f"чанк {chunk}"), ha="right", va="center",
                    fontsize=TEXT, clip_on=False)
    ax.set_xlim(-_GAP - 0.05, _x(n - 1) + 1 + _GAP + 0.05)
    ax.set_ylim(n + 0.05, -0.55)
    ax.set_aspect("equal")
    ax.axis("off")


def plot_ring_steps(steps: Sequence[RingStep], title: str | None = None, fade_incomplete: bool = False,
                    titles: Sequence[str] | None = None, ncols: int | None = None):
    """One panel per `RingStep` (from `fsdp_mini.course.ring_schedule`), left to right, `ncols` to a row
    (default: all in one row); the first panel of each row names the chunks.

    fade_incomplete: draw partial sums faint, for the all-gather phase of an all-reduce, where they are
    leftovers about to be overwritten. `titles` replaces the panels' default titles (`step_title`).
    """
    steps = list(steps)
    if not steps:
        raise ValueError("no steps to draw")
    if titles is not None and len(titles) != len(steps):
        raise ValueError(f"{len(titles)} titles for {len(steps)} steps")
    n = len(steps[0].state)
    ncols = len(steps) if ncols is None else max(1, min(ncols, len(steps)))
    nrows = -(-len(steps) // ncols)
    unit = 0.5  # inches per cell
    fig, axes = figure(width=ncols * unit * (n * (1 + _GAP) + _GAP) + 0.8,
                       height=nrows * unit * (n + 1.3) + (0.4 if title else 0.1),
                       ncols=ncols, nrows=nrows, squeeze=False)
    for i, ax in enumerate(axes.flat):
        if i >= len(steps):
            ax.axis("off")
            continue
        _panel(ax, steps[i], n, fade_incomplete, first=i % ncols == 0)
        ax.set_title(titles[i] if titles else step_title(steps[i], n), fontsize=TITLE)
    if title:
        fig.suptitle(title, fontsize=TITLE)
    fig.tight_layout()
    return fig
