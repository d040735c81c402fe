"""The flat design (`FSDP`) inside an ordinary training script: what a practitioner does around the wrapped model.

Issue 39 found these losing data without a word: a module that holds an FSDP part (a Lightning-like owner, a
ModuleDict of two parts) saved a state dict without it, and a sharded checkpoint of it with 0 keys; freezing a
block after wrapping did nothing; `.to(dtype)` after wrapping changed the stored weights but not the computation;
reading a parameter between steps read freed memory (a segmentation fault, in PyTorch's FSDP1 too). Each case
runs fsdp_mini and, where PyTorch's FSDP1 runs on gloo CPU (`device_id=torch.device("cpu")`, its
`ModuleWrapPolicy` for `wrap=`), FSDP1 beside it in the same ranks, and compares what a user can observe.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import fsdp_mini
from fsdp_mini import FSDP, fully_shard
from expect import raised
from launch_cases import run_cases


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("shift", torch.arange(4.0))

    def forward(self, x):
        return torch.tanh(self.lin(x)) + self.shift


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(Block(), Block())
        self.head = nn.Linear(4, 4)

    def forward(self, x):
        return self.head(self.blocks(x))


class Owner(nn.Module):
    """A training module as Lightning writes one: it holds the model (wrapped later) and a parameter of its own."""

    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.enc = Encoder()
        self.out = nn.Linear(4, 2)

    def forward(self, x):
        return self.out(self.enc(x))


def _flat(module):
    return FSDP(module, wrap=(Block,))


def _fsdp1(module):
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    return FullyShardedDataParallel(module, auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=torch.device("cpu"))


WRAPPERS = {"fsdp_mini": _flat, "torch FSDP1": _fsdp1}


def _batch(step=0):
    return torch.randn(3, 4, generator=torch.Generator().manual_seed(10 * dist.get_rank() + step))


def _cpu(sd):
    return {k: v.detach().to("cpu", copy=True) for k, v in sd.items()}


# --- the cases, each run on every rank ----------------------------------------------------------------------

def _owner_state_dict(wrap):
    owner = Owner()
    plain = _cpu(owner.state_dict())
    owner.enc = WRAPPERS[wrap](owner.enc)
    owner(_batch()).sum().backward()
    return plain, _cpu(owner.state_dict())


def _module_dict_state_dict(wrap):
    parts = nn.ModuleDict({"a": Owner(0).enc, "b": Owner(1).enc})
    plain = _cpu(parts.state_dict())
    for key in ("a", "b"):
        parts[key] = WRAPPERS[wrap](parts[key])
    return plain, _cpu(parts.state_dict())


def _owner_load_state_dict(wrap):
    target = {k: v + 1 for k, v in Owner(3).state_dict().items()}
    owner = Owner()
    owner.enc = WRAPPERS[wrap](owner.enc)
    result = owner.load_state_dict(target)
    loaded = _cpu(owner.state_dict())
    missing = raised(lambda: owner.load_state_dict({k: v for k, v in target.items() if k != "enc.head.bias"}))
    partial = owner.load_state_dict({**{k: v for k, v in target.items() if k != "enc.head.bias"},
                                     "enc.extra": torch.zeros(1)}, strict=False)
    return (target, tuple(result), loaded, missing.split(":")[0], "enc.head.bias" in missing,
            (sorted(partial.missing_keys), sorted(partial.unexpected_keys)))


def _wrapper_load_state_dict_returns_keys(_):
    model = _flat(Owner().enc)
    return type(model.load_state_dict(Owner(3).enc.state_dict())).__name__


def _owner_checkpoint(path):
    from fsdp_mini.checkpoint import load_checkpoint, save_checkpoint
    owner = Owner()
    owner.enc = _flat(owner.enc)
    opt = torch.optim.AdamW(owner.parameters(), lr=0.1, eps=1e-3)
    # one batch on every rank: the owner's own `out` is not data-parallel, so it stays the same everywhere
    owner(torch.randn(3, 4, generator=torch.Generator().manual_seed(0))).sum().backward()
    opt.step()
    save_checkpoint(path, owner, opt)
    fresh = Owner(5)
    fresh.enc = _flat(fresh.enc)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.1, eps=1e-3)
    load_checkpoint(path, fresh, fresh_opt)
    states = [(opt.state[a], fresh_opt.state[b]) for a, b in zip(owner.parameters(), fresh.parameters())]
    same_state = all(torch.equal(x[k], y[k]) for x, y in states for k in x)
    save_checkpoint(path + "-model", owner)  # the model alone (this wrote 0-byte files, without an error)
    model_only = Owner(6)
    model_only.enc = _flat(model_only.enc)
    load_checkpoint(path + "-model", model_only)
    return _cpu(owner.state_dict()), _cpu(fresh.state_dict()), same_state, _cpu(model_only.state_dict())


def _checkpoint_before_the_first_step(path):
    """Saved before the optimizer ever stepped: it loads as a fresh optimizer (PyTorch's DCP would keep the
    state of its loading step: AdamW's step 1, tests/differential/known.py), and the next step is the
    uninterrupted run's."""
    from fsdp_mini.checkpoint import load_checkpoint, save_checkpoint
    runs = []
    for resumed in (False, True):
        model = _flat(Owner().enc)
        opt = torch.optim.AdamW(model.parameters(), lr=0.1, eps=1e-3)
        if resumed:
            save_checkpoint(path, model, opt, overwrite=True)
            model = _flat(Owner(7).enc)  # other values: the checkpoint brings them back
            opt = torch.optim.AdamW(model.parameters(), lr=0.1, eps=1e-3)
            load_checkpoint(path, model, opt)
            runs.append(len(opt.state))
        model(_batch()).sum().backward()
        opt.step()
        runs.append(model.full_state_dict())
    return runs


def _freeze_after_wrapping(wrap):
    torch.manual_seed(0)
    model = WRAPPERS[wrap](Encoder())
    model.module.blocks[0].requires_grad_(False)  # frozen after wrapping
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.1, eps=1e-3)
    before = _full(model)
    for step in range(2):
        model(_batch(step)).sum().backward()
        opt.step()
        opt.zero_grad()
    after = _full(model)
    return {k: torch.equal(before[k], after[k]) for k in before}


