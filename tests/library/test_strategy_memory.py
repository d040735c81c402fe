"""Sharding strategies and per-rank memory: the ZeRO paper's Figure 1, and identities between strategies."""
from __future__ import annotations

import enum
import inspect

import pytest

import fsdp_mini.fsdp.strategy as strategy_module
from fsdp_mini.byte_format import format_bytes
from fsdp_mini.estimates import MemoryEstimate, estimate_memory
from fsdp_mini.fsdp.strategy import ShardingStrategy, as_strategy, is_hybrid, reshard_after_forward, shard_group_size
from fsdp_mini.fsdp.strategy_facts import MODEL_STATES, ZERO1, all_gathers_per_step, facts, sharded_states
from fsdp_mini.fsdp import strategy_facts

S = ShardingStrategy
HYBRIDS = [(S.HYBRID_SHARD, S.FULL_SHARD), (S._HYBRID_SHARD_ZERO2, S.SHARD_GRAD_OP)]  # (hybrid, its stage)


# --- strategy ---------------------------------------------------------------------------------


def test_names_mirror_pytorch():
    fsdp = pytest.importorskip("torch.distributed.fsdp")
    assert [m.name for m in ShardingStrategy] == [m.name for m in fsdp.ShardingStrategy]
    assert all(as_strategy(theirs) is S[theirs.name] for theirs in fsdp.ShardingStrategy)


def test_every_member_has_a_docstring():
    # enum members cannot carry __doc__, so the docstring is the string literal right after each one
    source = inspect.getsource(strategy_module)
    for member in ShardingStrategy:
        after = source.split(f"    {member.name} = enum.auto()\n", 1)[1]
        assert after.lstrip().startswith('"""'), member.name


@pytest.mark.parametrize("member", list(ShardingStrategy))
def test_as_strategy_accepts_members_and_names_in_any_case(member):
    assert as_strategy(member) is member
    for spelling in (member.name, member.name.lower(), member.name.title()):
        assert as_strategy(spelling) is member


def test_as_strategy_accepts_a_foreign_enum_by_name():
    Foreign = enum.Enum("Foreign", ["NO_SHARD"])
    assert as_strategy(Foreign.NO_SHARD) is S.NO_SHARD


@pytest.mark.parametrize("bad", ["full", "", 1, None, enum.Enum("Foreign", ["DDP"]).DDP])
def test_as_strategy_rejects_unknown_values_listing_valid_names(bad):
    with pytest.raises(ValueError, match="unknown sharding strategy .*valid names: FULL_SHARD, SHARD_GRAD"):
        as_strategy(bad)


@pytest.mark.parametrize("zero1", [ZERO1, "zero1"])
def test_as_strategy_rejects_zero1_pointing_to_fsdp_mini_zero(zero1):
    with pytest.raises(ValueError, match="ZeRO-1 is not an FSDP strategy: see fsdp_mini.optim.zero"):
        as_strategy(zero1)


def test_sharded_states_follow_the_zero_stages():
    # each stage shards strictly more than the one before it
    stages = [S.NO_SHARD, ZERO1, S.SHARD_GRAD_OP, S.FULL_SHARD]
    sets = [sharded_states(stage) for stage in stages]
    assert sets[0] == frozenset() and sets[-1] == MODEL_STATES
    assert all(a < b for a, b in zip(sets, sets[1:]))
    assert sets[1] == {"optimizer"} and sets[2] == {"optimizer", "grads"}
    for hybrid, stage in HYBRIDS:
        assert sharded_states(hybrid) == sharded_states(stage)
    assert sharded_states("zero1") == sharded_states(ZERO1)
    assert sharded_states("full_shard") == sharded_states(S.FULL_SHARD)


def test_is_hybrid():
    assert {m for m in ShardingStrategy if is_hybrid(m)} == {h for h, _ in HYBRIDS}
    assert is_hybrid("hybrid_shard") and not facts(ZERO1).hybrid


def test_sharded_states_rejects_unknown_names():
    with pytest.raises(ValueError, match="unknown sharding strategy 'ZERO4'"):
        sharded_states("ZERO4")


