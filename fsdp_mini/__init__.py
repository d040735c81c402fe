"""fsdp_mini: Fully Sharded Data Parallel from scratch, small enough to read in an afternoon.

Two floors. This package is the library, what an engineer imports to train a model; the course's tools
(plots, exercises, the lessons' GPT, benchmarks, simulators, the command line) live in
`fsdp_mini.course`, which imports the library and never the other way round.

The library, bottom up (a module imports only from its own layer or the ones before it in this list):
  1. one process, no collective: torch_internals (every private PyTorch name used, with its reason),
     runtime (init / finish / get_device, torchrun's environment), strategy (the strategies, and what
     the engines ask of one), ring_model (bytes a ring sends), flat_param (flatten, pad, cut into
     shards), units (a unit's label and the order units run in, both designs), plan (which modules
     become units), nested (tensors in nested outputs), mixed_precision, memory (the tracker of
     gathered bytes, byte counts), flight_recorder (each rank's last collectives, and the first one
     where ranks diverged), replaced_params (an optimizer built before wrapping fails loudly),
     gathered_storage (gathered parameters freed and refilled), full_state (what a full state dict is),
     weak_hooks (gradient hooks that let a dropped model be freed), compile_boundary (FSDP's hooks run
     outside torch.compile, in both designs)
  beside the engines, never imported by them (analysis and measuring tools): strategy_facts (what each
     ZeRO stage shards and gathers, `ZERO1` included), estimates (the ZeRO paper's arithmetic per strategy:
     `estimate_memory`), saved_activations (bytes autograd keeps for backward)
  2. processes and messages: launch (start N ranks and fail fast, from the caller), comm_log (every
     collective, logged), collectives (ring by hand and torch's builtins), groups (shard and replica
     process groups), grad_reduction (a gradient's ReduceScatter then replica AllReduce, in flight)
  3. the engines: states (the named states of a unit), data_parallel (what DDP and FSDP share),
     grad_buckets (DDP's bucket rule), ddp, zero (ZeRO-1; zero_checkpoint: its sharded checkpoint);
     the flat design (FSDP1's): flat_param_handle (one flat parameter's gather / free / reduce), fsdp
     (the wrapper and its units); the per-parameter design (FSDP2's): fsdp_param (one parameter's dim-0
     shard), fsdp_param_group (a unit's collectives and lifecycle), fully_shard (the API and its hooks);
     replicate (DDP applied in place, beside fully_shard), replicate_with_fsdp (FSDP2's replicate: fully_shard's
     units over a replicate-only mesh); tp_operators (Megatron's f and g) and
     tensor_parallel (parallelize_module, column- and row-wise, sequence parallel); state_dict (full
     state dicts), checkpoint (sharded DCP checkpoints; sharded_boxes: their pieces, and DCP planners that write them;
     checkpoint_integrity: staging, checksums, atomic commit), memory_ledger (a step's bytes by kind
     and phase, and a memory budget)

`fsdp_mini.checkpoint` is imported on demand (torch.distributed.checkpoint takes a while to import).
`python -m fsdp_mini` runs the course's command line (`fsdp_mini.course.cli`).
"""
from fsdp_mini import collectives, comm_log, flat_param, memory, plan, strategy
from fsdp_mini.comm_log import CommLog, CommRecord, scope
from fsdp_mini.memory import MemoryTracker, format_bytes
from fsdp_mini.mixed_precision import MixedPrecision, MixedPrecisionPolicy
from fsdp_mini.strategy import ShardingStrategy, as_strategy, shard_group_size
from fsdp_mini.runtime import finish, get_device, init, under_torchrun
from fsdp_mini.launch import LaunchError, LaunchTimeout, launch
from fsdp_mini.fsdp import FSDP
from fsdp_mini.fully_shard import FSDPModule, fully_shard, register_fsdp_forward_method
from fsdp_mini.state_dict import full_state_dict, load_full_state_dict
from fsdp_mini.zero import ZeroRedundancyOptimizer
from fsdp_mini.ddp import DistributedDataParallel
from fsdp_mini.replicate import ReplicateModule, replicate

__all__ = [
    "FSDP", "ShardingStrategy", "MixedPrecision", "ZeroRedundancyOptimizer", "DistributedDataParallel",
    "fully_shard", "FSDPModule", "MixedPrecisionPolicy", "register_fsdp_forward_method", "replicate", "ReplicateModule",
    "full_state_dict", "load_full_state_dict",
    "launch", "init", "finish", "under_torchrun", "get_device", "LaunchError", "LaunchTimeout",
    "CommLog", "CommRecord", "scope",
    "MemoryEstimate", "MemoryTracker", "estimate_memory", "format_bytes",
    "ZERO1", "as_strategy", "sharded_states", "shard_group_size",
    "collectives", "comm_log", "flat_param", "memory", "plan", "strategy",
]

# exports that load on first use (module-level __getattr__): analysis the engines never import
LAZY_EXPORTS = {"estimate_memory": "fsdp_mini.estimates", "MemoryEstimate": "fsdp_mini.estimates",
                "ZERO1": "fsdp_mini.strategy_facts", "sharded_states": "fsdp_mini.strategy_facts"}


def __getattr__(name: str):
    """`fsdp_mini.estimate_memory`, `MemoryEstimate`, `ZERO1` and `sharded_states` load on first use: they
    are analysis, which the engines never import, so `import fsdp_mini.fsdp` or `fsdp_mini.fully_shard`
    does not load them."""
    if name in LAZY_EXPORTS:
        import importlib

        return getattr(importlib.import_module(LAZY_EXPORTS[name]), name)
    raise AttributeError(f"module 'fsdp_mini' has no attribute {name!r}")
