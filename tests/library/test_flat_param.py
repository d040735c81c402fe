"""The flat buffer: layout arithmetic, shards that tile it, pieces that reassemble every parameter once,
and flatten / unflatten_views that round-trip values and share storage. Pure tensor logic, no processes."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from fsdp_mini.fsdp.flat_param import FlatLayout, ParamSlot, Piece, flatten, unflatten_views

# Shape lists chosen to cover: one scalar, a single parameter, several of mixed rank, a tiny bias next to
# a matrix, a zero-element parameter in the middle, and numels that are prime (never divisible by n > 1).
SHAPE_SETS = {
    "scalar": [()],
    "one_vector": [(7,)],
    "docstring_example": [(6,), (3,)],
    "mixed_ranks": [(2, 3), (4,), (), (1, 1, 5)],
    "matrix_and_bias": [(5, 5), (5,)],
    "with_empty": [(3,), (0,), (2, 2)],
    "prime_total": [(11,), (2,)],  # 13 elements
}
NS = [1, 2, 3, 4, 5, 7, 16, 40]  # includes n = 1 and n far above every numel here (padding-only shards)


def _names(k: int) -> list[tuple[str, ...]]:
    return [(f"p{i}",) for i in range(k)]


def _layout(shapes, n):
    return FlatLayout(_names(len(shapes)), [torch.Size(s) for s in shapes], n)


CASES = [pytest.param(shapes, n, id=f"{key}-n{n}") for (key, shapes), n in itertools.product(SHAPE_SETS.items(), NS)]


# --- FlatLayout -------------------------------------------------------------------------------


@pytest.mark.parametrize("shapes, n", CASES)
def test_layout_arithmetic(shapes, n):
    layout = _layout(shapes, n)
    numels = [math.prod(s) for s in shapes]  # math.prod(()) == 1: a scalar has one element
    total = sum(numels)
    # Independent ceil, in integers. A layout with zero elements still has shard_numel 1.
    expected_shard = max(1, (total + n - 1) // n)
    assert layout.n == n
    assert layout.numel == total
    assert layout.shard_numel == expected_shard
    assert layout.padded_numel == expected_shard * n
    assert layout.padding == expected_shard * n - total
    assert 0 <= layout.padding < max(n, 1) or total == 0
    assert layout.padded_numel % n == 0 and layout.padded_numel >= total
    # parameters sit back to back, in order, starting at 0
    offsets = [sum(numels[:i]) for i in range(len(numels))]
    assert [p.offset for p in layout.params] == offsets
    assert [p.numel for p in layout.params] == numels
    assert [p.shape for p in layout.params] == [torch.Size(s) for s in shapes]
    assert all(isinstance(p.shape, torch.Size) for p in layout.params)
    assert [p.names for p in layout.params] == _names(len(shapes))
    assert f"n={n}" in repr(layout) and f"padding={layout.padding}" in repr(layout)


@pytest.mark.parametrize("shapes, n", CASES)
def test_shard_ranges_tile_the_padded_buffer(shapes, n):
    layout = _layout(shapes, n)
    ranges = [layout.shard_range(r) for r in range(n)]
    assert ranges[0][0] == 0 and ranges[-1][1] == layout.padded_numel
    assert all(hi - lo == layout.shard_numel for lo, hi in ranges)  # equal shards
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))  # no gap, no overlap
    covered = [0] * layout.padded_numel
    for lo, hi in ranges:
        for i in range(lo, hi):
            covered[i] += 1
    assert covered == [1] * layout.padded_numel


@pytest.mark.parametrize("shapes, n", CASES)
def test_pieces_reassemble_every_parameter_exactly_once(shapes, n):
    layout = _layout(shapes, n)
    # seen[p][k]: how many shards claim element k of parameter p
    seen = [[0] * p.numel for p in layout.params]
    # owner[i]: which (param, element) each position of the padded buffer holds, or None for padding
    owner = [None] * layout.padded_numel
    for idx, p in enumerate(layout.params):
        for k in range(p.numel):
            owner[p.offset + k] = (idx, k)
    index = {id(p): i for i, p in enumerate(layout.params)}
    for r in range(n):
        lo, hi = layout.shard_range(r)
        pieces = layout.pieces(r)
        assert all(isinstance(pc, Piece) and isinstance(pc.param, ParamSlot) for pc in pieces)
        # in parameter order, and laid out left to right inside the shard without overlap
        order = [index[id(pc.param)] for pc in pieces]
        assert order == sorted(order) and len(set(order)) == len(order)
        end_in_shard = 0
        for pc in pieces:
            assert 0 <= pc.start < pc.end <= pc.param.numel
            assert pc.numel == pc.end - pc.start
            assert pc.shard_offset >= end_in_shard
            end_in_shard = pc.shard_offset + pc.numel
            assert end_in_shard <= layout.shard_numel
            for k in range(pc.start, pc.end):
                g = lo + pc.shard_offset + (k - pc.start)  # where the piece says the element is
                assert owner[g] == (index[id(pc.param)], k)
                seen[index[id(pc.param)]][k] += 1
        # every non-padding position of this shard is claimed by some piece
        claimed = sum(pc.numel for pc in pieces)
        assert claimed == sum(1 for i in range(lo, hi) if owner[i] is not None)
        # a shard lying wholly in the padding holds no pieces
        if lo >= layout.numel:
            assert pieces == []
    assert all(count == [1] * len(count) for count in seen)


@pytest.mark.parametrize("n", [2, 5, 9])
def test_n_above_numel_gives_padding_only_shards(n):
    layout = _layout([(2,)], n)
    assert layout.shard_numel == 1 and layout.padded_numel == n and layout.padding == n - 2
    assert [len(layout.pieces(r)) for r in range(n)] == [1, 1] + [0] * (n - 2)


def test_single_scalar_parameter():
    layout = _layout([()], 3)
    assert layout.numel == 1 and layout.shard_numel == 1 and layout.padded_numel == 3
    (piece,) = layout.pieces(0)
    assert (piece.start, piece.end, piece.shard_offset) == (0, 1, 0)
    assert layout.pieces(1) == layout.pieces(2) == []
    t = torch.tensor(2.5)
    flat = flatten([t], layout)
    assert flat.tolist() == [2.5, 0.0, 0.0]
    (view,) = unflatten_views(flat, layout)
    assert view.shape == torch.Size([]) and view.item() == 2.5


def test_n_equal_one_has_one_shard_without_padding():
    shapes = [(2, 3), (4,)]
    layout = _layout(shapes, 1)
    assert layout.padding == 0 and layout.shard_range(0) == (0, 10)
    assert [(pc.start, pc.end, pc.shard_offset) for pc in layout.pieces(0)] == [(0, 6, 0), (0, 4, 6)]


def test_tied_names_are_kept_together():
    layout = FlatLayout([("emb.weight", "head.weight"), ("b",)], [torch.Size([3, 2]), torch.Size([2])], 2)
    assert layout.params[0].names == ("emb.weight", "head.weight")
    assert layout.numel == 8  # a tied tensor is stored once


@pytest.mark.parametrize("n", [0, -1, -7])
def test_bad_n_is_a_value_error(n):
    with pytest.raises(ValueError, match="number of shards"):
        _layout([(2,)], n)


@pytest.mark.parametrize("names, shapes", [([], []), ([("a",)], []), ([("a",), ("b",)], [torch.Size([1])])])
def test_empty_or_mismatched_layout_is_a_value_error(names, shapes):
    with pytest.raises(ValueError, match="at least one parameter"):
        FlatLayout(names, shapes, 2)


@pytest.mark.parametrize("rank", [-1, 3, 100])
def test_shard_rank_out_of_range(rank):
    layout = _layout([(5,)], 3)
    with pytest.raises(ValueError, match="out of range"):
        layout.shard_range(rank)
    with pytest.raises(ValueError, match="out of range"):
        layout.pieces(rank)


def test_signature_is_equal_for_equal_layouts_and_differs_otherwise():
    base = FlatLayout([("a",), ("b",)], [torch.Size([2, 3]), torch.Size([4])], 2)
    same = FlatLayout([("a",), ("b",)], [torch.Size([2, 3]), torch.Size([4])], 2)
    assert base.signature() == same.signature()
    hash(base.signature())  # usable as a dict key / comparable across ranks
    variants = {
        "shape, same numel": FlatLayout([("a",), ("b",)], [torch.Size([3, 2]), torch.Size([4])], 2),
        "shape, other numel": FlatLayout([("a",), ("b",)], [torch.Size([2, 3]), torch.Size([5])], 2),
        "name": FlatLayout([("a",), ("c",)], [torch.Size([2, 3]), torch.Size([4])], 2),
        "tied name": FlatLayout([("a", "z"), ("b",)], [torch.Size([2, 3]), torch.Size([4])], 2),
        "order": FlatLayout([("b",), ("a",)], [torch.Size([4]), torch.Size([2, 3])], 2),
        "n": FlatLayout([("a",), ("b",)], [torch.Size([2, 3]), torch.Size([4])], 5),
    }
    for what, other in variants.items():
        assert other.signature() != base.signature(), what


# --- flatten / unflatten_views ------------------------------------------------------------------


def _tensors(shapes, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    # distinct non-zero values, so a misplaced element or a zero where data belongs cannot go unseen
    return [torch.rand(s, generator=g, dtype=torch.float64).add_(1 + i).to(dtype) for i, s in enumerate(shapes)]


@pytest.mark.parametrize("shapes, n", CASES)
def test_flatten_round_trip_and_zero_padding(shapes, n):
    layout = _layout(shapes, n)
    ts = _tensors(shapes)
    flat = flatten(ts, layout)
    assert flat.shape == (layout.padded_numel,) and flat.dtype == torch.float32
    expected = torch.cat([t.reshape(-1) for t in ts] + [torch.zeros(layout.padding)])
    assert torch.equal(flat, expected)
    assert torch.count_nonzero(flat[layout.numel:]) == 0
    views = unflatten_views(flat, layout)
    assert len(views) == len(ts)
    for v, t in zip(views, ts):
        assert v.shape == t.shape and torch.equal(v, t)
    # and each shard's pieces hold exactly the slices of the parameters they name
    for r in range(n):
        lo, hi = layout.shard_range(r)
        shard = flat[lo:hi]
        for pc in layout.pieces(r):
            t = ts[layout.params.index(pc.param)]
            assert torch.equal(shard[pc.shard_offset:pc.shard_offset + pc.numel], t.reshape(-1)[pc.start:pc.end])


def test_views_share_storage_with_the_flat_buffer():
    layout = _layout([(2, 3), (4,), ()], 3)
    flat = flatten(_tensors([(2, 3), (4,), ()]), layout)
    views = unflatten_views(flat, layout)
    for v, p in zip(views, layout.params):
        assert v.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()
        assert v.data_ptr() == flat.data_ptr() + p.offset * flat.element_size()
    # write through a view: the flat buffer changes at exactly that parameter's elements
    before = flat.clone()
    views[1][2] = -100.0
    changed = (flat != before).nonzero().flatten().tolist()
    assert changed == [layout.params[1].offset + 2] and flat[changed[0]] == -100.0
    # write the flat buffer: the views see it
    flat.zero_()
    assert all(torch.count_nonzero(v) == 0 for v in views)
    views[2].fill_(7.0)
    assert flat[layout.params[2].offset] == 7.0


def test_views_do_not_touch_the_padding():
    layout = _layout([(3,), (2,)], 4)  # numel 5, padded 8
    flat = torch.zeros(layout.padded_numel)
    for v in unflatten_views(flat, layout):
        v.fill_(1.0)
    assert flat.tolist() == [1.0] * layout.numel + [0.0] * layout.padding


def test_unflatten_accepts_an_unpadded_buffer_and_rejects_a_short_one():
    layout = _layout([(3,), (2,)], 4)
    ts = _tensors([(3,), (2,)])
    exact = torch.cat([t.reshape(-1) for t in ts])  # numel elements, no padding
    for v, t in zip(unflatten_views(exact, layout), ts):
        assert torch.equal(v, t)
    with pytest.raises(ValueError, match=f"{layout.numel - 1} elements.*needs {layout.numel}"):
        unflatten_views(exact[:-1], layout)


def test_none_entries_become_zeros():
    shapes = [(2,), (3,), (1, 2)]
    layout = _layout(shapes, 4)
    ts = _tensors(shapes, dtype=torch.float64)
    flat = flatten([ts[0], None, ts[2]], layout)
    assert flat.dtype == torch.float64  # taken from the first tensor that is not None
    views = unflatten_views(flat, layout)
    assert torch.equal(views[0], ts[0]) and torch.equal(views[2], ts[2])
    assert torch.count_nonzero(views[1]) == 0
    assert torch.count_nonzero(flat[layout.numel:]) == 0


def test_leading_none_takes_dtype_from_a_later_tensor():
    layout = _layout([(2,), (2,)], 1)
    flat = flatten([None, torch.ones(2, dtype=torch.bfloat16)], layout)
    assert flat.dtype == torch.bfloat16 and flat.tolist() == [0.0, 0.0, 1.0, 1.0]


def test_all_none_is_float32_zeros_on_cpu():
    layout = _layout([(2,), (3,)], 2)
    flat = flatten([None, None], layout)
    assert flat.dtype == torch.float32 and flat.device.type == "cpu"
    assert flat.shape == (layout.padded_numel,) and torch.count_nonzero(flat) == 0


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_dtype_argument_casts(dtype):
    shapes = [(3,), (2, 2)]
    layout = _layout(shapes, 3)
    ts = _tensors(shapes)
    flat = flatten(ts, layout, dtype=dtype)
    assert flat.dtype == dtype
    for v, t in zip(unflatten_views(flat, layout), ts):
        assert v.dtype == dtype and torch.equal(v, t.to(dtype))


def test_dtype_argument_applies_to_all_none():
    layout = _layout([(2,)], 2)
    assert flatten([None], layout, dtype=torch.float16).dtype == torch.float16


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu")])
def test_device_argument(device):
    layout = _layout([(2,)], 2)
    flat = flatten([None], layout, device=device)
    assert flat.device == torch.device("cpu")
    flat = flatten([torch.ones(2)], layout, device=device)
    assert flat.device == torch.device("cpu") and flat.tolist() == [1.0, 1.0]


def test_flatten_copies_and_accepts_non_contiguous_inputs():
    layout = _layout([(3, 2)], 2)
    base = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    t = base.t()  # non-contiguous, shape (3, 2)
    assert not t.is_contiguous()
    flat = flatten([t], layout)
    assert torch.equal(unflatten_views(flat, layout)[0], t)
    flat.zero_()
    assert torch.equal(base, torch.arange(6, dtype=torch.float32).reshape(2, 3))  # input untouched


@pytest.mark.parametrize("bad", [torch.zeros(5), torch.zeros(3, 2), torch.zeros(6, 1), torch.zeros(())])
def test_wrong_shape_is_a_value_error_naming_the_parameter(bad):
    # (3, 2) has the right numel but the wrong shape: rejected as well
    layout = FlatLayout([("layer.bias",), ("layer.weight", "tied.weight")], [torch.Size([2]), torch.Size([2, 3])], 2)
    with pytest.raises(ValueError, match=r"layer\.weight: expected shape \(2, 3\)"):
        flatten([torch.zeros(2), bad], layout)
