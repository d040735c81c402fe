"""What the lessons say about PyTorch, checked by running PyTorch (torch 2.13, gloo, CPU ranks).

Each test names the lesson and quotes the sentence it backs, so that a claim and its evidence cannot
drift apart: change the sentence, and this file says which behaviour it must still describe. Claims
that cannot run on a CPU (NCCL, GPU kernels) are cited in the lessons themselves, with the pinned
torch's source file and line; several tests here check that those cited lines still say what the
lessons quote, so a torch upgrade flags a stale citation. Sections follow the lessons.
"""
from __future__ import annotations

import datetime
import multiprocessing
import os
import socket
import subprocess
import sys
import time
import warnings
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from fsdp_mini import launch
from fsdp_mini.run import LaunchTimeout
from fsdp2_calls import FSDP2Calls
from launch_cases import run_cases
import inspect
import textwrap
from fsdp_mini.course.models import GPT, Block, GPTConfig, make_batch
from fsdp_mini.course.train import local_rows
import importlib
import math
from collections import Counter
from pathlib import Path
from fsdp_mini.course.exercises.per_parameter import TRIAL_SHAPES, dim0_shard, trial_tensor
from fsdp_mini.course.train import local_rows, train
import functools
import pickle
import re
from fsdp_mini.course.activation_runs import checkpoint_then_shard
from fsdp_mini.course.flight_records import dump_trace, first_finding, fr_trace, record_both
import torch.utils.checkpoint as tuc
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointWrapper,
    apply_activation_checkpointing,
)
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy
from torch.distributed.fsdp import fully_shard as torch_fully_shard
from torch.nn.attention import SDPBackend, sdpa_kernel
from fsdp_mini import FSDP, CommLog, launch
from fsdp_mini.course.activations import (
    Checkpointed,
    PyTorchGathers,
    checkpoint_attention_core,
    checkpoint_blocks,
    course_bytes,
    sdpa_saved,
    step_traffic,
)
from fsdp_mini.course.pytorch_equivalent import pytorch_full_state_dict
from fsdp_mini.course.train import train
from fsdp_mini.saved_activations import SavedActivations


# ============================== lessons 00-04 =====================================================

MiB = 2 ** 20


def test_adamw_keeps_two_moments_and_a_float32_step_per_parameter_allocated_at_the_first_step():
    # 00 · "Adam keeps two more tensors per parameter (the running mean and variance of the gradient),
    #       plus a step counter"
    # 04 · "a warm-up step (Adam allocates its state lazily, in the first `step()`)"
    # 04 · "Adam keeps a 0-dimensional `step` tensor (4 bytes of float32) per parameter it optimizes."
    model = nn.Sequential(nn.Linear(5, 4), nn.Linear(4, 3))
    model[0].weight.requires_grad_(False)  # frozen: no gradient, so no state either
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    assert len(opt.state) == 0  # nothing allocated at construction
    model(torch.randn(2, 5)).sum().backward()
    opt.step()
    trained = [p for p in model.parameters() if p.requires_grad]
    assert set(opt.state) == set(trained)
    for p in trained:
        state = opt.state[p]
        assert set(state) == {"step", "exp_avg", "exp_avg_sq"}
        for moment in ("exp_avg", "exp_avg_sq"):
            assert state[moment].shape == p.shape and state[moment].dtype == p.dtype
        step = state["step"]
        assert step.dim() == 0 and step.dtype == torch.float32 and step.element_size() == 4
        assert step.item() == 1.0


def test_adam_hides_a_gradient_scale_that_sgd_shows():
    # 03 · "a wrong averaging factor (SUM instead of AVG) would change its steps, while Adam would hide it,
    #       since its update hardly depends on the gradient's scale"
    # 04 · "Adam's is nearly scale-invariant and would hide, say, a forgotten division by the number of ranks"
    def after_steps(opt_cls, scale, **kwargs):
        torch.manual_seed(0)
        w = nn.Parameter(torch.randn(64))
        opt = opt_cls([w], **kwargs)
        for step in range(3):
            torch.manual_seed(100 + step)
            w.grad = scale * torch.randn(64)
            opt.step()
        return w.detach()

    start = after_steps(torch.optim.SGD, 0.0, lr=0.1)  # the initial weights
    sgd_1, sgd_4 = (after_steps(torch.optim.SGD, s, lr=0.1, momentum=0.9) for s in (1.0, 4.0))
    adam_1, adam_4 = (after_steps(torch.optim.AdamW, s, lr=1e-2) for s in (1.0, 4.0))
    assert torch.allclose(sgd_4 - start, 4 * (sgd_1 - start), rtol=1e-4)  # SGD: 4x the gradient, 4x the step
    assert (adam_1 - start).abs().max() > 1e-2  # Adam moved the weights...
    assert torch.allclose(adam_4, adam_1, rtol=0, atol=1e-6)  # ...and by the same steps at 4x the gradient


def test_a_tiny_eps_turns_a_near_zero_gradient_into_an_update_as_large_as_the_learning_rate():
    # 04 · "where a gradient is almost zero ..., a tiny ε turns float rounding noise into updates as large as
    #       the learning rate"
    lr = 1e-2

    def first_update(eps, grad):
        w = nn.Parameter(torch.zeros(1))
        opt = torch.optim.AdamW([w], lr=lr, eps=eps, weight_decay=0.0)
        w.grad = torch.tensor([grad])
        opt.step()
        return abs(w.item())

    noise = 1e-7  # the size of rounding noise on a gradient that is truly ~0
    assert first_update(1e-8, noise) > 0.9 * lr
    assert first_update(1e-3, noise) < 1e-3 * lr


_TORCHRUN_SCRIPT = """
import os, sys
names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
with open(os.path.join(sys.argv[1], "rank" + os.environ["RANK"]), "w") as f:
    f.write(repr({k: os.environ.get(k) for k in names}))
"""


def test_torchrun_puts_rank_and_world_size_into_each_process_environment(tmp_path):
    # 01 · "On a cluster, `torchrun` starts the processes and puts `RANK` and `WORLD_SIZE` into their
    #       environment."
    # 00 · "`fsdp_mini.init()` reads torchrun's environment" (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT)
    script = tmp_path / "env.py"
    script.write_text(_TORCHRUN_SCRIPT)
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          str(script), str(tmp_path)], env=dict(env, OMP_NUM_THREADS="1"),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    seen = [eval((tmp_path / f"rank{r}").read_text()) for r in range(2)]
    for rank, e in enumerate(seen):
        assert (e["RANK"], e["WORLD_SIZE"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"]) == (str(rank), "2", str(rank), "2")
        assert e["MASTER_ADDR"] and e["MASTER_PORT"]


def _recv_into_int32():
    if dist.get_rank() == 0:
        dist.send(torch.tensor([1.0, 2.0]), dst=1)
        return None
    buffer = torch.zeros(2, dtype=torch.int32)  # the same 8 bytes, another dtype
    dist.recv(buffer, src=0)
    return buffer.tolist()


def test_recv_fills_a_buffer_the_receiver_made_with_the_raw_bytes(no_orphans):
    # 01 · "the receiver must know the shape and dtype in advance, because nothing but the raw data travels"
    got = launch(_recv_into_int32, 2, timeout=60)[1]
    assert got == torch.tensor([1.0, 2.0]).view(torch.int32).tolist()  # float32 bits, read as int32
    assert got != [1, 2]


def _late_receiver(delay):
    t = torch.ones(1)
    if dist.get_rank() == 0:
        start = time.perf_counter()
        dist.send(t, dst=1)
        return time.perf_counter() - start
    time.sleep(delay)
    dist.recv(t, src=0)
    return None


def _everyone_sends_first(numel):
    rank, n = dist.get_rank(), dist.get_world_size()
    dist.send(torch.zeros(numel), dst=(rank + 1) % n)  # blocking send before any recv: nobody receives
    dist.recv(torch.empty(numel), src=(rank - 1) % n)


def test_on_gloo_a_blocking_send_waits_for_its_receiver_so_send_first_deadlocks_at_any_size(no_orphans):
    # 01 · "Both calls block, `send` until the receiver has taken the data, `recv` until it has arrived."
    # 01 · "On gloo a blocking `send` returns only once the receiver has taken the data, so this deadlocks
    #       whatever the size, even for one element"
    waited = launch(_late_receiver, 2, args=(1.5,), timeout=60)[0]
    assert waited > 1.0  # a one-element send waited for the late recv
    with pytest.raises(LaunchTimeout):
        launch(_everyone_sends_first, 2, args=(1,), timeout=5)


def _isend_then_irecv():
    rank, n = dist.get_rank(), dist.get_world_size()
    out, inc = torch.full((3,), float(rank)), torch.empty(3)
    start = time.perf_counter()
    send = dist.isend(out, dst=(rank + 1) % n)  # every rank sends first, without blocking
    issued = time.perf_counter() - start
    if rank == 0:
        time.sleep(1.0)  # rank 1 waits for this receive: its isend must not have blocked
    recv = dist.irecv(inc, src=(rank - 1) % n)
    send.wait()
    recv.wait()
    return issued, inc.tolist()


def test_isend_and_irecv_return_at_once_and_complete_in_wait(no_orphans):
    # 02 · "`_exchange` is one ring step: an `isend` to the right and an `irecv` from the left, in flight
    #       together."
    # 02 · "written by you from `dist.isend` / `dist.irecv` (or blocking `send` / `recv` in an order that
    #       cannot deadlock)"
    results = launch(_isend_then_irecv, 3, timeout=60)
    for rank, (issued, got) in enumerate(results):
        assert issued < 0.5
        assert got == [float((rank - 1) % 3)] * 3


def _reduce_then_look():
    rank, n = dist.get_rank(), dist.get_world_size()
    t = torch.full((6,), float(2 ** rank))  # any sum of these says which ranks it holds
    dist.reduce(t, dst=0)
    return t.tolist()


def test_reduce_leaves_partial_sums_in_the_other_ranks_buffers_on_gloo(no_orphans):
    # 01 · "`reduce` sums into one rank. The other ranks' buffers are the algorithm's scratch space: gloo
    #       leaves partial sums there"
    results = launch(_reduce_then_look, 4, timeout=60)
    assert results[0] == [15.0] * 6  # 1 + 2 + 4 + 8: rank 0 holds the sum
    others = [v for r in range(1, 4) for v in results[r]]
    assert all(v == int(v) and 1 <= v <= 15 for v in others)  # each a sum of some ranks' contributions
    changed = [r for r in range(1, 4) if results[r] != [float(2 ** r)] * 6]
    assert changed  # some rank's buffer now holds a partial sum, not its own input
    partial = [v for r in changed for v in results[r] if v not in (float(2 ** r), 15.0)]
    assert partial  # neither its own input nor the full sum


def _reduce_scatter_all_gather():
    rank, n = dist.get_rank(), dist.get_world_size()
    out = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for name, rs, ag in (("tensor", dist.reduce_scatter_tensor, dist.all_gather_into_tensor),
                             ("single", dist.reduce_scatter_single, dist.all_gather_single)):
            rs_out, ag_out = torch.empty(2), torch.empty(3 * n)
            rs(rs_out, torch.arange(2.0 * n) * (rank + 1))
            ag(ag_out, torch.tensor([1.0, 2.0, 3.0]) * (rank + 1))
            out[name] = (rs_out.tolist(), ag_out.tolist())
    out["future_warnings"] = sorted({str(w.message).split("`")[1] for w in caught
                                     if issubclass(w.category, FutureWarning) and "`" in str(w.message)})
    return out


def test_reduce_scatter_leaves_rank_r_chunk_r_of_the_sum_and_all_gather_concatenates_in_rank_order(no_orphans):
    # 01 · "the input is cut into n chunks and rank r ends with the sum of chunk r. AllGather goes the other
    #       way: each rank brings one chunk and everyone ends with all of them, in rank order."
    # 01 · (the lead's sentence) "`reduce_scatter_tensor` and `all_gather_into_tensor` ... are deprecated
    #       (a `FutureWarning`) in favour of `reduce_scatter_single` and `all_gather_single`, with the same
    #       arguments"
    n = 4
    results = launch(_reduce_scatter_all_gather, n, timeout=60)
    total = sum(torch.arange(2.0 * n) * (r + 1) for r in range(n))
    gathered = [x for q in range(n) for x in (torch.tensor([1.0, 2.0, 3.0]) * (q + 1)).tolist()]
    for rank, out in enumerate(results):
        for name in ("tensor", "single"):
            rs_out, ag_out = out[name]
            assert rs_out == total[2 * rank:2 * rank + 2].tolist()
            assert ag_out == gathered
        assert {"torch.distributed.reduce_scatter_tensor", "torch.distributed.all_gather_into_tensor"} <= set(
            out["future_warnings"])


def _avg_async():
    rank = dist.get_rank()
    t = torch.full((1000,), float(rank + 1))
    work = dist.all_reduce(t, op=dist.ReduceOp.AVG, async_op=True)
    while not work.is_completed():
        time.sleep(0.01)
    before_wait = t[0].item()
    work.wait()
    return before_wait, t[0].item()


def test_all_reduce_avg_runs_on_gloo_and_divides_before_wait(no_orphans):
    # 03 · "The right-hand side is exactly what an AllReduce with `AVG` computes."
    # 03 · "gloo's own `AVG` has divided by the time the work completes" (exercise 2's solution)
    for before_wait, after in launch(_avg_async, 4, timeout=60):
        assert after == 2.5  # (1 + 2 + 3 + 4) / 4
        assert before_wait == 2.5  # already divided once the work completed, before wait()


def _async_all_reduce_returns_at_once():
    rank = dist.get_rank()
    t = torch.ones(4)
    if rank == 1:
        time.sleep(1.5)  # the partner arrives late
    start = time.perf_counter()
    work = dist.all_reduce(t, async_op=True)
    issued = time.perf_counter() - start
    work.wait()
    return issued, time.perf_counter() - start, t.tolist()


def test_an_async_all_reduce_returns_at_once_and_wait_blocks_until_it_is_done(no_orphans):
    # 03 · "issuing an *asynchronous* AllReduce: the call returns at once, the bytes travel in the background"
    (issued, done, t), _ = launch(_async_all_reduce_returns_at_once, 2, timeout=60)
    assert issued < 0.5 < 1.0 < done  # rank 0's call returned long before its partner joined
    assert t == [2.0] * 4


def _default_timeout():
    from torch.distributed.distributed_c10d import _get_default_timeout
    return _get_default_timeout(dist.get_backend()), dist.get_backend()


def test_a_missing_partner_is_waited_for_30_minutes_by_default_on_gloo(no_orphans):
    # 01 · "the others wait in their next collective for a partner that is gone, until the process group's
    #       timeout: 30 minutes by default on gloo"
    (timeout, backend), _ = launch(_default_timeout, 2, timeout=60)
    assert backend == "gloo" and timeout == datetime.timedelta(minutes=30)
    assert dist.constants.default_pg_timeout == datetime.timedelta(minutes=30)


def test_fsdp_names_ddp_no_shard_and_zero_2_shard_grad_op():
    # 03 · "plain data parallelism, PyTorch's `DistributedDataParallel` (DDP), which FSDP calls `NO_SHARD`"
    # 04 · "FSDP's ZeRO-2 is called SHARD_GRAD_OP"; 00 · "ZeRO-3 (FSDP's FULL_SHARD)"
    # (FSDP1 refuses CPU tensors, so this reads its own definition, torch/distributed/fsdp/api.py:32-67)
    from torch.distributed.fsdp import ShardingStrategy
    doc = " ".join(ShardingStrategy.__doc__.split())
    assert {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"} <= set(ShardingStrategy.__members__)
    assert "``NO_SHARD``: Parameters, gradients, and optimizer states are not sharded but instead replicated" in doc
    assert "similar to PyTorch's :class:`DistributedDataParallel` API" in doc
    assert "``SHARD_GRAD_OP``: Gradients and optimizer states are sharded during computation" in doc
    assert "does not reshard them after the forward" in doc
    assert "``FULL_SHARD``: Parameters, gradients, and optimizer states are sharded." in doc


class _WithBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.register_buffer("running", torch.zeros(3))

    def forward(self, x):
        return self.lin(x) + self.running


def _ddp_construction_and_averaging():
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)  # a different initialisation on every rank
    module = _WithBuffer()
    module.running.fill_(float(rank))
    before = {k: v.clone() for k, v in module.state_dict().items()}
    ddp = nn.parallel.DistributedDataParallel(module)
    after = {k: v.clone() for k, v in module.state_dict().items()}
    torch.manual_seed(100 + rank)  # a different batch on every rank
    x = torch.randn(5, 4)
    ddp(x).pow(2).sum().backward()
    local = module.lin.weight.detach().requires_grad_()
    # this rank's own gradient, recomputed without DDP on the same (now common) weights
    own = torch.autograd.grad((x @ local.T + module.lin.bias + module.running).pow(2).sum(), local)[0]
    return before, after, module.lin.weight.grad.clone(), own


def test_ddp_broadcasts_rank_0s_parameters_and_buffers_at_construction_and_averages_gradients(no_orphans):
    # 03 · "DDP broadcasts rank 0's parameters and buffers when it is constructed, so a different seed on
    #       some rank cannot matter."
    # 03 · "PyTorch's `DistributedDataParallel` (DDP) ... averages gradients with AllReduce"
    results = launch(_ddp_construction_and_averaging, 3, timeout=60)
    rank0_before = results[0][0]
    assert not torch.equal(results[1][0]["lin.weight"], rank0_before["lin.weight"])  # they did differ
    for _, after, _, _ in results:
        for k in rank0_before:
            assert torch.equal(after[k], rank0_before[k])  # weights and buffer: rank 0's, everywhere
    mean = sum(own for *_, own in results) / 3
    for _, _, grad, _ in results:
        torch.testing.assert_close(grad, mean, rtol=1e-5, atol=1e-6)  # the average, not the sum


def _eight_layers():
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(256, 256) for _ in range(8)])  # 263,168 B per layer


