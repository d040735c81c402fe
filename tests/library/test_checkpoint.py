"""Sharded checkpoints: saved at N ranks with one strategy, resumed at M ranks with another, training
goes on exactly as if it had never stopped; and the files hold plain parameters under their own names."""
import functools
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.testing import assert_close

from fsdp_mini import full_state_dict, fully_shard, get_device, launch
from fsdp_mini.checkpoint.sharded_checkpoint import load_checkpoint, save_checkpoint, sharded_state_dict
from fsdp_mini.fsdp.fully_sharded_data_parallel import FSDP
from fsdp_mini.optim.zero import ZeroRedundancyOptimizer
from small_model import Block, TinyConfig, TinyLM, batch

pytestmark = pytest.mark.usefixtures("no_orphans")

CFG = TinyConfig()
BATCH = 12  # divisible by every world size tested: 1, 2, 3, 4
STEPS, SPLIT = 5, 3  # 3 steps, checkpoint, 2 more steps
TIMEOUT = 60
# AdamW's eps is raised from 1e-8 for the reason given in test_zero.py: near-zero gradients would
# amplify rounding differences between world sizes beyond rtol 1e-5. SGD with momentum as well:
# its momentum buffer is state that must survive too.
OPTIMIZERS = {
    "adamw": (torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1, "eps": 1e-3}),
    "sgd": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
}


def _optimizer(name, params, lr_factor=1.0):
    cls, kwargs = OPTIMIZERS[name]
    return cls(params, **{**kwargs, "lr": kwargs["lr"] * lr_factor})


def _rows():
    rank, n = dist.get_rank(), dist.get_world_size()
    return slice(rank * BATCH // n, (rank + 1) * BATCH // n)


def _train(model, opt, steps, rows=slice(None)):
    losses = []
    for s in steps:
        x, y = batch(CFG, BATCH, step=s)
        loss = model(x[rows].to(get_device()), y[rows].to(get_device()))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


@functools.lru_cache(maxsize=None)
def _reference(opt_name):
    """Single-process training on the global batch, all STEPS in one go: losses, final state_dict."""
    model = TinyLM(CFG)
    losses = _train(model, _optimizer(opt_name, model.parameters()), range(STEPS))
    return losses, model.state_dict()


def _sharded(strategy, cfg=CFG, seed=0):
    """A sharded TinyLM: the flat design under `strategy`, or the per-parameter one ("fully_shard" on the
    whole world, "fully_shard_2x2" on a 2 x 2 mesh: HSDP)."""
    if not strategy.startswith("fully_shard"):
        return FSDP(TinyLM(cfg, seed=seed), sharding_strategy=strategy, wrap=(Block,))
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2)) if strategy == "fully_shard_2x2" else None
    model = TinyLM(cfg, seed=seed)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _train_and_save(path, strategy, opt_name):
    model = _sharded(strategy)
    opt = _optimizer(opt_name, model.parameters())
    losses = _train(model, opt, range(SPLIT), _rows())
    save_checkpoint(path, model, opt)
    return losses


def _load_and_train(path, strategy, opt_name):
    # Other weights and another lr than the checkpoint's: loading must replace every one of them.
    model = _sharded(strategy, seed=1)
    opt = _optimizer(opt_name, model.parameters(), lr_factor=3.0)
    load_checkpoint(path, model, opt)
    lr = opt.param_groups[0]["lr"]
    losses = _train(model, opt, range(SPLIT, STEPS), _rows())
    return losses, full_state_dict(model), lr


def _launch(fn, world, args, local_world_size=None):
    return launch(fn, world, args=args, timeout=TIMEOUT, local_world_size=local_world_size)


