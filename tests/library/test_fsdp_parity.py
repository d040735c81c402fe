"""Parity: every strategy trains exactly like one process on the whole batch, and like PyTorch itself
(its DistributedDataParallel, and its FSDP2 `fully_shard` per block and on the root, on a 1-D or a
(replicate, shard) mesh).

SGD with momentum catches a wrong averaging factor (Adam would not: its update is invariant to a
gradient scale). AdamW uses eps=1e-3: with the default 1e-8, Adam divides rounding noise of gradients
that are truly ~0 (a dead GELU unit; on the course's GPT, the key bias, which softmax ignores) by ~1e-8
and amplifies it past rtol=1e-5 even between two *single-process* runs that only split the batch
differently.
"""
from functools import partial

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard as torch_fully_shard
from torch.distributed.tensor import DTensor

from fsdp_mini import FSDP, launch
from small_model import Block, TinyConfig, TinyLM, train

CFG = TinyConfig()
STEPS, BATCH = 5, 12  # 12 rows split evenly over 1, 2, 3 and 4 ranks
OPTIMIZERS = {
    "sgd": partial(torch.optim.SGD, lr=0.1, momentum=0.9),
    "adamw": partial(torch.optim.AdamW, lr=1e-2, weight_decay=0.1, eps=1e-3),
}
TOL = dict(rtol=1e-5, atol=1e-6)


def _cases(world: int) -> list[tuple[str, str, str, int | None]]:
    """(strategy, optimizer, impl, shard_size) to run at this world size."""
    strategies = ["NO_SHARD", "SHARD_GRAD_OP", "FULL_SHARD", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"]
    shard = {1: 1, 2: 1, 3: 3, 4: 2}[world]  # world 4: a 2 x 2 grid; world 2: two replicas of one shard
    cases = [(s, o, "builtin", shard if "HYBRID" in s else None) for s in strategies for o in OPTIMIZERS]
    if world > 1:
        cases += [(s, "sgd", "ring", shard if "HYBRID" in s else None) for s in ("FULL_SHARD", "HYBRID_SHARD")]
    return cases


def _fsdp_worker(cases):
    out = {}
    for strategy, opt, impl, shard_size in cases:
        model = FSDP(TinyLM(CFG), strategy, wrap=(Block,), shard_size=shard_size, impl=impl)
        losses = train(model, OPTIMIZERS[opt](model.parameters()), CFG, STEPS, BATCH)
        sd = model.full_state_dict()
        out[(strategy, opt, impl, shard_size)] = (losses, sd if dist.get_rank() == 0 else None,
                                                  sum(float(v.double().sum()) for v in sd.values()))
    return out


@pytest.fixture(scope="module")
def reference():
    """Single-process training on the whole batch, one run per optimizer."""
    out = {}
    for name, opt in OPTIMIZERS.items():
        model = TinyLM(CFG)
        losses = train(model, opt(model.parameters()), CFG, STEPS, BATCH)
        out[name] = (losses, model.state_dict())
    return out


def _mean_losses(results, case):
    per_rank = torch.tensor([r[case][0] for r in results])
    return per_rank.mean(0)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_every_strategy_matches_single_process(world, reference, no_orphans):
    cases = _cases(world)
    results = launch(_fsdp_worker, world, args=(cases,), timeout=150, local_world_size=2 if world == 4 else None)
    for case in cases:
        ref_losses, ref_sd = reference[case[1]]
        torch.testing.assert_close(_mean_losses(results, case), torch.tensor(ref_losses), **TOL, msg=lambda m: f"{case}: {m}")
        sd = results[0][case][1]
        assert list(sd) == list(ref_sd), case
        for k in ref_sd:
            torch.testing.assert_close(sd[k], ref_sd[k], **TOL, msg=lambda m: f"{case} {k}: {m}")
        checksums = {r[case][2] for r in results}
        assert len(checksums) == 1, f"{case}: ranks disagree on the full state dict"


def pytorch_wrapped(model: TinyLM, strategy: str) -> nn.Module:
    """`model` under PyTorch's own form of `strategy`: DDP for NO_SHARD; else FSDP2 on every block
    (resharding after forward unless SHARD_GRAD_OP) and on the root (FSDP2's default for it), on the whole
    world or, for HYBRID_SHARD, on a (replicate, shard) mesh of 2 x world/2."""
    if strategy == "NO_SHARD":
        return nn.parallel.DistributedDataParallel(model)
    world = dist.get_world_size()
    if strategy == "HYBRID_SHARD":
        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh("cpu", (world,))
    for block in model.blocks:
        torch_fully_shard(block, mesh=mesh, reshard_after_forward=strategy != "SHARD_GRAD_OP")
    return torch_fully_shard(model, mesh=mesh)


def whole_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The unwrapped keys and whole tensors of a DDP or FSDP2 model."""
    inner = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone() for k, v in inner.state_dict().items()}


def _pytorch_worker(strategies):
    out = {}
    for strategy in strategies:
        ours = FSDP(TinyLM(CFG), strategy, wrap=(Block,))
        our_losses = train(ours, OPTIMIZERS["sgd"](ours.parameters()), CFG, STEPS, BATCH)
        theirs = pytorch_wrapped(TinyLM(CFG), strategy)
        their_losses = train(theirs, OPTIMIZERS["sgd"](theirs.parameters()), CFG, STEPS, BATCH)
        out[strategy] = (our_losses, their_losses, ours.full_state_dict(), whole_state(theirs))
    return out


@pytest.mark.parametrize("world,strategies", [
    (2, ["NO_SHARD", "SHARD_GRAD_OP", "FULL_SHARD"]),
    (4, ["FULL_SHARD", "HYBRID_SHARD"]),
])
def test_matches_pytorch_ddp_and_fsdp2(world, strategies, no_orphans):
    results = launch(_pytorch_worker, world, args=(strategies,), timeout=150, local_world_size=2)
    for rank, res in enumerate(results):
        for strategy, (ours, theirs, our_sd, their_sd) in res.items():
            torch.testing.assert_close(torch.tensor(ours), torch.tensor(theirs), **TOL)
            assert list(our_sd) == list(their_sd)
            for k in our_sd:
                torch.testing.assert_close(our_sd[k], their_sd[k], **TOL, msg=lambda m: f"rank {rank} {strategy} {k}: {m}")
