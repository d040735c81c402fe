"""The alpha-beta model: checked through identities between algorithms, not against copied numbers."""
from __future__ import annotations

import math
import random

import pytest

from fsdp_mini.course.cost import (
    AlphaBeta,
    algbw,
    bus_factor,
    busbw,
    fit_alpha_beta,
    naive_all_reduce,
    predict,
    ring_all_gather,
    ring_all_reduce,
    ring_reduce_scatter,
    ring_steps,
    tree_all_reduce,
)

ALL_MODELS = [ring_all_reduce, ring_reduce_scatter, ring_all_gather, naive_all_reduce, tree_all_reduce]
RING_OPS = ["all_reduce", "reduce_scatter", "all_gather"]
S, ALPHA, B = 64e6, 5e-6, 100e9  # a 64 MB bucket on a 100 GB/s link with 5 us latency
GROUPS = [2, 3, 4, 7, 8, 64, 1000]


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-18)


@pytest.mark.parametrize("model", ALL_MODELS)
def test_one_rank_costs_nothing(model):
    assert model(S, 1, ALPHA, B) == 0.0


@pytest.mark.parametrize("n", GROUPS)
def test_ring_all_reduce_is_reduce_scatter_then_all_gather(n):
    rs, ag = ring_reduce_scatter(S, n, ALPHA, B), ring_all_gather(S, n, ALPHA, B)
    assert close(rs, ag)
    assert close(ring_all_reduce(S, n, ALPHA, B), rs + ag)


@pytest.mark.parametrize("op", RING_OPS)
@pytest.mark.parametrize("n", GROUPS)
def test_ring_time_is_steps_alpha_plus_bus_factor_bytes(op, n):
    expected = ring_steps(op, n) * ALPHA + bus_factor(op, n) * S / B
    assert close(predict(op, S, n, ALPHA, B), expected)


def test_ring_bandwidth_term_tends_to_2S_over_B_from_below():
    times = [ring_all_reduce(S, n, 0.0, B) for n in GROUPS]
    assert times == sorted(times) and all(t < 2 * S / B for t in times)
    assert math.isclose(ring_all_reduce(S, 10**6, 0.0, B), 2 * S / B, rel_tol=1e-5)


def test_naive_grows_linearly_in_n():
    times = [naive_all_reduce(S, n, ALPHA, B) for n in range(1, 20)]
    steps = [b - a for a, b in zip(times, times[1:])]
    assert all(close(step, steps[0]) for step in steps)
    assert close(steps[0], naive_all_reduce(S, 2, ALPHA, B))


def test_tree_grows_with_log2_n():
    one_level = tree_all_reduce(S, 2, ALPHA, B)
    for k in range(1, 11):
        assert close(tree_all_reduce(S, 2**k, ALPHA, B), k * one_level)
        # a partial level costs a full level: 2^k + 1 ranks need as many rounds as 2^(k+1)
        assert close(tree_all_reduce(S, 2**k + 1, ALPHA, B), tree_all_reduce(S, 2 ** (k + 1), ALPHA, B))


def test_two_ranks_tree_and_naive_are_the_same_exchange():
    assert close(tree_all_reduce(S, 2, ALPHA, B), naive_all_reduce(S, 2, ALPHA, B))


@pytest.mark.parametrize("n", [4, 8, 64])
def test_ring_wins_on_large_messages_and_loses_on_latency(n):
    large = {alg: predict("all_reduce", S, n, ALPHA, B, alg) for alg in ("ring", "naive", "tree")}
    assert large["ring"] < large["tree"] <= large["naive"]
    # empty messages: only latency counts, and the ring pays as many as the naive root
    assert close(ring_all_reduce(0, n, ALPHA, B), naive_all_reduce(0, n, ALPHA, B))
    assert tree_all_reduce(0, n, ALPHA, B) < ring_all_reduce(0, n, ALPHA, B)


@pytest.mark.parametrize(
    "op,algorithm,model",
    [
        ("all_reduce", "ring", ring_all_reduce),
        ("all_reduce", "naive", naive_all_reduce),
        ("all_reduce", "tree", tree_all_reduce),
        ("reduce_scatter", "ring", ring_reduce_scatter),
        ("all_gather", "ring", ring_all_gather),
    ],
)
def test_predict_dispatches(op, algorithm, model):
    assert predict(op, S, 8, ALPHA, B, algorithm) == model(S, 8, ALPHA, B)


@pytest.mark.parametrize("op", RING_OPS)
@pytest.mark.parametrize("n", GROUPS)
def test_busbw_of_a_latency_free_ring_is_the_link_bandwidth(op, n):
    seconds = predict(op, S, n, 0.0, B)
    assert math.isclose(busbw(op, S, n, seconds), B, rel_tol=1e-12)
    assert close(algbw(S, seconds) * seconds, S)


def test_bus_factor_at_one_rank_and_for_rooted_ops():
    assert [bus_factor(op, 1) for op in RING_OPS] == [0.0, 0.0, 0.0]
    for n in (1, 2, 8):
        for op in ("broadcast", "reduce"):
            assert busbw(op, S, n, 0.5) == algbw(S, 0.5)
    assert close(bus_factor("all_reduce", 8), bus_factor("reduce_scatter", 8) + bus_factor("all_gather", 8))


