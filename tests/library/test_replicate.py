"""`replicate` (fsdp_mini.replicate, PyTorch's composable DDP) on its own and beside `fully_shard`: parity with
one process and with PyTorch's `torch.distributed._composable.replicate` + `fully_shard` on gloo, plain
parameters, bytes per step derived from the shapes, nothing reduced twice, gradient accumulation, rank 0's
values at the first forward, and clear errors before any collective.

The composition is CS336's FSDP handout's (assignment 2): the blocks sharded, the rest (embeddings, the
final norm, the tied head) replicated as plain tensors with all-reduced gradients.
"""
from __future__ import annotations

import math
from collections import Counter
from contextlib import nullcontext

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor

from fsdp_mini import FSDP, CommLog, DistributedDataParallel, full_state_dict, launch
from fsdp_mini.fsdp._fully_shard.fully_shard import FSDPModule, fully_shard
from fsdp_mini._composable.replicate import ReplicateModule, replicate, replicated_parameters
from expect import error_text
from small_model import TinyConfig, TinyLM, batch, rank_rows, train
from launch_cases import run_cases

CFG = TinyConfig()
STEPS, BATCH = 3, 12  # 12 rows split evenly over 2 and 3 ranks
TOL = dict(rtol=1e-5, atol=1e-6)
ROOT_NAMES = ["pos", "embed.weight", "norm.weight"]  # TinyLM's parameters outside its blocks (head = embed)


def make_optimizer(name, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    return torch.optim.AdamW(params, lr=1e-2, eps=1e-3, weight_decay=0.1)  # eps: see tests/library/test_ddp.py


def full_weights(model) -> dict[str, torch.Tensor]:
    """PyTorch's model: each DTensor gathered whole, plain tensors as they are."""
    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
            for k, v in model.state_dict().items()}


def composed(model, order="blocks first", **kwargs):
    """fully_shard each block and replicate the root (either order: replicate collects at the first forward)."""
    if order == "replicate first":
        replicate(model, **kwargs)
    for block in model.blocks:
        fully_shard(block)
    if order == "blocks first":
        replicate(model, **kwargs)
    return model


def pytorch_composed(model, which="composable"):
    """PyTorch 2.13 has two: the composable DDP (`torch.distributed._composable.replicate`, what fsdp_mini's
    mirrors) and the FSDP2-era one (`_composable.replicate_with_fsdp.replicate`: DTensor(Replicate()) params)."""
    from torch.distributed._composable import replicate as composable_replicate
    from torch.distributed._composable.replicate_with_fsdp import replicate as fsdp2_era_replicate
    from torch.distributed.fsdp import fully_shard as torch_fully_shard

    for block in model.blocks:
        torch_fully_shard(block)
    return (composable_replicate if which == "composable" else fsdp2_era_replicate)(model)


# --- parity: one process, PyTorch ---------------------------------------------------------------------

def _parity():
    out = {}
    for opt_name in ("sgd", "adamw"):
        for order in ("blocks first", "replicate first"):
            model = composed(TinyLM(CFG), order)
            losses = train(model, make_optimizer(opt_name, model.parameters()), CFG, STEPS, BATCH)
            out[opt_name, order] = (losses, full_state_dict(model))
        for which in ("composable", "fsdp2-era"):
            model = pytorch_composed(TinyLM(CFG), which)
            out[opt_name, f"pytorch {which}"] = (
                train(model, make_optimizer(opt_name, model.parameters()), CFG, STEPS, BATCH), full_weights(model))
    model = replicate(TinyLM(CFG), impl="ring")  # replicate alone: DDP applied in place
    out["sgd", "alone, ring"] = (train(model, make_optimizer("sgd", model.parameters()), CFG, STEPS, BATCH),
                                 full_weights(model))
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_composed_with_fully_shard_matches_one_process_and_pytorch(world, no_orphans):
    results = launch(_parity, world, timeout=150)
    for opt_name in ("sgd", "adamw"):
        ref = TinyLM(CFG)
        ref_losses = train(ref, make_optimizer(opt_name, ref.parameters()), CFG, STEPS, BATCH)
        cases = ["blocks first", "replicate first", "pytorch composable", "pytorch fsdp2-era"] + (
            ["alone, ring"] if opt_name == "sgd" else [])
        for case in cases:
            mean = torch.tensor([r[opt_name, case][0] for r in results]).mean(0)
            torch.testing.assert_close(mean, torch.tensor(ref_losses), **TOL, msg=lambda m: f"{opt_name} {case}: {m}")
            for rank, r in enumerate(results):
                sd = r[opt_name, case][1]
                assert list(sd) == list(ref.state_dict())
                for k, v in ref.state_dict().items():
                    torch.testing.assert_close(sd[k], v, **TOL, msg=lambda m: f"{opt_name} {case} rank {rank} {k}: {m}")
        for r in results:  # ours against PyTorch's on the same rank: the same local losses and weights
            ours = r[opt_name, "blocks first"]
            for which in ("composable", "fsdp2-era"):
                theirs = r[opt_name, f"pytorch {which}"]
                torch.testing.assert_close(torch.tensor(ours[0]), torch.tensor(theirs[0]), **TOL)
                for k, v in theirs[1].items():
                    torch.testing.assert_close(ours[1][k], v, **TOL)


