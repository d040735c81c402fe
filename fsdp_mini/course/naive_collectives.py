"""The AllReduce the obvious way, through rank 0: lesson 01's baseline beside the library's ring.

Every rank sends its tensor to rank 0, which sums them and sends the result back to each (a reduce, then a
broadcast). Rank 0 sends (n-1)·S bytes, so its link is the bottleneck and the time grows linearly with n,
where the ring (`fsdp_mini.collectives.ring_all_reduce`) sends 2(n-1)/n·S from every rank. No engine uses
it: it is a teaching baseline, so it lives on the course floor. It is published as the library's collectives
are, as a `collective_calls.CollectiveCall` (CommLog counts its bytes send by send; the flight recorder enters it).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from fsdp_mini.collectives import AVG, SUM
from fsdp_mini.collective_calls import CollectiveCall

__all__ = ["naive_all_reduce"]


def naive_all_reduce(tensor: torch.Tensor, op=SUM, group=None) -> None:
    """All-reduce the obvious way, for contrast: every rank sends its tensor to rank 0, which sums and
    sends the result back to each. Rank 0 receives and sends (n-1)·S bytes, so its link is the
    bottleneck and the time grows linearly with n; the others send S each. In place, SUM or AVG,
    blocking, on the calling thread (finish the library's async collectives on `group` first).
    """
    if op not in (SUM, AVG):
        raise ValueError(f"op must be ReduceOp.SUM or ReduceOp.AVG, got {op}")
    if not tensor.is_contiguous():
        raise ValueError("tensor must be contiguous")
    group = group if group is not None else dist.group.WORLD
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    flat = tensor.view(-1)
    nbytes = flat.numel() * flat.element_size()
    pending = CollectiveCall("all_reduce", "naive", nbytes, n, dist.get_rank(),  # what CommLog records
                             group=tuple(dist.get_process_group_ranks(group)), tensors=(flat,))

    if rank == 0:
        incoming = torch.empty_like(flat)
        for src in range(1, n):  # sequential: the root's one link carries everything
            dist.recv(incoming, group=group, group_src=src)
            flat.add_(incoming)
        if op == AVG:
            flat.div_(n)
        for dst in range(1, n):
            dist.send(flat, group=group, group_dst=dst)
            pending.sent += nbytes
    else:
        dist.send(flat, group=group, group_dst=0)
        pending.sent += nbytes
        dist.recv(flat, group=group, group_src=0)
    pending.finish()
