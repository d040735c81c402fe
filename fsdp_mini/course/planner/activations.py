"""What one transformer block keeps for backward, tensor by tensor, per token, under each checkpointing mode.

Lesson 11's formula (`fsdp_mini.course.activations.course_terms`) lists what the course's GPT block saves;
this is the same count extended to the models the planner knows, in 16-bit training as torchtitan runs them
(FSDP2 with bf16 parameters, so every matrix product's output is bf16):

* RMSNorm as torchtitan's eager `RMSNorm` computes it (`x.float()`, `x * rsqrt(mean(x^2) + eps)`,
  `.type_as(x) * weight`): autograd keeps the fp32 copy of the input (4 bytes), 1/rms (one fp32 per
  token), the normalized bf16 tensor that multiplies the weight and the output that the next linear layers
  read. LayerNorm (`F.layer_norm`): its input, mean and 1/std, and its output.
* Attention through `scaled_dot_product_attention`'s flash kernel: q, k and v as the kernel receives them
  (under grouped-query attention k and v repeated to every query head first, as torchtitan's `repeat_kv`
  does), the output, and one fp32 log-sum-exp per head and token; no s x s matrix.
* SwiGLU `w2(silu(w1 x) * w3 x)`: w1's output (silu's input), silu's output and w3's output (the product's
  two inputs) and the product (w2's input). GELU: its input and its output (the projection's input).
* Rotary embeddings save nothing per token (the complex product saves only the shared frequencies); residual
  additions save nothing.

Each tensor carries where tensor parallelism puts it: `"tp"` (split over TP ranks: heads, the MLP's width),
`"sp"` (the residual stream: split only under sequence parallelism), `"gathered"` (the input of a
column-parallel layer: PyTorch's sequence parallelism all-gathers it and autograd keeps it whole, Megatron-LM's
keeps its 1/tp shard and all-gathers it again in backward, `Layout.sp_variant`), `"full"` (the partial sums a
row-parallel layer returns), `"sp-only"` (exists only under sequence parallelism, split over
TP ranks: the ReduceScatter outputs that op-level checkpointing saves). Context parallelism splits every
tensor by its tokens.

`compile` models what Inductor's fusion changes: RMSNorm keeps its bf16 input and 1/rms, not the fp32 copy
and the normalized tensor; SwiGLU keeps w1's and w3's outputs and recomputes silu and the product in the
backward kernel. These are what the min-cut partitioner of `torch.compile` chooses for these patterns;
a modelled heuristic, not a measurement.
"""
from __future__ import annotations

from dataclasses import dataclass

from fsdp_mini.course.planner.layout import Checkpointing
from fsdp_mini.course.planner.models import ModelSpec

__all__ = ["Saved", "norm_saved", "block_saved", "checkpointed_blocks", "loss_bytes_per_token",
           "matmul_outputs", "column_parallel_widths", "recomputed_matmuls"]

LOSS_FP32 = 4
"""Bytes of the fp32 logits and of log_softmax's fp32 output: torchtitan's loss upcasts the logits."""


@dataclass(frozen=True)
class Saved:
    """One tensor a block keeps for backward: `bytes_per_token` of one sequence position, and how TP splits it."""

    name: str
    bytes_per_token: float
    split: str  # "tp", "sp", "gathered", "full" or "sp-only"


def norm_saved(model: ModelSpec, name: str, element_bytes: int = 2, compile: bool = False) -> list[Saved]:
    """One norm's saved tensors, its output (the next linear layers' input) included."""
    h = model.hidden
    if model.norm == "layernorm":
        inner = [Saved(f"{name} input", element_bytes * h, "sp"), Saved(f"{name} mean and 1/std", 8, "sp")]
    elif compile:
        inner = [Saved(f"{name} input", element_bytes * h, "sp"), Saved(f"{name} 1/rms", 4, "sp")]
    else:
        inner = [Saved(f"{name} input in fp32", 4 * h, "sp"), Saved(f"{name} 1/rms", 4, "sp"),
                 Saved(f"{name} normalized (x weight's input)", element_bytes * h, "sp")]
    return inner + [Saved(f"{name} output (linear layers' input)", element_bytes * h, "gathered")]


def _attention(model: ModelSpec, e: int) -> list[Saved]:
    h = model.hidden
    if model.mlp == "gelu":  # GPT-2: one qkv matrix; its output's storage is what SDPA keeps
        qkv = [Saved("q, k, v (the qkv output)", e * (h + 2 * model.kv_dim), "tp")]
    else:
        qkv = [Saved("q (after rotary)", e * h, "tp"), Saved("k (after rotary, repeated to all heads)", e * h, "tp"),
               Saved("v (repeated to all heads)", e * h, "tp")]
    return qkv + [Saved("attention output (wo's input)", e * h, "tp"),
                  Saved("attention log-sum-exp (fp32 per head)", 4 * model.heads, "tp")]


def _mlp(model: ModelSpec, e: int, compile: bool) -> list[Saved]:
    f = model.ffn
    if model.mlp == "gelu":
        if compile:
            return [Saved("GELU input (fc output)", e * f, "tp")]
        return [Saved("GELU input (fc output)", e * f, "tp"), Saved("GELU output (projection's input)", e * f, "tp")]
    if compile:
        return [Saved("w1 output", e * f, "tp"), Saved("w3 output", e * f, "tp")]
    return [Saved("w1 output (silu's input)", e * f, "tp"), Saved("silu output", e * f, "tp"),
            Saved("w3 output", e * f, "tp"), Saved("silu x w3 (w2's input)", e * f, "tp")]


