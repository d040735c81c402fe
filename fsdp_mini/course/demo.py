"""`python -m fsdp_mini demo`: train one small GPT under every strategy, side by side.

For each strategy: the final loss, how far the trained weights are from single-process training and
from PyTorch's own implementation (DDP or FSDP2 `fully_shard`), what each rank holds in memory, and
how many bytes it sent per step. On an even world of 4 or more, one more row: tensor parallelism inside
pairs of ranks and `fully_shard` across them on a 2-D mesh (lesson 12), against PyTorch's
`parallelize_module` + `fully_shard` on the same mesh. The three claims of the course in one table:
sharding does not change the numbers, it divides the memory, and it pays for that in communication.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from fsdp_mini.comm_log import CommLog
from fsdp_mini.fsdp.fully_sharded_data_parallel import FSDP
from fsdp_mini.rank_environment import get_device
from fsdp_mini.byte_format import format_bytes
from fsdp_mini.memory import optimizer_state_bytes, tensor_bytes
from fsdp_mini.course.models import GPT, Block, GPTConfig, make_batch
from fsdp_mini.course.pytorch_equivalent import pytorch_full_state_dict, shard_per_parameter, wrap_like_pytorch
from fsdp_mini.course.tensor_parallel_plan import (parallelize_gpt, parallelize_gpt_with_pytorch,
                                                   pytorch_gpt_full_state_dict)
from fsdp_mini.tensor.parallel.parallelize import ParallelDims, gather_tensor_parallel
from fsdp_mini.fsdp._fully_shard.fully_shard import gathered_memory, memory_stats
from fsdp_mini.checkpoint.state_dict import full_state_dict
from fsdp_mini.course.train import hybrid_shard_size, local_rows, train
from fsdp_mini.optim.zero import ZeroRedundancyOptimizer

__all__ = ["CFG", "worker", "reference", "table"]

CFG = GPTConfig(n_layer=4)
STEPS, BATCH = 6, 16
STRATEGIES = ["NO_SHARD", "ZERO1", "SHARD_GRAD_OP", "FULL_SHARD", "HYBRID_SHARD"]
PER_PARAMETER = ["SHARD_GRAD_OP", "FULL_SHARD", "HYBRID_SHARD"]  # the same strategies, per-parameter design


def _optimizer(params):
    return torch.optim.AdamW(params, lr=3e-3, weight_decay=0.1, eps=1e-6)


def _global_mean(values: list[float]) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t)
    return (t / dist.get_world_size()).tolist()


def _measure_step(model, opt, tracker=None, rows_of: tuple[int, int] | None = None) -> None:
    """One more forward and backward (no step), so gradients and gathered parameters are alive. `rows_of`:
    (data-parallel rank, data-parallel size) when they are not the global ones (a 2-D mesh)."""
    rank, world = rows_of or (dist.get_rank(), dist.get_world_size())
    x, y = (local_rows(t, rank, world) for t in make_batch(CFG, BATCH, STEPS))
    if tracker is not None:
        tracker.reset_peak()
    model(x, y).backward()


def _run_ours(strategy: str, shard_size: int) -> dict:
    if strategy == "ZERO1":
        model = GPT(CFG).to(get_device())
        opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW, lr=3e-3, weight_decay=0.1, eps=1e-6)
        with CommLog() as log:
            losses = train(model, opt, CFG, STEPS, BATCH)
        _measure_step(model, opt)
        memory = {"params": tensor_bytes(model.parameters()), "grads": tensor_bytes(p.grad for p in model.parameters()),
                  "optimizer": opt.optimizer_state_bytes(), "unsharded_peak": 0}
        sd = {k: v.cpu() for k, v in model.state_dict().items()}
        return {"losses": losses, "sd": sd, "memory": memory, "sent": log.sent / STEPS}
    model = FSDP(GPT(CFG), strategy, wrap=(Block,), shard_size=shard_size if "HYBRID" in strategy else None)
    opt = _optimizer(model.parameters())
    with CommLog() as log:
        losses = train(model, opt, CFG, STEPS, BATCH)
    _measure_step(model, opt, model.gathered_memory)
    return {"losses": losses, "sd": model.full_state_dict(), "memory": model.memory_stats(opt), "sent": log.sent / STEPS}


def _run_per_parameter(strategy: str, shard_size: int) -> dict:
    model = shard_per_parameter(GPT(CFG), strategy, wrap=(Block,), shard_size=shard_size if "HYBRID" in strategy else None)
    opt = _optimizer(model.parameters())
    with CommLog() as log:
        losses = train(model, opt, CFG, STEPS, BATCH)
    _measure_step(model, opt, gathered_memory(model))
    return {"losses": losses, "sd": full_state_dict(model), "memory": memory_stats(model, opt), "sent": log.sent / STEPS}


def tensor_parallel_degree(world: int) -> int | None:
    """The TP degree of the demo's 2-D row: 2 when the world splits into (world / 2) x 2 and the heads into
    two (the course GPT has 2); None (no 2-D row) on an odd world."""
    return 2 if world % 2 == 0 and world > 2 and CFG.n_head % 2 == 0 else None


def _run_2d(with_pytorch: bool) -> dict:
    """Tensor parallel inside each pair of ranks, fully_shard across them (lesson 12)."""
    world = dist.get_world_size()
    tp = tensor_parallel_degree(world)
    mesh = ParallelDims(world // tp, tp, world).build_mesh(get_device().type)
    rows_of = (mesh["dp"].get_local_rank(), mesh["dp"].size())  # a TP group shares its rows of the batch
    model = parallelize_gpt(GPT(CFG).to(get_device()), mesh)
    opt = _optimizer(model.parameters())
    with CommLog() as log:
        losses = train(model, opt, CFG, STEPS, BATCH, rows_of=rows_of)
    _measure_step(model, opt, gathered_memory(model), rows_of=rows_of)
    row = {"strategy": "2-D", "losses": _global_mean(losses), "memory": memory_stats(model, opt),
           "sd": gather_tensor_parallel(model, full_state_dict(model)), "sent": log.sent / STEPS, "vs_pytorch": None}
    if with_pytorch:
        theirs = parallelize_gpt_with_pytorch(GPT(CFG).to(get_device()), mesh)
        train(theirs, _optimizer(theirs.parameters()), CFG, STEPS, BATCH, rows_of=rows_of)
        their_sd = pytorch_gpt_full_state_dict(theirs, mesh)
        row["vs_pytorch"] = max((row["sd"][k].cpu() - their_sd[k]).abs().max().item() for k in their_sd)
    row["sd"] = {k: v.cpu() for k, v in row["sd"].items()}
    return row


def worker(with_pytorch: bool = True) -> list[dict]:
    """Every rank trains every strategy; returns rank 0's view (losses are averaged over ranks)."""
    shard_size = hybrid_shard_size(dist.get_world_size())
    rows = []
    for strategy in STRATEGIES:
        row = _run_ours(strategy, shard_size)
        row["strategy"], row["losses"] = strategy, _global_mean(row["losses"])
        row["vs_pytorch"] = None
        if with_pytorch and strategy != "ZERO1":
            theirs = wrap_like_pytorch(GPT(CFG), strategy, wrap=(Block,), shard_size=shard_size)
            train(theirs, _optimizer(theirs.parameters()), CFG, STEPS, BATCH)
            their_sd = pytorch_full_state_dict(theirs)
            row["vs_pytorch"] = max((row["sd"][k] - their_sd[k]).abs().max().item() for k in their_sd)
        rows.append(row)
    for strategy in PER_PARAMETER:
        row = _run_per_parameter(strategy, shard_size)
        row["strategy"], row["losses"] = f"per-parameter {strategy}", _global_mean(row["losses"])
        row["vs_pytorch"] = None
        if with_pytorch:
            theirs = wrap_like_pytorch(GPT(CFG), strategy, wrap=(Block,), shard_size=shard_size)
            train(theirs, _optimizer(theirs.parameters()), CFG, STEPS, BATCH)
            their_sd = pytorch_full_state_dict(theirs)
            row["vs_pytorch"] = max((row["sd"][k] - their_sd[k]).abs().max().item() for k in their_sd)
        rows.append(row)
    if tensor_parallel_degree(dist.get_world_size()):
        rows.append(_run_2d(with_pytorch))
    return rows


