"""How many bytes of model states each rank holds under a sharding strategy.

This is the arithmetic behind the ZeRO paper's Figure 1 and the first question to ask before choosing
a strategy: does the model fit? With mixed-precision Adam every parameter costs 2 bytes (fp16/bf16
weight) + 2 bytes (gradient) + K = 12 bytes (fp32 master weight, momentum, variance). Replicated,
7.5B parameters need 120 GB on *every* rank; a state sharded over a group of G ranks costs only
ceil(num_params / G) elements per rank, so sharding all three over 64 ranks needs 1.9 GB.

Only model states are counted, in their steady state: not activations, not the temporary buffers that
hold one FSDP unit's all-gathered parameters or unsharded gradients, not allocator fragmentation.
Those are real, and they are why a model that fits on paper can still run out of memory.

The estimate has a measured twin in `fsdp_mini.memory`: `MemoryTracker` counts the bytes of unsharded
parameters that the FSDP engine really holds at each moment and their peak, and `optimizer_state_bytes` sums
what an optimizer really allocated, so a lesson can set the prediction beside the measurement. An analysis
module: the engines never import it (tests/library/test_layout.py).

Units are decimal (1 GB = 1e9 bytes), as in the ZeRO paper, so its numbers can be checked digit for
digit; `format_bytes` prints them that way.
"""
from __future__ import annotations

from dataclasses import dataclass

from fsdp_mini.byte_format import format_bytes
from fsdp_mini.fsdp.strategy import StrategyLike, check_shard_size
from fsdp_mini.fsdp.strategy_facts import facts, shard_group_size_with_zero1

__all__ = ["MemoryEstimate", "estimate_memory"]


@dataclass(frozen=True)
class MemoryEstimate:
    """Per-rank bytes of each model state; `total` is their sum (checked, so an estimate is consistent)."""

    params: int
    grads: int
    optimizer: int
    total: int

    def __post_init__(self) -> None:
        if self.total != self.params + self.grads + self.optimizer:
            raise ValueError(
                f"total={self.total} is not params + grads + optimizer = "
                f"{self.params} + {self.grads} + {self.optimizer}"
            )

    def __str__(self) -> str:
        return (
            f"params {format_bytes(self.params)} + grads {format_bytes(self.grads)} + "
            f"optimizer {format_bytes(self.optimizer)} = {format_bytes(self.total)} per rank"
        )


def estimate_memory(
    num_params: int,
    world_size: int,
    strategy: StrategyLike,
    shard_size: int | None = None,
    param_bytes: int = 2,
    grad_bytes: int = 2,
    optimizer_bytes: int = 12,
    tp: int = 1,
) -> MemoryEstimate:
    """Per-rank bytes of parameters, gradients and optimizer states for `num_params` parameters.

    `strategy` is a `ShardingStrategy` (or its name) or `ZERO1`. A sharded state is split over all
    `world_size` ranks, except for the hybrid strategies, which split it over a shard group of
    `shard_size` ranks and replicate it across the `world_size // shard_size` groups; `shard_size`
    follows `fsdp_mini.fsdp.strategy_facts.shard_group_size_with_zero1` (default: one node), and is rejected for the others.

    `tp` is the tensor-parallel degree of a 2-D mesh (tp x dp). Tensor parallelism splits every weight
    matrix over the tp ranks of its group for the whole step, so each TP rank owns ceil(num_params / tp)
    parameters with their gradients and optimizer states; the strategy then shards that share over the
    `world_size // tp` data-parallel ranks (the hybrids: over a shard group of `shard_size` of them),
    exactly as it shards a whole model when tp = 1. `world_size` must be a multiple of tp, and with
    tp > 1 a hybrid needs `shard_size` given, counted in data-parallel ranks (the one-node default counts
    GPUs, and a node of g GPUs holds only g / tp data-parallel ranks). The split
    counts every parameter as divisible; a real TP plan replicates the LayerNorms (a few thousand
    parameters per block), which this leaves out.

    The byte defaults are mixed-precision Adam (ZeRO's K = 12); for plain fp32 Adam pass
    `param_bytes=4, grad_bytes=4, optimizer_bytes=8`. `num_params` may be an integral float such as
    7.5e9, as papers write it.
    """
    num_params = _check_int("num_params", num_params, minimum=0)
    world_size = _check_int("world_size", world_size, minimum=1)
    param_bytes = _check_int("param_bytes", param_bytes, minimum=0)
    grad_bytes = _check_int("grad_bytes", grad_bytes, minimum=0)
    optimizer_bytes = _check_int("optimizer_bytes", optimizer_bytes, minimum=0)
    tp = _check_int("tp", tp, minimum=1)
    if world_size % tp:
        raise ValueError(f"world_size={world_size} is not a multiple of tp={tp}: a 2-D mesh of tp x dp ranks "
                         f"needs world_size = tp * dp")
    sharded = facts(strategy).sharded
    if tp > 1 and facts(strategy).hybrid:
        dp = world_size // tp
        if shard_size is None:
            raise ValueError(f"with tp={tp} a hybrid strategy needs shard_size, in data-parallel ranks (a divisor "
                             f"of world_size // tp = {dp}): the one-node default counts GPUs")
        check_shard_size(shard_size, dp, f"the {dp} data-parallel ranks (world_size {world_size} // tp {tp})")
    group = shard_group_size_with_zero1(strategy, world_size // tp, shard_size)
    # -(-a // b) is ceil(a / b) in exact integer arithmetic (a float division would round).
    per_tp_rank = -(-num_params // tp)  # tensor parallelism splits the weights first

    def per_rank(state: str, bytes_per_element: int) -> int:
        elements = -(-per_tp_rank // group) if state in sharded else per_tp_rank
        return elements * bytes_per_element

    params = per_rank("params", param_bytes)
    grads = per_rank("grads", grad_bytes)
    optimizer = per_rank("optimizer", optimizer_bytes)
    return MemoryEstimate(params, grads, optimizer, params + grads + optimizer)


def _check_int(name: str, value: int | float, minimum: int) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value
