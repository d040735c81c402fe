"""Composable APIs applied to a module in place, where PyTorch keeps them (`torch.distributed._composable`):

    replicate             DDP as a composable API (`torch.distributed._composable.replicate`)
    replicate_with_fsdp   FSDP2's replicate, through `fully_shard`'s units (`..._composable.replicate_with_fsdp`)

Each module's `replicate` is imported from it; `fsdp_mini.replicate` is the first one.
"""