def reference() -> dict:
    """Single-process training on the whole global batch: the numbers every strategy must reproduce."""
    model = GPT(CFG)
    opt = _optimizer(model.parameters())
    losses = train(model, opt, CFG, STEPS, BATCH, shard_batch=False)  # under torchrun too: rank 0 alone
    x, y = make_batch(CFG, BATCH, STEPS)
    model(x, y).backward()
    memory = {"params": tensor_bytes(model.parameters()), "grads": tensor_bytes(p.grad for p in model.parameters()),
              "optimizer": optimizer_state_bytes(opt), "unsharded_peak": 0}
    return {"strategy": "1 process", "losses": losses, "sd": model.state_dict(), "memory": memory, "sent": 0,
            "vs_pytorch": None}


def table(ref: dict, rows: list[dict], world: int) -> str:
    shard_size = hybrid_shard_size(world)
    hybrid = f"HYBRID_SHARD ({world // shard_size}x{shard_size})"
    names = {"NO_SHARD": "NO_SHARD (DDP)", "ZERO1": "ZeRO-1", "SHARD_GRAD_OP": "SHARD_GRAD_OP (ZeRO-2)",
             "FULL_SHARD": "FULL_SHARD (ZeRO-3)", "HYBRID_SHARD": hybrid,
             "per-parameter SHARD_GRAD_OP": "fully_shard, reshard=False", "per-parameter FULL_SHARD": "fully_shard",
             "per-parameter HYBRID_SHARD": f"fully_shard, 2-D mesh {world // shard_size}x{shard_size}"}
    tp = tensor_parallel_degree(world)
    if tp:
        names["2-D"] = f"TP x fully_shard, {world // tp}x{tp}"
    head = (f"{'strategy':<28}{'loss':>8}{'max|dw| vs 1':>14}{'vs PyTorch':>12}{'params':>10}{'grads':>10}"
            f"{'optim':>10}{'gathered':>10}{'sent/step':>11}")
    lines = [head, "-" * len(head)]
    for row in [ref] + rows:
        m = row["memory"]
        diff = max((row["sd"][k] - ref["sd"][k]).abs().max().item() for k in ref["sd"])
        vs_pt = "-" if row["vs_pytorch"] is None else f"{row['vs_pytorch']:.1e}"
        lines.append(f"{names.get(row['strategy'], row['strategy']):<28}{row['losses'][-1]:>8.4f}"
                     f"{diff if row is not ref else 0:>14.1e}{vs_pt:>12}"
                     + "".join(f"{format_bytes(m[k]):>10}" for k in ("params", "grads", "optimizer", "unsharded_peak"))
                     + f"{format_bytes(row['sent']):>11}")
    return "\n".join(lines)
