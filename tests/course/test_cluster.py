"""The two-level cluster model: which collectives cross nodes, their ring times on the right link (multi-rail
across nodes: a group with k ranks per node leaves it on k network cards), and bytes per rank that match a
CommLog of a real run byte for byte."""
import math
from collections import Counter

import pytest
import torch

from fsdp_mini import CommLog, FSDP, launch
from fsdp_mini.course.cluster import Cluster, compare_strategies, ring_bandwidth, step_communication
from fsdp_mini.course.models import GPT, Block, GPTConfig
from fsdp_mini.course.train import train

# NVLink-like inside, 400 Gb/s = 50 GB/s between: eight cards out of a node add up to more than NVLink.
C88 = Cluster(nodes=8, gpus_per_node=8, intra_bandwidth=300e9, inter_bandwidth=50e9,
              alpha_intra=5e-6, alpha_inter=20e-6)
# The same nodes behind one 400 Gb/s card each: 50 GB/s per node, 6.25 GB/s per GPU.
THIN = Cluster(nodes=8, gpus_per_node=8, intra_bandwidth=300e9, inter_bandwidth=50e9 / 8,
               alpha_intra=5e-6, alpha_inter=20e-6)
P = 7 * 2**30  # divisible by 64: no padding, so the formulas read exactly as on paper
S = 2 * P  # bf16 bytes


def close(a, b):
    return math.isclose(a, b, rel_tol=1e-12)


def by_op(step):
    return {c.op: c for c in step.collectives}


def test_cluster_validates_its_arguments_and_places_ranks_node_by_node():
    assert C88.world_size == 64 and C88.node_of(0) == 0 and C88.node_of(7) == 0 and C88.node_of(8) == 1
    assert not C88.spans_nodes(range(8)) and C88.spans_nodes([7, 8]) and C88.spans_nodes([0, 8, 16])
    assert C88.link(range(8)) == (5e-6, 300e9) and C88.cards(range(8)) == 0
    # across nodes: the ring leaves each node on its ranks' cards there, at most as fast as NVLink
    assert C88.link(range(64)) == (20e-6, 300e9) and C88.cards(range(64)) == 8
    assert C88.link(range(0, 64, 8)) == (20e-6, 50e9) and C88.cards(range(0, 64, 8)) == 1
    assert C88.link(range(0, 64, 2)) == (20e-6, 200e9) and THIN.link(range(64)) == (20e-6, 50e9)
    assert C88.cards([0, 1, 2, 8]) == 1  # a ring runs at its slowest crossing
    assert ring_bandwidth(3, 300e9, 50e9) == 150e9 and ring_bandwidth(8, 300e9, 50e9) == 300e9
    with pytest.raises(TypeError, match="ranks"):
        C88.link(True)
    with pytest.raises(ValueError, match="members_per_node"):
        ring_bandwidth(0, 300e9, 50e9)
    for bad in ({"nodes": 0}, {"gpus_per_node": 2.0}, {"inter_bandwidth": 0}, {"alpha_intra": -1.0}):
        kwargs = dict(nodes=2, gpus_per_node=2, intra_bandwidth=1.0, inter_bandwidth=1.0, alpha_intra=0.0,
                      alpha_inter=0.0) | bad
        with pytest.raises(ValueError):
            Cluster(**kwargs)
    with pytest.raises(ValueError):
        C88.node_of(64)


def test_ddp_all_reduces_everything_across_nodes_on_all_of_a_nodes_cards():
    step = step_communication(C88, "NO_SHARD", P)
    (ar,) = step.collectives
    assert (ar.op, ar.group_size, ar.count, ar.crosses_nodes, ar.nbytes) == ("all_reduce", 64, 1, True, S)
    assert close(step.seconds, 2 * 63 * 20e-6 + 2 * 63 / 64 * S / 300e9)  # 8 cards x 50 GB/s > NVLink
    assert close(step_communication(THIN, "NO_SHARD", P).seconds, 2 * 63 * 20e-6 + 2 * 63 / 64 * S / 50e9)
    assert step.sent_inter == 2 * 63 * S // 64 and step.sent_intra == 0 and step.intra_seconds == 0
    assert close(step.sent_network, step.sent / 8) and close(step.sent_nvlink, 7 * step.sent / 8)