@pytest.mark.parametrize("save, load, opt_name", [
    pytest.param((2, "FULL_SHARD", None), (3, "SHARD_GRAD_OP", None), "adamw", id="2-FULL_SHARD-to-3-SHARD_GRAD_OP"),
    pytest.param((4, "HYBRID_SHARD", 2), (1, "NO_SHARD", None), "adamw", id="2x2-HYBRID_SHARD-to-1-NO_SHARD"),
    pytest.param((3, "NO_SHARD", None), (4, "FULL_SHARD", None), "adamw", id="3-NO_SHARD-to-4-FULL_SHARD"),
    pytest.param((1, "FULL_SHARD", None), (4, "HYBRID_SHARD", 2), "sgd", id="1-FULL_SHARD-to-2x2-HYBRID_SHARD-sgd"),
    # between the designs: per-parameter (DTensor) and flat (boxes) checkpoints are the same file
    pytest.param((2, "fully_shard", None), (3, "FULL_SHARD", None), "adamw", id="2-per-param-to-3-flat"),
    pytest.param((3, "SHARD_GRAD_OP", None), (4, "fully_shard_2x2", None), "sgd", id="3-flat-to-2x2-per-param-sgd"),
    pytest.param((4, "fully_shard_2x2", None), (2, "fully_shard", None), "adamw", id="2x2-per-param-to-2-per-param"),
])
def test_resumed_training_matches_uninterrupted_training(tmp_path, save, load, opt_name):
    (n, s, lws), (m, s2, lws2) = save, load
    first = _launch(_train_and_save, n, (str(tmp_path), s, opt_name), lws)
    second = _launch(_load_and_train, m, (str(tmp_path), s2, opt_name), lws2)
    ref_losses, ref_state = _reference(opt_name)
    # Equal local batches: the mean of the ranks' losses is the loss on the global batch.
    losses = torch.cat([torch.tensor(first).mean(0), torch.tensor([r[0] for r in second]).mean(0)])
    assert_close(losses, torch.tensor(ref_losses), rtol=1e-5, atol=1e-6)
    assert {r[2] for r in second} == {OPTIMIZERS[opt_name][1]["lr"]}  # hyperparameters restored too
    for _, state, _ in second:
        assert list(state) == list(ref_state)
        assert_close(state, ref_state, rtol=1e-5, atol=1e-6)


# --- a model-only checkpoint, saved once by a 2x2 hybrid run ----------------------------------------

def _save_model_only(path):
    model = _sharded("HYBRID_SHARD")
    _train(model, _optimizer("sgd", model.parameters()), range(1), _rows())
    save_checkpoint(path, model)
    try:
        save_checkpoint(path, model)
        refused = ""
    except FileExistsError as exc:  # on every rank, before any collective
        refused = str(exc)
    save_checkpoint(path, model, overwrite=True)
    return model.full_state_dict(), refused


@pytest.fixture(scope="module")
def model_only(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("model_only"))
    results = launch(_save_model_only, 4, args=(path,), timeout=TIMEOUT, local_world_size=2)
    return path, results


def test_an_existing_checkpoint_is_kept_unless_overwrite(model_only):
    _, results = model_only
    assert all("already exists" in refused and "overwrite=True" in refused for _, refused in results)


def test_each_piece_is_written_once_under_the_original_name_and_shape(model_only):
    path, results = model_only
    saved, _ = results[0]
    md = dcp.FileSystemReader(path).read_metadata()
    plain = TinyLM(CFG)
    assert set(md.state_dict_metadata) == set(plain.state_dict())  # the tied weight under both its names
    written = {}  # file -> elements of parameters in it
    for name, p in plain.named_parameters():  # named_parameters skips the tied duplicate, written like the first
        tmd = md.state_dict_metadata[name]
        assert tuple(tmd.size) == tuple(p.shape)
        assert sum(c.sizes.numel() for c in tmd.chunks) == p.numel()  # two replicas hold it, written once
        for idx, where in md.storage_data.items():
            if idx.fqn == name:
                written[where.relative_path] = written.get(where.relative_path, 0) + tmd.chunks[idx.index].sizes.numel()
    # DCP's deduplication spreads the replicated pieces over both replica groups: all 4 ranks write.
    total = sum(p.numel() for p in plain.parameters())
    assert sorted(written) == [f"__{r}_0.distcp" for r in range(4)]
    assert all(n < total / 2 for n in written.values()), written
    # So a plain module reads it with DCP alone, no fsdp_mini involved (here without torch.distributed).
    target = plain.state_dict()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        dcp.load(target, checkpoint_id=path, no_dist=True)
    for key, value in plain.state_dict().items():
        assert torch.equal(value, saved[key]), key


def _load_model_only(path):
    model = _sharded("FULL_SHARD", seed=1)
    load_checkpoint(path, model)
    loaded = model.full_state_dict()
    try:
        load_checkpoint(path, model, _optimizer("adamw", model.parameters()))
        error = ""
    except ValueError as exc:
        error = str(exc)
    return loaded, error


