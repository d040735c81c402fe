"""A two-level network on paper: fast links inside a node, slower ones between nodes.

`fsdp_mini.course.cost` prices a collective on one kind of link. A real cluster has two: GPUs of one node talk
over NVLink (hundreds of GB/s each), GPUs of different nodes over network cards (400 Gb/s = 50 GB/s per
GPU on DGX-class machines). Which strategy wins depends on which collective runs over which link, so
this module prices every collective of one training step on such a cluster:

    cluster = Cluster(nodes=8, gpus_per_node=8, intra_bandwidth=300e9, inter_bandwidth=50e9,
                      alpha_intra=5e-6, alpha_inter=20e-6)
    step_communication(cluster, "HYBRID_SHARD", 7e9).seconds

The model, and why each piece is what it is:

* Ranks are numbered node by node (ranks 0..g-1 on node 0, as torchrun numbers them), so the grid of
  `fsdp_mini.fsdp.groups.grid` applies: shard groups are rows of `shard_size` consecutive ranks, replica
  groups are columns.
* A ring moves in lockstep: each of its steps ends when the slowest of its links has delivered its
  chunk. A ring whose ranks all live on one node runs at `intra_bandwidth` and `alpha_intra`.
* A ring over a group that spans nodes enters and leaves each node over the network, and NCCL does not send
  it all through one card: with NVLink inside the node it runs one ring per network card ("rails", one
  channel each), every ring carries its share of the chunks and leaves the node through its own card, and
  NVLink moves each chunk to the GPU whose card it takes (NVIDIA's NCCL maintainers: "we can use NVLink to
  split the operations in N parts then balance the traffic onto the N NICs", NVIDIA/nccl issue 601). So a
  group with k ranks on each node crosses on k cards at once, and its ring runs at

      ring_bandwidth(k, intra, inter) = min(intra_bandwidth, k x inter_bandwidth)     per rank

  with `alpha_inter` per step: FULL_SHARD over whole nodes of 8 crosses on all 8 cards (no slower than
  NVLink when the node's cards add up to it), HYBRID_SHARD's replica groups, one rank per node, each on one
  card. This is the model `fsdp_mini.course.planner.step_time.group_link` uses too (with the network's
  fitted efficiency); lesson 12 derives it.
* `inter_bandwidth` is the network per GPU: the node's cards' bandwidth over its GPUs (one 400 Gb/s card per
  GPU on DGX-class nodes: 50 GB/s; one card for a node of g GPUs: its bandwidth / g). Groups of the same kind
  (all shard groups, all replica groups) run at the same time and share the node's cards that way.
* Per step and unit (P = the unit's flat parameter, padded to a multiple of the shard group size n as
  fsdp_mini pads it; r = number of replicas), exactly `fsdp_mini.fsdp.fully_sharded_data_parallel`'s schedule:

      FULL_SHARD, HYBRID_SHARD      2 AllGather(P) + ReduceScatter(P)   [+ AllReduce(P/n) across r]
      SHARD_GRAD_OP, _HYBRID_ZERO2  1 AllGather(P) + ReduceScatter(P)   [+ AllReduce(P/n) across r]
      NO_SHARD                      AllReduce across all ranks of the P's, in buckets of at least
                                    `bucket_cap_mb` filled in backward order (`fsdp_mini.parallel.grad_buckets`)

  FULL_SHARD shards over the whole world, so its shard group spans nodes and every AllGather and
  ReduceScatter crosses the network. HYBRID_SHARD shards inside a node (default `shard_size` =
  `gpus_per_node`), so AllGather and ReduceScatter stay on NVLink and only the AllReduce of a
  1/gpus_per_node gradient shard crosses nodes. NO_SHARD (DDP) AllReduces every gradient across nodes.

What it ignores: overlap (FSDP prefetches the next AllGather during compute, so a step waits for
max(compute, communication), not their sum; `seconds` here is the communication a step has to hide),
NCCL's hierarchical and tree algorithms for multi-node all-reduce, an uneven split of the chunks over the
rails, congestion in the network, and the time to compute reductions. Use it to compare strategies
on one cluster and to see which link each one stresses; measure before quoting absolute times.

Bytes sent per rank use `fsdp_mini.ring_model.ring_model_sent`, the ring model CommLog applies to the
builtin collectives, so a prediction for the small GPT matches a CommLog of a real run byte for byte.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence

from fsdp_mini.course.cost import predict
from fsdp_mini.parallel.grad_buckets import MiB, assign_buckets
from fsdp_mini.fsdp.groups import grid
from fsdp_mini.ring_model import ring_model_sent
from fsdp_mini.fsdp.strategy import StrategyLike, as_strategy, is_hybrid, shard_group_size
from fsdp_mini.fsdp.strategy_facts import all_gathers_per_step

__all__ = ["Cluster", "Collective", "StepComm", "ring_bandwidth", "step_communication", "compare_strategies"]


def ring_bandwidth(members_per_node: int, intra_bandwidth: float, inter_bandwidth: float) -> float:
    """Bytes/s per rank of a ring over a group that spans nodes with `members_per_node` of its ranks on each
    node: it leaves every node on its members' network cards at once (one NCCL ring per card, NVLink bringing
    each chunk to its card), `inter_bandwidth` each, and cannot run faster than NVLink inside the node. One home
    for the course's multi-rail model: `Cluster.link` and the planner's `group_link` both call it."""
    if isinstance(members_per_node, bool) or not isinstance(members_per_node, int) or members_per_node < 1:
        raise ValueError(f"members_per_node must be an integer >= 1, got {members_per_node!r}")
    return min(intra_bandwidth, members_per_node * inter_bandwidth)

@dataclass(frozen=True)
class Cluster:
    """`nodes` machines of `gpus_per_node` GPUs. Bandwidths in bytes/s per GPU (NVLink inside a node,
    the node's network cards between nodes, divided by its GPUs), latencies `alpha_*` in seconds per ring step."""

    nodes: int
    gpus_per_node: int
    intra_bandwidth: float
    inter_bandwidth: float
    alpha_intra: float
    alpha_inter: float

    def __post_init__(self) -> None:
        for name in ("nodes", "gpus_per_node"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("intra_bandwidth", "inter_bandwidth"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 bytes/s, got {getattr(self, name)!r}")
        for name in ("alpha_intra", "alpha_inter"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0 seconds, got {getattr(self, name)!r}")

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    def node_of(self, rank: int) -> int:
        """The node that global rank `rank` runs on (ranks are numbered node by node)."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside a world of {self.world_size}")
        return rank // self.gpus_per_node

    def spans_nodes(self, ranks: Iterable[int]) -> bool:
        """True when the ranks do not all live on one node: their ring must cross the network."""
        return len({self.node_of(r) for r in ranks}) > 1

    def cards(self, ranks: Iterable[int]) -> int:
        """The network cards per node a ring over `ranks` leaves on: its ranks per node (the fewest on any of
        its nodes: a ring runs at its slowest crossing); 0 when they all live on one node."""
        if isinstance(ranks, bool):
            raise TypeError("pass the ring's ranks (e.g. range(cluster.world_size) for FULL_SHARD), not a bool: "
                            "how fast a ring crosses nodes depends on how many of its ranks each node holds")
        per_node = Counter(self.node_of(r) for r in ranks)
        return min(per_node.values()) if len(per_node) > 1 else 0

    def link(self, ranks: Iterable[int]) -> tuple[float, float]:
        """(alpha, bandwidth) of a ring over `ranks`: NVLink's inside one node; across nodes the network's
        alpha and the `ring_bandwidth` of the cards it leaves each node on."""
        cards = self.cards(ranks)
        if cards == 0:
            return self.alpha_intra, self.intra_bandwidth
        return self.alpha_inter, ring_bandwidth(cards, self.intra_bandwidth, self.inter_bandwidth)


@dataclass(frozen=True)
class Collective:
    """`count` identical collectives of one step: `op` over groups of `group_size` ranks on `nbytes`
    (S, the full tensor, as in CommLog), whether their groups cross nodes, and per call the predicted
    `seconds` and the bytes `sent` by one rank. `cards`: the network cards per node a crossing group's ring
    leaves on (its ranks per node; 0 when it stays inside a node), so a rank's card carries `sent / cards`
    and NVLink the rest."""

    op: str
    nbytes: int
    group_size: int
    count: int
    crosses_nodes: bool
    seconds: float
    sent: int
    cards: int = 0

    @property
    def total_seconds(self) -> float:
        return self.count * self.seconds

    @property
    def total_sent(self) -> int:
        return self.count * self.sent

    @property
    def total_network(self) -> float:
        """Bytes per step that one rank's network card sends for these calls (0 inside a node)."""
        return self.count * self.sent / self.cards if self.crosses_nodes else 0


@dataclass(frozen=True)
class StepComm:
    """Every collective of one training step of `strategy`, and their sums: time and bytes per rank,
    split by whether the group stays in a node (`intra`) or crosses nodes (`inter`)."""

    strategy: str
    shard_size: int
    replicas: int
    collectives: tuple[Collective, ...]

    def _sum(self, attr: str, crosses: bool | None):
        return sum(getattr(c, attr) for c in self.collectives if crosses is None or c.crosses_nodes == crosses)

    @property
    def seconds(self) -> float:
        """Predicted communication time of the step, collectives one after another (no overlap)."""
        return self._sum("total_seconds", None)

    @property
    def intra_seconds(self) -> float:
        return self._sum("total_seconds", False)

    @property
    def inter_seconds(self) -> float:
        return self._sum("total_seconds", True)

    @property
    def sent(self) -> int:
        """Bytes one rank sends per step."""
        return self._sum("total_sent", None)

    @property
    def sent_intra(self) -> int:
        """Bytes one rank sends in collectives whose groups stay inside a node."""
        return self._sum("total_sent", False)

    @property
    def sent_inter(self) -> int:
        """Bytes one rank sends in collectives whose groups span nodes; of these its network card carries
        `sent_network`, NVLink the rest (the group's other ranks on the node are its ring's neighbours)."""
        return self._sum("total_sent", True)

    @property
    def sent_network(self) -> int:
        """Bytes one rank's network card sends per step: what leaves a node, over its cards (to the byte)."""
        return round(self._sum("total_network", None))

    @property
    def sent_nvlink(self) -> int:
        """Bytes one rank sends over NVLink per step: everything but what its network card carries."""
        return self.sent - self.sent_network


def _unit_sizes(num_params, units: int) -> list[int]:
    if isinstance(num_params, (int, float)) and not isinstance(num_params, bool):
        if isinstance(num_params, float):
            if not num_params.is_integer():
                raise ValueError(f"num_params must be an integer, got {num_params!r}")
            num_params = int(num_params)
        if num_params < 1:
            raise ValueError(f"num_params must be >= 1, got {num_params}")
        if isinstance(units, bool) or not isinstance(units, int) or not 1 <= units <= num_params:
            raise ValueError(f"units must be an integer in [1, num_params], got {units!r}")
        base, extra = divmod(num_params, units)
        return [base + (1 if i < extra else 0) for i in range(units)]
    sizes = list(num_params)
    if units != 1:
        raise ValueError("pass either a list of unit sizes or units=, not both")
    if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
        raise ValueError(f"unit sizes must be integers >= 1, got {sizes!r}")
    return sizes


def _buckets(unit_sizes: list[int], grad_bytes: int, cap_mb: float) -> list[int]:
    """Elements per gradient bucket: units join in backward order (the last unit first, the root last)
    by DDP's bucket rule, the one `fsdp_mini.parallel.grad_buckets` gives the engine."""
    backward_order = [(numel, numel * grad_bytes, None) for numel in reversed(unit_sizes)]
    return [sum(bucket) for bucket in assign_buckets(backward_order, cap_mb * MiB)]


def step_communication(cluster: Cluster, strategy: StrategyLike, num_params: int | float | Sequence[int], *,
                       units: int = 1, shard_size: int | None = None, param_bytes: int = 2, grad_bytes: int = 2,
                       root_stays_gathered: bool = False, bucket_cap_mb: float = 25) -> StepComm:
    """Predicted collectives of one training step of `strategy` on `cluster`.

    `num_params`: the whole model's parameter count, cut into `units` equal FSDP units, or a list of
    each unit's parameter count. `param_bytes` is the element size parameters are gathered in (2 for
    bf16), `grad_bytes` the one gradients are reduced in. `shard_size` (hybrid strategies only)
    defaults to `gpus_per_node`: one node per shard group. `root_stays_gathered`: the first unit is the
    root, which fsdp_mini and FSDP2 keep gathered from forward to backward, so it gathers once.
    `bucket_cap_mb`: NO_SHARD's gradient buckets, as `fsdp_mini.FSDP`'s argument of that name.
    """
    strategy = as_strategy(strategy)
    world = cluster.world_size
    if is_hybrid(strategy) and shard_size is None:
        shard_size = cluster.gpus_per_node
    n = shard_group_size(strategy, world, shard_size)
    replicas = world // n
    rows, cols = grid(world, n)
    shard_group, replica_group = tuple(rows[0]), tuple(cols[0])  # every row (column) lies on the nodes alike

    calls: Counter = Counter()
    sizes = _unit_sizes(num_params, units)
    if n == 1:  # NO_SHARD: nothing to gather; the gradients travel in buckets
        for numel in _buckets(sizes, grad_bytes, bucket_cap_mb) if replicas > 1 else []:
            calls[("all_reduce", numel, grad_bytes, replica_group)] += 1
    else:
        for i, numel in enumerate(sizes):
            padded = math.ceil(numel / n) * n  # fsdp_mini's flat layout: equal shards
            gathers = all_gathers_per_step(strategy)
            if root_stays_gathered and i == 0:
                gathers = min(gathers, 1)
            calls[("all_gather", padded, param_bytes, shard_group)] += gathers
            calls[("reduce_scatter", padded, grad_bytes, shard_group)] += 1
            if replicas > 1:
                calls[("all_reduce", padded // n, grad_bytes, replica_group)] += 1

    collectives = []
    for (op, numel, size, group), count in sorted(calls.items()):
        if count == 0:
            continue
        alpha, bandwidth = cluster.link(group)  # NVLink, or the network on the group's cards per node
        nbytes, cards = numel * size, cluster.cards(group)
        collectives.append(Collective(op=op, nbytes=nbytes, group_size=len(group), count=count, crosses_nodes=cards > 0,
                                      seconds=predict(op, nbytes, len(group), alpha, bandwidth),
                                      sent=ring_model_sent(op, numel, size, len(group)), cards=cards))
    return StepComm(strategy=strategy.name, shard_size=n, replicas=replicas, collectives=tuple(collectives))


def compare_strategies(cluster: Cluster, num_params, strategies=("NO_SHARD", "FULL_SHARD", "HYBRID_SHARD"),
                       **kwargs) -> dict[str, StepComm]:
    """`step_communication` for each strategy (same model, same cluster), keyed by strategy name."""
    return {as_strategy(s).name: step_communication(cluster, s, num_params, **kwargs) for s in strategies}
