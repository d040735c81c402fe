"""Plots for the lessons, one module per kind of picture; labels follow `set_language`, text sizes the
course's type scale (`style`), and in a notebook figures are stored as `display` describes.

Every function takes plain data (numbers, CommLog records, layouts) and returns a matplotlib figure, so
a lesson ends the cell with `plt.show()` and stays deterministic: no randomness, no timestamps, fixed
sizes and colours (`RANK_COLORS[r]` is rank r's colour in every lesson).
"""
from __future__ import annotations

from fsdp_mini.course import language
from fsdp_mini.course.language import get_language, tr
from fsdp_mini.course.viz.display import use_in_notebook
from fsdp_mini.course.viz.style import RC, TEXT

__all__ = ["set_language", "get_language", "tr", "RANK_COLORS", "rank_color", "figure", "stacked_bars"]

RANK_COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C")


def set_language(lang: str) -> None:
    """Every lesson's first code cell: choose the language of labels and messages
    (`fsdp_mini.course.language.set_language`) and, in a notebook, store figures sharp and described
    (`display.use_in_notebook`), so that no lesson needs a cell of its own for that."""
    language.set_language(lang)
    use_in_notebook()


def rank_color(rank: int) -> str:
    return RANK_COLORS[rank % len(RANK_COLORS)]


def figure(width: float = 7.0, height: float = 3.2, ncols: int = 1, nrows: int = 1, **kwargs):
    """A figure with the course's fixed size and style: (fig, axes)."""
    import matplotlib.pyplot as plt

    plt.rcParams.update(RC)  # the course's type scale (style.py) for text a plot does not size itself
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, height), dpi=100, **kwargs)
    return fig, axes


def stacked_bars(bars: dict[str, dict[str, float]], layers: dict[str, tuple[str, str]], unit: float, fmt: str):
    """One stacked bar per label of `bars[label][layer]`, layers bottom up in the order of `layers`
    (layer -> (colour, legend label)), each bar's total written above it in format `fmt`.
    Returns (fig, ax, totals) for the caller to label."""
    fig, ax = figure(width=max(5.0, 1.3 * len(bars) + 2.5), height=3.4)
    labels = list(bars)
    bottoms = [0.0] * len(labels)
    for layer, (color, legend) in layers.items():
        heights = [bars[label].get(layer, 0) / unit for label in labels]
        ax.bar(labels, heights, bottom=bottoms, color=color, label=legend, width=0.6)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    for x, total in enumerate(bottoms):
        ax.text(x, total, format(total, fmt), ha="center", va="bottom", fontsize=TEXT)
    return fig, ax, bottoms
