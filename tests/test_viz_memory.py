"""Memory bars: one stacked bar per setup, totals on top, labels in the chosen language."""
import matplotlib

matplotlib.use("Agg")

from fsdp_mini import estimate_memory  # noqa: E402
from fsdp_mini.course.language import set_language  # noqa: E402
from fsdp_mini.course.viz.memory import plot_memory_bars  # noqa: E402


def test_stacked_bars_and_labels_in_both_languages():
    bars = {s: vars(estimate_memory(int(7.5e9), 64, s)) for s in ("NO_SHARD", "ZERO1", "FULL_SHARD")}
    try:
        for lang, ylabel, legend in (("en", "GB per rank", "gradients"), ("ru", "ГБ на ранг", "градиенты")):
            set_language(lang)
            ax = plot_memory_bars(bars).axes[0]
            assert len(ax.patches) == 3 * 3
            assert ax.get_ylabel() == ylabel and legend in [t.get_text() for t in ax.get_legend().get_texts()]
            assert [t.get_text() for t in ax.texts] == ["120", "31.4", "1.88"]
    finally:
        set_language("en")
