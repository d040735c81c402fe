"""ZeRO-1 as a drop-in torch optimizer: gradient clipping, LR schedulers, parameter groups, add_param_group,
one process's state dict, and checkpoints resumed at another world size, each equal to one process (and,
where PyTorch has the feature, to PyTorch's ZeroRedundancyOptimizer on gloo)."""
import functools

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.utils import clip_grad_norm_
from torch.optim.lr_scheduler import StepLR
from torch.testing import assert_close

from fsdp_mini import launch
from fsdp_mini.checkpoint import load_checkpoint, save_checkpoint
from fsdp_mini.comm_log import CommLog
from fsdp_mini.parallel.ddp import DistributedDataParallel
from fsdp_mini._composable.replicate import replicate
from fsdp_mini.optim.zero import ZeroRedundancyOptimizer
from small_model import TinyConfig, TinyLM, batch

pytestmark = pytest.mark.usefixtures("no_orphans")

CFG = TinyConfig()
BATCH = 12  # divisible by 2 and 3
MAX_NORM = 0.5  # below the gradient norm of the first steps (checked): the clip really clips
# (class, its options, the options of the first group: weight decay there and none in the second).
# SGD with momentum catches a wrong averaging or clipping factor; AdamW with eps=1e-3: see test_zero.py.
OPTIMIZERS = {
    "sgd": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}, {"weight_decay": 0.01, "lr": 0.2}),
    "adamw": (torch.optim.AdamW, {"lr": 1e-2, "eps": 1e-3}, {"weight_decay": 0.1}),
}
TOL = {"rtol": 1e-5, "atol": 1e-6}


def _param_groups(module, opt_name):
    """Two groups: the matrices with the first group's options (weight decay), the vectors without."""
    first = OPTIMIZERS[opt_name][2]
    matrices = [p for p in module.parameters() if p.dim() >= 2]
    vectors = [p for p in module.parameters() if p.dim() < 2]
    return [{"params": matrices, **first}, {"params": vectors, "weight_decay": 0.0}]