def _full(model):
    if isinstance(model, FSDP):
        return model.full_state_dict()
    with type(model).summon_full_params(model):
        return _cpu(model.state_dict())


def _freeze_part_of_a_flat_parameter(_):
    torch.manual_seed(0)
    model = _flat(Encoder())  # blocks are units; head is the root unit's only module, so it is whole
    whole = raised(lambda: model.module.head.requires_grad_(False))
    model = FSDP(Encoder(), wrap=())  # one flat parameter for everything
    part = raised(lambda: model.module.blocks[0].requires_grad_(False))
    unfreeze = raised(lambda: _frozen_at_wrapping().module.blocks[0].requires_grad_(True))
    return whole, part, unfreeze


def _frozen_at_wrapping():
    enc = Encoder()
    enc.blocks[0].requires_grad_(False)
    return _flat(enc)


def _conversions_after_wrapping(_):
    torch.manual_seed(0)
    model = _flat(Encoder())
    to_bf16 = raised(lambda: model.to(torch.bfloat16))
    holder_f64 = raised(lambda: nn.Sequential(model).to(torch.float64))
    same = raised(lambda: model.float().to("cpu"))
    trains = model(_batch()).dtype
    fsdp1 = raised(lambda: _fsdp1(Encoder()).to(torch.bfloat16))  # PyTorch's FSDP1 takes it (fully_sharded_data_parallel.py's docstring)
    return to_bf16, holder_f64, same, str(trains), fsdp1


def _read_between_steps(_):
    torch.manual_seed(0)
    model = _flat(Encoder())
    model(_batch()).sum().backward()
    read = raised(lambda: print(model.module.head.weight))
    shape = tuple(model.module.blocks[0].lin.weight.shape)
    with model.summon_full_params():
        inside = model.module.head.weight.detach().clone()
    return read, shape, torch.equal(inside, model.full_state_dict()["head.weight"])


def _identical_nan_and_inf_buffers(design):
    torch.manual_seed(0)
    model = Encoder()
    model.register_buffer("bounds", torch.tensor([-float("inf"), float("inf"), float("nan")]))
    if design == "flat":
        return raised(lambda: _flat(model))
    return raised(lambda: fully_shard(model))


def _summon_and_change(model, target, **kwargs):
    """Double two weights (one in a block unit, one in the root unit) in place inside summon_full_params."""
    with type(model).summon_full_params(target, **kwargs):
        with torch.no_grad():
            for name, p in target.named_parameters():  # FSDP1 keeps its wrappers' names in them
                if name.replace("_fsdp_wrapped_module.", "").endswith(("blocks.1.lin.weight", "head.weight")):
                    p.mul_(2)


def _summon_full_params_writes_back(wrap):
    torch.manual_seed(0)
    model = WRAPPERS[wrap](Encoder())
    seen = {"before": _full(model)}
    _summon_and_change(model, model)  # FSDP1's default: writeback=True
    seen["written back"] = _full(model)
    _summon_and_change(model, model, writeback=False)
    seen["read only"] = _full(model)
    _summon_and_change(model, nn.Sequential(model))  # a module holding the wrapper, as FSDP1 takes it
    seen["through a holder"] = _full(model)
    return seen


