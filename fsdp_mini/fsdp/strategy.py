"""The sharding strategies, under PyTorch FSDP's names, and what the engines ask of one.

Data-parallel training keeps three *model states* per parameter: the parameter itself, its gradient and
the optimizer state (for mixed-precision Adam: fp32 master copy, momentum, variance). Plain DDP
replicates all three on every rank; the ZeRO paper (Rajbhandari et al., 2020) removes that redundancy
in stages, and PyTorch FSDP exposes the stages as a `ShardingStrategy`:

    stage   PyTorch name                  sharded states
    DDP     NO_SHARD                      none
    ZeRO-1  (no FSDP strategy)            optimizer
    ZeRO-2  SHARD_GRAD_OP                 optimizer, grads
    ZeRO-3  FULL_SHARD                    optimizer, grads, params

Each stage saves memory and pays for it in communication: ZeRO-3 must all-gather parameters before
every use, ZeRO-2 only once per step. The hybrid strategies apply a stage inside a *shard group*
(typically one node, with fast links) and replicate across groups, so the expensive all-gathers stay
on the fast links.

What the engines ask of a strategy lives here, and only here: whether a unit's parameters are freed
after forward (`reshard_after_forward`), whether it is hybrid, and over how many ranks it shards
(`shard_group_size`, with torchrun's LOCAL_WORLD_SIZE as the hybrids' default). What a strategy costs
(which model states it shards, AllGathers per step, ZeRO-1 beside the FSDP strategies) is analysis, in
`fsdp_mini.fsdp.strategy_facts`, which the engines never import.

`ShardingStrategy` mirrors PyTorch's member names exactly, so code written against fsdp_mini reads
the same as code written against `torch.distributed.fsdp`, and `as_strategy` accepts either enum.
ZeRO-1 is not an FSDP strategy: fsdp_mini implements it separately (`fsdp_mini.optim.zero`), and `as_strategy`
says so when given its name.
"""
from __future__ import annotations

import enum
from typing import Union

from fsdp_mini.rank_environment import local_world_size

__all__ = ["ShardingStrategy", "StrategyLike", "as_strategy", "is_hybrid", "reshard_after_forward",
           "shard_group_size", "check_shard_size"]


class ShardingStrategy(enum.Enum):
    """PyTorch FSDP's sharding strategies, same names, same order (`torch.distributed.fsdp`)."""

    FULL_SHARD = enum.auto()
    """ZeRO-3: parameters, gradients and optimizer states are all sharded over every rank. Each FSDP
    unit all-gathers its parameters just before forward, frees them, all-gathers them again for
    backward, then reduce-scatters the gradients. Least memory, most communication."""

    SHARD_GRAD_OP = enum.auto()
    """ZeRO-2: gradients and optimizer states are sharded; parameters are gathered once for forward
    and kept whole until backward ends (sharded only between steps). Saves the backward all-gather
    at the cost of holding full parameters during compute."""

    NO_SHARD = enum.auto()
    """DDP: nothing is sharded; every rank holds everything and gradients are all-reduced. The
    baseline that the other strategies are measured against."""

    HYBRID_SHARD = enum.auto()
    """ZeRO-3 inside a shard group (usually one node), replication across groups: parameters,
    gradients and optimizer states are sharded over the group, and each gradient shard is then
    all-reduced across the groups' replicas. Per-rank memory is that of FULL_SHARD on one group."""

    _HYBRID_SHARD_ZERO2 = enum.auto()
    """ZeRO-2 inside a shard group, replication across groups: like HYBRID_SHARD but parameters stay
    whole during compute, as in SHARD_GRAD_OP. The leading underscore is PyTorch's: it is private
    and experimental there."""


StrategyLike = Union[ShardingStrategy, enum.Enum, str]


def as_strategy(value: StrategyLike) -> ShardingStrategy:
    """Return the `ShardingStrategy` that `value` names.

    Accepts a member, its name as a string in any case (`"full_shard"`), or a member of another enum
    with the same name, which is how PyTorch's own `ShardingStrategy` converts without fsdp_mini
    importing torch. Anything else is a ValueError that lists the valid names, so a typo in a config
    file fails at start-up rather than deep inside training.
    """
    if isinstance(value, ShardingStrategy):
        return value
    name = value.name if isinstance(value, enum.Enum) else value
    if isinstance(name, str):
        for member in ShardingStrategy:
            if member.name.lower() == name.lower():
                return member
    valid = ", ".join(member.name for member in ShardingStrategy)
    hint = " (ZeRO-1 is not an FSDP strategy: see fsdp_mini.optim.zero)" if _names_zero1(name) else ""
    raise ValueError(f"unknown sharding strategy {value!r}{hint}; valid names: {valid}")


def is_hybrid(strategy: StrategyLike) -> bool:
    """True if `strategy` shards within a shard group and replicates across groups (HYBRID_SHARD and
    _HYBRID_SHARD_ZERO2)."""
    return as_strategy(strategy) in (ShardingStrategy.HYBRID_SHARD, ShardingStrategy._HYBRID_SHARD_ZERO2)


def reshard_after_forward(strategy: StrategyLike) -> bool:
    """True if a unit's parameters are freed after forward and gathered again for backward (ZeRO-3:
    FULL_SHARD and HYBRID_SHARD); PyTorch FSDP2's `fully_shard(reshard_after_forward=...)` takes exactly
    this value."""
    return as_strategy(strategy) in (ShardingStrategy.FULL_SHARD, ShardingStrategy.HYBRID_SHARD)


def shard_group_size(strategy: StrategyLike, world_size: int, shard_size: int | None = None) -> int:
    """How many ranks share one copy of the model, i.e. split each sharded state between them.

    NO_SHARD: 1 (every rank holds everything). FULL_SHARD and SHARD_GRAD_OP: the whole world.
    The hybrids: `shard_size`, by default one node (torchrun's LOCAL_WORLD_SIZE; the whole world when it
    is not set). `shard_size` is an error for the others, and must divide the world: a clear ValueError
    before any process group exists.
    """
    strategy = as_strategy(strategy)
    if not is_hybrid(strategy):
        if shard_size is not None:
            raise ValueError(f"shard_size applies to the hybrid strategies only, not to {strategy.name}")
        return 1 if strategy is ShardingStrategy.NO_SHARD else world_size
    if shard_size is None:
        shard_size = local_world_size(default=world_size)
    check_shard_size(shard_size, world_size)
    return shard_size


def check_shard_size(shard_size, ranks: int, of: str | None = None) -> None:
    """The one check of a shard group's size, wherever one is given (a strategy, a grid of process groups,
    a memory estimate): a positive int that divides the ranks it shards, else a ValueError naming both.
    `of` says what those ranks are (default: "the world size N")."""
    if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size < 1 or ranks % shard_size:
        raise ValueError(f"shard_size={shard_size!r} must be a positive divisor of {of or f'the world size {ranks}'}")


def _names_zero1(value: object) -> bool:
    return isinstance(value, str) and value.upper() == "ZERO1"
