"""DDP from scratch (fsdp_mini.parallel.ddp): parity with one process on the global batch and with torch's DDP,
the bucket plan, what it communicates (CommLog), no_sync, the broadcast at construction, unused
parameters, process groups and clear errors (the bucket plots of lesson 03: tests/course/test_viz_buckets.py).

SGD with momentum catches a wrong averaging factor (Adam's update is invariant to a gradient scale);
AdamW uses eps=1e-3 for the reason given in test_fsdp_parity.py (rounding noise of gradients that are
truly ~0, divided by a tiny eps, would exceed rtol=1e-5 even between two single-process runs).
"""
from functools import partial

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from fsdp_mini import CommLog, launch
from fsdp_mini.parallel.ddp import DistributedDataParallel, all_reduce_gradients, plan_buckets
from fsdp_mini.parallel.grad_buckets import MiB
from small_model import TinyConfig, TinyLM, batch, rank_rows, train
from launch_cases import run_cases

CFG = TinyConfig()
STEPS, BATCH = 4, 12  # 12 rows split evenly over 1, 2, 3 and 4 ranks
OPTIMIZERS = {
    "sgd": partial(torch.optim.SGD, lr=0.1, momentum=0.9),
    "adamw": partial(torch.optim.AdamW, lr=1e-2, weight_decay=0.1, eps=1e-3),
}
TOL = dict(rtol=1e-5, atol=1e-6)
MODEL_MIB = 4 * CFG.numel() / MiB  # the model's fp32 gradients, all trainable
CAP = MODEL_MIB / 5  # five or six buckets


def _trainable_bytes(model):
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


# --- parity ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def reference():
    """Single-process training on the whole batch, per optimizer (this also imports what the first
    optimizer step imports in the parent, so the forked ranks do not each pay for it)."""
    out = {}
    for name, opt in OPTIMIZERS.items():
        model = TinyLM(CFG)
        out[name] = (train(model, opt(model.parameters()), CFG, STEPS, BATCH), model.state_dict())
    return out


def _parity_worker():
    out = {}
    for name, opt in OPTIMIZERS.items():
        model = DistributedDataParallel(TinyLM(CFG), bucket_cap_mb=CAP)
        out[name] = (train(model, opt(model.parameters()), CFG, STEPS, BATCH), model.module.state_dict())
    model = DistributedDataParallel(TinyLM(CFG), bucket_cap_mb=CAP, impl="ring")
    out["ring"] = (train(model, OPTIMIZERS["sgd"](model.parameters()), CFG, STEPS, BATCH), model.module.state_dict())
    theirs = nn.parallel.DistributedDataParallel(TinyLM(CFG))
    out["torch"] = (train(theirs, OPTIMIZERS["sgd"](theirs.parameters()), CFG, STEPS, BATCH),
                    theirs.module.state_dict())
    return out


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_matches_single_process_and_torch_ddp(world, reference, no_orphans):
    results = launch(_parity_worker, world, timeout=90)
    for case in ("sgd", "adamw", "ring", "torch"):
        ref_losses, ref_sd = reference["adamw" if case == "adamw" else "sgd"]
        mean = torch.tensor([r[case][0] for r in results]).mean(0)
        torch.testing.assert_close(mean, torch.tensor(ref_losses), **TOL, msg=lambda m: f"{case}: {m}")
        for rank, r in enumerate(results):  # every replica holds the whole, identical model
            sd = r[case][1]
            assert list(sd) == list(ref_sd)
            for k in ref_sd:
                torch.testing.assert_close(sd[k], ref_sd[k], **TOL, msg=lambda m: f"{case} rank {rank} {k}: {m}")
    for r in results:  # ours against torch's DDP on the same rank: the same local losses
        torch.testing.assert_close(torch.tensor(r["sgd"][0]), torch.tensor(r["torch"][0]), **TOL)


# --- the bucket plan (pure) --------------------------------------------------------------------------

def _reverse_trainable(model):
    return [n for n, p in reversed(list(model.named_parameters())) if p.requires_grad]


