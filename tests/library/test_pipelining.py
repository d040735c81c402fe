"""fsdp_mini.pipelining: stages and schedules equal one process and PyTorch's torch.distributed.pipelining, a script
moves between the two by its import line, every hop is a logged send, and bad input is an error that names it."""
from __future__ import annotations

import copy
import importlib

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from expect import error_text
from fsdp_mini import CommLog, launch

STEPS, BATCH, MICRO = 3, 8, 4
TOL = dict(rtol=1e-5, atol=1e-6)


def make_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.GELU(), nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8), nn.Tanh(),
                         nn.Linear(8, 3))


def cut(model: nn.Sequential, stages: int) -> list[nn.Module]:
    return {2: [model[0:4], model[4:7]], 4: [model[0:2], model[2:4], model[4:6], model[6:7]]}[stages]


def batch(step: int):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(BATCH, 6, generator=g), torch.randn(BATCH, 3, generator=g)


def optimizer(name: str, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    return torch.optim.AdamW(params, lr=1e-2, eps=1e-3, weight_decay=0.1)


def one_process(opt_name: str):
    model = make_model()
    opt = optimizer(opt_name, model.parameters())
    losses = []
    for step in range(STEPS):
        x, y = batch(step)
        opt.zero_grad()
        # the pipeline's loss: the mean over micro-batches of each micro-batch's mean
        per_mb = [F.mse_loss(model(a), b) for a, b in zip(x.chunk(MICRO), y.chunk(MICRO))]
        torch.stack(per_mb).mean().backward()
        losses.append([v.item() for v in per_mb])
        opt.step()
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def one_process_halves():
    """One process, as 2 data-parallel ranks of a pipeline with MICRO micro-batches see it (SGD): each rank's
    half of the batch in MICRO micro-batches; the gradient is the mean over all of them. Returns each half's
    per-micro-batch losses per step, and the final weights."""
    model = make_model()
    opt = optimizer("sgd", model.parameters())
    halves = ([], [])
    for step in range(STEPS):
        x, y = batch(step)
        opt.zero_grad()
        per_mb = [[F.mse_loss(model(a), b) for a, b in zip(xh.chunk(MICRO), yh.chunk(MICRO))]
                  for xh, yh in zip(x.chunk(2), y.chunk(2))]
        torch.stack([v for half in per_mb for v in half]).mean().backward()
        for half, values in zip(halves, per_mb):
            half.append([v.item() for v in values])
        opt.step()
    return halves, {k: v.detach().clone() for k, v in model.state_dict().items()}


def train(pipelining, schedule_name: str, opt_name: str, stages: int):
    """The same script for torch.distributed.pipelining and fsdp_mini.pipelining: only `pipelining` differs."""
    rank = dist.get_rank()
    model = make_model()
    part = cut(model, stages)[rank]
    stage = pipelining.PipelineStage(part, rank, stages, torch.device("cpu"))
    schedule = getattr(pipelining, schedule_name)(stage, MICRO, loss_fn=F.mse_loss)
    opt = optimizer(opt_name, part.parameters())
    losses = []
    for step in range(STEPS):
        x, y = batch(step)
        opt.zero_grad()
        got: list = []
        if rank == 0:
            schedule.step(x)
        elif rank == stages - 1:
            schedule.step(target=y, losses=got)
        else:
            schedule.step()
        losses.append([v.item() for v in got])
        opt.step()
    names = {id(p): n for n, p in model.named_parameters()}
    return losses, {names[id(p)]: p.detach().clone() for p in part.parameters()}


def _ours(schedule_name, opt_name, stages):
    return train(importlib.import_module("fsdp_mini.pipelining"), schedule_name, opt_name, stages)


def _both(schedule_name, opt_name):
    return (train(importlib.import_module("torch.distributed.pipelining"), schedule_name, opt_name, 2),
            train(importlib.import_module("fsdp_mini.pipelining"), schedule_name, opt_name, 2))


@pytest.mark.parametrize("stages", [2, 4])
@pytest.mark.parametrize("schedule_name", ["ScheduleGPipe", "Schedule1F1B"])
@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
def test_a_pipeline_trains_as_one_process(stages, schedule_name, opt_name, no_orphans):
    losses, weights = one_process(opt_name)
    results = launch(_ours, stages, (schedule_name, opt_name, stages), timeout=120)
    flat = lambda steps: [v for step in steps for v in step]  # noqa: E731
    assert flat(results[-1][0]) == pytest.approx(flat(losses), rel=1e-5)  # the last stage's per-micro-batch losses
    got = {name: w for _, part in results for name, w in part.items()}
    assert set(got) == set(weights)
    for name, w in weights.items():
        torch.testing.assert_close(got[name], w, **TOL)


@pytest.mark.parametrize("schedule_name", ["ScheduleGPipe", "Schedule1F1B"])
def test_the_same_script_on_pytorchs_pipelining_and_on_fsdp_mini_gives_the_same_training(schedule_name, no_orphans):
    for torch_run, ours in launch(_both, 2, (schedule_name, "adamw"), timeout=120):
        assert sum(ours[0], []) == pytest.approx(sum(torch_run[0], []), rel=1e-5)
        for name, w in torch_run[1].items():
            torch.testing.assert_close(ours[1][name], w, **TOL)


def _logged_step():
    from fsdp_mini.pipelining import PipelineStage, Schedule1F1B

    rank = dist.get_rank()
    part = cut(make_model(), 2)[rank]
    schedule = Schedule1F1B(PipelineStage(part, rank, 2, "cpu"), MICRO, loss_fn=F.mse_loss)
    x, y = batch(0)
    logs = []
    for _ in range(2):
        with CommLog() as log:
            schedule.step(x) if rank == 0 else schedule.step(target=y, losses=[])
        logs.append([(r.op, r.label, r.nbytes, r.sent) for r in log.records])
    return logs, schedule.pipeline_order()


def test_every_hop_is_a_logged_send_and_the_first_step_sends_the_shape_once(no_orphans):
    """Per step, stage 0 sends each micro-batch's activation (2 rows x 8 features, fp32) and receives its
    gradient; stage 1 the reverse. The first step sends a header (the activation's shape) before the first one."""
    (first0, second0), order0 = launch(_logged_step, 2, timeout=60)[0]
    activation = 4 * (BATCH // MICRO) * 8
    header = ("send", "pipeline stage 0 to 1 shape", 80, 80)
    assert header in first0 and header not in second0  # records are in the order the calls completed
    assert sorted(r for r in second0 if r[0] == "send") == [
        ("send", f"pipeline stage 0 to 1 activation {k}", activation, activation) for k in range(MICRO)]
    assert sorted(r[1] for r in second0 if r[0] == "recv") == [
        f"pipeline stage 1 to 0 gradient {k}" for k in range(MICRO)]
    assert all(r[3] == 0 for r in second0 if r[0] == "recv")
    assert order0 == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)]