# --- what a user sees: plain parameters, names, the class ---------------------------------------------

def _what_it_holds():
    model = composed(TinyLM(CFG))
    before_forward = replicated_parameters(model)
    train(model, make_optimizer("sgd", model.parameters()), CFG, 1, BATCH)
    kinds = {name: (type(p).__name__, isinstance(p, DTensor)) for name, p in model.named_parameters()}
    theirs = {}
    for which in ("composable", "fsdp2-era"):
        torch_model = pytorch_composed(TinyLM(CFG), which)
        train(torch_model, make_optimizer("sgd", torch_model.parameters()), CFG, 1, BATCH)
        theirs[which] = (type(torch_model.pos).__name__, type(torch_model).__name__)
    return (before_forward, replicated_parameters(model), kinds, type(model).__name__,
            isinstance(model, ReplicateModule), isinstance(model, TinyLM), list(model.state_dict()), theirs)


def test_replicated_parameters_stay_plain_tensors_and_blocks_become_dtensors(no_orphans):
    before, after, kinds, cls, is_replicate, is_tinylm, keys, theirs = launch(_what_it_holds, 2, timeout=90)[0]
    # PyTorch's composable DDP keeps plain parameters too (its class name: DDP<Class>); its FSDP2-era
    # replicate makes them DTensors (Replicate()) and names the class Replicate<Class>, as fsdp_mini does
    assert theirs == {"composable": ("Parameter", "DDPTinyLM"), "fsdp2-era": ("DTensor", "ReplicateTinyLM")}
    assert before == []  # collected at the first forward, as PyTorch's replicate does
    assert after == ROOT_NAMES  # the tied head counts once, under its first name
    for name, (kind, is_dtensor) in kinds.items():
        in_block = name.startswith("blocks.")
        assert is_dtensor == in_block, name
        if not in_block:
            assert kind == "Parameter", name
    assert (cls, is_replicate, is_tinylm) == ("ReplicateTinyLM", True, True)
    assert keys == list(TinyLM(CFG).state_dict())  # the model's own keys: nothing is wrapped


# --- bytes per step: derived from the shapes ----------------------------------------------------------

def _bytes(bucket_cap_mb, alias, ignore_norm):
    model = TinyLM(CFG)
    if alias:  # the root reaches a block's submodule under a second name
        model.shortcut = model.blocks[0].up
    for block in model.blocks:
        fully_shard(block)
    replicate(model, ignored_modules=[model.norm] if ignore_norm else None, bucket_cap_mb=bucket_cap_mb)
    opt = make_optimizer("sgd", model.parameters())
    train(model, opt, CFG, 1, BATCH)
    with CommLog() as log:
        train(model, opt, CFG, 1, BATCH)
    return Counter((r.op, r.nbytes) for r in log.records)


def expected_bytes(world, root_params, per_bucket):
    """Each block (its own fully_shard root, so it keeps its parameters from forward into backward, as
    FSDP2 does): one AllGather and one ReduceScatter of its parameters' chunks padded to ceil(rows / n) rows,
    n of them; the replicated parameters: one AllReduce of all of them (`per_bucket`: one per parameter)."""
    out = Counter()
    for block in TinyLM(CFG).blocks:
        nbytes = 4 * world * sum(math.ceil(p.shape[0] / world) * math.prod(p.shape[1:]) for p in block.parameters())
        out["all_gather", nbytes] += 1
        out["reduce_scatter", nbytes] += 1
    if per_bucket:
        out.update(("all_reduce", 4 * p.numel()) for p in root_params)
    else:
        out["all_reduce", 4 * sum(p.numel() for p in root_params)] += 1
    return out


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("bucket_cap_mb, alias, ignore_norm", [(25, False, False), (1e-9, True, False),
                                                                (25, True, True)])
