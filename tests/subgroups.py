"""Subgroups for collective tests: the 2x2 layouts hybrid sharding uses, and a rank's own group among them.

Every rank must create every group (`dist.new_group` is collective over the world), then use the one it
belongs to."""
from __future__ import annotations

import torch.distributed as dist

__all__ = ["SHARD_GROUPS", "REPLICA_GROUPS", "own_group"]

SHARD_GROUPS = ((0, 1), (2, 3))    # a 2x2 world's shard groups, as hybrid sharding forms them
REPLICA_GROUPS = ((0, 2), (1, 3))  # and its replica groups


def own_group(group_ranks):
    """This rank's group among `group_ranks` (every rank creates all of them), or None (the world) for None."""
    if group_ranks is None:
        return None
    groups = [dist.new_group(ranks) for ranks in group_ranks]
    return next(g for g, ranks in zip(groups, group_ranks) if dist.get_rank() in ranks)
