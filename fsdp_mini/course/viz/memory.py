"""Memory bars: bytes per rank of parameters, gradients and optimizer state, stacked, one bar per setup."""
from __future__ import annotations

from fsdp_mini.course.language import tr
from fsdp_mini.course.viz import stacked_bars

__all__ = ["STATE_COLORS", "plot_memory_bars"]

STATE_COLORS = {"params": "#4C72B0", "grads": "#DD8452", "optimizer": "#55A868", "unsharded_peak": "#C44E52"}


def _label(state: str) -> str:
    return {"params": tr("parameters", "параметры"), "grads": tr("gradients", "градиенты"),
            "optimizer": tr("optimizer state", "состояние оптимизатора"),
            "unsharded_peak": tr("gathered parameters (peak)", "собранные параметры (пик)")}[state]


def plot_memory_bars(bars: dict[str, dict[str, float]], title: str | None = None, unit: float = 1e9,
                     unit_name: str | None = None, states=("params", "grads", "optimizer"), log: bool = False):
    """`bars[label][state]` = bytes (e.g. from `estimate_memory(...)` fields or `FSDP.memory_stats()`);
    one stacked bar per label, each bar's total written above it. Pass `title` through `tr(en, ru)`."""
    unit_name = unit_name or tr("GB", "ГБ")
    fig, ax, bottoms = stacked_bars(bars, {s: (STATE_COLORS[s], _label(s)) for s in states}, unit, ".3g")
    ax.set_ylabel(tr(f"{unit_name} per rank", f"{unit_name} на ранг"))
    if log:
        ax.set_yscale("log")
    ax.set_ylim(top=max(bottoms) * (3 if log else 1.15))
    if title:
        ax.set_title(title)
    ax.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    return fig
