"""Plots for the lessons, one module per kind of picture; labels follow `set_language`.

Every function takes plain data (numbers, CommLog records, layouts) and returns a matplotlib figure, so
a lesson ends the cell with `plt.show()` and stays deterministic: no randomness, no timestamps, fixed
sizes and colours (`RANK_COLORS[r]` is rank r's colour in every lesson).
"""
from __future__ import annotations

from fsdp_mini.language import get_language, set_language, tr

__all__ = ["set_language", "get_language", "tr", "RANK_COLORS", "rank_color", "figure"]

RANK_COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C")


def rank_color(rank: int) -> str:
    return RANK_COLORS[rank % len(RANK_COLORS)]


def figure(width: float = 7.0, height: float = 3.2, ncols: int = 1, nrows: int = 1, **kwargs):
    """A figure with the course's fixed size and style: (fig, axes)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=(width, height), dpi=100, **kwargs)
    return fig, axes
