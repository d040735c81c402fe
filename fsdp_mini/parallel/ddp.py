"""DDP from scratch: every rank keeps the whole model, trains on its slice of the batch, and averages
gradients with AllReduce, bucket by bucket, while backward is still running.

    model = DistributedDataParallel(GPT(cfg), bucket_cap_mb=25)   # the name and knob of torch's DDP
    loss = model(x_local, y_local); loss.backward()                 # p.grad = the global-batch gradient
    opt.step()

Why averaging is enough: with equal slices, the mean of the ranks' mean-loss gradients is the gradient
of the mean loss over the whole batch, so every rank takes the step one process would take on the
global batch, and the replicas stay identical (they start identical: rank 0's weights are broadcast).

Three ideas turn the naive version (`all_reduce_gradients`: one blocking AllReduce per parameter after
backward) into a fast one, and they are what torch.nn.parallel.DistributedDataParallel does:

  1. buckets   gradients are packed into buckets of about `bucket_cap_mb` MiB (`fsdp_mini.parallel.grad_buckets`:
               DDP's rule, a bucket closes once it holds at least the cap) and each bucket is one
               AllReduce: every collective pays a fixed latency, so fewer, larger messages amortise it
               (a transformer has many tiny tensors: LayerNorm weights, biases).
  2. reverse   buckets are filled in reverse registration order, the order in which backward produces
               gradients (last layers first), so the first buckets are complete early.
  3. overlap   a hook on each parameter fires when its gradient is accumulated; when a bucket's last
               gradient arrives, its AllReduce starts (async) and travels while backward computes the
               gradients of earlier layers. At the end of backward one callback waits for them all.

Buckets are always started in index order, on every rank: collectives must be issued in the same
order everywhere, and a bucket can complete out of order (an unused parameter, a different graph).

Differences from torch's DDP, for reading its code next: torch makes the first bucket small (1 MiB) by
default, rebuilds buckets after the first iteration in the order gradients really arrived, copies
gradients into preallocated bucket buffers in the hook (here the bucket is flattened when it is
complete), re-broadcasts buffers at every forward (here only at construction), and needs
`find_unused_parameters=True` for parameters without gradients, which it then leaves at None when no
rank used them; here every trainable parameter ends a synchronised backward with a gradient (zeros
if no rank used it). fsdp_mini.FSDP with NO_SHARD does the same job with whole FSDP units as the tensors
it puts in buckets, by the same rule.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from fsdp_mini import collectives as C
from fsdp_mini.collective_calls import scope
from fsdp_mini.parallel.data_parallel import GradientSync, broadcast_from_rank0, check_same_everywhere
from fsdp_mini.parallel.grad_buckets import MiB, assign_buckets, check_bucket_cap_mb
from fsdp_mini.rank_environment import get_device, require_distributed
from fsdp_mini.torch_internals import queue_after_backward
from fsdp_mini.weak_hooks import weak_hook

__all__ = ["DistributedDataParallel", "Bucket", "plan_buckets", "all_reduce_gradients"]


@dataclass(frozen=True)
class Bucket:
    """One bucket: the parameters (by name, in the order backward produces their gradients) whose
    gradients travel together in one AllReduce."""

    index: int
    names: tuple[str, ...]
    numels: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        return sum(self.numels)

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.dtype).element_size()


def plan_buckets(module: nn.Module, bucket_cap_mb: float = 25) -> list[Bucket]:
    """Group `module`'s trainable parameters into buckets of about `bucket_cap_mb` MiB (pure: no
    communication, works on the meta device), as PyTorch's DDP does.

    Parameters are taken in *reverse* registration order: backward runs the layers from last to first,
    so that is roughly the order in which gradients become ready, and bucket 0 fills up first. A tied
    parameter (embedding = head) counts once, under its first name. A bucket closes as soon as it holds
    at least the cap, and each dtype fills its own bucket (`fsdp_mini.parallel.grad_buckets`). A tiny cap gives
    one bucket per parameter, a huge one a single bucket per dtype.
    """
    check_bucket_cap_mb(bucket_cap_mb)
    trainable = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
    params = dict(trainable)
    backward_order = [(name, p.numel() * p.element_size(), p.dtype) for name, p in reversed(trainable)]
    return [Bucket(i, tuple(names), tuple(params[n].numel() for n in names), params[names[0]].dtype)
            for i, names in enumerate(assign_buckets(backward_order, bucket_cap_mb * MiB))]


def all_reduce_gradients(module: nn.Module, group=None, impl: str = "builtin") -> None:
    """The naive data-parallel step, for contrast: after backward, average every gradient across the
    ranks with one blocking AllReduce per parameter. Correct, but it pays one collective's latency per
    tensor (dozens of tiny messages) and the network idles during all of backward."""
    C.check_impl(impl)
    for name, p in module.named_parameters():
        if p.requires_grad:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            with scope(name):
                C.all_reduce(p.grad, C.AVG, group=group, impl=impl)


class DistributedDataParallel(GradientSync, nn.Module):
    """Data parallelism with bucketed, overlapped gradient AllReduce (see the module doc).

    `bucket_cap_mb`: the bucket size in MiB, as in torch's DDP (a bucket closes once it reaches it). `impl`: "builtin"
    (torch.distributed) or "ring" (fsdp_mini's hand-written ring). `group`: the process group to
    average over (default: all ranks); its rank 0 broadcasts the initial parameters and buffers.
    `buckets` lists the plan; `no_sync()` accumulates gradients locally.
    """

    def __init__(self, module: nn.Module, bucket_cap_mb: float = 25, impl: str = "builtin", group=None):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise ValueError(f"module must be an nn.Module, got {type(module).__name__}")
        if isinstance(module, DistributedDataParallel):
            raise ValueError("module is already wrapped in DistributedDataParallel")
        check_bucket_cap_mb(bucket_cap_mb)
        C.check_impl(impl)
        require_distributed("DistributedDataParallel")
        # On this rank's device (cuda:LOCAL_RANK under NCCL), as fsdp_mini.FSDP does; torch's DDP expects
        # the caller to have moved the module there.
        self.module = module.to(get_device())
        self.bucket_cap_mb, self.impl, self.group = bucket_cap_mb, impl, group
        self.buckets = plan_buckets(module, bucket_cap_mb)
        by_name = dict(module.named_parameters())
        self._bucket_params = [[by_name[n] for n in b.names] for b in self.buckets]
        check_same_everywhere(_description(module), "model", " of the group (every rank must build the same "
                              "DistributedDataParallel)", group=group, device=_device_of(module))
        broadcast_from_rank0(_state_tensors(module), group)
        self._reset()
        for i, params in enumerate(self._bucket_params):
            for j, p in enumerate(params):
                p.register_post_accumulate_grad_hook(weak_hook(self._on_grad, i, j))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    # --- backward: hooks, buckets, the final callback -------------------------------------------------

    def _reset(self) -> None:
        self._ready = [[False] * len(b.names) for b in self.buckets]
        self._missing = [len(b.names) for b in self.buckets]
        self._next = 0  # the next bucket to start: buckets start in index order on every rank
        self._works: list[tuple[int, torch.Tensor, object]] = []
        self._callback_queued = False

    def _on_grad(self, i: int, j: int, param: torch.Tensor) -> None:
        """Hook: parameter j of bucket i has its gradient. Start every bucket that is now complete."""
        if not self.requires_gradient_sync:
            return
        if not self._callback_queued:  # the first gradient of this backward
            self._callback_queued = True
            queue_after_backward(self._finish_backward)
        if not self._ready[i][j]:
            self._ready[i][j] = True
            self._missing[i] -= 1
        while self._next < len(self.buckets) and self._missing[self._next] == 0:
            self._start_bucket(self._next)
            self._next += 1

    def _start_bucket(self, i: int) -> None:
        """Flatten bucket i's gradients (zeros for a parameter without one) and start averaging them:
        async, so backward goes on computing while the bucket travels."""
        params = self._bucket_params[i]
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
        with scope(f"bucket {i}"):
            work = C.all_reduce(flat, C.AVG, group=self.group, async_op=True, impl=self.impl)
        self._works.append((i, flat, work))

    def _finish_backward(self) -> None:
        """End of backward: start the buckets still waiting (a parameter got no gradient), wait for every
        AllReduce, and copy the averaged gradients back into `p.grad`, so `opt.step()` sees them."""
        for i in range(self._next, len(self.buckets)):
            self._start_bucket(i)
        for i, flat, work in self._works:
            work.wait()
            for p, avg in zip(self._bucket_params[i], flat.split(self.buckets[i].numels)):
                if p.grad is None:
                    p.grad = avg.view_as(p).clone()
                else:
                    p.grad.copy_(avg.view_as(p))
        self._reset()


def _state_tensors(module: nn.Module) -> list[torch.Tensor]:
    """Every parameter and buffer once (tied ones once), in registration order."""
    seen, out = set(), []
    for t in list(module.parameters()) + list(module.buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


def _description(module: nn.Module) -> list[tuple]:
    """What must agree across replicas: every parameter's and buffer's name, shape, dtype, requires_grad."""
    return [(name, tuple(t.shape), str(t.dtype), t.requires_grad)
            for name, t in list(module.named_parameters()) + list(module.named_buffers())]


def _device_of(module: nn.Module) -> torch.device:
    return next((t.device for t in _state_tensors(module)), torch.device("cpu"))
