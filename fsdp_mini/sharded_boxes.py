"""A tensor that ranks hold in arbitrary boxes, shown to DCP as a ShardedTensor.

Both sharded checkpoints write their pieces this way: the flat design's (`fsdp_mini.checkpoint`: a shard is
a run of a flat buffer, a few rectangular boxes of each parameter) and ZeRO-1's (`fsdp_mini.zero_checkpoint`:
a run of each flattened parameter). A DTensor cannot describe either, since its shards are the even
`torch.chunk` pieces of a device mesh; a ShardedTensor is a list of arbitrary boxes with owners, built on
each rank without communication because every rank can compute every other rank's boxes from the layout.
"""
from __future__ import annotations

import math
import warnings
from contextlib import contextmanager
from typing import Callable

import torch
import torch.distributed as dist

from fsdp_mini.runtime import local_world_size
from fsdp_mini.torch_internals import Shard, ShardedTensor, ShardedTensorMetadata, ShardMetadata, TensorProperties

__all__ = ["Box", "quiet", "device_names", "sharded_tensor"]

Box = tuple[int, tuple[int, ...], tuple[int, ...], int]  # (global rank, offsets, sizes, offset in its local run)


@contextmanager
def quiet():
    """Silence ShardedTensor's deprecation warning, which every torch function called on one (by DCP
    too: `.size()`, `.device`) raises. It is noise here: DCP's ShardedTensor path is still the one
    PyTorch's own FSDP takes for SHARDED_STATE_DICT, and DTensor cannot describe FSDP's pieces."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*deprecating ShardedTensor.*", category=FutureWarning)
        yield


def device_names(device: torch.device) -> Callable[[int], str]:
    """The device each global rank holds its boxes on, as a placement names it: on GPUs rank r's local
    index (r modulo the ranks per node), else this rank's device for everyone."""
    if device.type == "cuda":
        local = local_world_size(default=torch.cuda.device_count())
        return lambda rank: f"cuda:{rank % local}"
    return lambda rank: str(device)


def sharded_tensor(local: torch.Tensor, boxes: list[Box], size: tuple[int, ...],
                   device_of: Callable[[int], str]) -> ShardedTensor:
    """A ShardedTensor of shape `size` made of `boxes`; this rank's boxes are views of `local` (its flat run:
    a box of `sizes` starts at its offset there), so saving copies nothing and loading writes in place."""
    me = dist.get_rank()
    metas, shards = [], []
    for rank, offsets, sizes, at in boxes:
        device = str(local.device) if rank == me else device_of(rank)
        md = ShardMetadata(shard_offsets=list(offsets), shard_sizes=list(sizes), placement=f"rank:{rank}/{device}")
        metas.append(md)
        if rank == me:
            shards.append(Shard(local[at:at + math.prod(sizes)].view(sizes), md))
    props = TensorProperties(dtype=local.dtype, layout=torch.strided, requires_grad=False,
                             memory_format=torch.contiguous_format, pin_memory=False)
    global_md = ShardedTensorMetadata(shards_metadata=metas, size=torch.Size(size), tensor_properties=props)
    with quiet():
        return ShardedTensor._init_from_local_shards_and_global_metadata(shards, global_md)