# --- memory -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "strategy,paper_gb",
    [(S.NO_SHARD, 120.0), (ZERO1, 31.4), (S.SHARD_GRAD_OP, 16.6), (S.FULL_SHARD, 1.9)],
)
def test_zero_paper_figure_1(strategy, paper_gb):
    # Rajbhandari et al. 2020, Figure 1: 7.5B parameters, N_d = 64, K = 12, mixed-precision Adam
    estimate = estimate_memory(7.5e9, 64, strategy)
    assert round(estimate.total / 1e9, 1) == paper_gb
    assert format_bytes(estimate.total) == f"{paper_gb:.1f} GB"


@pytest.mark.parametrize("hybrid,stage", HYBRIDS)
@pytest.mark.parametrize("world_size", [1, 8, 64])
def test_hybrid_is_its_stage_within_a_group_and_ddp_with_groups_of_one(hybrid, stage, world_size):
    n = 1_000_003  # prime: every sharded state needs rounding up
    whole_world = estimate_memory(n, world_size, hybrid, shard_size=world_size)
    assert whole_world == estimate_memory(n, world_size, stage)
    assert estimate_memory(n, world_size, hybrid, shard_size=1) == estimate_memory(n, world_size, S.NO_SHARD)
    # only the shard group matters, not how many replicas of it there are
    assert estimate_memory(n, 64, hybrid, shard_size=8) == estimate_memory(n, 8, stage)


@pytest.mark.parametrize("strategy", [S.FULL_SHARD, S.SHARD_GRAD_OP, ZERO1, S.NO_SHARD])
@pytest.mark.parametrize("num_params,world_size", [(0, 4), (1, 4), (10, 3), (1_000_003, 64), (64, 64)])
def test_shards_round_up_and_cover_every_parameter(strategy, num_params, world_size):
    one_byte = dict(param_bytes=1, grad_bytes=1, optimizer_bytes=1)
    estimate = estimate_memory(num_params, world_size, strategy, **one_byte)
    assert estimate.total == estimate.params + estimate.grads + estimate.optimizer
    for state in ("params", "grads", "optimizer"):
        per_rank = getattr(estimate, state)
        if state in sharded_states(strategy):
            assert num_params <= per_rank * world_size < num_params + world_size
        else:
            assert per_rank == num_params


def test_bytes_per_element_scale_each_state_independently():
    one = estimate_memory(1000, 8, S.SHARD_GRAD_OP, param_bytes=1, grad_bytes=1, optimizer_bytes=1)
    fp32 = estimate_memory(1000, 8, S.SHARD_GRAD_OP, param_bytes=4, grad_bytes=4, optimizer_bytes=8)
    assert (fp32.params, fp32.grads, fp32.optimizer) == (4 * one.params, 4 * one.grads, 8 * one.optimizer)
    assert estimate_memory(1000, 8, S.FULL_SHARD, param_bytes=0).params == 0


def test_more_sharding_never_costs_more():
    for world_size in (1, 2, 64):
        stages = (S.NO_SHARD, ZERO1, S.SHARD_GRAD_OP, S.FULL_SHARD)
        totals = [estimate_memory(7.5e9, world_size, stage).total for stage in stages]
        assert totals == sorted(totals, reverse=True)


def test_estimate_accepts_strategy_names():
    assert estimate_memory(100, 4, "full_shard") == estimate_memory(100, 4, S.FULL_SHARD)
    assert estimate_memory(100, 4, "zero1") == estimate_memory(100, 4, ZERO1)


