"""The training loop that tests, lessons and the demo share: data parallel over the global batch.

Every rank builds the same global batch and trains on its own rows, so the mean of the ranks' losses
is exactly the single-process loss on the whole batch, and averaging gradients (what every strategy
does) gives exactly the single-process gradient. That is what makes parity a meaningful test.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from fsdp_mini.rank_environment import get_device
from fsdp_mini.course.models import GPTConfig, make_batch

__all__ = ["local_rows", "train", "hybrid_shard_size"]


def hybrid_shard_size(world: int) -> int:
    """How the demo and the benchmark lay out a hybrid strategy on one machine: two "nodes" when the
    world splits evenly (4 ranks: a 2 x 2 grid), else one."""
    return world // 2 if world >= 4 and world % 2 == 0 else world


def local_rows(t: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """This rank's contiguous slice of a global batch (the batch must split evenly)."""
    if t.shape[0] % world_size:
        raise ValueError(f"global batch of {t.shape[0]} rows does not split over {world_size} ranks")
    per = t.shape[0] // world_size
    return t[rank * per:(rank + 1) * per]


def train(model, optimizer, cfg: GPTConfig, steps: int, batch_size: int, max_norm: float | None = None,
          device=None, seed: int = 0, shard_batch: bool = True,
          rows_of: tuple[int, int] | None = None) -> list[float]:
    """Train `steps` steps on `make_batch(cfg, batch_size, step)`; return this rank's local losses.

    Inside torch.distributed each rank takes its rows on its device; outside it (or with
    `shard_batch=False`, e.g. a reference computed on one rank) the whole batch. `rows_of`: the (rank,
    size) whose rows this rank takes when they are not its global ones: on a (dp, tp) mesh its data-parallel
    coordinates, since every rank of a TP group works on the same rows.
    `max_norm` clips with the model's own `clip_grad_norm_` if it has one (FSDP), else the optimizer's
    (ZeRO-1 on a plain model, whose `.grad` is each rank's own until it reduces them), else torch's."""
    distributed = dist.is_initialized() and shard_batch
    rank, world = (rows_of or (dist.get_rank(), dist.get_world_size())) if distributed else (0, 1)
    device = device or (get_device() if distributed else "cpu")
    losses = []
    for step in range(steps):
        x, y = (local_rows(t, rank, world).to(device) for t in make_batch(cfg, batch_size, step, seed))
        loss = model(x, y)
        loss.backward()
        if max_norm is not None:
            clip = getattr(model, "clip_grad_norm_", None) or getattr(optimizer, "clip_grad_norm_", None)
            if clip is not None:
                clip(max_norm)
            else:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses
