"""Distributed optimizers, where PyTorch keeps them (`torch.distributed.optim`):

    zero   `ZeroRedundancyOptimizer`: ZeRO stage 1, the optimizer state sharded (PyTorch's zero_redundancy_optimizer.py)
"""
from fsdp_mini.lazy_exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {"ZeroRedundancyOptimizer": "fsdp_mini.optim.zero:ZeroRedundancyOptimizer"})
