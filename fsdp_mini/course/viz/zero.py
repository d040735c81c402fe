"""Bytes on the wire in one training step, stacked by collective: DDP's AllReduce beside ZeRO's two halves."""
from __future__ import annotations

from fsdp_mini.course.language import tr
from fsdp_mini.course.viz import stacked_bars
from fsdp_mini.course.viz.style import SMALL

__all__ = ["OP_COLORS", "plot_step_bytes", "sent_by_op"]

OP_COLORS = {"all_reduce": "#8172B3", "reduce_scatter": "#CCB974", "all_gather": "#64B5CD"}


def _label(op: str) -> str:
    return {"all_reduce": "AllReduce", "reduce_scatter": "ReduceScatter", "all_gather": "AllGather"}[op]


def sent_by_op(log) -> dict[str, int]:
    """Bytes this rank sent per collective (`"all_reduce"`, ...) in a `CommLog`, all impls together."""
    out: dict[str, int] = {}
    for record in log.records:
        out[record.op] = out.get(record.op, 0) + record.sent
    return out


def plot_step_bytes(bars: dict[str, dict[str, int]], title: str | None = None, unit: float = 1e3,
                    unit_name: str = "kB"):
    """`bars[label][op]` = bytes one rank sent through collective `op` in one step (e.g. `sent_by_op(log)`);
    one stacked bar per label, AllReduce at the bottom, each bar's total written above it."""
    unknown = {op for ops in bars.values() for op in ops} - set(OP_COLORS)
    if unknown:
        raise ValueError(f"unknown collectives {sorted(unknown)}; expected some of {list(OP_COLORS)}")
    used = {op: (color, _label(op)) for op, color in OP_COLORS.items() if any(op in b for b in bars.values())}
    fig, ax, bottoms = stacked_bars(bars, used, unit, ".4g")
    ax.set_ylabel(tr(f"{unit_name} sent per rank per step", f"{unit_name} отправлено рангом за шаг"))
    ax.set_ylim(top=max(bottoms + [1e-12]) * 1.18)
    if title:
        ax.set_title(title)
    ax.legend(fontsize=SMALL, frameon=False, loc="upper center", ncol=len(ax.get_legend_handles_labels()[1]))
    fig.tight_layout()
    return fig
