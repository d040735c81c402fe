"""What each strategy communicates per step (byte-exact, from first principles), what it keeps in
memory (tracked), and the clear errors it raises on bad input before any collective."""
import math
from collections import Counter

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from fsdp_mini import FSDP, CommLog, MixedPrecision, launch
from fsdp_mini.comm_log import ring_model_sent
from small_model import Block, TinyConfig, TinyLM, batch, rank_rows, train

CFG = TinyConfig()


def _frozen_model(cfg=CFG):
    model = TinyLM(cfg)
    model.blocks[0].norm.weight.requires_grad_(False)  # block 0 gets a second, frozen, flat parameter
    return model


def _unit_params(cfg=CFG):
    """(unit name, [(numel, requires_grad)] per flat parameter), counted from the plain model."""
    model = _frozen_model(cfg)
    blocks = [(f"blocks.{i}", b) for i, b in enumerate(model.blocks)]
    in_blocks = {id(p) for _, b in blocks for p in b.parameters()}

    def split(params):
        groups = {}
        for p in params:
            groups.setdefault(p.requires_grad, []).append(p.numel())
        return [(sum(v), rg) for rg, v in sorted(groups.items(), reverse=True)]

    root = split(p for p in model.parameters() if id(p) not in in_blocks)  # tied head counted once
    return [("", root)] + [(name, split(b.parameters())) for name, b in blocks]


