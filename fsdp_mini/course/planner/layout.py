"""A layout: how one training step is spread over the GPUs, and the checks that make it well-formed.

The degrees follow torchtitan's device mesh, outermost first: [dp_replicate, dp_shard, cp, tp]. TP's ranks
are neighbours (one node), CP's come next, then FSDP's shard group, then the HSDP replicas. FSDP shards
parameters over dp_shard x cp ranks (torchtitan's `dp_shard_cp` mesh: a CP rank holds the whole model's
weights, so FSDP shards them over the CP ranks too), and replicates them over dp_replicate.

`local_batch` counts sequences per data-parallel rank: the tp x cp ranks of one group share them (each TP
rank sees all their tokens, each CP rank 1/cp of every sequence), torchtitan's convention. `seq` is the
whole sequence. `micro_batches` splits the local batch for gradient accumulation: FSDP gathers and
reduces once per micro-batch (FSDP2's default).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from fsdp_mini.course.planner.hardware import GPU
from fsdp_mini.course.planner.models import ModelSpec

__all__ = ["Checkpointing", "Layout", "SP_VARIANTS"]


class Checkpointing(str, Enum):
    """Activation checkpointing per block, as torchtitan's `[activation_checkpoint]` configures it.

    NONE: autograd keeps everything. SELECTIVE_OP: torchtitan's op-level policy (`_save_list`: the outputs
    of matrix products, except every second one in forward order, and of the attention kernel are saved;
    everything else is recomputed). SELECTIVE_LAYER: every k-th block fully checkpointed
    (`selective_ac_option = "k"`, default "2"). FULL: every block keeps only its input."""

    NONE = "none"
    SELECTIVE_OP = "selective-op"
    SELECTIVE_LAYER = "selective-layer"
    FULL = "full"


def _positive(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} {value!r} must be an integer >= 1")
    return value


SP_VARIANTS = ("pytorch", "megatron")
"""How SP's column-parallel layers keep their input: gathered (PyTorch) or as the shard, gathered again (Megatron-LM)."""


