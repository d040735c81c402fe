"""Lesson 12's picture of sequence parallelism: the shards of one sequence flowing through a transformer block
on `tp` ranks. Between the TP regions (LayerNorm, residual add) each rank holds its 1/tp of the positions; an
AllGather of the sequence enters each column-parallel region (every rank needs every position), a
ReduceScatter leaves each row-parallel one (add the partial sums, keep one's own positions): the two halves
of the AllReduce plain TP runs there. Plain numbers in, the same figure on every run."""
from __future__ import annotations

from fsdp_mini.course.language import tr
from fsdp_mini.course.viz import figure, rank_color
from fsdp_mini.course.viz.style import SMALL, TEXT, TITLE

__all__ = ["plot_sequence_parallel_block"]

_WHOLE = "#B8C2D1"  # a tensor every rank holds whole (all positions)
_PARTIAL = "#E8E8E8"  # a partial sum: every position, but only this rank's share of the sum


def plot_sequence_parallel_block(tp: int = 2):
    """One block on `tp` ranks, one row per rank, left to right: what each rank holds of the (batch, seq,
    hidden) activation at each stage, as a bar of the sequence (coloured segment: this rank's positions;
    grey: every position, whole; light grey: every position, a partial sum), and the collective between
    stages (AG = AllGather along the sequence, RS = ReduceScatter along it)."""
    from matplotlib.patches import Rectangle

    stages = [  # (label, what a rank holds: "mine" | "whole" | "partial")
        (tr("LayerNorm\n(ln_1)", "LayerNorm\n(ln_1)"), "mine"),
        (tr("attention\n(its heads)", "внимание\n(свои\nголовы)"), "whole"),
        (tr("attn.proj\n(partial\nsums)", "attn.proj\n(частичные\nсуммы)"), "partial"),
        (tr("+ residual,\nLayerNorm\n(ln_2)", "+ остаток,\nLayerNorm\n(ln_2)"), "mine"),
        (tr("mlp.fc\n(its\nfeatures)", "mlp.fc\n(свои\nпризнаки)"), "whole"),
        (tr("mlp.proj\n(partial\nsums)", "mlp.proj\n(частичные\nсуммы)"), "partial"),
        (tr("+ residual", "+ остаток"), "mine"),
    ]
    arrows = ["AG", "", "RS", "AG", "", "RS"]  # between stage i and i + 1
    step, bar_w, bar_h = 1.55, 1.05, 0.42
    fig, ax = figure(width=9.0, height=0.8 * tp + 2.2)
    for s, (label, held) in enumerate(stages):
        x = s * step
        ax.text(x + bar_w / 2, tp - 0.35, label, ha="center", va="bottom", fontsize=SMALL)
        for r in range(tp):
            y = tp - 1 - r
            ax.add_patch(Rectangle((x, y - bar_h / 2), bar_w, bar_h, facecolor="white", edgecolor="#888888",
                                   linewidth=0.8))
            if held == "mine":
                seg = bar_w / tp
                ax.add_patch(Rectangle((x + r * seg, y - bar_h / 2), seg, bar_h, facecolor=rank_color(r),
                                       edgecolor="none"))
            else:
                ax.add_patch(Rectangle((x, y - bar_h / 2), bar_w, bar_h, edgecolor="none",
                                       facecolor=_WHOLE if held == "whole" else _PARTIAL, hatch=None if held == "whole"
                                       else "///"))
    for s, op in enumerate(arrows):
        x0, x1 = s * step + bar_w + 0.04, (s + 1) * step - 0.04
        for r in range(tp):
            y = tp - 1 - r
            ax.annotate("", xy=(x1, y), xytext=(x0, y),
                        arrowprops=dict(arrowstyle="-|>", color="#C44E52" if op else "#555555",
                                        linewidth=1.6 if op else 0.9))
        if op:
            ax.text((x0 + x1) / 2, -0.62, op, ha="center", va="center", fontsize=TEXT, color="#C44E52",
                    fontweight="bold")
    for r in range(tp):
        ax.text(-0.12, tp - 1 - r, tr(f"rank {r}", f"ранг {r}"), ha="right", va="center", fontsize=TEXT,
                color=rank_color(r), fontweight="bold")
    legend = [(rank_color(0), None, tr("this rank's 1/tp of the positions", "свои 1/tp позиций")),
              (_WHOLE, None, tr("all positions, whole", "все позиции, целиком")),
              (_PARTIAL, "///", tr("all positions, a partial sum", "все позиции, частичная сумма"))]
    for i, (color, hatch, text) in enumerate(legend):
        x = i * 3.3
        ax.add_patch(Rectangle((x, -1.25), 0.35, 0.25, facecolor=color, hatch=hatch, edgecolor="#888888",
                               linewidth=0.6))
        ax.text(x + 0.45, -1.125, text, ha="left", va="center", fontsize=SMALL)
    ax.text((len(stages) - 1) * step + bar_w, -1.55, tr("AG = AllGather, RS = ReduceScatter, both along the "
                                                       "sequence (dim 1)", "AG = AllGather, RS = ReduceScatter, "
                                                       "оба по последовательности (измерение 1)"),
            ha="right", va="center", fontsize=SMALL, color="#444444")
    ax.set_xlim(-1.1, (len(stages) - 1) * step + bar_w + 0.1)
    ax.set_ylim(-1.75, tp + 0.45)
    ax.axis("off")
    ax.set_title(tr(f"Sequence parallelism: one block on {tp} ranks", f"Параллелизм по последовательности: "
                    f"один блок на {tp} рангах"), fontsize=TITLE)
    return fig
