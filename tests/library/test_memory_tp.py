"""`estimate_memory(..., tp=)`: tensor parallelism splits the parameters over tp ranks first (ceil(N / tp) per
TP rank), then the strategy shards that share over the world_size // tp data-parallel ranks; tp = 1 gives
exactly the numbers without it (the calculator, lesson 00 and lesson 12 rely on both)."""
import itertools

import pytest

from fsdp_mini.byte_format import format_bytes
from fsdp_mini.estimates import estimate_memory
from fsdp_mini.fsdp.strategy import ShardingStrategy as S
from fsdp_mini.fsdp.strategy_facts import ZERO1

EVERY = [S.NO_SHARD, ZERO1, S.SHARD_GRAD_OP, S.FULL_SHARD, S.HYBRID_SHARD, S._HYBRID_SHARD_ZERO2]
HYBRIDS = (S.HYBRID_SHARD, S._HYBRID_SHARD_ZERO2)


def ceil_div(a, b):
    return -(-a // b)


@pytest.mark.parametrize("strategy", EVERY)
def test_tp_1_gives_exactly_the_estimate_without_it(strategy, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    for n, world in itertools.product((0, 1, 999, 1_000_003, 7.5e9), (1, 2, 6, 64)):
        kwargs = {"shard_size": 2 if world % 2 == 0 else 1} if strategy in HYBRIDS else {}
        assert estimate_memory(n, world, strategy, tp=1, **kwargs) == estimate_memory(n, world, strategy, **kwargs)
    # and with the defaults left alone, the hybrids' one-node rule too
    if strategy in HYBRIDS:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
        assert estimate_memory(10_000, 16, strategy, tp=1) == estimate_memory(10_000, 16, strategy, shard_size=4)


def test_tp_1_keeps_zero_figure_1():
    shown = {s: format_bytes(estimate_memory(7.5e9, 64, s, tp=1).total)
             for s in (S.NO_SHARD, ZERO1, S.SHARD_GRAD_OP, S.FULL_SHARD)}
    assert shown == {S.NO_SHARD: "120.0 GB", ZERO1: "31.4 GB", S.SHARD_GRAD_OP: "16.6 GB", S.FULL_SHARD: "1.9 GB"}


def test_a_hand_count_with_tp_2():
    # 1001 parameters, 8 GPUs as 2 (TP) x 4 (DP), FULL_SHARD: a TP rank owns ceil(1001/2) = 501 parameters, a
    # data-parallel shard of them is ceil(501/4) = 126; bf16 weight and gradient, 12 bytes of Adam state
    e = estimate_memory(1001, 8, S.FULL_SHARD, tp=2)
    assert (e.params, e.grads, e.optimizer, e.total) == (126 * 2, 126 * 2, 126 * 12, 126 * 16)
    # SHARD_GRAD_OP keeps the TP rank's 501 parameters whole, shards gradients and optimizer state
    e = estimate_memory(1001, 8, S.SHARD_GRAD_OP, tp=2)
    assert (e.params, e.grads, e.optimizer) == (501 * 2, 126 * 2, 126 * 12)
    # NO_SHARD: each TP rank's share, replicated over the data-parallel ranks
    e = estimate_memory(1001, 8, S.NO_SHARD, tp=2)
    assert (e.params, e.grads, e.optimizer) == (501 * 2, 501 * 2, 501 * 12)
    # HYBRID_SHARD with shard groups of 2 of the 4 data-parallel ranks: ceil(501/2) = 251
    e = estimate_memory(1001, 8, S.HYBRID_SHARD, tp=2, shard_size=2)
    assert (e.params, e.grads, e.optimizer) == (251 * 2, 251 * 2, 251 * 12)


@pytest.mark.parametrize("strategy", [S.NO_SHARD, ZERO1, S.SHARD_GRAD_OP, S.FULL_SHARD])
def test_tp_is_the_estimate_of_a_tp_rank_share_over_the_data_parallel_ranks(strategy):
    for n, world, tp in itertools.product((1, 17, 1_000_003, 68_976_648_192), (8, 64, 4096), (2, 4, 8)):
        assert estimate_memory(n, world, strategy, tp=tp) == estimate_memory(ceil_div(n, tp), world // tp, strategy)


@pytest.mark.parametrize("hybrid", HYBRIDS)
def test_tp_with_a_hybrid_shards_inside_a_group_of_data_parallel_ranks(hybrid):
    for n, world, tp, shard in [(1_000_003, 64, 8, 2), (7e9, 64, 2, 4), (70e9, 512, 8, 64)]:
        expected = estimate_memory(ceil_div(int(n), tp), world // tp, hybrid, shard_size=shard)
        assert estimate_memory(n, world, hybrid, shard_size=shard, tp=tp) == expected


def test_tp_equal_to_the_world_leaves_nothing_to_shard():
    # 8 GPUs, all in one TP group: one data-parallel rank, so every strategy holds ceil(N / 8) of everything
    per_rank = {s: estimate_memory(7e9, 8, s, tp=8).total for s in (S.NO_SHARD, ZERO1, S.SHARD_GRAD_OP, S.FULL_SHARD)}
    assert set(per_rank.values()) == {ceil_div(7_000_000_000, 8) * 16}


def test_tp_x_fsdp_of_a_70b_model_on_512_gpus():
    # Lesson 12's layout: Llama-2-70B (68,976,648,192 parameters), TP 8 inside a node, FULL_SHARD over 64 nodes:
    # ceil(ceil(N / 8) / 64) parameters per rank, as FULL_SHARD alone over 512 GPUs, to a parameter or so
    n = 68_976_648_192
    both = estimate_memory(n, 512, "FULL_SHARD", tp=8)
    assert both.params == ceil_div(ceil_div(n, 8), 64) * 2
    assert abs(both.total - estimate_memory(n, 512, "FULL_SHARD").total) <= 16
    assert format_bytes(both.total) == "2.2 GB"


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(tp=0), "tp must be >= 1, got 0"),
        (dict(tp=-2), "tp must be >= 1, got -2"),
        (dict(tp=1.5), "tp must be an integer, got 1.5"),
        (dict(tp=True), "tp must be an integer, got True"),
        (dict(tp="8"), "tp must be an integer"),
        (dict(tp=3), "world_size=8 is not a multiple of tp=3"),
        (dict(tp=16), "world_size=8 is not a multiple of tp=16"),
        (dict(strategy=S.HYBRID_SHARD, tp=2), "with tp=2 a hybrid strategy needs shard_size, in data-parallel ranks"),
        (dict(strategy=S._HYBRID_SHARD_ZERO2, tp=2, shard_size=3),
         r"shard_size=3 must be a positive divisor of the 4 data-parallel ranks \(world_size 8 // tp 2\)"),
        (dict(strategy=S.HYBRID_SHARD, tp=2, shard_size=8), "shard_size=8 must be a positive divisor of the 4"),
        (dict(tp=2, shard_size=2), "shard_size applies to the hybrid strategies only, not to FULL_SHARD"),
    ],
)
def test_estimate_memory_rejects_a_bad_tp_degree(kwargs, match, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")  # the hybrid default must not hide the missing shard_size
    args = dict(num_params=1000, world_size=8, strategy=S.FULL_SHARD) | kwargs
    with pytest.raises(ValueError, match=match):
        estimate_memory(**args)


def test_a_float_tp_that_is_whole_is_accepted_as_num_params_is():
    assert estimate_memory(1000, 8, S.FULL_SHARD, tp=2.0) == estimate_memory(1000, 8, S.FULL_SHARD, tp=2)