def test_model_only_checkpoint_loads_at_another_world_size(model_only):
    path, saved = model_only
    for loaded, error in launch(_load_model_only, 3, args=(path,), timeout=TIMEOUT):
        assert list(loaded) == list(saved[0][0])
        assert all(torch.equal(loaded[k], saved[0][0][k]) for k in loaded)  # copied, bit for bit
        first = next(iter(TinyLM(CFG).state_dict()))
        assert f"missing keys ['optim.{first}.step'" in error and f"'optim.{first}.exp_avg'" in error
        assert "saved without the optimizer" in error


def _load_into(path, cfg):
    model = _sharded("FULL_SHARD", cfg=cfg, seed=1)
    before = model.full_state_dict()
    try:
        load_checkpoint(path, model)
        error = ""
    except ValueError as exc:
        error = str(exc)
    after = model.full_state_dict()
    return error, all(torch.equal(before[k], after[k]) for k in before)


def _mismatch(cfg: TinyConfig) -> str:
    """What loading a checkpoint of CFG into a model of `cfg` must say first, derived from the state dicts:
    missing keys in the model's order, unexpected ones sorted, or the first key whose shape differs."""
    saved, here = TinyLM(CFG).state_dict(), TinyLM(cfg).state_dict()
    missing = [k for k in here if k not in saved]
    unexpected = sorted(k for k in saved if k not in here and k != "head.weight")
    if missing:
        return f"missing keys {missing[:2]}"[:-1]
    if unexpected:
        return f"unexpected keys {unexpected[:2]}"[:-1]
    key = next(k for k in here if here[k].shape != saved[k].shape)
    return f"{key}: {tuple(saved[key].shape)} in the checkpoint, {tuple(here[key].shape)} here"


@pytest.mark.parametrize("cfg", [CFG.but(depth=CFG.depth + 1), CFG.but(depth=CFG.depth - 1),
                                 CFG.but(width=CFG.width + 4)], ids=["deeper", "shallower", "wider"])
def test_another_architecture_is_a_clear_error_and_leaves_the_model_alone(model_only, cfg):
    path, _ = model_only
    message = _mismatch(cfg)
    for error, untouched in launch(_load_into, 2, args=(path, cfg), timeout=TIMEOUT):
        assert "does not match the model" in error and message in error, error
        assert untouched


# --- the corner cases of the layout: padding-only shards, a 0-d parameter, frozen ones, buffers -----

