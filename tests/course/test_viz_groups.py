"""Pictures of groups and layouts: the grid of shard and replica groups, who holds which element of a
unit under fsdp_mini and FSDP2, and one step's bytes and time inside and across nodes."""
import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from fsdp_mini import estimate_memory  # noqa: E402
from fsdp_mini.course.cluster import Cluster, compare_strategies, step_communication  # noqa: E402
from fsdp_mini.course.language import set_language  # noqa: E402
from fsdp_mini.course.viz import rank_color  # noqa: E402
from fsdp_mini.course.viz.groups import (plot_grid, plot_shard_layouts, plot_shard_size_sweep, plot_step_comm,  # noqa: E402
                                         shard_segments)


@pytest.fixture
def russian_then_english():
    yield
    set_language("en")


def test_grid_draws_every_rank_in_its_colour_and_names_the_groups(russian_then_english):
    for lang, shard, replica, node in (("en", "shard group 1", "replica group", "node 1"),
                                       ("ru", "группа шардирования 1", "группа реплик", "узел 1")):
        set_language(lang)
        ax = plot_grid(4, 2, gpus_per_node=2).axes[0]
        texts = [t.get_text() for t in ax.texts]
        assert any(t.startswith(shard) and "[2, 3]" in t for t in texts)
        assert sum(t.startswith(replica) for t in texts) == 2 and any("[1, 3]" in t for t in texts)
        assert node in texts
        squares = [p for p in ax.patches if type(p).__name__ == "Rectangle" and p.get_width() < 0.7]
        colours = sorted(matplotlib.colors.to_hex(p.get_facecolor()) for p in squares)
        assert colours == sorted(rank_color(r).lower() for r in range(4))
    assert len([t for t in plot_grid(8, 4).axes[0].texts if "[1, 5]" in t.get_text()]) == 1  # columns


def test_segments_flat_pieces_cross_parameters_dim0_chunks_split_each_one():
    shapes = [(5, 2), (3,)]  # 13 elements
    assert shard_segments(shapes, 2, "flat") == [(0, 7, 0), (7, 13, 1), (13, 14, None)]
    # dim 0: rows [0, 3) and [3, 5) of the first, elements [0, 2) and [2, 3) of the second
    assert shard_segments(shapes, 2, "dim0") == [(0, 6, 0), (6, 10, 1), (10, 12, 0), (12, 13, 1)]
    # torch.chunk: 2 rows over 4 ranks leave ranks 2 and 3 without any
    assert shard_segments([(2, 3)], 4, "dim0") == [(0, 3, 0), (3, 6, 1)]
    with pytest.raises(ValueError):
        shard_segments(shapes, 2, "rows")


def test_layout_plot_has_both_rows_and_a_padding_entry(russian_then_english):
    set_language("ru")
    ax = plot_shard_layouts([("w", (5, 2)), ("b", (3,))], 2).axes[0]
    assert len(ax.patches) == 3 + 4
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["ранг 0", "ранг 1", "паддинг"]


def test_step_comm_splits_bytes_by_link_and_sets_networks_side_by_side(russian_then_english):
    rich = compare_strategies(Cluster(8, 8, 300e9, 50e9, 5e-6, 20e-6), 7e9)
    thin = compare_strategies(Cluster(8, 8, 300e9, 50e9 / 8, 5e-6, 20e-6), 7e9)
    for lang, legend in (("en", ["over NVLink", "over its network card"]),
                         ("ru", ["по NVLink", "через свою сетевую карту"])):
        set_language(lang)
        fig = plot_step_comm({"a card per GPU": rich, "a card per node": thin})
        left, right = fig.axes
        assert [t.get_text() for t in left.get_legend().get_texts()] == legend
        assert [t.get_text() for t in right.get_legend().get_texts()] == ["a card per GPU", "a card per node"]
        assert len(left.patches) == len(right.patches) == 2 * 3
        assert [t.get_text() for t in left.texts][::2] == [f"{s.sent / 1e9:.3g}" for s in rich.values()]
        assert [t.get_text() for t in left.texts][1::2] == [f"{s.sent_network / 1e9:.2g}" for s in rich.values()]
        assert [t.get_text() for t in right.texts] == [f"{s.seconds:.2g}" for net in (rich, thin)
                                                       for s in net.values()]


