"""Collectives by hand, from point-to-point sends, and logged wrappers of torch's builtins.

Written by hand because this is what the course teaches: a ring all-reduce is a ring reduce-scatter
followed by a ring all-gather, and FSDP is what you get when you stop doing the two back to back.
Everything else (the transport, the process groups) is torch.distributed's.

Signatures mirror torch.distributed: `ring_reduce_scatter(output, input, op, group)` with input = n x
output elements, `ring_all_gather(output, input, group)` with output = n x input elements,
`ring_all_reduce(tensor, op, group)` in place for any size. The wrappers `all_reduce`,
`reduce_scatter_tensor` and `all_gather_into_tensor` take torch's arguments plus `impl="builtin"` or
`"ring"`, so the engine can switch between them. Each call is published to whoever listens
(`fsdp_mini.collective_calls`: CommLog, the flight recorder). Ops: SUM and AVG,
and MAX for the all-reduces and the ring reduce-scatter (a gradient's infinity norm).

Point to point, for pipeline stages: `send` / `recv` and `isend` / `irecv` (torch's names and arguments, the
peer a global rank), logged as ops "send" (this rank sent the tensor's bytes) and "recv" (it sent none), their
group the pair (source, destination), so that the flight recorder pairs a send with its receive.

`async_op=True` returns a handle with `.wait()`, as torch does. Hand-written ops then run on one
background thread per process, in issue order: like a GPU's communication stream, it lets the next
unit's all-gather travel while this unit computes, and keeps every rank's ops in the same order.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch
import torch.distributed as dist

from fsdp_mini.collective_calls import CollectiveCall
from fsdp_mini.ring_model import ring_model_sent

__all__ = ["ring_reduce_scatter", "ring_all_gather", "ring_all_reduce", "all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor", "IMPLS", "SUM", "AVG", "MAX",
           "check_impl", "torch_all_gather_into_tensor", "torch_reduce_scatter_tensor", "send", "recv", "isend",
           "irecv"]

SUM, AVG, MAX = dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MAX
IMPLS = ("builtin", "ring")

# The one version shim. torch 2.13 renamed all_gather_into_tensor / reduce_scatter_tensor to
# all_gather_single / reduce_scatter_single (same signatures) and warns on the old names; older torch
# has only the old ones. Every builtin call of these two collectives in fsdp_mini goes through here.
torch_all_gather_into_tensor = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
torch_reduce_scatter_tensor = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@dataclass(frozen=True)
class _Group:
    """Where this rank sits in a group's ring: its rank, the size, and its two neighbours."""

    pg: object
    rank: int
    size: int
    global_rank: int
    ranks: tuple[int, ...]  # the group's global ranks (what the flight recorder keys on)

    @property
    def right(self) -> int:
        return (self.rank + 1) % self.size

    @property
    def left(self) -> int:
        return (self.rank - 1) % self.size


_group_ranks: dict[object, tuple[int, ...]] = {}


def _group(group) -> _Group:
    pg = group if group is not None else dist.group.WORLD
    ranks = _group_ranks.get(pg)
    if ranks is None:
        ranks = _group_ranks[pg] = tuple(dist.get_process_group_ranks(pg))
    return _Group(pg, dist.get_rank(pg), dist.get_world_size(pg), dist.get_rank(), ranks)


def _issue(op: str, impl: str, nbytes: int, g: _Group, tensors, sent: int = 0) -> CollectiveCall:
    """A collective being issued, published to the listeners (CommLog, the flight recorder)."""
    return CollectiveCall(op, impl, nbytes, g.size, g.global_rank, sent=sent, group=g.ranks, tensors=tensors)


def _check_op(op, allowed=(SUM, AVG)) -> None:
    if op not in allowed:
        names = " or ".join(f"ReduceOp.{o.name}" for o in allowed)
        raise ValueError(f"op must be {names}, got {op}")


def _flat(t: torch.Tensor, name: str) -> torch.Tensor:
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")
    return t.view(-1)


class Work:
    """Handle of an async collective, like torch's `Work`: `wait()` blocks until it is done."""

    def __init__(self, wait_fn, pending: CollectiveCall):
        self._wait_fn, self._pending, self._done = wait_fn, pending, False

    def wait(self) -> bool:
        if not self._done:
            self._wait_fn()
            self._done = True
            self._pending.finish()
        return True


