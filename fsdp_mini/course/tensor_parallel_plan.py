"""The course GPT's tensor-parallel plan (lesson 12), and the 2-D composition: TP inside every block over the
mesh's "tp" dimension, `fully_shard` over its "dp" dimension.

Megatron's split of a transformer block: attention's fused qkv is column parallel (each rank computes its
share of the heads, whole: `stacked=3` cuts q, k and v alike), its output projection row parallel; the MLP's
fc is column parallel (its share of the 4C hidden features), its proj row parallel. Embeddings, LayerNorms
and the tied head stay whole on every rank (replicated). The library knows no model: this plan is where the
course GPT's names and the heads constraint live.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from fsdp_mini.course.models import GPT, GPTConfig
from fsdp_mini.fully_shard import fully_shard
from fsdp_mini.tensor_parallel import ColwiseParallel, RowwiseParallel, parallelize_module

__all__ = ["gpt_tp_plan", "parallelize_gpt", "qkv_rows_for_pytorch"]


def gpt_tp_plan(cfg: GPTConfig, tp: int) -> dict:
    """The model's plan ({module path pattern: style}, every block's four Linears), after checking that `tp`
    ranks can share a block: whole heads per rank, and an even share of the hidden size."""
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise ValueError(f"the tensor-parallel degree must be a positive integer, got {tp!r}")
    if cfg.n_head % tp:
        raise ValueError(f"the tensor-parallel degree {tp} does not divide the {cfg.n_head} attention heads: "
                         f"each rank must compute whole heads")
    if cfg.n_embd % tp:
        raise ValueError(f"the tensor-parallel degree {tp} does not divide the hidden size n_embd={cfg.n_embd}")
    return {"blocks.*.attn.qkv": ColwiseParallel(stacked=3), "blocks.*.attn.proj": RowwiseParallel(),
            "blocks.*.mlp.fc": ColwiseParallel(), "blocks.*.mlp.proj": RowwiseParallel()}


def parallelize_gpt(model: GPT, mesh, reshard_after_forward=None) -> nn.Module:
    """TP x FSDP on a 2-D mesh with dimensions ("dp", "tp"): `gpt_tp_plan` over mesh["tp"] (every block's four
    Linears, checked together before anything changes), then `fully_shard` of each block over mesh["dp"], then
    of the root (embeddings, final LayerNorm, head: replicated across tp, sharded across dp). Every check
    (heads, sizes, mesh) runs before the first collective. Returns the model."""
    if getattr(mesh, "mesh_dim_names", None) != ("dp", "tp"):
        raise ValueError(f"parallelize_gpt needs a 2-D mesh with dimensions ('dp', 'tp'), got "
                         f"{getattr(mesh, 'mesh_dim_names', None)}")
    parallelize_module(model, mesh["tp"], gpt_tp_plan(model.cfg, mesh["tp"].size()))
    for block in model.blocks:
        fully_shard(block, mesh=mesh["dp"], reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh["dp"], reshard_after_forward=reshard_after_forward)
    return model


def qkv_rows_for_pytorch(c: int, tp: int) -> torch.Tensor:
    """The row order [q_0; k_0; v_0; q_1; k_1; v_1; ...] of the fused qkv weight (q_r: rank r's c/tp rows of q):
    PyTorch's ColwiseParallel cuts dim 0 into tp contiguous blocks, so in this order block r is [q_r; k_r; v_r],
    exactly what ColwiseParallel(stacked=3) gives rank r of the course's [q; k; v] layout."""
    per = c // tp
    return torch.cat([torch.arange(per) + s * c + r * per for r in range(tp) for s in range(3)])