def _summon_writes_back_only_what_changed(_):
    """Under mixed precision the gathered copy is bf16: what is not changed keeps its float32 bits; a change
    made before a forward inside the context survives the forward's free; unsupported options say so."""
    torch.manual_seed(0)
    model = FSDP(Encoder(), wrap=(Block,), mixed_precision=fsdp_mini.MixedPrecision(param_dtype=torch.bfloat16,
                                                                          buffer_dtype=torch.bfloat16))
    before = model.full_state_dict()
    with model.summon_full_params():
        with torch.no_grad():
            model.module.blocks[0].lin.bias.fill_(0.5)
        model(_batch())  # no grad needed: frees every unit it gathered (FlatParamHandle.write_back first)
    after = model.full_state_dict()
    rank0_only = raised(lambda: model.summon_full_params(rank0_only=True).__enter__())
    return before, after, rank0_only


def _mistakes_named(_):
    torch.manual_seed(0)
    wrap_instance = raised(lambda: FSDP(Encoder(), wrap=Block()))
    flat_copy = raised(lambda: copy.deepcopy(nn.ModuleDict({"ema": _flat(Encoder())})))
    per_param_copy = raised(lambda: copy.deepcopy(fully_shard(Encoder())))
    from torch.distributed.fsdp import fully_shard as torch_fully_shard
    from torch.distributed.device_mesh import init_device_mesh
    torch_copy = raised(lambda: copy.deepcopy(torch_fully_shard(Encoder(), mesh=init_device_mesh("cpu", (2,)))))
    return wrap_instance, flat_copy, per_param_copy, torch_copy


CASES = [(_owner_state_dict, w) for w in WRAPPERS] + [(_module_dict_state_dict, w) for w in WRAPPERS] + \
        [(_owner_load_state_dict, w) for w in WRAPPERS] + [(_freeze_after_wrapping, w) for w in WRAPPERS] + \
        [(_wrapper_load_state_dict_returns_keys, None), (_freeze_part_of_a_flat_parameter, None),
         (_conversions_after_wrapping, None), (_read_between_steps, None), (_identical_nan_and_inf_buffers, "flat"),
         (_identical_nan_and_inf_buffers, "per-parameter"), (_mistakes_named, None),
         (_summon_writes_back_only_what_changed, None)] + [(_summon_full_params_writes_back, w) for w in WRAPPERS]


def _run(case):
    fn, arg = case
    return fn(arg)


@pytest.fixture(scope="module")
def results():
    return run_cases(_run, CASES, 2)


def _rank0(results, fn, arg=None):
    return results[(fn, arg)][0]


def _same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], msg=k)


# --- the tests -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("wrap", WRAPPERS)
def test_an_owners_state_dict_holds_the_wrapped_part_whole(results, wrap, no_orphans):
    plain, owned = _rank0(results, _owner_state_dict, wrap)
    assert list(owned) == list(plain)  # the owner's keys, in the order a plain module gives them
    _same({k: v for k, v in owned.items() if not k.startswith("enc.")}, {k: plain[k] for k in plain if k.startswith("out.")})


@pytest.mark.parametrize("wrap", WRAPPERS)
def test_a_module_dict_of_two_wrapped_parts_saves_both(results, wrap, no_orphans):
    plain, parts = _rank0(results, _module_dict_state_dict, wrap)
    _same(parts, plain)


def test_fsdp_mini_and_fsdp1_give_an_owner_the_same_state_dict(results, no_orphans):
    _same(_rank0(results, _owner_state_dict, "fsdp_mini")[1], _rank0(results, _owner_state_dict, "torch FSDP1")[1])


@pytest.mark.parametrize("wrap", WRAPPERS)
def test_an_owners_load_state_dict_reaches_the_wrapped_part(results, wrap, no_orphans):
    target, result, loaded, missing_error, names_key, partial = _rank0(results, _owner_load_state_dict, wrap)
    assert result == ([], [])
    _same(loaded, target)
    assert missing_error.startswith("RuntimeError") and names_key  # strict: nn.Module's error, naming the key
    assert partial == (["enc.head.bias"], ["enc.extra"])  # strict=False: nn.Module's lists


def test_load_state_dict_returns_nn_modules_named_tuple(results, no_orphans):
    assert _rank0(results, _wrapper_load_state_dict_returns_keys) == "_IncompatibleKeys"


def test_a_sharded_checkpoint_of_an_owner_holds_the_wrapped_part(tmp_path, no_orphans):
    for saved, loaded, same_state, model_only in run_cases(_owner_checkpoint, [str(tmp_path / "ck")], 2)[str(tmp_path / "ck")]:
        _same(loaded, saved)
        _same(model_only, saved)
        assert same_state
    for folder in ("ck", "ck-model"):
        files = list((tmp_path / folder).glob("*.distcp"))
        assert files and all(f.stat().st_size > 0 for f in files)


