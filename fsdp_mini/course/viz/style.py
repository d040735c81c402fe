"""The course's one type scale for figures, so that text is the same size in every lesson's plots.

A figure is drawn at 100 dpi and shown on the site at most at its own pixel width (the content column
is wider than the course's figures, up to 9 inches): a point is then 100/72 CSS pixels, and the
smallest step, SMALL, is about 11 px on screen, the size of the site's small print. Three steps only:
TITLE for a figure's or a panel's title, TEXT for axis labels, legends and annotations a reader must
read, SMALL for tick labels and labels inside narrow marks. `RC` gives matplotlib's defaults the same
steps, for text a plot does not size itself.
"""
from __future__ import annotations

__all__ = ["TITLE", "TEXT", "SMALL", "RC"]

TITLE = 11.0
TEXT = 9.0
SMALL = 8.0

RC = {
    "font.size": TEXT,
    "figure.titlesize": TITLE,
    "axes.titlesize": TITLE,
    "axes.labelsize": TEXT,
    "xtick.labelsize": SMALL,
    "ytick.labelsize": SMALL,
    "legend.fontsize": SMALL,
    "legend.title_fontsize": TEXT,
}
