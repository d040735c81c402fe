"""ZeRO-1 trains exactly like one process, sends what DDP's all-reduce sends, and keeps 1/n of the state."""
import functools

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.testing import assert_close

from fsdp_mini import launch
from fsdp_mini.comm_log import CommLog, ring_model_sent
from fsdp_mini.optim.zero import ZeroRedundancyOptimizer
from small_model import TinyConfig, TinyLM, batch

pytestmark = pytest.mark.usefixtures("no_orphans")

CFG = TinyConfig()
BATCH = 12  # divisible by every world size tested: 1, 2, 3, 4
STEPS = 5
# SGD with momentum catches a wrong gradient averaging factor (Adam's update is nearly scale-invariant).
# AdamW's eps is raised from 1e-8: Adam divides by sqrt(v) + eps, so where a gradient is nearly zero (a
# dead GELU unit) it amplifies rounding noise up to lr/eps. On the course's GPT, with eps=1e-8 merely
# splitting the batch in ONE process moved weights by 5e-4; with 1e-3, by ~1e-7.
OPTIMIZERS = {
    "sgd": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
    "adamw": (torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1, "eps": 1e-3}),
}


@functools.lru_cache(maxsize=None)
def _reference(opt_name):
    """Single-process training on the global batch: per-step losses and the final state_dict."""
    cls, kwargs = OPTIMIZERS[opt_name]
    torch.manual_seed(0)
    model = TinyLM(CFG)
    opt = cls(model.parameters(), **kwargs)
    losses = []
    for s in range(STEPS):
        loss = model(*batch(CFG, BATCH, step=s))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, model.state_dict()


def _train_zero(opt_name, impl):
    """On each rank: ZeRO-1 training on this rank's rows of the global batch."""
    rank, n = dist.get_rank(), dist.get_world_size()
    cls, kwargs = OPTIMIZERS[opt_name]
    torch.manual_seed(0)
    model = TinyLM(CFG)
    opt = ZeroRedundancyOptimizer(model.parameters(), cls, impl=impl, **kwargs)
    rows = slice(rank * BATCH // n, (rank + 1) * BATCH // n)
    losses = []
    for s in range(STEPS):
        x, y = batch(CFG, BATCH, step=s)
        loss = model(x[rows], y[rows])
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, model.state_dict()


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("world_size, impl", [(1, "builtin"), (2, "builtin"), (3, "builtin"), (4, "builtin"),
                                              (2, "ring"), (3, "ring")])
def test_matches_single_process_training(world_size, impl, opt_name):
    results = launch(_train_zero, world_size, args=(opt_name, impl), timeout=60)
    ref_losses, ref_state = _reference(opt_name)
    # Equal local batches: the mean of the local mean losses is the global mean loss.
    losses = torch.tensor([r[0] for r in results]).mean(0)
    assert_close(losses, torch.tensor(ref_losses), rtol=1e-5, atol=1e-6)
    state = results[0][1]
    for _, other in results[1:]:  # the all-gather leaves every rank with the same bits
        assert all(torch.equal(state[k], other[k]) for k in state)
    assert_close(state, ref_state, rtol=1e-5, atol=1e-6)


class _TwoDtypes(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(5, 7)  # 42 float32 elements
        self.b = nn.Linear(7, 3).double()  # 24 float64 elements

    def forward(self, x):
        return self.b(self.a(x).double()).sum()


def _one_step_log(impl):
    torch.manual_seed(0)
    model = _TwoDtypes()
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW, impl=impl, lr=1e-3)
    model(torch.randn(4, 5)).backward()
    with CommLog() as log:
        opt.step()
    layouts = {str(fs.dtype): (fs.layout.numel, fs.layout.padded_numel, fs.dtype.itemsize)
               for fs in opt.flat_shards}
    return layouts, [(r.op, r.impl, r.nbytes, r.sent) for r in log.records]


@pytest.mark.parametrize("impl", ["builtin", "ring"])
def test_one_step_is_one_reduce_scatter_and_one_all_gather_per_dtype(impl):
    n = 3
    for layouts, records in launch(_one_step_log, n, args=(impl,), timeout=60):
        assert set(layouts) == {"torch.float32", "torch.float64"}
        expected = []
        for numel, padded, itemsize in layouts.values():
            expected.append(("reduce_scatter", impl, padded * itemsize))
            expected.append(("all_gather", impl, padded * itemsize))
        assert sorted(r[:3] for r in records) == sorted(expected)
        # The lesson's point: RS + AG send exactly what DDP's one ring all-reduce would send,
        # whether of the padded buffer or of the unpadded gradients (the ring pads them the same way).
        sent = sum(r[3] for r in records)
        assert sent == sum(ring_model_sent("all_reduce", padded, itemsize, n)
                           for _, padded, itemsize in layouts.values())
        assert sent == sum(ring_model_sent("all_reduce", numel, itemsize, n)
                           for numel, _, itemsize in layouts.values())


def _state_bytes():
    torch.manual_seed(0)
    model = TinyLM(CFG)
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)
    model(*batch(CFG, 4)).backward()
    opt.step()
    (fs,) = opt.flat_shards
    return opt.optimizer_state_bytes(), fs.layout.shard_numel


