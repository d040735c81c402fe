"""The ring schedule on paper matches the real ring collectives message by message; the ring and
bandwidth plots draw what they are given, with labels in the chosen language."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from fsdp_mini import collectives as C  # noqa: E402
from fsdp_mini import launch
from fsdp_mini.course import cost  # noqa: E402
from fsdp_mini.course.language import set_language  # noqa: E402
from fsdp_mini.course.ring_schedule import (Message, format_contributors, initial_state,  # noqa: E402
                                            ring_all_gather_schedule, ring_all_reduce_schedule,
                                            ring_reduce_scatter_schedule)
from fsdp_mini.course.viz.bandwidth import _ranks_ru, plot_bandwidth, plot_times, size_label  # noqa: E402
from fsdp_mini.course.viz.ring import DONE_COLOR, plot_ring_steps, step_title  # noqa: E402


@pytest.fixture
def english():
    yield
    set_language("en")
    plt.close("all")


# --- the schedule, on paper -------------------------------------------------------------------------

@pytest.mark.parametrize("n", range(1, 8))
def test_reduce_scatter_leaves_rank_r_with_the_full_chunk_r(n):
    steps = ring_reduce_scatter_schedule(n)
    assert len(steps) - 1 == cost.ring_steps("reduce_scatter", n)
    assert steps[0].phase == "start" and steps[0].state == initial_state(n)
    everyone = frozenset(range(n))
    final = steps[-1].state
    for r in range(n):
        assert final[r][r] == everyone
        if n > 1:
            assert [c == everyone for c in final[r]].count(True) == 1
    for st in steps[1:]:
        assert st.phase == "reduce_scatter"
        assert [(m.src, m.dst, m.chunk) for m in st.messages] == [
            (r, (r + 1) % n, (r - st.step - 1) % n) for r in range(n)]  # the docstring of ring_reduce_scatter
        assert sorted(m.dst for m in st.messages) == list(range(n))  # everyone receives exactly once


@pytest.mark.parametrize("n", range(1, 8))
def test_all_reduce_ends_with_every_chunk_everywhere(n):
    steps = ring_all_reduce_schedule(n)
    assert len(steps) - 1 == (cost.ring_steps("all_reduce", n) if n > 1 else 0)
    everyone = frozenset(range(n))
    assert all(cell == everyone for row in steps[-1].state for cell in row)
    for st in steps[1:]:
        if st.phase == "all_gather":
            assert [m.chunk for m in st.messages] == [(r - st.step) % n for r in range(n)]
            assert all(m.ranks == everyone for m in st.messages)
    sent_chunks = sum(len(st.messages) for st in steps)  # per rank: 2(n-1) chunks of S/n
    assert sent_chunks == n * 2 * (n - 1)


def test_plain_all_gather_and_bad_input():
    steps = ring_all_gather_schedule(3)
    assert steps[0].state[1] == (frozenset(), frozenset({1}), frozenset())
    assert steps[-1].state == tuple(tuple(frozenset({c}) for c in range(3)) for _ in range(3))
    with pytest.raises(ValueError):
        ring_all_gather_schedule(3, start=initial_state(2))
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError):
            ring_reduce_scatter_schedule(bad)
    assert format_contributors({2, 0}, 4) == "0+2"
    assert format_contributors(range(4), 4) == "Σ"
    assert format_contributors((), 4) == "" and format_contributors({0}, 1) == "0"


# --- the schedule against the real ring ---------------------------------------------------------------

def _spy_messages(kind):
    """On each rank: run a real ring op on inputs that encode who contributed to which chunk, with
    dist.isend intercepted; decode every sent tensor as (chunk, contributing ranks)."""
    import torch.distributed as dist

    n, r = dist.get_world_size(), dist.get_rank()
    seen = []
    real_isend = dist.isend

    def spy(tensor, *args, **kwargs):
        seen.append(tensor.clone())
        return real_isend(tensor, *args, **kwargs)

    dist.isend = spy
    try:
        # rank r's chunk j is [2^r, j+1]: a sum over ranks A is [bitmask of A, |A| (j+1)]
        mine = torch.tensor([[2.0 ** r, j + 1.0] for j in range(n)]).view(-1)
        if kind == "reduce_scatter":
            out = torch.empty(2)
            C.ring_reduce_scatter(out, mine)
            result = out
        elif kind == "all_gather":
            out = torch.empty(2 * n)
            C.ring_all_gather(out, mine.view(n, 2)[r].clone())
            result = out
        else:
            result = mine.clone()
            C.ring_all_reduce(result)
    finally:
        dist.isend = real_isend

    def decode(t):
        mask, scaled = int(t[0].item()), t[1].item()
        ranks = frozenset(k for k in range(n) if mask >> k & 1)
        return round(scaled / len(ranks)) - 1, ranks

    return [decode(t) for t in seen], result.tolist()


@pytest.mark.usefixtures("no_orphans")
@pytest.mark.parametrize("n", (2, 3, 4))
@pytest.mark.parametrize("kind", ("reduce_scatter", "all_gather", "all_reduce"))
def test_schedule_matches_every_message_of_the_real_ring(kind, n):
    schedule = {"reduce_scatter": ring_reduce_scatter_schedule, "all_gather": ring_all_gather_schedule,
                "all_reduce": ring_all_reduce_schedule}[kind](n)
    results = launch(_spy_messages, n, args=(kind,), timeout=60)
    for r, (messages, _) in enumerate(results):
        expected = [(m.chunk, m.ranks) for st in schedule[1:] for m in st.messages if m.src == r]
        assert messages == expected, f"rank {r}"
    everyone_mask = float(2 ** n - 1)
    if kind == "reduce_scatter":  # rank r's output: chunk r summed over everyone
        assert [res for _, res in results] == [[everyone_mask, n * (r + 1.0)] for r in range(n)]


def test_message_is_a_plain_tuple():
    m = Message(0, 1, 3, frozenset({0}))
    assert (m.src, m.dst, m.chunk, m.ranks) == (0, 1, 3, frozenset({0}))


# --- the plots ----------------------------------------------------------------------------------------

def test_ring_panels_cells_arrows_and_titles(english):
    steps = ring_reduce_scatter_schedule(4)
    fig = plot_ring_steps(steps, ncols=2, title="x")
    axes = fig.axes
    assert len(axes) == 4
    assert [ax.get_title() for ax in axes] == ["start"] + [f"ReduceScatter, step {s} of 3" for s in (1, 2, 3)]
    last = axes[3]
    texts = [t.get_text() for t in last.texts]
    assert texts.count("Σ") == 4 and "rank 3" in texts
    assert "chunk 0" in [t.get_text() for t in axes[2].texts]  # first panel of the second row
    assert "chunk 0" not in [t.get_text() for t in axes[1].texts]
    # 16 cells + 16 x 4 contribution squares, plus arrows: 3 plain and the wrap-around in two halves
    from matplotlib.colors import to_hex
    from matplotlib.patches import FancyArrowPatch, Rectangle
    cells = [p for p in last.patches if isinstance(p, Rectangle) and p.get_width() == 1]
    assert len(cells) == 16 and sum(to_hex(p.get_facecolor()) == DONE_COLOR.lower() for p in cells) == 4
    assert len([p for p in last.patches if isinstance(p, FancyArrowPatch)]) == 5
    assert len([p for p in axes[0].patches if isinstance(p, FancyArrowPatch)]) == 0

    ag = ring_all_gather_schedule(4, steps[-1].state)
    set_language("ru")
    fig = plot_ring_steps(ag, fade_incomplete=True)
    assert [ax.get_title() for ax in fig.axes] == ["после ReduceScatter"] + [
        f"AllGather, шаг {s} из 3" for s in (1, 2, 3)]
    assert "ранг 0" in [t.get_text() for t in fig.axes[0].texts]
    faded = [t for t in fig.axes[0].texts if t.get_alpha() == 0.3]
    assert len(faded) == 12  # everything but the four finished chunks
    assert step_title(ring_all_gather_schedule(2)[0], 2) == "начало"


def test_ring_plot_rejects_bad_input(english):
    with pytest.raises(ValueError):
        plot_ring_steps([])
    with pytest.raises(ValueError):
        plot_ring_steps(ring_reduce_scatter_schedule(3), titles=["a"])
    fig = plot_ring_steps(ring_reduce_scatter_schedule(3), ncols=2)  # 3 panels on a 2 x 2 grid
    assert sum(ax.axison for ax in fig.axes) == 0 and len(fig.axes) == 4


def test_times_lines_points_and_labels(english):
    sizes = [2 ** k for k in range(10, 21, 2)]
    lines = {f"n = {n}": [cost.ring_all_reduce(s, n, 1e-5, 1e10) for s in sizes] for n in (2, 8)}
    ax = plot_times(sizes, lines=lines, points={"n = 2": lines["n = 2"]}).axes[0]
    assert len(ax.lines) == 3 and ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert ax.lines[0].get_color() == ax.lines[2].get_color()  # one label, one colour
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["n = 2", "n = 8"]
    assert ax.get_ylabel() == "time, ms" and ax.get_xticklabels()[0].get_text() == "1 KiB"
    set_language("ru")
    ax = plot_times(sizes, points={"a": lines["n = 8"]}).axes[0]
    assert ax.get_ylabel() == "время, мс" and ax.get_xticklabels()[-1].get_text() == "1 МиБ"
    with pytest.raises(ValueError):
        plot_times(sizes)
    with pytest.raises(ValueError):
        plot_times(sizes, lines={"a": [1.0]})


def test_bandwidth_panels_from_benchmark_rows(english):
    rows = [{"size": s, "op": "all_reduce", "impl": impl, "world_size": 4, "seconds": t,
             "algbw": s / t, "busbw": s / t * 1.5}
            for s in (4096, 65536, 2 ** 20) for impl, t in (("builtin", 1e-3), ("ring", 2e-3))]
    fig = plot_bandwidth(rows)
    left, right = fig.axes
    assert len(left.lines) == len(right.lines) == 2
    assert list(left.lines[0].get_ydata()) == [4096 / 1e-3 / 1e9, 65536 / 1e-3 / 1e9, 2 ** 20 / 1e-3 / 1e9]
    assert list(right.lines[1].get_ydata()) == [s / 2e-3 * 1.5 / 1e9 for s in (4096, 65536, 2 ** 20)]
    assert left.get_ylabel() == "GB/s" and fig._suptitle.get_text() == "all_reduce, 4 ranks"
    assert left.get_yscale() == "log" and plot_bandwidth(rows, log=False).axes[0].get_yscale() == "linear"
    set_language("ru")
    fig = plot_bandwidth(rows)
    assert fig.axes[0].get_ylabel() == "ГБ/с" and fig._suptitle.get_text() == "all_reduce, 4 ранга"
    with pytest.raises(ValueError):
        plot_bandwidth(rows, op="all_gather")


def test_bandwidth_at_bus_factor_one_is_one_panel(english):
    """At 2 ranks busbw equals algbw: one panel that says so, not two identical ones."""
    rows = [{"size": s, "op": "all_reduce", "impl": "ring", "world_size": 2, "seconds": 1e-3,
             "algbw": s / 1e-3, "busbw": s / 1e-3} for s in (4096, 65536)]
    fig = plot_bandwidth(rows)
    assert len(fig.axes) == 1 and "algbw = busbw" in fig.axes[0].get_title()
    assert list(fig.axes[0].lines[0].get_ydata()) == [4096 / 1e-3 / 1e9, 65536 / 1e-3 / 1e9]
    rows[0]["busbw"] *= 1.5  # any difference: both panels again
    assert len(plot_bandwidth(rows).axes) == 2


def test_size_labels_and_russian_plurals(english):
    assert [size_label(s) for s in (512, 4096, 3 * 2 ** 19, 2 ** 30)] == ["512 B", "4 KiB", "1.5 MiB", "1 GiB"]
    assert [f"{n} {_ranks_ru(n)}" for n in (1, 2, 4, 5, 11, 12, 21, 22, 25, 111)] == [
        "1 ранг", "2 ранга", "4 ранга", "5 рангов", "11 рангов", "12 рангов", "21 ранг", "22 ранга",
        "25 рангов", "111 рангов"]
