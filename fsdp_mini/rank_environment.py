"""What this rank is, read from torchrun's environment: its node-local index and world, the device it
computes on, and whether torch.distributed is up.

The engines' only view of the process they run in. Starting and ending a rank (`init`, `finish`, the
launcher's bookkeeping, the flight folder) is `fsdp_mini.runtime`'s, which the engines never import, so that
`import fsdp_mini.fsdp` loads nothing of launching. The names of the environment variables are torchrun's
(`torch.distributed.run`); `runtime.init` sets them for a plain script, a world of one.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

__all__ = ["BACKENDS", "default_backend", "local_world_size", "local_rank", "get_device", "require_distributed",
           "under_torchrun"]

BACKENDS = ("gloo", "nccl")


def default_backend() -> str:
    """NCCL when this machine has a GPU, gloo (CPU processes) otherwise."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def local_world_size(default: int) -> int:
    """Ranks on this node: torchrun's LOCAL_WORLD_SIZE, or `default` when nothing set it (a plain
    script, a notebook). It is what a hybrid strategy's shard group defaults to: one node."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", default))


def local_rank() -> int:
    """This rank's index on its node (torchrun's LOCAL_RANK): the GPU it drives."""
    return int(os.environ.get("LOCAL_RANK", 0))


def get_device() -> torch.device:
    """The device this rank computes on: `cuda:LOCAL_RANK` under NCCL, the CPU under gloo."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", local_rank())
    return torch.device("cpu")


def require_distributed(what: str) -> None:
    """Stop with a clear error, before any collective, when `torch.distributed` is not initialised: every
    distributed wrapper (DDP, ZeRO, both FSDP designs, sharded checkpoints) starts with this check."""
    if not dist.is_initialized():
        raise RuntimeError(f"{what} needs torch.distributed, which is not initialised: run under fsdp_mini.launch "
                           "or torchrun and call fsdp_mini.init() first")


def under_torchrun() -> bool:
    """True in a rank started by torchrun (or any `env://` launcher): RANK and WORLD_SIZE are set."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ
