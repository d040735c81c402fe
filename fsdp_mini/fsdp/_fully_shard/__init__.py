"""The per-parameter design, PyTorch FSDP2's (`torch.distributed.fsdp._fully_shard`), file for file:

    fully_shard        `fully_shard`, `FSDPModule` and the module's state that only dispatches hooks
                       (PyTorch's `_fully_shard.py` and `_fsdp_state.py`)
    fsdp_param_group   one unit: its AllGather and ReduceScatter and its life in a step (`_fsdp_param_group.py`)
    fsdp_param         one parameter's dim-0 shard and gathered copy (`_fsdp_param.py`)

The names are imported from their modules (`fsdp_mini.fsdp` exports `fully_shard`): this package exports
nothing, so that `fsdp_mini.fsdp._fully_shard.fully_shard` is always the module.
"""
