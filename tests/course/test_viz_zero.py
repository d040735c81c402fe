"""The communication plot of lesson 04: stacked bytes per collective, labels in the lesson's language."""
import matplotlib
import pytest

from fsdp_mini.comm_log import CommLog, CommRecord
from fsdp_mini.course.language import set_language
from fsdp_mini.course.viz.zero import OP_COLORS, plot_step_bytes, sent_by_op

BARS = {"DDP": {"all_reduce": 96}, "ZeRO-1": {"reduce_scatter": 48, "all_gather": 48}}


@pytest.fixture(autouse=True)
def english_afterwards():
    yield
    set_language("en")


def _close(fig):
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_one_stacked_bar_per_label_with_totals():
    fig = plot_step_bytes(BARS, title="one step", unit=1, unit_name="B")
    (ax,) = fig.axes
    heights = sorted(round(p.get_height(), 6) for p in ax.patches if p.get_height() > 0)
    assert heights == [48, 48, 96]
    assert [t.get_text() for t in ax.texts] == ["96", "96"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["DDP", "ZeRO-1"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["AllReduce", "ReduceScatter", "AllGather"]
    assert ax.get_title() == "one step"
    assert isinstance(fig, matplotlib.figure.Figure)
    _close(fig)


def test_only_the_collectives_present_are_in_the_legend():
    fig = plot_step_bytes({"ZeRO-1": {"reduce_scatter": 5, "all_gather": 5}})
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["ReduceScatter", "AllGather"]
    _close(fig)


def test_labels_follow_the_language():
    set_language("ru")
    fig = plot_step_bytes(BARS)
    assert "отправлено" in fig.axes[0].get_ylabel()
    _close(fig)
    set_language("en")
    fig = plot_step_bytes(BARS)
    assert fig.axes[0].get_ylabel() == "kB sent per rank per step"
    _close(fig)


def test_unknown_collective_is_a_value_error():
    with pytest.raises(ValueError, match="unknown collectives"):
        plot_step_bytes({"x": {"broadcast": 1}})


def test_sent_by_op_sums_per_collective_over_impls():
    log = CommLog()
    for op, impl, sent in [("reduce_scatter", "ring", 3), ("all_gather", "builtin", 4), ("reduce_scatter", "builtin", 5)]:
        log.records.append(CommRecord(op, impl, 10, sent, 4, 0, 0.0, 1.0))
    assert sent_by_op(log) == {"reduce_scatter": 8, "all_gather": 4}
    assert set(sent_by_op(log)) <= set(OP_COLORS)
