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


def test_ledger_peaks_stack_each_kind_per_phase_in_both_languages():
    from fsdp_mini.course.viz.memory import plot_ledger_peaks
    from fsdp_mini.memory_ledger import KINDS, LedgerSnapshot

    def snap(phase, base):
        return LedgerSnapshot(phase, {k: base * (i + 1) for i, k in enumerate(KINDS)})

    peaks = {p: snap(p, b) for p, b in (("forward", 1000), ("backward", 2000), ("optimizer step", 500))}
    try:
        for lang, ylabel, legend, phase in (("en", "kB per rank", "activations", "optimizer step"),
                                            ("ru", "кБ на ранг", "активации", "шаг оптимизатора")):
            set_language(lang)
            ax = plot_ledger_peaks(peaks).axes[0]
            assert len(ax.patches) == 3 * len(KINDS) and ax.get_ylabel() == ylabel
            assert legend in [t.get_text() for t in ax.get_legend().get_texts()]
            assert [t.get_text() for t in ax.texts] == ["21", "42", "10"]
            assert phase in [t.get_text() for t in ax.get_xticklabels()]
            two = plot_ledger_peaks({"a": peaks, "b": peaks}).axes[0]
            assert len(two.patches) == 6 * len(KINDS) and two.get_xticklabels()[0].get_text().startswith("a\n")
    finally:
        set_language("en")
