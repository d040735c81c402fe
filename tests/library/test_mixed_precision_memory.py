"""MixedPrecision validation, and the measured side of memory: MemoryTracker, tensor_bytes and
optimizer_state_bytes (the estimate side is tested in test_strategy_memory.py)."""
from __future__ import annotations

import dataclasses
import random
import re

import pytest
import torch

from fsdp_mini.memory import MemoryTracker, optimizer_state_bytes, tensor_bytes
from fsdp_mini.fsdp.mixed_precision import MixedPrecision, MixedPrecisionPolicy

FLOAT_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
FIELDS = ["param_dtype", "reduce_dtype", "buffer_dtype"]


# --- MixedPrecision ---------------------------------------------------------------------------


def test_defaults():
    mp = MixedPrecision()
    assert mp.param_dtype is None and mp.reduce_dtype is None and mp.buffer_dtype is None
    assert mp.cast_forward_inputs is False and mp.cast_root_forward_inputs is True and not mp.keep_low_precision_grads


def test_field_names_mirror_pytorch():
    """FSDP1's fields, in its order and with its defaults, for the flat design (all but its private
    `_module_classes_to_ignore`: fsdp_mini wraps no module on its own); FSDP2's exactly for the policy."""
    fsdp = pytest.importorskip("torch.distributed.fsdp")
    theirs = [(f.name, f.default) for f in dataclasses.fields(fsdp.MixedPrecision) if not f.name.startswith("_")]
    assert [(f.name, f.default) for f in dataclasses.fields(MixedPrecision)] == theirs
    policy = {f.name for f in dataclasses.fields(fsdp.MixedPrecisionPolicy)}
    assert {f.name for f in dataclasses.fields(MixedPrecisionPolicy)} == policy


@pytest.mark.parametrize("param_dtype", FLOAT_DTYPES + [None])
@pytest.mark.parametrize("reduce_dtype", FLOAT_DTYPES + [None])
def test_every_floating_dtype_is_accepted(param_dtype, reduce_dtype):
    mp = MixedPrecision(param_dtype=param_dtype, reduce_dtype=reduce_dtype, cast_forward_inputs=False)
    assert mp.param_dtype is param_dtype and mp.reduce_dtype is reduce_dtype and mp.cast_forward_inputs is False


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("bad", [torch.int8, torch.int32, torch.int64, torch.bool, torch.complex64,
                                 "bfloat16", "torch.float16", float, 16, torch.tensor(1.0)])
def test_non_floating_dtypes_are_rejected_naming_the_field(field, bad):
    with pytest.raises(ValueError, match=f"MixedPrecision.{field} must be a floating-point torch.dtype"):
        MixedPrecision(**{field: bad})


def test_is_frozen():
    mp = MixedPrecision(param_dtype=torch.bfloat16)
    with pytest.raises(dataclasses.FrozenInstanceError):
        mp.param_dtype = torch.int32  # type: ignore[misc]
    assert mp == MixedPrecision(param_dtype=torch.bfloat16) and hash(mp) == hash(MixedPrecision(torch.bfloat16))


# --- MemoryTracker ----------------------------------------------------------------------------


def test_tracker_starts_empty():
    m = MemoryTracker()
    assert (m.current, m.peak) == (0, 0)


def test_alloc_free_peak_reset_peak():
    m = MemoryTracker()
    m.alloc(100)
    m.alloc(50)
    assert (m.current, m.peak) == (150, 150)
    m.free(100)
    assert (m.current, m.peak) == (50, 150)  # freeing never lowers the peak
    m.alloc(30)
    assert (m.current, m.peak) == (80, 150)  # below the old peak: unchanged
    m.reset_peak()
    assert (m.current, m.peak) == (80, 80)  # the peak restarts from what is alive now
    m.alloc(10)
    assert (m.current, m.peak) == (90, 90)
    m.free(90)
    assert (m.current, m.peak) == (0, 90)
    m.reset_peak()
    assert (m.current, m.peak) == (0, 0)
    assert repr(m) == "MemoryTracker(current=0, peak=0)"


def test_freeing_more_than_tracked_raises_and_changes_nothing():
    m = MemoryTracker()
    with pytest.raises(RuntimeError, match="freeing 1 bytes but only 0 are tracked"):
        m.free(1)
    m.alloc(10)
    with pytest.raises(RuntimeError, match=re.escape("freeing 11 bytes but only 10 are tracked")):
        m.free(11)
    assert (m.current, m.peak) == (10, 10)
    m.free(10)  # freeing exactly what is tracked is fine
    assert m.current == 0