def _errors():
    from fsdp_mini.pipelining import PipelineStage, ScheduleGPipe

    rank = dist.get_rank()
    part = nn.Linear(4, 4)
    out = {"wrong_rank": error_text(lambda: PipelineStage(part, 1 - rank, 2, "cpu")),
           "count": error_text(lambda: PipelineStage(part, rank, 3, "cpu")),
           "index": error_text(lambda: PipelineStage(part, 2, 2, "cpu")),
           "module": error_text(lambda: PipelineStage("layer", rank, 2, "cpu"), TypeError)}
    stage = PipelineStage(part, rank, 2, "cpu")
    out["micro"] = error_text(lambda: ScheduleGPipe(stage, 0))
    from fsdp_mini.pipelining import Schedule1F1B
    out["fewer_than_stages"] = error_text(lambda: Schedule1F1B(stage, 1))
    from fsdp_mini.pipelining import ScheduleInterleaved1F1B
    two = [PipelineStage(nn.Linear(4, 4), i, 4, "cpu") for i in (rank, rank + 2)]
    out["interleaved_micro"] = error_text(lambda: ScheduleInterleaved1F1B(two, 3))
    out["interleaved_stages"] = error_text(lambda: ScheduleInterleaved1F1B(two[:1], 4))
    out["single_on_two"] = error_text(lambda: ScheduleGPipe(two[0], 4))
    schedule = ScheduleGPipe(stage, 3, loss_fn=F.mse_loss)
    if rank == 0:
        out["split"] = error_text(lambda: schedule.step(torch.randn(4, 4)))
        out["no_input"] = error_text(lambda: schedule.step())
    else:
        out["no_target"] = error_text(lambda: schedule.step())
        out["input_in_the_middle"] = error_text(lambda: schedule.step(torch.randn(3, 4), target=torch.randn(3, 4)))
    return out


