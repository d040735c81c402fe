"""Lesson 12's picture of sequence parallelism: one block on tp ranks, each rank's sequence shard between the
TP regions, the collectives between stages (an AllGather into each column-parallel region, a ReduceScatter
out of each row-parallel one), in both languages."""
import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from fsdp_mini.course.language import set_language  # noqa: E402
from fsdp_mini.course.viz import rank_color  # noqa: E402
from fsdp_mini.course.viz.sequence_parallel import plot_sequence_parallel_block  # noqa: E402


@pytest.fixture
def russian_then_english():
    yield
    set_language("en")


@pytest.mark.parametrize("tp", [2, 4])
def test_each_rank_holds_its_own_positions_between_the_regions_and_the_collectives_alternate(tp,
                                                                                          russian_then_english):
    for lang, rank, title in (("en", "rank", "one block on"), ("ru", "ранг", "один блок на")):
        set_language(lang)
        ax = plot_sequence_parallel_block(tp).axes[0]
        texts = [t.get_text() for t in ax.texts]
        assert [t for t in texts if t in ("AG", "RS")] == ["AG", "RS", "AG", "RS"]  # enter, leave, enter, leave
        assert [t for t in texts if t.startswith(rank + " ")] == [f"{rank} {r}" for r in range(tp)]
        assert title in ax.get_title()
        width = 1.05 / tp  # a bar is the whole sequence; a rank's shard is 1/tp of it
        shards = [p for p in ax.patches if abs(p.get_width() - width) < 1e-9]
        for r in range(tp):  # three stages between the regions (ln_1, ln_2, the last residual add) per rank
            own = [p for p in shards if matplotlib.colors.to_hex(p.get_facecolor()) == rank_color(r).lower()]
            assert len(own) == 3 and len({round(p.get_x() % 1.55, 6) for p in own}) == 1
    assert len({round(p.get_x(), 6) for p in shards}) == 3 * tp  # each rank's shard at a different place
