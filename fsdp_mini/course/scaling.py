"""Where FSDP alone stops scaling, and what tensor parallelism inside a node changes: lesson 12 on paper.

Lesson 11 found the condition for a unit's AllGather to hide behind the previous unit's forward: enough
tokens per GPU (`fsdp_mini.course.exercises.activations.tokens_to_hide`). This module asks what happens to
that condition as a cluster grows, with the numbers of lesson 11's H100 cluster (`h100_cluster`):

1. `fsdp_scaling`: FULL_SHARD over 8 ... 4,096 GPUs with a FIXED global batch. The batch is what the
   optimiser wants, not what the cluster can swallow (Llama 2 trained every size with 4M tokens per step;
   past a critical batch size more tokens per step buy nothing), so each GPU gets batch / N tokens while the
   tokens needed to hide the AllGather stay (bandwidth term) or grow (latency term, (N - 1) alpha). The rows
   say where the AllGather stops hiding (`ScalingLimits.stops_hiding_at`) and where the ring's latency
   outweighs its bandwidth term (`latency_dominates_at`).
2. `mesh_layout`: a 2-D mesh, tp ranks of one node in a tensor-parallel group and dp = N / tp ranks across
   nodes in a data-parallel one, with FULL_SHARD on dp. What each rank holds and the bytes each link carries
   per step, derived from the transformer's shapes (`TransformerShape`): TP's AllReduces of activations on
   NVLink, FSDP's AllGathers and ReduceScatters of a 1/tp-sized unit on the network.
3. `compare_plans`: "when to choose what" for a Llama-class model on paper: FSDP, HSDP and TP(8) x FSDP side
   by side, model-state memory per rank (`fsdp_mini.estimate_memory`), communication per step and how much of
   it compute hides, one micro-batch and no recomputation.
4. `planner_comparison`: the same layouts (and TP8 with sequence parallelism) asked of the course's planner
   (`fsdp_mini.course.planner`), which adds what the paper version leaves out (activation memory, the loss,
   recomputation, micro-batches, attention's FLOPs, fitted efficiencies) and says under which micro-batches
   and checkpointing mode a verdict holds (`best_plans`, `tp_crossing`).

One home for each fact: the Llama shapes and the H100's peak, bandwidths and ring latencies are the planner's
presets (`get_model("llama2-*")`, `get_gpu("h100-sxm")`); this module only names them for the lesson.

Assumptions, each a default a caller can change:

* cluster: nodes of 8 H100 SXM, NVLink 450 GB/s and 400 Gb/s InfiniBand (50 GB/s) per GPU, alpha 5 us
  inside a node and 20 us across (the planner's `h100-sxm` preset; lesson 11's `Cluster(n, 8, 450e9, 50e9,
  5e-6, 20e-6)`); a ring over whole nodes leaves each on all 8 cards (`fsdp_mini.course.cluster.ring_bandwidth`:
  min(450, 8 x 50) = 400 GB/s); 989 TFLOP/s dense bf16 at 45 % MFU (lesson 11's H100 number).
* batch: 4M = 4,194,304 tokens a step, 1,024 sequences of 4,096 (Llama 2: Touvron et al. 2023, section 2.2,
  "a global batch-size of 4M tokens", for the 7B to the 70B model).
* models: Llama-2-7B and Llama-2-70B's published shapes (`LLAMA2_7B`, `LLAMA2_70B`); a unit is one
  transformer block (202 M and 856 M parameters), bf16 parameters and gradients, Adam in fp32 (K = 12).

What the alpha-beta model leaves out: NCCL's other algorithms (trees and PAT for large rings), an uneven
split over the rails, congestion in the network, the time to reduce, the attention's s^2 FLOPs (compute is 6 x
parameters x tokens), the first AllGather of a step (nothing runs before it) and the root unit (embeddings
and output head: counted in memory, not in communication), activation memory and gradient accumulation
(every micro-batch gathers again), activation recomputation (its forward repeats TP's two AllReduces),
sequence parallelism and asynchronous TP, which overlap TP's collectives with matrix products. TP's
AllReduces are counted as fully exposed: the next matrix product needs their result. Trends, not times.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from fsdp_mini.course.cluster import Cluster
from fsdp_mini.course.cost import ring_all_gather, ring_all_reduce, ring_reduce_scatter
from fsdp_mini.course.exercises.activations import tokens_to_hide
from fsdp_mini.course.planner import Layout, get_gpu, get_model
from fsdp_mini.course.planner import Plan as PlannerPlan
from fsdp_mini.course.planner import plan as planner_plan
from fsdp_mini.course.simulate import flops_seconds
from fsdp_mini.estimates import MemoryEstimate, estimate_memory
from fsdp_mini.ring_model import ring_model_sent
from fsdp_mini.fsdp.strategy import check_shard_size

__all__ = [
    "H100_FLOPS", "H100_MEMORY", "GPUS_PER_NODE", "GLOBAL_BATCH_TOKENS", "SEQUENCE_LENGTH", "GPU_COUNTS",
    "h100_cluster", "TransformerShape", "LLAMA2_7B", "LLAMA2_13B", "LLAMA2_70B",
    "HidingRow", "ScalingLimits", "fsdp_scaling", "scaling_limits", "latency_equals_bandwidth_at",
    "LinkTraffic", "MeshLayout", "mesh_layout",
    "Plan", "FSDP_PLAN", "HSDP_PLAN", "TP8_FSDP_PLAN", "PLANS", "PlanRow", "compare_plans",
    "H100", "PLANNER_LAYOUTS", "PlannerRow", "planner_comparison", "searched_comparison", "best_plans",
    "tp_crossing",
]

H100 = get_gpu("h100-sxm")
"""The planner's H100 SXM preset: the one source of the peak, the memory, the links and their latencies."""

