"""The bucket plots of lesson 03 (`fsdp_mini.course.viz.buckets`): a segment per parameter of the course's
GPT, a bar per bucket on the timeline, short names. Moved from tests/library/test_ddp.py: they test the
course's plots, not the DDP engine.
"""
import matplotlib
import pytest

from fsdp_mini.comm_log import CommRecord
from fsdp_mini.course.language import set_language
from fsdp_mini.course.models import GPT, GPTConfig
from fsdp_mini.course.viz.buckets import part_of, plot_bucket_layout, plot_bucket_timeline, short_name
from fsdp_mini.parallel.ddp import plan_buckets

matplotlib.use("Agg")

CFG = GPTConfig()
CAP = 0.02  # MiB: six buckets for the default GPT (99,000 bytes)


@pytest.fixture
def english_afterwards():
    yield
    set_language("en")


def test_layout_plot_has_a_segment_per_parameter_and_totals(english_afterwards):
    import matplotlib.pyplot as plt

    buckets = plan_buckets(GPT(CFG), CAP)
    fig = plot_bucket_layout(buckets, cap_mb=CAP, title="t", unit=1, unit_name="B")
    (ax,) = fig.axes
    assert len(ax.patches) == sum(len(b.names) for b in buckets)
    assert round(sum(p.get_width() for p in ax.patches)) == 99_000
    texts = [t.get_text() for t in ax.texts]
    assert all(f"{b.nbytes:.3g} B" in texts for b in buckets) and " bucket cap" in texts
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["ln_f", "blocks.1", "blocks.0", "pos_emb", "tok_emb"]
    plt.close(fig)
    set_language("ru")
    fig = plot_bucket_layout(buckets)
    assert fig.axes[0].get_ylabel() == "бакет (порядок AllReduce)" and fig.axes[0].get_xlabel() == "кБ"
    plt.close(fig)
    with pytest.raises(ValueError, match="no buckets"):
        plot_bucket_layout([])


def test_timeline_plot_draws_one_bar_per_bucket(english_afterwards):
    import matplotlib.pyplot as plt

    records = [CommRecord("all_reduce", "builtin", 8, 8, 2, 0, 10.0 + 0.001 * i, 10.01, f"bucket {i}")
               for i in (2, 0, 1)]
    fig = plot_bucket_timeline(records + [CommRecord("all_gather", "builtin", 8, 8, 2, 0, 10.0, 10.1, "x")],
                               t0=10.0, backward_end=10.012)
    (ax,) = fig.axes
    bars = sorted((round(p.get_y() + p.get_height() / 2), round(p.get_x(), 6), round(p.get_width(), 6))
                  for p in ax.patches if abs(p.get_height() - 0.6) < 1e-9)
    assert bars == [(0, 0.0, 10.0), (1, 1.0, 9.0), (2, 2.0, 8.0)]
    assert ax.get_xlabel() == "ms since backward started"
    plt.close(fig)
    with pytest.raises(ValueError, match="bucket i"):
        plot_bucket_timeline(records[:0], 0.0, 1.0)


def test_part_and_short_names():
    assert part_of("blocks.1.mlp.fc.weight") == "blocks.1" and part_of("ln_f.bias") == "ln_f"
    assert short_name("blocks.1.mlp.fc.weight") == "mlp.fc.w" and short_name("tok_emb.weight") == "tok_emb.w"