@pytest.mark.parametrize("seed", range(5))
def test_tracker_matches_a_brute_force_model(seed):
    """Random alloc/free/reset_peak sequences against the definition: peak = max of current since the
    last reset (or since the start)."""
    rng = random.Random(seed)
    m = MemoryTracker()
    history = [0]  # values of `current` since the last reset
    live: list[int] = []  # buffers alive now
    for _ in range(300):
        op = rng.random()
        if op < 0.5 or not live:
            nbytes = rng.randrange(0, 1000)
            m.alloc(nbytes)
            live.append(nbytes)
        elif op < 0.9:
            m.free(live.pop(rng.randrange(len(live))))
        else:
            m.reset_peak()
            history = []
        history.append(sum(live))
        assert m.current == sum(live)
        assert m.peak == max(history)


# --- tensor_bytes / optimizer_state_bytes -------------------------------------------------------


def test_tensor_bytes():
    ts = [torch.zeros(3, 4), torch.zeros(5, dtype=torch.float16), None, torch.zeros((), dtype=torch.int64),
          torch.zeros(0), torch.zeros(2, dtype=torch.bfloat16)]
    expected = 12 * 4 + 5 * 2 + 1 * 8 + 0 + 2 * 2
    assert tensor_bytes(ts) == expected
    assert tensor_bytes(t for t in ts) == expected  # any iterable
    assert tensor_bytes([]) == 0 and tensor_bytes([None]) == 0
    # a view counts its own elements, not its base's storage
    base = torch.zeros(10)
    assert tensor_bytes([base[:3]]) == 3 * 4


def _params(dtype=torch.float32):
    torch.manual_seed(0)
    shapes = [(3, 4), (5,), (), (2, 1, 3)]
    return [torch.nn.Parameter(torch.randn(s, dtype=dtype)) for s in shapes]


def _one_step(opt, params, skip=()):
    loss = sum((p.to(torch.float64) ** 2).sum() for i, p in enumerate(params) if i not in skip)
    loss.backward()
    opt.step()


def _state_tensor_bytes(opt, key):
    return sum(s[key].numel() * s[key].element_size() for s in opt.state.values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_adamw_state_is_two_moments_plus_step(dtype):
    params = _params(dtype)
    opt = torch.optim.AdamW(params, lr=1e-2)
    assert optimizer_state_bytes(opt) == 0  # lazily allocated: nothing before the first step
    _one_step(opt, params)
    numel = sum(p.numel() for p in params)
    element = torch.tensor([], dtype=dtype).element_size()
    assert len(opt.state) == len(params)
    step_bytes = _state_tensor_bytes(opt, "step")  # a small tensor per parameter in torch 2.x
    assert optimizer_state_bytes(opt) == 2 * numel * element + step_bytes
    # a second step allocates nothing new
    _one_step(opt, params)
    assert optimizer_state_bytes(opt) == 2 * numel * element + step_bytes


def test_adamw_skips_parameters_without_gradients():
    params = _params()
    opt = torch.optim.AdamW(params, lr=1e-2)
    _one_step(opt, params, skip={0})  # params[0] gets no gradient, hence no state
    assert params[0].grad is None and params[0] not in opt.state
    numel = sum(p.numel() for p in params[1:])
    assert optimizer_state_bytes(opt) == 2 * numel * 4 + _state_tensor_bytes(opt, "step")


def test_amsgrad_adds_a_third_moment():
    params = _params()
    opt = torch.optim.AdamW(params, lr=1e-2, amsgrad=True)
    _one_step(opt, params)
    numel = sum(p.numel() for p in params)
    assert optimizer_state_bytes(opt) == 3 * numel * 4 + _state_tensor_bytes(opt, "step")


def test_sgd_without_momentum_keeps_no_state():
    params = _params()
    opt = torch.optim.SGD(params, lr=0.1)
    _one_step(opt, params)
    assert optimizer_state_bytes(opt) == 0


def test_sgd_with_momentum_keeps_one_buffer():
    params = _params()
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    _one_step(opt, params)
    assert optimizer_state_bytes(opt) == sum(p.numel() for p in params) * 4