class _Tiny(nn.Module):
    """At 4 ranks the root's one trainable element (a 0-d scale) leaves ranks 1-3 a padding-only shard,
    the frozen vector leaves rank 3 one, and the Linear's weight is cut inside its rows."""

    def __init__(self, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.lin = nn.Linear(3, 2)
        with torch.no_grad():
            self.lin.weight.copy_(torch.randn(2, 3, generator=g))
            self.lin.bias.copy_(torch.randn(2, generator=g))
        self.scale = nn.Parameter(torch.tensor(1.5 + seed))
        self.frozen = nn.Parameter(torch.randn(5, generator=g), requires_grad=False)
        self.register_buffer("offset", torch.full((2,), 0.5 + seed))

    def forward(self, x):
        return ((self.lin(x) * self.scale + self.offset) ** 2).mean() + self.frozen.sum()


def _tiny_train(model, opt, steps):
    losses = []
    for s in steps:
        x = torch.randn(BATCH, 3, generator=torch.Generator().manual_seed(s))[_rows()]
        loss = model(x.to(get_device()))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _tiny_save_and_go_on(path):
    model = FSDP(_Tiny(), sharding_strategy="FULL_SHARD", wrap=(nn.Linear,))
    opt = _optimizer("adamw", model.parameters())
    _tiny_train(model, opt, range(2))
    save_checkpoint(path, model, opt)
    return _tiny_train(model, opt, range(2, 4)), model.full_state_dict()


def _tiny_load_and_go_on(path):
    model = FSDP(_Tiny(seed=1), sharding_strategy="SHARD_GRAD_OP", wrap=(nn.Linear,))
    opt = _optimizer("adamw", model.parameters())
    load_checkpoint(path, model, opt)
    pads_zero = True
    for unit in model.units:
        for h in unit.handles:
            lo = model.mesh_info.shard_mesh_rank * h.layout.shard_numel
            for value in opt.state.get(h.sharded_param, {}).values():
                if value.shape == h.sharded_param.shape:
                    pads_zero &= bool((value[max(0, h.layout.numel - lo):] == 0).all())
    keys = sorted(sharded_state_dict(model, opt))
    return _tiny_train(model, opt, range(2, 4)), model.full_state_dict(), pads_zero, keys


def test_padding_only_shards_0d_and_frozen_parameters_and_buffers(tmp_path):
    first = launch(_tiny_save_and_go_on, 4, args=(str(tmp_path),), timeout=TIMEOUT)
    second = launch(_tiny_load_and_go_on, 3, args=(str(tmp_path),), timeout=TIMEOUT)
    expected = torch.tensor([r[0] for r in first]).mean(0)
    assert_close(torch.tensor([r[0] for r in second]).mean(0), expected, rtol=1e-5, atol=1e-6)
    for _, state, pads_zero, keys in second:
        assert_close(state, first[0][1], rtol=1e-5, atol=1e-6)
        assert torch.equal(state["offset"], torch.full((2,), 0.5))  # the buffer came from the checkpoint
        assert pads_zero
        assert keys == sorted(["lin.weight", "lin.bias", "scale", "frozen", "offset", "optim.param_groups"]
                              + [f"optim.{p}.{s}" for p in ("lin.weight", "lin.bias", "scale")
                                 for s in ("exp_avg", "exp_avg_sq", "step")])


# --- optimizer param groups follow their parameters' names, not their position ------------------------

DESIGNS = ["flat", "per_param"]


def _design(design, seed=0):
    if design == "zero":  # a replicated model under ZeRO-1 (fsdp_mini.checkpoint.zero_checkpoint)
        return TinyLM(CFG, seed=seed)
    return _sharded("FULL_SHARD" if design == "flat" else "fully_shard", seed=seed)


def _decay_split(model, design):
    """(decay, no_decay) tensors of the optimizer: per parameter, the matrices and the vectors (1-D: norms,
    biases); in the flat design, whose optimizer sees one flat shard per unit, the root unit and the blocks."""
    if design == "flat":
        root = [h.sharded_param for h in model.units[0].handles]
        return root, [h.sharded_param for u in model.units[1:] for h in u.handles]
    params = list(model.parameters())
    return [p for p in params if p.ndim >= 2], [p for p in params if p.ndim < 2]


def _grouped_adamw(model, design, reverse=False, weight_decay=(0.1, 0.0)):
    decay, no_decay = _decay_split(model, design)
    groups = [{"params": decay, "weight_decay": weight_decay[0], "lr": 1e-2},
              {"params": no_decay, "weight_decay": weight_decay[1], "lr": 2e-2}]
    if design == "zero":
        return ZeroRedundancyOptimizer(groups[::-1] if reverse else groups, torch.optim.AdamW, eps=1e-3)
    return torch.optim.AdamW(groups[::-1] if reverse else groups, eps=1e-3)


def _save_grouped(path, design):
    model = _design(design)
    opt = _grouped_adamw(model, design)
    _train(model, opt, range(SPLIT), _rows())
    save_checkpoint(path, model, opt)
    return _train(model, opt, range(SPLIT, STEPS), _rows())


def _load_grouped_reversed(path, design):
    model = _design(design, seed=1)
    opt = _grouped_adamw(model, design, reverse=True, weight_decay=(0.5, 0.7))  # other values: all replaced
    load_checkpoint(path, model, opt)
    decay, _ = _decay_split(model, design)
    holds_decay = [any(p is q for p in g["params"] for q in decay) for g in opt.param_groups]
    hyper = [(holds, g["weight_decay"], g["lr"]) for holds, g in zip(holds_decay, opt.param_groups)]
    return hyper, _train(model, opt, range(SPLIT, STEPS), _rows())


@pytest.mark.parametrize("design", DESIGNS + ["zero"])
def test_param_groups_are_restored_by_parameter_name_not_by_position(tmp_path, design):
    # As PyTorch's get/set_optimizer_state_dict do: a group's hyperparameters follow the names of its parameters.
    path = str(tmp_path / "ckpt")
    uninterrupted = launch(_save_grouped, 2, args=(path, design), timeout=TIMEOUT)
    for hyper, losses in launch(_load_grouped_reversed, 3, args=(path, design), timeout=TIMEOUT):
        assert hyper == [(False, 0.0, 2e-2), (True, 0.1, 1e-2)], hyper
    resumed = torch.tensor([r[1] for r in launch(_load_grouped_reversed, 2, args=(path, design), timeout=TIMEOUT)])
    assert_close(resumed.mean(0), torch.tensor(uninterrupted).mean(0), rtol=1e-5, atol=1e-6)
    if design == "per_param":  # the names stored are those PyTorch's get_optimizer_state_dict stores
        from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        plain = TinyLM(CFG)
        theirs = get_optimizer_state_dict(plain, _grouped_adamw(plain, design))["param_groups"]
        ours = {"optim.param_groups": None}
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
            dcp.load(ours, checkpoint_id=path, no_dist=True, planner=DefaultLoadPlanner(flatten_state_dict=False,
                                                                                    flatten_sharded_tensors=False))
        assert [g["params"] for g in ours["optim.param_groups"]] == [g["params"] for g in theirs]


def _load_into_groups(path, design, layout):
    """Try to load into an optimizer built another way; the error, and whether the model and the optimizer
    were left exactly as they were (weights compared, the optimizer still without any state)."""
    model = _design(design, seed=1)
    decay, no_decay = _decay_split(model, design)
    if layout == "one_group":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, eps=1e-3)
    elif layout == "regrouped":  # two groups again, but one tensor has moved from one to the other
        opt = torch.optim.AdamW([{"params": decay + no_decay[:1]}, {"params": no_decay[1:]}], lr=1e-2, eps=1e-3)
    elif layout == "sgd":  # no state at all: Adam's moments would be dropped
        opt = torch.optim.SGD([{"params": decay}, {"params": no_decay}], lr=0.1)
    else:  # "sgd_momentum": another state (momentum_buffer) than the checkpoint's
        opt = torch.optim.SGD([{"params": decay}, {"params": no_decay}], lr=0.1, momentum=0.9)
    before = full_state_dict(model)
    try:
        load_checkpoint(path, model, opt)
        error = ""
    except ValueError as exc:
        error = str(exc)
    after = full_state_dict(model)
    return error, all(torch.equal(before[k], after[k]) for k in before), len(opt.state) == 0