# --- the hand-written ring ------------------------------------------------------------------------

_executor: tuple[int, ThreadPoolExecutor] | None = None
_executor_lock = threading.Lock()


def _comm_thread() -> ThreadPoolExecutor:
    """One communication thread per process (re-created after fork: threads do not survive it)."""
    global _executor
    with _executor_lock:
        if _executor is None or _executor[0] != os.getpid():
            _executor = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="fsdp_mini-comm"))
        return _executor[1]


def _exchange(send: torch.Tensor, recv: torch.Tensor, g: _Group, pending: CollectiveCall) -> None:
    """One ring step: send `send` to the right neighbour while receiving `recv` from the left one."""
    reqs = [dist.isend(send, group=g.pg, group_dst=g.right), dist.irecv(recv, group=g.pg, group_src=g.left)]
    for req in reqs:
        req.wait()
    pending.sent += send.numel() * send.element_size()


_scratch: dict[tuple, torch.Tensor] = {}


def _buffer(slot: int, numel: int, like: torch.Tensor) -> torch.Tensor:
    """A reusable scratch buffer (like NCCL's internal ones). Fresh allocations of tens of MiB cost
    more than the transfer itself here: each is a new mmap whose pages fault in on first touch.
    Only the communication thread uses them, one op at a time."""
    key = (slot, like.dtype, like.device)
    buf = _scratch.get(key)
    if buf is None or buf.numel() < numel:
        buf = _scratch[key] = torch.empty(numel, dtype=like.dtype, device=like.device)
    return buf[:numel]


_PIECE_ELEMS = 1 << 20  # 4 MiB of fp32: reduce one piece while the next one is still arriving


def _rs(out: torch.Tensor, inp: torch.Tensor, op, g: _Group, pending: CollectiveCall) -> None:
    n, r = g.size, g.rank
    chunks = inp.view(n, -1)
    if n == 1:
        out.copy_(chunks[0])
        return
    bufs = (_buffer(0, out.numel(), out), _buffer(1, out.numel(), out))
    # In pieces: the transport fills piece k+1 while this thread adds piece k (a pipeline).
    pieces = [(i, min(i + _PIECE_ELEMS, out.numel())) for i in range(0, out.numel(), _PIECE_ELEMS)]
    send = chunks[(r - 1) % n]
    for step in range(n - 1):
        recv = bufs[step % 2]
        # recv gets the partial sum of chunk j over ranks r-step-1..r-1; this rank adds its part.
        j = (r - step - 2) % n
        target = out if step == n - 2 else recv  # at the last step j == r: write the result in place
        sends = [dist.isend(send[a:b], group=g.pg, group_dst=g.right) for a, b in pieces]
        recvs = [dist.irecv(recv[a:b], group=g.pg, group_src=g.left) for a, b in pieces]
        for (a, b), req in zip(pieces, recvs):
            req.wait()
            (torch.maximum if op == MAX else torch.add)(recv[a:b], chunks[j][a:b], out=target[a:b])
        for req in sends:
            req.wait()
        pending.sent += send.numel() * send.element_size()
        send = recv
    if op == AVG:
        out.div_(n)


def _ag(out: torch.Tensor, inp: torch.Tensor, g: _Group, pending: CollectiveCall) -> None:
    n, r = g.size, g.rank
    chunks = out.view(n, -1)
    if chunks[r].data_ptr() != inp.data_ptr():
        chunks[r].copy_(inp)
    for step in range(n - 1):
        # Forward the chunk received last step (at first: our own) and receive the next one in place.
        _exchange(chunks[(r - step) % n], chunks[(r - step - 1) % n], g, pending)


def _run(body, pending: CollectiveCall, async_op: bool, n: int):
    """Run a ring op on the communication thread; block unless async_op."""
    if n == 1 and not async_op:
        body()
        pending.finish()
        return None
    future: Future = _comm_thread().submit(body)
    work = Work(future.result, pending)
    return work if async_op else work.wait() and None


