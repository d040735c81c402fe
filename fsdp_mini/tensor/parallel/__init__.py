"""Tensor and sequence parallelism, where PyTorch keeps them (`torch.distributed.tensor.parallel`):

    parallelize    `parallelize_module` with `ColwiseParallel`, `RowwiseParallel`, `SequenceParallel`,
                   `PrepareModuleInput` (PyTorch's api.py and style.py), from scratch
    tp_operators   Megatron-LM's f and g, and sequence parallelism's AllGather / ReduceScatter pair
"""
from fsdp_mini.lazy_exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    name: f"fsdp_mini.tensor.parallel.parallelize:{name}"
    for name in ("parallelize_module", "ColwiseParallel", "RowwiseParallel", "SequenceParallel", "PrepareModuleInput",
                 "ParallelStyle")})
