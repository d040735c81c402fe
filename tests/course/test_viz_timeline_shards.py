"""The timeline and shard-layout plots: what they draw follows from their input, labels follow the
language, and `unit_layouts` plans exactly the flat parameters that FSDP builds."""
import matplotlib

matplotlib.use("Agg")  # tests only: notebooks keep the inline backend

import matplotlib.pyplot as plt
import pytest
import torch

from fsdp_mini import FSDP, CommRecord, launch
from fsdp_mini.fsdp.flat_param import FlatLayout
from fsdp_mini.course.models import GPT, Block, GPTConfig
from fsdp_mini.course.trace import MemoryEvent, Span
from fsdp_mini.course.viz import set_language
from fsdp_mini.course.viz.shards import PAD_COLOR, describe_pieces, plot_flat_layout, unit_layouts
from fsdp_mini.course.viz.timeline import (KIND_COLORS, OP_COLORS, comm_lanes, plot_gathered_memory, plot_timeline,
                                           plot_timelines, plot_tradeoff, short_label)


@pytest.fixture(autouse=True)
def english_and_closed():
    set_language("en")
    yield
    set_language("en")
    plt.close("all")


def _rec(op, label, start, end, rank=0):
    return CommRecord(op, "builtin", 8, 4, 2, rank, start, end, label)


RECORDS = [_rec("all_gather", "root", 0.000, 0.002), _rec("all_gather", "blocks.0", 0.001, 0.004),
           _rec("reduce_scatter", "blocks.0", 0.005, 0.009), _rec("reduce_scatter", "root", 0.006, 0.010),
           _rec("all_gather", "root", 0.000, 0.002, rank=1)]
SPANS = [Span(0, "root", "forward", 0.002, 0.003, "tok_emb"), Span(0, "blocks.0", "backward", 0.004, 0.005, "blocks.0"),
         Span(1, "root", "forward", 0.002, 0.003, "tok_emb")]


def _bars(ax):
    return [p for p in ax.patches if isinstance(p, matplotlib.patches.Rectangle)]


# --- timeline -----------------------------------------------------------------------------------------


def test_short_labels():
    assert [short_label(x) for x in ("blocks.3", "root", "layers.12 (frozen)", "encoder")] == ["b3", "root", "l12", "encoder"]


def test_overlapping_collectives_get_separate_lanes():
    rank0 = [r for r in RECORDS if r.rank == 0]
    assert comm_lanes(rank0) == [0, 1, 0, 1]  # root AG overlaps blocks.0 AG; the two RS overlap
    assert comm_lanes([]) == []
    sequential = [_rec("all_gather", "a", 0, 1), _rec("all_gather", "b", 1, 2), _rec("all_gather", "c", 2, 3)]
    assert comm_lanes(sequential) == [0, 0, 0]


def test_timeline_draws_one_bar_per_record_and_span_with_their_colours():
    fig = plot_timeline(RECORDS, SPANS, title="step")
    ax = fig.axes[0]
    bars = _bars(ax)
    assert len(bars) == len(RECORDS) + len(SPANS)
    colours = sorted(matplotlib.colors.to_hex(b.get_facecolor()) for b in bars)
    expected = sorted([OP_COLORS[r.op].lower() for r in RECORDS] + [KIND_COLORS[s.kind].lower() for s in SPANS])
    assert colours == expected
    widths = sorted(round(b.get_width(), 6) for b in bars)
    assert widths == sorted(round((x.end - x.start) * 1e3, 6) for x in RECORDS + SPANS)
    assert min(b.get_x() for b in bars) == 0.0  # time from the first event, in ms
    ticks = [t.get_text() for t in ax.get_yticklabels()]
    assert ticks == ["rank 1: comm", "rank 1: compute", "rank 0: comm", "rank 0: compute"]


