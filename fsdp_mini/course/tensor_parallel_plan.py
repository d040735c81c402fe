"""The course GPT's tensor-parallel plan (lesson 12), and the 2-D composition: TP inside every block over the
mesh's "tp" dimension, `fully_shard` over its "dp" dimension.

Megatron's split of a transformer block: attention's fused qkv is column parallel (each rank computes its
share of the heads, whole: `stacked=3` cuts q, k and v alike), its output projection row parallel; the MLP's
fc is column parallel (its share of the 4C hidden features), its proj row parallel. Embeddings, LayerNorms
and the tied head stay whole on every rank (replicated). The library knows no model: this plan is where the
course GPT's names and the heads constraint live.

The sequence-parallel variant (`gpt_sp_plan`, `parallelize_gpt_sp`) is torchtitan's plan on the course GPT:
the residual stream between the TP regions is cut along the sequence (dim 1), the LayerNorms run on 1/tp
of the positions (`SequenceParallel`), the column-parallel layers gather the sequence (`input_layouts=
Shard(1)`) and the row-parallel ones reduce-scatter into it (`output_layouts=Shard(1)`). The embeddings and
the tied head stay whole: the first block's input is cut from the replicated embedding output, and the
head's input gathered again (`PrepareModuleInput`), since the loss needs every position.
"""
from __future__ import annotations

import logging

import torch
import torch.nn as nn

from fsdp_mini.course.models import GPT, GPTConfig
from fsdp_mini.course.pytorch_equivalent import pytorch_full_state_dict
from fsdp_mini.fsdp._fully_shard.fully_shard import fully_shard
from fsdp_mini.tensor.parallel.parallelize import (ColwiseParallel, PrepareModuleInput, Replicate, RowwiseParallel,
                                                   SequenceParallel, Shard, parallelize_module)

__all__ = ["gpt_tp_plan", "parallelize_gpt", "qkv_rows_for_pytorch", "parallelize_gpt_with_pytorch",
           "pytorch_gpt_full_state_dict", "gpt_sp_plan", "parallelize_gpt_sp", "parallelize_gpt_sp_with_pytorch"]


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


def gpt_sp_plan(cfg: GPTConfig, tp: int, save_gathered_input: bool = True) -> dict:
    """`gpt_tp_plan` with sequence parallelism (the same checks, and the sequence length `block_size` must
    be a multiple of `tp`; a shorter batch is checked at its forward). Between the TP regions a rank holds
    its 1/tp of the positions: LayerNorms, residual adds and what they keep for backward are 1/tp.
    `save_gathered_input=False`: the column-parallel layers keep their input's shard and gather it again in
    backward (Megatron-LM's variant), so their inputs are kept at 1/tp too."""
    gpt_tp_plan(cfg, tp)
    if cfg.block_size % tp:
        raise ValueError(f"the tensor-parallel degree {tp} does not divide the sequence length "
                         f"block_size={cfg.block_size}: sequence parallelism gives each rank 1/tp of it")
    seq = Shard(1)  # (batch, seq, hidden): the sequence is dim 1
    return {"blocks.0": PrepareModuleInput(input_layouts=Replicate(), desired_input_layouts=seq),
            "blocks.*.ln_1": SequenceParallel(), "blocks.*.ln_2": SequenceParallel(), "ln_f": SequenceParallel(),
            "blocks.*.attn.qkv": ColwiseParallel(stacked=3, input_layouts=seq,
                                                 save_gathered_input=save_gathered_input),
            "blocks.*.attn.proj": RowwiseParallel(output_layouts=seq),
            "blocks.*.mlp.fc": ColwiseParallel(input_layouts=seq, save_gathered_input=save_gathered_input),
            "blocks.*.mlp.proj": RowwiseParallel(output_layouts=seq),
            "lm_head": PrepareModuleInput(input_layouts=seq, desired_input_layouts=Replicate())}


def parallelize_gpt_sp(model: GPT, mesh, reshard_after_forward=None, save_gathered_input: bool = True) -> nn.Module:
    """`parallelize_gpt` with `gpt_sp_plan`: TP with sequence parallelism over mesh["tp"], then `fully_shard`
    of each block and of the root over mesh["dp"]. Every check runs before the first collective.
    `save_gathered_input=False`: Megatron-LM's variant (`gpt_sp_plan`)."""
    if getattr(mesh, "mesh_dim_names", None) != ("dp", "tp"):
        raise ValueError(f"parallelize_gpt_sp needs a 2-D mesh with dimensions ('dp', 'tp'), got "
                         f"{getattr(mesh, 'mesh_dim_names', None)}")
    parallelize_module(model, mesh["tp"], gpt_sp_plan(model.cfg, mesh["tp"].size(), save_gathered_input))
    for block in model.blocks:
        fully_shard(block, mesh=mesh["dp"], reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh["dp"], reshard_after_forward=reshard_after_forward)
    return model


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