def test_each_rank_keeps_a_quarter_of_the_optimizer_state():
    model = TinyLM(CFG)
    full = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(*batch(CFG, 4)).backward()
    full.step()
    full_bytes = sum(v.nbytes for s in full.state.values() for v in s.values())
    results = launch(_state_bytes, 4, timeout=60)
    shard_numel = results[0][1]
    assert shard_numel == -(-sum(p.numel() for p in model.parameters()) // 4)
    for nbytes, _ in results:
        assert nbytes == shard_numel * 2 * 4 + 4  # exp_avg, exp_avg_sq in float32, plus one step scalar
    assert abs(results[0][0] * 4 / full_bytes - 1) < 0.01


def _bookkeeping():
    """Tied weights once, frozen ones skipped, zero_grad clears, closure returns the loss."""
    torch.manual_seed(0)
    model = TinyLM(CFG)
    model.pos.requires_grad_(False)
    frozen = model.pos.detach().clone()
    params = list(model.parameters())
    opt = ZeroRedundancyOptimizer(params + params, torch.optim.SGD, lr=0.1)  # duplicates: counted once
    (fs,) = opt.flat_shards
    x, y = batch(CFG, 4)

    def closure():
        loss = model(x, y)
        loss.backward()
        return loss

    loss = opt.step(closure)
    grads_before = [p.grad is not None for p in model.parameters() if p.requires_grad]
    opt.zero_grad()
    return (len(fs.layout.params), fs.layout.numel, isinstance(loss, torch.Tensor), all(grads_before),
            all(p.grad is None for p in model.parameters()), fs.shard.grad is None,
            torch.equal(model.pos, frozen), len(opt.param_groups), opt.param_groups[0]["lr"])


def test_bookkeeping():
    model = TinyLM(CFG)
    trainable = [p for p in model.parameters() if p is not model.pos]
    expected = (len(trainable), sum(p.numel() for p in trainable), True, True, True, True, True, 1, 0.1)
    assert launch(_bookkeeping, 2, timeout=60) == [expected] * 2


@pytest.mark.parametrize("kwargs, message", [
    ({"params": []}, "no parameters that require grad"),
    ({"params": [nn.Parameter(torch.ones(3), requires_grad=False)]}, "no parameters that require grad"),
    ({"params": [{"lr": 0.1}]}, "a parameter group needs 'params'"),
    ({"params": [nn.Parameter(torch.ones(3)), {"params": [nn.Parameter(torch.ones(3))]}]}, "not a mix"),
    ({"params": nn.Parameter(torch.ones(3))}, "not one tensor"),
    ({"impl": "mpi"}, "impl must be one of ('builtin', 'ring')"),
    ({"optimizer_class": dict}, "torch.optim.Optimizer subclass"),
    ({"optimizer_class": torch.optim.SGD([nn.Parameter(torch.ones(1))], lr=0.1)}, "torch.optim.Optimizer subclass"),
])
def test_bad_inputs_are_value_errors_before_any_communication(kwargs, message):
    # Raised in this process, where torch.distributed is not even initialised.
    args = {"params": [nn.Parameter(torch.ones(3))], "optimizer_class": torch.optim.SGD, **kwargs}
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ZeroRedundancyOptimizer(args.pop("params"), args.pop("optimizer_class"), lr=0.1, **args)


def test_needs_an_initialised_process_group():
    if dist.is_initialized():
        pytest.skip("torch.distributed is initialised in this process")
    with pytest.raises(RuntimeError, match="needs torch.distributed, which is not initialised"):
        ZeroRedundancyOptimizer([nn.Parameter(torch.ones(3))], torch.optim.SGD, lr=0.1)