def test_bad_input_is_an_error_naming_it_before_any_send(no_orphans):
    first, last = launch(_errors, 2, timeout=60)
    assert "stage 1 runs on rank 1 of its group (stage_index mod 2), not on rank 0" in first["wrong_rank"]
    assert "num_stages=3 is not a multiple of the group's 2 ranks" in first["count"]
    assert "stage_index 2 must be in [0, num_stages=2)" in first["index"]
    assert "PipelineStage needs an nn.Module, got str" in first["module"]
    assert "n_microbatches must be an integer >= 1, got 0" in first["micro"]
    assert "Schedule1F1B needs at least as many micro-batches as stages: n_microbatches=1 < 2" in first[
        "fewer_than_stages"]
    assert "n_microbatches=3 is not a multiple of 2" in first["interleaved_micro"]
    assert "this rank holds stages [0, 2] of 4 (one in every 2), got [0]" in first["interleaved_stages"]
    assert "ScheduleGPipe runs one stage per rank, but there are 4 stages on 2 ranks" in first["single_on_two"]
    assert "input 0's batch of 4 does not split into 3 equal micro-batches" in first["split"]
    assert "the first stage's step needs the batch" in first["no_input"]
    assert "the last stage computes the loss: schedule.step(target=y)" in last["no_target"]
    assert "stages [1] receive their input from the stage before" in last["input_in_the_middle"]


def _sharded_stages(schedule_name, reshard_after_forward=True):
    """2 stages x 2 FSDP ranks: ranks 0, 1 hold stage 0 sharded between them, ranks 2, 3 stage 1; each pair of
    ranks at the same place of their data-parallel groups forms a pipeline. Each data-parallel rank takes half
    the batch."""
    from fsdp_mini import fully_shard
    from fsdp_mini.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    from fsdp_mini.tensor.parallel.parallelize import ParallelDims

    mesh = ParallelDims(dp=2, tp=2, world_size=4).build_mesh("cpu")  # rows: stages, columns: data-parallel ranks
    rank = dist.get_rank()
    stage_index, dp_rank = divmod(rank, 2)
    model = make_model()
    part = cut(model, 2)[stage_index]
    for layer in part:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh["tp"], reshard_after_forward=reshard_after_forward)  # this stage's 2 ranks
    fully_shard(part, mesh=mesh["tp"], reshard_after_forward=reshard_after_forward)
    stage = PipelineStage(part, stage_index, 2, "cpu", group=mesh["dp"].get_group())
    schedule = {"ScheduleGPipe": ScheduleGPipe, "Schedule1F1B": Schedule1F1B}[schedule_name](
        stage, MICRO, loss_fn=F.mse_loss)
    opt = optimizer("sgd", part.parameters())
    logs, losses = [], []
    for step in range(STEPS):
        x, y = (t.chunk(2)[dp_rank] for t in batch(step))
        opt.zero_grad()
        got: list = []
        with CommLog() as log:
            schedule.step(x) if stage_index == 0 else schedule.step(target=y, losses=got)
        logs.append(sorted((r.op, r.group_size, r.nbytes) for r in log.records))
        losses.append([v.item() for v in got])
        opt.step()
    from fsdp_mini.checkpoint.state_dict import full_state_dict
    names = {id(p): n for n, p in model.named_parameters()}
    return losses, {names[id(p)]: v for p, v in zip(part.parameters(), full_state_dict(part).values())}, logs[-1]