def test_timelines_stack_panels_and_follow_the_language():
    set_language("ru")
    fig = plot_timelines({"a": (RECORDS, SPANS), "b": (RECORDS[:2], [])})
    assert len(fig.axes) == 2 and [ax.get_title(loc="left") for ax in fig.axes] == ["a", "b"]
    assert "ранг 0: обмен данными" in [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert "мс" in fig.axes[-1].get_xlabel()
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "forward" in legend and "AllGather" in legend  # Latin in Russian too (lessons/ru/STYLE.md)


def test_gathered_memory_plots_the_tracked_bytes_in_event_order():
    events = [MemoryEvent(0, "root", "alloc", 10, 10, 5.0), MemoryEvent(0, "b", "alloc", 30, 40, 1.0),
              MemoryEvent(0, "b", "free", 30, 10, 9.0), MemoryEvent(0, "root", "free", 10, 0, 2.0)]
    fig = plot_gathered_memory({"run": events}, unit=1, unit_name="B", marks={"root + b": 40})
    line = fig.axes[0].get_lines()[0]
    assert list(line.get_ydata()) == [0, 10, 40, 10, 0]  # not sorted by time: by event number
    assert fig.axes[0].get_ylim()[1] > 40


def test_tradeoff_has_two_groups_of_one_bar_per_setup():
    fig = plot_tradeoff({"FULL_SHARD": 99_000, "SHARD_GRAD_OP": 188_520}, {"FULL_SHARD": 367_560, "SHARD_GRAD_OP": 188_520},
                        calls={"FULL_SHARD": 9, "SHARD_GRAD_OP": 5})
    left, right = fig.axes
    assert [round(b.get_height(), 2) for b in _bars(left)] == [99.0, 188.52]
    assert [round(b.get_height(), 2) for b in _bars(right)] == [367.56, 188.52]
    assert any("9 calls" in t.get_text() for t in right.texts)


# --- shards -------------------------------------------------------------------------------------------


def test_plot_flat_layout_marks_shards_and_padding():
    padded = FlatLayout([("w",), ("b",)], [torch.Size([6]), torch.Size([3])], 4)  # 9 -> 12: padding 3
    exact = FlatLayout([("w",), ("b",)], [torch.Size([6]), torch.Size([3])], 3)
    fig = plot_flat_layout([padded, exact])
    for ax, layout in zip(fig.axes, (padded, exact)):
        dashed = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
        assert sorted(ln.get_xdata()[0] for ln in dashed) == [layout.shard_range(r)[0] for r in range(1, layout.n)]
        pads = [b for b in _bars(ax) if b.get_hatch()]
        assert len(pads) == (1 if layout.padding else 0)
        if pads:
            assert (pads[0].get_x(), pads[0].get_width()) == (layout.numel, layout.padding)
            assert matplotlib.colors.to_hex(pads[0].get_edgecolor()) == PAD_COLOR.lower()
        assert ax.get_xlim() == (0, layout.padded_numel)
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend == ["w", "b", "padding"]


def test_plot_flat_layout_strips_the_common_prefix():
    layout = unit_layouts(GPT(GPTConfig()), (Block,), 4)["blocks.0"]
    fig = plot_flat_layout(layout)
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend[0] == "ln_1.weight" and legend[-1] == "padding"


def test_describe_pieces_lists_each_piece_and_the_padding():
    layout = FlatLayout([("w",), ("b",)], [torch.Size([6]), torch.Size([3])], 4)  # shards of 3
    assert len(describe_pieces(layout, 1)) == 1 and "[    3,     6) of 6" in describe_pieces(layout, 1)[0]
    last = describe_pieces(layout, 3)
    assert last == ["padding                    3 elements"]
    set_language("ru")
    assert describe_pieces(layout, 3) == ["паддинг                    элементов: 3"]


def _engine_layouts():
    model = GPT(GPTConfig())
    model.blocks[0].ln_1.weight.requires_grad_(False)
    fsdp = FSDP(model, wrap=(Block,))
    return {h.label: h.layout.signature() for u in fsdp.units for h in u.handles}


def test_unit_layouts_are_the_engines_layouts(no_orphans):
    model = GPT(GPTConfig())
    model.blocks[0].ln_1.weight.requires_grad_(False)
    planned = {k: v.signature() for k, v in unit_layouts(model, (Block,), 3).items()}
    for engine in launch(_engine_layouts, 3, timeout=60):
        assert engine == planned
    assert list(planned) == ["root", "blocks.0", "blocks.0 (frozen)", "blocks.1"]


# --- the idealised step -------------------------------------------------------------------------------


def _lane(events, lane):
    return sorted((e for e in events if e.lane == lane), key=lambda e: e.start)


def test_ideal_step_is_the_recipe_on_two_lanes_and_prefetch_shortens_it():
    from fsdp_mini.course.viz.timeline import ideal_step

    off, on = ideal_step(False), ideal_step(True)
    for events in (off, on):
        for lane in ("comm", "compute"):  # one thing at a time on each lane
            bars = _lane(events, lane)
            assert all(a.end <= b.start for a, b in zip(bars, bars[1:]))
        comm = [(e.what, e.unit) for e in _lane(events, "comm")]
        assert sorted(comm) == sorted([("all_gather", 0), ("all_gather", 1)] * 2 + [("reduce_scatter", 0), ("reduce_scatter", 1)])
        assert [(e.what, e.unit) for e in _lane(events, "compute")] == [("forward", 0), ("forward", 1), ("backward", 1), ("backward", 0)]
        for c in _lane(events, "compute"):  # a unit computes only after an AllGather of it has arrived
            assert any(g.what == "all_gather" and g.unit == c.unit and g.end <= c.start for g in events)
    assert max(e.end for e in off) == 12.0 and max(e.end for e in on) == 9.0
    # without prefetch the backward AllGather of unit 0 queues behind unit 1's ReduceScatter
    assert [(e.what, e.unit) for e in _lane(off, "comm")][3:5] == [("reduce_scatter", 1), ("all_gather", 0)]
    assert ideal_step(True, units=3, gather=0.5) == ideal_step(True, units=3, gather=0.5)  # deterministic


def test_plot_ideal_step_draws_every_event_and_the_waits():
    from fsdp_mini.course.viz.timeline import ideal_step, plot_ideal_step

    fig = plot_ideal_step((False, True))
    assert len(fig.axes) == 2
    for ax, prefetch in zip(fig.axes, (False, True)):
        events = ideal_step(prefetch)
        solid = [b for b in _bars(ax) if not b.get_hatch()]
        assert sorted((round(b.get_x(), 6), round(b.get_width(), 6)) for b in solid) == \
            sorted((e.start, e.end - e.start) for e in events)
        colours = sorted(matplotlib.colors.to_hex(b.get_facecolor()) for b in solid)
        assert colours == sorted((OP_COLORS[e.what] if e.lane == "comm" else KIND_COLORS[e.what]).lower() for e in events)
        waits = sum(b.get_width() for b in _bars(ax) if b.get_hatch())
        compute = _lane(events, "compute")
        assert waits == compute[-1].end - sum(e.end - e.start for e in compute)  # idle time of the compute lane
        assert ax.get_title(loc="left").endswith(str(int(max(e.end for e in events))))
    set_language("ru")
    fig = plot_ideal_step()
    assert fig.axes[0].get_title(loc="left") == "без предвыборки: шаг длится 12"
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["обмен данными", "вычисления"]
    assert "вычисления ждут" in [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