def _ddp_buckets(cap_mb):
    model = _eight_layers()
    kwargs = {} if cap_mb is None else {"bucket_cap_mb": cap_mb}
    ddp = nn.parallel.DistributedDataParallel(model, **kwargs)
    names = {p: n for n, p in model.named_parameters()}
    seen = []

    def hook(state, bucket):
        seen.append((bucket.index(), [names[p] for p in bucket.parameters()], bucket.buffer().numel() * 4))
        return allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, hook)
    per_iteration = []
    for _ in range(3):
        seen.clear()
        ddp(torch.randn(4, 256)).sum().backward()
        per_iteration.append(list(seen))
    return ddp.bucket_bytes_cap, per_iteration


def test_ddp_buckets_reverse_order_25_mib_default_a_1_mib_first_bucket_and_a_rebuild_after_iteration_one(
        no_orphans):
    # 03 · "DDP groups the gradients into buckets of about `bucket_cap_mb` MiB (PyTorch's name and default,
    #       25 MiB ...)"
    # 03 · "PyTorch's DDP also fills its buckets from the last layers back, each closed once it reaches the
    #       cap ... its first iteration reduces all gradients as one bucket, then it rebuilds the buckets in the
    #       order the gradients actually arrived during that backward ... And with the default cap its first
    #       bucket holds only 1 MiB"
    # 03 · "Buckets always start in index order, on every rank"
    layer = 263_168
    buckets = run_cases(_ddp_buckets, (None, 0.3), 2, timeout=120)  # the default cap and 0.3 MiB, one launch
    cap, iterations = buckets[None][0]
    assert cap == 25 * MiB and dist._DEFAULT_FIRST_BUCKET_BYTES == MiB
    first, second, third = iterations
    assert len(first) == 1 and first[0][2] == 8 * layer  # iteration 1: everything in one bucket
    assert second == third and [b[0] for b in second] == [0, 1]
    assert second[0][2] == 4 * layer and MiB <= 4 * layer < MiB + layer  # closed once it reached 1 MiB
    assert second[0][1][:2] == ["7.bias", "7.weight"] and second[1][1][-1] == "0.weight"  # last layer first
    # a cap of 0.3 MiB (not the default): the first bucket gets the same cap; buckets start in index order
    cap, iterations = buckets[0.3][0]
    assert cap == int(0.3 * MiB)
    assert [b[0] for b in iterations[1]] == [0, 1, 2, 3]
    assert [b[1][-1] for b in iterations[1]] == ["6.weight", "4.weight", "2.weight", "0.weight"]


def test_a_bucket_closes_as_soon_as_it_reaches_its_cap():
    # 03 · "a bucket closes as soon as it reaches the cap" (the function DDP calls at construction,
    #       torch/nn/parallel/distributed.py, `_ddp_init_helper`)
    tensors = [torch.empty(100), torch.empty(100), torch.empty(100), torch.empty(50)]  # 400, 400, 400, 200 B
    buckets, limits = dist._compute_bucket_assignment_by_size(tensors, [600])
    assert buckets == [[0, 1], [2, 3]] and limits == [600, 600]  # 800 >= 600: closed with the second tensor
    buckets, _ = dist._compute_bucket_assignment_by_size(tensors, [400, 800])  # a smaller first bucket
    assert buckets == [[0], [1, 2], [3]]


def _grads_are_bucket_views():
    ddp = nn.parallel.DistributedDataParallel(_eight_layers(), gradient_as_bucket_view=True)
    buffers = []

    def hook(state, bucket):
        buffers.append(bucket.buffer())
        return allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, hook)
    for _ in range(2):  # the second iteration runs on the rebuilt buckets
        buffers.clear()
        ddp.zero_grad(set_to_none=False)
        ddp(torch.randn(4, 256)).sum().backward()
    spans = [(b.data_ptr(), b.data_ptr() + b.numel() * b.element_size()) for b in buffers]
    return [any(lo <= p.grad.data_ptr() < hi for lo, hi in spans) for p in ddp.module.parameters()]


def test_with_gradient_as_bucket_view_every_grad_is_a_view_into_its_bucket(no_orphans):
    # 04 · "production implementations can keep gradients in flat buffers from the start and skip the copy
    #       (PyTorch's DDP does, with `gradient_as_bucket_view=True`: every `p.grad` is then a view into its
    #       bucket)"
    for inside in launch(_grads_are_bucket_views, 2, timeout=60):
        assert inside and all(inside)


def _no_sync_accumulation():
    rank = dist.get_rank()
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(nn.Linear(4, 2))
    calls = []

    def hook(state, bucket):
        calls.append(bucket.index())
        return allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, hook)
    torch.manual_seed(10 + rank)
    micro = [torch.randn(3, 4) for _ in range(2)]
    with ddp.no_sync():
        ddp(micro[0]).pow(2).sum().backward()
    during = (len(calls), ddp.module.weight.grad.clone())
    ddp(micro[1]).pow(2).sum().backward()
    # this rank's own accumulated gradient, without DDP
    w, b = ddp.module.weight.detach().requires_grad_(), ddp.module.bias.detach().requires_grad_()
    own = torch.autograd.grad(sum((x @ w.T + b).pow(2).sum() for x in micro), w)[0]
    return during, len(calls), ddp.module.weight.grad.clone(), own


def test_no_sync_skips_the_all_reduce_and_the_next_backward_averages_what_was_accumulated(no_orphans):
    # 03 · "`no_sync()` skips all of it for gradient accumulation."
    # 03 · "with model.no_sync():  # accumulate locally: no AllReduce for these backwards" (exercise 3)
    results = launch(_no_sync_accumulation, 2, timeout=60)
    mean = sum(r[3] for r in results) / 2
    for (calls_during, grad_during), calls_after, grad, own in results:
        assert calls_during == 0 and calls_after == 1  # nothing inside no_sync, one bucket after
        assert not torch.allclose(grad_during, mean)
        torch.testing.assert_close(grad, mean, rtol=1e-5, atol=1e-6)


class _Unused(nn.Module):
    def __init__(self):
        super().__init__()
        self.used, self.unused = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        return self.used(x)


def _unused_parameter(find):
    ddp = nn.parallel.DistributedDataParallel(_Unused(), find_unused_parameters=find)
    try:
        for _ in range(2):
            ddp(torch.randn(2, 4)).sum().backward()
    except RuntimeError as e:
        return "error", str(e)
    return "ok", ddp.module.unused.weight.grad


class _SometimesUnused(nn.Module):
    def __init__(self):
        super().__init__()
        self.used, self.unused = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x, use_both):
        return self.used(x) + self.unused(x) if use_both else self.used(x)


def _unused_on_rank_0():
    rank = dist.get_rank()
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(_SometimesUnused(), find_unused_parameters=True)
    x = torch.ones(2, 4)
    ddp(x, use_both=rank == 1).sum().backward()
    return ddp.module.unused.weight.grad.clone()


def test_pytorch_ddp_needs_find_unused_parameters_for_a_parameter_that_gets_no_gradient(no_orphans):
    # 03 · "PyTorch's DDP copes with such a parameter only with `find_unused_parameters=True` (it then reduces
    #       zeros in its place, and leaves the `.grad` of a parameter that no rank used at `None`); by default
    #       the next iteration raises an error"
    runs = run_cases(_unused_parameter, (False, True), 2, timeout=120)  # without and with, one launch
    for outcome, detail in runs[False]:
        assert outcome == "error" and "Expected to have finished reduction in the prior iteration" in detail
    for outcome, grad in runs[True]:
        assert outcome == "ok" and grad is None  # unused on every rank: its .grad is left alone
    on_rank_0, on_rank_1 = launch(_unused_on_rank_0, 2, timeout=60)  # used by rank 1 only
    own_1 = torch.full((4, 4), 2.0)  # d(sum of unused(ones(2, 4)))/dW on rank 1: 2 rows of ones
    assert torch.equal(on_rank_0, on_rank_1) and torch.allclose(on_rank_0, (0 + own_1) / 2)  # zeros reduced


def test_post_accumulate_grad_hook_sees_the_finished_gradient_once_even_for_a_tied_weight():
    # 03 · "PyTorch calls a parameter's `register_post_accumulate_grad_hook` right after backward has
    #       accumulated that parameter's gradient into `p.grad`."
    # 03 · "its gradient is complete only when backward has passed through both uses, at the very end"
    emb = nn.Embedding(7, 3)  # used twice: as the embedding and as the tied head
    seen = []
    emb.weight.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad.clone()))
    ids = torch.tensor([1, 2, 3])
    logits = emb(ids) @ emb.weight.T
    logits.sum().backward()
    assert len(seen) == 1  # once per backward, not once per use
    assert torch.equal(seen[0], emb.weight.grad)  # the sum of both uses' contributions


def test_a_queued_callback_runs_once_the_whole_backward_is_done():
    # 03 · "The first hook of a backward also queues a callback that autograd runs when the whole backward
    #       is done"
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3), nn.Linear(3, 3))
    events = []

    def on_grad(p):
        if not events:
            torch.autograd.Variable._execution_engine.queue_callback(lambda: events.append("callback"))
        events.append("grad")

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(on_grad)
    model(torch.randn(2, 3)).sum().backward()
    events.append("backward returned")
    assert events == ["grad"] * 6 + ["callback", "backward returned"]


def _torch_zero():
    from torch.distributed.optim import ZeroRedundancyOptimizer
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4))  # 128, 16, 64 and 4 elements
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=0.1)
    calls = []
    real = {name: getattr(dist, name) for name in ("broadcast", "all_reduce", "reduce_scatter_tensor",
                                                    "all_gather_into_tensor", "all_gather")}
    for name, fn in real.items():
        setattr(dist, name, (lambda name, fn: lambda *a, **k: (calls.append(name), fn(*a, **k))[1])(name, fn))
    try:
        model(torch.randn(3, 8)).sum().backward()
        opt.step()
    finally:
        for name, fn in real.items():
            setattr(dist, name, fn)
    names = {p: n for n, p in model.named_parameters()}
    owned = {names[p]: [tuple(v.shape) for k, v in s.items() if k != "step"] for p, s in opt.optim.state.items()}
    return calls, owned, [p.detach().clone() for p in model.parameters()]


def test_torchs_zero_redundancy_optimizer_gives_whole_parameters_to_ranks_and_broadcasts_them(no_orphans):
    # 04 · "PyTorch has a class of the same name, `torch.distributed.optim.ZeroRedundancyOptimizer`, built
    #       differently: every parameter belongs whole to one rank, ..., and after the step each rank
    #       broadcasts the parameters it owns"
    results = launch(_torch_zero, 2, timeout=60)
    shapes = {"0.weight": (16, 8), "0.bias": (16,), "1.weight": (4, 16), "1.bias": (4,)}
    owners = {name: [r for r, (_, owned, _) in enumerate(results) if name in owned] for name in shapes}
    assert all(len(ranks) == 1 for ranks in owners.values())  # each parameter: one rank, whole
    for _, owned, _ in results:
        assert all(s == [shapes[name]] * 2 for name, s in owned.items())  # full-size moments, not slices
    assert owners["0.weight"] == [0] and owners["1.weight"] == [1]  # sorted-greedy by size
    for calls, _, _ in results:
        assert set(calls) == {"broadcast"}  # no ReduceScatter, no AllGather, no averaging of its own
    assert all(torch.equal(a, b) for a, b in zip(results[0][2], results[1][2]))