@dataclass(frozen=True)
class Layout:
    """Degrees and switches of one run. `prefetch`: FSDP units gathered ahead of the one computing (1, as
    FSDP2 schedules it); `ac_every`: selective-layer's k; `float8`: float8 linears (compute, and the FSDP
    AllGather of their weights in float8, torchtitan's `enable_fsdp_float8_all_gather`); `compile`:
    torch.compile of each block; `compile_loss`: torch.compile of the loss too (torchtitan compiles it with
    `--training.compile` since 2025; its December 2024 code left it eager, "compiling loss function causes CUDA
    errors"); `cpu_offload`: sharded states and the optimizer step on the host; `sp_variant`: how sequence
    parallelism's column-parallel layers keep their input for backward, "pytorch" (the gathered whole, PyTorch's
    `ColwiseParallel(input_layouts=Shard(1))`) or "megatron" (the shard, all-gathered again in backward:
    Megatron-LM, fsdp_mini's `save_gathered_input=False`); it matters only with `sp`; `no_sync`: gradient
    accumulation without a ReduceScatter per micro-batch (FSDP2's `set_requires_gradient_sync(False)` on all but
    the last micro-batch): the unsharded gradients accumulate in fp32 and are reduce-scattered once a step;
    `tp_overlap`: TP's backward as Megatron-LM overlaps it, each column-parallel layer's input-gradient collective
    (and under Megatron's SP its input's AllGather) beside that layer's weight-gradient product."""

    gpus: int
    seq: int
    local_batch: int
    gpus_per_node: int = 8
    dp_replicate: int = 1
    tp: int = 1
    sp: bool = False
    sp_variant: str = "pytorch"
    cp: int = 1
    micro_batches: int = 1
    ac: Checkpointing = Checkpointing.NONE
    ac_every: int = 2
    float8: bool = False
    compile: bool = False
    compile_loss: bool = False
    reshard_after_forward: bool = True
    no_sync: bool = False
    tp_overlap: bool = False
    cpu_offload: bool = False
    prefetch: int = 1

    def __post_init__(self) -> None:
        for name in ("gpus", "seq", "local_batch", "gpus_per_node", "dp_replicate", "tp", "cp", "micro_batches",
                     "ac_every"):
            _positive(f"--{name.replace('_', '-')}", getattr(self, name))
        if not isinstance(self.prefetch, int) or self.prefetch < 0:
            raise ValueError(f"prefetch {self.prefetch!r} must be an integer >= 0")
        object.__setattr__(self, "ac", Checkpointing(self.ac))
        inner = self.dp_replicate * self.tp * self.cp
        if self.gpus % inner:
            raise ValueError(f"--gpus {self.gpus} is not a multiple of dp-replicate x tp x cp = "
                             f"{self.dp_replicate} x {self.tp} x {self.cp} = {inner}")
        if self.gpus > self.gpus_per_node and self.gpus % self.gpus_per_node:
            raise ValueError(f"--gpus {self.gpus} is not a whole number of nodes of --gpus-per-node "
                             f"{self.gpus_per_node}")
        if self.sp_variant not in SP_VARIANTS:
            raise ValueError(f"--sp-variant {self.sp_variant!r} must be one of {', '.join(SP_VARIANTS)}")
        if self.sp and self.tp == 1:
            raise ValueError("--sp needs --tp > 1: sequence parallelism splits what TP replicates")
        if self.seq % self.cp:
            raise ValueError(f"--cp {self.cp} does not divide --seq {self.seq}")
        if self.cp > 1 and self.seq % (2 * self.cp):
            raise ValueError(f"--seq {self.seq} must split into 2 x cp = {2 * self.cp} equal chunks: ring "
                             f"attention balances the causal mask with two chunks per CP rank")
        if self.tp_overlap and self.tp == 1:
            raise ValueError("--tp-overlap needs --tp > 1: it overlaps TP's backward collectives")
        if self.no_sync and self.micro_batches == 1:
            raise ValueError("--no-sync needs --micro-batches > 1: it skips the gradient sync of all micro-batches "
                             "but the last")
        if self.local_batch % self.micro_batches:
            raise ValueError(f"--micro-batches {self.micro_batches} does not divide --local-batch {self.local_batch}")
        if self.sp and (self.seq // self.cp) % self.tp:
            raise ValueError(f"--tp {self.tp} does not divide the {self.seq // self.cp} tokens per CP rank: "
                             f"sequence parallelism splits them")

    @property
    def dp_shard(self) -> int:
        """FSDP's data shard degree: gpus / (dp_replicate x tp x cp)."""
        return self.gpus // (self.dp_replicate * self.tp * self.cp)

    @property
    def fsdp_group(self) -> int:
        """Ranks a parameter is sharded over: dp_shard x cp (torchtitan's `dp_shard_cp`)."""
        return self.dp_shard * self.cp

    @property
    def dp(self) -> int:
        """Data-parallel ranks: each takes `local_batch` sequences."""
        return self.dp_replicate * self.dp_shard

    @property
    def micro_batch(self) -> int:
        """Sequences per data-parallel rank in one forward and backward."""
        return self.local_batch // self.micro_batches

    @property
    def tokens_per_step(self) -> int:
        """Tokens of one optimizer step, all GPUs together."""
        return self.dp * self.local_batch * self.seq

    @property
    def tokens_per_gpu(self) -> int:
        """Tokens one GPU's activations cover in one micro-batch: the CP rank's share of each sequence."""
        return self.micro_batch * self.seq // self.cp

    def check(self, model: ModelSpec, gpu: GPU) -> None:
        """What depends on the model and the GPU: TP must split heads and MLP; float8 needs fp8 tensor cores."""
        model.check_tp(self.tp)
        if self.float8 and gpu.fp8_flops is None:
            raise ValueError(f"--float8 needs fp8 tensor cores, which {gpu.name} does not have")
        if self.tp > self.gpus_per_node:
            raise ValueError(f"--tp {self.tp} spans nodes of --gpus-per-node {self.gpus_per_node}: TP belongs "
                             f"inside a node")