def test_tiny_cap_gives_one_bucket_per_parameter_in_reverse_order():
    model = TinyLM(CFG)
    buckets = plan_buckets(model, 1e-9)
    assert [b.names for b in buckets] == [(n,) for n in _reverse_trainable(model)]
    assert [b.index for b in buckets] == list(range(len(buckets)))
    assert buckets[0].names == ("norm.weight",) and buckets[-1].names == ("pos",)
    assert "head.weight" not in {n for b in buckets for n in b.names}  # tied: once, first name


def test_huge_cap_gives_one_bucket_of_everything():
    model = TinyLM(CFG)
    (bucket,) = plan_buckets(model, 1e6)
    assert bucket.names == tuple(_reverse_trainable(model))
    assert bucket.nbytes == _trainable_bytes(model) == 4 * CFG.numel()


@pytest.mark.parametrize("cap", [MODEL_MIB / 20, CAP, MODEL_MIB / 2, 2 * MODEL_MIB],
                         ids=["model/20", "model/5", "model/2", "2*model"])
def test_buckets_follow_pytorch_ddps_rule(cap):
    """The same buckets as PyTorch's DDP computes (its reducer's assignment, in backward order): a bucket
    closes as soon as it holds at least the cap."""
    model = TinyLM(CFG)
    sizes = {n: p.numel() * 4 for n, p in model.named_parameters()}
    buckets = plan_buckets(model, cap)
    order = _reverse_trainable(model)
    assert [n for b in buckets for n in b.names] == order
    params = dict(model.named_parameters())
    torch_buckets, _ = dist._compute_bucket_assignment_by_size([params[n] for n in order], [int(cap * MiB)])
    assert [list(b.names) for b in buckets] == [[order[i] for i in idx] for idx in torch_buckets]
    for b, nxt in zip(buckets, buckets[1:] + [None]):
        assert b.nbytes == sum(sizes[n] for n in b.names)
        if nxt is not None:  # closed because it reached the cap, and not before
            assert b.nbytes >= cap * MiB > b.nbytes - sizes[b.names[-1]]
    assert sum(b.nbytes for b in buckets) == _trainable_bytes(model)


def test_frozen_parameters_are_left_out_and_dtypes_get_their_own_buckets():
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3).double(), nn.Linear(3, 3))
    model[2].bias.requires_grad_(False)
    buckets = plan_buckets(model, 1e6)  # one open bucket per dtype, as PyTorch's DDP
    assert [b.names for b in buckets] == [("2.weight", "0.bias", "0.weight"), ("1.bias", "1.weight")]
    assert [b.dtype for b in buckets] == [torch.float32, torch.float64]
    assert buckets[1].nbytes == 12 * 8
    order = ["2.weight", "1.bias", "1.weight", "0.bias", "0.weight"]
    params = dict(model.named_parameters())
    for cap in (1e-9, 40 / MiB, 1e6):
        torch_buckets, _ = dist._compute_bucket_assignment_by_size([params[n] for n in order], [int(cap * MiB) or 1])
        assert [list(b.names) for b in plan_buckets(model, cap)] == [[order[i] for i in idx] for idx in torch_buckets]


# --- communication: CommLog ----------------------------------------------------------------------------

def _comm_worker(caps):
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = (rank_rows(t, rank, world) for t in batch(CFG, BATCH))
    out = {}
    for cap in caps:
        model = DistributedDataParallel(TinyLM(CFG), bucket_cap_mb=cap)
        loss = model(x, y)
        with CommLog() as log:
            loss.backward()
        out[cap] = ([(r.op, r.label, r.nbytes) for r in log.records], [b.nbytes for b in model.buckets])
    model = TinyLM(CFG)
    model(x, y).backward()
    with CommLog() as log:
        all_reduce_gradients(model)
    out["naive"] = [(r.op, r.label, r.nbytes) for r in log.records]
    return out