@pytest.mark.parametrize("design", DESIGNS)
def test_an_optimizer_that_does_not_match_is_refused_before_anything_is_written(tmp_path, design):
    path = str(tmp_path / "ckpt")
    launch(_save_grouped, 2, args=(path, design), timeout=TIMEOUT)
    expected = {
        "one_group": ["the checkpoint's optimizer has 2 param groups, this one 1"],
        "regrouped": ["param groups do not match the checkpoint's by parameter name", "group 0 holds"],
        "sgd": ["unexpected keys", ".exp_avg'", "exp_avg, exp_avg_sq, step", "this optimizer's: none"],
        "sgd_momentum": ["missing keys", ".momentum_buffer'", "unexpected keys", ".exp_avg_sq'",
                         "this optimizer's: momentum_buffer"],
    }
    problems = []  # every layout tried before the verdict
    for layout, parts in expected.items():
        error, model_untouched, optimizer_untouched = launch(_load_into_groups, 2, args=(path, design, layout),
                                                             timeout=TIMEOUT)[1]  # rank 1: the same error on both
        if not all(p in error for p in parts):
            problems.append(f"{layout}: error {error!r} lacks one of {parts}")
        if not model_untouched:
            problems.append(f"{layout}: the model was written before the error")
        if not optimizer_untouched:
            problems.append(f"{layout}: the optimizer was given state before the error")
    assert not problems, "\n".join(problems)


def _save_without_group_names(path, design):
    """A checkpoint as fsdp_mini wrote it before param groups carried their parameters' names (and before a
    tied weight was written under its second name too)."""
    from fsdp_mini.checkpoint.sharded_boxes import BoxesSavePlanner

    model = _design(design)
    opt = _grouped_adamw(model, design)
    _train(model, opt, range(1), _rows())
    sd = sharded_state_dict(model, opt)
    sd["optim.param_groups"] = [{k: v for k, v in g.items() if k != "params"} for g in sd["optim.param_groups"]]
    del sd["head.weight"]
    dcp.save(sd, checkpoint_id=path, planner=BoxesSavePlanner())
    return full_state_dict(model)


def _load_old_by_position(path, design):
    model = _design(design, seed=1)
    opt = _grouped_adamw(model, design, weight_decay=(0.5, 0.7))
    load_checkpoint(path, model, opt, verify=False)  # plain dcp.save: no manifest
    return [(g["weight_decay"], g["lr"]) for g in opt.param_groups], full_state_dict(model)


