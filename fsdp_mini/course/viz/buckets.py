"""DDP's gradient buckets: which parameters fall in which bucket (the layout), and when each bucket's
AllReduce ran relative to backward (the timeline, from CommLog records)."""
from __future__ import annotations

import re

from fsdp_mini.course.language import tr
from fsdp_mini.course.viz import figure
from fsdp_mini.course.viz.style import SMALL

__all__ = ["PART_COLORS", "part_of", "short_name", "plot_bucket_layout", "plot_bucket_timeline"]

PART_COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C",
               "#CCB974", "#64B5CD")


def part_of(name: str) -> str:
    """The part of the model a parameter belongs to: "blocks.1" for "blocks.1.mlp.fc.weight", else its
    top-level module ("ln_f", "tok_emb")."""
    m = re.match(r"^(\w+\.\d+)\.", name)
    return m.group(1) if m else name.split(".")[0]


def short_name(name: str) -> str:
    """A label that fits inside a bar: "blocks.1.mlp.fc.weight" -> "mlp.fc.w"."""
    rest = name[len(part_of(name)) + 1:] if re.match(r"^\w+\.\d+\.", name) else name
    return re.sub(r"\.weight$", ".w", re.sub(r"\.bias$", ".b", rest))


def plot_bucket_layout(buckets, cap_mb: float | None = None, title: str | None = None, unit: float = 1e3,
                       unit_name: str | None = None, element_size: int | None = None):
    """One horizontal bar per bucket (bucket 0, the first AllReduce, on top), one segment per parameter,
    as wide as its bytes and coloured by the part of the model it belongs to; each bucket's total at the
    right, the cap as a dashed line. `buckets`: `fsdp_mini.parallel.ddp.plan_buckets(...)` (or any objects with
    `names`, `numels` and `nbytes`)."""
    from matplotlib.patches import Patch

    if not buckets:
        raise ValueError("no buckets to plot")
    unit_name = unit_name or tr("kB", "кБ")
    fig, ax = figure(width=7.5, height=0.5 * len(buckets) + 1.6)
    parts: dict[str, str] = {}
    widest = max(b.nbytes for b in buckets) / unit
    cap = None if cap_mb is None else cap_mb * 1024 * 1024 / unit
    xmax = max(widest, cap or 0) * 1.22
    for b in buckets:
        size = element_size or b.nbytes // max(1, sum(b.numels))
        left = 0.0
        for name, numel in zip(b.names, b.numels):
            part = part_of(name)
            if part not in parts:
                parts[part] = PART_COLORS[len(parts) % len(PART_COLORS)]
            width = numel * size / unit
            ax.barh(b.index, width, left=left, height=0.7, color=parts[part], edgecolor="white", linewidth=0.8)
            if width > 0.09 * xmax:
                ax.text(left + width / 2, b.index, short_name(name), ha="center", va="center", fontsize=SMALL,
                        color="white")
            left += width
        ax.text(left + 0.01 * xmax, b.index, f"{b.nbytes / unit:.3g} {unit_name}", va="center", fontsize=SMALL)
    if cap is not None:
        ax.axvline(cap, color="black", linestyle="--", linewidth=1)
        ax.text(cap, len(buckets) - 0.4, tr(" bucket cap", " предел бакета"), fontsize=SMALL, va="bottom")
    ax.legend(handles=[Patch(color=c, label=p) for p, c in parts.items()], fontsize=SMALL, frameon=False,
              loc="upper center", bbox_to_anchor=(0.5, -0.22 if len(buckets) < 4 else -0.12),
              ncol=min(len(parts), 5))
    ax.set_yticks([b.index for b in buckets])
    ax.set_ylim(len(buckets) - 0.35, -0.65)
    ax.set_xlim(0, xmax)
    ax.set_ylabel(tr("bucket (AllReduce order)", "бакет (порядок AllReduce)"))
    ax.set_xlabel(unit_name)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig


def plot_bucket_timeline(records, t0: float, backward_end: float, title: str | None = None):
    """Each bucket's AllReduce as a bar from when it was issued to when it was waited for (CommLog's
    `start` and `end`), in milliseconds since backward started (`t0`), over a shaded band for the time
    backward ran (up to `backward_end`), with a dotted line where the last bucket was issued, i.e. when
backward had produced the last gradient. Timings vary run to run: a lesson cell that draws this starts
    with `# NBVAL_IGNORE_OUTPUT`."""
    recs = sorted((r for r in records if r.label.startswith("bucket ")), key=lambda r: int(r.label.split()[1]))
    if not recs:
        raise ValueError("no CommLog records labelled 'bucket i'")
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    ms = lambda t: (t - t0) * 1e3  # noqa: E731
    fig, ax = figure(width=7.0, height=0.38 * len(recs) + 1.7)
    ax.axvspan(0, ms(backward_end), color="#E4E4E4")
    for r in recs:
        i = int(r.label.split()[1])
        ax.barh(i, ms(r.end) - ms(r.start), left=ms(r.start), height=0.6, color="#8172B3")
        ax.plot([ms(r.start)], [i], marker="|", color="black", markersize=10)
    last = max(ms(r.start) for r in recs)
    ax.axvline(last, color="#C44E52", linestyle=":", linewidth=1.5)
    handles = [Patch(color="#E4E4E4", label=tr("loss.backward() running", "идёт loss.backward()")),
               Patch(color="#8172B3", label=tr("AllReduce: issued → waited for", "AllReduce: запущен → дождались")),
               Line2D([], [], color="#C44E52", linestyle=":", label=tr("last bucket ready", "последний бакет готов"))]
    ax.legend(handles=handles, fontsize=SMALL, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3)
    ax.set_yticks([int(r.label.split()[1]) for r in recs])
    ax.set_ylim(len(recs) - 0.4, -0.6)
    ax.set_xlim(left=min(0.0, min(ms(r.start) for r in recs)))
    ax.set_xlabel(tr("ms since backward started", "мс от начала backward"))
    ax.set_ylabel(tr("bucket", "бакет"))
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig
