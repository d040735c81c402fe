"""Loss curves side by side: lesson 06 draws fp32 against bf16 training, whose exact low digits depend on
the CPU's bf16 kernels, so the curves are shown as a picture (nbval compares text, not images)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from fsdp_mini.course.language import tr
from fsdp_mini.course.viz import figure, rank_color
from fsdp_mini.course.viz.style import SMALL

__all__ = ["plot_losses"]


def plot_losses(curves: Mapping[str, Sequence[float]], title: str | None = None):
    """One line per run: `curves[label][step]` = that step's loss. Pass labels and title through
    `tr(en, ru)`."""
    fig, ax = figure(width=6.0, height=3.0)
    for i, (label, losses) in enumerate(curves.items()):
        ax.plot(range(len(losses)), losses, marker="o", markersize=3, color=rank_color(i), label=label)
    ax.set_xlabel(tr("step", "шаг"))
    ax.set_ylabel(tr("loss", "лосс"))
    if title:
        ax.set_title(title)
    ax.legend(fontsize=SMALL, frameon=False)
    fig.tight_layout()
    return fig