H100_FLOPS = H100.bf16_flops * 0.45
"""FLOP/s one H100 SXM achieves: 989 TFLOP/s dense bf16 peak at 45 % MFU (lesson 11)."""
H100_MEMORY = H100.memory_bytes
"""Bytes of HBM on one H100 SXM (80 GiB): what model states must fit under, with room left for activations."""
GPUS_PER_NODE = 8
GLOBAL_BATCH_TOKENS = 4 * 1024 * 1024
"""Tokens per optimizer step: Llama 2's "global batch-size of 4M tokens" (Touvron et al., 2023, section 2.2),
1,024 sequences of 4,096 tokens. Fixed as the cluster grows: the batch is chosen for the optimisation."""
SEQUENCE_LENGTH = 4096
"""Llama 2's context length: below this many tokens per GPU a GPU no longer gets one whole sequence."""
GPU_COUNTS = tuple(8 * 2**k for k in range(10))
"""8, 16, ..., 4,096 GPUs: one node to 512 nodes of 8."""


def h100_cluster(gpus: int, gpus_per_node: int = GPUS_PER_NODE) -> Cluster:
    """Lesson 11's H100 cluster with `gpus` GPUs in nodes of `gpus_per_node`: NVLink 450 GB/s and alpha 5 us
    inside a node, 400 Gb/s InfiniBand (50 GB/s) and alpha 20 us per GPU between nodes."""
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1 or gpus % gpus_per_node and gpus > gpus_per_node:
        raise ValueError(f"gpus={gpus!r} must be a positive integer, a multiple of {gpus_per_node} above one node")
    links = (H100.nvlink_bandwidth, H100.network_bandwidth, H100.alpha_nvlink, H100.alpha_network)
    if gpus <= gpus_per_node:
        return Cluster(1, gpus, *links)
    return Cluster(gpus // gpus_per_node, gpus_per_node, *links)


# --- the models ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TransformerShape:
    """A Llama-style decoder's shapes: `layers` blocks of width `hidden`, attention with `heads` query heads
    and `kv_heads` key/value heads (grouped-query attention when fewer), a SwiGLU MLP of width `ffn` (three
    matrices), RMSNorm before each half, untied input embedding and output head over `vocab` tokens, no
    biases. Parameter counts follow from the shapes, so they match the published model's to the parameter."""

    name: str
    hidden: int
    layers: int
    ffn: int
    heads: int
    kv_heads: int
    vocab: int
    preset: str = ""
    """The planner's name for the same model (`fsdp_mini.course.planner.get_model`), if it has one."""

    @classmethod
    def from_preset(cls, preset: str, name: str) -> "TransformerShape":
        """The planner's preset `preset`, shown as `name`: its shapes, not a copy of them."""
        spec = get_model(preset)
        if spec.mlp != "swiglu" or spec.bias or spec.tied or spec.positions:
            raise ValueError(f"{preset} is not a Llama-style decoder")
        return cls(name, hidden=spec.hidden, layers=spec.layers, ffn=spec.ffn, heads=spec.heads,
                   kv_heads=spec.kv_heads, vocab=spec.vocab, preset=preset)

    def __post_init__(self) -> None:
        for field in ("hidden", "layers", "ffn", "heads", "kv_heads", "vocab"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{field} must be an integer >= 1, got {value!r}")
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError(f"heads={self.heads} must divide hidden={self.hidden}, and kv_heads={self.kv_heads} "
                             f"must divide heads")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def attention_params(self) -> int:
        """q and o: hidden x hidden each; k and v: hidden x (kv_heads x head_dim) each."""
        return 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_heads * self.head_dim

    @property
    def mlp_params(self) -> int:
        """gate, up (hidden -> ffn) and down (ffn -> hidden)."""
        return 3 * self.hidden * self.ffn

    @property
    def norm_params(self) -> int:
        """Two RMSNorm weights per block, replicated by tensor parallelism."""
        return 2 * self.hidden

    @property
    def block_params(self) -> int:
        """One transformer block: the FSDP unit."""
        return self.attention_params + self.mlp_params + self.norm_params

    @property
    def params(self) -> int:
        """The whole model: blocks, the input embedding and the output head, and the final norm."""
        return self.layers * self.block_params + 2 * self.vocab * self.hidden + self.hidden

    def block_params_per_tp_rank(self, tp: int) -> int:
        """One block's parameters on one rank of a TP group of `tp`: Megatron's split cuts q, k, v, gate and up
        by output columns (heads and ffn split tp ways) and o and down by input rows, and replicates the norms."""
        self.check_tp(tp)
        return (self.attention_params + self.mlp_params) // tp + self.norm_params

    def params_per_tp_rank(self, tp: int) -> int:
        """The whole model on one TP rank: blocks as `block_params_per_tp_rank`, the embedding and the head
        split over the vocabulary (vocab-parallel, ceil), the final norm replicated."""
        return (self.layers * self.block_params_per_tp_rank(tp) + 2 * -(-self.vocab // tp) * self.hidden
                + self.hidden)

    def check_tp(self, tp: int) -> None:
        """A TP degree must split the query heads, the key/value heads and the MLP's width evenly."""
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise ValueError(f"tp must be an integer >= 1, got {tp!r}")
        for what, value in (("heads", self.heads), ("kv_heads", self.kv_heads), ("ffn", self.ffn)):
            if value % tp:
                raise ValueError(f"tp={tp} does not divide {self.name}'s {what}={value}: each TP rank must get "
                                 f"whole heads and an equal share of the MLP")


LLAMA2_7B = TransformerShape.from_preset("llama2-7b", "Llama-2-7B")
"""6,738,415,616 parameters; a block 202,383,360 (lesson 11's "about 200 M")."""
LLAMA2_13B = TransformerShape.from_preset("llama2-13b", "Llama-2-13B")
"""13,015,864,320 parameters; a block 317,204,480."""
LLAMA2_70B = TransformerShape.from_preset("llama2-70b", "Llama-2-70B")
"""68,976,648,192 parameters (grouped-query attention, 8 key/value heads); a block 855,654,400."""


# --- 1. where FSDP alone stops scaling ---------------------------------------------------------------------

@dataclass(frozen=True)
class HidingRow:
    """One cluster size of `fsdp_scaling`: FULL_SHARD of a unit over all `gpus`, the global batch split evenly.

    `tokens_per_gpu` is what each GPU gets, `tokens_to_hide` what the unit's AllGather needs (lesson 11's
    exercise); `forward_s` the unit's forward on `tokens_per_gpu`, `gather_s` its AllGather, split into the
    ring's `latency_s` ((N - 1) alpha) and `bandwidth_s` ((N - 1)/N S / B)."""

    gpus: int
    nodes: int
    tokens_per_gpu: float
    tokens_to_hide: int
    forward_s: float
    gather_s: float
    latency_s: float
    bandwidth_s: float

    @property
    def hides(self) -> bool:
        """The unit's forward lasts as long as the next unit's AllGather."""
        return self.tokens_per_gpu >= self.tokens_to_hide

    @property
    def latency_dominates(self) -> bool:
        """The ring's n - 1 latencies cost more than its bytes."""
        return self.latency_s > self.bandwidth_s

    @property
    def exposed_s(self) -> float:
        """AllGather time per unit that the forward does not cover."""
        return max(0.0, self.gather_s - self.forward_s)

    @property
    def whole_sequences(self) -> float:
        """Sequences of `SEQUENCE_LENGTH` per GPU; below 1 a sequence must be split across GPUs."""
        return self.tokens_per_gpu / SEQUENCE_LENGTH


def fsdp_scaling(unit_params: int | float, gpu_counts: Sequence[int] = GPU_COUNTS,
                 global_batch: int = GLOBAL_BATCH_TOKENS, param_bytes: int = 2, flops_per_s: float = H100_FLOPS,
                 cluster_for: Callable[[int], Cluster] = h100_cluster) -> list[HidingRow]:
    """For each GPU count: FULL_SHARD over the whole cluster, `global_batch` tokens per step split over the
    GPUs, and one unit of `unit_params` parameters. Tokens per GPU fall as 1/N; the tokens the AllGather needs
    do not fall (the bandwidth term (N - 1)/N S/B is almost constant) and grow with the latency (N - 1) alpha.
    """
    if not unit_params >= 1:
        raise ValueError(f"unit_params must be >= 1, got {unit_params!r}")
    if not global_batch > 0:
        raise ValueError(f"global_batch must be > 0 tokens, got {global_batch!r}")
    rows = []
    for gpus in gpu_counts:
        cluster = cluster_for(gpus)
        n = cluster.world_size
        alpha, bandwidth = cluster.link(range(n))  # FULL_SHARD's ring: every rank
        nbytes = unit_params * param_bytes
        tokens = global_batch / n
        rows.append(HidingRow(
            gpus=n, nodes=cluster.nodes, tokens_per_gpu=tokens,
            tokens_to_hide=tokens_to_hide(unit_params, param_bytes, cluster, flops_per_s),
            forward_s=2 * unit_params * tokens / flops_per_s,
            gather_s=ring_all_gather(nbytes, n, alpha, bandwidth),
            latency_s=(n - 1) * alpha, bandwidth_s=(n - 1) / n * nbytes / bandwidth))
    return rows


@dataclass(frozen=True)
class ScalingLimits:
    """The crossing points of `fsdp_scaling`'s rows (None: not within the rows).

    `stops_hiding_at`: the first GPU count whose AllGather no longer hides (and none after it hides again);
    `latency_dominates_at`: the first whose ring latency exceeds its bandwidth term; `splits_sequences_at`:
    the first where a GPU gets less than one whole sequence; `last_hiding`: the largest count that hides."""

    stops_hiding_at: int | None
    latency_dominates_at: int | None
    splits_sequences_at: int | None
    last_hiding: int | None


def _first(rows: Sequence[HidingRow], test: Callable[[HidingRow], bool]) -> int | None:
    return next((r.gpus for r in rows if test(r)), None)


def scaling_limits(rows: Sequence[HidingRow]) -> ScalingLimits:
    """The crossing points of `rows` (from `fsdp_scaling`, in growing GPU counts). Raises if hiding comes back
    after it stopped, which a fixed batch on a growing ring cannot do: the rows would be wrongly ordered."""
    if [r.gpus for r in rows] != sorted(r.gpus for r in rows):
        raise ValueError("rows must be in growing GPU counts")
    stops = _first(rows, lambda r: not r.hides)
    if stops is not None and any(r.hides for r in rows if r.gpus > stops):
        raise ValueError("the AllGather hides again after it stopped hiding: rows from different settings?")
    hiding = [r.gpus for r in rows if r.hides]
    return ScalingLimits(stops_hiding_at=stops, latency_dominates_at=_first(rows, lambda r: r.latency_dominates),
                         splits_sequences_at=_first(rows, lambda r: r.whole_sequences < 1),
                         last_hiding=hiding[-1] if hiding else None)


def latency_equals_bandwidth_at(unit_bytes: float, alpha: float, bandwidth: float) -> float:
    """The ring length n at which an AllGather's latency (n - 1) alpha equals its bandwidth term
    (n - 1)/n S / B: n = S / (alpha B). Longer rings are latency-bound: a unit of 1.7 GB (a Llama-2-70B
    block in bf16) on nodes of 8 cards of 50 GB/s (B = 400 GB/s) crosses at about 214 GPUs, a 7B block's 405 MB
    at about 51."""
    if not unit_bytes > 0 or not alpha > 0 or not bandwidth > 0:
        raise ValueError("unit_bytes, alpha and bandwidth must be > 0")
    return unit_bytes / (alpha * bandwidth)


# --- 2. TP x FSDP on a 2-D mesh, on paper --------------------------------------------------------------------

@dataclass(frozen=True)
class LinkTraffic:
    """`count` identical collectives per step (all blocks): `op` over `group_size` ranks of `nbytes` (S, the
    full tensor), for `purpose` ("TP" or "FSDP"), on the `link` ("NVLink" inside a node, "network" when the group
    crosses nodes: it leaves each on `cards` network cards, its ranks there); per call, the bytes one rank sends
    (`sent`) and the alpha-beta `seconds`."""

    purpose: str
    op: str
    link: str
    group_size: int
    nbytes: int
    count: int
    sent: int
    seconds: float
    cards: int = 0

    @property
    def total_sent(self) -> int:
        return self.count * self.sent

    @property
    def total_on_card(self) -> float:
        """Bytes per step one rank's network card sends for these calls: 1/cards of a crossing ring's bytes."""
        return self.total_sent / self.cards if self.link == "network" else 0

    @property
    def total_seconds(self) -> float:
        return self.count * self.seconds


@dataclass(frozen=True)
class MeshLayout:
    """A 2-D mesh of `tp` x `dp` ranks (ranks numbered node by node, TP groups of `tp` consecutive ranks,
    data-parallel groups every tp-th rank), FULL_SHARD (or a hybrid's shard group of `shard_size`) on dp.

    What one rank holds: `block_params_per_rank` of each block between steps, `params_per_rank` of the model;
    `unit_params` is the 1/tp-sized block one data-parallel group gathers. Per step: every collective in
    `traffic`, and `tokens_per_dp_rank`, the tokens one TP group works on (each of its ranks sees them all)."""

    model: str
    tp: int
    dp: int
    shard_size: int
    tokens_per_dp_rank: float
    unit_params: int
    block_params_per_rank: int
    params_per_rank: int
    traffic: tuple[LinkTraffic, ...]

    def sent_on(self, link: str, purpose: str | None = None) -> float:
        """Bytes one rank sends per step on `link`, for one `purpose` or all: "network", what its network card
        carries (a crossing ring's bytes over the cards it leaves a node on); "NVLink", the rest."""
        if link not in ("NVLink", "network"):
            raise ValueError(f"link must be 'NVLink' or 'network', got {link!r}")
        chosen = [t for t in self.traffic if purpose in (None, t.purpose)]
        card = sum(t.total_on_card for t in chosen)
        return card if link == "network" else sum(t.total_sent for t in chosen) - card

    def seconds_of(self, purpose: str) -> float:
        """Communication seconds per step of one purpose, collectives one after another."""
        return sum(t.total_seconds for t in self.traffic if t.purpose == purpose)


def _link_name(crosses: bool) -> str:
    return "network" if crosses else "NVLink"


_PRICE = {"all_reduce": ring_all_reduce, "all_gather": ring_all_gather, "reduce_scatter": ring_reduce_scatter}


def mesh_layout(model: TransformerShape, cluster: Cluster, tp: int, global_batch: int = GLOBAL_BATCH_TOKENS,
                shard_size: int | None = None, param_bytes: int = 2, grad_bytes: int = 2,
                activation_bytes: int = 2, reshard_after_forward: bool = True) -> MeshLayout:
    """What each rank of a tp x dp mesh on `cluster` holds, and every collective of one training step.

    Per block and step (the shapes give every number; T = global_batch / dp tokens per TP group):

        TP, over the tp ranks of a group:   4 AllReduce of T x hidden x activation_bytes
            (forward: after attention's row-parallel o and after the MLP's row-parallel down, Megatron's g;
             backward: the input gradients of the column-parallel q/k/v and gate/up, Megatron's f)
        FSDP, over the shard group of dp ranks, of the block's 1/tp share U (padded to the group):
            2 AllGather of U x param_bytes (1 without `reshard_after_forward`) + 1 ReduceScatter of
            U x grad_bytes, and with replicas (a hybrid's `shard_size` < dp) 1 AllReduce of its shard

    A group whose ranks all sit on one node uses NVLink, else the network on its ranks' cards per node
    (`Cluster.link`). `shard_size` defaults to all dp ranks (FULL_SHARD on dp).
    """
    model.check_tp(tp)
    world = cluster.world_size
    if world % tp:
        raise ValueError(f"tp={tp} does not divide the cluster's {world} GPUs")
    dp = world // tp
    shard = dp if shard_size is None else shard_size
    check_shard_size(shard, dp, f"the {dp} data-parallel ranks")
    if global_batch % dp:
        raise ValueError(f"global_batch={global_batch} tokens do not split evenly over {dp} data-parallel ranks")
    tokens = global_batch // dp
    unit = model.block_params_per_tp_rank(tp)
    padded = -(-unit // shard) * shard  # equal shards, as fsdp_mini's flat layout pads them
    # rank r = dp_index * tp + tp_index: a TP group is tp consecutive ranks, a shard group every tp-th rank
    tp_group = range(tp)
    shard_group = range(0, shard * tp, tp)
    replica_group = range(0, world, shard * tp)

    calls = []

    def add(purpose, op, ranks, numel, element_size, count):
        n = len(ranks)
        if n == 1 or count == 0:
            return
        crosses = cluster.spans_nodes(ranks)
        alpha, bandwidth = cluster.link(ranks)
        nbytes = numel * element_size
        calls.append(LinkTraffic(purpose, op, _link_name(crosses), n, nbytes, count * model.layers,
                                 ring_model_sent(op, numel, element_size, n),
                                 _PRICE[op](nbytes, n, alpha, bandwidth), cluster.cards(ranks)))

    add("TP", "all_reduce", tp_group, tokens * model.hidden, activation_bytes, 4)
    add("FSDP", "all_gather", shard_group, padded, param_bytes, 2 if reshard_after_forward else 1)
    add("FSDP", "reduce_scatter", shard_group, padded, grad_bytes, 1)
    add("FSDP", "all_reduce", replica_group, padded // shard, grad_bytes, 1)
    return MeshLayout(model=model.name, tp=tp, dp=dp, shard_size=shard, tokens_per_dp_rank=tokens,
                      unit_params=unit, block_params_per_rank=padded // shard,
                      params_per_rank=-(-model.params_per_tp_rank(tp) // shard), traffic=tuple(calls))


# --- 3. when to choose what -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    """A way to lay a model over a cluster: `strategy` on the data-parallel ranks, tensor parallelism of
    degree `tp` inside each node, and for a hybrid a shard group of `shard_gpus` GPUs (a node by default)."""

    name: str
    strategy: str
    tp: int = 1
    shard_gpus: int | None = None


FSDP_PLAN = Plan("FSDP", "FULL_SHARD")
HSDP_PLAN = Plan("HSDP", "HYBRID_SHARD", shard_gpus=GPUS_PER_NODE)
TP8_FSDP_PLAN = Plan("TP8 x FSDP", "FULL_SHARD", tp=8)
PLANS = (FSDP_PLAN, HSDP_PLAN, TP8_FSDP_PLAN)


@dataclass(frozen=True)
class PlanRow:
    """One plan for one model on one cluster size, per GPU and step.

    `memory`: model states per rank (`estimate_memory`), `fits`: under `H100_MEMORY` (activations and the
    gathered units need the rest). `compute_s`: 6 x parameters x tokens of this GPU. `fsdp_s`: FSDP's
    collectives, of which `fsdp_exposed_s` is what the blocks' forward and backward do not cover; `tp_s`: TP's
    AllReduces, all exposed. `step_s` = compute + what is exposed; `hides`: FSDP's communication is covered."""

    model: str
    gpus: int
    plan: str
    memory: MemoryEstimate
    fits: bool
    tokens_per_gpu: float
    compute_s: float
    fsdp_s: float
    fsdp_exposed_s: float
    tp_s: float

    @property
    def step_s(self) -> float:
        return self.compute_s + self.fsdp_exposed_s + self.tp_s

    @property
    def hides(self) -> bool:
        return self.fsdp_exposed_s == 0

    @property
    def efficiency(self) -> float:
        """Compute / step: the share of the step the GPU spends on the model's FLOPs (1 = no exposed comm)."""
        return self.compute_s / self.step_s


def _plan_row(model: TransformerShape, gpus: int, plan: Plan, global_batch: int, flops_per_s: float,
              cluster_for: Callable[[int], Cluster], memory_limit: float) -> PlanRow:
    cluster = cluster_for(gpus)
    shard = None if plan.shard_gpus is None else max(1, plan.shard_gpus // plan.tp)
    layout = mesh_layout(model, cluster, plan.tp, global_batch, shard_size=shard)
    forward = 2 * layout.unit_params * layout.tokens_per_dp_rank / flops_per_s  # a block's 2 P T on this GPU
    gathers = [t for t in layout.traffic if t.op == "all_gather"]
    one_gather = gathers[0].seconds if gathers else 0.0
    fsdp_block = layout.seconds_of("FSDP") / model.layers
    # forward hides one AllGather behind 2PT; backward (4PT) the rest: AllGather, ReduceScatter, replicas' AllReduce
    exposed = max(0.0, one_gather - forward) + max(0.0, fsdp_block - one_gather - 2 * forward)
    memory = estimate_memory(model.params, gpus, plan.strategy, shard_size=shard, tp=plan.tp)
    return PlanRow(model=model.name, gpus=gpus, plan=plan.name, memory=memory, fits=memory.total <= memory_limit,
                   tokens_per_gpu=global_batch / gpus,
                   compute_s=flops_seconds(model.params, global_batch / gpus, flops_per_s, 1.0),
                   fsdp_s=fsdp_block * model.layers, fsdp_exposed_s=exposed * model.layers,
                   tp_s=layout.seconds_of("TP"))


def compare_plans(models: Sequence[TransformerShape] = (LLAMA2_7B, LLAMA2_70B),
                  gpu_counts: Sequence[int] = GPU_COUNTS[3:], plans: Sequence[Plan] = PLANS,
                  global_batch: int = GLOBAL_BATCH_TOKENS, flops_per_s: float = H100_FLOPS,
                  cluster_for: Callable[[int], Cluster] = h100_cluster,
                  memory_limit: float = H100_MEMORY) -> list[PlanRow]:
    """Every plan for every model and GPU count (64 ... 4,096 by default), with a fixed global batch.

    FSDP: FULL_SHARD over all GPUs. HSDP: FULL_SHARD inside a node, replicas across nodes (the gradient
    shard's AllReduce crosses the network). TP8 x FSDP: TP over a node's 8 GPUs on NVLink, FULL_SHARD of the
    1/8-sized blocks over the nodes. Compute and FSDP overlap block by block (one collective stream beside
    one compute stream); TP's AllReduces wait in line."""
    return [_plan_row(m, g, p, global_batch, flops_per_s, cluster_for, memory_limit)
            for m in models for g in gpu_counts for p in plans]


# --- 4. the same question to the planner ------------------------------------------------------------------------

PLANNER_LAYOUTS = {"FSDP": {}, "HSDP": {"hsdp": True}, "TP8 x FSDP": {"tp": 8}, "TP8+SP x FSDP": {"tp": 8, "sp": True}}
"""The layouts `planner_comparison` plans: FULL_SHARD over every GPU; FULL_SHARD inside a node with one replica
per node; TP over a node's 8 GPUs with FULL_SHARD across nodes, without and with sequence parallelism."""


@dataclass(frozen=True)
class PlannerRow:
    """One layout for one model on one cluster size, as the planner prices it. `result` is the planner's
    `Plan` (memory and step time), None where the global batch leaves a data-parallel rank fewer sequences
    than the micro-batches (FSDP alone on more GPUs than sequences)."""

    model: str
    gpus: int
    plan: str
    micro_batches: int
    ac: str
    result: PlannerPlan | None

    @property
    def fits(self) -> bool:
        return self.result is not None and self.result.memory.fits

    @property
    def runs(self) -> bool:
        return self.result is not None

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation (torchtitan's), 0 where the layout cannot run."""
        return 0.0 if self.result is None else self.result.time.mfu

    @property
    def efficiency(self) -> float:
        """What `plot_plans` draws: here the MFU."""
        return self.mfu


def planner_comparison(models: Sequence[TransformerShape] = (LLAMA2_7B, LLAMA2_70B),
                       gpu_counts: Sequence[int] = GPU_COUNTS[3:], layouts: dict = PLANNER_LAYOUTS,
                       global_batch: int = GLOBAL_BATCH_TOKENS, seq: int = SEQUENCE_LENGTH,
                       micro_batches: int = 1, ac: str = "full", gpu: str = "h100-sxm", no_sync: bool = False,
                       tp_overlap: bool = False) -> list[PlannerRow]:
    """Every layout of `layouts` for every model and GPU count, at a fixed global batch of `global_batch`
    tokens in sequences of `seq`, each data-parallel rank's sequences in `micro_batches` micro-batches,
    checkpointing `ac` ("none", "selective-op", "selective-layer", "full"), on `gpu` (a planner preset).
    `no_sync` (with several micro-batches) and `tp_overlap` (with TP): the planner's switches of those names."""
    if global_batch % seq:
        raise ValueError(f"global_batch={global_batch} is not a whole number of sequences of {seq}")
    sequences = global_batch // seq
    rows = []
    for model in models:
        spec = get_model(model.preset)
        for gpus in gpu_counts:
            for name, degrees in layouts.items():
                tp, sp = degrees.get("tp", 1), degrees.get("sp", False)
                replicas = max(1, gpus // GPUS_PER_NODE) if degrees.get("hsdp") else 1
                dp = gpus // tp
                result = None
                if sequences % dp == 0 and (sequences // dp) % micro_batches == 0:
                    layout = Layout(gpus=gpus, seq=seq, local_batch=sequences // dp, micro_batches=micro_batches,
                                    ac=ac, tp=tp, sp=sp, dp_replicate=replicas,
                                    no_sync=no_sync and micro_batches > 1, tp_overlap=tp_overlap and tp > 1)
                    result = planner_plan(spec, get_gpu(gpu), layout)
                rows.append(PlannerRow(model.name, gpus, name, micro_batches, ac, result))
    return rows


def searched_comparison(models: Sequence[TransformerShape] = (LLAMA2_7B, LLAMA2_70B),
                        gpu_counts: Sequence[int] = GPU_COUNTS[3:], layouts: dict = PLANNER_LAYOUTS,
                        ac: str = "full", gpu: str = "h100-sxm") -> list[PlannerRow]:
    """`planner_comparison` with the micro-batches chosen, not given: for each model, GPU count and layout, the
    fastest that fits of every number of micro-batches (of those that divide the local batch), each with and
    without a gradient sync per micro-batch (`no_sync`), and with and without TP's backward overlap (`tp_overlap`),
    as a practitioner picks them: of the options that fit even at the top of the planner's memory error
    (`fit_verdict` "fits"), else of those that fit by its count; where none fits, one micro-batch as given (the row
    then does not fit either)."""
    sequences = GLOBAL_BATCH_TOKENS // SEQUENCE_LENGTH
    tried = [planner_comparison(models, gpu_counts, layouts, micro_batches=2 ** k, ac=ac, gpu=gpu, no_sync=no_sync,
                                tp_overlap=overlap)
             for k in range(sequences.bit_length()) for no_sync in (False, True) for overlap in (False, True)]
    out = []
    for options in zip(*tried):  # the same (model, GPU count, layout) under 1, 2, 4, ... micro-batches
        sure = [r for r in options if r.fits and r.result.memory.fit_verdict == "fits"]
        fitting = sure or [r for r in options if r.fits]  # within the memory error only where nothing is sure
        out.append(max(fitting, key=lambda r: r.mfu) if fitting else options[0])
    return out


def best_plans(rows: Sequence[PlannerRow]) -> dict[tuple[str, int], PlannerRow | None]:
    """For each (model, GPU count): the fastest row that fits (highest MFU), None where none fits."""
    best: dict[tuple[str, int], PlannerRow | None] = {}
    for row in rows:
        key = (row.model, row.gpus)
        best.setdefault(key, None)
        if row.fits and (best[key] is None or row.mfu > best[key].mfu):
            best[key] = row
    return best


def tp_crossing(rows: Sequence[PlannerRow], model: str) -> int | None:
    """The first GPU count from which the best layout that fits uses TP at every larger count that has a
    layout that fits; None if TP never wins."""
    best = best_plans(rows)
    counts = sorted(g for m, g in best if m == model and best[m, g] is not None)
    for i, gpus in enumerate(counts):
        if all("TP" in best[model, g].plan for g in counts[i:]):
            return gpus
    return None
