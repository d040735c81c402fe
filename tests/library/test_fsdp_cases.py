"""The cases real models bring: odd sizes, tied and frozen parameters, buffers, nested units, a unit
called twice, a rank whose shard is only padding; and mixed precision, no_sync, clipping, meta init."""
from functools import partial

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from fsdp_mini import FSDP, CommLog, MixedPrecision, launch
from fsdp_mini.fsdp.fully_sharded_data_parallel import materialise_by_name
from small_model import Block, TinyConfig, TinyLM, batch, rank_rows, train
from launch_cases import run_cases

TOL = dict(rtol=1e-5, atol=1e-6)
SGD = partial(torch.optim.SGD, lr=0.1, momentum=0.9)
ADAMW = partial(torch.optim.AdamW, lr=1e-2, weight_decay=0.1, eps=1e-3)  # eps: see test_fsdp_parity


class Scale(nn.Module):
    """A unit with a single element: at world 4, three ranks' shards are only padding."""

    def __init__(self):
        super().__init__()
        self.gain = nn.Parameter(torch.tensor(1.5))

    def forward(self, x):
        return x * self.gain


class Inner(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.lin = nn.Linear(d_in, d_out)

    def forward(self, x):
        return torch.tanh(self.lin(x))


class Outer(nn.Module):
    """A unit that contains another unit (nested), plus a frozen bias next to trainable weights."""

    def __init__(self):
        super().__init__()
        self.inner = Inner(5, 7)
        self.lin = nn.Linear(7, 5)
        self.lin.bias.requires_grad_(False)

    def forward(self, x):
        return self.lin(self.inner(x))


class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.inp = nn.Linear(3, 5)
        self.outer = Outer()
        self.twice = Inner(5, 5)  # called twice in one forward
        self.scale = Scale()
        self.head = nn.Linear(5, 2)
        self.register_buffer("shift", torch.linspace(-1, 1, 5))
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)

    def forward(self, x, y):
        h = self.outer(self.inp(x) + self.shift)
        h = self.scale(self.twice(self.twice(h)))
        return F.mse_loss(self.head(h), y)


TOY_WRAP = (Outer, Inner, Scale)


def toy_batch(step, rows=12):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(rows, 3, generator=g), torch.randn(rows, 2, generator=g)


def train_toy(model, opt, steps=5):
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    losses = []
    for step in range(steps):
        x, y = (rank_rows(t, rank, world) for t in toy_batch(step))
        loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _toy_worker(cases):
    out = {}
    for strategy, opt_name in cases:
        model = FSDP(Toy(), strategy, wrap=TOY_WRAP, shard_size=2 if "HYBRID" in strategy else None)
        opt = {"sgd": SGD, "adamw": ADAMW}[opt_name](model.parameters())
        losses = train_toy(model, opt)
        units = {u.label: [(h.requires_grad, len(h.layout.pieces(model.mesh_info.shard_mesh_rank))) for h in u.handles]
                 for u in model.units}
        out[(strategy, opt_name)] = (losses, model.full_state_dict(), units)
    return out


@pytest.mark.parametrize("world", [2, 3, 4])
def test_toy_model_with_every_awkward_case(world, no_orphans):
    strategies = ["NO_SHARD", "SHARD_GRAD_OP", "FULL_SHARD"] + (["HYBRID_SHARD"] if world == 4 else [])
    cases = [(s, o) for s in strategies for o in ("sgd", "adamw")]
    results = launch(_toy_worker, world, args=(cases,), timeout=120)
    for opt_name, opt in (("sgd", SGD), ("adamw", ADAMW)):
        ref = Toy()
        before = ref.state_dict()
        ref_losses = train_toy(ref, opt(ref.parameters()))
        for strategy in strategies:
            case = (strategy, opt_name)
            losses = torch.tensor([r[case][0] for r in results]).mean(0)
            torch.testing.assert_close(losses, torch.tensor(ref_losses), **TOL)
            sd = results[0][case][1]
            assert list(sd) == list(ref.state_dict())
            for k, v in ref.state_dict().items():
                torch.testing.assert_close(sd[k], v, **TOL, msg=lambda m: f"{case} {k}: {m}")
            torch.testing.assert_close(sd["outer.lin.bias"], before["outer.lin.bias"], rtol=0, atol=0)
            units = results[0][case][2]
            assert set(units) == {"root", "outer", "outer.inner", "twice", "scale"}
            assert units["outer"][0][0] and not units["outer"][1][0], "trainable and frozen in separate handles"
            if strategy != "NO_SHARD":
                n = 2 if "HYBRID" in strategy else world
                pieces = [r[case][2]["scale"][0][1] for r in results]
                assert pieces == [int(r % n == 0) for r in range(world)], "one element: other shards are padding"


