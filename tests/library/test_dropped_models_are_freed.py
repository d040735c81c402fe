"""A model that trained a step is freed once the script drops it, in every engine, as PyTorch's own are.

Gradient hooks live in C++, out of the garbage collector's sight: an engine whose hook held it strongly
stayed in memory with its gathered buffers after `del model` (fsdp_mini.weak_hooks). Each case trains one
step (forward, backward, optimizer step), drops every reference the script held, collects, and asks a weak
reference whether the model and its optimizer are gone. PyTorch's DDP and FSDP2 are checked the same way, so the test also
says what PyTorch does. The optimizer must go too (ZeroRedundancyOptimizer hooks the parameters)."""
from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from fsdp_mini import FSDP, DistributedDataParallel, ShardingStrategy, launch
from fsdp_mini.fsdp._fully_shard.fully_shard import fully_shard
from fsdp_mini._composable.replicate import replicate
from fsdp_mini.optim.zero import ZeroRedundancyOptimizer
from small_model import Block, TinyConfig, TinyLM, batch, rank_rows

CFG = TinyConfig()


def build(engine: str) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = TinyLM(CFG)
    if engine == "FSDP":
        model = FSDP(model, ShardingStrategy.FULL_SHARD, wrap=(Block,))
    elif engine == "FSDP hybrid":
        model = FSDP(model, ShardingStrategy.HYBRID_SHARD, wrap=(Block,))
    elif engine == "fully_shard":
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    elif engine == "replicate":
        replicate(model)
    elif engine == "DistributedDataParallel":
        model = DistributedDataParallel(model)
    elif engine == "torch DDP":
        model = torch.nn.parallel.DistributedDataParallel(model)
    elif engine == "torch fully_shard":
        from torch.distributed.fsdp import fully_shard as torch_fully_shard
        for block in model.blocks:
            torch_fully_shard(block)
        torch_fully_shard(model)
    if engine == "ZeroRedundancyOptimizer":
        return model, ZeroRedundancyOptimizer(model.parameters(), torch.optim.SGD, lr=0.1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def freed_after_a_step(engine: str) -> bool:
    model, optimizer = build(engine)
    tokens, targets = batch(CFG, 4)
    rank, world = dist.get_rank(), dist.get_world_size()
    model(rank_rows(tokens, rank, world), rank_rows(targets, rank, world)).backward()
    optimizer.step()
    refs = [weakref.ref(model), weakref.ref(optimizer)]
    del model, optimizer
    gc.collect()
    return all(ref() is None for ref in refs)


ENGINES = ["FSDP", "FSDP hybrid", "fully_shard", "replicate", "DistributedDataParallel",
           "ZeroRedundancyOptimizer", "torch DDP", "torch fully_shard"]


def run_all() -> dict[str, bool]:
    return {engine: freed_after_a_step(engine) for engine in ENGINES}


@pytest.mark.timeout(120)
def test_every_engine_frees_a_dropped_model_after_a_training_step(no_orphans):
    results = launch(run_all, 4, timeout=100)
    kept = sorted({engine for per_rank in results for engine, freed in per_rank.items() if not freed})
    assert kept == [], f"still alive after del + gc.collect(): {kept}"


def registry_sizes_after_dropped_models(rounds: int) -> tuple[int, int]:
    """fully_shard's two id-keyed tables (which unit holds a parameter, for its errors), after `rounds` models
    were sharded, trained and dropped: what a loop over models (a sweep, a test suite) leaves behind."""
    import sys
    tables = sys.modules["fsdp_mini.fsdp._fully_shard.fully_shard"]
    for _ in range(rounds):
        assert freed_after_a_step("fully_shard")
    return len(tables._MANAGED), len(tables._HOLDERS)


@pytest.mark.timeout(120)
def test_fully_shards_tables_forget_a_dropped_model(no_orphans):
    # before: the original parameters' entries stayed, dead, one per parameter and model (76 after three TinyLMs)
    assert launch(registry_sizes_after_dropped_models, 2, args=(3,), timeout=100) == [(0, 0), (0, 0)]