def test_a_checkpoint_saved_before_the_first_step_loads_a_fresh_optimizer(tmp_path, no_orphans):
    for uninterrupted, state_after_load, resumed in run_cases(_checkpoint_before_the_first_step,
                                                              [str(tmp_path / "ck")], 2)[str(tmp_path / "ck")]:
        assert state_after_load == 0
        _same(resumed, uninterrupted)


@pytest.mark.parametrize("wrap", WRAPPERS)
def test_a_block_frozen_after_wrapping_stays_as_it_was(results, wrap, no_orphans):
    unchanged = _rank0(results, _freeze_after_wrapping, wrap)
    assert unchanged["blocks.0.lin.weight"] and unchanged["blocks.0.lin.bias"]  # AdamW's weight decay too
    assert not unchanged["blocks.1.lin.weight"] and not unchanged["head.weight"]


def test_freezing_part_of_a_flat_parameter_says_why_and_what_to_do(results, no_orphans):
    whole, part, unfreeze = _rank0(results, _freeze_part_of_a_flat_parameter)
    assert whole == "no error"
    assert part.startswith("ValueError: blocks.0.requires_grad_(False) after FSDP: its parameters share the flat "
                           "parameter 'root' with ") and "before wrapping" in part and "fully_shard" in part
    assert unfreeze.startswith("ValueError: cannot unfreeze ['blocks.0 (frozen)'] after FSDP")


def test_a_dtype_conversion_after_wrapping_is_refused_before_anything_changes(results, no_orphans):
    to_bf16, holder_f64, same, trains, fsdp1 = _rank0(results, _conversions_after_wrapping)
    assert fsdp1 == "no error"
    assert to_bf16.startswith("ValueError: FSDP holds its parameters in flat shards of torch.float32 on cpu; this "
                              "conversion would make them torch.bfloat16 on cpu") and "MixedPrecision" in to_bf16
    assert holder_f64.startswith("ValueError") and "torch.float64" in holder_f64
    assert same == "no error" and trains == "torch.float32"


def test_reading_a_parameter_between_steps_is_an_error_not_a_segfault(results, no_orphans):
    read, shape, summoned = _rank0(results, _read_between_steps)
    assert read.startswith("RuntimeError: head.weight is sharded now") and "summon_full_params" in read
    assert shape == (4, 4) and summoned


@pytest.mark.parametrize("design", ["flat", "per-parameter"])
def test_identical_nan_and_inf_buffers_start_the_same_on_every_rank(results, design, no_orphans):
    assert _rank0(results, _identical_nan_and_inf_buffers, design) == "no error"


def test_wrap_instances_and_deep_copies_say_what_to_do(results, no_orphans):
    wrap_instance, flat_copy, per_param_copy, torch_copy = _rank0(results, _mistakes_named)
    assert wrap_instance == ("ValueError: wrap takes module classes, got a Block instance: pass wrap=(Block,) to "
                             "make every Block a unit")
    assert flat_copy.startswith("RuntimeError: a model sharded by FSDP cannot be deep-copied") and \
        "full_state_dict" in flat_copy
    assert per_param_copy.startswith("RuntimeError: a model sharded by fully_shard cannot be deep-copied")
    assert torch_copy.startswith("AssertionError: FSDP does not support deepcopy")  # PyTorch refuses as well


@pytest.mark.parametrize("wrap", WRAPPERS)
def test_summon_full_params_writes_changes_back_as_fsdp1_does(results, wrap, no_orphans):
    seen = _rank0(results, _summon_full_params_writes_back, wrap)
    before = seen["before"]
    doubled = {k: v * 2 if k in ("blocks.1.lin.weight", "head.weight") else v for k, v in before.items()}
    _same(seen["written back"], doubled)
    _same(seen["read only"], doubled)  # writeback=False: the second doubling is dropped
    _same(seen["through a holder"], {k: v * 2 if k in ("blocks.1.lin.weight", "head.weight") else v
                                     for k, v in doubled.items()})
    _same(seen["through a holder"], _rank0(results, _summon_full_params_writes_back, "torch FSDP1")["through a holder"])


def test_summon_full_params_writes_back_only_what_changed(results, no_orphans):
    before, after, rank0_only = _rank0(results, _summon_writes_back_only_what_changed)
    assert torch.equal(after["blocks.0.lin.bias"], torch.full((4,), 0.5))
    for k in before:
        if k != "blocks.0.lin.bias":
            assert torch.equal(after[k], before[k]), k  # float32 bits, not their bf16 rounding
    assert rank0_only.startswith("ValueError") and "full_state_dict" in rank0_only