def _bad_tie_worker():
    model = Toy()
    model.outer.inner.lin.weight = model.twice.lin.weight  # tied across two units
    try:
        FSDP(model, "FULL_SHARD", wrap=TOY_WRAP)
    except ValueError as e:
        return str(e)


def test_weights_tied_across_units_are_a_clear_error(no_orphans):
    messages = launch(_bad_tie_worker, 2, timeout=60)
    assert all("tied" in m and "twice.lin.weight" in m and "another FSDP unit" in m for m in messages), messages


def _mixed_precision_worker():
    cfg = TinyConfig()
    out = {}
    for name, mp in (("fp32", None), ("bf16", MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))):
        model = FSDP(TinyLM(cfg), "FULL_SHARD", wrap=(Block,), mixed_precision=mp)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        from fsdp_mini import CommLog
        with CommLog() as log:
            losses = train(model, opt, cfg, 8, 12)
        dtypes = {h.sharded_param.dtype for u in model.units for h in u.handles}
        out[name] = (losses, model.full_state_dict(), log.summary(), dtypes)
    return out


def test_mixed_precision_trains_close_to_fp32(no_orphans):
    fp32, bf16 = launch(_mixed_precision_worker, 2, timeout=120)[0].values()
    # bf16 compute: losses within 2% of fp32, still falling; the master shards stay fp32
    losses32, losses16 = torch.tensor(fp32[0]), torch.tensor(bf16[0])
    torch.testing.assert_close(losses16, losses32, rtol=2e-2, atol=0)
    assert losses16[-1] < losses16[0] - 0.1
    assert bf16[3] == {torch.float32}
    for k, v in fp32[1].items():
        assert bf16[1][k].dtype == torch.float32
        torch.testing.assert_close(bf16[1][k], v, rtol=0, atol=2e-2)
    # the all-gathers move bf16 (half the bytes), the reduce-scatters fp32 (reduce_dtype)
    ag32, ag16 = fp32[2][("all_gather", "builtin")], bf16[2][("all_gather", "builtin")]
    rs32, rs16 = fp32[2][("reduce_scatter", "builtin")], bf16[2][("reduce_scatter", "builtin")]
    assert ag16["calls"] == ag32["calls"] and 2 * ag16["nbytes"] == ag32["nbytes"]
    assert rs16 == rs32


def _no_sync_worker(strategy, micro):
    cfg = TinyConfig()
    rank, world = dist.get_rank(), dist.get_world_size()
    model = FSDP(TinyLM(cfg), strategy, wrap=(Block,))
    opt = SGD(model.parameters())
    for step in range(2):
        x, y = batch(cfg, 12 * micro, step)
        chunks = list(zip(x.chunk(micro), y.chunk(micro)))
        for i, (xc, yc) in enumerate(chunks):
            xc, yc = rank_rows(xc, rank, world), rank_rows(yc, rank, world)
            if i < micro - 1:
                with model.no_sync():
                    (model(xc, yc) / micro).backward()
                assert all(h.sharded_param.grad is None for u in model.units for h in u.handles), "no_sync communicated"
            else:
                (model(xc, yc) / micro).backward()
        opt.step()
        opt.zero_grad()
    return model.full_state_dict()


NO_SYNC_STRATEGIES = ["NO_SHARD", "SHARD_GRAD_OP", "FULL_SHARD"]


def _no_sync_three_micro_batches(strategy):
    return _no_sync_worker(strategy, 3)


@pytest.mark.parametrize("strategy", NO_SYNC_STRATEGIES)
def test_no_sync_accumulation_equals_one_big_batch(strategy, no_orphans):
    cfg = TinyConfig()
    ref = TinyLM(cfg)
    opt = SGD(ref.parameters())
    for step in range(2):
        x, y = batch(cfg, 36, step)
        ref(x, y).backward()
        opt.step()
        opt.zero_grad()
    # the three strategies in one launch (tests/launch_cases.py), each test asserting its own
    sd = run_cases(_no_sync_three_micro_batches, NO_SYNC_STRATEGIES, 2, timeout=150)[strategy][0]
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(sd[k], v, **TOL)


