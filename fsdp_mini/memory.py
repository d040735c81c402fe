"""How many bytes of model states each rank holds under a sharding strategy.

This is the arithmetic behind the ZeRO paper's Figure 1 and the first question to ask before choosing
a strategy: does the model fit? With mixed-precision Adam every parameter costs 2 bytes (fp16/bf16
weight) + 2 bytes (gradient) + K = 12 bytes (fp32 master weight, momentum, variance). Replicated,
7.5B parameters need 120 GB on *every* rank; a state sharded over a group of G ranks costs only
ceil(num_params / G) elements per rank, so sharding all three over 64 ranks needs 1.9 GB.

Only model states are counted, in their steady state: not activations, not the temporary buffers that
hold one FSDP unit's all-gathered parameters or unsharded gradients, not allocator fragmentation.
Those are real, and they are why a model that fits on paper can still run out of memory.

The estimate has a measured twin: `MemoryTracker` counts the bytes of unsharded parameters that the
FSDP engine really holds at each moment and their peak, and `optimizer_state_bytes` sums what an
optimizer really allocated, so a lesson can set the prediction beside the measurement.

Units are decimal (1 GB = 1e9 bytes), as in the ZeRO paper, so its numbers can be checked digit for
digit; `format_bytes` prints them that way.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch.distributed.tensor import DTensor

from fsdp_mini.strategy import StrategyLike, check_shard_size, is_hybrid, shard_group_size, sharded_states

__all__ = ["MemoryEstimate", "estimate_memory", "format_bytes", "decimal_scale", "MemoryTracker", "MemoryChange",
           "ListenerHandle", "tensor_bytes", "optimizer_state_bytes", "step_memory_stats", "SavedActivations"]

_UNITS = ("B", "kB", "MB", "GB", "TB", "PB")


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
    follows `fsdp_mini.strategy.shard_group_size` (default: one node), and is rejected for the others.

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
    sharded = sharded_states(strategy)
    if tp > 1 and is_hybrid(strategy):
        dp = world_size // tp
        if shard_size is None:
            raise ValueError(f"with tp={tp} a hybrid strategy needs shard_size, in data-parallel ranks (a divisor "
                             f"of world_size // tp = {dp}): the one-node default counts GPUs")
        check_shard_size(shard_size, dp, f"the {dp} data-parallel ranks (world_size {world_size} // tp {tp})")
    group = shard_group_size(strategy, world_size // tp, shard_size)
    # -(-a // b) is ceil(a / b) in exact integer arithmetic (a float division would round).
    per_tp_rank = -(-num_params // tp)  # tensor parallelism splits the weights first

    def per_rank(state: str, bytes_per_element: int) -> int:
        elements = -(-per_tp_rank // group) if state in sharded else per_tp_rank
        return elements * bytes_per_element

    params = per_rank("params", param_bytes)
    grads = per_rank("grads", grad_bytes)
    optimizer = per_rank("optimizer", optimizer_bytes)
    return MemoryEstimate(params, grads, optimizer, params + grads + optimizer)


def format_bytes(nbytes: int | float) -> str:
    """Human-readable decimal size: `"512 B"`, `"1.9 GB"`, `"31.4 GB"` (1 kB = 1000 B, as in ZeRO)."""
    if not nbytes >= 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes!r}")
    if nbytes < 1000:
        return f"{nbytes:g} B"
    value, unit = decimal_scale(nbytes)
    return f"{value:.1f} {_UNITS[unit]}"


def decimal_scale(nbytes: int | float, units: int = len(_UNITS)) -> tuple[float, int]:
    """`nbytes` in decimal units: (value, k) with value = nbytes / 1000**k, k the unit ("B", "kB", "MB",
    ...) that shows it, below `units`. A value that would print as 1000.0 moves up a unit (999,960 B is
    "1.0 MB", not "1000.0 kB"). The one rule of `format_bytes` and of the lessons' translated sizes."""
    value, unit = float(nbytes), 0
    while unit < units - 1 and round(value, 1) >= 1000:
        value, unit = value / 1000, unit + 1
    return value, unit


def _check_int(name: str, value: int | float, minimum: int) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


@dataclass(frozen=True)
class MemoryChange:
    """One `alloc` or `free` seen by a `MemoryTracker`: `kind` is "alloc" or "free", `label` what was
    allocated (an FSDP flat parameter's label), `current` the tracked bytes right after."""

    kind: str
    label: str
    nbytes: int
    current: int


