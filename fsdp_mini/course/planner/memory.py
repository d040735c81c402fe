"""Memory per GPU: every term of one training step, the peak as `torch.cuda.max_memory_reserved` reads it,
and whether it fits.

From first principles (nothing here is fitted to a measurement):

* Sharded model states (FSDP2 with bf16 parameters and fp32 reduction, torchtitan's default): fp32
  parameters, fp32 gradients and AdamW's two fp32 moments, 16 bytes per parameter, of the rank's shard:
  the model / tp (TP splits the weights; norms and the root's vocabulary-parallel tables are counted as
  split too) / (dp_shard x cp) (FSDP's group). `fsdp_mini.estimate_memory` is the same arithmetic for
  model states alone (ZeRO's K = 12 plus 2 + 2). CPU offload moves them to the host.
* Gathered parameters (bf16): the root unit (embedding, final norm, head), which FSDP2 keeps gathered
  from its forward to the end of backward, and (1 + prefetch) blocks in flight (every block, from its
  forward to its backward, without `reshard_after_forward`); in backward also a block's
  unsharded bf16 gradients, their fp32 copy that the ReduceScatter reads, and the root's bf16 gradient,
  reduced only at the end. With float8 all-gather the blocks travel in 1 byte.
* Activations: `activations.block_saved` per block and mode, times the block count, times the tokens one
  GPU holds per micro-batch (local batch / micro-batches x seq / cp), TP splitting what it splits; the final
  norm's. In backward a checkpointed block rebuilds its whole forward: one block's NONE set more.
* The loss (`activations.loss_bytes_per_token`): eager, the larger of its forward (bf16 logits, their fp32 copy,
  log_softmax's output) and its backward (three fp32 tensors of the logits' shape); compiled, two bf16 ones.

The peak is the larger of two moments: the end of forward (all activations, the loss's temporaries, the
root and the last block gathered) and the start of backward (all activations, the gathered blocks, the
root's gradient, and either a checkpointed block rebuilt while it computes or, in its post-backward, once
autograd has freed its saved tensors, its gradient buffers). The caching allocator reserves more than it hands out:
`ALLOCATOR_OVERHEAD` is that ratio, one named constant (not fitted: the published rows give no memory).

The verdict knows its error. On every held-out row that publishes its peak (`validation.HELD_OUT_ROWS`, torchtitan
on H100 and H200) the count falls short of the measurement, by 4 to 17 %: `MEMORY_ERROR_BAND`, measured and never
used to correct the peak. A plan "fits" when even the largest error leaves it within capacity, "does not fit" when
even the smallest puts it over, and is "undecided" between: measure before you trust it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from fsdp_mini.course.planner.activations import (block_saved, checkpointed_blocks, loss_bytes_per_token,
                                                  norm_saved, Saved)
from fsdp_mini.course.planner.hardware import GPU, GiB
from fsdp_mini.course.planner.layout import Checkpointing, Layout
from fsdp_mini.course.planner.models import ModelSpec

__all__ = ["ALLOCATOR_OVERHEAD", "MEMORY_ERROR_BAND", "VERDICTS", "VERDICT_MESSAGES", "STATE_BYTES", "MemoryBreakdown",
           "memory_breakdown", "saved_bytes"]

ALLOCATOR_OVERHEAD = 1.02
"""max_memory_reserved / max_memory_allocated: what PyTorch's caching allocator keeps beyond the live tensors
(blocks rounded up to 2 MiB pages, free pieces of segments). torchtitan runs with
`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` (its run_train.sh), which maps segments in place and leaves
little unusable, hence 2 %. A chosen value, not fitted: no published row reports memory with allocation."""

MEMORY_ERROR_BAND = (-0.174, -0.042)
"""(smallest, largest) relative error of the predicted peak reserved memory, predicted / published - 1, over the
held-out rows that publish memory (13 torchtitan runs, `validation.HELD_OUT_ROWS`), rounded outward to three digits
(tests/course/test_planner.py recomputes it). Every row is short: the published peak lies between
peak / (1 + largest) and peak / (1 + smallest), 4 to 21 % above the count."""

VERDICTS = ("fits", "undecided", "does not fit")
"""The three answers to "does it fit?": within capacity at both ends of the error band, across it, beyond it."""

VERDICT_MESSAGES = dict(zip(VERDICTS, ("verdict_fits", "verdict_undecided", "verdict_does_not_fit")))
"""The entry of fsdp_mini/course/messages.py each verdict is printed as, in the lessons and on the pages."""

STATE_BYTES = {"parameters (fp32 shard)": 4, "gradients (fp32 shard)": 4, "AdamW moments (fp32 shard)": 8}
"""Bytes per sharded parameter of each model state (FSDP2 keeps the fp32 original sharded; AdamW's exp_avg
and exp_avg_sq)."""


def saved_bytes(items: list[Saved], layout: Layout, tokens: int) -> float:
    """Bytes on one GPU of `items` for `tokens` tokens, each split by TP where it is (`Saved.split`)."""
    total = 0.0
    for item in items:
        if item.split == "sp-only" and not layout.sp:
            continue
        split = layout.tp if item.split in ("tp", "sp-only") or (item.split == "sp" and layout.sp) or (
            item.split == "gathered" and layout.sp and layout.sp_variant == "megatron") else 1
        total += item.bytes_per_token * tokens / split
    return total


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per GPU of each term (`terms`, in order), the allocated peak, the reserved peak, the capacity."""

    terms: dict = field(default_factory=dict)
    peak_allocated: float = 0.0
    capacity: float = 0.0
    peak_moment: str = ""

    @property
    def peak_reserved(self) -> float:
        """What `torch.cuda.max_memory_reserved` would read."""
        return self.peak_allocated * ALLOCATOR_OVERHEAD

    @property
    def fits(self) -> bool:
        return self.peak_reserved <= self.capacity

    @property
    def short_by(self) -> float:
        """Bytes missing (0 when it fits)."""
        return max(0.0, self.peak_reserved - self.capacity)

    @property
    def likely_peak(self) -> tuple[float, float]:
        """Bytes the published runs' errors put the measured peak between (`MEMORY_ERROR_BAND`)."""
        smallest, largest = MEMORY_ERROR_BAND
        return self.peak_reserved / (1 + largest), self.peak_reserved / (1 + smallest)

    @property
    def fit_verdict(self) -> str:
        """One of `VERDICTS`: "fits" when the whole band is within capacity, "does not fit" when none of it
        is, "undecided" when the capacity lies inside the band."""
        low, high = self.likely_peak
        return VERDICTS[0] if high <= self.capacity else VERDICTS[2] if low > self.capacity else VERDICTS[1]

    def verdict(self) -> str:
        low, high = self.likely_peak
        band = f"measured peaks of published runs put it at {low / GiB:.1f}-{high / GiB:.1f} GiB"
        point = (f"{(self.capacity - self.peak_reserved) / GiB:.1f} GiB free by the count" if self.fits else
                 f"short by {self.short_by / GiB:.1f} GiB by the count")
        return f"{self.fit_verdict} ({point}; {band})"


