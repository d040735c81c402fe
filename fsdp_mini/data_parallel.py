"""What every data-parallel wrapper here shares (DDP, FSDP): the same model on every rank, checked,
and gradient synchronisation that can be paused.

Same model everywhere: the ranks of a data-parallel job must build the same model (names, shapes,
dtypes, and for FSDP the same unit plan), or their first collective either hangs (different sizes) or
silently mixes unrelated tensors. `check_same_everywhere` hashes a description of the model on each rank
and compares the hashes with one tiny AllGather, so a mismatch fails at construction with the ranks
named, before any real collective.

Pausing sync: gradient accumulation over k micro-batches needs only the last backward to communicate.
`no_sync()` is PyTorch's name for that (DDP, FSDP1); FSDP2 calls it `set_requires_gradient_sync(False)`.
"""
from __future__ import annotations

import hashlib
from contextlib import contextmanager

import torch
import torch.distributed as dist

from fsdp_mini.collectives import torch_all_gather_into_tensor

__all__ = ["check_same_everywhere", "GradientSync"]


def check_same_everywhere(description: object, what: str, hint: str = "", group=None, device=None) -> None:
    """Raise a ValueError naming the ranks of `group` whose `repr(description)` differs from its rank 0's.

    Collective over `group` (every rank must call it). The message reads "ranks [1] wrap a different
    {what} than rank 0{hint}".
    """
    n = dist.get_world_size(group)
    if n == 1:
        return
    digest = int.from_bytes(hashlib.sha256(repr(description).encode()).digest()[:7], "big")
    mine = torch.tensor([digest], dtype=torch.int64, device=device)
    everyone = torch.empty(n, dtype=torch.int64, device=device)
    torch_all_gather_into_tensor(everyone, mine, group=group)
    differ = [r for r, d in enumerate(everyone.tolist()) if d != everyone[0].item()]
    if differ:
        raise ValueError(f"ranks {differ} wrap a different {what} than rank 0{hint}")


class GradientSync:
    """Mixin: `require_gradient_sync` says whether backward communicates gradients; `no_sync()` turns it
    off for a block (gradient accumulation), and the first backward after it reduces everything
    accumulated."""

    require_gradient_sync: bool = True

    @contextmanager
    def no_sync(self):
        """Accumulate gradients locally, without communication, inside the block."""
        previous, self.require_gradient_sync = self.require_gradient_sync, False
        try:
            yield
        finally:
            self.require_gradient_sync = previous