def ring_reduce_scatter(output: torch.Tensor, input: torch.Tensor, op=SUM, group=None, async_op=False):
    """Ring reduce-scatter: rank r ends with the reduced chunk r of `input` (n chunks of output's size).

    n-1 steps. At step s rank r sends to rank r+1 a running sum for chunk (r-s-1) mod n (at s=0 its own
    raw chunk r-1) and receives from rank r-1 the running sum for chunk (r-s-2) mod n, to which it adds
    its own part. After n-1 steps that chunk is r, summed over all n ranks. Each rank sends
    (n-1)·S/n bytes: the bandwidth optimum, and half of an all-reduce.
    """
    _check_op(op, (SUM, AVG, MAX))
    g, inp, out = _group(group), _flat(input, "input"), _flat(output, "output")
    if inp.numel() != g.size * out.numel():
        raise ValueError(f"input has {inp.numel()} elements, expected group size {g.size} x output's {out.numel()}")
    pending = _issue("reduce_scatter", "ring", inp.numel() * inp.element_size(), g, (inp,))
    return _run(lambda: _rs(out, inp, op, g, pending), pending, async_op, g.size)


def ring_all_gather(output: torch.Tensor, input: torch.Tensor, group=None, async_op=False):
    """Ring all-gather: `output` = every rank's `input`, concatenated in rank order.

    n-1 steps. Rank r first places its input in chunk r; at step s it sends chunk (r-s) mod n to rank
    r+1 and receives chunk (r-s-1) mod n from rank r-1, straight into `output` (no copies). Each rank
    sends (n-1)·S/n bytes, S = output's size.
    """
    g, inp, out = _group(group), _flat(input, "input"), _flat(output, "output")
    if out.numel() != g.size * inp.numel():
        raise ValueError(f"output has {out.numel()} elements, expected group size {g.size} x input's {inp.numel()}")
    pending = _issue("all_gather", "ring", out.numel() * out.element_size(), g, (inp,))
    return _run(lambda: _ag(out, inp, g, pending), pending, async_op, g.size)


