"""Lesson 13's plot and printed tables: what they draw and print is what the planner computed, in the language."""
import matplotlib
import pytest

from fsdp_mini.course.language import set_language
from fsdp_mini.course.planner import GiB, Layout, get_gpu, get_model, plan
from fsdp_mini.course.planner.layout import Checkpointing
from fsdp_mini.course.viz.planning import layout_label, memory_parts, plot_memory_and_speed, show_plans, term_name

matplotlib.use("Agg")


@pytest.fixture(autouse=True)
def english_afterwards():
    yield
    set_language("en")


def _plans():
    model, gpu = get_model("llama3-8b"), get_gpu("h100-sxm")
    return [plan(model, gpu, Layout(gpus=8, seq=8192, local_batch=2, ac=ac)) for ac in Checkpointing]


def test_the_memory_parts_add_up_to_the_peak_reserved():
    for p in _plans():
        parts = memory_parts(p)
        assert len(parts) == 3 and all(nbytes >= 0 for _, nbytes in parts)
        assert sum(nbytes for _, nbytes in parts) == pytest.approx(p.memory.peak_reserved)


def test_the_plot_draws_each_plan_its_memory_and_its_speed():
    import matplotlib.pyplot as plt

    plans = _plans()
    fig = plot_memory_and_speed(plans, [ac.value for ac in Checkpointing])
    left, right = fig.axes
    widths = [bar.get_width() for bar in left.patches]
    assert len(widths) == 3 * len(plans)
    for i, p in enumerate(plans):
        assert sum(widths[3 * i:3 * i + 3]) == pytest.approx(p.memory.peak_reserved / GiB)
    speeds = [bar.get_width() for bar in right.patches]
    assert speeds == [p.time.tokens_per_s_per_gpu if p.memory.fits else 0 for p in plans]
    assert any("does not fit" in t.get_text() for t in right.texts)
    plt.close(fig)
    set_language("ru")
    fig = plot_memory_and_speed(plans, [ac.value for ac in Checkpointing])
    assert any("не помещается" in t.get_text() for t in fig.axes[1].texts)
    assert "ГиБ" in fig.axes[0].get_xlabel()
    plt.close(fig)


def test_every_planner_term_and_part_has_a_russian_name():
    """A term the planner adds later shows in English in the Russian lesson until it gets its name here."""
    p = _plans()[1]
    set_language("ru")
    for key in [*p.memory.terms, *p.time.parts, p.memory.peak_moment]:
        assert term_name(key) != key, key


def test_tables_and_labels(capsys):
    plans = _plans()
    show_plans(plans, [ac.value for ac in Checkpointing])
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 + len(plans) and f"{plans[0].memory.peak_reserved / GiB:.1f}" in out[1]
    shown = [" ".join(line.split()[2:-3]) for line in out[1:]]  # between the GiB and the last three numbers
    assert shown == [p.memory.fit_verdict for p in plans] and "undecided" in shown  # the band, not the count
    layout = Layout(gpus=256, seq=8192, local_batch=8, tp=4, sp=True, cp=2, dp_replicate=2)
    assert layout_label(layout) == "HSDP 2 × FSDP 16 × TP 4 + SP × CP 2"