def test_bytes_per_step_follow_from_the_shapes_and_nothing_is_reduced_twice(world, bucket_cap_mb, alias, ignore_norm,
                                                                             no_orphans):
    got = launch(_bytes, world, args=(bucket_cap_mb, alias, ignore_norm), timeout=120)
    params = dict(TinyLM(CFG).named_parameters())
    root = [params[n] for n in ROOT_NAMES if not (ignore_norm and n == "norm.weight")]
    for counts in got:
        assert counts == expected_bytes(world, root, per_bucket=bucket_cap_mb < 1)


def _issue_order():
    from fsdp_mini.flight_recorder import RECORDER

    model = composed(TinyLM(CFG), bucket_cap_mb=1e-9)  # one bucket per parameter
    opt = make_optimizer("sgd", model.parameters())
    train(model, opt, CFG, 1, BATCH)
    RECORDER.reset()
    train(model, opt, CFG, 1, BATCH)
    return [(e.op, math.prod(e.shapes[0])) for e in RECORDER.entries()]


def test_a_full_bucket_travels_while_backward_goes_on_through_the_blocks(no_orphans):
    """Backward reaches the final norm first: its bucket's AllReduce is issued before the blocks' ReduceScatters
    (overlap). The token table (also the head: its gradient is complete only once the embedding's part is in)
    and the position table come last; buckets start in index order (reverse registration: embed, then pos)."""
    world = 2
    # the flight recorder keeps each collective's input: a block's padded shard for its AllGather, all of
    # its padded chunks for its ReduceScatter
    shard = [sum(math.ceil(p.shape[0] / world) * math.prod(p.shape[1:]) for p in b.parameters())
             for b in TinyLM(CFG).blocks]
    padded = [world * n for n in shard]
    expected = ([("all_gather", n) for n in shard]
                + [("all_reduce", CFG.width)]
                + [("reduce_scatter", n) for n in reversed(padded)]
                + [("all_reduce", CFG.vocab * CFG.width), ("all_reduce", CFG.context * CFG.width)])
    for order in launch(_issue_order, world, timeout=90):
        assert order == expected


# --- gradient accumulation ----------------------------------------------------------------------------

MICRO = 2  # micro-batches per optimizer step