def memory_breakdown(model: ModelSpec, gpu: GPU, layout: Layout) -> MemoryBreakdown:
    """Every term, per GPU, in bytes; the peak over the two moments described in the module's docstring."""
    layout.check(model, gpu)
    tp, group = layout.tp, layout.fsdp_group
    shard = -(-model.params // (tp * group))  # parameters of this rank's shard
    terms: dict[str, float] = {}
    for name, nbytes in STATE_BYTES.items():
        terms[name] = 0.0 if layout.cpu_offload else shard * nbytes
    unit = model.block_params / tp
    gathered_bytes = 1 if layout.float8 else 2
    root = 2 * model.root_params / tp
    terms["root unit gathered (bf16)"] = root
    tokens = layout.tokens_per_gpu
    e = 2
    per_block = {mode: saved_bytes(block_saved(model, mode, e, layout.compile), layout, tokens)
                 for mode in Checkpointing}
    n_ckpt = checkpointed_blocks(model.layers, layout.ac, layout.ac_every)
    if layout.ac == Checkpointing.SELECTIVE_LAYER:
        blocks = n_ckpt * per_block[Checkpointing.FULL] + (model.layers - n_ckpt) * per_block[Checkpointing.NONE]
    else:
        blocks = model.layers * per_block[layout.ac]
    terms["activations: blocks"] = blocks
    terms["activations: final norm"] = saved_bytes(norm_saved(model, "final norm", e, layout.compile), layout, tokens)
    rebuilt = per_block[Checkpointing.NONE] if n_ckpt else 0.0
    loss = loss_bytes_per_token(model, e, layout.compile_loss, vocab_parallel=tp > 1) * tokens / tp
    in_flight = (1 + layout.prefetch) * unit * gathered_bytes
    backward_buffers = unit * 2 + unit * 4 + root  # a block's bf16 grads, their fp32 copy, the root's bf16 grad
    # the last block stays gathered for backward; without reshard_after_forward every block does
    kept = unit * gathered_bytes * (1 if layout.reshard_after_forward else model.layers)
    forward_end = loss + kept
    # In backward: while a block computes, its saved tensors (and a rebuilt forward) are alive; its gradient
    # buffers appear in post-backward, when autograd has freed them: the larger of the two moments.
    last_checkpointed = layout.ac != Checkpointing.SELECTIVE_LAYER or model.layers % layout.ac_every == 0
    last_saved = per_block[layout.ac if layout.ac != Checkpointing.SELECTIVE_LAYER else
                           (Checkpointing.FULL if last_checkpointed else Checkpointing.NONE)]
    backward_start = max(in_flight, kept) + root + max(rebuilt, unit * 6 - last_saved)
    terms["blocks gathered in flight (bf16)"] = max(in_flight, kept)
    terms["gradient buffers (block bf16 + fp32 for ReduceScatter, root bf16)"] = backward_buffers
    terms["checkpointed block rebuilt in backward"] = rebuilt
    terms["logits and loss (bf16 logits, fp32 copy, log_softmax)"] = loss
    # FSDP2 without gradient sync: every unit's unsharded gradient, upcast to the reduce dtype (fp32), accumulates
    # from the first micro-batch's backward to the last's ReduceScatter (`to_accumulated_grad_if_needed`)
    accumulated = 4 * model.params / tp if layout.no_sync else 0.0
    if layout.no_sync:  # a term only where it exists: the tables of a synced step stay as they were
        terms["unsharded gradients accumulated (no sync, fp32)"] = accumulated
    base = sum(terms[k] for k in STATE_BYTES) + root + blocks + terms["activations: final norm"] + accumulated
    if forward_end >= backward_start:
        peak, moment = base + forward_end, "end of forward (the loss)"
    else:
        peak, moment = base + backward_start, "start of backward"
    return MemoryBreakdown(terms=terms, peak_allocated=peak, capacity=gpu.memory_bytes, peak_moment=moment)