def _clip_worker(max_norm, impl):
    cfg = TinyConfig()
    model = FSDP(TinyLM(cfg), "FULL_SHARD", wrap=(Block,), impl=impl)
    x, y = (rank_rows(t, dist.get_rank(), dist.get_world_size()) for t in batch(cfg, 12, 0))
    model(x, y).backward()
    with CommLog() as log:
        norm = model.clip_grad_norm_(max_norm).item()
        inf_norm = model.clip_grad_norm_(float("inf")).item()
    model.zero_grad()
    losses = train(model, SGD(model.parameters()), cfg, 4, 12, max_norm=max_norm)
    clip_records = [(r.op, r.impl, r.label, r.nbytes) for r in log.records]
    return norm, inf_norm, losses, model.full_state_dict(), clip_records


CLIP_MAX_NORM, CLIP_IMPLS = 0.05, ["builtin", "ring"]


def _clip_at_the_test_norm(impl):
    return _clip_worker(CLIP_MAX_NORM, impl)


@pytest.mark.parametrize("impl", CLIP_IMPLS)
def test_clip_grad_norm_equals_single_process_clipping(impl, no_orphans):
    """Both norms equal torch's on the unsharded model, and each is one logged AllReduce of one number
    (SUM of |g|^2, MAX for the infinity norm) through the chosen impl."""
    cfg, max_norm = TinyConfig(), CLIP_MAX_NORM
    ref = TinyLM(cfg)
    ref(*batch(cfg, 12, 0)).backward()
    ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), max_norm).item()
    ref_inf = torch.nn.utils.clip_grad_norm_(ref.parameters(), float("inf")).item()
    ref.zero_grad()
    ref_losses = train(ref, SGD(ref.parameters()), cfg, 4, 12, max_norm=max_norm)
    results = run_cases(_clip_at_the_test_norm, CLIP_IMPLS, 3, timeout=150)[impl]  # both impls, one launch
    mean_losses = torch.tensor([r[2] for r in results]).mean(0)
    torch.testing.assert_close(mean_losses, torch.tensor(ref_losses), **TOL)
    for norm, inf_norm, _, sd, clip_records in results:
        assert clip_records == [("all_reduce", impl, "clip_grad_norm_", 4)] * 2
        assert norm > max_norm, "the test must actually clip"
        assert norm == pytest.approx(ref_norm, rel=1e-5) and inf_norm == pytest.approx(ref_inf, rel=1e-5)
        for k, v in ref.state_dict().items():
            torch.testing.assert_close(sd[k], v, **TOL)


def _meta_worker():
    cfg = TinyConfig(depth=3)
    with torch.device("meta"):
        meta = TinyLM(cfg, seed=7)
    model = FSDP(meta, "FULL_SHARD", wrap=(Block,), param_init_fn=materialise_by_name(meta, meta.init_parameter))
    unit_bytes = [sum(h.nbytes for h in u.handles) for u in model.units]
    return model.full_state_dict(), model.gathered_memory.peak, unit_bytes, model.memory_stats()["params"]


def _modules_given_to_param_init_fn():
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP1
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    def calls(wrap):
        with torch.device("meta"):
            meta = TinyLM(TinyConfig(depth=2), seed=7)
        names, seen = {id(m): n for n, m in meta.named_modules()}, []
        init = materialise_by_name(meta, meta.init_parameter)

        def record(module):
            seen.append(names[id(module)])
            init(module)
        wrap(meta, record)
        return seen

    ours = calls(lambda m, fn: FSDP(m, "FULL_SHARD", wrap=(Block,), param_init_fn=fn))
    theirs = calls(lambda m, fn: FSDP1(m, auto_wrap_policy=ModuleWrapPolicy({Block}), param_init_fn=fn,
                                       device_id=torch.device("cpu"), use_orig_params=True))
    try:
        with torch.device("meta"):
            left = TinyLM(TinyConfig(depth=2))
        FSDP(left, "FULL_SHARD", wrap=(Block,), param_init_fn=lambda module: None)
        error = None
    except ValueError as e:
        error = str(e)
    return ours, theirs, error