def _rows():
    rank, n = dist.get_rank(), dist.get_world_size()
    return slice(rank * BATCH // n, (rank + 1) * BATCH // n)


@functools.lru_cache(maxsize=None)
def _one_process(opt_name, steps=6):
    """One process on the global batch, the standard loop: backward, clip_grad_norm_, step, scheduler."""
    cls, kwargs, _ = OPTIMIZERS[opt_name]
    torch.manual_seed(0)
    model = TinyLM(CFG)
    opt = cls(_param_groups(model, opt_name), **kwargs)
    sched = StepLR(opt, step_size=2, gamma=0.5)
    losses, norms, states = [], [], []
    for s in range(steps):
        loss = model(*batch(CFG, BATCH, step=s))
        loss.backward()
        norms.append(clip_grad_norm_(model.parameters(), MAX_NORM).item())
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(loss.item())
        states.append(({k: v.clone() for k, v in model.state_dict().items()}, _copy(opt.state_dict())))
    return losses, norms, states


def _copy(state_dict):
    return {"state": {i: {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
                      for i, s in state_dict["state"].items()},
            "param_groups": [dict(g) for g in state_dict["param_groups"]]}


def _wrap(module, wrap):
    if wrap == "plain":
        return module
    if wrap == "ddp":
        return DistributedDataParallel(module)
    if wrap == "replicate":  # the same DDP, applied in place
        return replicate(module)
    return nn.parallel.DistributedDataParallel(module)  # "torch_ddp"


def _train(model, module, opt, sched, steps, clip):
    losses, norms = [], []
    for s in steps:
        x, y = batch(CFG, BATCH, step=s)
        loss = model(x[_rows()], y[_rows()])
        loss.backward()
        if clip == "zero":
            norms.append(opt.clip_grad_norm_(MAX_NORM).item())
        else:  # torch's, on p.grad
            norms.append(clip_grad_norm_(module.parameters(), MAX_NORM).item())
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, norms


def _zero_run(opt_name, wrap, clip, steps, pytorch_zero=False):
    cls, kwargs, _ = OPTIMIZERS[opt_name]
    torch.manual_seed(0)
    module = TinyLM(CFG)
    model = _wrap(module, wrap)
    if pytorch_zero:
        from torch.distributed.optim import ZeroRedundancyOptimizer as TorchZero
        opt = TorchZero(_param_groups(module, opt_name), optimizer_class=cls, **kwargs)
    else:
        opt = ZeroRedundancyOptimizer(_param_groups(module, opt_name), cls, **kwargs)
    sched = StepLR(opt, step_size=2, gamma=0.5)
    losses, norms = _train(model, module, opt, sched, range(steps), clip)
    return losses, norms, module.state_dict()


def _check_equals_one_process(results, opt_name, steps):
    ref_losses, ref_norms, ref_states = _one_process(opt_name)
    assert max(ref_norms[:2]) > MAX_NORM  # the clip is not a no-op
    losses = torch.tensor([r[0] for r in results]).mean(0)  # equal local batches: mean of local means
    assert_close(losses, torch.tensor(ref_losses[:steps]), **TOL)
    for _, norms, state in results:
        assert_close(torch.tensor(norms), torch.tensor(ref_norms[:steps]), **TOL)  # the global norm on every rank
        assert all(torch.equal(state[k], results[0][2][k]) for k in state)
        assert_close(state, ref_states[steps - 1][0], **TOL)


# --- 1. backward -> clip -> step equals one process, or is refused ---------------------------------------

@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("wrap, clip", [("plain", "zero"), ("ddp", "torch"), ("ddp", "zero"), ("replicate", "torch")])
def test_clipped_training_equals_one_process(world_size, opt_name, wrap, clip):
    """A plain model clips with the optimizer's clip_grad_norm_ (p.grad is each rank's own until step);
    a DDP model's p.grad is the average, so torch's clip_grad_norm_ is exact there, and so is ours."""
    results = launch(_zero_run, world_size, args=(opt_name, wrap, clip, 4), timeout=90)
    _check_equals_one_process(results, opt_name, 4)


def _clip_local_gradients():
    torch.manual_seed(0)
    model = TinyLM(CFG)
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.SGD, lr=0.1)
    x, y = batch(CFG, BATCH)
    model(x[_rows()], y[_rows()]).backward()
    clip_grad_norm_(model.parameters(), MAX_NORM)  # each rank's own gradient: each rank's own norm
    before = [p.detach().clone() for p in model.parameters()]
    try:
        opt.step()
    except RuntimeError as exc:
        return str(exc), all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    return None, None


@pytest.mark.parametrize("world_size", [2, 3])
def test_clipping_each_ranks_own_gradient_is_refused_on_every_rank(world_size):
    for rank, (message, unchanged) in enumerate(launch(_clip_local_gradients, world_size, timeout=60)):
        assert message is not None, f"rank {rank}: step() took gradients clipped with this rank's norm"
        assert message.startswith(f"rank {rank}: the gradients were changed in place between backward and step()")
        assert "clip_grad_norm_(max_norm)" in message and "DistributedDataParallel" in message
        assert unchanged  # refused before the step, on every rank: no rank waits for another


def _ddp_step_log():
    torch.manual_seed(0)
    module = TinyLM(CFG)
    model = DistributedDataParallel(module)
    opt = ZeroRedundancyOptimizer(module.parameters(), torch.optim.SGD, lr=0.1)
    x, y = batch(CFG, BATCH)
    model(x[_rows()], y[_rows()]).backward()
    clip_grad_norm_(module.parameters(), MAX_NORM)
    with CommLog() as log:
        opt.step()
    return [(r.op, r.nbytes) for r in log.records]


def test_gradients_ddp_averaged_are_not_averaged_again():
    """DDP's AllReduce averaged p.grad in backward: step() takes its slice, with no ReduceScatter (what
    PyTorch's ZeroRedundancyOptimizer does under DDP); one all-gather of 2 int64 per rank checks that the
    gradients are the same everywhere, then the parameters' all-gather."""
    padded_numel = -(-sum(p.numel() for p in TinyLM(CFG).parameters()) // 3) * 3  # one float32 flat buffer
    for records in launch(_ddp_step_log, 3, timeout=60):
        assert records == [("all_gather", 3 * 2 * 8), ("all_gather", padded_numel * 4)]


def _ddp_accumulated_two_microbatches(opt_name):
    """DDP with gradient accumulation: the first microbatch under no_sync() (each rank's own gradient), the
    second synchronised (the average of both); then torch's clip and ZeRO's step."""
    cls, kwargs, _ = OPTIMIZERS[opt_name]
    torch.manual_seed(0)
    module = TinyLM(CFG)
    model = DistributedDataParallel(module)
    opt = ZeroRedundancyOptimizer(_param_groups(module, opt_name), cls, **kwargs)
    sched = StepLR(opt, step_size=2, gamma=0.5)
    losses = []
    for s in range(4):
        x, y = (t[_rows()] for t in batch(CFG, BATCH, step=s))
        half = x.shape[0] // 2
        with model.no_sync():
            first = model(x[:half], y[:half]) / 2
            first.backward()
        second = model(x[half:], y[half:]) / 2
        second.backward()
        clip_grad_norm_(module.parameters(), MAX_NORM)
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(first.item() + second.item())
    return losses, [], module.state_dict()


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_ddp_gradient_accumulation_with_clipping_equals_one_process(opt_name):
    ref_losses, _, ref_states = _one_process(opt_name)
    results = launch(_ddp_accumulated_two_microbatches, 2, args=(opt_name,), timeout=90)
    assert_close(torch.tensor([r[0] for r in results]).mean(0), torch.tensor(ref_losses[:4]), **TOL)
    for _, _, state in results:
        assert_close(state, ref_states[3][0], **TOL)


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_equals_pytorchs_zero_redundancy_optimizer(opt_name):
    """PyTorch's ZeroRedundancyOptimizer under PyTorch's DDP, with two parameter groups, StepLR and
    clip_grad_norm_, against ours under PyTorch's DDP and ours on a plain model: the same losses and weights."""
    theirs = launch(_zero_run, 2, args=(opt_name, "torch_ddp", "torch", 4, True), timeout=90)
    for wrap, clip in [("torch_ddp", "torch"), ("plain", "zero")]:
        ours = launch(_zero_run, 2, args=(opt_name, wrap, clip, 4), timeout=90)
        for (l1, n1, s1), (l2, n2, s2) in zip(ours, theirs):
            assert_close(torch.tensor(l1), torch.tensor(l2), **TOL)
            assert_close(torch.tensor(n1), torch.tensor(n2), **TOL)
            assert_close(s1, s2, **TOL)
    _check_equals_one_process(theirs, opt_name, 4)


# --- 2. a torch.optim.Optimizer: schedulers, groups, add_param_group, state dicts -------------------------

def _add_group_later(opt_name):
    """The vectors join the optimizer after step 1, with add_param_group (their gradients are cleared by
    model.zero_grad, so step 1 ignores them, as one process's optimizer does)."""
    cls, kwargs, _ = OPTIMIZERS[opt_name]
    torch.manual_seed(0)
    model = TinyLM(CFG)
    matrices, vectors = _param_groups(model, opt_name)
    if dist.is_initialized():
        opt = ZeroRedundancyOptimizer([matrices], cls, **kwargs)
    else:
        opt = cls([matrices], **kwargs)
    losses = []
    for s in range(4):
        if s == 2:
            opt.add_param_group(vectors)
        x, y = batch(CFG, BATCH, step=s)
        rows = _rows() if dist.is_initialized() else slice(None)
        loss = model(x[rows], y[rows])
        loss.backward()
        opt.step()
        model.zero_grad()
        losses.append(loss.item())
    groups = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    return losses, model.state_dict(), groups, isinstance(opt, torch.optim.Optimizer)


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_add_param_group_equals_one_process(opt_name):
    ref_losses, ref_state, ref_groups, _ = _add_group_later(opt_name)
    results = launch(_add_group_later, 3, args=(opt_name,), timeout=60)
    assert_close(torch.tensor([r[0] for r in results]).mean(0), torch.tensor(ref_losses), **TOL)
    for _, state, groups, is_optimizer in results:
        assert is_optimizer
        assert_close(state, ref_state, **TOL)
        assert groups == ref_groups  # every option of both groups, the class's defaults (betas, ...) included


def _consolidate_then_reload(opt_name, state_dict=None, model_state=None):
    """3 steps, then consolidate_state_dict(to=0) (what state_dict() returns on each rank); or, given
    one process's state, load it (model and optimizer) and train steps 3..5."""
    cls, kwargs, _ = OPTIMIZERS[opt_name]
    torch.manual_seed(0)
    model = TinyLM(CFG)
    opt = ZeroRedundancyOptimizer(_param_groups(model, opt_name), cls, **kwargs)
    sched = StepLR(opt, step_size=2, gamma=0.5)
    if state_dict is None:
        _train(model, model, opt, sched, range(3), "zero")
        opt.consolidate_state_dict(to=0)
        try:
            return opt.state_dict()
        except RuntimeError as exc:
            return str(exc)
    model.load_state_dict(model_state)
    opt.load_state_dict(state_dict)
    sched = StepLR(opt, step_size=2, gamma=0.5, last_epoch=2)
    losses, _ = _train(model, model, opt, sched, range(3, 6), "zero")
    return losses, model.state_dict()


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_state_dict_is_one_processs_and_loads_at_another_world_size(opt_name):
    ref_losses, _, ref_states = _one_process(opt_name)
    ref_model, ref_optim = ref_states[2]
    full, other = launch(_consolidate_then_reload, 2, args=(opt_name,), timeout=60)
    assert other == ("rank 1: optimizer state has not been consolidated on this rank. Call "
                     "consolidate_state_dict(to=1) on all ranks first, if you meant to save the global state")
    assert full["param_groups"] == ref_optim["param_groups"]
    assert full["state"].keys() == ref_optim["state"].keys()
    for i, state in ref_optim["state"].items():
        assert list(full["state"][i]) == list(state)
        assert_close(full["state"][i], state, **TOL)
    # one process's state dict (saved by torch's own optimizer) loads into ZeRO at 3 ranks and trains on
    results = launch(_consolidate_then_reload, 3, args=(opt_name, ref_optim, ref_model), timeout=60)
    assert_close(torch.tensor([r[0] for r in results]).mean(0), torch.tensor(ref_losses[3:]), **TOL)
    for _, state in results:
        assert_close(state, ref_states[5][0], **TOL)


# --- 3. the done-when: scheduler, two groups, clipping, a checkpoint resumed at another size ------

def _train_and_checkpoint(opt_name, wrap, steps, path, resume):
    """Steps `steps` of the standard loop (ZeRO-1, StepLR, two groups, clipping: torch's on a DDP model,
    the optimizer's on a plain one); resume: load_checkpoint first (the scheduler from extra_state), else
    save_checkpoint at the end."""
    cls, kwargs, _ = OPTIMIZERS[opt_name]
    torch.manual_seed(1)  # resumed weights must come from the checkpoint, not from the seed
    module = TinyLM(CFG)
    if not resume:
        torch.manual_seed(0)
        module = TinyLM(CFG)
    model = _wrap(module, wrap)
    opt = ZeroRedundancyOptimizer(_param_groups(module, opt_name), cls, **kwargs)
    sched = StepLR(opt, step_size=2, gamma=0.5)
    if resume:
        extra = load_checkpoint(path, model, opt)
        sched.load_state_dict(extra["scheduler"])
    losses, _ = _train(model, module, opt, sched, steps, "torch" if wrap != "plain" else "zero")
    if not resume:
        save_checkpoint(path, model, opt, extra_state={"scheduler": sched.state_dict()})
    return losses, module.state_dict()


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("first, then", [((2, "plain"), (3, "ddp")), ((3, "ddp"), (2, "plain"))])
def test_checkpoint_resumed_at_another_world_size_equals_one_process(tmp_path, opt_name, first, then):
    path = tmp_path / "ckpt"
    before = launch(_train_and_checkpoint, first[0], args=(opt_name, first[1], range(3), path, False), timeout=90)
    after = launch(_train_and_checkpoint, then[0], args=(opt_name, then[1], range(3, 6), path, True), timeout=90)
    ref_losses, _, ref_states = _one_process(opt_name)
    losses = [torch.tensor([r[0] for r in part]).mean(0) for part in (before, after)]
    assert_close(torch.cat(losses), torch.tensor(ref_losses), **TOL)
    for _, state in after:
        assert_close(state, ref_states[5][0], **TOL)


# --- the rest of the drop-in surface: norm types, PyTorch's keywords, bad input ----------------------------

def _clip_one_step(norm_type):
    torch.manual_seed(0)
    model = TinyLM(CFG)
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9)
    x, y = batch(CFG, BATCH)
    model(x[_rows()], y[_rows()]).backward()
    norm = opt.clip_grad_norm_(0.05, norm_type)
    opt.step()
    return norm.item(), model.state_dict()


@pytest.mark.parametrize("norm_type", [1.0, float("inf")])
def test_clip_grad_norm_of_any_norm_type_equals_one_process(norm_type):
    torch.manual_seed(0)
    model = TinyLM(CFG)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(*batch(CFG, BATCH)).backward()
    ref_norm = clip_grad_norm_(model.parameters(), 0.05, norm_type).item()
    opt.step()
    assert ref_norm > 0.05
    for norm, state in launch(_clip_one_step, 3, args=(norm_type,), timeout=60):
        assert norm == pytest.approx(ref_norm, rel=1e-5)
        assert_close(state, model.state_dict(), **TOL)


def _pytorch_keywords_and_bad_state():
    model = TinyLM(CFG)
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, process_group=dist.group.WORLD,
                                  parameters_as_bucket_view=False, lr=0.1)
    errors = []
    for call in (lambda: opt.load_state_dict({"state": {}, "param_groups": [{"params": [0, 1], "lr": 0.1}]}),
                 lambda: opt.consolidate_state_dict(to=1),
                 lambda: save_checkpoint("unused", model, torch.optim.SGD(model.parameters(), lr=0.1))):
        try:
            call()
            errors.append(None)
        except ValueError as exc:
            errors.append(str(exc))
    return opt.group is dist.group.WORLD, "process_group" in opt.defaults, errors


def test_pytorchs_keywords_and_bad_state_dicts_are_clear():
    n = sum(1 for _ in TinyLM(CFG).parameters())
    assert launch(_pytorch_keywords_and_bad_state, 1, timeout=60) == [(True, False, [
        f"the state dict's parameter groups hold [2] parameters, this optimizer's [{n}]",
        "to=1 is not a rank of a group of 1",
        "a checkpoint of a plain or DistributedDataParallel model takes its ZeroRedundancyOptimizer (or no "
        "optimizer), got SGD"])]


@pytest.mark.parametrize("option", ["overlap_with_ddp", "parameters_as_bucket_view"])
def test_pytorchs_other_layouts_are_refused_before_any_communication(option):
    with pytest.raises(ValueError, match=f"{option}=True is PyTorch's ZeroRedundancyOptimizer's option"):
        ZeroRedundancyOptimizer([nn.Parameter(torch.ones(3))], torch.optim.SGD, lr=0.1, **{option: True})