def test_memory_estimate_total_must_be_the_sum():
    with pytest.raises(ValueError, match="total=7 is not params \\+ grads \\+ optimizer = 1 \\+ 2 \\+ 3"):
        MemoryEstimate(1, 2, 3, 7)
    assert str(MemoryEstimate(1, 2, 3, 6)) == "params 1 B + grads 2 B + optimizer 3 B = 6 B per rank"


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(num_params=-1), "num_params must be >= 0, got -1"),
        (dict(num_params=1.5), "num_params must be an integer, got 1.5"),
        (dict(num_params="7B"), "num_params must be an integer"),
        (dict(world_size=0), "world_size must be >= 1, got 0"),
        (dict(world_size=True), "world_size must be an integer"),
        (dict(param_bytes=-2), "param_bytes must be >= 0"),
        (dict(grad_bytes=-2), "grad_bytes must be >= 0"),
        (dict(optimizer_bytes=-12), "optimizer_bytes must be >= 0"),
        (dict(strategy="zero3"), "unknown sharding strategy 'zero3'"),
        (dict(shard_size=4), "shard_size applies to the hybrid strategies only, not to FULL_SHARD"),
        (dict(strategy=ZERO1, shard_size=4), "shard_size applies to the hybrid strategies only, not to ZERO1"),
        (dict(strategy=S.HYBRID_SHARD, shard_size=0), "shard_size=0 must be a positive divisor of the world size 8"),
        (dict(strategy=S.HYBRID_SHARD, shard_size=3), "shard_size=3 must be a positive divisor of the world size 8"),
        (dict(strategy=S.HYBRID_SHARD, shard_size=16), "shard_size=16 must be a positive divisor"),
    ],
)
def test_estimate_memory_rejects_bad_arguments(kwargs, match, monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    args = dict(num_params=1000, world_size=8, strategy=S.FULL_SHARD) | kwargs
    with pytest.raises(ValueError, match=match):
        estimate_memory(**args)


def test_format_bytes_uses_decimal_units():
    assert format_bytes(999) == "999 B" and format_bytes(1000) == "1.0 kB"
    for exponent, unit in enumerate(("kB", "MB", "GB", "TB", "PB"), start=1):
        assert format_bytes(1000**exponent) == f"1.0 {unit}"
        if exponent > 1:  # a value that rounds to 1000.0 of one unit is shown as 1.0 of the next
            assert format_bytes(1000**exponent - 1) == f"1.0 {unit}"
    assert format_bytes(1000**6) == "1000.0 PB"  # the largest unit just grows
    with pytest.raises(ValueError, match="nbytes must be >= 0, got -1"):
        format_bytes(-1)


@pytest.mark.parametrize("hybrid", [S.HYBRID_SHARD, S._HYBRID_SHARD_ZERO2])
def test_hybrid_estimate_uses_the_engines_shard_group_rule(hybrid, monkeypatch):
    """One rule for the shard group in the estimate and in the engine: one node (LOCAL_WORLD_SIZE)."""
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert estimate_memory(10_000, 16, hybrid) == estimate_memory(10_000, 16, hybrid, shard_size=4)
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert estimate_memory(10_000, 16, hybrid) == estimate_memory(10_000, 16, hybrid, shard_size=16)


def test_strategy_facts_match_pytorch_and_the_zero_stages():
    """What each strategy implies, from its one home: FSDP2's reshard_after_forward, gathers per step."""
    assert {m: (reshard_after_forward(m), all_gathers_per_step(m)) for m in S} == {
        S.FULL_SHARD: (True, 2), S.HYBRID_SHARD: (True, 2), S.SHARD_GRAD_OP: (False, 1),
        S._HYBRID_SHARD_ZERO2: (False, 1), S.NO_SHARD: (False, 0)}
    assert {m: (facts(m).reshard_after_forward, facts(m).hybrid) for m in S} == {
        m: (reshard_after_forward(m), is_hybrid(m)) for m in S}  # the engines' rule, not a second copy of it
    assert all_gathers_per_step(ZERO1) == 1 and not facts(ZERO1).reshard_after_forward
    assert [shard_group_size(m, 8) for m in (S.NO_SHARD, S.SHARD_GRAD_OP, S.FULL_SHARD)] == [1, 8, 8]
    assert [strategy_facts.shard_group_size_with_zero1(m, 8) for m in (S.NO_SHARD, S.FULL_SHARD, ZERO1)] == [1, 8, 8]
    assert facts("full_shard") == facts(S.FULL_SHARD) and facts(S.FULL_SHARD).sharded == MODEL_STATES


@pytest.mark.parametrize("engines_rule", [is_hybrid, reshard_after_forward, lambda s: shard_group_size(s, 8)])
def test_the_engines_rules_refuse_zero1_which_only_the_analysis_knows(engines_rule):
    """ZeRO-1 is no FSDP strategy: the engines' questions about a strategy send it to fsdp_mini.optim.zero."""
    with pytest.raises(ValueError, match="ZeRO-1 is not an FSDP strategy: see fsdp_mini.optim.zero"):
        engines_rule(ZERO1)