# ============================== lessons 01 and 05-08 ==============================================

CFG = GPTConfig()  # the course's GPT: 2 blocks, 61 tokens (prime: nothing divides evenly)


def _fsdp2(model, mesh=None, **kwargs):
    """PyTorch's FSDP2 as the lessons apply it: every block a unit, then the root."""
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block, mesh=mesh, **kwargs)
    return fully_shard(model, mesh=mesh, **kwargs)


def _local_batch(step=0, rows=8):
    rank, world = dist.get_rank(), dist.get_world_size()
    return [local_rows(t, rank, world) for t in make_batch(CFG, rows, step)]


def _both_names():
    rank = dist.get_rank()
    x = torch.arange(4.0) + 10 * rank
    old, new = torch.empty(8), torch.empty(8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist.all_gather_into_tensor(old, x)
        old_rs = torch.empty(2)
        dist.reduce_scatter_tensor(old_rs, x)
    dist.all_gather_single(new, x)
    new_rs = torch.empty(2)
    dist.reduce_scatter_single(new_rs, x)
    messages = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    return torch.equal(old, new) and torch.equal(old_rs, new_rs), messages


def test_01_the_pinned_torch_deprecates_all_gather_into_tensor_for_all_gather_single(no_orphans):
    # 01, "The two halves": "in the pinned torch 2.13 those two are deprecated (a `FutureWarning`) in favour
    # of `torch.distributed.reduce_scatter_single` and `all_gather_single`, with the same arguments"
    assert torch.__version__.startswith("2.13")
    for old, new in (("all_gather_into_tensor", "all_gather_single"),
                     ("reduce_scatter_tensor", "reduce_scatter_single")):
        assert inspect.signature(getattr(dist, old)).parameters.keys() == \
            inspect.signature(getattr(dist, new)).parameters.keys()
    for same, messages in launch(_both_names, 2, timeout=60):
        assert same
        assert any("all_gather_single" in m for m in messages)
        assert any("reduce_scatter_single" in m for m in messages)


def _what_forward_leaves(reshard_after_forward):
    from torch.distributed.tensor import DTensor

    model = _fsdp2(GPT(CFG), reshard_after_forward=reshard_after_forward)
    shards = [p for p in model.blocks[0].parameters()]  # what the optimizer holds: the DTensor shards
    x, y = _local_batch()
    loss = model(x, y)
    weight = model.blocks[0].mlp.fc.weight
    after_forward = (type(weight).__name__, tuple(weight.shape),
                     all(isinstance(s, DTensor) and s.to_local().numel() > 0 for s in shards))
    loss.backward()
    weight = model.blocks[0].mlp.fc.weight
    return after_forward, (type(weight).__name__, isinstance(weight, DTensor))


def test_06_shard_grad_op_holds_the_gathered_copy_and_the_shard_from_forward_to_backward(no_orphans):
    # 06, "Reshard after forward": "SHARD_GRAD_OP, here and in PyTorch, keeps only shards at rest (during
    # the optimizer step and in checkpoints) and holds the gathered copy *and* the shard from forward until
    # backward frees each unit"
    full = tuple(GPT(CFG).blocks[0].mlp.fc.weight.shape)
    runs = run_cases(_what_forward_leaves, (False, True), 2, timeout=170)  # SHARD_GRAD_OP, FULL_SHARD: one launch
    for (kind, shape, shards_kept), (after_backward, is_shard) in runs[False]:
        assert kind != "DTensor" and shape == full and shards_kept  # gathered copy and shard, both held
        assert is_shard  # backward freed the gathered copy: a shard at rest
    for (kind, shape, _), _ in runs[True]:
        assert kind == "DTensor"  # FULL_SHARD: a block is a shard again right after its forward


def _mixed_precision_step():
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from torch.distributed.tensor import DTensor

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    model = _fsdp2(GPT(CFG), mp_policy=policy)
    seen = {}

    def compute_dtype(module, args):
        seen.setdefault("compute", module.weight.dtype)  # returns None: the inputs stay as they are

    model.blocks[0].mlp.fc.register_forward_pre_hook(compute_dtype)
    x, y = _local_batch()
    with FSDP2Calls() as log:
        model(x, y).backward()
    grads = {type(p.grad).__name__ + ":" + str(p.grad.dtype) for p in model.parameters()}
    shards = {str(p.dtype) for p in model.parameters() if isinstance(p, DTensor)}
    return ({str(c.dtype) for c in log.ops("all_gather")}, {str(c.dtype) for c in log.ops("reduce_scatter")},
            str(seen["compute"]), grads, shards)


def test_06_mixed_precision_gathers_in_bf16_and_reduces_in_fp32_onto_fp32_shards(no_orphans):
    # 06, "Mixed precision": "each rank casts its fp32 shard to bf16 *before* the AllGather (half the bytes on
    # the wire and in the buffer), computes forward and backward in bf16, casts the gradients to fp32 for the
    # ReduceScatter ... and lands them on the fp32 shard, which the optimizer updates as the master copy"
    # (fsdp_mini's MixedPrecision and PyTorch's MixedPrecisionPolicy behave alike; this is PyTorch's FSDP2)
    for gathered, reduced, compute, grads, shards in launch(_mixed_precision_step, 2, timeout=90):
        assert gathered == {"torch.bfloat16"} and reduced == {"torch.float32"}
        assert compute == "torch.bfloat16"
        assert grads == {"DTensor:torch.float32"} and shards == {"torch.float32"}


def _placements():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    one_d = _fsdp2(GPT(CFG))
    flat = all(p.placements == (Shard(0),) for p in one_d.parameters())
    all_dtensors = all(isinstance(p, DTensor) for p in one_d.parameters())
    rows = one_d.tok_emb.weight.to_local().shape[0]
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    two_d = _fsdp2(GPT(CFG), mesh=mesh)
    hybrid = all(p.placements == (Replicate(), Shard(0)) for p in two_d.parameters())
    return all_dtensors, flat, hybrid, rows


def test_08_fsdp2_parameters_are_dim0_dtensor_shards_cut_like_torch_chunk(no_orphans):
    # 08, "The map": "it keeps every parameter as a `DTensor` sharded on dim 0"; "How FSDP2 holds a shard":
    # "`Replicate()` on the `replicate` dimension, `Shard(dim=0)` on the `shard` dimension"; "The embedding
    # has 61 rows, so FSDP2 gives rank 0 one row more than rank 1 (`torch.chunk`)"
    results = launch(_placements, 4, timeout=90)
    for rank, (all_dtensors, flat, hybrid, rows) in enumerate(results):
        assert all_dtensors and flat and hybrid
        assert rows == torch.chunk(torch.empty(61), 4)[rank].shape[0]  # 16, 15, 15, 15


def _backward_order():
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    model = _fsdp2(GPT(GPTConfig(n_layer=3)))
    events, originals = [], (FSDPParamGroup.unshard, FSDPParamGroup.post_backward)

    def unshard(self, *args, **kwargs):
        events.append(("unshard", self._module_fqn))
        return originals[0](self, *args, **kwargs)

    def post_backward(self, *args, **kwargs):
        events.append(("post_backward", self._module_fqn))
        return originals[1](self, *args, **kwargs)

    x, y = _local_batch()
    loss = model(x, y)
    FSDPParamGroup.unshard, FSDPParamGroup.post_backward = unshard, post_backward
    try:
        loss.backward()
    finally:
        FSDPParamGroup.unshard, FSDPParamGroup.post_backward = originals
    first = {}
    for i, event in enumerate(events):
        first.setdefault(event, i)
    # backward runs blocks.2, blocks.1, blocks.0: is each block gathered before the one after it is done?
    return [first[("unshard", f"blocks.{k}")] < first[("post_backward", f"blocks.{k + 1}")] for k in (0, 1)]


def test_08_fsdp2_prefetches_in_backward_by_default(no_orphans):
    # 08, "The map", prefetch row: FSDP2 "on by default; `set_modules_to_forward_prefetch`,
    # `set_modules_to_backward_prefetch` to tune": by default blocks.0 is gathered before blocks.1's backward
    # is done (_fsdp_param_group.py:576, pre_backward -> _backward_prefetch), and blocks.1 before blocks.2's.
    # (FSDP2 has no switch to turn it off: an empty `set_modules_to_backward_prefetch([])` means the default,
    # _fsdp_state.py:384.)
    assert launch(_backward_order, 2, timeout=90) == [[True, True], [True, True]]


def _meta_init():
    from torch.distributed.tensor import DTensor

    with torch.device("meta"):
        model = GPT(CFG)
    _fsdp2(model)
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    for module in model.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
    sharded = all(isinstance(p, DTensor) and p.device.type == "cpu" for p in model.parameters())
    x, y = _local_batch()
    return sharded, model(x, y).isfinite().item()


def test_08_meta_device_init_is_fully_shard_then_to_empty(no_orphans):
    # 08, "The map", meta-device init row: "`fully_shard` the meta model, then `model.to_empty(device=...)` and
    # initialise"
    assert launch(_meta_init, 2, timeout=90) == [(True, True), (True, True)]


def _accumulate(sync_first):
    model = _fsdp2(GPT(CFG))
    reduces = []
    for step in range(2):
        model.set_requires_gradient_sync(sync_first or step == 1)
        x, y = _local_batch(step)
        with FSDP2Calls() as log:
            model(x, y).backward()
        reduces.append(len(log.ops("reduce_scatter")))
    return reduces, {n: p.grad.full_tensor() for n, p in model.named_parameters()}


def test_08_set_requires_gradient_sync_false_accumulates_without_reducing(no_orphans):
    # 08, "The map", gradient accumulation row: FSDP2's `model.set_requires_gradient_sync(False)` is FSDP1's and
    # fsdp_mini's `no_sync()`: no ReduceScatter in that micro-batch, and the same gradients in the end
    runs = run_cases(_accumulate, (False, True), 2, timeout=170)  # both settings, one launch
    (reduces, grads), _ = runs[False]
    (always, synced), _ = runs[True]
    assert reduces[0] == 0 and reduces[1] > 0 and always[0] == always[1] == reduces[1]
    for name, grad in grads.items():
        torch.testing.assert_close(grad, synced[name], rtol=1e-5, atol=1e-7)


def _clip():
    model = _fsdp2(GPT(CFG))
    x, y = _local_batch()
    model(x, y).backward()
    return torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).full_tensor().item()


def test_08_clip_grad_norm_on_fsdp2_gives_the_whole_models_norm(no_orphans):
    # 08, "The map", clipping row: FSDP2 uses the plain `torch.nn.utils.clip_grad_norm_(model.parameters(),
    # 1.0)`, and the norm it computes over the DTensor gradients is the whole model's
    one = GPT(CFG)
    x, y = make_batch(CFG, 8)
    one(x, y).backward()
    want = torch.nn.utils.clip_grad_norm_(one.parameters(), 1.0).item()
    for norm in launch(_clip, 2, timeout=90):
        assert norm == pytest.approx(want, rel=1e-5)


def _unshard_reshard():
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    def gathered(model):
        return {n for n, p in model.named_parameters() if not isinstance(p, DTensor)}

    model = _fsdp2(GPT(CFG))
    model.unshard()
    root_only = gathered(model)
    model.reshard()
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for unit in units:
        unit.unshard()
    everything = {n: tuple(p.shape) for n, p in model.named_parameters() if not isinstance(p, DTensor)}
    for unit in units:
        unit.reshard()
    return root_only, everything, gathered(model)


def test_08_unshard_gathers_one_unit_so_whole_parameters_need_it_on_every_unit(no_orphans):
    # 08, "The map", whole parameters row: FSDP2's "`unshard()` on every FSDP module (each gathers its own
    # unit: the root's leaves the blocks sharded), later `reshard()`"
    shapes = {n: tuple(p.shape) for n, p in GPT(CFG).named_parameters()}
    for root_only, everything, after in launch(_unshard_reshard, 2, timeout=90):
        assert root_only == {n for n in shapes if not n.startswith("blocks.")}
        assert everything == shapes and after == set()


def test_08_torchrun_sets_the_environment_fsdp_mini_init_reads(tmp_path):
    # 08, "Real GPUs, several nodes: torchrun": "reads the environment that torchrun sets (`RANK`, `WORLD_SIZE`,
    # `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`)"; "torchrun numbers ranks node by node and sets
    # `LOCAL_WORLD_SIZE` to the GPUs per node"
    script = tmp_path / "env.py"
    script.write_text(textwrap.dedent(f"""
        import json, os
        keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
        with open(os.path.join({str(tmp_path)!r}, "rank" + os.environ["RANK"]), "w") as f:
            json.dump({{k: os.environ.get(k) for k in keys}}, f)
    """))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                    str(script)], env=env, check=True, capture_output=True, timeout=120)
    import json

    seen = [json.loads((tmp_path / f"rank{r}").read_text()) for r in range(2)]
    for rank, values in enumerate(seen):
        assert (values["RANK"], values["LOCAL_RANK"], values["WORLD_SIZE"]) == (str(rank), str(rank), "2")
        assert values["LOCAL_WORLD_SIZE"] == "2" and values["GROUP_RANK"] == "0"
        assert values["MASTER_ADDR"] and values["MASTER_PORT"]


def _full_state_dict():
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    torch.manual_seed(0)
    model = _fsdp2(GPT(CFG))
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return {k: (type(v).__name__, tuple(v.shape), v.clone()) for k, v in state.items()}


def test_08_get_model_state_dict_full_gathers_plain_tensors_under_the_original_names(no_orphans):
    # 08, "The same training in both": "`get_model_state_dict` with `StateDictOptions(full_state_dict=True)`,
    # which gathers each DTensor into a plain tensor under its original name"
    torch.manual_seed(0)
    want = GPT(CFG).state_dict()
    for got in launch(_full_state_dict, 2, timeout=90):
        assert set(got) == set(want)
        for key, (kind, shape, value) in got.items():
            assert kind == "Tensor" and shape == tuple(want[key].shape)
            assert torch.equal(value, want[key])