def ring_all_reduce(tensor: torch.Tensor, op=SUM, group=None, async_op=False):
    """Ring all-reduce in place = ring reduce-scatter, then ring all-gather, of the same buffer.

    Any size: the tensor is padded to n equal chunks of ceil(numel/n) elements (zeros do not change a
    sum). Step by step: the n-1 reduce-scatter steps leave rank r with the sum of chunk r, the n-1
    all-gather steps hand every finished chunk around the ring. Each rank sends 2(n-1)·ceil(numel/n)
    elements, about 2(n-1)/n·S: nearly independent of n, unlike the naive all-reduce through rank 0,
    whose root sends (n-1)·S.
    """
    _check_op(op, (SUM, AVG, MAX))
    g = _group(group)
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)
    numel, n = flat.numel(), g.size
    chunk = -(-numel // n)
    pending = _issue("all_reduce", "ring", numel * flat.element_size(), g, (flat,))

    def body():
        buf = flat
        if chunk * n != numel:
            buf = _buffer(2, chunk * n, flat)
            buf[:numel].copy_(flat)
            buf[numel:].zero_()
        mine = buf.view(n, chunk)[g.rank]
        _rs(mine, buf, op, g, pending)
        _ag(buf, mine, g, pending)
        if buf is not flat:
            flat.copy_(buf[:numel])
        if flat.data_ptr() != tensor.data_ptr():
            tensor.copy_(flat.view_as(tensor))

    return _run(body, pending, async_op, n)


# --- logged wrappers with torch's signatures ------------------------------------------------------

def check_impl(impl: str) -> None:
    """A clear error for an unknown `impl` (what the engine's constructors check first)."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")


def _builtin(call, post, pending: CollectiveCall, async_op: bool):
    work = call()
    handle = Work(lambda: (work.wait(), post and post()), pending)
    return handle if async_op else handle.wait() and None


def all_reduce(tensor: torch.Tensor, op=SUM, group=None, async_op=False, impl="builtin"):
    """`torch.distributed.all_reduce`, logged; impl="ring" runs `ring_all_reduce` instead."""
    check_impl(impl)
    if impl == "ring":
        return ring_all_reduce(tensor, op, group, async_op)
    _check_op(op, (SUM, AVG, MAX))
    g = _group(group)
    pending = _issue("all_reduce", "builtin", tensor.numel() * tensor.element_size(), g, (tensor,),
                     sent=ring_model_sent("all_reduce", tensor.numel(), tensor.element_size(), g.size))
    # AVG as a SUM and a division on this rank: one code path for every backend and for the ring (torch
    # 2.13's gloo and NCCL also have AVG themselves; the result is the same).
    post = (lambda: tensor.div_(g.size)) if op == AVG else None
    wire_op = SUM if op == AVG else op
    return _builtin(lambda: dist.all_reduce(tensor, wire_op, group=g.pg, async_op=True), post, pending, async_op)


def reduce_scatter_tensor(output: torch.Tensor, input: torch.Tensor, op=SUM, group=None, async_op=False,
                          impl="builtin"):
    """`torch.distributed.reduce_scatter_tensor`, logged; impl="ring" runs `ring_reduce_scatter`."""
    check_impl(impl)
    if impl == "ring":
        return ring_reduce_scatter(output, input, op, group, async_op)
    _check_op(op)
    g = _group(group)
    pending = _issue("reduce_scatter", "builtin", input.numel() * input.element_size(), g, (input,),
                     sent=ring_model_sent("reduce_scatter", input.numel(), input.element_size(), g.size))
    return _builtin(lambda: torch_reduce_scatter_tensor(output, input, op, group=g.pg, async_op=True), None,
                    pending, async_op)


def all_gather_into_tensor(output: torch.Tensor, input: torch.Tensor, group=None, async_op=False,
                           impl="builtin"):
    """`torch.distributed.all_gather_into_tensor`, logged; impl="ring" runs `ring_all_gather`."""
    check_impl(impl)
    if impl == "ring":
        return ring_all_gather(output, input, group, async_op)
    g = _group(group)
    pending = _issue("all_gather", "builtin", output.numel() * output.element_size(), g, (input,),
                     sent=ring_model_sent("all_gather", output.numel(), output.element_size(), g.size))
    return _builtin(lambda: torch_all_gather_into_tensor(output, input, group=g.pg, async_op=True), None,
                    pending, async_op)


# --- point to point -------------------------------------------------------------------------------------

def _p2p(op: str, tensor: torch.Tensor, peer: int, group, async_op: bool, tag: int = 0):
    g = _group(group)
    world = dist.get_world_size()
    if isinstance(peer, bool) or not isinstance(peer, int) or not 0 <= peer < world or peer == g.global_rank:
        raise ValueError(f"{op}: peer {peer!r} must be another rank of the world's {world} (this is rank "
                         f"{g.global_rank})")
    if peer not in g.ranks:
        raise ValueError(f"{op}: rank {peer} is not in the group of ranks {list(g.ranks)}")
    nbytes = tensor.numel() * tensor.element_size()
    pair = (g.global_rank, peer) if op == "send" else (peer, g.global_rank)
    pending = CollectiveCall(op, "builtin", nbytes, 2, g.global_rank, sent=nbytes if op == "send" else 0,
                             group=pair, tensors=(tensor,), channel=tag)
    if op == "send":
        call = lambda: dist.isend(tensor, dst=peer, group=g.pg, tag=tag)  # noqa: E731
    else:
        call = lambda: dist.irecv(tensor, src=peer, group=g.pg, tag=tag)  # noqa: E731
    return _builtin(call, None, pending, async_op)


def isend(tensor: torch.Tensor, dst: int, group=None, tag: int = 0) -> Work:
    """`torch.distributed.isend`, logged: send `tensor` to global rank `dst`; `.wait()` on the handle. A receive
    takes the sends of its `tag` from that rank in the order they were sent."""
    return _p2p("send", tensor, dst, group, async_op=True, tag=tag)


def irecv(tensor: torch.Tensor, src: int, group=None, tag: int = 0) -> Work:
    """`torch.distributed.irecv`, logged: receive into `tensor` from global rank `src`; `.wait()` on the handle."""
    return _p2p("recv", tensor, src, group, async_op=True, tag=tag)


def send(tensor: torch.Tensor, dst: int, group=None, tag: int = 0) -> None:
    """`torch.distributed.send`, logged: blocks until the tensor has been sent."""
    _p2p("send", tensor, dst, group, async_op=False, tag=tag)


def recv(tensor: torch.Tensor, src: int, group=None, tag: int = 0) -> None:
    """`torch.distributed.recv`, logged: blocks until `tensor` holds what `src` sent."""
    _p2p("recv", tensor, src, group, async_op=False, tag=tag)
