"""How a lesson's figure is stored in its notebook: a sharp PNG that carries its own description.

Jupyter's inline backend saves a figure at the figure's own 100 dpi, so on a HiDPI screen (and on the
course site, where a figure can be zoomed) its text is blurred; and it stores no description, so the
site's `<img>` got nbconvert's placeholder alt text, in English on Russian pages too. `use_in_notebook`
replaces the inline backend's PNG formatter by `figure_png`: the PNG is rendered at `SCALE` times the
figure's pixel size, with `width`/`height` metadata that keep it at its 1x size on the page (what
IPython's "retina" format does), and with `alt` metadata, the figure's own title (`describe`), which
nbconvert writes into the `<img alt>`. The figure's text repr (`<Figure size 700x320 with 1 Axes>`,
which nbval compares) does not change: the figure's dpi stays 100.
"""
from __future__ import annotations

import base64
import io

from fsdp_mini.course.language import tr

__all__ = ["SCALE", "describe", "figure_png", "use_in_notebook"]

SCALE = 2  # device pixels per CSS pixel of a stored figure


def describe(fig) -> str:
    """A figure's description for a reader who cannot see it: "Figure: " and its titles (the figure's
    suptitle, else each axes' title), in the lesson's language."""
    titles = [fig.get_suptitle()] if fig.get_suptitle() else [ax.get_title() for ax in fig.axes]
    titles = [" ".join(t.split()) for t in titles if t and t.strip()]
    if not titles:  # no title: what the axes measure
        titles = [" ".join(f"{ax.get_ylabel()} / {ax.get_xlabel()}".split()).strip(" /") for ax in fig.axes]
        titles = [t for t in titles if t]
    return tr("Figure", "Рисунок") + (": " + "; ".join(titles) if titles else "")


def figure_png(fig) -> tuple[str, dict] | None:
    """The (base64 PNG, metadata) that a notebook stores for `fig`, as an IPython formatter returns it."""
    if not fig.axes and not fig.lines:
        return None  # an empty figure: nothing to show (as the inline backend does)
    buffer = io.BytesIO()
    dpi = fig.dpi * SCALE
    fig.canvas.print_figure(buffer, format="png", dpi=dpi, bbox_inches="tight",
                            facecolor=fig.get_facecolor(), edgecolor=fig.get_edgecolor())
    data = buffer.getvalue()
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")  # the IHDR chunk
    metadata = {"width": width // SCALE, "height": height // SCALE, "alt": describe(fig)}
    return base64.b64encode(data).decode("ascii"), metadata


def use_in_notebook() -> None:
    """In an IPython kernel, store figures with `figure_png`; elsewhere, do nothing."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None or not hasattr(shell, "display_formatter"):
        return
    import importlib

    import matplotlib
    from matplotlib.figure import Figure

    backend = matplotlib.get_backend()
    if backend.startswith("module://"):
        # Loading the inline backend registers its own PNG formatter (matplotlib_inline's
        # configure_inline_support): load it first, so that the formatter below is the one that stays.
        importlib.import_module(backend[len("module://"):])
    shell.display_formatter.formatters["image/png"].for_type(Figure, figure_png)