def expected_records(strategy: str, world: int, shard_size: int | None, one_bucket: bool = True) -> Counter:
    """The documented per-step formula (fsdp_mini.fsdp.fully_sharded_data_parallel), as a multiset of (op, S bytes, group size).

    NO_SHARD's gradients go in buckets: this model is far below the default 25 MiB, so all of them make
    one AllReduce; with a cap below the smallest unit (`one_bucket=False`) every unit is its own bucket."""
    n = {"NO_SHARD": 1, "SHARD_GRAD_OP": world, "FULL_SHARD": world}.get(strategy, shard_size)
    replicas = world // n
    out = Counter()
    if n == 1:
        sizes = [numel * 4 for _, flats in _unit_params() for numel, trainable in flats if trainable]
        for nbytes in ([sum(sizes)] if one_bucket else sizes):
            out[("all_reduce", nbytes, world)] += 1
        return out
    for unit, flats in _unit_params():
        for numel, trainable in flats:
            P = math.ceil(numel / n) * n * 4  # padded, fp32
            gathers = 0 if n == 1 else (2 if strategy in ("FULL_SHARD", "HYBRID_SHARD") and unit else 1)
            out[("all_gather", P, n)] += gathers
            if trainable:
                if n > 1:
                    out[("reduce_scatter", P, n)] += 1
                if replicas > 1:
                    out[("all_reduce", P // n, replicas)] += 1
    return +out


CASES = [("NO_SHARD", None), ("SHARD_GRAD_OP", None), ("FULL_SHARD", None), ("HYBRID_SHARD", 2),
         ("_HYBRID_SHARD_ZERO2", 2), ("NO_SHARD, bucket per unit", None)]
TINY_BUCKETS = 1e-6  # MiB: about 1 byte, so every unit fills a bucket of its own


def _comm_worker(impl):
    out = {}
    for case, shard_size in CASES:
        strategy, _, per_unit = case.partition(", ")
        cap = TINY_BUCKETS if per_unit else 25
        model = FSDP(_frozen_model(), strategy, wrap=(Block,), shard_size=shard_size, impl=impl, bucket_cap_mb=cap)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        logs = []
        for step in range(2):  # step 0 records the execution order, step 1 prefetches: same bytes
            with CommLog() as log:
                train(model, opt, CFG, 1, 12, seed=step)
            logs.append([(r.op, r.nbytes, r.group_size, r.sent) for r in log.records])
        out[case] = logs
    return out


@pytest.mark.parametrize("impl", ["builtin", "ring"])
def test_comm_per_step_equals_the_documented_formula(impl, no_orphans):
    for rank, res in enumerate(launch(_comm_worker, 4, args=(impl,), timeout=120)):
        for case, shard_size in CASES:
            strategy, _, per_unit = case.partition(", ")
            want = expected_records(strategy, 4, shard_size, one_bucket=not per_unit)
            for step, records in enumerate(res[case]):
                got = Counter((op, nbytes, size) for op, nbytes, size, _ in records)
                assert got == want, f"rank {rank} {case} step {step}"
                for op, nbytes, size, sent in records:
                    assert sent == ring_model_sent(op, nbytes // 4, 4, size), (case, op)


def _memory_worker():
    cfg = TinyConfig(depth=4)
    out = {}
    for name, strategy, prefetch in (("full", "FULL_SHARD", True), ("full_no_prefetch", "FULL_SHARD", False),
                                     ("grad_op", "SHARD_GRAD_OP", True), ("ddp", "NO_SHARD", True)):
        model = FSDP(TinyLM(cfg), strategy, wrap=(Block,), prefetch=prefetch)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        train(model, opt, cfg, 1, 8)  # records the order that prefetch follows
        model.gathered_memory.reset_peak()
        x, y = (rank_rows(t, dist.get_rank(), 2) for t in batch(cfg, 8, 1))
        model(x, y).backward()
        stats = model.memory_stats(opt)
        out[name] = (stats, [sum(h.nbytes for h in u.handles) for u in model.units])
    return out


def test_memory_is_tracked_per_strategy(no_orphans):
    res = launch(_memory_worker, 2, timeout=120)[0]
    full, units = res["full"]
    root, block = units[0], units[1]
    assert all(u == block for u in units[1:])
    total = sum(units)
    assert full["params"] == total // 2 and full["grads"] == total // 2
    assert full["optimizer"] == 2 * total // 2 + 4 * len(units)  # exp_avg, exp_avg_sq; a 4-byte step each
    assert full["unsharded_now"] == 0
    assert full["unsharded_peak"] == root + 2 * block, "root + the current block + the prefetched one"
    assert res["full_no_prefetch"][0]["unsharded_peak"] == root + block
    assert res["grad_op"][0]["unsharded_peak"] == total, "ZeRO-2 holds every unit from forward to backward"
    ddp = res["ddp"][0]
    assert ddp["unsharded_peak"] == 0, "NO_SHARD computes on its own full copy: nothing is gathered"
    assert ddp["params"] == 4 * TinyConfig(depth=4).numel()


def _errors_worker():
    def message(fn):
        try:
            fn()
        except (ValueError, RuntimeError) as e:
            return f"{type(e).__name__}: {e}"
        return "no error"

    model = FSDP(TinyLM(CFG), "FULL_SHARD", wrap=(Block,))
    good_sd = model.full_state_dict()
    with CommLog() as log:
        msgs = {
            "shard_size": message(lambda: FSDP(TinyLM(CFG), "HYBRID_SHARD", wrap=(Block,), shard_size=3)),
            "shard_size_not_hybrid": message(lambda: FSDP(TinyLM(CFG), "FULL_SHARD", shard_size=2)),
            "wrap_matches_nothing": message(lambda: FSDP(TinyLM(CFG), wrap=(nn.Conv2d,))),
            "wrap_not_a_class": message(lambda: FSDP(TinyLM(CFG), wrap=("Block",))),
            "zero1": message(lambda: FSDP(TinyLM(CFG), "ZERO1")),
            "impl": message(lambda: FSDP(TinyLM(CFG), impl="mpi")),
            "bucket_cap_mb": message(lambda: FSDP(TinyLM(CFG), "NO_SHARD", bucket_cap_mb=0)),
            "mixed_precision": message(lambda: FSDP(TinyLM(CFG), mixed_precision=torch.bfloat16)),
            "wrapped_twice": message(lambda: FSDP(model)),
            "wrong_device": message(lambda: model(torch.zeros(2, 4, dtype=torch.long, device="meta"))),
            "missing_key": message(lambda: model.load_full_state_dict({k: v for k, v in good_sd.items()
                                                                       if k != "norm.weight"})),
            "unexpected_key": message(lambda: model.load_full_state_dict({**good_sd, "extra.weight": torch.zeros(1)})),
            "wrong_shape": message(lambda: model.load_full_state_dict({**good_sd, "norm.weight": torch.zeros(3)})),
        }
    msgs["collectives issued"] = len(log.records)
    return msgs


def test_bad_input_is_a_clear_error_before_any_collective(no_orphans):
    for msgs in launch(_errors_worker, 2, timeout=60):
        assert msgs.pop("collectives issued") == 0
        expected = {
            "shard_size": "shard_size=3 must be a positive divisor of the world size 2",
            "shard_size_not_hybrid": "shard_size applies to the hybrid strategies only",
            "wrap_matches_nothing": "wrap class Conv2d matches no submodule of TinyLM",
            "wrap_not_a_class": "wrap must hold nn.Module classes",
            "zero1": "fsdp_mini.optim.zero",
            "impl": "impl must be one of",
            "bucket_cap_mb": "bucket_cap_mb must be a positive number of MiB, got 0",
            "mixed_precision": "mixed_precision must be a MixedPrecision",
            "wrapped_twice": "already wrapped",
            "wrong_device": "input on meta, but this rank computes on cpu",
            "missing_key": "missing keys ['norm.weight']",
            "unexpected_key": "unexpected keys ['extra.weight']",
            "wrong_shape": f"norm.weight: shape (3,) in the state dict, ({CFG.width},) in the model",
        }
        for case, text in expected.items():
            assert text in msgs[case], f"{case}: {msgs[case]}"


def _mismatch_worker():
    cfg = CFG.but(depth=CFG.depth + 1) if dist.get_rank() == 1 else CFG
    try:
        FSDP(TinyLM(cfg), wrap=(Block,))
    except ValueError as e:
        return str(e)


def test_ranks_wrapping_different_models_fail_together(no_orphans):
    for msg in launch(_mismatch_worker, 3, timeout=60):
        assert msg is not None and "ranks [1] wrap a different model" in msg


def test_fsdp_needs_a_process_group():
    with pytest.raises(RuntimeError, match="fsdp_mini.init"):
        FSDP(TinyLM(CFG))


def _summon_worker():
    model = FSDP(TinyLM(CFG), "FULL_SHARD", wrap=(Block,))
    with model.summon_full_params():
        inside = model.module.blocks[1].up.weight.clone()
    return inside, model.gathered_memory.current


def test_summon_full_params_shows_the_original_parameters(no_orphans):
    expected = TinyLM(CFG).blocks[1].up.weight.detach()
    for inside, after in launch(_summon_worker, 2, timeout=60):
        torch.testing.assert_close(inside, expected, rtol=0, atol=0)
        assert after == 0
