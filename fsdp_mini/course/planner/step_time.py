"""Time per training step: the work counted from shapes, priced on the GPU and its links, overlapped as FSDP
schedules it.

Per micro-batch, per GPU (T tokens: micro-batch x seq / cp; TP ranks each see all T with 1/tp of the weights):

* Matrix products: 2 FLOPs per weight and token forward, 4 backward, for the blocks and the output head
  (the embedding is a lookup), at `MATMUL_FRACTION` of the bf16 peak (of the fp8 peak with float8).
* Causal attention: forward 2 x seq x hidden FLOPs per token (q k^T and the product with v, half the
  square), backward 2.5 x forward (flash attention's backward does five products to forward's two: it
  recomputes the probabilities), also at `MATMUL_FRACTION`, of the peak FlashAttention-2 reaches on the GPU
  (`GPU.attention_peak`: on Hopper a share of the datasheet's, see `hardware`).
* Recomputation: a checkpointed block's forward again in backward (FULL, and every k-th block under
  SELECTIVE_LAYER); under SELECTIVE_OP the products torchtitan's policy does not save
  (`activations.recomputed_matmuls`) and every memory-bound op, not the attention.
* Memory-bound kernels at `HBM_FRACTION` of HBM bandwidth, bytes counted op by op for the eager block
  (`elementwise_bytes`; backward reads and writes twice what forward does), the loss, and the optimizer step
  (AdamW on the fp32 shard plus gradient clipping: 40 bytes per parameter), FSDP2's copy-out and copy-in around
  its collectives (`FSDP_COPY_BYTES_PER_PARAM`). `compile` fuses the block's; `compile_loss` the loss's.
* CPU offload (`Layout.cpu_offload`): the step in host memory and the shards over PCIe (`cpu_offload_time`),
  priced on the preset's host (`GPU.pcie_bandwidth`, `GPU.host_memory_bandwidth`).
* Collectives, alpha-beta rings (`fsdp_mini.course.cost`) on the link their group uses (`group_link`):
  FSDP's AllGather (bf16, or float8) and ReduceScatter (fp32) of each block per micro-batch and the root's
  once; HSDP's AllReduce of the gradient shard; TP's two AllReduces per block and direction (with SP a
  ReduceScatter and an AllGather each, and with Megatron-LM's variant two more AllGathers in backward, of the
  inputs its column-parallel layers kept as shards), repeated by recomputation; with `tp_overlap` each
  column-parallel layer's backward collectives (the input gradient's AllReduce or ReduceScatter, Megatron's
  AllGather again) run beside that layer's weight-gradient product and wait only for what it does not cover;
  CP's ring passing K and V (forward) and K, V, dK, dV (backward) in cp - 1 steps.

Overlap, as FSDP2 runs it: a block's AllGather hides behind the previous block's forward (prefetch),
its backward collectives (next AllGather, previous ReduceScatter, HSDP's AllReduce) behind the block's
backward; the first AllGathers and the last ReduceScatters wait. TP's collectives sit on the critical path
(the next product needs their result); CP's ring hides behind the attention of the chunk it does not need.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from fsdp_mini.course.cluster import ring_bandwidth
from fsdp_mini.course.cost import ring_all_gather, ring_all_reduce, ring_reduce_scatter
from fsdp_mini.course.planner.activations import (checkpointed_blocks, column_parallel_widths, matmul_outputs,
                                                  recomputed_matmuls)
from fsdp_mini.course.planner.calibration import CALIBRATION, Calibration
from fsdp_mini.course.planner.hardware import GPU
from fsdp_mini.course.planner.layout import Checkpointing, Layout
from fsdp_mini.course.planner.models import ModelSpec

__all__ = ["StepTime", "step_time", "group_link", "elementwise_bytes", "flops_per_token", "mfu", "cpu_offload_time",
           "OPTIMIZER_BYTES_PER_PARAM", "ATTENTION_BACKWARD_RATIO", "FSDP_COPY_BYTES_PER_PARAM",
           "CPU_ADAMW_BYTES_PER_PARAM", "CPU_FUSED_ADAMW_BYTES_PER_PARAM", "CLIP_BYTES_PER_PARAM",
           "PCIE_ACHIEVED", "HOST_MEMORY_ACHIEVED"]

ATTENTION_BACKWARD_RATIO = 2.5
"""Flash attention's backward FLOPs over its forward's: five matrix products (S = QK^T again, dV, dP, dQ, dK)
to the forward's two (Dao, "FlashAttention-2", 2023, algorithm 2)."""
CLIP_BYTES_PER_PARAM = 12
"""Bytes per parameter of gradient clipping (fp32): the gradients read for their norm (4), then read and
written scaled (8)."""
OPTIMIZER_BYTES_PER_PARAM = 28 + CLIP_BYTES_PER_PARAM
"""HBM bytes per sharded parameter of one step: AdamW (foreach, fp32) reads parameter, gradient and two
moments (16) and writes parameter and moments (12); clipping (`CLIP_BYTES_PER_PARAM`)."""
CPU_ADAMW_BYTES_PER_PARAM = 80
"""Host-memory bytes per parameter of PyTorch's default `AdamW` step on CPU tensors (fp32, weight decay),
counted op by op (`fsdp_mini.course.activations.step_traffic`; lesson 11 and the tests count it again). On CPU
tensors the default is the single-tensor loop (`_default_to_fused_or_foreach` in `torch/optim/optimizer.py`
picks foreach only for the devices of `_get_foreach_kernels_supported_devices`: cuda, xpu, mtia, privateuse1);
`foreach=True` counts the same 80. Each of its ops reads and writes whole tensors, temporaries included:
about three times the 28 a single pass needs."""
CPU_FUSED_ADAMW_BYTES_PER_PARAM = 32
"""The same for `AdamW(fused=True)` on CPU tensors (counted the same way): one pass, near the 28 floor. The
planner prices the default (`cpu_offload_time`)."""
PCIE_ACHIEVED = 0.8
"""Share of a PCIe link's nominal one-way bandwidth (`GPU.pcie_bandwidth`) that FSDP's copies reach: an
assumption (the 128b/130b line code leaves 98 %, packet headers and DMA descriptors take more; about 50 GB/s of
Gen5's 64, lesson 11's figure). Not fitted: no published run in `validation` offloads."""
HOST_MEMORY_ACHIEVED = 0.5
"""Share of the host memory's nominal bandwidth (`GPU.host_memory_bandwidth`) that PyTorch's CPU optimizer step
streams at: an assumption (lesson 11: about 300 GB/s of a two-socket Sapphire Rapids host's 563-614 GB/s; its
op-by-op kernels run one after another, each a short pass that does not saturate every channel). Not fitted."""
FSDP_COPY_BYTES_PER_PARAM = (4, 6)
"""HBM bytes per parameter of a block that FSDP2's own copies move, per micro-batch: each AllGather's copy-out
from the flat output buffer into the parameters (`foreach_all_gather_copy_out`: read 2, write 2 in bf16; 1 + 1
with float8 all-gather), once in forward and once more in backward under `reshard_after_forward`; and the
ReduceScatter's copy-in (`foreach_reduce`: the bf16 gradients read, written into the fp32 input buffer: 2 + 4).
The AllGather's copy-in (the fp32 shard cast to bf16) and the reduced shard's accumulation move the shard's
bytes only (1/group of these)."""
LOSS_BYTES_PER_LOGIT = 40
"""HBM bytes per logit of the eager loss, forward and backward: the fp32 upcast (2 + 4), log_softmax (about 8 and
12 with its reductions), the gradient cast back to bf16 (4 + 2), plus the labels' gather (negligible)."""
COMPILED_LOSS_BYTES_PER_LOGIT = 8
"""The same, compiled (`Layout.compile_loss`): forward reads the bf16 logits twice (the row's max, then the sum of
exponentials: a looped reduction over 128k columns), backward reads them once and writes the bf16 gradient."""