def test_full_shard_over_all_ranks_crosses_nodes_for_every_gather_and_scatter():
    step = step_communication(C88, "FULL_SHARD", P)
    ops = by_op(step)
    assert ops["all_gather"].count == 2 and ops["reduce_scatter"].count == 1 and "all_reduce" not in ops
    assert all(c.crosses_nodes and c.group_size == 64 and c.cards == 8 for c in step.collectives)
    assert close(step.seconds, 3 * (63 * 20e-6 + 63 / 64 * S / 300e9))
    assert close(step_communication(THIN, "FULL_SHARD", P).seconds, 3 * (63 * 20e-6 + 63 / 64 * S / 50e9))
    assert step.sent == step.sent_inter == 3 * 63 * S // 64 and close(step.sent_network, step.sent / 8)
    # ZeRO-2 skips the backward gather: one AllGather fewer, same link.
    grad_op = step_communication(C88, "SHARD_GRAD_OP", P)
    assert close(grad_op.seconds, 2 / 3 * step.seconds)


def test_hybrid_keeps_gather_and_scatter_in_the_node_and_all_reduces_a_shard_across():
    step = step_communication(C88, "HYBRID_SHARD", P)
    ops = by_op(step)
    assert (step.shard_size, step.replicas) == (8, 8)
    assert not ops["all_gather"].crosses_nodes and not ops["reduce_scatter"].crosses_nodes
    ar = ops["all_reduce"]
    assert ar.crosses_nodes and ar.group_size == 8 and ar.nbytes == S // 8  # one gradient shard
    intra = 3 * (7 * 5e-6 + 7 / 8 * S / 300e9)
    inter = 2 * 7 * 20e-6 + 2 * 7 / 8 * (S / 8) / 50e9
    assert close(step.intra_seconds, intra) and close(step.inter_seconds, inter)
    assert step.sent_inter == 2 * 7 * (S // 8) // 8 and step.sent_intra == 3 * 7 * S // 8
    assert step.sent_network == step.sent_inter  # one rank per node: the card carries the whole AllReduce
    # What leaves a node: 7/8 of DDP's (2 S 7/8 against 2 S 63/64), about 0.6 of FULL_SHARD's (3 S 63/64).
    ddp, full = step_communication(C88, "NO_SHARD", P), step_communication(C88, "FULL_SHARD", P)
    assert close(step.sent_network / ddp.sent_network, (7 / 8) / (63 / 64))
    assert close(step.sent_network / full.sent_network, (2 * 7 / 8) / (3 * 63 / 64))
    # on 8 cards per node the bytes cross at NVLink's pace: what separates them is latency, 63 steps per ring
    # of FULL_SHARD, so with one unit FULL_SHARD is faster and with 32 (a 7B model's blocks) slower
    assert full.seconds < step.seconds
    assert step_communication(C88, "FULL_SHARD", P, units=32).seconds > step_communication(
        C88, "HYBRID_SHARD", P, units=32).seconds
    # With one card per node, bytes per card decide: hybrid beats FULL_SHARD by their ratio, and DDP a little.
    thin = {s: step_communication(THIN, s, P, units=32) for s in ("NO_SHARD", "FULL_SHARD", "HYBRID_SHARD")}
    assert thin["HYBRID_SHARD"].seconds < thin["NO_SHARD"].seconds < thin["FULL_SHARD"].seconds
    assert thin["FULL_SHARD"].seconds > 1.4 * thin["HYBRID_SHARD"].seconds


def test_hybrid_degenerates_to_full_shard_and_one_node_needs_no_network():
    whole = step_communication(C88, "HYBRID_SHARD", P, shard_size=64)
    assert whole.replicas == 1 and close(whole.seconds, step_communication(C88, "FULL_SHARD", P).seconds)
    one_node = Cluster(1, 8, 300e9, 50e9, 5e-6, 20e-6)
    for strategy in ("NO_SHARD", "FULL_SHARD", "HYBRID_SHARD"):
        assert step_communication(one_node, strategy, P).inter_seconds == 0
    # A shard group of two nodes crosses the network again: on a thin network, hybrid helps inside a node only.
    two_nodes = step_communication(THIN, "HYBRID_SHARD", P, shard_size=16)
    assert all(c.crosses_nodes for c in two_nodes.collectives)
    assert two_nodes.seconds > 1.5 * step_communication(THIN, "HYBRID_SHARD", P).seconds


def test_units_multiply_latency_not_bandwidth_and_the_root_gathers_once():
    one = step_communication(C88, "FULL_SHARD", P)
    many = step_communication(C88, "FULL_SHARD", P, units=32)
    assert close(many.seconds - one.seconds, 31 * 3 * 63 * 20e-6)
    assert many.sent == one.sent
    listed = step_communication(C88, "FULL_SHARD", [P // 32] * 32)
    assert listed == many
    rooted = step_communication(C88, "FULL_SHARD", [P // 32] * 32, root_stays_gathered=True)
    assert sum(c.count for c in rooted.collectives if c.op == "all_gather") == 63
    compared = compare_strategies(C88, P)
    assert list(compared) == ["NO_SHARD", "FULL_SHARD", "HYBRID_SHARD"] and compared["FULL_SHARD"] == one


def test_padding_and_bad_input():
    step = step_communication(C88, "FULL_SHARD", 100)  # padded to 128 elements, like fsdp_mini's layout
    assert by_op(step)["all_gather"].nbytes == 128 * 2
    for kwargs in ({"num_params": 0}, {"num_params": 1.5}, {"num_params": [3, 0]}, {"num_params": 10, "units": 11},
                   {"num_params": [5, 5], "units": 2}):
        with pytest.raises(ValueError):
            step_communication(C88, "FULL_SHARD", **kwargs)
    with pytest.raises(ValueError, match="hybrid"):
        step_communication(C88, "FULL_SHARD", P, shard_size=8)
    with pytest.raises(ValueError, match="divisor"):
        step_communication(C88, "HYBRID_SHARD", P, shard_size=3)


CFG = GPTConfig()


def _unit_sizes():
    model = GPT(CFG)
    blocks = [sum(p.numel() for p in b.parameters()) for b in model.blocks]
    return [sum(p.numel() for p in model.parameters()) - sum(blocks)] + blocks  # the root first


def _logged_step():
    out = {}
    for strategy in ("NO_SHARD", "FULL_SHARD", "HYBRID_SHARD"):
        model = FSDP(GPT(CFG), strategy, wrap=(Block,))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with CommLog() as log:
            train(model, opt, CFG, 1, 8)
        out[strategy] = Counter((r.op, r.nbytes, r.group_size, r.sent) for r in log.records)
    return out


def test_prediction_matches_a_commlog_of_fsdp_mini_on_two_simulated_nodes(no_orphans):
    cluster = Cluster(nodes=2, gpus_per_node=2, intra_bandwidth=1e9, inter_bandwidth=1e8, alpha_intra=0.0,
                      alpha_inter=0.0)
    logged = launch(_logged_step, 4, local_world_size=2, timeout=120)
    for strategy, counts in logged[0].items():
        step = step_communication(cluster, strategy, _unit_sizes(), param_bytes=4, grad_bytes=4,
                                  root_stays_gathered=True)
        predicted = Counter()
        for c in step.collectives:
            predicted[(c.op, c.nbytes, c.group_size, c.sent)] += c.count
        assert counts == predicted, strategy
        assert all(r == logged[0][strategy] for r in (res[strategy] for res in logged)), "every rank alike"


def test_the_planner_prices_every_ring_as_the_cluster_model_does():
    """One network model: the planner's `group_link` (at the network's nominal bandwidth) and `Cluster.link` give
    the same (alpha, bandwidth) for every group a mesh of whole nodes forms, on every GPU preset."""
    from fsdp_mini.course.planner.hardware import GPUS
    from fsdp_mini.course.planner.step_time import group_link
    checked = 0
    for gpu in GPUS.values():
        for nodes in (1, 2, 8):
            cluster = Cluster(nodes, 8, gpu.nvlink_bandwidth, gpu.network_bandwidth, gpu.alpha_nvlink,
                              gpu.alpha_network)
            for stride in (1, 2, 4, 8, 16):
                for size in (2, 4, 8, 16, 32, 64):
                    if cluster.world_size % (size * stride) == 0:
                        ranks = range(0, size * stride, stride)
                        assert group_link(size, stride, gpu, 8) == cluster.link(ranks), (gpu.name, size, stride)
                        checked += 1
    assert checked > 100
