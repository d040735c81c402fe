"""fsdp_mini: Fully Sharded Data Parallel from scratch, small enough to read in an afternoon.

Floors, bottom up (a module imports only from floors below it):
  1. cost, memory, strategy   -- pure models: alpha-beta time, bytes per rank, what each strategy shards
  2. launch, comm_log, collectives -- start ranks, log every collective, ring collectives by hand
"""
from fsdp_mini.launch import LaunchError, LaunchTimeout, get_device, init, launch

__all__ = ["launch", "init", "get_device", "LaunchError", "LaunchTimeout"]