def flops_per_token(model: ModelSpec, seq: int) -> float:
    """torchtitan's MFU numerator: 6 N + 12 L H T (N with embeddings; H the hidden size, T the sequence)."""
    return 6 * model.params + 12 * model.layers * model.hidden * seq


def mfu(model: ModelSpec, gpu: GPU, seq: int, tokens_per_s_per_gpu: float) -> float:
    """Model FLOPs utilisation as torchtitan reports it: of the bf16 peak, also for float8 runs."""
    return tokens_per_s_per_gpu * flops_per_token(model, seq) / gpu.bf16_flops


def elementwise_bytes(model: ModelSpec, compile: bool) -> tuple[float, float]:
    """HBM bytes per token of one block's forward memory-bound ops, bf16, as (residual-stream part, split by
    TP only under SP; head/MLP part, split by TP). Eager, op by op:

        RMSNorm  x.float() 2+4, pow 4+4, mean 4, x*rsqrt 4+4, type_as 4+2, *weight 2+2 = 36 h
        residual add 2+2+2 = 6 h, twice
        rotary on q and k: float 2+4, complex product 4+4, type_as 4+2 = 20 (h + kv)
        repeat_kv (GQA): read k and v, write them repeated = 4 (kv + h)
        SwiGLU: silu 2+2, product 4+2 = 10 f            GELU 2+2 per element = 4 f;  LayerNorm 2+2 = 4 h

    `compile` fuses each norm with the residual add before it (read 2 inputs, write sum and output: 8 h) and
    SwiGLU into one pass (read 4 f, write 2 f). Rotary stays as eager runs it: torchtitan multiplies complex
    numbers (`view_as_complex`), and Inductor "does not support code generation for complex operators"
    (the pinned torch's `_inductor/lowering.py`, `_warn_complex_not_supported`; `view_as_complex` is a
    `make_fallback`), so the complex product runs as its own kernel between the casts."""
    h, kv, f = model.hidden, model.kv_dim, model.ffn
    rope = model.positions == 0
    repeat = 4 * (kv + h) if kv < h else 0
    if compile:
        stream = 2 * 8 * h
        inner = (20 * (h + kv) if rope else 0) + repeat + (6 * f if model.mlp == "swiglu" else 4 * f)
    else:
        norm = 36 * h if model.norm == "rmsnorm" else 4 * h
        stream = 2 * norm + 2 * 6 * h
        inner = (20 * (h + kv) if rope else 0) + repeat + (10 * f if model.mlp == "swiglu" else 4 * f)
    return stream, inner


