"""fsdp_mini: Fully Sharded Data Parallel from scratch, small enough to read in an afternoon.

Floors, bottom up (a module imports only from floors below it):
  1. strategy, cost, memory  -- pure models: what each strategy shards, alpha-beta time, bytes per rank
  2. launch, comm_log, collectives -- start ranks, log every collective, ring collectives by hand
"""
from fsdp_mini import collectives, comm_log, cost, memory, strategy
from fsdp_mini.comm_log import CommLog, CommRecord, scope
from fsdp_mini.cost import AlphaBeta, algbw, bus_factor, busbw, fit_alpha_beta, predict
from fsdp_mini.memory import MemoryEstimate, estimate_memory, format_bytes
from fsdp_mini.strategy import ZERO1, ShardingStrategy, as_strategy, sharded_states
from fsdp_mini.launch import LaunchError, LaunchTimeout, get_device, init, launch

__all__ = [
    "launch", "init", "get_device", "LaunchError", "LaunchTimeout",
    "CommLog", "CommRecord", "scope",
    "AlphaBeta", "algbw", "bus_factor", "busbw", "fit_alpha_beta", "predict",
    "MemoryEstimate", "estimate_memory", "format_bytes",
    "ZERO1", "ShardingStrategy", "as_strategy", "sharded_states",
    "collectives", "comm_log", "cost", "memory", "strategy",
]
