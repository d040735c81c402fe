"""fsdp_mini.fully_shard against PyTorch's FSDP2 on the same ranks and data, scenario by scenario.

Each scenario is a function of the `fully_shard` under test (fsdp_mini's or torch's) run on 2 gloo ranks;
both implementations run in the same processes, on the same model and batches, and what they return
(gradients, parameters, dtypes, types) must agree. The scenarios are the ones where a user relies on
FSDP2's behaviour and fsdp_mini used to differ silently (issue: "fully_shard behaves like FSDP2").
"""
from __future__ import annotations

import dataclasses
from collections import namedtuple

import functools

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import fsdp_mini
from fsdp_mini import launch
from fsdp2_calls import AllReduces, FSDP2Calls
from launch_cases import run_cases

IMPLS = ("fsdp_mini", "torch")


def _impl(name):
    """(fully_shard, MixedPrecisionPolicy) of one implementation."""
    if name == "torch":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        return fully_shard, MixedPrecisionPolicy
    return fsdp_mini.fully_shard, fsdp_mini.MixedPrecisionPolicy


def _mlp(seed=0, width=6, depth=3):
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Linear(width, width) for _ in range(depth)])


def _shard_layers(model, fully_shard, **kwargs):
    for layer in model:
        fully_shard(layer, **kwargs)
    return fully_shard(model, **kwargs)


def _batch(rank, rows=4, width=6, seed=0):
    return torch.randn(rows, width, generator=torch.Generator().manual_seed(seed + 100 * rank))


def _grads(model):
    """name -> the whole gradient (gathered from its DTensor), or None."""
    out = {}
    for name, p in model.named_parameters():
        g = p.grad
        out[name] = None if g is None else (g.full_tensor() if hasattr(g, "full_tensor") else g).clone()
    return out


def _params(model):
    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for n, p in model.named_parameters()}


def _both(scenario):
    """Run `scenario(impl_name)` for both implementations on this rank: {impl: result}."""
    return {name: scenario(name) for name in IMPLS}


def _both_with(case):
    """One case of a parametrized scenario on this rank: case = (scenario, keyword, value)."""
    scenario, keyword, value = case
    return _both(functools.partial(scenario, **{keyword: value}))


def _both_cases(scenario, keyword, values, world_size=2, **kwargs):
    """{value: per-rank {impl: result}} of `scenario(impl, keyword=value)` for every value, in one launch
    (tests/launch_cases.py): the parametrized tests of a scenario share it, each asserting its own value."""
    results = run_cases(_both_with, [(scenario, keyword, v) for v in values], world_size, **kwargs)
    return {value: results[(scenario, keyword, value)] for value in values}


def _assert_same(results, compare):
    for rank_results in results:
        compare(rank_results["fsdp_mini"], rank_results["torch"])


def _same_tensors(a, b, rtol=1e-6, atol=1e-7):
    assert a.keys() == b.keys()
    for k in a:
        if a[k] is None or b[k] is None:
            assert a[k] is None and b[k] is None, k
        else:
            torch.testing.assert_close(a[k], b[k], rtol=rtol, atol=atol, msg=k)


# --- requires_grad is read when it matters ------------------------------------------------------------

def _freeze_after_wrap(name):
    fully_shard, _ = _impl(name)
    model = _shard_layers(_mlp(), fully_shard)
    model[0].weight.requires_grad_(False)  # frozen after fully_shard
    model(_batch(dist.get_rank())).sum().backward()
    return _grads(model)


def test_a_parameter_frozen_after_fully_shard_gets_no_gradient(no_orphans):
    _assert_same(launch(_both, 2, args=(_freeze_after_wrap,), timeout=120), _same_tensors)


def _unfreeze_later(name):
    fully_shard, _ = _impl(name)
    model = _mlp()
    model[1].weight.requires_grad_(False)  # frozen when wrapped...
    _shard_layers(model, fully_shard)
    model(_batch(dist.get_rank())).sum().backward()
    first = _grads(model)
    model.zero_grad(set_to_none=True)
    model[1].weight.requires_grad_(True)  # ...and unfrozen for the next step
    model(_batch(dist.get_rank(), seed=1)).sum().backward()
    return first, _grads(model)


def test_a_parameter_unfrozen_after_fully_shard_gets_its_gradient(no_orphans):
    def compare(a, b):
        _same_tensors(a[0], b[0])
        _same_tensors(a[1], b[1])
        assert a[1]["1.weight"] is not None

    _assert_same(launch(_both, 2, args=(_unfreeze_later,), timeout=120), compare)


# --- unused parameters keep None ----------------------------------------------------------------------

class _WithUnused(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.used, self.unused = nn.Linear(6, 6), nn.Linear(6, 6)

    def forward(self, x):
        return self.used(x)


def _unused(name):
    fully_shard, _ = _impl(name)
    model = fully_shard(_WithUnused())
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.5)
    model(_batch(dist.get_rank())).sum().backward()
    grads = _grads(model)
    opt.step()
    return grads, _params(model), sorted(n for n, p in model.named_parameters() if p in opt.state)


def test_unused_parameters_get_no_gradient_and_adamw_leaves_them_alone(no_orphans):
    def compare(a, b):
        _same_tensors(a[0], b[0])
        assert a[0]["unused.weight"] is None
        _same_tensors(a[1], b[1], rtol=1e-5, atol=1e-6)
        assert a[2] == b[2]

    _assert_same(launch(_both, 2, args=(_unused,), timeout=120), compare)


# --- gradient accumulation without sync accumulates in reduce_dtype -----------------------------------

