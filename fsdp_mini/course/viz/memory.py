"""Memory bars: bytes per rank of parameters, gradients and optimizer state, stacked, one bar per setup."""
from __future__ import annotations

from fsdp_mini.course.language import tr
from fsdp_mini.course.viz import stacked_bars
from fsdp_mini.course.viz.style import SMALL

__all__ = ["STATE_COLORS", "LEDGER_COLORS", "plot_memory_bars", "plot_ledger_peaks"]

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
    ax.legend(fontsize=SMALL, frameon=False)
    fig.tight_layout()
    return fig


# the memory ledger's kinds (fsdp_mini.memory_ledger.KINDS), bottom up: model states, then what a step adds
LEDGER_COLORS = {"parameters": "#4C72B0", "gradients": "#DD8452", "optimizer state": "#55A868",
                 "gathered": "#C44E52", "prefetch": "#E8A0A2", "activations": "#8172B3"}


def _ledger_label(kind: str) -> str:
    return {"parameters": tr("parameters", "параметры"), "gradients": tr("gradients", "градиенты"),
            "optimizer state": tr("optimizer state", "состояние оптимизатора"),
            "gathered": tr("gathered", "собранные"), "prefetch": tr("prefetch", "предвыборка"),
            "activations": tr("activations", "активации")}[kind]


def _phase_label(phase: str) -> str:
    return {"forward": "forward", "backward": "backward",
            "optimizer step": tr("optimizer step", "шаг оптимизатора")}.get(phase, phase)


def plot_ledger_peaks(peaks: dict, title: str | None = None, unit: float = 1e3, unit_name: str | None = None):
    """Each phase's peak by kind, stacked: `peaks` is a `MemoryLedger.peaks` (phase -> snapshot with
    `.bytes[kind]`) or several of them, {setup label: peaks}, drawn side by side as "label\nphase".
    Shows which kind makes each phase's peak. Pass `title` through `tr(en, ru)`."""
    setups = peaks if peaks and not hasattr(next(iter(peaks.values())), "bytes") else {"": peaks}
    bars = {}
    for setup, by_phase in setups.items():
        for phase, snap in by_phase.items():
            bars[f"{setup}\n{_phase_label(phase)}" if setup else _phase_label(phase)] = dict(snap.bytes)
    unit_name = unit_name or tr("kB", "кБ")
    fig, ax, totals = stacked_bars(bars, {k: (c, _ledger_label(k)) for k, c in LEDGER_COLORS.items()}, unit, ".0f")
    ax.set_ylabel(tr(f"{unit_name} per rank", f"{unit_name} на ранг"))
    ax.set_ylim(top=max(totals) * 1.15)
    ax.tick_params(axis="x", labelsize=8)
    if title:
        ax.set_title(title)
    ax.legend(fontsize=SMALL, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig
