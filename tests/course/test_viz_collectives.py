"""The lesson-01 plots: per-rank cells before/after a collective, bytes per rank, predicted times."""
import matplotlib

matplotlib.use("Agg")  # tests only: the lessons keep the inline backend

import matplotlib.pyplot as plt
import pytest
from matplotlib.patches import Rectangle

from fsdp_mini.course.cost import predict
from fsdp_mini.course.language import set_language
from fsdp_mini.course.viz.collectives import (cell_sources, integers, plot_bytes_sent, plot_collective,
                                              plot_predicted_times)

BEFORE = [[1.0 * (r + 1), 2.0 * (r + 1), 3.0 * (r + 1)] for r in range(4)]
LABELS = {"en": ("before", "after", "rank 0", "ring"), "ru": ("до", "после", "ранг 0", "кольцо")}


@pytest.fixture(params=["en", "ru"])
def lang(request):
    set_language(request.param)
    yield request.param
    set_language("en")
    plt.close("all")


def _texts(ax):
    return [t.get_text() for t in ax.texts]


def test_integers_prints_integer_valued_floats_as_integers_and_keeps_none():
    assert integers([1.0, -2.0, 30.0]) == [1, -2, 30] and all(type(v) is int for v in integers([1.0]))
    assert integers(None) is None  # what reduce leaves on a non-destination rank
    with pytest.raises(ValueError, match="integer-valued"):
        integers([1.5])  # a fraction is refused, not rounded away


def test_cell_sources():
    assert cell_sources("broadcast", 4, 3, root=2) == [[2, 2, 2]] * 4
    assert cell_sources("reduce", 2, 1) == [[(0, 1)], [None]]
    assert cell_sources("all_reduce", 2, 2) == [[(0, 1)] * 2] * 2
    assert cell_sources("all_gather", 2, 4) == [[0, 0, 1, 1]] * 2
    with pytest.raises(ValueError):
        cell_sources("all_gather", 3, 4)
    with pytest.raises(ValueError):
        cell_sources("gather", 2, 2)


@pytest.mark.parametrize("op, after", [
    ("broadcast", [[1.0, 2.0, 3.0]] * 4),
    ("all_reduce", [[10.0, 20.0, 30.0]] * 4),
    ("reduce", [[10.0, 20.0, 30.0], None, None, None]),
    ("all_gather", [sum(BEFORE, [])] * 4),
])
def test_plot_collective_draws_one_labelled_cell_per_element(lang, op, after):
    fig = plot_collective(BEFORE, after, op)
    before_ax, after_ax = fig.axes
    assert _texts(before_ax) == [f"{v:g}" for row in BEFORE for v in row]
    expected = [f"{v:g}" for v in after[0]] * (1 if op == "reduce" else 4) + ["?"] * (9 if op == "reduce" else 0)
    assert _texts(after_ax) == expected
    # Rectangles: an owned cell is one fill + one outline, a sum over 4 ranks is 4 stripes + an outline,
    # an undefined "?" cell is one hatched square.
    assert len(before_ax.patches) == 12 * 2
    per_cell = 5 if op in ("all_reduce", "reduce") else 2
    assert len(after_ax.patches) == (3 * per_cell + 9 if op == "reduce" else len(expected) * per_cell)
    en_before, en_after, en_rank, _ = LABELS[lang]
    assert before_ax.get_title() == en_before and after_ax.get_title() == en_after
    assert [t.get_text() for t in before_ax.get_yticklabels()][0] == en_rank
    assert fig._suptitle.get_text().startswith(op)


def test_plot_bytes_sent_has_one_bar_per_rank_and_algorithm(lang):
    s = 4800
    sent = {"naive": [3 * s, s, s, s], "ring": [7200] * 4}
    fig = plot_bytes_sent(sent, nbytes=s)
    ax = fig.axes[0]
    bars = [p for p in ax.patches if isinstance(p, Rectangle)]
    assert len(bars) == 8
    assert sorted(b.get_height() for b in bars) == sorted(sent["naive"] + sent["ring"])
    assert "3 S" in _texts(ax) and _texts(ax).count("1.5 S") == 4
    assert [t.get_text() for t in ax.get_xticklabels()][0] == LABELS[lang][2]
    assert LABELS[lang][3] in [t.get_text() for t in ax.get_legend().get_texts()]


def test_plot_predicted_times_has_one_line_per_algorithm_and_panel(lang):
    ns = list(range(2, 65))
    panels = {f"S = {s}": {a: [predict("all_reduce", s, n, 1e-5, 25e9, a) for n in ns] for a in ("naive", "ring", "tree")}
              for s in (4096, 10**8)}
    fig = plot_predicted_times(ns, panels)
    assert len(fig.axes) == 2
    for ax, title in zip(fig.axes, panels):
        assert ax.get_title() == title and len(ax.lines) == 3
        assert LABELS[lang][3] in [t.get_text() for t in ax.get_legend().get_texts()]
        assert ax.get_yscale() == "log"
    assert "ms" in fig.axes[0].get_ylabel() if lang == "en" else "мс" in fig.axes[0].get_ylabel()