def model_times(op, n, alpha, bandwidth, sizes):
    return [predict(op, s, n, alpha, bandwidth) for s in sizes]


SIZES = [2.0**k for k in range(10, 31, 2)]


@pytest.mark.parametrize("op", RING_OPS)
@pytest.mark.parametrize("n", [2, 3, 8, 64])
@pytest.mark.parametrize("alpha,bandwidth", [(5e-6, 100e9), (30e-6, 12.5e9), (0.0, 1e9)])
def test_fit_recovers_the_model_exactly(op, n, alpha, bandwidth):
    fit = fit_alpha_beta(op, n, SIZES, model_times(op, n, alpha, bandwidth, SIZES))
    assert isinstance(fit, AlphaBeta)
    assert math.isclose(fit.alpha, alpha, rel_tol=1e-6, abs_tol=1e-12)
    assert math.isclose(fit.bandwidth, bandwidth, rel_tol=1e-9)


@pytest.mark.parametrize("op", RING_OPS)
def test_fit_is_robust_to_tiny_noise(op):
    rng = random.Random(0)
    times = [t * (1 + rng.uniform(-1e-4, 1e-4)) for t in model_times(op, 8, ALPHA, B, SIZES)]
    alpha, bandwidth = fit_alpha_beta(op, 8, SIZES, times)
    assert math.isclose(alpha, ALPHA, rel_tol=0.05)
    assert math.isclose(bandwidth, B, rel_tol=1e-3)


def test_fit_clamps_negative_latency_to_zero():
    # a constant negative offset makes the unconstrained intercept negative: no link has alpha < 0
    times = [t - 1e-6 for t in model_times("all_reduce", 8, 0.0, B, SIZES[3:])]
    fit = fit_alpha_beta("all_reduce", 8, SIZES[3:], times)
    assert fit.alpha == 0.0
    assert math.isclose(fit.bandwidth, B, rel_tol=1e-2)


@pytest.mark.parametrize("model", ALL_MODELS)
@pytest.mark.parametrize(
    "args,match",
    [
        ((S, 0, ALPHA, B), "n .* >= 1"),
        ((S, 2.0, ALPHA, B), "n .* integer"),
        ((S, True, ALPHA, B), "n .* integer"),
        ((-1, 2, ALPHA, B), "nbytes must be >= 0"),
        ((float("nan"), 2, ALPHA, B), "nbytes must be >= 0"),
        ((S, 2, -1e-6, B), "alpha must be >= 0"),
        ((S, 2, ALPHA, 0), "bandwidth must be > 0"),
    ],
)
def test_models_reject_bad_arguments(model, args, match):
    with pytest.raises(ValueError, match=match):
        model(*args)


def test_predict_rejects_unknown_op_and_algorithm():
    with pytest.raises(ValueError, match="unknown op 'broadcast'; valid: all_reduce"):
        predict("broadcast", S, 2, ALPHA, B)
    with pytest.raises(ValueError, match="unknown algorithm 'butterfly'; valid: ring, naive, tree"):
        predict("all_reduce", S, 2, ALPHA, B, "butterfly")
    with pytest.raises(ValueError, match="'tree' is modelled for all_reduce only"):
        predict("all_gather", S, 2, ALPHA, B, "tree")


def test_bandwidth_helpers_reject_bad_arguments():
    with pytest.raises(ValueError, match="unknown op 'all_to_all'"):
        bus_factor("all_to_all", 2)
    with pytest.raises(ValueError, match="n .* >= 1"):
        bus_factor("all_reduce", 0)
    with pytest.raises(ValueError, match="unknown op 'broadcast'"):
        ring_steps("broadcast", 2)
    with pytest.raises(ValueError, match="seconds must be > 0"):
        algbw(S, 0.0)
    with pytest.raises(ValueError, match="nbytes must be >= 0"):
        busbw("all_reduce", -1, 2, 1.0)


@pytest.mark.parametrize(
    "op,n,sizes,seconds,match",
    [
        ("broadcast", 2, SIZES, SIZES, "unknown op 'broadcast'"),
        ("all_reduce", 0, SIZES, SIZES, "n .* >= 1"),
        ("all_reduce", 1, SIZES, SIZES, "n must be >= 2 to fit"),
        ("all_reduce", 2, [1.0, 2.0], [1.0], "differ in length: 2 != 1"),
        ("all_reduce", 2, [-1.0, 2.0], [1.0, 2.0], "must all be >= 0"),
        ("all_reduce", 2, [1.0, 2.0], [1.0, -2.0], "must all be >= 0"),
        ("all_reduce", 2, [8.0, 8.0], [1.0, 2.0], "two distinct sizes"),
        ("all_reduce", 2, [1.0, 2.0], [3.0, 1.0], "times do not grow with size"),
    ],
)
def test_fit_rejects_bad_data(op, n, sizes, seconds, match):
    with pytest.raises(ValueError, match=match):
        fit_alpha_beta(op, n, sizes, seconds)
