"""Lesson 12's plots: what they draw is what `fsdp_mini.course.scaling` computed, labels in the language."""
import matplotlib
import pytest

from fsdp_mini.course.language import set_language
from fsdp_mini.course.scaling import LLAMA2_70B, compare_plans, fsdp_scaling
from fsdp_mini.course.viz.scaling import plot_fsdp_scaling, plot_plans

matplotlib.use("Agg")


@pytest.fixture(autouse=True)
def english_afterwards():
    yield
    set_language("en")


def _texts(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts + ax.get_legend().get_texts()]


def test_the_scaling_plot_draws_the_rows_and_marks_where_hiding_stops():
    import matplotlib.pyplot as plt

    rows = fsdp_scaling(LLAMA2_70B.block_params)
    fig = plot_fsdp_scaling(rows)
    left, right = fig.axes
    assert list(left.lines[0].get_ydata()) == [r.tokens_per_gpu for r in rows]
    assert list(left.lines[1].get_ydata()) == [r.tokens_to_hide for r in rows]
    stop = next(r.gpus for r in rows if not r.hides)
    assert list(left.lines[2].get_xdata()) == [stop, stop]  # the vertical mark
    assert list(right.lines[1].get_ydata()) == [r.latency_s * 1e3 for r in rows]
    assert any(f"{stop:,}" in t for t in _texts(fig))
    plt.close(fig)
    set_language("ru")
    fig = plot_fsdp_scaling(rows)
    assert any("больше не скрывают" in t for t in _texts(fig)) and fig.axes[0].get_xlabel() == "GPU"
    plt.close(fig)


def test_the_plans_plot_draws_hollow_markers_for_plans_that_do_not_fit():
    import matplotlib.pyplot as plt

    rows = compare_plans()
    models = list(dict.fromkeys(r.model for r in rows))
    fig = plot_plans(rows, models)
    assert [ax.get_title() for ax in fig.axes] == models
    hollow = [line for ax in fig.axes for line in ax.lines if line.get_markerfacecolor() == "none"]
    assert len(hollow) == len({(r.model, r.plan) for r in rows if not r.fits})
    plt.close(fig)


def test_the_plans_plot_has_one_legend_under_the_panels():
    """Lesson 12's figure at site size: one legend for both panels, outside them, one entry per plan."""
    import matplotlib.pyplot as plt

    rows = compare_plans()
    models = list(dict.fromkeys(r.model for r in rows))
    fig = plot_plans(rows, models)
    assert all(ax.get_legend() is None for ax in fig.axes) and len(fig.legends) == 1
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels[:-1] == list(dict.fromkeys(r.plan for r in rows))
    plt.close(fig)