def _accumulate_in_reduce_dtype(name):
    fully_shard, Policy = _impl(name)
    torch.manual_seed(0)
    model = nn.Linear(1, 2, bias=False)
    nn.init.ones_(model.weight)
    fully_shard(model, mp_policy=Policy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
    # gradient = the input: 3 (synced), then 256 + 1 - 256 over three micro-batches, the last one synced.
    # In bf16, 256 + 1 rounds to 256: accumulating in bf16 loses the 1 that fp32 keeps.
    for x, sync in ((3.0, True), (256.0, False), (1.0, False), (-256.0, True)):
        model.set_requires_gradient_sync(sync)
        model(torch.full((1, 1), x)).sum().backward()
    return _grads(model)


def test_unsynced_gradients_accumulate_in_the_reduce_dtype(no_orphans):
    def compare(a, b):
        _same_tensors(a, b)
        assert a["weight"].flatten().tolist() == [4.0, 4.0]

    _assert_same(launch(_both, 2, args=(_accumulate_in_reduce_dtype,), timeout=120), compare)


# --- what replaces a sharded parameter is adopted, not undone -----------------------------------------

def _load_assign(name):
    fully_shard, _ = _impl(name)
    model = _shard_layers(_mlp(), fully_shard)
    state = {k: v.detach() + 1.0 for k, v in model.state_dict().items()}  # sharded DTensors, new values
    model.load_state_dict(state, assign=True)
    adopted = all(p is state[n] or p.data_ptr() == state[n].data_ptr() or torch.equal(p.to_local(),
                  state[n].to_local()) for n, p in model.named_parameters())
    out = model(_batch(dist.get_rank()))
    return out.detach(), _params(model), adopted


def test_load_state_dict_with_assign_is_kept_by_the_next_forward(no_orphans):
    def compare(a, b):
        torch.testing.assert_close(a[0], b[0])
        _same_tensors(a[1], b[1])
        assert a[2] and b[2]

    _assert_same(launch(_both, 2, args=(_load_assign,), timeout=120), compare)


def _state_dict_while_gathered(name):
    fully_shard, _ = _impl(name)
    model = _shard_layers(_mlp(), fully_shard, reshard_after_forward=False)
    model(_batch(dist.get_rank()))  # no backward: every layer stays gathered
    return {k: type(v).__name__ for k, v in model.state_dict().items()}


def test_state_dict_of_a_gathered_model_is_sharded(no_orphans):
    def compare(a, b):
        assert a == b and set(a.values()) == {"DTensor"}

    _assert_same(launch(_both, 2, args=(_state_dict_while_gathered,), timeout=120), compare)


def _to_float64(name):
    fully_shard, _ = _impl(name)
    model = _shard_layers(_mlp(), fully_shard)
    model.to(torch.float64)
    out = model(_batch(dist.get_rank()).double())
    out.sum().backward()
    return out.detach(), _grads(model), {str(p.dtype) for p in model.parameters()}


def test_module_to_a_dtype_after_fully_shard_trains_in_that_dtype(no_orphans):
    def compare(a, b):
        torch.testing.assert_close(a[0], b[0])
        _same_tensors(a[1], b[1])
        assert a[2] == b[2] == {"torch.float64"}

    _assert_same(launch(_both, 2, args=(_to_float64,), timeout=120), compare)


# --- activations of any container between units -------------------------------------------------------

Pair = namedtuple("Pair", "hidden skip")


@dataclasses.dataclass
class Carry:
    hidden: torch.Tensor
    skip: torch.Tensor


class _Emit(nn.Module):
    """Two layers: its backward needs its (freed, then gathered again) weights, so the unit must see
    backward arrive through the container it returned."""

    def __init__(self, kind):
        super().__init__()
        self.kind, self.lin, self.lin2 = kind, nn.Linear(6, 6), nn.Linear(6, 6)

    def forward(self, x):
        h = self.lin2(torch.tanh(self.lin(x)))
        return Pair(h, x) if self.kind == "namedtuple" else Carry(h, x)


class _Take(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, carried):
        return self.lin(carried.hidden) + carried.skip


def _containers(name, kind):
    fully_shard, _ = _impl(name)
    torch.manual_seed(0)
    model = nn.Sequential(_Emit(kind), _Take())
    fully_shard(model[0])
    fully_shard(model[1])
    fully_shard(model)
    model(_batch(dist.get_rank())).sum().backward()
    return _grads(model)


KINDS = ["namedtuple", "dataclass"]


@pytest.mark.parametrize("kind", KINDS)
def test_namedtuple_and_dataclass_activations_between_units(kind, no_orphans):
    _assert_same(_both_cases(_containers, "kind", KINDS)[kind], _same_tensors)


# --- API a user of FSDP2 reaches for -----------------------------------------------------------------

def _meta_init(name):
    fully_shard, _ = _impl(name)
    with torch.device("meta"):
        model = _mlp()
    _shard_layers(model, fully_shard)
    model.to_empty(device="cpu")
    torch.manual_seed(1)
    for layer in model:
        layer.reset_parameters()
    out = model(_batch(dist.get_rank()))
    out.sum().backward()
    return _params(model), out.detach(), _grads(model)


def test_meta_device_init_then_to_empty_and_reset_parameters(no_orphans):
    def compare(a, b):
        for x, y in zip(a, b):
            _same_tensors(x, y) if isinstance(x, dict) else torch.testing.assert_close(x, y)

    _assert_same(launch(_both, 2, args=(_meta_init,), timeout=120), compare)


class _Normed(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin, self.norm = nn.Linear(6, 6), nn.LayerNorm(6)

    def forward(self, x):
        return self.norm(self.lin(x))


def _ignored(name):
    fully_shard, _ = _impl(name)
    model = _Normed()
    fully_shard(model, ignored_params=set(model.norm.parameters()))
    kinds = {n: type(p).__name__ for n, p in model.named_parameters()}
    model(_batch(dist.get_rank())).pow(2).sum().backward()
    return kinds, _grads(model)


def test_ignored_params_stay_whole_and_unreduced(no_orphans):
    def compare(a, b):
        assert a[0] == b[0] and a[0]["norm.weight"] != "DTensor" and a[0]["lin.weight"] == "DTensor"
        _same_tensors(a[1], b[1])

    results = launch(_both, 2, args=(_ignored,), timeout=120)
    _assert_same(results, compare)
    # ignored: each rank keeps its own gradient (the two ranks saw different data)
    assert not torch.equal(results[0]["fsdp_mini"][1]["norm.weight"], results[1]["fsdp_mini"][1]["norm.weight"])


def _keep_after_backward(name):
    fully_shard, _ = _impl(name)

    model = _shard_layers(_mlp(), fully_shard)
    model.set_reshard_after_backward(False)
    model.set_requires_gradient_sync(False)
    model(_batch(dist.get_rank())).sum().backward()
    kept = {n: type(p).__name__ for n, p in model.named_parameters()}
    # the next micro-batch: its forward finds every unit gathered; each unit frees after its forward
    # (reshard_after_forward) and backward gathers it again. fsdp_mini's collectives show in CommLog,
    # FSDP2's in torch.distributed's
    with fsdp_mini.CommLog() as ours, FSDP2Calls() as theirs:
        model(_batch(dist.get_rank(), seed=1)).sum().backward()
    gathers = len([r for r in ours.records if r.op == "all_gather"]) + len(theirs.ops("all_gather"))
    return kept, gathers


def test_set_reshard_after_backward_false_keeps_units_gathered_for_the_next_micro_batch(no_orphans):
    def compare(a, b):
        assert a == b and "DTensor" not in a[0].values() and a[1] == 3  # backward's three, forward's none

    _assert_same(launch(_both, 2, args=(_keep_after_backward,), timeout=120), compare)


class _WithRootParam(nn.Module):
    """Three layers (the units) and a scale owned by the root itself, so the root has parameters."""

    def __init__(self):
        super().__init__()
        self.layers = _mlp()
        self.scale = nn.Parameter(torch.full((6,), 0.5))

    def forward(self, x):
        return self.layers(x) * self.scale


def _root_reshard(name, root_value):
    fully_shard, _ = _impl(name)

    model = _WithRootParam()
    for layer in model.layers:
        fully_shard(layer)
    model = fully_shard(model, **({} if root_value == "default" else {"reshard_after_forward": root_value}))
    model(_batch(dist.get_rank())).sum().backward()  # the first step records the order
    with fsdp_mini.CommLog() as ours, FSDP2Calls() as theirs:
        model(_batch(dist.get_rank(), seed=1)).sum().backward()
    gathers = len([r for r in ours.records if r.op == "all_gather"]) + len(theirs.ops("all_gather"))
    return gathers, _grads(model)


ROOT_VALUES = [("default", 7), (True, 8), (False, 7)]


@pytest.mark.parametrize("root_value, gathers", ROOT_VALUES)
def test_the_root_keeps_its_parameters_by_default_and_frees_them_when_told(root_value, gathers, no_orphans):
    # FSDP2: reshard_after_forward=None (the default) is True for every unit but the root; an explicit True
    # on the root frees it after forward too, and backward gathers it again (torch/distributed/fsdp/
    # _fully_shard/_fully_shard.py, the docstring of reshard_after_forward; _fsdp_state.py, _lazy_init)
    def compare(a, b):
        assert a[0] == b[0] == gathers  # three layers twice, the root once (twice when freed)
        _same_tensors(a[1], b[1])

    _assert_same(_both_cases(_root_reshard, "root_value", [v for v, _ in ROOT_VALUES])[root_value], compare)


def _partly_sharded():
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import fully_shard as torch_fully_shard

    out = {}
    for name, fully_shard in (("fsdp_mini", fsdp_mini.fully_shard), ("torch", torch_fully_shard)):
        model = _mlp()
        fully_shard(model[1])  # only the middle layer is sharded; the root is a plain Sequential
        if name == "torch":
            out[name] = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
        else:
            out[name] = fsdp_mini.full_state_dict(model)
    return out


def test_full_state_dict_of_a_partly_sharded_model(no_orphans):
    for result in launch(_partly_sharded, 2, timeout=120):
        _same_tensors(result["fsdp_mini"], result["torch"])
        _same_tensors(result["fsdp_mini"], _mlp().state_dict())


def _divided(factor):
    model = fsdp_mini.fully_shard(_mlp())
    if factor is not None:
        model.set_gradient_divide_factor(factor)
    model(_batch(dist.get_rank())).sum().backward()
    return _grads(model)


DIVIDED = (None, 8.0)  # the default average, and a divide factor


def test_gradient_divide_factor_divides_the_sum(no_orphans):
    # FSDP2's set_gradient_divide_factor needs ReduceOp.PREMUL_SUM, which gloo lacks (shared/NOTES.md): the
    # expectation is computed from the default average instead, sum = average x world
    runs = run_cases(_divided, DIVIDED, 2)  # one launch, shared with the forced-sum tests below
    averaged, divided = runs[None][0], runs[8.0][0]
    _same_tensors(divided, {k: v * 2 / 8.0 for k, v in averaged.items()})


def _one_unit_over_two_modules(name):
    fully_shard, _ = _impl(name)

    model = _mlp(depth=4)
    returned = fully_shard([model[0], model[1]])  # one unit: one AllGather before layer 0, freed after layer 1
    fully_shard(model[2])
    fully_shard(model)
    with fsdp_mini.CommLog() as ours, FSDP2Calls() as theirs:
        model(_batch(dist.get_rank())).sum().backward()
    sizes = sorted([r.nbytes for r in ours.records if r.op == "all_gather"]
                   + [4 * c.numel * dist.get_world_size() for c in theirs.ops("all_gather")])
    return type(returned).__name__, len(returned), sizes, _grads(model)


def test_fully_shard_of_a_list_makes_one_unit_of_its_modules(no_orphans):
    def compare(a, b):
        assert a[:3] == b[:3] and a[:2] == ("list", 2)
        _same_tensors(a[3], b[3])

    _assert_same(launch(_both, 2, args=(_one_unit_over_two_modules,), timeout=120), compare)


def _hsdp_all_reduce_held(name):
    from torch.distributed.device_mesh import init_device_mesh

    fully_shard, _ = _impl(name)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    model = _shard_layers(_mlp(), fully_shard, mesh=mesh)
    all_reduces = []
    for step, all_reduce in enumerate((False, True)):  # two micro-batches; the replicas meet once
        model.set_requires_all_reduce(all_reduce)
        with AllReduces() as counted:
            model(_batch(dist.get_rank(), seed=step)).sum().backward()
        all_reduces.append(counted.count)
    return _grads(model), all_reduces


def test_set_requires_all_reduce_false_holds_hsdp_gradients_for_the_next_all_reduce(no_orphans):
    """The gradients alone would be equal whether the flag works or not: the replica AllReduces are counted
    too, none in the held-back micro-batch, one per unit (each layer) in the last."""
    def compare(a, b):
        _same_tensors(a[0], b[0])
        assert a[1] == b[1] == [0, len(_mlp())]

    _assert_same(launch(_both, 4, args=(_hsdp_all_reduce_held,), local_world_size=2, timeout=120), compare)


def _not_last_backward(name):
    fully_shard, _ = _impl(name)
    model = _shard_layers(_mlp(), fully_shard)
    waited = []
    for step, last in enumerate((False, True)):
        model.set_is_last_backward(last)
        model(_batch(dist.get_rank(), seed=step)).sum().backward()
        if name == "fsdp_mini":  # which units' reductions backward waited for: their shards got a gradient
            waited.append(sum(layer.weight.grad is not None for layer in model))
    return _grads(model), waited


def test_set_is_last_backward_false_finishes_the_reductions_in_the_last_backward(no_orphans):
    """Equal final gradients would not show a flag that does nothing: fsdp_mini's backward that is not the
    last leaves its reductions in flight (no unit's shard has a gradient yet); the last one waits for all
    of them. (FSDP2 gives each shard its gradient as its reduction is issued, so only fsdp_mini is counted.)"""
    def compare(a, b):
        _same_tensors(a[0], b[0])
        assert a[1] == [0, len(_mlp())]

    _assert_same(launch(_both, 2, args=(_not_last_backward,), timeout=120), compare)


def _reshard_after_forward_set(name, value):
    fully_shard, _ = _impl(name)
    model = _shard_layers(_mlp(), fully_shard)
    model.set_reshard_after_forward(value)
    with FSDP2Calls(include_fsdp_mini=True) as log:
        out = model(_batch(dist.get_rank()))
        log.mark("forward end")
        out.sum().backward()
    return _issued(log), log.marks["forward end"], _grads(model)


@pytest.mark.parametrize("value", [True, False])
def test_set_reshard_after_forward_decides_whether_backward_gathers_again(value, no_orphans):
    """Set after `fully_shard` (which used the default: every layer frees after forward), on the whole model:
    False keeps each layer gathered from its forward into its backward, so backward gathers nothing;
    True gathers each layer again. The same collectives as FSDP2's, call by call."""
    def compare(a, b):
        assert a[:2] == b[:2]
        _same_tensors(a[2], b[2])
        gathers = _gathers(a[0])
        assert len(gathers[:a[1]]) == len(_mlp())  # forward: one per layer
        assert len(gathers[a[1]:]) == (len(_mlp()) if value else 0)

    _assert_same(_both_cases(_reshard_after_forward_set, "value", [True, False])[value], compare)


def _backward_prefetch_set(name, how):
    fully_shard, _ = _impl(name)
    model = _shard_layers(_mlp(), fully_shard)
    model(_batch(dist.get_rank())).sum().backward()  # the first step
    if how == "empty list":
        for layer in model:
            layer.set_modules_to_backward_prefetch([])
    elif how == "all at once":  # the last layer's pre-backward issues the other two layers' AllGathers too
        model[2].set_modules_to_backward_prefetch([model[1], model[0]])
    with FSDP2Calls(include_fsdp_mini=True) as log:
        out = model(_batch(dist.get_rank(), seed=1))
        log.mark("forward end")
        out.sum().backward()
    return _issued(log)[log.marks["forward end"]:], _grads(model)


PREFETCH = ["empty list", "all at once"]


@pytest.mark.parametrize("how", PREFETCH)
def test_set_modules_to_backward_prefetch_orders_the_gathers(how, no_orphans):
    """Backward's collectives, call by call, the same as FSDP2's. With the last layer prefetching both
    others, all three AllGathers come first. An empty list on every layer is FSDP2's default again
    (`default_prefetch = len(self._states_to_backward_prefetch) == 0`, _fsdp_state.py:384): each layer's
    pre-backward prefetches the layer before it, so the second AllGather comes before the first
    ReduceScatter (a list read as "no prefetch" would issue AllGather, ReduceScatter, AllGather, ...)."""
    def compare(a, b):
        _same_tensors(a[1], b[1])
        ops = [c[0] for c in a[0]]
        n = len(_mlp())
        assert a[0] == b[0]
        if how == "empty list":
            assert ops[:2] == ["all_gather", "all_gather"] and ops.count("all_gather") == n
        else:
            assert ops == ["all_gather"] * n + ["reduce_scatter"] * n

    _assert_same(_both_cases(_backward_prefetch_set, "how", PREFETCH)[how], compare)


# --- round two (issue 31 §3): the order of collectives, the root, the API ---------------------------------
# Both implementations' collectives are recorded in the order they are issued (FSDP2Calls with
# include_fsdp_mini), and a scenario passes when the two sequences are the same, call by call.

def _issued(log):
    """The issued collectives as (op, elements per rank, reduction)."""
    return [(c.op, c.numel, c.reduce_op) for c in log.calls]


def _gathers(issued):
    return [c for c in issued if c[0] == "all_gather"]


def _same_collectives_but_the_roots_reduce_scatter(a, b):
    """The same collectives, the AllGathers in the same order. Where the root has parameters of its own and
    its inputs need no gradient, one ReduceScatter comes at another place, deliberately: FSDP2 ends a
    unit's backward when the gradients of its inputs are computed, so the root's only at the end of
    backward; fsdp_mini ends it as soon as its parameters have their gradients
    (FSDPParamGroup.maybe_post_backward), so the root's ReduceScatter starts right after the root's own
    backward (the head's), overlapping the blocks' backward, instead of last (same bytes, same count)."""
    assert _gathers(a) == _gathers(b) and sorted(a, key=str) == sorted(b, key=str)


class _Mark(torch.autograd.Function):
    """Identity; its backward notes in the log how many collectives were issued when it ran."""

    @staticmethod
    def forward(ctx, x, log, name):
        ctx.log, ctx.name = log, name
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        if ctx.log is not None:
            ctx.log.mark(ctx.name)
        return grad, None, None


class _WithHead(nn.Module):
    """Three layers (units) and a head of the root's own, which backward reaches first."""

    def __init__(self):
        super().__init__()
        self.layers = _mlp()
        self.head = nn.Linear(6, 6)
        self.log = None

    def forward(self, x):
        return _Mark.apply(self.head(self.layers(x)), self.log, "head backward")


def _root_prefetch(name):
    fully_shard, _ = _impl(name)
    model = _WithHead()
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    model(_batch(dist.get_rank())).sum().backward()  # the first step
    with FSDP2Calls(include_fsdp_mini=True) as log:
        model.log = log
        out = model(_batch(dist.get_rank(), seed=1))
        log.mark("forward end")
        out.sum().backward()
    return _issued(log), log.marks, _grads(model)


def test_the_root_prefetches_the_last_block_when_backward_starts(no_orphans):
    # FSDP2 records each unit's post-forward; the root's comes last, so its pre-backward prefetches the unit
    # whose forward ended before it: the last block, before the head's backward runs
    # (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py, _backward_prefetch)
    def compare(a, b):
        assert a[1] == b[1]
        _same_collectives_but_the_roots_reduce_scatter(a[0], b[0])
        ahead = a[0][a[1]["forward end"]:a[1]["head backward"]]
        assert ahead == [("all_gather", 6 * 6 // 2 + 6 // 2, None)]  # the last layer's rows, at 2 ranks
        _same_tensors(a[2], b[2])

    _assert_same(launch(_both, 2, args=(_root_prefetch,), timeout=120), compare)


class _ChunkedHead(nn.Module):
    """A body whose output a head (norm, out: one unit, `fully_shard([norm, out])`) takes in chunks,
    outside the model's forward: a chunked loss."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(6, 6), nn.Linear(6, 6))
        self.norm, self.out = nn.Linear(6, 6), nn.Linear(6, 6)

    def forward(self, x):
        return self.body(x)

    def head(self, h):
        return self.out(self.norm(h))


def _chunked_step(model, x, how):
    h = model(x)
    if how == "retain_graph":  # each chunk's backward runs through the body too
        for chunk in h.chunk(2):
            model.head(chunk).sum().backward(retain_graph=True)
        return
    if how == "no_body_backward":
        for chunk in h.detach().chunk(2):
            model.head(chunk).sum().backward()
        return
    detached = h.detach().requires_grad_()
    chunks = detached.chunk(2)
    for i, chunk in enumerate(chunks):
        last = i == len(chunks) - 1
        if how == "accumulate":
            model.set_requires_gradient_sync(last)
        elif how == "keep_after_backward":
            model.set_reshard_after_backward(last)
        elif how == "is_last_backward":
            model.set_is_last_backward(last)
        model.head(chunk).sum().backward()
    model.set_is_last_backward(True)
    h.backward(detached.grad)  # the body's backward, once


def _chunked(name, how):
    fully_shard, _ = _impl(name)
    model = _ChunkedHead()
    for layer in model.body:
        fully_shard(layer)
    fully_shard([model.norm, model.out])
    fully_shard(model)
    steps = []
    for step in range(2):
        with FSDP2Calls(include_fsdp_mini=True) as log:
            _chunked_step(model, _batch(dist.get_rank(), seed=step), how)
        steps.append(_issued(log))
    return steps, _grads(model)


CHUNKED = ["detach", "retain_graph", "no_body_backward", "accumulate", "keep_after_backward", "is_last_backward"]


@pytest.mark.parametrize("how", CHUNKED)
def test_a_chunked_head_unit_used_standalone(how, no_orphans):
    # the backward of a chunk ends before the next chunk's forward: FSDP2's end of backward forgets the
    # post-forward order, so a later chunk (and the body after it) prefetches nothing it would not use
    def compare(a, b):
        assert a[0] == b[0]
        _same_tensors(a[1], b[1])

    _assert_same(_both_cases(_chunked, "how", CHUNKED)[how], compare)


def _reshard_int(name, value):
    import warnings

    fully_shard, _ = _impl(name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = _shard_layers(_mlp(), fully_shard, reshard_after_forward=value)
    model(_batch(dist.get_rank())).sum().backward()
    with FSDP2Calls(include_fsdp_mini=True) as log:
        model(_batch(dist.get_rank(), seed=1)).sum().backward()
    warned = any("reshard_after_forward=1" in str(w.message) for w in caught)
    return _issued(log), _grads(model), warned


RESHARD_INTS = [(1, True), (2, False)]


@pytest.mark.parametrize("value, keeps", RESHARD_INTS)
def test_reshard_after_forward_int_1_keeps_and_the_group_size_frees(value, keeps, no_orphans):
    # FSDP2 reads an int as the group size to reshard to: 1 is False (with a warning), the shard group's size
    # is True (torch/distributed/fsdp/_fully_shard/_fsdp_init.py, _get_post_forward_mesh_info)
    def compare(a, b):
        assert a[0] == b[0]
        gathers = sum(op == "all_gather" for op, _, _ in a[0])
        assert gathers == (3 if keeps else 6)  # forward's three layers [+ backward's three again]
        _same_tensors(a[1], b[1])
        assert a[2] == (value == 1)  # fsdp_mini warns (FSDP2 logs the same words)

    _assert_same(_both_cases(_reshard_int, "value", [v for v, _ in RESHARD_INTS])[value], compare)


class _Generating(nn.Module):
    """A root with parameters of its own (the head) and a no-grad method beside forward, which runs the
    submodules itself or calls forward (as HuggingFace's generate does)."""

    def __init__(self, calls_forward):
        super().__init__()
        self.layers = _mlp()
        self.head = nn.Linear(6, 6)
        self.calls_forward = calls_forward

    def forward(self, x):
        return self.head(self.layers(x))

    @torch.no_grad()
    def generate(self, x):
        if self.calls_forward:
            return self(self(x))
        return self.head(self.layers(self.head(self.layers(x))))


def _generate_then_train(name, calls_forward):
    from torch.distributed.fsdp import register_fsdp_forward_method as torch_register

    fully_shard, _ = _impl(name)
    register = torch_register if name == "torch" else fsdp_mini.register_fsdp_forward_method
    model = _Generating(calls_forward)
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    register(model, "generate")
    model(_batch(dist.get_rank())).sum().backward()  # the first step
    generated = model.generate(_batch(dist.get_rank(), seed=1))
    kinds = {n: type(p).__name__ for n, p in model.named_parameters()}
    with FSDP2Calls(include_fsdp_mini=True) as log:
        model(_batch(dist.get_rank(), seed=2)).sum().backward()
    return generated, kinds, _issued(log), _grads(model)


@pytest.mark.parametrize("calls_forward", [False, True])
def test_a_no_grad_generate_frees_the_root_which_fsdp2_keeps_gathered(calls_forward, no_orphans):
    # FSDP2's post-forward reshards by reshard_after_forward alone, with or without grad: the root keeps its
    # parameters (head.weight stays a plain Parameter) and the next step does not gather it again, unless a
    # generate that calls forward ends the root's FORWARD inside (FSDPParamGroup.reshard outside FORWARD).
    # fsdp_mini frees a unit after any no-grad forward (FSDPParamGroup.post_forward): one AllGather more
    def compare(a, b):
        torch.testing.assert_close(a[0], b[0])
        assert a[1]["layers.0.weight"] == b[1]["layers.0.weight"] == "DTensor"
        assert a[1]["head.weight"] == "DTensor"
        assert b[1]["head.weight"] == ("DTensor" if calls_forward else "Parameter")
        assert sum(op == "all_gather" for op, _, _ in b[2]) == 6 + calls_forward
        assert len(_gathers(a[2])) == 7 and _gathers(a[2])[7 - len(_gathers(b[2])):] == _gathers(b[2])  # the root's first
        _same_tensors(a[3], b[3])

    _assert_same(_both_cases(_generate_then_train, "calls_forward", [False, True])[calls_forward], compare)


def _optimizer_after_an_evaluation(name):
    """An evaluation pass before training, then the optimizer; the root has parameters of its own (the
    head), kept gathered after forward by default."""
    fully_shard, _ = _impl(name)
    model = _Generating(calls_forward=False)
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    with torch.no_grad():
        model(_batch(dist.get_rank()))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    before = _params(model)
    model(_batch(dist.get_rank(), seed=1)).square().sum().backward()
    opt.step()
    after = _params(model)
    return {n: type(p).__name__ for n, p in zip(before, opt.param_groups[0]["params"])}, \
        sorted(n for n in before if not torch.equal(before[n], after[n]))


def test_an_optimizer_made_after_an_evaluation_pass_trains_the_model(no_orphans):
    # FSDP2 (pytorch#131965): after the no-grad forward the root's module holds the gathered copies of the
    # head, the optimizer gets them, and its step moves tensors the backward's reshard discarded: the head
    # stays as it was, without a word. fsdp_mini freed the root after the no-grad forward: the optimizer holds
    # the sharded parameters and the step trains every one of them
    def compare(a, b):
        names = sorted(a[0])
        assert set(a[0].values()) == {"DTensor"} and a[1] == names
        assert b[0]["head.weight"] == b[0]["head.bias"] == "Parameter"
        assert b[1] == [n for n in names if not n.startswith("head.")]

    _assert_same(launch(_both, 2, args=(_optimizer_after_an_evaluation,), timeout=120), compare)


class _Embedded(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(10, 6)
        self.layers = _mlp()

    def forward(self, tokens):
        return self.layers(self.embed(tokens))


def _no_unshard_in_backward(name):
    fully_shard, _ = _impl(name)
    model = _Embedded()
    fully_shard(model.embed)
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    model.embed.set_unshard_in_backward(False)
    tokens = torch.randint(0, 10, (4,), generator=torch.Generator().manual_seed(dist.get_rank()))
    with FSDP2Calls(include_fsdp_mini=True) as log:
        model(tokens).pow(2).sum().backward()
    return _issued(log), _grads(model)


def test_set_unshard_in_backward_false_skips_the_embeddings_gather(no_orphans):
    def compare(a, b):
        assert a[0] == b[0]
        assert sum(op == "all_gather" for op, _, _ in a[0]) == 4 + 3  # forward's four; backward: the layers
        _same_tensors(a[1], b[1])

    _assert_same(launch(_both, 2, args=(_no_unshard_in_backward,), timeout=120), compare)


class _Fails(Exception):
    """The error a scenario raises on purpose."""


class _RaiseInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        raise _Fails("backward fails here")


class _Failing(nn.Module):
    """Three layers (units); between the first two, a step can fail in forward or in backward."""

    def __init__(self):
        super().__init__()
        self.layers = _mlp()
        self.fail = None

    def forward(self, x):
        h = self.layers[0](x)
        if self.fail == "forward":
            raise _Fails("forward fails here")
        if self.fail == "backward":
            h = _RaiseInBackward.apply(h)
        return self.layers[2](self.layers[1](h))


def _recover(name, where):
    fully_shard, _ = _impl(name)
    model = _Failing()
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, eps=1e-3)
    for step, fail in enumerate((None, where, None)):
        if fail == "skip":  # the reference: no second step at all
            continue
        model.fail = fail
        try:
            model(_batch(dist.get_rank(), seed=step)).sum().backward()
        except _Fails:
            model.reset_iter_state()
            opt.zero_grad()
            continue
        if step == 2:
            grads = _grads(model)
        opt.step()
        opt.zero_grad()
    with FSDP2Calls(include_fsdp_mini=True) as log:
        model(_batch(dist.get_rank(), seed=3)).sum().backward()
    return grads, _params(model), _issued(log), _grads(model)


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_reset_iter_state_recovers_from_an_exception_mid_step(where, no_orphans):
    def compare(a, b):
        _same_tensors(a[0], b[0])
        _same_tensors(a[1], b[1], rtol=1e-5, atol=1e-6)
        assert a[2] == b[2]
        _same_tensors(a[3], b[3])

    runs = _both_cases(_recover, "where", ["forward", "backward", "skip"])  # "skip": no failed step at all
    results = runs[where]
    _assert_same(results, compare)
    # the failed step counts for nothing: the same as two good steps
    clean = runs["skip"]
    _same_tensors(results[0]["fsdp_mini"][1], clean[0]["fsdp_mini"][1], rtol=1e-5, atol=1e-6)


def _reset_while_accumulating(name, where):
    """An unsynced micro-batch, a failing one (or none: "none"; or neither: "fresh"), then a synced one."""
    fully_shard, _ = _impl(name)
    model = _Failing()
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    if where != "fresh":
        model.set_requires_gradient_sync(False)
        model(_batch(dist.get_rank(), seed=0)).sum().backward()
    if where in ("forward", "backward"):
        model.fail = where
        try:
            model(_batch(dist.get_rank(), seed=1)).sum().backward()
        except _Fails:
            model.reset_iter_state()
        model.fail = None
    model.set_requires_gradient_sync(True)
    model(_batch(dist.get_rank(), seed=2)).sum().backward()
    return _grads(model)


def _same(a, b):
    return all(torch.allclose(a[k], b[k], rtol=1e-6, atol=1e-7) for k in a)


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_reset_iter_state_drops_the_accumulated_micro_batches(where, no_orphans):
    # A deliberate difference. FSDP2's docstring says the reset discards "no_sync grad-accumulation state",
    # but its _reset_iter_state leaves the gathered parameters' .grad alone: after a failed forward the
    # unsynced micro-batch is still added into the next synced step, and after a failed backward so are
    # the gradients that backward had produced before it failed. Neither is visible to the caller
    # (zero_grad() clears the sharded gradients only). fsdp_mini drops both, as the docstring says: the
    # next step is a fresh one.
    runs = _both_cases(_reset_while_accumulating, "where", ["forward", "backward", "none", "fresh"])
    for rank in range(2):
        fresh, accumulated = runs["fresh"][rank], runs["none"][rank]
        assert _same(accumulated["fsdp_mini"], accumulated["torch"]) and _same(fresh["fsdp_mini"], fresh["torch"])
        ours, theirs = runs[where][rank]["fsdp_mini"], runs[where][rank]["torch"]
        assert _same(ours, fresh["fsdp_mini"])
        assert not _same(theirs, fresh["torch"])
        if where == "forward":
            assert _same(theirs, accumulated["torch"])


def _reset_not_root(name):
    fully_shard, _ = _impl(name)
    model = _shard_layers(_mlp(), fully_shard)
    model(_batch(dist.get_rank())).sum().backward()
    try:
        model[0].reset_iter_state()
    except RuntimeError as exc:
        return str(exc)
    return "no error"


def test_reset_iter_state_on_a_unit_that_is_not_the_root_is_an_error(no_orphans):
    for result in launch(_both, 2, args=(_reset_not_root,), timeout=120):
        assert result["fsdp_mini"] == result["torch"] == "reset_iter_state must be called on the root FSDP module"


def _summed(name, factor, deprecated_name=False):
    import warnings

    fully_shard, _ = _impl(name)
    model = _shard_layers(_mlp(), fully_shard)
    units = [m for m in model.modules() if hasattr(m, "set_force_sum_reduction_for_comms")]
    for m in units:  # one unit's setting each (no recurse argument, as in FSDP2)
        m.set_force_sum_reduction_for_comms(True)  # FSDP2 then needs no PREMUL_SUM: it runs on gloo
    warned = False
    if factor is not None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for m in units:
                (m.set_reduce_scatter_divide_factor if deprecated_name else m.set_gradient_divide_factor)(factor)
        warned = any(issubclass(w.category, DeprecationWarning) for w in caught)
    with FSDP2Calls(include_fsdp_mini=True) as log:
        model(_batch(dist.get_rank())).sum().backward()
    return _issued(log), _grads(model), warned


FORCED_SUMS = [(None, False), (8.0, False), (8.0, True)]


def _summed_case(name, case):
    return _summed(name, factor=case[0], deprecated_name=case[1])


@pytest.mark.parametrize("factor, deprecated_name", FORCED_SUMS)
def test_forced_sums_and_a_divide_factor_match_pytorch_on_gloo(factor, deprecated_name, no_orphans):
    # with sums forced, FSDP2 reduce-scatters with SUM and divides afterwards, by the world or the factor
    # (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py, _get_gradient_divide_factors)
    def compare(a, b):
        assert a[0] == b[0] and {r for op, _, r in a[0] if op == "reduce_scatter"} == {"SUM"}
        _same_tensors(a[1], b[1])
        assert a[2] == b[2] == deprecated_name

    results = _both_cases(_summed_case, "case", FORCED_SUMS)[(factor, deprecated_name)]
    _assert_same(results, compare)
    averaged = run_cases(_divided, DIVIDED, 2)[None][0]  # the launch test_gradient_divide_factor_... shares
    _same_tensors(results[0]["fsdp_mini"][1], {k: v * 2 / (factor or 2) for k, v in averaged.items()})


def _hooked(name, mesh_shape):
    from torch.distributed.device_mesh import init_device_mesh

    fully_shard, _ = _impl(name)
    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=("replicate", "shard")[-len(mesh_shape):])
    model = _shard_layers(_mlp(), fully_shard, mesh=mesh)
    seen = []

    def hook(reduced):
        seen.append(reduced.clone())
        reduced.mul_(2)  # in place: the gradients are twice the reduced ones

    for m in model.modules():
        if hasattr(m, "set_all_reduce_hook"):
            m.set_all_reduce_hook(hook)
    model(_batch(dist.get_rank())).sum().backward()
    return seen, _grads(model)


@pytest.mark.parametrize("mesh_shape, world", [((2,), 2), ((2, 2), 4)])
def test_set_all_reduce_hook_sees_and_changes_each_reduced_chunk(mesh_shape, world, no_orphans):
    def compare(a, b):
        assert len(a[0]) == len(b[0]) == 3  # one per layer; the root has no parameters of its own
        for x, y in zip(a[0], b[0]):
            torch.testing.assert_close(x, y)
        _same_tensors(a[1], b[1])

    _assert_same(launch(_both, world, args=(functools.partial(_hooked, mesh_shape=mesh_shape),),
                        local_world_size=2, timeout=120), compare)


def _shard_dim_1(param):
    from torch.distributed.tensor import Shard

    return Shard(1) if param.ndim == 2 else None  # weights along their columns, biases by rows


def _placed(name, opt_name):
    fully_shard, _ = _impl(name)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 4))
    full = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for layer in (model[0], model[2]):
        fully_shard(layer, shard_placement_fn=_shard_dim_1)
    fully_shard(model, shard_placement_fn=_shard_dim_1)
    layout = {k: (type(v).__name__, tuple(v.placements), tuple(v.to_local().shape))
              for k, v in model.state_dict().items()}
    model[0].unshard()
    gathered = model[0].weight.detach().clone()  # the whole parameter, put together from the columns
    model[0].reshard()
    opt = (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if opt_name == "sgd" else
           torch.optim.AdamW(model.parameters(), lr=1e-2, eps=1e-3, weight_decay=0.1))
    for step in range(3):
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(step * 10 + dist.get_rank()))
        model(x).pow(2).sum().backward()
        if step == 0:
            grads = _grads(model)
        opt.step()
        opt.zero_grad()
    return layout, gathered, full["0.weight"], grads, _params(model)


@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
def test_shard_placement_fn_shards_along_dim_1_like_pytorch(opt_name, no_orphans):
    def compare(a, b):
        assert a[0] == b[0]  # keys, DTensor, placements, local shapes
        assert a[0]["0.weight"] == ("DTensor", (torch.distributed.tensor.Shard(1),), (8, 3))
        assert torch.equal(a[1], a[2]) and torch.equal(b[1], b[2])
        _same_tensors(a[3], b[3])
        _same_tensors(a[4], b[4], rtol=1e-5, atol=1e-6)

    _assert_same(_both_cases(_placed, "opt_name", ["sgd", "adamw"])[opt_name], compare)


ROUND_TWO_METHODS = ["set_unshard_in_backward", "reset_iter_state", "set_reduce_scatter_divide_factor",
                     "set_force_sum_reduction_for_comms", "set_all_reduce_hook"]


@pytest.mark.parametrize("method", ROUND_TWO_METHODS)
def test_the_new_methods_take_pytorchs_arguments(method):
    import inspect

    from torch.distributed.fsdp import FSDPModule as TorchFSDPModule

    def arguments(fn):
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

    assert arguments(getattr(fsdp_mini.FSDPModule, method)) == arguments(getattr(TorchFSDPModule, method))


def test_fully_shard_takes_shard_placement_fn_as_a_keyword():
    import inspect

    from torch.distributed.fsdp import fully_shard as torch_fully_shard

    ours = inspect.signature(fsdp_mini.fully_shard).parameters["shard_placement_fn"]
    theirs = inspect.signature(torch_fully_shard).parameters["shard_placement_fn"]
    assert ours.kind is theirs.kind is inspect.Parameter.KEYWORD_ONLY and ours.default is theirs.default is None