def parallelize_gpt_with_pytorch(model: GPT, mesh) -> nn.Module:
    """`parallelize_gpt`'s twin in PyTorch itself, for side-by-side checks (the demo, the tests): qkv's rows
    reordered (`qkv_rows_for_pytorch`: PyTorch's ColwiseParallel cuts contiguous rows), then
    `torch.distributed.tensor.parallel.parallelize_module` over mesh["tp"] with ColwiseParallel /
    RowwiseParallel, then `torch.distributed.fsdp.fully_shard` of each block and of the root over mesh["dp"].
    Its weights come back in the course's [q; k; v] order from `pytorch_gpt_full_state_dict`."""
    from torch.distributed.fsdp import fully_shard as torch_fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel as TorchColwise
    from torch.distributed.tensor.parallel import RowwiseParallel as TorchRowwise
    from torch.distributed.tensor.parallel import parallelize_module as torch_parallelize_module

    ours = gpt_tp_plan(model.cfg, mesh["tp"].size())  # the same plan and checks, before any collective
    rows = qkv_rows_for_pytorch(model.cfg.n_embd, mesh["tp"].size())
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight.copy_(block.attn.qkv.weight[rows])
            block.attn.qkv.bias.copy_(block.attn.qkv.bias[rows])
    # the same plan in PyTorch's styles (stacked=3 needs none: the rows were reordered above)
    plan = {path: TorchColwise() if isinstance(style, ColwiseParallel) else TorchRowwise()
            for path, style in ours.items()}
    torch_parallelize_module(model, mesh["tp"], plan)
    for block in model.blocks:
        torch_fully_shard(block, mesh=mesh["dp"])
    torch_fully_shard(model, mesh=mesh["dp"])
    return model


def parallelize_gpt_sp_with_pytorch(model: GPT, mesh) -> nn.Module:
    """`parallelize_gpt_sp`'s twin in PyTorch: qkv's rows reordered as in `parallelize_gpt_with_pytorch`,
    then PyTorch's own styles with the same layouts (`SequenceParallel`, `ColwiseParallel(input_layouts=
    Shard(1))`, `RowwiseParallel(output_layouts=Shard(1))`, `PrepareModuleInput`, local tensors out of
    the last two), then `fully_shard` of each block and of the root over mesh["dp"]."""
    from torch.distributed.fsdp import fully_shard as torch_fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel as TorchColwise
    from torch.distributed.tensor.parallel import PrepareModuleInput as TorchPrepareModuleInput
    from torch.distributed.tensor.parallel import RowwiseParallel as TorchRowwise
    from torch.distributed.tensor.parallel import SequenceParallel as TorchSequenceParallel
    from torch.distributed.tensor.parallel import parallelize_module as torch_parallelize_module

    ours = gpt_sp_plan(model.cfg, mesh["tp"].size())  # the same plan and checks, before any collective
    rows = qkv_rows_for_pytorch(model.cfg.n_embd, mesh["tp"].size())
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight.copy_(block.attn.qkv.weight[rows])
            block.attn.qkv.bias.copy_(block.attn.qkv.bias[rows])

    def theirs(style):
        if isinstance(style, ColwiseParallel):
            return TorchColwise(input_layouts=style.input_layouts)
        if isinstance(style, RowwiseParallel):
            return TorchRowwise(output_layouts=style.output_layouts)
        if isinstance(style, SequenceParallel):
            return TorchSequenceParallel()
        return TorchPrepareModuleInput(input_layouts=style.input_layouts,
                                       desired_input_layouts=style.desired_input_layouts, use_local_output=True)

    torch_parallelize_module(model, mesh["tp"], {path: theirs(style) for path, style in ours.items()})
    for block in model.blocks:
        torch_fully_shard(block, mesh=mesh["dp"])
    torch_fully_shard(model, mesh=mesh["dp"])
    return model


def pytorch_gpt_full_state_dict(model: GPT, mesh) -> dict[str, torch.Tensor]:
    """The full state dict of a model from `parallelize_gpt_with_pytorch(model, mesh)`, on CPU, qkv in the
    course's [q; k; v] order.
    Collective over the whole mesh. PyTorch warns, on every rank, that gathering a weight sharded twice on
    dim 0 takes two AllGathers: known and harmless here, so that logger is quieted while it runs."""
    logger = logging.getLogger("torch.distributed.tensor._redistribute")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        full = pytorch_full_state_dict(model)
    finally:
        logger.setLevel(level)
    back = torch.argsort(qkv_rows_for_pytorch(model.cfg.n_embd, mesh["tp"].size()))
    for name in full:
        if ".attn.qkv." in name:
            full[name] = full[name][back]
    return full
