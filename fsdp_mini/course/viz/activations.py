"""Lesson 11's pictures: activation bytes (formula beside measurement), what checkpointing trades, and
when a unit's AllGather hides behind the previous unit's forward."""
from __future__ import annotations

from fsdp_mini.course.language import tr
from fsdp_mini.course.viz import figure
from fsdp_mini.course.viz.style import SMALL

__all__ = ["plot_activation_agreement", "plot_checkpoint_tradeoff", "plot_hiding"]

_COLORS = {"megatron": "#8C8C8C", "formula": "#4C72B0", "measured": "#DD8452"}


def plot_activation_agreement(rows: list[dict]):
    """One group of bars per setting: Korthikanti et al.'s formula as written (at 4 bytes a value), the
    formula for the course's GPT, and what `SavedActivations` measured. `rows[i]` has the setting's "b", "s",
    "h" and its bytes per layer: "megatron_fp32", "our_formula", "measured_bytes". Log scale: the s^2 term
    dwarfs the rest."""
    fig, ax = figure(width=7.5, height=3.4)
    width = 0.27
    names = {"megatron": tr("Megatron's formula as written (fp32)", "формула Megatron как есть (fp32)"),
             "formula": tr("formula for the course's GPT", "формула для GPT курса"),
             "measured": tr("measured (SavedActivations)", "измерено (SavedActivations)")}
    columns = {"megatron": "megatron_fp32", "formula": "our_formula", "measured": "measured_bytes"}
    for k, (key, column) in enumerate(columns.items()):
        xs = [i + (k - 1) * width for i in range(len(rows))]
        ax.bar(xs, [r[column] / 1e6 for r in rows], width=width, color=_COLORS[key], label=names[key])
    labels = [f"b={r['b']} s={r['s']} h={r['h']}" for r in rows]
    ax.set_xticks(range(len(rows)), labels, fontsize=SMALL)
    ax.set_yscale("log")
    ax.set_ylabel(tr("MB per layer", "МБ на слой"))
    ax.set_title(tr("Activation memory of one transformer layer", "Память активаций одного слоя трансформера"))
    ax.legend(fontsize=SMALL, frameon=False)
    fig.tight_layout()
    return fig


def plot_checkpoint_tradeoff(labels: list[str], saved_bytes: list[float], step_ms: list[float]):
    """Two panels over checkpointing setups: activation bytes saved in forward, and step time."""
    fig, (left, right) = figure(width=8.0, height=3.0, ncols=2)
    left.bar(labels, [b / 1e6 for b in saved_bytes], color=_COLORS["formula"], width=0.6)
    left.set_ylabel(tr("MB saved for backward", "МБ, сохранено для backward"))
    left.set_title(tr("Activation memory", "Память активаций"))
    right.bar(labels, step_ms, color=_COLORS["measured"], width=0.6)
    right.set_ylabel(tr("ms per step (fastest run)", "мс на шаг (лучший запуск)"))
    right.set_title(tr("Step time (forward + backward)", "Время шага (forward + backward)"))
    for ax in (left, right):
        ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    return fig


def plot_hiding(cases: list[dict]):
    """One line per case: a unit's forward time against tokens per GPU, with the AllGather it must hide
    as a horizontal line in the same colour and the crossing point marked. `cases[i]` has "label",
    "tokens" (list), "forward_ms" (list), "gather_ms", "needed" (the crossing)."""
    fig, ax = figure(width=7.5, height=3.4)
    colors = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3")
    for case, color in zip(cases, colors):
        ax.plot(case["tokens"], case["forward_ms"], color=color, label=case["label"])
        ax.axhline(case["gather_ms"], color=color, linestyle=":", linewidth=1)
        ax.plot([case["needed"]], [case["gather_ms"]], "o", color=color)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(tr("tokens per GPU per micro-batch", "токенов на GPU в микробатче"))
    ax.set_ylabel(tr("ms", "мс"))
    ax.set_title(tr("A unit's forward (solid) against the next unit's AllGather (dotted)",
                    "Forward юнита (сплошная) и AllGather следующего юнита (пунктир)"))
    ax.legend(fontsize=SMALL, frameon=False)
    fig.tight_layout()
    return fig