# ============================== lesson 09 =========================================================

TORCH = Path(torch.__file__).parent


FSDP1_PY = TORCH / "distributed" / "fsdp" / "fully_sharded_data_parallel.py"


FLAT_PARAM_PY = TORCH / "distributed" / "fsdp" / "_flat_param.py"


WRAP_UTILS_PY = TORCH / "distributed" / "fsdp" / "_wrap_utils.py"


FSDP2_DIR = TORCH / "distributed" / "fsdp" / "_fully_shard"


def _line(path: Path, number: int) -> str:
    return path.read_text().splitlines()[number - 1]


def _fsdp2_09(model, blocks_kwargs=None, root_kwargs=None):
    """PyTorch's FSDP2 as lesson 09 applies it: every block a unit, then the root (in place)."""
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block, **(blocks_kwargs or {}))
    return fully_shard(model, **(root_kwargs or {}))


def _batch_09(step=0, rows=8):
    rank, world = dist.get_rank(), dist.get_world_size()
    return [local_rows(t, rank, world) for t in make_batch(CFG, rows, step)]


class _LoRA(nn.Module):
    """Lesson 09's adapter: a frozen linear layer plus a trainable low-rank update."""

    def __init__(self, base: nn.Linear, rank: int = 4, seed: int = 0):
        super().__init__()
        self.base = base.requires_grad_(False)
        g = torch.Generator().manual_seed(seed)
        self.A = nn.Parameter(torch.randn(rank, base.in_features, generator=g) * 0.02)
        self.B = nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x):
        return self.base(x) + x @ self.A.T @ self.B.T


def _lora_gpt():
    model = GPT(CFG).requires_grad_(False)
    for i, block in enumerate(model.blocks):
        block.attn.qkv = _LoRA(block.attn.qkv, seed=2 * i)
        block.mlp.fc = _LoRA(block.mlp.fc, seed=2 * i + 1)
    return model


def test_09_fsdp_minis_three_files_mirror_pytorchs():
    # 09, introduction: "`fsdp_mini.fully_shard`, written from scratch in three files that mirror PyTorch's
    # (`fsdp_param`: one parameter's shard; `fsdp_param_group`: a unit's collectives; `fully_shard`: the API
    # and its hooks)"
    from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
    from torch.distributed.fsdp._fully_shard._fully_shard import FSDPModule, fully_shard

    ours = {name: importlib.import_module(f"fsdp_mini.fsdp._fully_shard.{name}") for name in
            ("fsdp_param", "fsdp_param_group", "fully_shard")}  # in the folder PyTorch keeps its three in
    assert {"unshard", "reshard", "post_backward"} <= set(dir(FSDPParamGroup))
    assert FSDPParam.__module__.endswith("_fsdp_param") and callable(fully_shard) and FSDPModule
    assert hasattr(ours["fsdp_param"], "FSDPParam") and hasattr(ours["fsdp_param_group"], "FSDPParamGroup")
    assert callable(ours["fully_shard"].fully_shard)


def test_09_the_cited_torch_lines_say_what_the_lesson_quotes():
    # 09, "Frozen and trainable parameters in one unit": the lesson cites the pinned torch's lines for FSDP1's
    # refusal, its warning and its documentation, and FSDP2's chunking, copy-in/copy-out and the root's
    # reshard rule. The lines must still say so.
    assert "Must flatten tensors with uniform `requires_grad` when" in _line(FLAT_PARAM_PY, 823)
    assert "not self._use_orig_params" in _line(FLAT_PARAM_PY, 818)
    assert "FSDP does not support wrapping such modules when use_orig_params=False" in _line(WRAP_UTILS_PY, 169)
    assert "raise ValueError(msg)" in _line(WRAP_UTILS_PY, 178)
    assert "the gradient memory usage will be higher than expected" in _line(WRAP_UTILS_PY, 164)
    doc = "\n".join(FSDP1_PY.read_text().splitlines()[207:213])  # lines 208-213
    assert "For ``use_orig_params=False``, each FSDP instance must manage" in doc
    assert "prevent higher than expected gradient memory usage" in doc
    # FSDP2 cuts with torch.chunk and pads the missing chunks with empty ones
    assert "chunks = list(torch.chunk(tensor, num_chunks, dim=dim))" in _line(FSDP2_DIR / "_fsdp_common.py", 137)
    assert "while len(chunks) < num_chunks:" in _line(FSDP2_DIR / "_fsdp_common.py", 138)
    assert "chunks.append(chunks[0].new_empty(0))" in _line(FSDP2_DIR / "_fsdp_common.py", 139)
    assert "_chunk_with_empty(param_data, shard_world_size, dim=shard_dim)" in _line(
        FSDP2_DIR / "_fsdp_param.py", 298)
    # copy-in to one buffer, one collective, copy-out by column block (view(world_size, -1), split on dim 1)
    assert "torch.ops.fsdp.all_gather_copy_in(" in _line(FSDP2_DIR / "_fsdp_collectives.py", 354)
    assert "all_gather_output = all_gather_output.view(world_size, -1)" in _line(
        FSDP2_DIR / "_fsdp_collectives.py", 474)
    assert "all_gather_output, all_gather_input_split_sizes, dim=1, out=out" in _line(
        FSDP2_DIR / "_fsdp_collectives.py", 486)
    # gradients: viewed as n rows and filled rank by rank, each rank's chunk of every gradient (chunk_cat)
    assert "reduce_scatter_input = reduce_scatter_input.view(world_size, -1)" in _line(
        FSDP2_DIR / "_fsdp_collectives.py", 783)
    assert "torch.ops.fsdp.chunk_cat(" in _line(FSDP2_DIR / "_fsdp_collectives.py", 784)
    # register_fsdp_forward_method wraps the method in the root's pre- and post-forward
    assert "fsdp_state._pre_forward(self, args, kwargs)" in _line(FSDP2_DIR / "_fully_shard.py", 953)
    assert "fsdp_state._post_forward(self, args, out)" in _line(FSDP2_DIR / "_fully_shard.py", 955)
    # the root keeps its parameters from forward to backward only when reshard_after_forward is left None
    assert "if self._auto_reshard_after_forward:" in _line(FSDP2_DIR / "_fsdp_state.py", 205)
    assert "post_forward_mesh_info = None" in _line(FSDP2_DIR / "_fsdp_state.py", 207)
    # an int k reshards after forward to groups of k consecutive ranks
    assert "mesh_info.mesh.mesh.view(-1, reshard_after_forward)" in _line(FSDP2_DIR / "_fsdp_init.py", 188)


# (use_orig_params, by_policy): the two tests below read one launch of all four (tests/launch_cases.py)
FSDP1_LORA = ((False, False), (False, True), (True, True), (True, False))


def _fsdp1_lora(use_orig_params: bool, by_policy: bool):
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    cpu = torch.device("cpu")  # without device_id, FSDP1 refuses to run without an accelerator
    model = _lora_gpt()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            if by_policy:
                model = FullyShardedDataParallel(model, auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=cpu,
                                                 use_orig_params=use_orig_params)
            else:
                for i, block in enumerate(model.blocks):
                    model.blocks[i] = FullyShardedDataParallel(block, device_id=cpu,
                                                               use_orig_params=use_orig_params)
                model = FullyShardedDataParallel(model, device_id=cpu, use_orig_params=use_orig_params)
        except ValueError as e:
            return {"error": str(e).splitlines()[0]}
    warned = [str(w.message).splitlines()[0] for w in caught if issubclass(w.category, UserWarning)
              and "requires_grad=True and False" in str(w.message)]
    x, y = _batch_09()
    model(x, y).backward()
    flat = [unit._flat_param for unit in FullyShardedDataParallel.fsdp_modules(model)]
    return {"warned": warned, "flat": [p.numel() for p in flat],
            "grad_bytes": sum(p.grad.numel() * p.grad.element_size() for p in flat if p.grad is not None),
            "trainable": sum(p.numel() for p in _lora_gpt().parameters() if p.requires_grad)}


def _fsdp1_without_device_id():
    from torch.distributed.fsdp import FullyShardedDataParallel

    try:
        FullyShardedDataParallel(nn.Linear(4, 4))
    except RuntimeError as e:
        return str(e)
    return ""


def test_09_fsdp1_refuses_a_cpu_run_unless_given_device_id(no_orphans):
    # 09, "Frozen and trainable parameters in one unit": "FSDP1 refuses a CPU run unless given
    # `device_id=torch.device("cpu")`; with it, it runs on gloo" (the run itself: the tests below)
    for message in launch(_fsdp1_without_device_id, 2, timeout=60):
        assert message == "FSDP needs a non-CPU accelerator device, but no accelerator device is detected."


def test_09_fsdp1_refuses_a_unit_of_frozen_and_trainable_parameters_with_use_orig_params_false(no_orphans):
    # 09, "Frozen and trainable parameters in one unit": "PyTorch's FSDP1 does not split: with
    # `use_orig_params=False`, its default, it refuses such a unit with a `ValueError`": wrapped by hand, the
    # flat parameter's check (_flat_param.py:822) says "Must flatten tensors with uniform `requires_grad` when
    # `use_orig_params=False`"; wrapped by an auto-wrap policy, the policy's check (_wrap_utils.py:178) comes
    # first and says to wrap the frozen parameters separately (what LoRA recipes for FSDP1 do).
    for result in run_cases(_fsdp1_lora, FSDP1_LORA, 2, timeout=170, star=True)[(False, False)]:
        assert result == {"error": "Must flatten tensors with uniform `requires_grad` when `use_orig_params=False`"}
    for result in run_cases(_fsdp1_lora, FSDP1_LORA, 2, timeout=170, star=True)[(False, True)]:
        assert result["error"].startswith("blocks.0 has both parameters with requires_grad=True and False. FSDP "
                                          "does not support wrapping such modules when use_orig_params=False. "
                                          "If possible, wrap the frozen parameters with FSDP separately.")


def test_09_fsdp1_use_orig_params_true_keeps_one_flat_gradient_frozen_part_included(no_orphans):
    # 09, "Frozen and trainable parameters in one unit": "with `use_orig_params=True` it accepts the unit and
    # keeps one flat parameter, whose gradient covers the frozen part too, as its documentation warns
    # (fully_sharded_data_parallel.py:208-213)": the policy path warns with the numbers, and after backward
    # each rank's gradients live in storages the size of its whole flat shards, ~11 times the adapters'.
    results = run_cases(_fsdp1_lora, FSDP1_LORA, 2, timeout=170, star=True)[(True, True)]
    for result in results:
        assert [w.split(" We do")[0] for w in result["warned"]] == [
            f"blocks.{i} has both parameters with requires_grad=True and False." for i in (0, 1)]
        assert "(12270 numel instead of 1080 numel before sharding via reduce-scatter)" in result["warned"][0]
        # the two blocks' flat shards (the root's is frozen: no gradient); fp32
        blocks = sorted(result["flat"])[-2:]
        assert result["grad_bytes"] == 4 * sum(blocks)
        assert result["grad_bytes"] > 10 * 4 * result["trainable"] / 2  # vs the adapters' share of a rank
    by_hand = run_cases(_fsdp1_lora, FSDP1_LORA, 2, timeout=170, star=True)[(True, False)]
    assert [r["grad_bytes"] for r in by_hand] == [r["grad_bytes"] for r in results] and not by_hand[0]["warned"]


def _fsdp1_groups():
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    model = FullyShardedDataParallel(GPT(CFG), auto_wrap_policy=ModuleWrapPolicy({Block}),
                                     device_id=torch.device("cpu"), use_orig_params=True)
    opt = torch.optim.AdamW(_groups_by_name(model), lr=1e-2, eps=1e-3)
    train(model, opt, CFG, steps=3, batch_size=8)
    with FullyShardedDataParallel.summon_full_params(model):
        state = {k.replace("_fsdp_wrapped_module.", ""): v.detach().clone() for k, v in model.state_dict().items()}
    return [len(g["params"]) for g in opt.param_groups], state


def _no_decay(name):
    return name.endswith("bias") or ".ln_" in name or name.startswith("ln_")


def _groups_by_name(model):
    named = list(model.named_parameters())
    return [{"params": [p for n, p in named if not _no_decay(n)], "weight_decay": 0.1},
            {"params": [p for n, p in named if _no_decay(n)], "weight_decay": 0.0}]


def test_09_fsdp1_use_orig_params_true_gives_the_names_that_optimizer_groups_need(no_orphans):
    # 09, "Optimizer groups by name": "(PyTorch's FSDP1 has `use_orig_params=True` for this; fsdp_mini's flat
    # design does not.)": the recipe finds 10 decay and 18 no-decay parameters and trains what one process does.
    one = GPT(CFG)
    one_opt = torch.optim.AdamW(_groups_by_name(one), lr=1e-2, eps=1e-3)
    train(one, one_opt, CFG, steps=3, batch_size=8, shard_batch=False)
    for sizes, state in launch(_fsdp1_groups, 2, timeout=120):
        assert sizes == [len(g["params"]) for g in one_opt.param_groups] == [10, 18]
        for k, v in one.state_dict().items():
            torch.testing.assert_close(state[k], v, rtol=1e-5, atol=1e-5)


def _fsdp2_lora():
    from torch.distributed.tensor import DTensor, Shard

    model = _lora_gpt()
    names_before = [(n, p.dtype, p.requires_grad) for n, p in model.named_parameters()]
    same = _fsdp2_09(model) is model
    kinds = {(isinstance(p, nn.Parameter), isinstance(p, DTensor), p.placements == (Shard(0),))
             for p in model.parameters()}
    names_after = [(n, p.dtype, p.requires_grad) for n, p in model.named_parameters()]
    x, y = _batch_09()
    with FSDP2Calls() as log:
        model(x, y).backward()
    block0 = [p for p in model.blocks[0].parameters()]
    return {"same": same, "kinds": kinds, "names": names_before == names_after,
            "calls": log.calls, "block_local": sum(p.to_local().numel() for p in block0),
            "trainable_local": sum(p.to_local().numel() for p in block0 if p.requires_grad),
            "root_params": sorted(n for n, _ in model.named_parameters() if not n.startswith("blocks."))}


