"""fsdp_mini: Fully Sharded Data Parallel from scratch, small enough to read in an afternoon.

Two floors. This package is the library, what an engineer imports to train a model; the course's tools
(plots, exercises, the lessons' GPT, benchmarks, simulators, the command line) live in
`fsdp_mini.course`, which imports the library and never the other way round.

The library is laid out as `torch.distributed` is, so that where a thing lives here says where it lives in
PyTorch (the README's table maps every module). Bottom up (a module imports only from its own layer or the
ones before it; tests/library/test_layout.py checks the order):
  1. one process: torch_internals (every private PyTorch name used, with its reason), lazy_exports, nested
     (tensors in nested outputs), weak_hooks, ring_model (bytes a ring sends), memory (the tracker of
     gathered bytes, byte counts), byte_format (bytes as text), rank_environment (this rank's node-local
     index, device, and whether torch.distributed is up: all the engines read of their process)
  2. processes and messages: flight_recorder (each rank's last collectives, a listener), collective_calls
     (a collective in flight, published to listeners: the diagnostics subscribe, the engines never call
     them), comm_log (every collective, logged), collectives (ring by hand and torch's builtins), grad_norm
     (a sharded gradient's norm and clipping by it, for both FSDP designs and ZeRO-1), runtime
     (init / finish: starting and ending a rank), run (`launch`: start N ranks and fail fast)
  3. the engines: fsdp/ (both FSDP designs and their shared mechanics: the core), parallel/ (DDP),
     _composable/ (replicate), optim/ (ZeRO-1), tensor/parallel/ (TP, SP), pipelining/ (stages and schedules)
  4. around the engines: checkpoint/ (full state dicts, sharded DCP checkpoints), memory_ledger (a step's
     bytes by kind and phase), saved_activations, estimates (the ZeRO paper's arithmetic)

Every name below loads on first use, so `import fsdp_mini.fsdp` loads the core alone.
`python -m fsdp_mini` runs the course's command line (`fsdp_mini.course.cli`).
"""
from fsdp_mini.lazy_exports import lazy_exports

_EXPORTS = {
    "FSDP": "fsdp_mini.fsdp.fully_sharded_data_parallel:FSDP",
    "ShardingStrategy": "fsdp_mini.fsdp.strategy:ShardingStrategy",
    "as_strategy": "fsdp_mini.fsdp.strategy:as_strategy",
    "shard_group_size": "fsdp_mini.fsdp.strategy:shard_group_size",
    "MixedPrecision": "fsdp_mini.fsdp.mixed_precision:MixedPrecision",
    "MixedPrecisionPolicy": "fsdp_mini.fsdp.mixed_precision:MixedPrecisionPolicy",
    "fully_shard": "fsdp_mini.fsdp._fully_shard.fully_shard:fully_shard",
    "FSDPModule": "fsdp_mini.fsdp._fully_shard.fully_shard:FSDPModule",
    "register_fsdp_forward_method": "fsdp_mini.fsdp._fully_shard.fully_shard:register_fsdp_forward_method",
    "full_state_dict": "fsdp_mini.checkpoint.state_dict:full_state_dict",
    "load_full_state_dict": "fsdp_mini.checkpoint.state_dict:load_full_state_dict",
    "ZeroRedundancyOptimizer": "fsdp_mini.optim.zero:ZeroRedundancyOptimizer",
    "DistributedDataParallel": "fsdp_mini.parallel.ddp:DistributedDataParallel",
    "replicate": "fsdp_mini._composable.replicate:replicate",
    "ReplicateModule": "fsdp_mini._composable.replicate:ReplicateModule",
    "launch": "fsdp_mini.run:launch",
    "LaunchError": "fsdp_mini.run:LaunchError",
    "LaunchTimeout": "fsdp_mini.run:LaunchTimeout",
    "init": "fsdp_mini.runtime:init",
    "finish": "fsdp_mini.runtime:finish",
    "under_torchrun": "fsdp_mini.rank_environment:under_torchrun",
    "get_device": "fsdp_mini.rank_environment:get_device",
    "CommLog": "fsdp_mini.comm_log:CommLog",
    "CommRecord": "fsdp_mini.comm_log:CommRecord",
    "scope": "fsdp_mini.comm_log:scope",
    "MemoryTracker": "fsdp_mini.memory:MemoryTracker",
    "format_bytes": "fsdp_mini.byte_format:format_bytes",
    "MemoryEstimate": "fsdp_mini.estimates:MemoryEstimate",
    "estimate_memory": "fsdp_mini.estimates:estimate_memory",
    "ZERO1": "fsdp_mini.fsdp.strategy_facts:ZERO1",
    "sharded_states": "fsdp_mini.fsdp.strategy_facts:sharded_states",
    # modules, as `fsdp_mini.collectives.ring_all_reduce(...)` reads
    "collectives": "fsdp_mini.collectives",
    "comm_log": "fsdp_mini.comm_log",
    "memory": "fsdp_mini.memory",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