def test_param_init_fn_takes_each_module_of_a_unit_as_fsdp1_does(no_orphans):
    """PyTorch FSDP1's `param_init_fn(module)`: called on every module of a unit, breadth first from the
    unit's module and stopping at other units; FSDP1 builds the inner units first, fsdp_mini the root
    first, so the calls are compared unit by unit. A param_init_fn that leaves a parameter on the meta
    device is a ValueError naming it."""
    ours, theirs, error = launch(_modules_given_to_param_init_fn, 2, timeout=120)[0]
    units = {"", "blocks.0", "blocks.1"}

    def by_unit(seen):
        out, current = {}, None
        for name in seen:
            current = name if name in units else current
            out.setdefault(current, []).append(name)
        return out
    assert by_unit(ours) == by_unit(theirs) and len(ours) == len(theirs)
    assert ours[:5] == ["", "embed", "blocks", "norm", "head"]  # the root's own modules, not its blocks
    assert error == ("parameter pos is on the meta device: pass a param_init_fn that materialises its module")


def test_meta_init_materialises_one_unit_at_a_time(no_orphans):
    cfg = TinyConfig(depth=3)
    expected = TinyLM(cfg, seed=7).state_dict()
    for sd, peak, unit_bytes, shard_bytes in launch(_meta_worker, 2, timeout=60):
        assert list(sd) == list(expected)
        for k, v in expected.items():
            torch.testing.assert_close(sd[k], v, rtol=0, atol=0)
        assert len(unit_bytes) == cfg.depth + 1 and peak == max(unit_bytes), "never more than one whole unit at a time"
        assert shard_bytes == sum(unit_bytes) // 2


# --- what a new user meets: non-float parameters, the inner module, initial values -------------------

class WithTable(nn.Module):
    """A float layer, an integer table and a complex rotation: mixed precision casts the float one only."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.table = nn.Parameter(torch.arange(8).reshape(4, 2), requires_grad=False)
        self.rot = nn.Parameter(torch.polar(torch.ones(4), torch.arange(4.0)), requires_grad=False)

    def forward(self, x):
        phase = (x.to(torch.complex64) * self.rot).real.to(x.dtype)
        return self.lin(x) + self.table[:, 0].to(x.dtype) + phase

    @property
    def device(self):  # what HuggingFace models do: the device of the first parameter
        return next(self.parameters()).device


def _non_float_and_inner_module():
    model = FSDP(WithTable(), "FULL_SHARD",
                 mixed_precision=MixedPrecision(param_dtype=torch.bfloat16))
    x = torch.randn(2, 4)
    out = model(x)
    out.float().sum().backward()
    try:
        model.module(x)
        direct = "no error"
    except RuntimeError as exc:
        direct = str(exc)
    with model.summon_full_params():
        inner = {n: p.dtype for n, p in model.module.named_parameters()}
        device = str(model.module.device)
        inner_out = model.module(x.to(torch.bfloat16)).dtype
    return out.dtype, inner, device, inner_out, direct


def test_mixed_precision_casts_floats_only_and_the_inner_module_is_usable_under_summon(no_orphans):
    out_dtype, inner, device, inner_out, direct = launch(_non_float_and_inner_module, 2, timeout=60)[0]
    assert out_dtype == torch.bfloat16  # FSDP1's policy has no output_dtype: the output stays in param_dtype
    assert inner == {"lin.weight": torch.bfloat16, "lin.bias": torch.bfloat16, "table": torch.int64,
                     "rot": torch.complex64}
    assert device == "cpu" and inner_out == torch.bfloat16
    assert "the wrapped module (WithTable) is inside an FSDP wrapper and its parameters are sharded" in direct


class Seen(nn.Module):
    """A layer that notes the dtype of the input it got, and holds a float and an integer buffer."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("scale", torch.full((4,), 0.5))  # exact in bf16
        self.register_buffer("count", torch.arange(4))
        self.seen: list[torch.dtype] = []

    def forward(self, x):
        self.seen.append(x.dtype)
        x = x.to(self.lin.weight.dtype)  # an input left in float32 would meet bf16 weights (as in FSDP1)
        return self.lin(x) * self.scale.to(x.dtype)


class SeenTwice(nn.Module):
    """The root computes, then hands its inner unit a float32 tensor of its own making."""

    def __init__(self):
        super().__init__()
        self.first, self.inner = Seen(), Seen()

    def forward(self, x):
        return self.inner(self.first(x).float())


def _fsdp1_policy(fields):
    torch.manual_seed(0)
    model = FSDP(SeenTwice(), "FULL_SHARD", wrap=(Seen,), mixed_precision=MixedPrecision(**fields))
    model(torch.randn(2, 4)).sum().backward()
    buffers = {n: b.dtype for n, b in model.module.named_buffers()}
    full = model.full_state_dict()
    return (model.module.first.seen, model.module.inner.seen, buffers,
            {k: (v.dtype, v.tolist()) for k, v in full.items() if "scale" in k or "count" in k})


