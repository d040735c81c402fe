"""FSDP, both designs, where PyTorch keeps them (`torch.distributed.fsdp`): the core of fsdp_mini.

    fully_sharded_data_parallel   `FSDP`: the flat design, PyTorch's FSDP1 (`FullyShardedDataParallel`)
    flat_param, flat_param_handle a unit's parameters as one flat buffer, and its gather / free / reduce
    plan                          which modules become units (FSDP1's auto-wrap)
    strategy                      `ShardingStrategy` and what the engines ask of one (FSDP1's `api.py`)
    _fully_shard/                 `fully_shard`: the per-parameter design, PyTorch's FSDP2, in the files
                                  PyTorch's `_fully_shard/` has (fsdp_param, fsdp_param_group, fully_shard)
    shared by both designs        states, units, groups, gathered_storage, grad_reduction, mixed_precision,
                                  full_state, replaced_params, compile_boundary

`import fsdp_mini.fsdp` loads the collectives, the two designs and their shared mechanics, and nothing of
checkpointing, launching, the flight recorder, tensor parallelism, ZeRO or the course
(tests/library/test_layout.py asserts it). `strategy_facts` (what each strategy costs, as data) sits here
beside `strategy` and is analysis: the engines never import it.
"""
from fsdp_mini.fsdp.fully_sharded_data_parallel import FSDP
from fsdp_mini.fsdp.mixed_precision import MixedPrecision, MixedPrecisionPolicy
from fsdp_mini.fsdp.strategy import ShardingStrategy
from fsdp_mini.fsdp._fully_shard.fully_shard import FSDPModule, fully_shard, register_fsdp_forward_method

FullyShardedDataParallel = FSDP  # PyTorch's name: `from torch.distributed.fsdp import FullyShardedDataParallel as FSDP`

__all__ = ["FSDP", "FullyShardedDataParallel", "ShardingStrategy", "MixedPrecision", "MixedPrecisionPolicy",
           "fully_shard", "FSDPModule", "register_fsdp_forward_method"]
