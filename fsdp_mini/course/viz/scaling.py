"""Lesson 12's pictures: where FSDP alone stops hiding its AllGathers as the cluster grows, and how
FSDP, HSDP and TP x FSDP compare across cluster sizes (both from `fsdp_mini.course.scaling`)."""
from __future__ import annotations

from fsdp_mini.course.language import tr
from fsdp_mini.course.viz import figure
from fsdp_mini.course.viz.style import SMALL

__all__ = ["plot_fsdp_scaling", "plot_plans"]

PLAN_COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3")


def plot_fsdp_scaling(rows, title: str = ""):
    """Left: tokens each GPU gets (a fixed global batch over N GPUs) against the tokens its unit needs to
    hide the next AllGather, the first count that no longer hides marked. Right: one AllGather's time split
    into the ring's latency term, (N - 1) alpha, and its bandwidth term. `rows`: `fsdp_scaling`'s."""
    gpus = [r.gpus for r in rows]
    fig, (left, right) = figure(width=9.5, height=4.0, ncols=2)
    left.plot(gpus, [r.tokens_per_gpu for r in rows], "o-", color=PLAN_COLORS[0],
              label=tr("tokens each GPU gets", "токенов достаётся GPU"))
    left.plot(gpus, [r.tokens_to_hide for r in rows], "s--", color=PLAN_COLORS[3],
              label=tr("tokens that hide the AllGather", "токенов, чтобы спрятать AllGather"))
    stop = next((r for r in rows if not r.hides), None)
    if stop is not None:
        left.axvline(stop.gpus, color="#8C8C8C", linewidth=1, linestyle=":")
        # at the foot of the mark, to its left: the curves run higher there
        left.annotate(tr(f"stops hiding: {stop.gpus:,} GPUs", f"вычисления больше не скрывают его: {stop.gpus} GPU"),
                      (stop.gpus, 0.04), xycoords=("data", "axes fraction"), xytext=(-4, 0),
                      textcoords="offset points", ha="right", va="bottom", fontsize=SMALL)
    left.set_ylabel(tr("tokens per GPU", "токенов на GPU"))
    # legends under the panels, where they cover no line
    left.legend(fontsize=SMALL, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    right.plot(gpus, [r.bandwidth_s * 1e3 for r in rows], "o-", color=PLAN_COLORS[2],
               label=tr("bandwidth term", "слагаемое пропускной способности"))
    right.plot(gpus, [r.latency_s * 1e3 for r in rows], "s--", color=PLAN_COLORS[4],
               label=tr("latency term, (N - 1) alpha", "слагаемое задержки, (N − 1) α"))
    right.set_ylabel(tr("ms per AllGather", "мс на один AllGather"))
    right.legend(fontsize=SMALL, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(tr("GPUs", "GPU"))
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_plans(rows, models: list[str], ylabel: str | None = None, ymax: float = 105):
    """One panel per model: the share of each step spent on the model's FLOPs (compute / step, or the MFU of
    `planner_comparison`'s rows, with `ylabel` saying which) for every plan across cluster sizes; a plan that
    does not fit a GPU is drawn hollow, one that cannot run (fewer sequences than GPUs) not at all. One legend
    for all panels, below them, so that no line hides behind it. `rows`: `compare_plans`'s or
    `planner_comparison`'s."""
    fig, axes = figure(width=9.5, height=3.9, ncols=len(models), sharey=True)
    axes = list(axes) if len(models) > 1 else [axes]
    plans = list(dict.fromkeys(r.plan for r in rows))
    for ax, model in zip(axes, models):
        for plan, color in zip(plans, PLAN_COLORS):
            mine = [r for r in rows if r.model == model and r.plan == plan and getattr(r, "runs", True)]
            gpus = [r.gpus for r in mine]
            ax.plot(gpus, [100 * r.efficiency for r in mine], "-", color=color, linewidth=1, alpha=0.5)
            fits = [r for r in mine if r.fits]
            no = [r for r in mine if not r.fits]
            ax.plot([r.gpus for r in fits], [100 * r.efficiency for r in fits], "o", color=color)
            if no:
                ax.plot([r.gpus for r in no], [100 * r.efficiency for r in no], "o", mfc="none", color=color)
        ax.set_xscale("log", base=2)
        ax.set_title(model)
        ax.set_xlabel(tr("GPUs", "GPU"))
        ax.set_ylim(0, ymax)
    axes[0].set_ylabel(ylabel or tr("compute / step, %", "вычисления / шаг, %"))
    # one legend for all panels, under them: a colour per plan, and what a hollow marker means
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], marker="o", color=color, linewidth=1, label=plan)
               for plan, color in zip(plans, PLAN_COLORS)]
    handles.append(Line2D([], [], marker="o", mfc="none", color="#8C8C8C", linestyle="none",
                          label=tr("hollow: does not fit", "пустой маркер: не помещается")))
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=SMALL, frameon=False)
    return fig