@pytest.mark.parametrize("fields, first, inner", [
    (dict(param_dtype=torch.bfloat16), torch.bfloat16, torch.float32),  # FSDP1's default: the root only
    (dict(param_dtype=torch.bfloat16, cast_root_forward_inputs=False), torch.float32, torch.float32),
    (dict(param_dtype=torch.bfloat16, cast_root_forward_inputs=False, cast_forward_inputs=True),
     torch.bfloat16, torch.bfloat16),
    (dict(param_dtype=torch.bfloat16, cast_forward_inputs=True), torch.bfloat16, torch.bfloat16),
])
def test_mixed_precision_casts_inputs_where_fsdp1_does(fields, first, inner, no_orphans):
    """FSDP1's MixedPrecision: `cast_root_forward_inputs` (default True) casts the root's inputs,
    `cast_forward_inputs` (default False) every unit's (torch/distributed/fsdp/_runtime_utils.py,
    `_root_pre_forward` and `_pre_forward`)."""
    seen_first, seen_inner, _, _ = launch(_fsdp1_policy, 2, args=(fields,), timeout=60)[0]
    assert (seen_first, seen_inner) == ([first], [inner])


def test_mixed_precision_buffer_dtype_casts_float_buffers_and_the_state_dict_keeps_their_own(no_orphans):
    seen_first, _, buffers, full = launch(_fsdp1_policy, 2, args=(dict(buffer_dtype=torch.bfloat16),), timeout=60)[0]
    assert buffers == {"first.scale": torch.bfloat16, "first.count": torch.int64,
                       "inner.scale": torch.bfloat16, "inner.count": torch.int64}
    assert full == {"first.scale": (torch.float32, [0.5] * 4), "first.count": (torch.int64, [0, 1, 2, 3]),
                    "inner.scale": (torch.float32, [0.5] * 4), "inner.count": (torch.int64, [0, 1, 2, 3])}
    assert seen_first == [torch.float32]  # no param_dtype: nothing else is cast


def test_mixed_precision_refuses_keep_low_precision_grads_instead_of_ignoring_it():
    with pytest.raises(ValueError, match="keep_low_precision_grads=True is not supported"):
        MixedPrecision(param_dtype=torch.bfloat16, keep_low_precision_grads=True)


def _generate_on_a_flat_model():
    model = FSDP(TinyLM(), "FULL_SHARD", wrap=(Block,))
    prompt = torch.tensor([[1, 2, 3]])
    try:
        model.generate(prompt, 4)  # the inner TinyLM.generate calls the root unit's embedding directly
        direct = "no error"
    except RuntimeError as e:
        direct = str(e)
    with model.summon_full_params():
        tokens = model.generate(prompt, 4)
    return direct, tokens


def test_a_method_beside_forward_gets_a_clear_error_and_works_under_summon(no_orphans):
    direct, tokens = launch(_generate_on_a_flat_model, 2, timeout=60)[0]
    assert direct.startswith("embed (Embedding) is inside an FSDP wrapper and its parameters are sharded")
    assert torch.equal(tokens, TinyLM().generate(torch.tensor([[1, 2, 3]]), 4))


def _unseeded_flat(strategy, sync):
    try:
        model = FSDP(TinyLM(seed=dist.get_rank()), strategy, wrap=(Block,), sync_module_states=sync)
    except ValueError as exc:
        return str(exc)
    return model.full_state_dict()


UNSEEDED = [(strategy, sync) for strategy in ("NO_SHARD", "FULL_SHARD") for sync in (False, True)]


def _unseeded_case(case):
    return _unseeded_flat(*case)


@pytest.mark.parametrize("strategy", ["NO_SHARD", "FULL_SHARD"])
def test_ranks_that_start_differently_are_named_or_synced_from_rank_0(strategy, no_orphans):
    seeded = [dict(TinyLM(seed=rank).named_parameters()) for rank in (0, 1)]
    first = next(name for name, p in seeded[0].items() if not torch.equal(p, seeded[1][name]))
    runs = run_cases(_unseeded_case, UNSEEDED, 3, timeout=150)  # both strategies, with and without sync
    messages = runs[(strategy, False)]
    assert len(set(messages)) == 1 and messages[0].startswith(
        f"ranks [1, 2] start from different values than rank 0 (first differing: {first})")
    for sd in runs[(strategy, True)]:
        for k, v in TinyLM(seed=0).state_dict().items():
            torch.testing.assert_close(sd[k], v, rtol=0, atol=0)