@pytest.mark.parametrize("reshard_after_forward", [True, False], ids=["reshard", "keep (torchtitan under PP)"])
@pytest.mark.parametrize("schedule_name", ["ScheduleGPipe", "Schedule1F1B"])
def test_fully_shard_inside_each_stage_trains_as_one_process_and_reduces_once_a_step(schedule_name,
                                                                                   reshard_after_forward, no_orphans):
    (half0, half1), weights = one_process_halves()
    results = launch(_sharded_stages, 4, (schedule_name, reshard_after_forward), timeout=150)
    got = {}
    for _, part, _ in results:
        got.update(part)
    for name, w in weights.items():
        torch.testing.assert_close(got[name], w, **TOL)
    # each data-parallel rank's per-micro-batch losses: its half of the batch
    assert sum(results[2][0], []) == pytest.approx(sum(half0, []), rel=1e-5)
    assert sum(results[3][0], []) == pytest.approx(sum(half1, []), rel=1e-5)
    ops = results[0][2]
    gathers = [n for op, size, n in ops if (op, size) == ("all_gather", 2)]
    scatters = [n for op, size, n in ops if (op, size) == ("reduce_scatter", 2)]
    units = {4 * (8 * 6 + 8), 4 * (8 * 8 + 8)}  # stage 0's two Linear layers, fp32 (its root holds nothing)
    assert sorted(scatters) == sorted(units)  # once a step, not once per micro-batch
    if reshard_after_forward:
        # every forward gathers (and reshards after it); a backward gathers only what a forward freed, and keeps
        # it for the next (GPipe: one gather for all backwards): fewer than FSDP alone, 2 per unit and micro-batch
        assert len(units) * MICRO <= len(gathers) < 2 * len(units) * MICRO
    else:  # gathered once a step: kept through every forward and backward, freed after the last backward
        assert sorted(gathers) == sorted(units)


def train_interleaved(pipelining, opt_name: str):
    """Two ranks, two stages each (rank r holds stages r and r + 2 of 4): the same script for PyTorch and fsdp_mini."""
    rank = dist.get_rank()
    model = make_model()
    parts = cut(model, 4)
    stages = [pipelining.PipelineStage(parts[i], i, 4, torch.device("cpu")) for i in (rank, rank + 2)]
    schedule = pipelining.ScheduleInterleaved1F1B(stages, MICRO, loss_fn=F.mse_loss)
    params = [p for i in (rank, rank + 2) for p in parts[i].parameters()]
    opt = optimizer(opt_name, params)
    losses = []
    for step in range(STEPS):
        x, y = batch(step)
        opt.zero_grad()
        got: list = []
        schedule.step(x) if rank == 0 else schedule.step(target=y, losses=got)
        losses.append([v.item() for v in got])
        opt.step()
    names = {id(p): n for n, p in model.named_parameters()}
    return losses, {names[id(p)]: p.detach().clone() for p in params}, getattr(schedule, "pipeline_order", None)


def _interleaved_both(opt_name):
    ours = train_interleaved(importlib.import_module("fsdp_mini.pipelining"), opt_name)
    theirs = train_interleaved(importlib.import_module("torch.distributed.pipelining"), opt_name)
    return ours[:2] + (ours[2](),), theirs[:2]


@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
def test_interleaved_1f1b_trains_as_one_process_and_as_pytorchs(opt_name, no_orphans):
    losses, weights = one_process(opt_name)
    results = launch(_interleaved_both, 2, (opt_name,), timeout=150)
    flat = lambda steps: [v for step in steps for v in step]  # noqa: E731
    (ours_losses, _, _), (theirs_losses, _) = results[1]
    assert flat(ours_losses) == pytest.approx(flat(losses), rel=1e-5)
    assert flat(ours_losses) == pytest.approx(flat(theirs_losses), rel=1e-5)
    for (_, ours, _), (_, theirs) in results:
        for name, w in ours.items():
            torch.testing.assert_close(w, weights[name], **TOL)
            torch.testing.assert_close(w, theirs[name], **TOL)
    # rank 0 warms up with (p - r - 1) x 2 + (v - 1) x p = 4 forwards: micro-batches 0, 1 of stage 0, then of stage 2
    order0 = results[0][0][2]
    assert order0[:4] == [("F", 0, 0), ("F", 0, 1), ("F", 2, 0), ("F", 2, 1)]
    assert sorted(order0) == sorted([(k, s, mb) for k in "FB" for s in (0, 2) for mb in range(MICRO)])