def test_09_fsdp2_keeps_names_and_requires_grad_and_gathers_a_mixed_unit_in_one_allgather(no_orphans):
    # 09, "The same model, two designs": "a function applied bottom-up, as in PyTorch: to every block, then to
    # the root, which takes what is left (the embeddings and the final LayerNorm). It returns the same module
    # object, whose parameters are now shards"; "What to remember": "A per-parameter shard is an
    # `nn.Parameter` holding a DTensor ... that keeps its name, dtype and `requires_grad`"; "Frozen and
    # trainable parameters in one unit": FSDP2 gathers a block's 16 parameters, frozen and trainable, in one
    # AllGather and reduce-scatters only the trainable ones.
    for r in launch(_fsdp2_lora, 2, timeout=120):
        assert r["same"] and r["names"] and r["kinds"] == {(True, True, True)}
        assert r["root_params"] == ["ln_f.bias", "ln_f.weight", "pos_emb.weight", "tok_emb.weight"]
        gathers = [c.numel for c in r["calls"] if c.op == "all_gather"]
        scatters = [c.numel for c in r["calls"] if c.op == "reduce_scatter"]
        # forward: the root, then one AllGather per block holding the whole block's shard (frozen included);
        # backward: each block once more. The root stays gathered (reshard_after_forward left None).
        assert len(gathers) == 1 + 2 + 2 and gathers.count(r["block_local"]) == 4
        # ReduceScatter: one per block, of the trainable parameters' padded rows only; none for the frozen root
        assert scatters == [2 * r["trainable_local"]] * 2


def _fsdp2_bytes():
    model = _fsdp2_09(GPT(CFG))
    x, y = _batch_09()
    with FSDP2Calls() as log:
        model(x, y).backward()
    return log.calls


def test_09_fsdp2_pads_each_parameters_rows_to_a_multiple_of_n(no_orphans):
    # 09, "What to remember": "the per-parameter design (FSDP2, `fsdp_mini.fully_shard`) pads each parameter's
    # rows to a multiple of n"; "The same model, two designs": "61 embedding rows become 62" on 2 ranks.
    n = 2
    units = {"root": [], "blocks.0": [], "blocks.1": []}
    for name, p in GPT(CFG).named_parameters():
        units[".".join(name.split(".")[:2]) if name.startswith("blocks.") else "root"].append(p.shape)
    padded = {u: sum(math.ceil(s[0] / n) * math.prod(s[1:]) for s in shapes) for u, shapes in units.items()}
    for calls in launch(_fsdp2_bytes, n, timeout=120):
        gathers = [c.numel for c in calls if c.op == "all_gather"]
        assert gathers == [padded["root"], padded["blocks.0"], padded["blocks.1"], padded["blocks.1"],
                           padded["blocks.0"]]
        assert sorted(c.numel for c in calls if c.op == "reduce_scatter") == sorted(
            n * v for v in padded.values())


def _fsdp2_locals(world):
    from torch.distributed.fsdp import fully_shard

    module = nn.Module()
    for i, shape in enumerate(TRIAL_SHAPES):
        module.register_parameter(f"p{i}", nn.Parameter(trial_tensor(shape, i)))
    fully_shard(module)
    return [module.get_parameter(f"p{i}").to_local().detach().clone() for i in range(len(TRIAL_SHAPES))]


def test_09_fsdp2_cuts_like_torch_chunk_and_gives_ranks_past_the_chunks_nothing(no_orphans):
    # 09, "What a rank holds" and exercise 1: "the rule is `torch.chunk`'s: chunks of ⌈rows / n⌉ rows, rank after
    # rank, so the last ranks may hold fewer rows, or none" (_fsdp_common.py:134, `_chunk_with_empty`); the
    # exercise's reference `dim0_shard` keeps what PyTorch's FSDP2 keeps on every rank of worlds 2, 3 and 4, and
    # `torch.chunk` itself returns fewer than n chunks for some of those shapes.
    fewer = 0
    for world in (2, 3, 4):
        for rank, shards in enumerate(launch(_fsdp2_locals, world, args=(world,), timeout=120)):
            for i, shape in enumerate(TRIAL_SHAPES):
                want = dim0_shard(trial_tensor(shape, i), rank, world)
                assert shards[i].shape == want.shape and torch.equal(shards[i], want), (world, rank, shape)
        fewer += sum(len(torch.chunk(torch.empty(s), world)) < world for s in TRIAL_SHAPES)
    assert fewer >= 2  # (2, 3, 4) at world 3, (3, 5) and (2, 3, 4) at world 4


def _fsdp2_generate():
    from torch.distributed.fsdp import register_fsdp_forward_method

    prompt = torch.tensor([[1, 2, 3], [7, 9, 11]])
    model = _fsdp2_09(GPT(CFG))
    try:
        model.generate(prompt, 5)
        error = ""
    except RuntimeError as e:
        error = str(e).splitlines()[0]
    register_fsdp_forward_method(model, "generate")
    with FSDP2Calls() as log:
        out = model.generate(prompt, 5)
    return error, out, len(log.calls)


def test_09_fsdp2_generate_fails_on_shards_unless_registered_then_gathers_each_block_per_token(no_orphans):
    # 09, "A method beside forward: `generate()`": "The per-parameter design without registration fails inside
    # PyTorch (the embedding meets a DTensor shard)"; "PyTorch's answer is `register_fsdp_forward_method(model,
    # "generate")`, which runs the method between the root's pre-forward and post-forward hooks": registered, it
    # generates what one process does, gathering the root once and each block once per new token.
    expected = GPT(CFG).generate(torch.tensor([[1, 2, 3], [7, 9, 11]]), 5)
    for error, out, gathers in launch(_fsdp2_generate, 2, timeout=120):
        assert error.startswith("aten.embedding.default got mixed torch.Tensor and DTensor")
        assert torch.equal(out, expected)
        assert gathers == 1 + 2 * 5


def _fsdp2_reshard(blocks_value, root_value):
    model = _fsdp2_09(GPT(CFG), {"reshard_after_forward": blocks_value},
                      {} if root_value is None else {"reshard_after_forward": root_value})
    x, y = _batch_09()
    with FSDP2Calls() as forward:
        loss = model(x, y)
    with FSDP2Calls() as backward:
        loss.backward()
    return ([(c.op, c.group_size) for c in forward.ops("all_gather")],
            [(c.op, c.group_size) for c in backward.ops("all_gather")])


def test_09_fsdp2_reshard_after_forward_int_gathers_backward_within_groups_of_k(no_orphans):
    # 09, "`reshard_after_forward=2`: a middle way": "An int k keeps a 1/k share of each gathered parameter
    # after forward, so backward gathers from k ranks only ... (ZeRO++'s hpZ; PyTorch's FSDP2 has the same
    # option)"; the groups are k consecutive ranks (_fsdp_init.py:188), a node when ranks are numbered by node.
    runs = run_cases(_fsdp2_reshard, ((2, None), (True, None), (False, None)), 4, timeout=170, star=True)
    for forward, backward in runs[(2, None)]:
        assert forward == [("all_gather", 4)] * 3  # root, blocks.0, blocks.1 over all four ranks
        assert backward == [("all_gather", 2)] * 2  # blocks.1, blocks.0 from the kept shares, within pairs
    for forward, backward in runs[(True, None)]:
        assert forward == [("all_gather", 4)] * 3 and backward == [("all_gather", 4)] * 2
    for forward, backward in runs[(False, None)]:
        assert forward == [("all_gather", 4)] * 3 and backward == []


def test_09_fsdp2_keeps_the_root_gathered_only_when_its_reshard_after_forward_is_left_unset(no_orphans):
    # 09, "`reshard_after_forward=2`: a middle way": "the root keeps its default, as in PyTorch, where the root
    # stays gathered from forward to backward only when `reshard_after_forward` is left unset
    # (_fsdp_state.py:205)": passed True explicitly, FSDP2 frees the root after forward and gathers it again.
    runs = run_cases(_fsdp2_reshard, ((True, True), (True, None)), 2, timeout=170, star=True)
    for _, backward in runs[(True, True)]:
        assert len(backward) == 3  # blocks.1, blocks.0 and the root again
    for _, backward in runs[(True, None)]:
        assert len(backward) == 2


# ============================== lesson 10 =========================================================

C10D = TORCH / "include" / "torch" / "csrc" / "distributed" / "c10d"


ENV = dict(os.environ, OMP_NUM_THREADS="1")


def _run(script: str, env=None, timeout=120) -> subprocess.CompletedProcess:
    return _wait([_start(script, env)], timeout)[0]


def _start(script: str, env=None, args=()) -> subprocess.Popen:
    """`python -c SCRIPT *args` in a fresh Python, started, not waited for: scripts that spend their time
    importing torch or waiting out a timeout they provoke run side by side."""
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *args], env=env or ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _wait(procs, timeout=120) -> list[subprocess.CompletedProcess]:
    """Each started script's outcome, all within `timeout` seconds; any still running then is killed."""
    deadline = time.monotonic() + timeout
    try:
        done = []
        for proc in procs:
            out, err = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
            done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
        return done
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def test_the_default_timeouts_are_30_minutes_on_gloo_and_10_on_nccl():
    # Lesson 10, introduction: "after the process group's timeout (30 minutes on gloo, 10 on NCCL)";
    # "Timeouts per group": "init_process_group(timeout=...) sets the default group's (NCCL's default
    # 10 minutes, gloo's 30)".
    from torch.distributed.constants import default_pg_timeout
    from torch.distributed.distributed_c10d import Backend, _get_default_timeout

    assert default_pg_timeout == datetime.timedelta(minutes=30)
    assert _get_default_timeout(Backend.GLOO) == datetime.timedelta(minutes=30)
    # NCCL is not compiled into the CPU build: its default is read from the pinned torch's header
    # (include/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp:157-158, cited in the lesson)
    header = (C10D / "ProcessGroupNCCL.hpp").read_text().splitlines()
    assert "kProcessGroupNCCLDefaultTimeout" in header[156]
    assert "std::chrono::milliseconds(10 * 60 * 1000)" in header[157]


def _quick_group_times_out():
    quick = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=2))
    start = time.monotonic()
    if dist.get_rank() == 1:
        time.sleep(4)  # never joins
        return None
    try:
        dist.all_reduce(torch.ones(3), group=quick)
    except RuntimeError as e:
        return time.monotonic() - start, str(e)
    return "no error"


def test_new_group_timeout_fails_a_skipped_collective_in_seconds(no_orphans):
    # Lesson 10, "Timeouts per group": "new_group(ranks, timeout=...) gives one group its own: a short one
    # ..., so that a skipped collective in it fails in seconds while the rest keep their long timeout."
    seconds, message = launch(_quick_group_times_out, 2, timeout=30)[0]  # the default group: 60 s
    assert 1.5 < seconds < 4
    assert re.search(r"Timed out waiting 2000ms", message)


def _init_late_with_torch(rank, port, conn):
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    time.sleep(5 * rank)  # rank 1 arrives 5 s after rank 0 (a margin for a busy machine)
    try:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=1))
        conn.send("initialised")
    except RuntimeError as e:
        conn.send(f"{type(e).__name__}: {e}")
    os._exit(0)


def test_init_process_group_fails_a_rank_whose_peer_starts_later_than_the_timeout():
    # Lesson 10, "Timeouts per group": "The default group's timeout also bounds init_process_group's wait for
    # the other ranks: a rank whose peer arrives later than that fails in init_process_group itself". That
    # fsdp_mini.init waits: tests/library/test_launch.py,
    # test_init_waits_for_a_rank_that_starts_later_than_the_timeout.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("fork")
    reader, writer = ctx.Pipe(duplex=False)
    ranks = [ctx.Process(target=_init_late_with_torch, args=(r, port, writer)) for r in range(2)]
    for proc in ranks:
        proc.start()
    try:
        said = reader.recv() if reader.poll(60) else "nothing within 60 s"
    finally:
        for proc in ranks:
            proc.kill()
            proc.join()
    assert re.match(r"DistStoreError: Timed out after \d seconds waiting for clients\. 1/2 clients joined", said), said


DETAIL_SCRIPT = """
    import datetime, os, pickle, sys, tempfile, torch, torch.distributed as dist, multiprocessing as mp
    from fsdp_mini.runtime import wait_for_every_rank

    def rank(r, folder, case):
        log = os.open(os.path.join(folder, f"rank{r}.log"), os.O_WRONLY | os.O_CREAT, 0o644)
        os.dup2(log, 1)  # this rank's prints and gloo's messages, apart from the other cases' ranks
        os.dup2(log, 2)
        store = dist.FileStore(os.path.join(folder, "store"), 2)
        wait_for_every_rank(store, 2, datetime.timedelta(seconds=60))  # a rank that starts late is not the hang
        store.set_timeout(datetime.timedelta(seconds=3))
        dist.init_process_group("gloo", store=store, rank=r, world_size=2, timeout=datetime.timedelta(seconds=3))
        backend = type(dist.group.WORLD._get_backend(torch.device("cpu"))).__name__
        try:
            if case == "shapes":
                dist.all_reduce(torch.ones(4 + r))
            elif case == "stopped":
                if r == 0:
                    dist.all_reduce(torch.ones(4))  # rank 1 has stopped issuing collectives
            else:  # three agreeing AllReduces, then what the flight recorder saw
                for _ in range(3):
                    dist.all_reduce(torch.ones(4))
                names = [e["profiling_name"] for e in
                         pickle.loads(torch._C._distributed_c10d._dump_fr_trace())["entries"]]
                print(f"rank {r} {backend}", names, flush=True)
        except RuntimeError as e:
            print(f"rank {r} {backend} RuntimeError:", str(e).splitlines()[0], flush=True)

    if __name__ == "__main__":  # each case named in argv on two ranks of its own, all cases at once
        ctx = mp.get_context("fork")
        cases = {case: (tempfile.mkdtemp(), []) for case in sys.argv[1:]}
        for case, (folder, ranks) in cases.items():
            ranks += [ctx.Process(target=rank, args=(r, folder, case), daemon=True) for r in range(2)]
        for _, ranks in cases.values():
            for p in ranks:
                p.start()
        for case, (folder, ranks) in cases.items():
            for p in ranks:
                p.join(60)
            print(f"=== {case}")
            for r in range(2):
                with open(os.path.join(folder, f"rank{r}.log")) as f:
                    print(f.read(), end="", flush=True)
"""


