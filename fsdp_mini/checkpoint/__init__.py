"""Checkpoints, where PyTorch keeps them (`torch.distributed.checkpoint`):

    sharded_checkpoint   `save_checkpoint` / `load_checkpoint`: every rank writes what it holds, through DCP
    state_dict           full state dicts of either design, gathered under the original names
                         (`torch.distributed.checkpoint.state_dict`'s `get_model_state_dict(full_state_dict=True)`)
    integrity            staging, checksums and an atomic commit: a checkpoint loads whole or says what is wrong
    sharded_boxes        a tensor held as arbitrary boxes, and the DCP planners that write and read it
    zero_checkpoint      what a checkpoint holds for a replicated model and its `ZeroRedundancyOptimizer`

Names load on first use: torch.distributed.checkpoint takes a while to import, and `fsdp_mini.full_state_dict`
needs none of it.
"""
from fsdp_mini.lazy_exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    "save_checkpoint": "fsdp_mini.checkpoint.sharded_checkpoint:save_checkpoint",
    "load_checkpoint": "fsdp_mini.checkpoint.sharded_checkpoint:load_checkpoint",
    "full_state_dict": "fsdp_mini.checkpoint.state_dict:full_state_dict",
    "load_full_state_dict": "fsdp_mini.checkpoint.state_dict:load_full_state_dict"})