def test_shard_size_sweep_shows_memory_and_stacked_time_per_size(russian_then_english):
    sizes = (1, 2, 4, 8, 16)
    cluster = Cluster(2, 8, 300e9, 50e9, 5e-6, 20e-6)
    memory = [estimate_memory(7e9, 16, "HYBRID_SHARD", shard_size=s).total for s in sizes]
    steps = [step_communication(cluster, "HYBRID_SHARD", 7e9, shard_size=s) for s in sizes]
    set_language("ru")
    left, right = plot_shard_size_sweep(sizes, memory, steps, gpus_per_node=8).axes
    assert [t.get_text() for t in left.texts][:5] == ["112", "56", "28", "14", "7"]
    assert "один узел" in [t.get_text() for t in left.texts]
    assert len(right.patches) == 2 * len(sizes)
    assert [t.get_text() for t in right.get_xticklabels()] == [str(s) for s in sizes]


def test_who_holds_what_follows_the_strategy_facts():
    from fsdp_mini.course.viz.groups import who_holds_what

    table = who_holds_what(4, 2)
    assert list(table) == ["DDP", "ZeRO-1", "ZeRO-2", "FSDP", "HSDP"]
    assert [table[k]["group"] for k in table] == [1, 4, 4, 4, 2]
    parts = {k: tuple(round(e - s, 6) for s, e in (v["held"][3][st] for st in ("params", "grads", "optimizer")))
             for k, v in table.items()}
    assert parts == {"DDP": (1, 1, 1), "ZeRO-1": (1, 1, 0.25), "ZeRO-2": (1, 0.25, 0.25),
                     "FSDP": (0.25, 0.25, 0.25), "HSDP": (0.5, 0.5, 0.5)}
    assert table["HSDP"]["held"][0]["params"] == table["HSDP"]["held"][2]["params"] == (0.0, 0.5)  # replicas
    assert {table["FSDP"]["held"][r]["params"] for r in range(4)} == {(r / 4, (r + 1) / 4) for r in range(4)}
    assert table["DDP"]["travels"] == [("all_reduce", "grads", 1, "replica", 1.0)]
    assert ("all_gather", "params", 2, "shard", 1.0) in table["FSDP"]["travels"]
    assert ("all_gather", "params", 1, "shard", 1.0) in table["ZeRO-2"]["travels"]
    assert table["HSDP"]["travels"][-1] == ("all_reduce", "grads", 1, "replica", 0.5)


def test_plot_who_holds_what_fills_each_ranks_share(russian_then_english):
    from fsdp_mini.course.viz.groups import plot_who_holds_what, who_holds_what

    table = who_holds_what(4, 2)
    fig = plot_who_holds_what(4, 2)
    assert [ax.get_title() for ax in fig.axes] == ["DDP", "ZeRO-1", "ZeRO-2", "FSDP", "HSDP (2×2)"]
    for ax, entry in zip(fig.axes, table.values()):
        filled = [p for p in ax.patches if matplotlib.colors.to_hex(p.get_facecolor()) != "#f2f2f2"]
        assert len(filled) == 4 * 3
        expected = sorted(round(e - s, 6) for rank in entry["held"].values() for s, e in rank.values())
        assert sorted(round(p.get_width(), 6) for p in filled) == expected
    assert [t.get_text() for t in fig.axes[3].texts[:3]] == ["1/4", "1/4", "1/4"]
    assert "2× AllGather" in fig.axes[3].texts[-1].get_text()
    set_language("ru")
    fig = plot_who_holds_what(4, 2)
    assert "между репликами" in fig.axes[4].texts[-1].get_text()
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["параметры", "градиенты", "состояние оптимизатора"]