def matmul_outputs(model: ModelSpec) -> list[tuple[str, int, str]]:
    """Each matrix product of a block in forward order: (weight, output width, TP split). Column-parallel
    outputs are split; row-parallel ones (wo, w2) are partial sums of full width until TP reduces them."""
    h, kv, f = model.hidden, model.kv_dim, model.ffn
    if model.mlp == "swiglu":
        return [("wq", h, "tp"), ("wk", kv, "tp"), ("wv", kv, "tp"), ("wo", h, "full"),
                ("w1", f, "tp"), ("w3", f, "tp"), ("w2", h, "full")]
    return [("qkv", h + 2 * kv, "tp"), ("proj", h, "full"), ("fc", f, "tp"), ("fc_proj", h, "full")]


def column_parallel_widths(model: ModelSpec) -> list[int]:
    """The output width of each group of column-parallel products that read one input, in forward order (Llama:
    wq, wk, wv, then w1, w3; GPT-2: qkv, then fc): `matmul_outputs`' runs of TP-split outputs."""
    widths, run = [], 0
    for _, width, split in matmul_outputs(model):
        if split == "tp":
            run += width
        elif run:
            widths.append(run)
            run = 0
    return widths + ([run] if run else [])


def recomputed_matmuls(model: ModelSpec) -> list[str]:
    """torchtitan's op-level selective checkpointing counts the block's matrix products in forward order and
    saves every odd one (1st, 3rd, ...): the even ones (Llama: wk, wo, w3) run again in backward.

    Its policy (torchtitan's parallelize code, `_save_list` and `_custom_policy`): MUST_SAVE for the outputs of
    `aten.mm` except every second one, of the flash and memory-efficient attention kernels, of
    `_c10d_functional.reduce_scatter_tensor` and of `aten.max` (float8's scales: a scalar per tensor,
    negligible); PREFER_RECOMPUTE for everything else."""
    return [name for i, (name, _, _) in enumerate(matmul_outputs(model), start=1) if i % 2 == 0]


def block_saved(model: ModelSpec, mode: Checkpointing, element_bytes: int = 2, compile: bool = False) -> list[Saved]:
    """What one block keeps between its forward and its backward under `mode` (for SELECTIVE_LAYER: a block
    that is checkpointed keeps what FULL keeps, the others what NONE keeps; see `checkpointed_blocks`)."""
    e = element_bytes
    block_input = Saved("block input (kept by the checkpoint)", e * model.hidden, "sp")
    if mode in (Checkpointing.FULL, Checkpointing.SELECTIVE_LAYER):
        return [block_input]
    if mode == Checkpointing.SELECTIVE_OP:
        recomputed = set(recomputed_matmuls(model))
        mms = [Saved(f"{name} output", e * width, split) for name, width, split in matmul_outputs(model)
               if name not in recomputed]
        return [block_input] + mms + [Saved("attention output (saved op)", e * model.hidden, "tp"),
                                      Saved("attention log-sum-exp (fp32 per head)", 4 * model.heads, "tp"),
                                      Saved("SP ReduceScatter outputs (saved op)", 2 * e * model.hidden, "sp-only")]
    return (norm_saved(model, "attention norm", e, compile) + _attention(model, e)
            + norm_saved(model, "MLP norm", e, compile) + _mlp(model, e, compile))


def checkpointed_blocks(layers: int, mode: Checkpointing, every: int = 2) -> int:
    """Blocks whose forward runs again in backward: all (FULL, SELECTIVE_OP: partly), none (NONE), or every
    `every`-th (SELECTIVE_LAYER: torchtitan wraps block i, counting from 1, when i % every == 0)."""
    if mode == Checkpointing.NONE:
        return 0
    if mode == Checkpointing.SELECTIVE_LAYER:
        return layers // every
    return layers


def loss_bytes_per_token(model: ModelSpec, element_bytes: int = 2, compile: bool = False,
                         vocab_parallel: bool = False) -> int:
    """The loss's peak per token, split over TP ranks by the vocabulary-parallel loss.

    Eager (torchtitan: `cross_entropy(pred.float(), labels)`): in forward the logits in bf16, their fp32 copy
    and log_softmax's fp32 output (e + 4 + 4 bytes per logit); the train step then drops `pred`, and the
    loss's backward holds three fp32 tensors at once: log_softmax's saved output, nll_loss's gradient and
    log_softmax's input gradient (12). The peak is the larger. Under TP torchtitan's loss is vocabulary-parallel
    (`loss_parallel`), whose backward (the pinned torch's `distributed/tensor/parallel/loss.py`,
    `_nll_loss_and_log_softmax_backward`) returns `(grad_input + torch.exp(x)) * grad_output`: beside the saved
    log-probabilities x, a zeros_like(x), their sum with exp(x) and the product: four fp32 tensors (16).
    Compiled (Inductor fuses the upcast, log_softmax and nll_loss into reductions): the bf16 logits it keeps and
    their bf16 gradient (2 e)."""
    if compile:
        return model.vocab * 2 * element_bytes
    backward = (4 if vocab_parallel else 3) * LOSS_FP32
    return model.vocab * max(element_bytes + 2 * LOSS_FP32, backward)