@pytest.mark.parametrize("design", DESIGNS)
def test_a_checkpoint_without_group_names_loads_its_groups_by_position(tmp_path, design):
    path = str(tmp_path / "ckpt")
    saved = launch(_save_without_group_names, 2, args=(path, design), timeout=TIMEOUT)[0]
    for groups, state in launch(_load_old_by_position, 2, args=(path, design), timeout=TIMEOUT):
        assert groups == [(0.1, 1e-2), (0.0, 2e-2)]
        assert list(state) == list(saved) and all(torch.equal(state[k], saved[k]) for k in saved)  # head.weight too


# --- a tied weight: PyTorch's own loaders read the checkpoint of either design ------------------------

def _save_tied(path, design):
    model = _design(design)
    opt = _optimizer("adamw", model.parameters())
    _train(model, opt, range(SPLIT), _rows())
    save_checkpoint(path, model, opt, extra_state={"step": SPLIT})
    return full_state_dict(model)


def _load_tied(path, design):
    model = _design(design, seed=1)
    opt = _optimizer("adamw", model.parameters())
    extra = load_checkpoint(path, model, opt)
    return full_state_dict(model), extra


@pytest.mark.parametrize("design", DESIGNS)
def test_a_tied_weight_loads_with_pytorchs_own_loaders_and_with_fsdp_mini(tmp_path, design):
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    path = str(tmp_path / "ckpt")
    saved = launch(_save_tied, 2, args=(path, design), timeout=TIMEOUT)[0]
    assert set(saved) == set(TinyLM(CFG).state_dict())  # head.weight among them
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        plain = TinyLM(CFG, seed=1)  # a plain module, its own state_dict(): both names of the tied weight
        dcp.load(plain.state_dict(), checkpoint_id=path, no_dist=True)
        flow = TinyLM(CFG, seed=1)  # PyTorch's state-dict API
        sd = get_model_state_dict(flow)
        dcp.load(sd, checkpoint_id=path, no_dist=True)
        set_model_state_dict(flow, sd)
    for module in (plain, flow):
        assert module.head.weight is module.embed.weight
        state = module.state_dict()
        assert list(state) == list(saved) and all(torch.equal(state[k], saved[k]) for k in saved)
    for state, extra in launch(_load_tied, 3, args=(path, design), timeout=TIMEOUT):  # and fsdp_mini's, 2 -> 3
        assert extra == {"step": SPLIT}
        assert list(state) == list(saved) and all(torch.equal(state[k], saved[k]) for k in saved)


# --- a partly sharded model: fully_shard on some modules only, the root replicated ------------------

def _partly_sharded(seed=0):
    """fully_shard on the blocks only: the root (embeddings, head, final norm) stays a plain replicated
    module, as `full_state_dict` accepts it (tests/library/test_fsdp2_differential.py)."""
    model = TinyLM(CFG, seed=seed)
    for block in model.blocks:
        fully_shard(block)
    return model


def _save_and_load_partly_sharded(path):
    # The whole batch on every rank: nothing syncs the root's replicated gradients (no DDP around it), so only
    # equal batches keep its parameters equal on every rank, as a replicated tensor's checkpoint needs.
    model = _partly_sharded()
    opt = _optimizer("adamw", model.parameters())
    _train(model, opt, range(SPLIT))
    save_checkpoint(path, model, opt, extra_state={"step": SPLIT})
    saved = full_state_dict(model)
    go_on = _train(model, opt, range(SPLIT, STEPS))
    fresh = _partly_sharded(seed=1)
    fresh_opt = _optimizer("adamw", fresh.parameters(), lr_factor=3.0)
    extra = load_checkpoint(path, fresh, fresh_opt)
    loaded = full_state_dict(fresh)
    return saved, loaded, extra, go_on, _train(fresh, fresh_opt, range(SPLIT, STEPS))


def test_a_partly_sharded_model_saves_and_loads(tmp_path):
    for saved, loaded, extra, go_on, resumed in launch(_save_and_load_partly_sharded, 2,
                                                       args=(str(tmp_path / "ckpt"),), timeout=TIMEOUT):
        assert extra == {"step": SPLIT}
        assert list(loaded) == list(saved) and all(torch.equal(loaded[k], saved[k]) for k in saved)
        assert resumed == go_on  # the optimizer's state and lr came back too: the same next steps