@pytest.fixture(scope="module")
def under_detail() -> dict[str, str]:
    """What each case's two ranks print (stdout and stderr) under DETAIL: one fresh process (DETAIL is read at
    import), which forks the ranks of the three cases at once."""
    env = dict(ENV, TORCH_DISTRIBUTED_DEBUG="DETAIL")
    run = _wait([_start(DETAIL_SCRIPT, env, args=("shapes", "stopped", "agree"))])[0]
    assert run.returncode == 0, run.stderr
    return dict(re.findall(r"^=== (\w+)\n(.*?)(?=^=== |\Z)", run.stdout, re.M | re.S))


def test_detail_wraps_the_group_and_raises_on_mismatched_shapes(under_detail):
    # Lesson 10, "What PyTorch offers": "TORCH_DISTRIBUTED_DEBUG=DETAIL wraps every process group in a
    # ProcessGroupWrapper: before each collective, the ranks exchange a fingerprint of it (sequence number,
    # op, shapes, dtypes) over a helper gloo group and raise on a mismatch"; "DETAIL catches ... mismatched
    # shapes at once, with both shapes".
    out = under_detail["shapes"]
    assert "_ProcessGroupWrapper" in out
    assert "Detected mismatch between collectives on ranks" in out
    assert "Tensor Tensor shapes" in out and "TensorShape=[4]" in out and "TensorShape=[5]" in out


def test_detail_names_a_rank_that_stopped_once_the_group_times_out(under_detail):
    # Lesson 10: "A rank that has stopped issuing collectives (a batch fewer) brings no fingerprint at all:
    # rank 0 waits in the monitored barrier, which names the ranks that never came once the group's timeout
    # has passed".
    out = under_detail["stopped"]
    assert "rank 0 _ProcessGroupWrapper RuntimeError: [Rank 0]: Ranks 1 failed to pass monitoredBarrier in 3000 ms" in out
    assert "Detected mismatch" not in out


def test_detail_costs_two_small_allgathers_per_collective(under_detail):
    # Lesson 10: "It also costs: on gloo, before each collective, two small AllGathers of the fingerprint
    # (its length, then the fingerprint) on the helper group". PyTorch's own flight recorder shows them.
    out = under_detail["agree"]
    names = eval(re.search(r"rank 0 _ProcessGroupWrapper (\[.*\])", out).group(1))
    assert names == ["gloo:all_gather", "gloo:all_gather", "gloo:all_reduce"] * 3
    # and the wrapper's helper is a plain gloo group (distributed_c10d.py, _create_process_group_wrapper)
    source = (TORCH / "distributed" / "distributed_c10d.py").read_text()
    assert "helper_pg = ProcessGroupGloo(store, rank, world_size, timeout=timeout)" in source


def test_detail_is_read_when_torch_distributed_is_imported():
    # Lesson 10: "It is read when torch.distributed is imported, so it goes in the environment of a new
    # process."
    late, early = _wait([_start("""
        import os, torch.distributed as dist
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"  # too late: read at import
        print(dist.get_debug_level())
    """), _start("import torch.distributed as dist; print(dist.get_debug_level())",
                 env=dict(ENV, TORCH_DISTRIBUTED_DEBUG="DETAIL"))])
    assert "DebugLevel.OFF" in late.stdout, late.stderr
    assert "DebugLevel.DETAIL" in early.stdout, early.stderr


def _rank0_issues_one_more():
    dist.all_reduce(torch.ones(3))
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(3))  # rank 1 never joins


def _raw_dump(folder):
    """The dump as torch writes it, with no repair of its pg_config."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"rank_{dist.get_rank()}"), "wb") as f:
        f.write(torch._C._distributed_c10d._dump_fr_trace())


def _both_dumps(folder):
    try:
        _rank0_issues_one_more()
    except RuntimeError:
        pass
    finally:
        _raw_dump(os.path.join(folder, "raw"))
        dump_trace(os.path.join(folder, "pytorch"), dist.get_rank())


def test_the_flight_recorder_records_gloo_and_fr_trace_reads_a_repaired_dump(tmp_path):
    # Lesson 10, "PyTorch's flight recorder": "in torch 2.13 it records gloo as well as NCCL";
    # "gloo has no such watchdog, so a gloo rank writes its buffer itself: _dump_fr_trace() ... in a
    # finally"; "the dump's pg_config lists one nameless group and fr_trace stops with a KeyError. The
    # course's dump_trace writes the groups in by name"; fr_trace "reports the first collective where they
    # disagree".
    exits = record_both(functools.partial(_both_dumps, str(tmp_path)), 2, str(tmp_path), timeout_s=3)
    assert exits == {0: 0, 1: 0}
    raw = pickle.loads((tmp_path / "raw" / "rank_0").read_bytes())
    assert [e["profiling_name"] for e in raw["entries"]] == ["gloo:all_reduce", "gloo:all_reduce"]
    assert [e["collective_seq_id"] for e in raw["entries"]] == [1, 2]
    assert [e["process_group"] for e in raw["entries"]] == [("0", "default_pg")] * 2
    assert list(raw["pg_config"]) == [""]  # the group registered before it had its name
    out = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace",
                          str(tmp_path / "raw")], env=ENV, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "KeyError: ('0', 0)" in out.stderr
    assert first_finding(fr_trace(str(tmp_path))) == {
        "kind": "not joined", "seq": 2, "collective": "gloo:all_reduce", "ranks": [1]}


def _count_entries():
    dist.all_reduce(torch.ones(3))
    return len(pickle.loads(torch._C._distributed_c10d._dump_fr_trace())["entries"])


def test_the_buffer_is_on_by_default_and_its_size_is_an_environment_variable():
    # Lesson 10: "TORCH_FR_BUFFER_SIZE entries (2000 by default, 0 turns it off;
    # TORCH_NCCL_TRACE_BUFFER_SIZE is its older name)" (FlightRecorder.hpp:110-111).
    # One process imports torch; a child forked for each setting sets the variable before its first group
    # (the buffer is made then: record_both sets it so) and reports what its buffer kept of five AllReduces.
    script = """
        import os, pickle, tempfile, torch, torch.distributed as dist
        settings = (("default", {}), ("off", {"TORCH_FR_BUFFER_SIZE": "0"}),
                    ("three", {"TORCH_FR_BUFFER_SIZE": "3"}), ("old name", {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2"}))
        for name, env in settings:
            child = os.fork()
            if child == 0:
                os.environ.update(env)
                dist.init_process_group("gloo", init_method=f"file://{tempfile.mkdtemp()}/s", rank=0, world_size=1)
                for _ in range(5):
                    dist.all_reduce(torch.ones(3))
                print(name, len(pickle.loads(torch._C._distributed_c10d._dump_fr_trace())["entries"]), flush=True)
                os._exit(0)
            os.waitpid(child, 0)
    """
    out = _run(script)
    counts = {name: int(n) for name, n in re.findall(r"^(default|off|three|old name) (\d+)$", out.stdout, re.M)}
    assert counts == {"default": 5, "off": 0, "three": 3, "old name": 2}
    header = (C10D / "FlightRecorder.hpp").read_text().splitlines()
    assert '{"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"}, 2000);' in header[110]


def test_nccl_dump_settings_and_the_analyzer_exist_in_the_pinned_torch():
    # Lesson 10: "On NCCL a watchdog thread writes each rank's buffer to a file when a collective times out
    # (TORCH_NCCL_DUMP_ON_TIMEOUT=1; the files are named by the prefix TORCH_FR_DUMP_TEMP_FILE and the
    # rank)"; "python -m torch.distributed.flight_recorder.fr_trace DIR (also installed as torchfrtrace)".
    header = (C10D / "ProcessGroupNCCL.hpp").read_text().splitlines()
    assert "dumping debug info on watchdog" in header[70] and '"TORCH_NCCL_DUMP_ON_TIMEOUT"' in header[74]
    assert b"TORCH_FR_DUMP_TEMP_FILE" in (TORCH / "lib" / "libtorch_cpu.so").read_bytes()
    from importlib.metadata import entry_points
    scripts = {e.name: e.value for e in entry_points(group="console_scripts")}
    assert scripts["torchfrtrace"] == "torch.distributed.flight_recorder.fr_trace:main"


def _all_gather_of_another_size():
    out = torch.empty(2 * (4 if dist.get_rank() == 0 else 64))
    dist.all_gather_into_tensor(out, torch.ones(out.numel() // 2))


def test_a_rank_that_dies_leaves_no_dump_and_fr_trace_names_it(tmp_path):
    # Lesson 10: "a process that dies takes PyTorch's buffer with it, so fr_trace says only whose dump is
    # missing"; "gloo aborts rank 0 on the size mismatch: SIGABRT" (the state_dict() mode).
    exits = record_both(_all_gather_of_another_size, 2, str(tmp_path), timeout_s=3)
    assert exits[0] == -6  # SIGABRT: gloo's enforce on a received size larger than expected
    assert not (tmp_path / "pytorch" / "rank_0").exists()
    assert first_finding(fr_trace(str(tmp_path))) == {"kind": "missing dumps", "ranks": [0]}


def test_fr_trace_takes_the_first_file_it_reads_as_the_expected_collective():
    # Lesson 10: "fr_trace takes the first file it reads as the expected collective and calls the ranks
    # that differ from it culprits; which file comes first is the file system's order".
    builder = (TORCH / "distributed" / "flight_recorder" / "components" / "builder.py").read_text().splitlines()
    assert "starting arbitrarily with the trace from the first rank" in builder[194]
    assert "first_rank = next(rank_iter)" in builder[197]
    loader = (TORCH / "distributed" / "flight_recorder" / "components" / "loader.py").read_text().splitlines()
    assert "for root, _, files in os.walk(args.trace_dir):" in loader[83]  # unsorted: directory order


def test_distributed_sampler_gives_every_rank_the_same_count():
    # Lesson 10, "One batch fewer": "the sampler gives every rank the same number of samples (by default it
    # repeats a few to fill the last round; drop_last=True drops the remainder instead)".
    from torch.utils.data.distributed import DistributedSampler
    data = list(range(10))
    padded = [list(DistributedSampler(data, num_replicas=4, rank=r, shuffle=False)) for r in range(4)]
    dropped = [list(DistributedSampler(data, num_replicas=4, rank=r, shuffle=False, drop_last=True))
               for r in range(4)]
    assert [len(s) for s in padded] == [3, 3, 3, 3]
    assert sorted(sum(padded, [])) == sorted(data + [0, 1])  # two samples repeated
    assert [len(s) for s in dropped] == [2, 2, 2, 2]


def _join_with_fully_shard():
    from torch.distributed.algorithms.join import Join
    from torch.distributed.fsdp import fully_shard
    model = fully_shard(torch.nn.Linear(4, 4))
    try:
        with Join([model]):
            pass
    except AttributeError as e:
        return str(e)
    return "joined"


def test_join_does_not_apply_to_fsdp(no_orphans):
    # Lesson 10, "One batch fewer": "DDP's Join context ... does not help: it takes Joinable modules, and
    # neither FSDP nor fully_shard is one."
    from torch.distributed.algorithms.join import Joinable
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
    from torch.nn.parallel import DistributedDataParallel
    assert issubclass(DistributedDataParallel, Joinable)
    assert not issubclass(FullyShardedDataParallel, Joinable) and not issubclass(FSDPModule, Joinable)
    assert launch(_join_with_fully_shard, 2, timeout=60) == ["'FSDPLinear' object has no attribute 'join_hook'"] * 2


def test_torchrun_max_restarts_restarts_a_failed_job(tmp_path):
    # Lesson 10, "A dead rank": "torchrun's --max-restarts automates the restart."
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys
        marker = {str(tmp_path / "tried")!r}
        if not os.path.exists(marker):
            open(marker, "w").close()
            sys.exit(3)  # the first attempt dies
        print("second attempt", os.environ["TORCHELASTIC_RESTART_COUNT"])
    """))
    job = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
                          "--max-restarts", "1", str(script)], env=ENV, capture_output=True, text=True,
                         timeout=180)
    assert job.returncode == 0, job.stderr[-2000:]
    assert "second attempt 1" in job.stdout


def _tracked():
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (2,))
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(4, 8)).sum().backward()  # the first step creates AdamW's state
    opt.step()
    opt.zero_grad()
    tracker = FSDPMemTracker(model, opt)
    with tracker:  # the second step, tracked
        model(torch.ones(4, 8)).sum().backward()
        opt.step()
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    return {getattr(k, "value", k): v for k, v in peak.items()}


def test_fsdp_mem_tracker_runs_on_cpu_and_gloo(no_orphans):
    # Lesson 10, "PyTorch's memory tools": "FSDPMemTracker ... files each byte under a kind ... It counts,
    # it does not ask an allocator, so it runs on CPU and gloo."
    peak = launch(_tracked, 2, timeout=120)[0]
    assert peak["Sharded Param"] == 2 * (8 * 8 + 8) // 2 * 4  # this rank's half of both layers, fp32
    assert peak["OptState"] >= 2 * peak["Sharded Param"]  # AdamW's two moments (and its step counters)
    assert {"Unsharded Param", "Activation", "Temp", "All Gather", "Inputs", "Total"} <= set(peak)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the claim is about a CPU-only build")
def test_the_memory_snapshot_is_cuda_only_and_the_profiler_counts_cpu_memory():
    # Lesson 10: "It belongs to the CUDA allocator (torch/cuda/memory.py:996 calls
    # torch._C._cuda_record_memory_history), so a CPU-only build has no such call (it raises
    # AttributeError) ...; on CPU, torch.profiler.profile(profile_memory=True) records each operator's
    # allocations".
    with pytest.raises(AttributeError, match="_cuda_record_memory_history"):
        torch.cuda.memory._record_memory_history()
    memory = (TORCH / "cuda" / "memory.py").read_text().splitlines()
    assert "_C._cuda_record_memory_history(" in memory[995]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        torch.ones(1024, 1024) * 2
    assert max(e.cpu_memory_usage for e in prof.key_averages()) >= 1024 * 1024 * 4


def test_expandable_segments_is_a_setting_of_the_allocator_config():
    # Lesson 10: "with PYTORCH_ALLOC_CONF=expandable_segments:True (PYTORCH_CUDA_ALLOC_CONF is the older
    # name) the caching allocator grows one segment as needed instead of reserving a new one for each large
    # allocation (c10/core/AllocatorConfig.h:158-160 and 209-215)".
    header = (TORCH / "include" / "c10" / "core" / "AllocatorConfig.h").read_text().splitlines()
    assert "PYTORCH_ALLOC_CONF" in header[157] and "PYTORCH_CUDA_ALLOC_CONF" in header[158]
    assert "expandable segment feature is enabled" in header[208]
    assert "static bool use_expandable_segments()" in header[212]


