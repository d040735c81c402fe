"""What a sharding strategy costs, as data: which model states it shards and how many AllGathers of a unit
one step makes, ZeRO-1 included.

The engines need only `fsdp_mini.fsdp.strategy` (the strategy's name, whether it reshards after forward, is
hybrid, and over how many ranks it shards). The memory estimate (`fsdp_mini.estimates`), the course's cost
and cluster models and its pictures ask a different question, *what does each ZeRO stage keep and send*,
and they compare all four stages side by side, ZeRO-1 with them, though ZeRO-1 is no FSDP strategy
(fsdp_mini implements it as `fsdp_mini.optim.zero`). So this is an analysis module beside the engines, which never
import it (tests/library/test_layout.py): the one place that knows the extra name `ZERO1`.

    stage   strategy                        sharded states              AllGathers of a unit per step
    DDP     NO_SHARD                        none                        0
    ZeRO-1  ZERO1                           optimizer                   1 (the updated parameters)
    ZeRO-2  SHARD_GRAD_OP, _HYBRID_SHARD_ZERO2   optimizer, grads       1 (before forward)
    ZeRO-3  FULL_SHARD, HYBRID_SHARD        optimizer, grads, params    2 (before forward and backward)

Where the engines' rule exists it is used, not restated: `reshard_after_forward`, `is_hybrid` and the shard
group's size come from `fsdp_mini.fsdp.strategy`.
"""
from __future__ import annotations

from dataclasses import dataclass

from fsdp_mini.fsdp.strategy import ShardingStrategy, StrategyLike, as_strategy, is_hybrid, reshard_after_forward
from fsdp_mini.fsdp.strategy import shard_group_size

__all__ = ["ZERO1", "MODEL_STATES", "StrategyFacts", "facts", "sharded_states", "all_gathers_per_step",
           "shard_group_size_with_zero1"]

ZERO1 = "ZERO1"
"""ZeRO stage 1: only optimizer states are sharded. Not a PyTorch FSDP strategy (FSDP has none that
shards the optimizer but not the gradients); fsdp_mini implements it as `fsdp_mini.optim.zero`. Accepted,
case-insensitively, by this module's functions and by `fsdp_mini.estimates.estimate_memory` only, so that
lessons can compare all four ZeRO stages side by side."""

MODEL_STATES = frozenset({"params", "grads", "optimizer"})
"""The three per-parameter model states that a strategy may shard (activations are not model states)."""

_SHARDED = {
    ShardingStrategy.NO_SHARD: frozenset(),
    ZERO1: frozenset({"optimizer"}),
    ShardingStrategy.SHARD_GRAD_OP: frozenset({"grads", "optimizer"}),
    ShardingStrategy._HYBRID_SHARD_ZERO2: frozenset({"grads", "optimizer"}),
    ShardingStrategy.FULL_SHARD: MODEL_STATES,
    ShardingStrategy.HYBRID_SHARD: MODEL_STATES,
}


@dataclass(frozen=True)
class StrategyFacts:
    """What one strategy does, as data.

    `sharded`: the model states split over the shard group (the rest is replicated on each of its ranks).
    `reshard_after_forward`: a unit's gathered parameters are freed after its forward and gathered again
    for backward (ZeRO-3); otherwise they stay whole from forward until the end of backward (ZeRO-2).
    `all_gathers_per_step`: AllGathers of one (non-root) unit per training step, 2, 1 or 0.
    `hybrid`: shard inside a group of ranks (a node) and replicate across groups.
    """

    sharded: frozenset[str]
    reshard_after_forward: bool
    all_gathers_per_step: int
    hybrid: bool


def facts(strategy: StrategyLike) -> StrategyFacts:
    """Everything `strategy` implies (see `StrategyFacts`); `ZERO1` is accepted. ZeRO-1 reduce-scatters the
    gradients, steps its shard and all-gathers the updated parameters once."""
    if _is_zero1(strategy):
        return StrategyFacts(_SHARDED[ZERO1], reshard_after_forward=False, all_gathers_per_step=1, hybrid=False)
    strategy = as_strategy(strategy)
    reshard = reshard_after_forward(strategy)
    gathers = 0 if strategy is ShardingStrategy.NO_SHARD else 2 if reshard else 1
    return StrategyFacts(_SHARDED[strategy], reshard, gathers, is_hybrid(strategy))


def sharded_states(strategy: StrategyLike) -> frozenset[str]:
    """The model states (a subset of `MODEL_STATES`) that `strategy` shards; `ZERO1` is accepted.

    The states not returned are replicated in full on every rank of the (shard) group.
    """
    return facts(strategy).sharded


def all_gathers_per_step(strategy: StrategyLike) -> int:
    """AllGathers of one unit's parameters per training step: 2 (ZeRO-3), 1 (ZeRO-2, ZeRO-1) or 0 (DDP)."""
    return facts(strategy).all_gathers_per_step


def shard_group_size_with_zero1(strategy: StrategyLike, world_size: int, shard_size: int | None = None) -> int:
    """The engines' rule (`fsdp_mini.fsdp.strategy.shard_group_size`) with `ZERO1` accepted: ZeRO-1 shards the
    optimizer over the whole world, and `shard_size` is an error for it as for every non-hybrid strategy."""
    if _is_zero1(strategy):
        if shard_size is not None:
            raise ValueError(f"shard_size applies to the hybrid strategies only, not to {ZERO1}")
        return world_size
    return shard_group_size(strategy, world_size, shard_size)


def _is_zero1(value: object) -> bool:
    return isinstance(value, str) and value.upper() == ZERO1