# --- no deprecated ShardedTensor: DCP sees the boxes through fsdp_mini's own planners -----------------

def _save_and_load_raising_on_deprecations(path, design):
    def adamw(model):
        if design == "zero":
            return ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-2, eps=1e-3)
        return _optimizer("adamw", model.parameters())

    def state(model):
        return {k: v.clone() for k, v in model.state_dict().items()} if design == "zero" else full_state_dict(model)

    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # ShardedTensor's deprecation is a FutureWarning
        model = _design(design)
        opt = adamw(model)
        _train(model, opt, range(1), _rows())
        kinds = sorted({type(v).__name__ for v in sharded_state_dict(model, opt).values()})
        save_checkpoint(path, model, opt)
        fresh = _design(design, seed=1)
        fresh_opt = adamw(fresh)
        load_checkpoint(path, fresh, fresh_opt)
        return kinds, state(model), state(fresh), _train(model, opt, range(1, 2), _rows()), \
            _train(fresh, fresh_opt, range(1, 2), _rows())


@pytest.mark.parametrize("design", ["flat", "zero"])
def test_no_deprecated_sharded_tensor_is_built(tmp_path, design):
    # Its deprecation warning raised as an error while saving and loading (nothing silences it now), and
    # none among what DCP is handed.
    for kinds, saved, loaded, go_on, resumed in launch(_save_and_load_raising_on_deprecations, 2,
                                                       args=(str(tmp_path / "ckpt"), design), timeout=TIMEOUT):
        assert "ShardedTensor" not in kinds, kinds
        assert list(loaded) == list(saved) and all(torch.equal(loaded[k], saved[k]) for k in saved)
        assert resumed == go_on


# --- sharded_boxes on its own: arbitrary boxes saved at 2 ranks, read at 3 with others, and whole ----------

_FULL = torch.arange(35.0).view(5, 7)
_SAVED_BOXES = {  # rank: (its run of the flattened tensor [lo, hi), its boxes (offsets, sizes, offset in the run))
    0: ((0, 17), [((0, 0), (2, 7), 0), ((2, 0), (1, 3), 14)]),
    1: ((17, 35), [((2, 3), (1, 4), 0), ((3, 0), (2, 7), 4)]),
}
_LOADED_BOXES = {
    0: ((0, 10), [((0, 0), (1, 7), 0), ((1, 0), (1, 3), 7)]),
    1: ((10, 25), [((1, 3), (1, 4), 0), ((2, 0), (1, 7), 4), ((3, 0), (1, 4), 11)]),
    2: ((25, 35), [((3, 4), (1, 3), 0), ((4, 0), (1, 7), 3)]),
}


def _boxed(layout, fill):
    from fsdp_mini.checkpoint.sharded_boxes import Box, BoxedTensor

    (lo, hi), boxes = layout[dist.get_rank()]
    run = _FULL.flatten()[lo:hi].clone() if fill else torch.zeros(hi - lo)
    return run, BoxedTensor(run, [Box(*b) for b in boxes], tuple(_FULL.shape))


def _save_boxes(path):
    from fsdp_mini.checkpoint.sharded_boxes import BoxesSavePlanner

    dcp.save({"w": _boxed(_SAVED_BOXES, fill=True)[1], "b": torch.ones(3)}, checkpoint_id=path,
             planner=BoxesSavePlanner())


def _load_boxes(path):
    from fsdp_mini.checkpoint.sharded_boxes import BoxesLoadPlanner

    run, boxed = _boxed(_LOADED_BOXES, fill=False)
    dcp.load({"w": boxed}, checkpoint_id=path, planner=BoxesLoadPlanner())
    (lo, hi), _ = _LOADED_BOXES[dist.get_rank()]
    return torch.equal(run, _FULL.flatten()[lo:hi])


def test_boxes_reshard_and_load_whole_into_a_plain_tensor(tmp_path):
    path = str(tmp_path / "ckpt")
    launch(_save_boxes, 2, args=(path,), timeout=TIMEOUT)
    assert launch(_load_boxes, 3, args=(path,), timeout=TIMEOUT) == [True, True, True]
    whole = {"w": torch.zeros(5, 7), "b": torch.zeros(3)}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        dcp.load(whole, checkpoint_id=path, no_dist=True)
    assert torch.equal(whole["w"], _FULL) and torch.equal(whole["b"], torch.ones(3))