def group_link(size: int, stride: int, gpu: GPU, gpus_per_node: int,
               network_fraction: float = 1.0) -> tuple[float, float]:
    """(alpha, bandwidth) of a ring over `size` ranks `stride` apart. Inside a node: NVLink. Across nodes: the
    course's multi-rail model (`fsdp_mini.course.cluster.ring_bandwidth`, derived in lesson 12): NCCL threads its
    rings through the node over NVLink and leaves it through the NICs, each GPU's own, so the k members of the
    group on one node share the node's crossing: min(NVLink, k x NIC) per rank (k = 1 for HSDP's replicas one
    per node; 8 for FSDP over whole nodes), the network reaching `network_fraction` of its nominal bandwidth
    (`calibration.NETWORK_FRACTION`)."""
    if size * stride <= gpus_per_node:
        return gpu.alpha_nvlink, gpu.nvlink_bandwidth
    per_node = max(1, gpus_per_node // stride)
    return gpu.alpha_network, ring_bandwidth(per_node, gpu.nvlink_bandwidth, gpu.network_bandwidth * network_fraction)


@dataclass(frozen=True)
class StepTime:
    """Seconds of one optimizer step per term (`parts`), the step, and the throughput it gives."""

    step_s: float
    tokens_per_s_per_gpu: float
    mfu: float
    parts: dict = field(default_factory=dict)
    collectives: dict = field(default_factory=dict)


def step_time(model: ModelSpec, gpu: GPU, layout: Layout, calibration: Calibration = CALIBRATION) -> StepTime:
    """Seconds per optimizer step and tokens/s per GPU (see the module's docstring for every term)."""
    layout.check(model, gpu)
    c = calibration
    tp, cp, T, L = layout.tp, layout.cp, layout.tokens_per_gpu, model.layers
    mm_peak = (gpu.fp8_flops if layout.float8 else gpu.bf16_flops) * c.matmul_fraction
    attn_peak = gpu.attention_peak * c.matmul_fraction
    hbm = gpu.hbm_bandwidth * c.hbm_fraction
    sp_split = tp if layout.sp else 1

    # one block, one micro-batch
    mm_f = 2 * model.matmul_params / tp * T / mm_peak
    attn_f = 2 * layout.seq * model.hidden * T / tp / attn_peak
    stream, inner = elementwise_bytes(model, layout.compile)
    elem_bytes = stream * T / sp_split + inner * T / tp
    # float8 (torchao, tensorwise): 3 bytes per element of each linear's input and output width here, which the
    # block's memory-bound bytes count 3 times (forward once, backward twice): 9 + 9, about what the recipe moves,
    # 10 per input element (forward: amax, read 2, and cast, read 2 write 1; backward the same again for the weight
    # gradient) and 8 per output element (its gradient's amax and two casts, for dgrad and transposed for wgrad)
    if layout.float8:
        widths = [(params // width, width) for (_, params), (_, width, _) in zip(model.block_matmuls,
                                                                                 matmul_outputs(model))]
        elem_bytes += 3 * sum(w_in + w_out for w_in, w_out in widths) * T / tp
    elem_f = elem_bytes / hbm
    outputs = dict((name, width) for name, width, _ in matmul_outputs(model))
    recomputed_mm = 2 * model.hidden * sum(outputs[n] for n in recomputed_matmuls(model)) / tp * T / mm_peak

    act_bytes = 2 * T * model.hidden  # one activation of the TP group's tokens, bf16
    tp_alpha, tp_bw = group_link(tp, 1, gpu, layout.gpus_per_node, c.network_fraction)
    if tp == 1:
        tp_f = tp_b = tp_recomputed = 0.0
    elif layout.sp:
        gather = 2 * ring_all_gather(act_bytes, tp, tp_alpha, tp_bw)
        tp_f = tp_b = gather + 2 * ring_reduce_scatter(act_bytes, tp, tp_alpha, tp_bw)
        if layout.sp_variant == "megatron":  # the column-parallel inputs, kept as shards, gathered again
            tp_b += gather
        tp_recomputed = gather  # op-level checkpointing saves the ReduceScatters' outputs
    else:
        tp_f = tp_b = tp_recomputed = 2 * ring_all_reduce(act_bytes, tp, tp_alpha, tp_bw)
    if layout.tp_overlap:  # per column-parallel layer: its backward collectives beside its weight-gradient product
        if layout.sp:
            beside = ring_reduce_scatter(act_bytes, tp, tp_alpha, tp_bw) + (
                ring_all_gather(act_bytes, tp, tp_alpha, tp_bw) if layout.sp_variant == "megatron" else 0.0)
        else:
            beside = ring_all_reduce(act_bytes, tp, tp_alpha, tp_bw)
        tp_b -= sum(min(beside, 2 * model.hidden * width / tp * T / mm_peak) for width in column_parallel_widths(model))
    cp_alpha, cp_bw = group_link(cp, tp, gpu, layout.gpus_per_node, c.network_fraction)
    kv_chunk = 2 * 2 * T * model.kv_dim / tp  # k and v of this rank's tokens, bf16
    cp_ring_f = (cp - 1) * (cp_alpha + kv_chunk / cp_bw) if cp > 1 else 0.0
    cp_f = max(0.0, cp_ring_f - attn_f * (cp - 1) / cp)  # the ring hides behind the chunks already here
    cp_b = max(0.0, 2 * cp_ring_f - ATTENTION_BACKWARD_RATIO * attn_f * (cp - 1) / cp)

    forward = mm_f + attn_f + elem_f + tp_f + cp_f
    backward = 2 * mm_f + ATTENTION_BACKWARD_RATIO * attn_f + 2 * elem_f + tp_b + cp_b
    n_ckpt = checkpointed_blocks(L, layout.ac, layout.ac_every)
    if layout.ac == Checkpointing.SELECTIVE_OP:
        recompute = recomputed_mm + elem_f + tp_recomputed
    elif n_ckpt:
        recompute = forward
    else:
        recompute = 0.0
    recompute_share = n_ckpt / L

    # the root: the output head's products, the loss, the final norm
    head_f = 2 * model.vocab * model.hidden / tp * T / mm_peak
    loss_bytes = COMPILED_LOSS_BYTES_PER_LOGIT if layout.compile_loss else LOSS_BYTES_PER_LOGIT
    loss = (loss_bytes * model.vocab / tp * T + 3 * stream / 2 * T / sp_split) / hbm  # + final norm

    # FSDP's collectives of one micro-batch, on the shard group (dp_shard x cp ranks, stride tp)
    n = layout.fsdp_group
    fs_alpha, fs_bw = group_link(n, tp, gpu, layout.gpus_per_node, c.network_fraction)
    unit = model.block_params / tp
    gather_bytes = 1 if layout.float8 else 2
    ag = ring_all_gather(unit * gather_bytes, n, fs_alpha, fs_bw) if n > 1 else 0.0
    rs = ring_reduce_scatter(unit * 4, n, fs_alpha, fs_bw) if n > 1 else 0.0
    root = model.root_params / tp
    ag_root = ring_all_gather(root * 2, n, fs_alpha, fs_bw) if n > 1 else 0.0
    rs_root = ring_reduce_scatter(root * 4, n, fs_alpha, fs_bw) if n > 1 else 0.0
    r = layout.dp_replicate
    rep_alpha, rep_bw = group_link(r, n * tp, gpu, layout.gpus_per_node, c.network_fraction)
    ar = ring_all_reduce(unit / n * 4, r, rep_alpha, rep_bw) if r > 1 else 0.0
    ar_root = ring_all_reduce(root / n * 4, r, rep_alpha, rep_bw) if r > 1 else 0.0

    # FSDP2's copy-out after each AllGather, copy-in before each ReduceScatter (memory-bound, on the block's path)
    copy_out, copy_in = FSDP_COPY_BYTES_PER_PARAM
    copy_out = copy_out * gather_bytes / 2
    fsdp_copies = (unit * (copy_out * (2 if layout.reshard_after_forward else 1) + copy_in) / hbm) if n > 1 else 0.0

    block_backward = backward + recompute * recompute_share
    hides = layout.prefetch > 0
    fwd_exposed = ag_root + ag + (L - 1) * (max(0.0, ag - forward) if hides else ag)
    ag_backward = ag if layout.reshard_after_forward else 0.0  # the backward's AllGather (none if kept gathered)
    bwd_comm = ag_backward + rs + ar
    bwd_exposed = (L - 1) * (max(0.0, bwd_comm - block_backward) if hides else bwd_comm) + rs + ar + rs_root + ar_root
    compute = L * (forward + block_backward + fsdp_copies) + 3 * head_f + loss
    micro = compute + fwd_exposed + bwd_exposed
    # without gradient sync, every micro-batch but the last leaves out the ReduceScatters (and HSDP's AllReduces):
    # its backward hides only the next AllGather, and nothing waits at its end (the accumulation into fp32 moves
    # about the bytes the ReduceScatter's copy-in would)
    no_sync_exposed = (L - 1) * (max(0.0, ag_backward - block_backward) if hides else ag_backward)

    local_params = model.params / (tp * n)
    m = layout.micro_batches
    unsynced = m - 1 if layout.no_sync else 0
    saved_by_no_sync = unsynced * (no_sync_exposed - bwd_exposed)  # 0 when every micro-batch syncs
    optimizer = local_params * OPTIMIZER_BYTES_PER_PARAM / hbm
    pcie = 0.0
    if layout.cpu_offload:  # the step on the host, the shard's parameters and gradients over PCIe
        optimizer, pcie = cpu_offload_time(local_params, gpu, layout)
    step = m * micro + saved_by_no_sync + optimizer + pcie
    tokens_per_gpu = layout.tokens_per_step / layout.gpus
    rate = tokens_per_gpu / step
    parts = {
        "matmuls (blocks and head)": m * (L * 3 * mm_f + 3 * head_f),
        "attention": m * L * (1 + ATTENTION_BACKWARD_RATIO) * attn_f,
        "memory-bound ops (norms, rotary, SwiGLU, loss)": m * (L * 3 * elem_f + loss),
        "FSDP copy-in / copy-out": m * L * fsdp_copies,
        "recomputation": m * L * recompute * recompute_share,
        "TP collectives (exposed)": m * L * (tp_f + tp_b),
        "CP ring (exposed)": m * L * (cp_f + cp_b),
        "FSDP AllGather (exposed)": m * fwd_exposed,
        "FSDP ReduceScatter / HSDP AllReduce (exposed)": m * bwd_exposed + saved_by_no_sync,
        "optimizer step": optimizer,
    }
    if layout.cpu_offload:
        parts["PCIe copies (CPU offload)"] = pcie
    collectives = {"fsdp_all_gather_per_block_s": ag, "fsdp_reduce_scatter_per_block_s": rs,
                   "hsdp_all_reduce_per_block_s": ar, "tp_per_block_forward_s": tp_f, "cp_ring_forward_s": cp_ring_f,
                   "block_forward_s": forward, "block_backward_s": block_backward}
    return StepTime(step_s=step, tokens_per_s_per_gpu=rate, mfu=mfu(model, gpu, layout.seq, rate),
                    parts=parts, collectives=collectives)


def cpu_offload_time(local_params: float, gpu: GPU, layout: Layout) -> tuple[float, float]:
    """(seconds of the optimizer step on the host, seconds of PCIe copies) per optimizer step of one GPU whose
    shard holds `local_params` parameters, under FSDP's CPU offload (lesson 11 reads what crosses PCIe from
    PyTorch's code).

    * The step: PyTorch's default AdamW on the fp32 shard in host memory, plus gradient clipping there
      (`CPU_ADAMW_BYTES_PER_PARAM` + `CLIP_BYTES_PER_PARAM`), at this GPU's share of its socket's memory
      (`GPU.host_memory_bandwidth`, every GPU's process steps at once) x `HOST_MEMORY_ACHIEVED`. It runs after
      backward: nothing hides it.
    * PCIe, per micro-batch: the fp32 parameter shard to the GPU before each AllGather (twice with reshard after
      forward: 8 bytes per parameter, else 4), the fp32 gradient shard back after each ReduceScatter (4).
      The link carries both directions at once, so the longer one counts, at `GPU.pcie_bandwidth` x
      `PCIE_ACHIEVED`. Counted as not hidden: FSDP issues the copies on its collective streams, where they can
      overlap compute, so this term is an upper bound.
    """
    if gpu.pcie_bandwidth is None or gpu.host_memory_bandwidth is None:
        raise ValueError(f"GPU {gpu.name!r} names no PCIe or host memory bandwidth: CPU offload cannot be priced")
    host = local_params * (CPU_ADAMW_BYTES_PER_PARAM + CLIP_BYTES_PER_PARAM) / (
        gpu.host_memory_bandwidth * HOST_MEMORY_ACHIEVED)
    to_gpu = (2 if layout.reshard_after_forward else 1) * 4 * local_params
    to_host = 4 * local_params
    pcie = layout.micro_batches * max(to_gpu, to_host) / (gpu.pcie_bandwidth * PCIE_ACHIEVED)
    return host, pcie
