"""fsdp_mini: Fully Sharded Data Parallel from scratch, small enough to read in an afternoon.

Floors, bottom up (a module imports only from floors below it):
  1. strategy, cost, memory, flat_param, mixed_precision -- pure: what each strategy shards, alpha-beta
     time, bytes per rank, how a unit's parameters are flattened, padded and cut into shards
  2. launch, comm_log, collectives, groups -- start ranks, log every collective, ring collectives by
     hand, shard and replica process groups
  3. ddp, flat_param_handle, fsdp, zero, state_dict, checkpoint, pytorch_equivalent -- the engine: gather,
     free, reduce; full and sharded checkpoints; the same strategies in PyTorch, to compare against
  4. models, train, demo -- the small GPT every lesson trains, the shared loop, `python -m fsdp_mini demo`

`fsdp_mini.checkpoint` is imported on demand (torch.distributed.checkpoint takes a while to import).
"""
from fsdp_mini import collectives, comm_log, cost, flat_param, memory, strategy
from fsdp_mini.comm_log import CommLog, CommRecord, scope
from fsdp_mini.cost import AlphaBeta, algbw, bus_factor, busbw, fit_alpha_beta, predict
from fsdp_mini.memory import MemoryEstimate, MemoryTracker, estimate_memory, format_bytes
from fsdp_mini.mixed_precision import MixedPrecision
from fsdp_mini.strategy import ZERO1, ShardingStrategy, as_strategy, sharded_states
from fsdp_mini.launch import LaunchError, LaunchTimeout, finish, get_device, init, launch, under_torchrun
from fsdp_mini.fsdp import FSDP
from fsdp_mini.zero import ZeroRedundancyOptimizer
from fsdp_mini.ddp import DistributedDataParallel
from fsdp_mini import models

__all__ = [
    "FSDP", "ShardingStrategy", "MixedPrecision", "ZeroRedundancyOptimizer", "DistributedDataParallel",
    "launch", "init", "finish", "under_torchrun", "get_device", "LaunchError", "LaunchTimeout",
    "CommLog", "CommRecord", "scope",
    "AlphaBeta", "algbw", "bus_factor", "busbw", "fit_alpha_beta", "predict",
    "MemoryEstimate", "MemoryTracker", "estimate_memory", "format_bytes",
    "ZERO1", "as_strategy", "sharded_states",
    "collectives", "comm_log", "cost", "flat_param", "memory", "models", "strategy",
]
