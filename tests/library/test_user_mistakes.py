"""Issue 23 §3: the mistakes users make get a clear error (or a warning), before any collective where they can.

Each test runs the mistake on gloo ranks and checks the message names the problem."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from fsdp_mini import FSDP, fully_shard, launch
from fsdp_mini.fsdp.replaced_params import OptimizerBuiltBeforeWrapping
from expect import raised


def _mixing_designs():
    torch.manual_seed(0)
    flat_then_per_param = raised(lambda: fully_shard(FSDP(nn.Sequential(nn.Linear(4, 4)))))
    torch.manual_seed(0)
    per_param_then_flat = raised(lambda: FSDP(fully_shard(nn.Sequential(nn.Linear(4, 4)))))
    return flat_then_per_param, per_param_then_flat


def test_mixing_the_two_designs_says_so(no_orphans):
    for a, b in launch(_mixing_designs, 2, timeout=120):
        assert "ValueError" in a and "the two designs do not mix" in a and "FSDP" in a
        assert "ValueError" in b and "DTensor parameters" in b and "do not mix" in b


def _fully_shard_inside_flat(which):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    FSDP(model)  # collective: every rank
    if dist.get_rank() == 0:
        return "rank 0 stays out"
    # rank 1 alone: had it entered a collective, launch would time out
    return raised(lambda: fully_shard(model[0] if which == "submodule" else model))


@pytest.mark.parametrize("which", ["submodule", "wrapped module"])
def test_fully_shard_inside_a_flat_fsdp_model_says_the_designs_do_not_mix(which, no_orphans):
    out = launch(_fully_shard_inside_flat, 2, args=(which,), timeout=60)[1]
    kind = "Linear" if which == "submodule" else "Sequential"
    assert out == (f"ValueError: fully_shard was given a {kind} inside a model wrapped by FSDP (fsdp_mini's flat "
                   f"design, which holds its parameters in flat shards): the two designs do not mix; apply "
                   f"fully_shard to the plain model")


class _Pair(nn.Module):
    """Two units built bottom-up, `a` then `b`, sharing a parameter: a submodule used by both
    (`shared_module`), or b's weight tied to a's (`tied`)."""

    def __init__(self, case):
        super().__init__()
        torch.manual_seed(0)
        if case == "shared_module":
            shared = nn.Linear(4, 4)
            self.a, self.b = nn.Sequential(nn.Linear(4, 4), shared), nn.Sequential(nn.Linear(4, 4), shared)
        else:
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)
            self.b.weight = self.a.weight

    def forward(self, x):
        return self.b(self.a(x))


def _shared_across_units(case, design):
    from torch.distributed.fsdp import fully_shard as torch_fully_shard

    shard = torch_fully_shard if design == "torch" else fully_shard
    model = _Pair(case)
    shard(model.a)  # collective: every rank
    if design == "fsdp_mini" and dist.get_rank() == 0:
        return "rank 0 stays out"
    # fsdp_mini's rank 1 alone: had it entered a collective, launch would time out
    return raised(lambda: (shard(model.b), shard(model), model(torch.ones(2, 4)).sum().backward()))


@pytest.mark.parametrize("case", ["shared_module", "tied"])
def test_a_parameter_shared_by_two_units_built_bottom_up_names_it_and_both_units(case, no_orphans):
    ours = launch(_shared_across_units, 2, args=(case, "fsdp_mini"), timeout=60)[1]
    theirs = launch(_shared_across_units, 2, args=(case, "torch"), timeout=60)
    name, unit = ("1.weight", "Sequential") if case == "shared_module" else ("weight", "Linear")
    assert ours.startswith(f"ValueError: parameter {name} is shared with another unit ({unit}, which holds it "
                           f"already) than the {unit} given here: a parameter must belong to one fully_shard unit")
    assert "bottom-up" not in ours and "fully_shard([module_a, module_b])" in ours
    # PyTorch refuses both too, at the first forward: a tied one with its own ValueError naming the parameter
    # (and the same advice), a shared submodule on an internal invariant
    for message in theirs:
        if case == "tied":
            assert message.startswith("ValueError: Parameter 'b.weight' is shared with a parameter already "
                                      "managed by another FSDP group") and "fully_shard([module_a, module_b])" in message
        else:
            assert message.startswith("TypeError: Invariant encountered"), message


def _outside_the_mesh():
    from torch.distributed.device_mesh import DeviceMesh

    mesh = DeviceMesh("cpu", [0, 1])  # rank 2 is not in it
    if dist.get_rank() == 2:
        return raised(lambda: fully_shard(nn.Linear(4, 4), mesh=mesh))
    return None


def test_a_rank_outside_the_mesh_gets_a_value_error_before_any_collective(no_orphans):
    # rank 2 returns at once: had it entered a collective with ranks 0-1 absent, launch would time out
    out = launch(_outside_the_mesh, 3, timeout=60)
    assert out[2] == "ValueError: rank 2 is not in the mesh [0, 1]: every rank that calls fully_shard must be in its mesh"


def _optimizer_first(design):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # the mistake: before wrapping
    model = FSDP(model) if design == "flat" else fully_shard(model)
    model(torch.ones(2, 4)).sum().backward()
    wrong = raised(optimizer.step)
    right = raised(torch.optim.SGD(model.parameters(), lr=0.1).step)
    return wrong, right


@pytest.mark.parametrize("design", ["flat", "per-parameter"])
def test_an_optimizer_built_before_wrapping_fails_at_its_first_step(design, no_orphans):
    for wrong, right in launch(_optimizer_first, 2, args=(design,), timeout=120):
        assert wrong.startswith(OptimizerBuiltBeforeWrapping.__name__) and "built before the model was wrapped" in wrong
        assert right == "no error"


def _hybrid_on_one_node():
    torch.manual_seed(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        FSDP(nn.Linear(4, 4), "HYBRID_SHARD")
        FSDP(nn.Linear(4, 4), "HYBRID_SHARD", shard_size=1)
    return [str(w.message) for w in caught]


def test_hybrid_shard_on_one_node_warns_that_it_is_full_shard(no_orphans):
    for messages in launch(_hybrid_on_one_node, 2, timeout=120):
        assert len(messages) == 1 and "HYBRID_SHARD on one node" in messages[0] and "FULL_SHARD" in messages[0]


def _nonfinite_clip():
    torch.manual_seed(0)
    flat = FSDP(nn.Linear(4, 4))
    flat(torch.ones(2, 4)).sum().backward()
    flat.handles[0].sharded_param.grad[0] = float("nan") if dist.get_rank() == 0 else 0.0
    refused = raised(lambda: flat.clip_grad_norm_(1.0, error_if_nonfinite=True))
    quiet = raised(lambda: flat.clip_grad_norm_(1.0))
    torch.manual_seed(0)
    per_param = fully_shard(nn.Linear(4, 4))
    per_param(torch.ones(2, 4)).sum().backward()
    per_param.weight.grad.to_local()[0, 0] = float("inf")
    torch_raised = raised(lambda: torch.nn.utils.clip_grad_norm_(per_param.parameters(), 1.0,
                                                                  error_if_nonfinite=True))
    return refused, quiet, torch_raised


def test_clip_grad_norm_takes_error_if_nonfinite_in_both_designs(no_orphans):
    for refused, quiet, torch_raised in launch(_nonfinite_clip, 2, timeout=120):
        assert refused.startswith("RuntimeError: The total norm of order 2.0") and "non-finite" in refused
        assert quiet == "no error"  # the default scales by the non-finite norm, as PyTorch's
        assert torch_raised.startswith("RuntimeError: The total norm of order 2.0") and "non-finite" in torch_raised