def test_one_all_reduce_per_bucket_and_the_trainable_bytes_in_all(no_orphans):
    caps = (1e-9, CAP, 1e6)
    results = launch(_comm_worker, 2, args=(caps,), timeout=60)
    model = TinyLM(CFG)
    for res in results:
        for cap in caps:
            records, bucket_bytes = res[cap]
            assert len(records) == len(plan_buckets(model, cap)) == len(bucket_bytes)
            assert [r[0] for r in records] == ["all_reduce"] * len(records)
            assert [r[1] for r in records] == [f"bucket {i}" for i in range(len(records))]
            assert [r[2] for r in records] == bucket_bytes
            assert sum(bucket_bytes) == _trainable_bytes(model)
        assert len(res[1e-9][0]) == len(list(model.parameters())) and len(res[1e6][0]) == 1
        naive = res["naive"]
        assert [r[1] for r in naive] == [n for n, _ in model.named_parameters()]
        assert sum(r[2] for r in naive) == _trainable_bytes(model)


def _no_sync_worker(micro):
    rank, world = dist.get_rank(), dist.get_world_size()
    model = DistributedDataParallel(TinyLM(CFG), bucket_cap_mb=CAP)
    x, y = batch(CFG, BATCH * micro)
    calls = []
    for i, (xc, yc) in enumerate(zip(x.chunk(micro), y.chunk(micro))):
        xc, yc = rank_rows(xc, rank, world), rank_rows(yc, rank, world)
        with CommLog() as log:
            if i < micro - 1:
                with model.no_sync():
                    (model(xc, yc) / micro).backward()
            else:
                (model(xc, yc) / micro).backward()
        calls.append(len(log.records))
    return calls, {n: p.grad for n, p in model.module.named_parameters()}


def test_no_sync_accumulation_equals_one_big_batch(no_orphans):
    micro = 3
    ref = TinyLM(CFG)
    ref(*batch(CFG, BATCH * micro)).backward()
    results = launch(_no_sync_worker, 2, args=(micro,), timeout=60)
    for calls, grads in results:
        assert calls == [0] * (micro - 1) + [len(plan_buckets(ref, CAP))]  # silent, then one per bucket
        for n, p in ref.named_parameters():
            torch.testing.assert_close(grads[n], p.grad, rtol=1e-5, atol=1e-7, msg=lambda m: f"{n}: {m}")


# --- construction: broadcast, groups, unused parameters, errors --------------------------------------