def _accumulation_step(model, opt, step, paused_while):
    """One optimizer step over MICRO micro-batches, syncing only on the last (`paused_while(paused)`: the context
    a micro-batch's forward and backward run in); returns the losses and, per micro-batch, the collectives its
    backward issued (ours only)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    losses, ops = [], []
    for micro in range(MICRO):
        x, y = (rank_rows(t, rank, world) for t in batch(CFG, BATCH, step * MICRO + micro))
        with paused_while(micro < MICRO - 1):
            loss = model(x, y)
            with CommLog() as log:
                loss.backward()
        losses.append(loss.item())
        ops.append(sorted({r.op for r in log.records}))
    opt.step()
    opt.zero_grad()
    return losses, ops


def _accumulate(which):
    model = composed(TinyLM(CFG)) if which == "ours" else pytorch_composed(TinyLM(CFG))

    def paused_while(paused):
        model.set_requires_gradient_sync(not paused)  # the replicated parameters only, as in PyTorch
        for block in model.blocks:
            block.set_requires_gradient_sync(not paused)
        return nullcontext()

    opt = make_optimizer("sgd", model.parameters())
    steps = [_accumulation_step(model, opt, step, paused_while) for step in range(STEPS)]
    weights = full_state_dict(model) if which == "ours" else full_weights(model)
    return steps, weights


def _only_replicate_paused():
    """Pause replicate alone, with DDP's `no_sync()`: the blocks still reduce-scatter, the replicated parameters
    do not all-reduce until the last micro-batch."""
    model = composed(TinyLM(CFG))
    opt = make_optimizer("sgd", model.parameters())
    steps = [_accumulation_step(model, opt, step, lambda paused: model.no_sync() if paused else nullcontext())
             for step in range(STEPS)]
    return steps, full_state_dict(model)


def test_gradient_accumulation_without_sync_matches_one_process_and_pytorch(no_orphans):
    ref = TinyLM(CFG)
    opt = make_optimizer("sgd", ref.parameters())
    for step in range(STEPS):
        for micro in range(MICRO):
            ref(*batch(CFG, BATCH, step * MICRO + micro)).backward()
        opt.step()
        opt.zero_grad()
    runs = run_cases(_accumulate, ("ours", "pytorch"), 2, timeout=170)  # ours and PyTorch's, one launch
    ours, theirs = runs["ours"], runs["pytorch"]
    alone = launch(_only_replicate_paused, 2, timeout=120)
    for rank in range(2):
        steps, weights = ours[rank]
        for _, ops in steps:
            # paused: nothing at all; then the blocks' ReduceScatters and the replicated parameters' AllReduce
            # (each block is a fully_shard root, so it kept its parameters: no AllGather in backward)
            assert ops == [[], ["all_reduce", "reduce_scatter"]]
        torch.testing.assert_close(torch.tensor([s[0] for s in steps]), torch.tensor([s[0] for s in theirs[rank][0]]),
                                   **TOL)
        for k, v in ref.state_dict().items():
            torch.testing.assert_close(weights[k], v, **TOL, msg=lambda m: f"ours rank {rank} {k}: {m}")
            torch.testing.assert_close(theirs[rank][1][k], v, **TOL, msg=lambda m: f"pytorch rank {rank} {k}: {m}")
            torch.testing.assert_close(alone[rank][1][k], v, **TOL, msg=lambda m: f"replicate paused {k}: {m}")
        for _, ops in alone[rank][0]:
            assert ops == [["reduce_scatter"], ["all_reduce", "reduce_scatter"]]


# --- rank 0's values, and clear errors ----------------------------------------------------------------

def _values_from_rank0():
    from torch.distributed._composable import replicate as torch_replicate

    out = {}
    for name, apply in (("ours", replicate), ("pytorch", torch_replicate)):
        torch.manual_seed(dist.get_rank())  # the mistake: every rank draws different weights
        model = nn.Linear(3, 3)
        initial = model.weight.detach().clone()
        apply(model)
        model(torch.ones(1, 3))  # both broadcast rank 0's values at the first forward
        out[name] = (initial, model.weight.detach().clone())
    return out


def test_every_rank_starts_from_rank0s_values_as_in_pytorch(no_orphans):
    results = launch(_values_from_rank0, 2, timeout=90)
    rank0_initial = results[0]["ours"][0]
    assert not torch.equal(results[1]["ours"][0], rank0_initial)  # they did differ
    for r in results:
        for name in ("ours", "pytorch"):
            assert torch.equal(r[name][1], rank0_initial), name


def _call_errors():
    """Every collective object is built on both ranks; the mistakes run on rank 1 only: had replicate entered a
    collective, rank 1 would wait for rank 0 forever and the launch would time out."""
    flat = FSDP(nn.Sequential(nn.Linear(4, 4)))
    ddp = DistributedDataParallel(nn.Linear(4, 4))
    sharded = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    fully_shard(sharded[0])
    all_sharded = nn.Sequential(nn.Linear(4, 4))
    fully_shard(all_sharded[0])
    if dist.get_rank() == 0:
        return None
    out = {}
    out["flat FSDP"] = error_text(lambda: replicate(flat))
    out["DDP inside"] = error_text(lambda: replicate(nn.Sequential(ddp)))
    out["fully_shard"] = error_text(lambda: replicate(sharded[0]))
    twice = replicate(nn.Linear(4, 4))
    out["twice"] = error_text(lambda: replicate(twice))
    inner = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    replicate(inner[1])
    out["nested"] = error_text(lambda: replicate(inner))
    out["no parameters"] = error_text(lambda: replicate(nn.ReLU()))
    out["frozen"] = error_text(lambda: replicate(nn.Linear(4, 4).requires_grad_(False)))
    out["all sharded"] = error_text(lambda: replicate(all_sharded))
    out["fully_shard after"] = error_text(lambda: fully_shard(replicate(nn.Linear(4, 4))))
    out["bucket"] = error_text(lambda: replicate(nn.Linear(4, 4), bucket_cap_mb=0))
    out["impl"] = error_text(lambda: replicate(nn.Linear(4, 4), impl="rings"))
    out["device_id type"] = error_text(lambda: replicate(nn.Linear(4, 4), device_id="cpu"))
    out["device_id"] = error_text(lambda: replicate(nn.Linear(4, 4), device_id=torch.device("meta")))
    out["ignored"] = error_text(lambda: replicate(nn.Linear(4, 4), ignored_modules=[nn.Linear(2, 2)]))
    return out


def test_bad_calls_fail_at_the_call_before_any_collective(no_orphans):
    out = launch(_call_errors, 2, timeout=90)[1]
    expected = {
        "flat FSDP": "wrapped by FSDP (fsdp_mini's flat FSDP or DDP)",
        "DDP inside": "wrapped by DistributedDataParallel",
        "fully_shard": "replicate was given a FSDPLinear managed by fully_shard",
        "twice": "replicate was already applied to this module",
        "nested": "replicate was already applied to 1 (ReplicateLinear): its parameters would be all-reduced twice",
        "no parameters": "replicate was given a ReLU with no trainable parameters",
        "frozen": "replicate was given a Linear with no trainable parameters",
        "all sharded": "replicate was given a Sequential with no trainable parameters outside fully_shard units",
        "fully_shard after": "fully_shard was given a module wrapped by ReplicateLinear (fsdp_mini's flat FSDP or "
                             "DDP, or replicate): the two designs do not mix; apply fully_shard to the plain model "
                             "(beside replicate: fully_shard the blocks, replicate their parent)",
        "bucket": "bucket_cap_mb must be a positive number of MiB, got 0",
        "impl": "impl must be one of ('builtin', 'ring'), got 'rings'",
        "device_id type": "device_id must be an int or a torch.device, got str",
        "device_id": "device_id meta is not this rank's device cpu (rank 1)",
        "ignored": "ignored_modules must hold submodules of the Linear given to replicate, got Linear",
    }
    assert set(out) == set(expected)
    for case, text in expected.items():
        assert text in out[case], f"{case}: {out[case]}"


def _first_forward_errors():
    rank = dist.get_rank()
    out = {}
    differs = replicate(nn.Linear(4, 4 + rank))  # every rank builds its own shape: the mistake
    out["shapes"] = error_text(lambda: differs(torch.ones(1, 4)))
    torch.manual_seed(0)
    taken = nn.Sequential(nn.Linear(4, 4))
    replicate(taken)
    fully_shard(taken[0])  # after replicate: the unit takes every parameter
    out["taken"] = error_text(lambda: taken(torch.ones(1, 4)))
    return out


def test_ranks_that_replicate_different_models_are_named_at_the_first_forward(no_orphans):
    for out in launch(_first_forward_errors, 2, timeout=90):
        assert out["shapes"].startswith("ranks [1] wrap a different set of parameters to replicate (Linear) than "
                                        "rank 0 (every rank must build the same model"), out["shapes"]
        assert "Sequential has no trainable parameters left outside fully_shard units" in out["taken"], out["taken"]


def test_replicate_needs_torch_distributed():
    assert "replicate needs torch.distributed" in error_text(lambda: replicate(nn.Linear(2, 2)), RuntimeError)


# --- a process group of its own; nothing kept alive ---------------------------------------------------

def _in_a_group():
    """Ranks 0 and 1 replicate over their own group and train on halves of the batch; rank 2 trains nothing
    (it only takes part in creating the group, as every rank must)."""
    import gc
    import weakref

    group = dist.new_group([0, 1])
    if dist.get_rank() == 2:
        return None
    model = replicate(TinyLM(CFG), process_group=group)
    opt = make_optimizer("adamw", model.parameters())
    losses = []
    for step in range(STEPS):
        loss = model(*(rank_rows(t, dist.get_rank(), 2) for t in batch(CFG, BATCH, step)))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    ref = weakref.ref(model)
    del model, opt, loss
    gc.collect()
    return losses, weights, ref() is None


def test_replicate_over_a_process_group_and_the_model_is_freed_when_dropped(no_orphans):
    ref = TinyLM(CFG)
    ref_losses = train(ref, make_optimizer("adamw", ref.parameters()), CFG, STEPS, BATCH)
    results = launch(_in_a_group, 3, timeout=120)
    assert results[2] is None
    mean = torch.tensor([r[0] for r in results[:2]]).mean(0)
    torch.testing.assert_close(mean, torch.tensor(ref_losses), **TOL)
    for losses, weights, freed in results[:2]:
        for k, v in ref.state_dict().items():
            torch.testing.assert_close(weights[k], v, **TOL)
        assert freed  # replicate's state lives in the module, not in a global table that would keep it alive
