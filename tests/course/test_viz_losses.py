"""Lesson 06's loss curves: one line per run with its values, labels in the lesson's language."""
import matplotlib.pyplot as plt

from fsdp_mini.course.language import set_language
from fsdp_mini.course.viz.losses import plot_losses


def test_one_line_per_run_with_its_losses_and_russian_labels():
    try:
        set_language("ru")
        fig = plot_losses({"fp32": [4.1, 3.9, 3.7], "bf16": [4.1, 3.95]}, title="лоссы")
        (ax,) = fig.axes
        assert [list(line.get_ydata()) for line in ax.lines] == [[4.1, 3.9, 3.7], [4.1, 3.95]]
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["fp32", "bf16"]
        assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) == ("шаг", "лосс", "лоссы")
        plt.close(fig)
    finally:
        set_language("en")