class _WithBuffer(nn.Module):
    def __init__(self, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.lin = nn.Linear(3, 2)
        with torch.no_grad():
            self.lin.weight.copy_(torch.randn(2, 3, generator=g))
        self.register_buffer("running", torch.full((2,), float(seed)))
        self.register_buffer("count", torch.tensor(seed))  # another dtype: its own broadcast

    def forward(self, x):
        return self.lin(x)


def _broadcast_worker():
    rank = dist.get_rank()
    lm = DistributedDataParallel(TinyLM(CFG, seed=rank))
    small = DistributedDataParallel(_WithBuffer(seed=rank + 5))
    return lm.module.state_dict(), small.module.state_dict()


def test_broadcast_at_construction_makes_differently_seeded_ranks_identical(no_orphans):
    results = launch(_broadcast_worker, 3, timeout=60)
    ref, small_ref = TinyLM(CFG, seed=0).state_dict(), _WithBuffer(seed=5).state_dict()
    assert not torch.equal(TinyLM(CFG, seed=1).state_dict()["embed.weight"], ref["embed.weight"])
    for lm_sd, small_sd in results:
        for k in ref:
            assert torch.equal(lm_sd[k], ref[k]), k
        for k in small_ref:
            assert torch.equal(small_sd[k], small_ref[k]), k
        assert small_sd["count"].dtype == torch.int64


def _group_worker():
    rank = dist.get_rank()
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    group = pairs[rank // 2]
    model = DistributedDataParallel(TinyLM(CFG, seed=rank), bucket_cap_mb=CAP, group=group)
    x, y = batch(CFG, 4, step=rank // 2)  # each pair its own batch of 4 rows, 2 per rank
    model(rank_rows(x, rank % 2, 2), rank_rows(y, rank % 2, 2)).backward()
    return model.module.state_dict(), {n: p.grad for n, p in model.module.named_parameters()}


def test_a_process_group_replicates_and_averages_within_itself(no_orphans):
    results = launch(_group_worker, 4, timeout=60)
    for rank, (sd, grads) in enumerate(results):
        leader = rank // 2 * 2  # the group's rank 0 broadcast its seed's weights
        ref = TinyLM(CFG, seed=leader)
        ref(*batch(CFG, 4, step=rank // 2)).backward()
        for k, v in ref.state_dict().items():
            assert torch.equal(sd[k], v), (rank, k)
        for n, p in ref.named_parameters():
            torch.testing.assert_close(grads[n], p.grad, rtol=1e-5, atol=1e-7, msg=lambda m: f"{rank} {n}: {m}")


class _Branchy(nn.Module):
    """`b` is used only where the caller says so; `never` is never used."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.a, self.b, self.never = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g))

    def forward(self, x, use_b):
        h = self.a(x)
        return (self.b(h) if use_b else h).pow(2).mean()


def _unused_worker(cap):
    rank = dist.get_rank()
    ours = DistributedDataParallel(_Branchy(), bucket_cap_mb=cap)
    theirs = nn.parallel.DistributedDataParallel(_Branchy(), find_unused_parameters=True)
    out = []
    for step in range(2):  # the second step checks that the state was reset after the first
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(10 * step + rank))
        for model in (ours, theirs):
            model.zero_grad()
            model(x, use_b=rank == 0).backward()
        out.append(({n: p.grad for n, p in ours.module.named_parameters()},
                    {n: p.grad for n, p in theirs.module.named_parameters()}))
    return out


UNUSED_CAPS = [1e-9, 25]  # a bucket per parameter, one bucket for all


@pytest.mark.parametrize("cap", UNUSED_CAPS)
def test_unused_parameters_are_reduced_at_the_end_of_backward(cap, no_orphans):
    results = run_cases(_unused_worker, UNUSED_CAPS, 2, timeout=120)[cap]  # both caps, one launch
    for steps in results:
        for ours, theirs in steps:
            for n in ("a.weight", "a.bias", "b.weight", "b.bias"):  # b: rank 0's gradient / 2
                torch.testing.assert_close(ours[n], theirs[n], rtol=1e-5, atol=1e-7, msg=lambda m: f"{n}: {m}")
            for n in ("never.weight", "never.bias"):  # unused everywhere: zeros here, None in torch
                assert theirs[n] is None and torch.equal(ours[n], torch.zeros_like(ours[n]))
    torch.testing.assert_close(results[0][0][0]["b.weight"], results[1][0][0]["b.weight"], rtol=0, atol=0)


@pytest.mark.parametrize("kwargs,match", [
    (dict(bucket_cap_mb=0), "bucket_cap_mb"),
    (dict(bucket_cap_mb=-1), "bucket_cap_mb"),
    (dict(bucket_cap_mb=float("nan")), "bucket_cap_mb"),
    (dict(bucket_cap_mb=True), "bucket_cap_mb"),
    (dict(bucket_cap_mb="25"), "bucket_cap_mb"),
    (dict(impl="nccl"), "impl must be one of"),
])
def test_bad_input_is_a_value_error_before_any_collective(kwargs, match):
    assert not dist.is_initialized()  # raised here, in the parent: no process group, no collective
    with pytest.raises(ValueError, match=match):
        DistributedDataParallel(TinyLM(CFG), **kwargs)


def test_other_errors():
    with pytest.raises(ValueError, match="nn.Module"):
        DistributedDataParallel(lambda x: x)
    with pytest.raises(ValueError, match="bucket_cap_mb"):
        plan_buckets(TinyLM(CFG), 0)
    with pytest.raises(RuntimeError, match="torch.distributed"):
        DistributedDataParallel(TinyLM(CFG))
    with pytest.raises(ValueError, match="impl"):
        all_reduce_gradients(TinyLM(CFG), impl="mpi")


def _mismatch_worker():
    DistributedDataParallel(TinyLM(CFG.but(depth=1 + dist.get_rank())))


def test_ranks_with_different_models_fail_clearly(no_orphans):
    from fsdp_mini import LaunchError

    with pytest.raises(LaunchError, match="different model"):
        launch(_mismatch_worker, 2, timeout=30)
