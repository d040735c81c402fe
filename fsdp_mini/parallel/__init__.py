"""Data parallelism without sharding, where PyTorch keeps DDP (`torch.nn.parallel`):

    ddp             `DistributedDataParallel`: DDP from scratch (torch/nn/parallel/distributed.py)
    grad_buckets    DDP's bucket rule, also NO_SHARD's bucketed AllReduce (PyTorch's C++ `Reducer`)
    data_parallel   what every data-parallel wrapper shares (DDP, both FSDP designs): the same model on
                    every rank, checked; `no_sync()`
"""
from fsdp_mini.lazy_exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {"DistributedDataParallel": "fsdp_mini.parallel.ddp:DistributedDataParallel"})
