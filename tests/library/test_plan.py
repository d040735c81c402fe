"""The unit planner (`fsdp_mini.fsdp.plan`): pure, public, and the one source of unit and flat-parameter labels;
and the engine's named states (`TrainingState`, `ShardedState`, `ReduceStage`, `ExecutionOrder`)."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from fsdp_mini import FSDP, launch
from fsdp_mini.fsdp.plan import plan_units, wrap_classes
from fsdp_mini.fsdp.states import ReduceStage, ShardedState, TrainingState
from fsdp_mini.fsdp.units import ExecutionOrder, unit_label
from small_model import Block, TinyConfig, TinyLM, batch, rank_rows


class TwoDtypes(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3).double())
        self.inner[0].bias.requires_grad_(False)
        self.head = nn.Linear(3, 2)


def test_the_plan_puts_the_root_first_then_the_blocks_and_labels_them():
    model = TinyLM(TinyConfig(depth=2))
    plan = plan_units(model, Block)
    assert [u.name for u in plan.units] == ["", "blocks.0", "blocks.1"]
    assert [u.label for u in plan.units] == ["root", "blocks.0", "blocks.1"]
    assert plan.units[0].is_root and not plan.units[1].is_root
    root_names = [p.names for p in plan.units[0].flat_params[0].params]
    assert ("embed.weight", "head.weight") in root_names  # tied: one tensor, both names
    assert plan.state_dict_keys == tuple(model.state_dict())
    assert sum(fp.layout(3).numel for u in plan.units for fp in u.flat_params) == sum(p.numel() for p in model.parameters())


def test_labels_name_frozen_and_dtype_groups_after_the_units_label():
    plan = plan_units(TwoDtypes(), nn.Sequential)
    inner = plan.units[1]
    assert [fp.label for fp in inner.flat_params] == ["inner (float32)", "inner (float64)", "inner (frozen) (float32)"]
    assert [(fp.requires_grad, fp.dtype) for fp in inner.flat_params] == [
        (True, torch.float32), (True, torch.float64), (False, torch.float32)]
    assert [fp.label for fp in plan.units[0].flat_params] == ["root"]
    assert unit_label("") == "root" and inner.label == "inner"


def test_bad_plans_are_clear_errors():
    with pytest.raises(ValueError, match="wrap class Block matches no submodule of Linear"):
        plan_units(nn.Linear(2, 2), Block)
    with pytest.raises(ValueError, match="wrap must hold nn.Module classes"):
        wrap_classes((int,), nn.Linear(2, 2))
    tied = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    tied[1].weight = tied[0].weight
    with pytest.raises(ValueError, match=r"parameter 1.weight is tied to 0.weight, which is in another FSDP unit"):
        plan_units(tied, nn.Linear)
    with pytest.raises(ValueError, match="has no parameters to shard"):
        plan_units(nn.Sequential(nn.ReLU()), nn.ReLU)


def test_execution_order_by_first_runs_lets_a_unit_skipped_so_far_join_late():
    # both designs' forward order (FSDP1's and FSDP2's): a unit joins when it first runs, whenever that is
    a, b, c = object(), object(), object()
    order = ExecutionOrder()
    for unit in (a, b, a):  # a first forward that runs a twice and skips c
        order.join(unit)
    assert list(order) == [a, b] and order.after(a) == [b] and order.after(b) == [] and c not in order
    for unit in (a, c, b):  # a later forward runs c too: it joins after the others
        order.join(unit)
    assert list(order) == [a, b, c] and order.after(b) == [c]


def _states(strategy):
    cfg = TinyConfig(depth=2)
    model = FSDP(TinyLM(cfg), strategy, wrap=(Block,))
    x, y = (rank_rows(t, dist.get_rank(), dist.get_world_size()) for t in batch(cfg, 4, 0))
    seen = {"after construction": [h.sharded_state for h in model.handles]}
    loss = model(x, y)
    seen["after forward"] = [h.sharded_state for h in model.handles]
    stages = []

    def hook(grad):  # a gradient of blocks.0: blocks.1 (backward's first unit) has been reduced by then
        stages.append([h.grad_reduction.stage if h.grad_reduction else None for h in model.handles])
        stages.append([u.training_state for u in model.units])

    model.units[1].handles[0].leaves[0].register_hook(hook)
    loss.backward()
    seen["after backward"] = [h.sharded_state for h in model.handles]
    seen["units after backward"] = [u.training_state for u in model.units]
    return seen, stages


@pytest.mark.parametrize("strategy, after_forward", [("FULL_SHARD", "SHARDED"), ("SHARD_GRAD_OP", "UNSHARDED")])
def test_handles_and_units_say_what_state_they_are_in(strategy, after_forward, no_orphans):
    seen, stages = launch(_states, 2, args=(strategy,), timeout=60)[0]
    S = ShardedState
    assert seen["after construction"] == [S.SHARDED] * 3
    # the root stays gathered from forward into backward; the blocks follow the strategy
    assert seen["after forward"] == [S.UNSHARDED, S[after_forward], S[after_forward]]
    assert seen["after backward"] == [S.SHARDED] * 3
    assert seen["units after backward"] == [TrainingState.IDLE] * 3
    reductions, unit_states = stages
    assert reductions[2] in (ReduceStage.SCATTERING, ReduceStage.ACROSS_REPLICAS)  # blocks.1 reduced first
    assert TrainingState.PRE_BACKWARD in unit_states