# ============================== lesson 11 =========================================================

FSDP2 = TORCH / "distributed" / "fsdp" / "_fully_shard"


CFG4 = GPTConfig(n_layer=4)


STEPS = 2


def _line(path: Path, number: int) -> str:
    return path.read_text().splitlines()[number - 1]


class _TwoBlocks(nn.Module):
    def __init__(self, first, second):
        super().__init__()
        self.first, self.second = first, second

    def forward(self, x):
        return tuc.checkpoint(lambda y: self.second(self.first(y)), x, use_reentrant=False)


def _span_model():
    model = GPT(CFG4)
    model.blocks = nn.ModuleList([_TwoBlocks(model.blocks[0], model.blocks[1]), model.blocks[2], model.blocks[3]])
    return model


def _plain(name):
    """A key of the span model's state dict as the plain GPT names it."""
    m = re.match(r"blocks\.0\.(first|second)\.(.*)", name)
    if m:
        return f"blocks.{int(m.group(1) == 'second')}.{m.group(2)}"
    m = re.match(r"blocks\.(\d)\.(.*)", name)
    return f"blocks.{int(m.group(1)) + 1}.{m.group(2)}" if m else name


def _pytorch_run(model, reshard=None):
    for m in [m for m in model.modules() if isinstance(m, Block)]:
        torch_fully_shard(m, reshard_after_forward=reshard)
    torch_fully_shard(model, reshard_after_forward=reshard)
    with PyTorchGathers() as gathers:
        train(model, torch.optim.SGD(model.parameters(), lr=0.1), CFG4, steps=STEPS, batch_size=8)
    return {"counts": {k: v // STEPS for k, v in gathers.counts.items()}, "peak": gathers.peak,
            "events": gathers.events, "state": pytorch_full_state_dict(model)}


def _mini_span():
    model = FSDP(_span_model(), "FULL_SHARD", wrap=(Block,))
    with CommLog() as log:
        train(model, torch.optim.SGD(model.parameters(), lr=0.1), CFG4, steps=STEPS, batch_size=8)
    return {k: v // STEPS for k, v in Counter(r.label for r in log.records if r.op == "all_gather").items()}


def _span_worker():
    return {"none": _pytorch_run(GPT(CFG4)), "unit": _pytorch_run(checkpoint_blocks(GPT(CFG4), range(4))),
            "span": _pytorch_run(_span_model()), "mini_span": _mini_span(),
            "root_true": _pytorch_run(GPT(CFG4), reshard=True)["counts"]["root"]}


@pytest.fixture(scope="module")
def span_runs():
    return launch(_span_worker, 2, timeout=240)[0]


def test_fsdp2_gathers_the_first_unit_of_a_spanning_checkpoint_twice_and_keeps_it(span_runs, no_orphans):
    # Lesson 11, "What it does to the AllGathers": "fsdp_mini then frees block 0 after the recomputation
    # [...] 3 AllGathers of block 0 per step. PyTorch's FSDP2 gathers it 2 times: its post-forward skips the
    # reshard while backward runs [...], so block 0 stays gathered from its recomputation through block 1's
    # backward to its own." and "the gathered peak unchanged".
    span = span_runs["span"]
    assert span["counts"] == {"root": 1, "blocks.0.first": 2, "blocks.0.second": 2, "blocks.1": 2, "blocks.2": 2}
    assert span_runs["mini_span"]["blocks.0.first"] == 3  # fsdp_mini's engine: a third AllGather
    first_step = span["events"][:len(span["events"]) // STEPS]
    gathers = [i for i, e in enumerate(first_step) if e == ("gather", "blocks.0.first")]
    frees = [i for i, e in enumerate(first_step) if e == ("free", "blocks.0.first")]
    assert len(gathers) == 2 and len(frees) == 2
    # after its second gather (for recomputation and backward) block 0 is freed once, after block 1 is
    assert frees[1] > gathers[1] and first_step.index(("free", "blocks.0.second"), gathers[1]) < frees[1]
    assert span["peak"] == span_runs["none"]["peak"]
    # "with backward prefetch, on by default in every engine here, two blocks are gathered during each block's
    # backward anyway": the peak is the root and two blocks (FSDP2's default: _fsdp_state.py line 384)
    model = GPT(CFG4)
    root = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("blocks."))
    block = sum(p.numel() for p in model.blocks[0].parameters())
    assert span_runs["none"]["peak"] == 4 * (root + 2 * block)
    assert "default_prefetch = len(self._states_to_backward_prefetch) == 0" in _line(FSDP2 / "_fsdp_state.py", 384)
    state = {_plain(k): v for k, v in span["state"].items()}
    assert sorted(state) == sorted(span_runs["none"]["state"])
    for k, v in span_runs["none"]["state"].items():  # the span trains like no checkpointing
        torch.testing.assert_close(state[k], v, rtol=1e-5, atol=1e-6)


def test_fsdp2_per_unit_checkpoint_costs_no_allgather(span_runs, no_orphans):
    # Lesson 11: "Checkpointing each unit leaves every count as it was, in all three engines: 2 AllGathers per
    # block under FULL_SHARD [...] the root gathered once, and the gathered peak unchanged".
    none, unit = span_runs["none"], span_runs["unit"]
    assert none["counts"] == {"root": 1, **{f"blocks.{i}": 2 for i in range(4)}}
    assert unit["counts"] == {"root": 1, **{f"blocks.{i}.block": 2 for i in range(4)}}
    assert unit["peak"] == none["peak"]


def test_fsdp2_root_stays_gathered_after_forward_only_by_default(span_runs, no_orphans):
    # Lesson 11's table code: "PyTorch: None, its default, keeps the root gathered after forward, as fsdp_mini
    # does" (torch/distributed/fsdp/_fully_shard/_fsdp_state.py, lines 203-207).
    assert span_runs["none"]["counts"]["root"] == 1 and span_runs["root_true"] == 2
    assert "For the root, do not reshard after forward" in _line(FSDP2 / "_fsdp_state.py", 203)


def test_fsdp2_hooks_leave_a_unit_in_pre_backward_alone_at_the_cited_lines():
    # Lesson 11: "its pre-forward and post-forward hooks return at once when the unit is in PRE_BACKWARD
    # (_fsdp_state.py, lines 295 and 327), and a unit's post-forward does not reshard while any backward is
    # running (_fsdp_param_group.py, lines 562-564: `if not is_bw()`)".
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

    assert "TrainingState.PRE_BACKWARD" in _line(FSDP2 / "_fsdp_state.py", 295)
    assert "TrainingState.PRE_BACKWARD" in _line(FSDP2 / "_fsdp_state.py", 327)
    assert _line(FSDP2 / "_fsdp_param_group.py", 562).strip() == "if not is_bw():"
    assert _line(FSDP2 / "_fsdp_param_group.py", 563).strip() == "self.reshard()"
    assert inspect.getsourcelines(FSDPState._pre_forward)[1] <= 295
    assert inspect.getsourcelines(FSDPParamGroup.post_forward)[1] == 557


def _ac_worker():
    out = {}
    for order in ("none", "ac", "fsdp"):
        model = GPT(CFG4)
        calls = []
        for block in model.blocks:
            block.register_forward_pre_hook(lambda *_: calls.append(1))
        # the lesson's own wrapping: "ac" wraps the blocks then shards the wrappers, "fsdp" the other way
        checkpoint_then_shard(model, {"none": "none", "ac": "inside", "fsdp": "around"}[order])
        with PyTorchGathers() as gathers:
            train(model, torch.optim.SGD(model.parameters(), lr=0.1), CFG4, steps=STEPS, batch_size=8)
        out[order] = {"counts": sorted(v // STEPS for v in gathers.counts.values()),
                      "names": sorted(gathers.counts), "recomputed": len(calls) // STEPS - CFG4.n_layer,
                      "state": pytorch_full_state_dict(model)}
    return out


def test_checkpoint_wrapper_and_fully_shard_in_either_order(no_orphans):
    # Lesson 11, "In PyTorch: checkpoint_wrapper, then fully_shard": "Either order trains exactly as without
    # checkpointing, gathers each block twice a step, and recomputes each block once in backward" and "the
    # state dict's keys stay the plain ones either way".
    runs = launch(_ac_worker, 2, timeout=240)[0]
    plain = sorted(GPT(CFG4).state_dict())
    for order, run in runs.items():
        assert run["counts"] == [1, 2, 2, 2, 2], order
        assert run["recomputed"] == (0 if order == "none" else CFG4.n_layer), order
        assert sorted(run["state"]) == plain, order
        for k, v in runs["none"]["state"].items():
            torch.testing.assert_close(run["state"][k], v, rtol=0, atol=1e-6)
    assert all("_checkpoint_wrapped_module" in n for n in runs["fsdp"]["names"] if n != "root")
    assert runs["ac"]["names"] == runs["none"]["names"]


def test_torchtitan_order_is_cited_as_the_lesson_says():
    # Lesson 11: "TorchTitan [...] applies it first and then fully_shard to each wrapped block" - a citation
    # of torchtitan/models/llama3/infra/parallelize.py (apply_ac, then apply_fsdp); here only PyTorch's side:
    # apply_activation_checkpointing wraps in place, non-reentrant by default.
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    assert inspect.signature(checkpoint_wrapper).parameters["checkpoint_impl"].default is CheckpointImpl.NO_REENTRANT
    model = GPT(GPTConfig())
    apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, Block))
    assert all(isinstance(b, CheckpointWrapper) for b in model.blocks)


def test_non_reentrant_checkpoint_saves_only_its_input_and_recomputes_in_backward():
    # Lesson 11: "Checkpointing a block means: in forward, run it without saving anything inside it, keeping only
    # its input; in backward, run its forward again" (torch.utils.checkpoint, use_reentrant=False: the input is
    # saved by new_frame.save_inputs, torch/utils/checkpoint.py line 1701).
    cfg = GPTConfig(n_embd=64, n_head=4, block_size=64)
    block = Checkpointed(Block(cfg))
    x = torch.randn(8, 64, 64, requires_grad=True)
    with SavedActivations(exclude=block.parameters()) as saved:
        y = block(x)
    assert saved.nbytes == x.numel() * 4
    assert block.recomputed == 0
    y.sum().backward()
    assert block.recomputed == 1
    assert "new_frame.save_inputs(*args)" in _line(TORCH / "utils" / "checkpoint.py", 1701)


def test_checkpoint_restores_the_random_state_for_its_recomputation():
    # Lesson 11: "the checkpoint does work of its own (it saves and restores the random generator's state, and
    # packs and unpacks every tensor saved inside it)" (torch/utils/checkpoint.py lines 1631-1632).
    x = torch.ones(10_000, requires_grad=True)
    y = tuc.checkpoint(lambda t: torch.nn.functional.dropout(t, 0.5, training=True), x, use_reentrant=False)
    y.sum().backward()
    assert torch.equal(x.grad != 0, y != 0)  # the recomputed mask is the forward's
    assert "fwd_cpu_state = torch.get_rng_state()" in _line(TORCH / "utils" / "checkpoint.py", 1632)


def test_fsdp2_issues_all_gathers_on_streams_of_their_own_at_the_cited_line():
    # Lesson 11, "Measured on this CPU": "FSDP2 issues its AllGathers on streams of their own:
    # get_all_gather_streams in torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py, line 116".
    assert _line(FSDP2 / "_fsdp_param_group.py", 116).strip() == "def get_all_gather_streams("


def test_early_stop_skips_recomputing_a_blocks_last_matrix_product():
    # Lesson 11: "PyTorch's checkpoint (with use_reentrant=False) recomputes less: by default it stops as soon as
    # it has rebuilt every tensor the block's backward needs" and "the recomputation stops before that last
    # matrix product" (the MLP's output projection).
    from torch.utils.flop_counter import FlopCounterMode

    cfg = GPTConfig()
    x = torch.randn(2, cfg.block_size, cfg.n_embd, requires_grad=True)
    block = Block(cfg)

    def step(checkpointed, early_stop=True):
        with tuc.set_checkpoint_early_stop(early_stop), sdpa_kernel(SDPBackend.MATH):
            with FlopCounterMode(display=False) as counter:
                y = tuc.checkpoint(block, x, use_reentrant=False) if checkpointed else block(x)
                y.sum().backward()
        return counter.get_total_flops()

    plain = step(False)
    forward = plain // 3  # backward costs two forwards
    last_projection = 2 * 4 * cfg.n_embd * cfg.n_embd * x.shape[0] * cfg.block_size
    assert step(True, early_stop=False) == plain + forward
    assert step(True) == plain + forward - last_projection


@pytest.mark.parametrize("early_stop, fired", [(True, 0), (False, 1)])
def test_early_stop_decides_whether_the_post_forward_hook_fires_in_backward(early_stop, fired):
    # Lesson 11: "with torch.utils.checkpoint.set_checkpoint_early_stop(False) (the recomputation then runs to
    # the block's end, so its post-forward hook fires inside backward)".
    block = Block(GPTConfig())
    hooks = []
    block.register_forward_hook(lambda *_: hooks.append(1))
    x = torch.randn(2, 16, 30, requires_grad=True)
    with tuc.set_checkpoint_early_stop(early_stop):
        y = tuc.checkpoint(block, x, use_reentrant=False)
    hooks.clear()
    y.sum().backward()
    assert len(hooks) == fired


def test_sdpa_on_cpu_flash_without_dropout_math_with_dropout():
    # Lesson 11: "F.scaled_dot_product_attention on CPU runs a flash-attention kernel: it keeps q, k, v, the
    # output and one log-sum-exp per row and head" and "With dropout_p = 0.1 the same call falls back to the math
    # kernel [...] and keeps three s x s tensors [...] The math kernel without dropout keeps one, the softmax."
    b, a, s, d = 2, 4, 128, 16
    flash = sdpa_saved(b, a, s, d)
    assert flash["backward"] == "ScaledDotProductFlashAttentionForCpuBackward0"
    assert flash["square"] == 0 and flash["nbytes"] == 4 * (b * a * s * d + b * a * s)  # output, log-sum-exp
    dropout = sdpa_saved(b, a, s, d, dropout_p=0.1)
    assert "Flash" not in dropout["backward"] and dropout["square"] == 3
    assert dropout["nbytes"] >= 3 * 4 * a * s * s * b  # the mask too is 4 bytes a value on this path
    math_kernel = sdpa_saved(b, a, s, d, backend=SDPBackend.MATH)
    assert math_kernel["square"] == 1
    # "and recomputes the softmax in backward": the CPU flash backward gets q, k, v, the output and logsumexp
    import torchgen

    yaml = Path(torchgen.__file__).parent / "packaged" / "autograd" / "derivatives.yaml"
    assert "(grad, query, key, value, output, logsumexp, dropout_p" in _line(yaml, 2929)


def test_fused_gpu_attention_kernels_regenerate_dropout_from_the_rng_state():
    # Lesson 11: "the backward of _scaled_dot_product_flash_attention takes rng_state, that of
    # _scaled_dot_product_efficient_attention philox_seed and philox_offset, and neither takes a mask
    # (torchgen/packaged/autograd/derivatives.yaml, lines 2919-2925)". The kernels are CUDA-only; their
    # schemas and autograd formulas ship with the CPU build.
    import torchgen

    yaml = Path(torchgen.__file__).parent / "packaged" / "autograd" / "derivatives.yaml"
    assert _line(yaml, 2919).startswith("- name: _scaled_dot_product_efficient_attention(")
    assert "philox_seed, philox_offset" in _line(yaml, 2921)
    assert _line(yaml, 2923).startswith("- name: _scaled_dot_product_flash_attention(")
    assert "rng_state" in _line(yaml, 2925)
    for op in (torch.ops.aten._scaled_dot_product_flash_attention_backward,
               torch.ops.aten._scaled_dot_product_efficient_attention_backward):
        names = [arg.name for arg in op.default._schema.arguments]
        assert "philox_seed" in names and "philox_offset" in names
        assert not [n for n in names if "mask" in n and n != "grad_input_mask"]


def test_selective_recomputation_gives_back_the_softmax_under_math_and_only_the_lse_under_flash():
    # Lesson 11, "Selective recomputation": "Under the math kernel, checkpointing the core alone gives back the
    # softmax [...] Under flash attention [...] checkpointing the core on top saves only the log-sum-exp."
    cfg = GPTConfig(n_embd=64, n_head=4, block_size=128)
    b, s, h, a = 4, 128, 64, 4
    x = torch.randn(b, s, h, requires_grad=True)
    saved = {}
    for backend in (SDPBackend.MATH, SDPBackend.FLASH_ATTENTION):
        for core in (False, True):
            block = Block(cfg)
            if core:
                checkpoint_attention_core(block)
            with torch.nn.attention.sdpa_kernel(backend), SavedActivations(exclude=block.parameters()) as kept:
                block(x).sum().backward()
            saved[backend, core] = kept.nbytes
    assert saved[SDPBackend.FLASH_ATTENTION, False] == course_bytes(s, b, h, a)
    assert saved[SDPBackend.MATH, False] - saved[SDPBackend.MATH, True] == 4 * a * s * s * b
    assert saved[SDPBackend.FLASH_ATTENTION, False] - saved[SDPBackend.FLASH_ATTENTION, True] == 4 * a * s * b
    assert saved[SDPBackend.MATH, True] == saved[SDPBackend.FLASH_ATTENTION, True]


def test_selective_checkpoint_contexts_exist_as_the_lesson_names_them():
    # Lesson 11: "an op-level policy: torch.utils.checkpoint.create_selective_checkpoint_contexts, which
    # TorchTitan uses to save the outputs of matrix products and recompute the rest".
    from functools import partial

    def policy(ctx, op, *args, **kwargs):
        if op is torch.ops.aten.mm.default:
            return tuc.CheckpointPolicy.MUST_SAVE
        return tuc.CheckpointPolicy.PREFER_RECOMPUTE

    block = Block(GPTConfig())
    x = torch.randn(2, 16, 30, requires_grad=True)
    y = tuc.checkpoint(block, x, use_reentrant=False,
                       context_fn=partial(tuc.create_selective_checkpoint_contexts, policy))
    y.sum().backward()
    expected = torch.autograd.grad(block(x).sum(), x)[0]
    torch.testing.assert_close(x.grad, expected)


def _offload_worker():
    model = GPT(GPTConfig())
    policy = dict(offload_policy=CPUOffloadPolicy(pin_memory=False),
                  mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    for block in model.blocks:
        torch_fully_shard(block, **policy)
    torch_fully_shard(model, **policy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    calls, to = [], torch.Tensor.to

    def recording_to(tensor, *args, **kwargs):
        out = to(tensor, *args, **kwargs)
        calls.append((tensor.dtype, "device" if isinstance(args[0], torch.device) else out.dtype))
        return out

    torch.Tensor.to = recording_to
    try:
        model.blocks[0].unshard()
    finally:
        torch.Tensor.to = to
    model.blocks[0].reshard()
    model(*make_batch(GPTConfig(), 4)).backward()
    weight = model.blocks[0].attn.qkv.weight
    grad = weight.grad.to_local().dtype
    optimizer.step()
    state = optimizer.state[weight]
    return {"calls": calls, "shard": weight.to_local().dtype, "grad": grad,
            "moments": {k: (state[k].dtype, state[k].device.type) for k in ("exp_avg", "exp_avg_sq")}}


def test_cpu_offload_copies_the_fp32_shard_then_casts_and_steps_on_the_host(no_orphans):
    # Lesson 11, "CPU offload": "parameters, host to GPU, before every AllGather: the fp32 shard, cast to bf16
    # only once it is on the GPU [...] gradients [...] cast back to fp32 first [...] the optimizer state: never
    # [moves]" - run with FSDP2's CPUOffloadPolicy and a bf16 MixedPrecisionPolicy on gloo (the "GPU" is the
    # CPU here, so only the order of the calls is shown; the bytes are read from the cited lines).
    run = launch(_offload_worker, 2, timeout=120)[0]
    params = len(list(Block(GPTConfig()).parameters()))
    assert run["calls"] == [(torch.float32, "device"), (torch.float32, torch.bfloat16)] * params
    assert run["shard"] == run["grad"] == torch.float32
    assert run["moments"] == {"exp_avg": (torch.float32, "cpu"), "exp_avg_sq": (torch.float32, "cpu")}


def test_offload_code_paths_at_the_cited_lines():
    # Lesson 11, "CPU offload": the cited lines of the pinned torch. FSDP2: _fsdp_param.py 896-901 (copy, then
    # cast), 312-315 (shards on the host, pinned), _fsdp_collectives.py 696 (gradient cast to fp32) and 738
    # (copy to the host), _fsdp_api.py 185-189; FSDP1 (which refuses CPU, so read only): _flat_param.py
    # 1350-1355, _runtime_utils.py 917 and 985, api.py CPUOffload(offload_params=True).
    from torch.distributed.fsdp import CPUOffload

    param = (FSDP2 / "_fsdp_param.py").read_text().splitlines()
    assert "self.device, non_blocking=True" in param[898] and "_to_dtype_if_needed(sharded_param_data" in param[900]
    assert "padded_sharded_param.cpu()" in param[312] and "pin_memory()" in param[314]
    collectives = (FSDP2 / "_fsdp_collectives.py").read_text().splitlines()
    assert "_to_dtype_if_needed(reduce_output, orig_dtype)" in collectives[695]
    assert 'torch.device("cpu"), non_blocking=non_blocking' in collectives[737]
    api = "\n".join((FSDP2 / "_fsdp_api.py").read_text().splitlines()[184:189])
    assert "Sharded parameters are copied host-to-device before all-gather" in api
    assert "optimizer" in api and "step runs on CPU with CPU optimizer states" in api
    fsdp1 = TORCH / "distributed" / "fsdp"
    flat = (fsdp1 / "_flat_param.py").read_text().splitlines()
    assert "implicitly casts to the low precision" in flat[1349]
    assert "_local_shard.to(" in flat[1351] and "self.device, non_blocking=True" in flat[1352]
    runtime = (fsdp1 / "_runtime_utils.py").read_text().splitlines()
    assert "_cast_grad_to_param_dtype(state, sharded_grad, flat_param)" in runtime[916]
    assert "handle.flat_param._cpu_grad.copy_(" in runtime[984]
    assert CPUOffload(offload_params=True).offload_params


def test_adamw_on_cpu_is_the_for_loop_and_reads_and_writes_80_bytes_per_parameter():
    # Lesson 11, "CPU offload": "AdamW's step on the CPU: 80 B per parameter (fused=True: 32 B), counted" - the
    # default AdamW on CPU tensors takes neither the foreach nor the fused path.
    from torch.optim.optimizer import _default_to_fused_or_foreach

    assert _default_to_fused_or_foreach([torch.zeros(4)], differentiable=False) == (False, False)
    assert step_traffic(torch.optim.AdamW, lr=1e-3, weight_decay=0.1) == 80
    assert step_traffic(torch.optim.AdamW, lr=1e-3, weight_decay=0.1, fused=True) == 32
    # the fused kernel's schema marks the gradients as written (Tensor(b!)[] grads), hence 32 and not 28
    schema = torch.ops.aten._fused_adamw_.default._schema
    assert [a.alias_info is not None and a.alias_info.is_write for a in schema.arguments][:4] == [True] * 4


# --- lesson 12: tensor parallelism ------------------------------------------------------------------------

def _torch_tp_loss(reorder: bool):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from fsdp_mini.course.tensor_parallel_plan import qkv_rows_for_pytorch

    model = GPT(CFG)
    if reorder:
        rows = qkv_rows_for_pytorch(CFG.n_embd, 2)
        with torch.no_grad():
            for block in model.blocks:
                block.attn.qkv.weight.copy_(block.attn.qkv.weight[rows])
                block.attn.qkv.bias.copy_(block.attn.qkv.bias[rows])
    mesh = init_device_mesh("cpu", (2,))
    parallelize_module(model, mesh, {"blocks.*.attn.qkv": ColwiseParallel(), "blocks.*.attn.proj": RowwiseParallel()})
    return model(*make_batch(CFG, 4)).item()


def test_12_pytorchs_colwise_parallel_cuts_contiguous_rows_and_knows_no_fused_qkv(no_orphans):
    # 12, "The same in PyTorch": "PyTorch's `ColwiseParallel` cuts a weight into contiguous blocks and has no
    # notion of a fused qkv. So on its side we first reorder qkv's rows as [q_0; k_0; v_0; q_1; k_1; v_1]"
    one_process = GPT(CFG)(*make_batch(CFG, 4)).item()
    runs = run_cases(_torch_tp_loss, (False, True), 2, timeout=120)  # as is, and reordered: one launch
    plain, reordered = runs[False][0], runs[True][0]
    assert abs(plain - one_process) > 1e-4  # rank 0 computed all of q with half of k: wrong heads
    assert reordered == pytest.approx(one_process, rel=1e-5)


def _torch_sequence_parallel(sequence_parallel: bool):
    """PyTorch's own TP plan on the course GPT over 2 ranks, with or without sequence parallelism (the plan of
    `parallelize_gpt_sp_with_pytorch`, without fully_shard): the c10d collectives of one forward and one backward
    (CommDebugMode), the placements of a SequenceParallel LayerNorm, its weight's gradient."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    from fsdp_mini.course.tensor_parallel_plan import qkv_rows_for_pytorch

    model = GPT(CFG)
    rows = qkv_rows_for_pytorch(CFG.n_embd, 2)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight.copy_(block.attn.qkv.weight[rows])
            block.attn.qkv.bias.copy_(block.attn.qkv.bias[rows])
    seq = Shard(1) if sequence_parallel else Replicate()
    plan = {"blocks.*.attn.qkv": ColwiseParallel(input_layouts=seq),
            "blocks.*.attn.proj": RowwiseParallel(output_layouts=seq),
            "blocks.*.mlp.fc": ColwiseParallel(input_layouts=seq),
            "blocks.*.mlp.proj": RowwiseParallel(output_layouts=seq)}
    if sequence_parallel:
        local = dict(use_local_output=True)
        plan |= {"blocks.0": PrepareModuleInput(input_layouts=Replicate(), desired_input_layouts=seq, **local),
                 "blocks.*.ln_1": SequenceParallel(), "blocks.*.ln_2": SequenceParallel(), "ln_f": SequenceParallel(),
                 "lm_head": PrepareModuleInput(input_layouts=seq, desired_input_layouts=Replicate(), **local)}
    parallelize_module(model, init_device_mesh("cpu", (2,)), plan)
    seen = {}
    model.blocks[0].ln_1.register_forward_hook(lambda m, a, out: seen.update(out=str(getattr(out, "placements", None))))
    with CommDebugMode() as forward:
        loss = model(*make_batch(CFG, 4))
    with CommDebugMode() as backward:
        loss.backward()
    w = model.blocks[0].ln_1.weight
    counts = [{str(op).split(".")[-1]: n for op, n in mode.get_comm_counts().items()} for mode in (forward, backward)]
    grad = w.grad.full_tensor() if sequence_parallel else w.grad
    return counts, str(getattr(w, "placements", None)), str(getattr(w.grad, "placements", None)), seen["out"], grad


def test_12_pytorchs_sequence_parallel_splits_each_all_reduce_and_leaves_the_norm_gradients_partial(no_orphans):
    # fsdp_mini.tensor.parallel.tp_operators / tensor_parallel (SP): "each of TP's AllReduces becomes a ReduceScatter into sequence
    # shards and an AllGather out of them"; the replicated head's input and embedding's gradient are gathered once
    # more each; a SequenceParallel norm keeps its weights whole (Replicate) and computes on Shard(1). Its weight's
    # gradient is a sum over this rank's positions: PyTorch leaves it Partial(sum) after backward (reduced when it is
    # used), fsdp_mini adds it over the TP group in backward; the full value is one process's either way.
    one_process = GPT(CFG)
    one_process(*make_batch(CFG, 4)).backward()
    want = one_process.blocks[0].ln_1.weight.grad
    runs = run_cases(_torch_sequence_parallel, (False, True), 2, timeout=120)  # TP, then TP + SP: one launch
    tp_counts = runs[False][0][0]
    per_direction = 2 * CFG.n_layer  # attention and MLP of each block: g forward, f backward
    assert tp_counts == [{"all_reduce": per_direction}] * 2
    for counts, weight, grad, out, full_grad in runs[True]:
        assert counts == [{"all_gather_into_tensor": per_direction + 1, "reduce_scatter_tensor": per_direction}] * 2
        assert (weight, out, grad) == ("(Replicate(),)", "(Shard(dim=1),)", "(Partial(sum),)")
        torch.testing.assert_close(full_grad, want, rtol=1e-5, atol=1e-7)