class MemoryTracker:
    """Live and peak bytes of one kind of buffer, counted where the engine allocates and frees them.

    Tracked, not guessed: FSDP calls `alloc` when it materialises a unit's gathered parameters and
    `free` when it releases them, so `peak` is the largest amount of unsharded parameter memory that
    was ever alive at once on this rank (for FULL_SHARD with prefetch: about two units, not the model).

    `listen(fn)` calls `fn(MemoryChange)` after every alloc and free until the returned handle's
    `remove()`: how a timeline (`fsdp_mini.course.trace`) sees each gather and free as it happens.
    """

    def __init__(self) -> None:
        self.current = 0
        self.peak = 0
        self._listeners: dict[int, Callable[[MemoryChange], None]] = {}
        self._next_id = 0

    def alloc(self, nbytes: int, label: str = "") -> None:
        if nbytes < 0:
            raise ValueError(f"cannot allocate {nbytes} bytes")
        self.current += nbytes
        self.peak = max(self.peak, self.current)
        self._tell("alloc", label, nbytes)

    def free(self, nbytes: int, label: str = "") -> None:
        if nbytes < 0:
            raise ValueError(f"cannot free {nbytes} bytes")
        if nbytes > self.current:
            raise RuntimeError(f"freeing {nbytes} bytes but only {self.current} are tracked")
        self.current -= nbytes
        self._tell("free", label, nbytes)

    def listen(self, fn: Callable[[MemoryChange], None]) -> "ListenerHandle":
        """Call `fn` with each later `MemoryChange`; `handle.remove()` stops it."""
        key, self._next_id = self._next_id, self._next_id + 1
        self._listeners[key] = fn
        return ListenerHandle(lambda: self._listeners.pop(key, None))

    def _tell(self, kind: str, label: str, nbytes: int) -> None:
        if self._listeners:
            change = MemoryChange(kind, label, nbytes, self.current)
            for fn in list(self._listeners.values()):
                fn(change)

    def reset_peak(self) -> None:
        self.peak = self.current

    def __repr__(self) -> str:
        return f"MemoryTracker(current={self.current}, peak={self.peak})"


class ListenerHandle:
    """What `MemoryTracker.listen` returns: `remove()` unsubscribes (idempotent)."""

    def __init__(self, remove: Callable[[], object]):
        self._remove = remove

    def remove(self) -> None:
        self._remove()


def tensor_bytes(tensors) -> int:
    """Bytes this rank holds for the given tensors (None entries are skipped): of a DTensor, its local
    shard, not the global tensor it describes."""
    return sum(_local(t).numel() * _local(t).element_size() for t in tensors if t is not None)


def _local(t):
    return t.to_local() if isinstance(t, DTensor) else t


def optimizer_state_bytes(optimizer) -> int:
    """Bytes of every tensor in a torch optimizer's state (Adam: exp_avg, exp_avg_sq, step)."""
    return tensor_bytes(v for state in optimizer.state.values() for v in state.values()
                        if hasattr(v, "element_size"))


def step_memory_stats(params, optimizer, tracker: MemoryTracker) -> dict[str, int]:
    """This rank's bytes, as both designs report them (`FSDP.memory_stats`, `fully_shard.memory_stats`):
    sharded parameters and their gradients (local shards), optimizer state, and the gathered parameters
    now and at their peak (`tracker`)."""
    params = list(params)
    return {"params": tensor_bytes(params), "grads": tensor_bytes(p.grad for p in params),
            "optimizer": optimizer_state_bytes(optimizer) if optimizer is not None else 0,
            "unsharded_now": tracker.current, "unsharded_peak": tracker.peak}


class SavedActivations:
    """Bytes that autograd saves for backward inside the block: the activations.

        with SavedActivations(exclude=model.parameters()) as saved:
            loss = model(x, y)
        saved.nbytes   # grows with batch size and sequence length, unlike the model states

    Counted through `torch.autograd.graph.saved_tensors_hooks`, each storage once (views of one tensor
    share it), leaving out the storages of `exclude` (the parameters, which backward also saves but
    which are model states, not activations). Deterministic: it counts bytes, it does not time anything.
    """

    def __init__(self, exclude=()):
        import torch

        self._torch = torch
        self._skip = {t.untyped_storage().data_ptr() for t in exclude}
        self._seen: set[int] = set()
        self.nbytes = 0

    def _pack(self, t):
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in self._skip and ptr not in self._seen:
            self._seen.add(ptr)
            self.nbytes += storage.nbytes()
        return t

    def __enter__(self) -> "SavedActivations":
        self._hooks = self._torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
