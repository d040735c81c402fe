"""What every data-parallel wrapper here shares (DDP, FSDP): the same model on every rank, checked,
and gradient synchronisation that can be paused.

Same model everywhere: the ranks of a data-parallel job must build the same model (names, shapes,
dtypes, and for FSDP the same unit plan), or their first collective either hangs (different sizes) or
silently mixes unrelated tensors. `check_same_everywhere` hashes a description of the model on each rank
and compares the hashes with one tiny AllGather, so a mismatch fails at construction with the ranks
named, before any real collective.

Same starting values: data parallelism is only correct if every replica starts from the same weights.
A rank that forgot to seed its generator trains a different replica forever (NO_SHARD), or a patchwork of
shards from different initialisations (FULL_SHARD), silently. `check_same_values` compares a fingerprint
of every tensor across ranks and names the first one that differs; `broadcast_from_rank0` is the fix
PyTorch's DDP applies always and FSDP applies with `sync_module_states=True`.

Pausing sync: gradient accumulation over k micro-batches needs only the last backward to communicate.
`no_sync()` is PyTorch's name for that (DDP, FSDP1); FSDP2 calls it `set_requires_gradient_sync(False)`.
"""
from __future__ import annotations

import hashlib
from contextlib import contextmanager

import torch
import torch.distributed as dist

from fsdp_mini.collectives import torch_all_gather_into_tensor

__all__ = ["check_same_everywhere", "check_same_values", "check_same_fingerprints", "broadcast_from_rank0",
           "fingerprint", "GradientSync", "refuse_deepcopy"]


def _global_ranks(group, ranks: list[int]) -> list[int]:
    """The global ranks of `group`'s ranks: a message names a rank as the user sees it (on a 2-D mesh the
    checks run over subgroups, whose rank 0 is not global rank 0)."""
    if group is None or group is dist.group.WORLD:
        return list(ranks)
    return [dist.get_global_rank(group, r) for r in ranks]


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
        first, *others = _global_ranks(group, [0, *differ])
        raise ValueError(f"ranks {others} wrap a different {what} than rank {first}{hint}")


def fingerprint(t: torch.Tensor) -> torch.Tensor:
    """Two int64 sums of a tensor's bits (of all elements, and of every other one, so that a swap shows):
    equal bits give equal sums on any device and in any summation order (integer addition, wrapping), and
    different values, in practice, different sums. Bits, not values: a NaN equals the same NaN, and no
    float64 copy of the tensor is made. (DDP and FSDP compare the starting values with it; ZeRO-1, whether
    the ranks' gradients are the same average.)"""
    x = t.detach().reshape(-1)
    if x.numel() == 0:
        return torch.zeros(2, dtype=torch.int64, device=x.device)
    bits = x.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}.get(x.element_size(), torch.int64))
    return torch.stack([bits.sum(dtype=torch.int64), bits[::2].sum(dtype=torch.int64)])


def check_same_values(named: list[tuple[str, torch.Tensor]], group=None, device=None, where: str = "") -> None:
    """Raise a ValueError naming the ranks whose tensors differ from rank 0's, and the first such tensor
    (its name, then `where`). Collective over `group` (one AllGather of 2 numbers per tensor)."""
    check_same_fingerprints([(name, fingerprint(t)) for name, t in named], group, device, where)


def check_same_fingerprints(named: list[tuple[str, torch.Tensor]], group=None, device=None, where: str = "") -> None:
    """`check_same_values` on fingerprints taken earlier (e.g. of a unit's values before it was sharded)."""
    n = dist.get_world_size(group)
    if n == 1 or not named:
        return
    mine = torch.stack([fp for _, fp in named]).to(device)
    everyone = torch.empty((n, *mine.shape), dtype=mine.dtype, device=mine.device)
    torch_all_gather_into_tensor(everyone.view(-1), mine.view(-1), group=group)
    differs = everyone != everyone[0]
    differ = {r: int(differs[r].any(dim=1).nonzero()[0]) for r in range(1, n) if differs[r].any()}
    if differ:
        first = named[min(differ.values())][0]
        source, *others = _global_ranks(group, [0, *sorted(differ)])
        raise ValueError(f"ranks {others} start from different values than rank {source} (first differing: "
                         f"{first}{where}): seed every rank the same way before building the model, or pass "
                         f"sync_module_states=True to start every rank from rank {source}'s values")


def refuse_deepcopy(design: str):
    """`copy.deepcopy` of a sharded model (or of a module that holds one, e.g. for an EMA copy): its parameters
    are this rank's shards, tied to process groups that cannot be copied, so say what to do instead of
    "cannot pickle ProcessGroup". PyTorch's FSDP2 refuses too ("FSDP does not support deepcopy")."""
    raise RuntimeError(f"a model sharded by {design} cannot be deep-copied: its parameters are this rank's shards, "
                       f"bound to process groups. For a copy (an EMA model, say), deep-copy the model before "
                       f"sharding it, or build a fresh one and load fsdp_mini.full_state_dict(model) into it")


def broadcast_from_rank0(tensors: list[torch.Tensor], group=None) -> None:
    """Overwrite `tensors` with rank 0's (of `group`): one broadcast per dtype of all of them flattened
    together (few large messages, as PyTorch's DDP does at construction)."""
    if dist.get_world_size(group) == 1:
        return
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    with torch.no_grad():
        for same in by_dtype.values():
            flat = torch.cat([t.detach().reshape(-1) for t in same])
            dist.broadcast(flat, group=group, group_src=0)
            for t, value in zip(same, flat.split([t.numel() for t in same])):
                t.copy_(value.view_as(t))


class GradientSync:
    """Mixin: `requires_gradient_sync` says whether backward communicates gradients; `no_sync()` turns it
    off for a block (gradient accumulation), and the first backward after it reduces everything
    accumulated."""

    requires_gradient_sync: bool = True

    @contextmanager
    def no_sync(self):
        """Accumulate gradients locally, without communication, inside the block."""
        previous, self.requires_gradient_sync = self.requires_gradient_sync, False
        try:
            yield
        finally:
            self.requires_gradient_sync = previous
