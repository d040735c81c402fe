"""The norm of a gradient held in shards across ranks, and clipping by it: what both FSDP designs' and
ZeRO-1's `clip_grad_norm_` compute, as `torch.nn.utils.clip_grad_norm_` would on the whole model.

Each rank sums |g|^p over its own shards (or takes the largest |g| for the infinity norm), one AllReduce of
that single number over the group that holds the shards gives the whole model's, and every rank scales its
shards by the same coefficient. Padding is zero, so it adds nothing.
"""
from __future__ import annotations

import torch

from fsdp_mini import collectives as C
from fsdp_mini.collective_calls import scope

__all__ = ["clip_sharded_grads_"]


def clip_sharded_grads_(grads: list[torch.Tensor], max_norm: float, norm_type: float = 2.0, group=None,
                        impl: str = "builtin", error_if_nonfinite: bool = False,
                        device: torch.device | None = None) -> torch.Tensor:
    """Clip `grads` (this rank's shards of one gradient) to `max_norm` of the whole gradient; returns its
    norm. `group`: the ranks the shards are spread over (None: nothing to sum, a rank holds all of it).
    `error_if_nonfinite`: raise, as PyTorch does, when the norm is nan or inf (every rank sees the same
    norm, so every rank raises) instead of scaling the gradients by it."""
    norm_type = float(norm_type)
    if not grads:
        return torch.zeros((), device=device)
    if norm_type == float("inf"):
        local, op = torch.stack([g.detach().abs().max() for g in grads]).max().float().reshape(1), C.MAX
    else:
        local, op = sum(g.detach().float().abs().pow(norm_type).sum() for g in grads).reshape(1), C.SUM
    if group is not None:
        with scope("clip_grad_norm_"):
            C.all_reduce(local, op, group=group, impl=impl)
    total = local[0] if op == C.MAX else local[0].pow(1.0 / norm_type)
    if error_if_nonfinite and not torch.isfinite(total):
        raise RuntimeError(f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, "
                           f"so it cannot be clipped. To disable this error and scale the gradients by the "
                           f"non-finite norm anyway, set `error_if_nonfinite=False`")
    coef = torch.clamp(float(max_norm) / (total + 1e-6), max=1.0)  # as torch.nn.utils.clip_grad_norm_
    for g in grads:
        g.mul_(coef.to(g.dtype))
    return total
