"""Lesson 12 on paper (fsdp_mini.course.scaling): each function against a hand computation on a small case,
and the crossing points and trends the lesson states, on lesson 11's H100 cluster."""
import math

import pytest

from fsdp_mini import estimate_memory
from fsdp_mini.course.cluster import Cluster, step_communication
from fsdp_mini.course.exercises.activations import tokens_to_hide
from fsdp_mini.course.scaling import (
    GLOBAL_BATCH_TOKENS, GPU_COUNTS, H100_FLOPS, HSDP_PLAN, LLAMA2_13B, LLAMA2_70B, LLAMA2_7B, PLANS, Plan,
    TP8_FSDP_PLAN, FSDP_PLAN, TransformerShape, compare_plans, fsdp_scaling, h100_cluster,
    latency_equals_bandwidth_at, mesh_layout, scaling_limits)

# a cluster with round numbers: 2 nodes x 2 GPUs, 1 MB/s and 1 ms across nodes, 10 MB/s and 0.1 ms inside
SMALL = Cluster(nodes=2, gpus_per_node=2, intra_bandwidth=10e6, inter_bandwidth=1e6, alpha_intra=1e-4,
                alpha_inter=1e-3)
TINY = TransformerShape("tiny", hidden=8, layers=2, ffn=16, heads=2, kv_heads=2, vocab=10)


def close(a, b):
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15)


# --- the models -------------------------------------------------------------------------------------------

def test_llama2_shapes_give_the_published_parameter_counts():
    assert (LLAMA2_7B.params, LLAMA2_13B.params, LLAMA2_70B.params) == (6_738_415_616, 13_015_864_320,
                                                                        68_976_648_192)
    assert (LLAMA2_7B.block_params, LLAMA2_70B.block_params) == (202_383_360, 855_654_400)


def test_shapes_count_what_transformers_builds():
    """The same count as Hugging Face's Llama of the same shapes (grouped-query attention, untied head)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    shape = TransformerShape("small", hidden=64, layers=3, ffn=176, heads=8, kv_heads=2, vocab=101)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=176, num_hidden_layers=3,
                                      num_attention_heads=8, num_key_value_heads=2, vocab_size=101,
                                      tie_word_embeddings=False)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    assert sum(p.numel() for p in model.parameters()) == shape.params
    assert sum(p.numel() for p in model.model.layers[0].parameters()) == shape.block_params


def test_tensor_parallel_share_of_a_block_by_hand():
    # TINY: q, k, v, o 8x8 each = 256, MLP 3 x 8 x 16 = 384, two norms of 8: 656 per block.
    assert TINY.block_params == 656
    # TP 2 halves the matrices (320) and replicates the norms (16): 336
    assert TINY.block_params_per_tp_rank(2) == 336
    # whole model per TP rank: 2 blocks, embedding and head split over the vocabulary (5 rows of 8 each), norm 8
    assert TINY.params_per_tp_rank(2) == 2 * 336 + 2 * 5 * 8 + 8
    assert TINY.params_per_tp_rank(1) == TINY.params


def test_a_tp_degree_must_split_heads_and_mlp_evenly():
    with pytest.raises(ValueError, match="tp=16 does not divide Llama-2-70B's kv_heads=8"):
        LLAMA2_70B.block_params_per_tp_rank(16)
    with pytest.raises(ValueError, match="tp=3 does not divide tiny's heads=2"):
        TINY.check_tp(3)
    with pytest.raises(ValueError, match="tp must be an integer >= 1"):
        TINY.check_tp(0)
    with pytest.raises(ValueError, match="kv_heads=3 must divide heads"):
        TransformerShape("bad", hidden=8, layers=1, ffn=8, heads=2, kv_heads=3, vocab=4)


def test_h100_cluster_is_lesson_11s():
    assert h100_cluster(8) == Cluster(1, 8, 450e9, 50e9, 5e-6, 20e-6)
    assert h100_cluster(512) == Cluster(64, 8, 450e9, 50e9, 5e-6, 20e-6)
    assert GPU_COUNTS == (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
    assert GLOBAL_BATCH_TOKENS == 1024 * 4096 and H100_FLOPS == 989e12 * 0.45
    with pytest.raises(ValueError, match="a multiple of 8"):
        h100_cluster(12)


# --- 1. where FSDP alone stops scaling ----------------------------------------------------------------------

def test_fsdp_scaling_by_hand_on_a_small_cluster():
    # 1,024 bf16 parameters over 4 GPUs on 2 nodes: the ring crosses the network on both ranks' cards of a node
    # (2 x 1e6 B/s, below NVLink's 10e6). AllGather of S = 2,048 B: 3 x 1 ms + 3/4 x 2,048 / 2e6 s = 3 ms +
    # 0.768 ms = 3.768 ms; a forward at 1e9 FLOP/s takes 2 x 1,024 x T / 1e9 s, so T >= 3.768e-3 x 1e9 / 2,048 =
    # 1,839.8: 1,840 tokens hide it. 6,000 tokens give each GPU 1,500.
    (row,) = fsdp_scaling(1024, gpu_counts=[4], global_batch=6000, flops_per_s=1e9, cluster_for=lambda n: SMALL)
    assert (row.gpus, row.nodes, row.tokens_per_gpu, row.tokens_to_hide) == (4, 2, 1500, 1840)
    assert close(row.latency_s, 3e-3) and close(row.bandwidth_s, 0.768e-3) and close(row.gather_s, 3.768e-3)
    assert close(row.forward_s, 3.072e-3) and close(row.exposed_s, 0.696e-3)
    assert not row.hides and row.latency_dominates
    assert row.tokens_to_hide == tokens_to_hide(1024, 2, SMALL, 1e9)  # lesson 11's exercise, the same rule
    (more,) = fsdp_scaling(1024, gpu_counts=[4], global_batch=4 * 1840, flops_per_s=1e9,
                           cluster_for=lambda n: SMALL)
    assert more.hides and more.exposed_s == 0


def test_tokens_per_gpu_fall_while_the_tokens_to_hide_grow():
    rows = fsdp_scaling(LLAMA2_70B.block_params)
    assert [r.gpus for r in rows] == list(GPU_COUNTS)
    assert all(r.tokens_per_gpu * r.gpus == GLOBAL_BATCH_TOKENS for r in rows)
    across = rows[1:]  # from 2 nodes on, the ring crosses InfiniBand on all 8 cards of each node
    assert all(a.tokens_to_hide < b.tokens_to_hide for a, b in zip(across, across[1:]))
    # the latency term grows as N - 1; the bandwidth term stays below S / B whatever N is
    unit_bytes = 2 * LLAMA2_70B.block_params
    assert all(close(r.latency_s, (r.gpus - 1) * 20e-6) for r in across)
    assert all(r.bandwidth_s < unit_bytes / 400e9 for r in across)
    assert across[-1].bandwidth_s / across[0].bandwidth_s < 1.07 < across[-1].latency_s / across[0].latency_s


def test_where_fsdp_alone_stops_hiding_the_allgather():
    """Lesson 12: with Llama 2's 4M-token batch, a 70B block's AllGather stops hiding at 1,024 H100s."""
    rows = fsdp_scaling(LLAMA2_70B.block_params)
    limits = scaling_limits(rows)
    assert limits.stops_hiding_at == 1024 and limits.last_hiding == 512
    by = {r.gpus: r for r in rows}
    assert by[512].tokens_per_gpu == 8192 > by[512].tokens_to_hide
    assert by[1024].tokens_per_gpu == 4096 < by[1024].tokens_to_hide
    assert all(r.hides == (r.gpus <= 512) for r in rows)
    # from one node to two the AllGather slows by less than half: 8 cards of 50 GB/s against NVLink's 450
    assert 1.2 < by[16].gather_s / by[8].gather_s < 1.4
    # a 7B block: the same bandwidth term, more latency per parameter; it stops a doubling earlier
    assert scaling_limits(fsdp_scaling(LLAMA2_7B.block_params)).stops_hiding_at == 512
    # 2,048 GPUs or more: less than one 4,096-token sequence per GPU
    assert limits.splits_sequences_at == 2048


def test_where_the_rings_latency_dominates():
    # n = S / (alpha B): 1.711 GB / (20 us x 400 GB/s) = 214 for a 70B block, 51 for a 7B block
    crossing_70b = latency_equals_bandwidth_at(2 * LLAMA2_70B.block_params, 20e-6, 400e9)
    assert close(crossing_70b, 2 * 855_654_400 / 8e6)
    assert scaling_limits(fsdp_scaling(LLAMA2_70B.block_params)).latency_dominates_at == 256
    crossing_7b = latency_equals_bandwidth_at(2 * LLAMA2_7B.block_params, 20e-6, 400e9)
    assert 32 < crossing_7b < 64
    assert scaling_limits(fsdp_scaling(LLAMA2_7B.block_params)).latency_dominates_at == 64
    # at the crossing the two terms are equal, by construction
    n = 1000
    s = n * 20e-6 * 50e9
    assert close((n - 1) * 20e-6, (n - 1) / n * s / 50e9)
    with pytest.raises(ValueError):
        latency_equals_bandwidth_at(0, 20e-6, 50e9)


def test_scaling_limits_refuses_rows_that_come_back():
    rows = fsdp_scaling(LLAMA2_70B.block_params)
    with pytest.raises(ValueError, match="growing GPU counts"):
        scaling_limits(rows[::-1])
    mixed = rows[:8] + fsdp_scaling(LLAMA2_70B.block_params, gpu_counts=[2048], global_batch=2**27)
    with pytest.raises(ValueError, match="hides again"):
        scaling_limits(mixed)


# --- 2. TP x FSDP on a 2-D mesh ---------------------------------------------------------------------------

def test_mesh_layout_by_hand():
    # TINY on SMALL: TP 2 inside each node, FULL_SHARD over the 2 nodes; 16 tokens a step, 8 per TP group.
    layout = mesh_layout(TINY, SMALL, tp=2, global_batch=16)
    assert (layout.tp, layout.dp, layout.shard_size, layout.tokens_per_dp_rank) == (2, 2, 2, 8)
    assert (layout.unit_params, layout.block_params_per_rank) == (336, 168)
    assert layout.params_per_rank == (2 * 336 + 2 * 5 * 8 + 8) // 2
    by = {(t.purpose, t.op): t for t in layout.traffic}
    assert set(by) == {("TP", "all_reduce"), ("FSDP", "all_gather"), ("FSDP", "reduce_scatter")}
    # TP: 4 AllReduces per block of 8 tokens x 8 wide x 2 B = 128 B, on NVLink; each rank sends 2(n-1)/n S = 128 B
    tp = by["TP", "all_reduce"]
    assert (tp.link, tp.group_size, tp.nbytes, tp.count, tp.sent) == ("NVLink", 2, 128, 8, 128)
    assert close(tp.seconds, 2 * 1e-4 + 128 / 10e6)
    # FSDP: 2 AllGathers + 1 ReduceScatter per block of 336 x 2 B = 672 B over 2 nodes; each rank sends 336 B
    ag, rs = by["FSDP", "all_gather"], by["FSDP", "reduce_scatter"]
    # (one rank per node: its ring leaves each node on one card)
    assert (ag.link, ag.group_size, ag.nbytes, ag.count, ag.sent, ag.cards) == ("network", 2, 672, 4, 336, 1)
    assert (rs.link, rs.nbytes, rs.count, rs.sent) == ("network", 672, 2, 336)
    assert close(ag.seconds, 1e-3 + 336 / 1e6)
    assert layout.sent_on("NVLink") == 8 * 128 == 1024
    assert layout.sent_on("network") == 6 * 336 == 2016 == layout.sent_on("network", "FSDP")
    with pytest.raises(ValueError, match="link must be"):
        layout.sent_on("infiniband")
    assert close(layout.seconds_of("TP"), 8 * tp.seconds)
    # without resharding after forward: one AllGather per block
    once = mesh_layout(TINY, SMALL, tp=2, global_batch=16, reshard_after_forward=False)
    assert {t.op: t.count for t in once.traffic if t.purpose == "FSDP"} == {"all_gather": 2, "reduce_scatter": 2}


def test_tp_groups_that_span_nodes_use_the_network():
    # TP 2 fits in a node of SMALL; TP 4 spans its 2 nodes, so its ring crosses them (and dp = 1: no FSDP)
    layout = mesh_layout(TINY, SMALL, tp=2, global_batch=16)
    assert [t.link for t in layout.traffic if t.purpose == "TP"] == ["NVLink"]
    wide = TransformerShape("wide", hidden=8, layers=1, ffn=16, heads=4, kv_heads=4, vocab=8)
    spans = mesh_layout(wide, SMALL, tp=4, global_batch=16)
    assert [(t.purpose, t.link) for t in spans.traffic] == [("TP", "network")]


@pytest.mark.parametrize("strategy,shard", [("FULL_SHARD", None), ("HYBRID_SHARD", 8)])
def test_mesh_layout_with_tp_1_is_lesson_11s_cluster_model(strategy, shard):
    """With tp = 1 the FSDP part is `step_communication`'s, collective for collective (blocks as units)."""
    cluster = h100_cluster(64)
    layout = mesh_layout(LLAMA2_7B, cluster, tp=1, shard_size=shard)
    step = step_communication(cluster, strategy, [LLAMA2_7B.block_params] * LLAMA2_7B.layers, shard_size=shard)
    ours = sorted((t.op, t.nbytes, t.group_size, t.count, t.sent) for t in layout.traffic)
    theirs = sorted((c.op, c.nbytes, c.group_size, c.count, c.sent) for c in step.collectives)
    assert ours == theirs and not [t for t in layout.traffic if t.purpose == "TP"]
    assert close(layout.seconds_of("FSDP"), step.seconds)
    assert close(layout.sent_on("network"), step.sent_network) and close(layout.sent_on("NVLink"), step.sent_nvlink)


def test_tp8_keeps_the_bytes_each_network_card_carries_and_shortens_the_ring():
    """Lesson 12, part 3: Llama-2-70B on 512 H100s, per rank and step."""
    cluster = h100_cluster(512)
    fsdp, both = mesh_layout(LLAMA2_70B, cluster, tp=1), mesh_layout(LLAMA2_70B, cluster, tp=8)
    assert both.dp == 64 and both.tokens_per_dp_rank == 65536
    # FSDP alone: 2 AllGathers + 1 ReduceScatter of the whole block over 512 ranks, 8 of them on each node,
    # so each rank's card carries an eighth of its ring's bytes. TP8 x FSDP: a block's 1/8 share (the matrices
    # split 8 ways, the two norms of 8,192 whole) over 64 ranks, one per node, all of it on the rank's card.
    share = (855_654_400 - 2 * 8192) // 8 + 2 * 8192
    assert both.unit_params == share == 106_971_136
    assert both.sent_on("network") == 80 * 3 * 63 * (share // 64) * 2
    assert fsdp.sent_on("network") == 80 * 3 * 511 * (855_654_400 // 512) * 2 / 8
    assert round(fsdp.sent_on("network") / both.sent_on("network"), 2) == 1.01  # the same bytes per card
    assert both.sent_on("network") == both.sent_on("network", "FSDP")
    # what TP shortens is the ring: 63 steps instead of 511, each paying the network's latency
    fsdp_ag, tp_ag = ([t for t in m.traffic if t.op == "all_gather"][0] for m in (fsdp, both))
    assert (fsdp_ag.group_size, fsdp_ag.cards, tp_ag.group_size, tp_ag.cards) == (512, 8, 64, 1)
    assert fsdp_ag.seconds - tp_ag.seconds > 0.8 * (511 - 63) * 20e-6
    # NVLink carries TP's 4 AllReduces per block of 65,536 tokens x 8,192 x 2 B = 1.07 GB, 2 x 7/8 of it each
    activation = 65536 * 8192 * 2
    assert both.sent_on("NVLink") == 80 * 4 * 2 * 7 * (activation // 8)
    assert both.sent_on("NVLink") > both.sent_on("network")
    # what a rank holds: ~1/512 of the model either way (TP replicates the norms: a little more)
    assert 0 < both.params_per_rank - estimate_memory(LLAMA2_70B.params, 512, "FULL_SHARD", tp=8).params // 2 < 20_000


def test_mesh_layout_rejects_bad_input():
    with pytest.raises(ValueError, match="tp=3 does not divide"):
        mesh_layout(TINY, SMALL, tp=3, global_batch=16)
    with pytest.raises(ValueError, match="tp=8 does not divide the cluster's 4 GPUs"):
        mesh_layout(TransformerShape("t", 8, 1, 16, 8, 8, 8), SMALL, tp=8, global_batch=16)
    with pytest.raises(ValueError, match="do not split evenly over 2 data-parallel ranks"):
        mesh_layout(TINY, SMALL, tp=2, global_batch=15)
    with pytest.raises(ValueError, match="shard_size=3 must be a positive divisor of the 2 data-parallel ranks"):
        mesh_layout(TINY, SMALL, tp=2, global_batch=16, shard_size=3)


# --- 3. when to choose what ----------------------------------------------------------------------------------

def test_a_plan_row_by_hand():
    # TINY on SMALL, FSDP over 4 GPUs, 4,000 tokens (1,000 per GPU) at 1e6 FLOP/s.
    (row,) = compare_plans([TINY], [4], [FSDP_PLAN], global_batch=4000, flops_per_s=1e6,
                           cluster_for=lambda n: SMALL, memory_limit=1e4)
    forward = 2 * 656 * 1000 / 1e6  # a block's forward: 1.312 s
    gather = 3 * 1e-3 + 3 / 4 * 656 * 2 / 2e6  # 3.492 ms (two cards per node): hidden
    assert close(row.compute_s, 6 * TINY.params * 1000 / 1e6)
    assert close(row.fsdp_s, 2 * 3 * gather) and row.fsdp_exposed_s == 0 and row.tp_s == 0 and row.hides
    assert row.memory == estimate_memory(TINY.params, 4, "FULL_SHARD") and row.fits
    assert row.efficiency == 1 and forward > gather
    # 40 tokens (10 per GPU): forward 13.12 ms; backward 26.24 ms against AllGather + ReduceScatter
    (row,) = compare_plans([TINY], [4], [FSDP_PLAN], global_batch=40, flops_per_s=1e6,
                           cluster_for=lambda n: SMALL, memory_limit=100)
    assert row.fsdp_exposed_s == 0
    (row,) = compare_plans([TINY], [4], [FSDP_PLAN], global_batch=4, flops_per_s=1e6,
                           cluster_for=lambda n: SMALL, memory_limit=100)
    forward = 2 * 656 * 1 / 1e6
    exposed = max(0, gather - forward) + max(0, 2 * gather - 2 * forward)
    assert close(row.fsdp_exposed_s, 2 * exposed) and not row.hides and not row.fits
    assert close(row.step_s, row.compute_s + row.fsdp_exposed_s)


def test_tp_allreduces_are_priced_and_exposed():
    # TP 2 x FSDP 2 on SMALL: TP's 4 AllReduces per block of 8 tokens x 8 x 2 B, all on the critical path
    (row,) = compare_plans([TINY], [4], [Plan("TP2 x FSDP", "FULL_SHARD", tp=2)], global_batch=16,
                           flops_per_s=1e6, cluster_for=lambda n: SMALL)
    assert close(row.tp_s, 2 * 4 * (2 * 1e-4 + 128 / 10e6))
    assert close(row.step_s, row.compute_s + row.fsdp_exposed_s + row.tp_s)
    assert row.memory == estimate_memory(TINY.params, 4, "FULL_SHARD", tp=2)


def test_when_to_choose_what():
    """Lesson 12, part 5: the claims it makes from this table (4M tokens a step, H100s, 64 ... 4,096 GPUs)."""
    rows = {(r.model, r.gpus, r.plan): r for r in compare_plans()}
    assert len(rows) == 2 * 7 * len(PLANS)
    seven, seventy = LLAMA2_7B.name, LLAMA2_70B.name
    fsdp, hsdp, tp8 = FSDP_PLAN.name, HSDP_PLAN.name, TP8_FSDP_PLAN.name
    # memory: HSDP keeps a whole copy per node: 13.5 GB for 7B, 138 GB for 70B, more than an H100 has
    assert rows[seven, 64, hsdp].fits and not rows[seventy, 64, hsdp].fits
    assert all(rows[m, g, p].fits for m in (seven, seventy) for g in GPU_COUNTS[3:] for p in (fsdp, tp8))
    # FSDP alone hides its AllGathers up to 256 GPUs for 7B and 512 for 70B (a bigger block, the same latency)
    assert [rows[seven, g, fsdp].hides for g in GPU_COUNTS[3:]] == [True] * 3 + [False] * 4
    assert [rows[seventy, g, fsdp].hides for g in GPU_COUNTS[3:]] == [True] * 4 + [False] * 3
    # for 70B, TP8 x FSDP hides FSDP's communication up to 1,024 GPUs, and beats FSDP alone from 1,024
    assert [rows[seventy, g, tp8].hides for g in GPU_COUNTS[3:]] == [True] * 5 + [False] * 2
    assert all(rows[seventy, g, tp8].step_s < rows[seventy, g, fsdp].step_s for g in (1024, 2048, 4096))
    # ... but where FSDP hides, TP's exposed AllReduces make it slower: TP is for when FSDP alone cannot
    assert all(rows[m, g, tp8].step_s > rows[m, g, fsdp].step_s
               for m, last in ((seven, 256), (seventy, 512)) for g in GPU_COUNTS[3:] if g <= last)
    # for 7B, HSDP (fits, AllGathers on NVLink) is the fastest from 512 on
    assert all(rows[seven, g, hsdp].step_s == min(rows[seven, g, p].step_s for p in (fsdp, hsdp, tp8))
               for g in (512, 1024, 2048, 4096))
    # at 4,096 GPUs a 4M-token batch is too small for every plan: each spends over half the step waiting
    assert all(rows[m, 4096, p].efficiency < 0.5 for m in (seven, seventy) for p in (fsdp, hsdp, tp8))


def test_the_llama_shapes_and_the_h100_links_are_the_planners_presets():
    """One home for each fact: scaling.py names the planner's presets, it does not copy them."""
    from fsdp_mini.course.planner import get_gpu, get_model

    for shape in (LLAMA2_7B, LLAMA2_13B, LLAMA2_70B):
        spec = get_model(shape.preset)
        assert (shape.params, shape.block_params) == (spec.params, spec.block_params)
    gpu = get_gpu("h100-sxm")
    assert h100_cluster(512) == Cluster(64, 8, gpu.nvlink_bandwidth, gpu.network_bandwidth, gpu.alpha_nvlink,
                                        gpu.alpha_network)
    assert H100_FLOPS == gpu.bf16_flops * 0.45
    with pytest.raises(ValueError, match="not a Llama-style"):
        TransformerShape.from_preset("gpt2", "GPT-2")


def test_planner_comparison_plans_each_layout_with_the_stated_assumptions():
    """Lesson 12, part 5: every row is the planner's plan of that layout, under the micro-batches and the
    checkpointing mode asked for; a layout with fewer sequences than data-parallel ranks does not run."""
    from fsdp_mini.course.planner import Layout, get_gpu, get_model, plan
    from fsdp_mini.course.scaling import best_plans, planner_comparison, tp_crossing

    rows = planner_comparison((LLAMA2_70B,), (512, 2048), micro_batches=2, ac="full")
    by = {(r.gpus, r.plan): r for r in rows}
    assert len(rows) == 2 * 4 and all(r.micro_batches == 2 and r.ac == "full" for r in rows)
    expected = plan(get_model("llama2-70b"), get_gpu("h100-sxm"),
                    Layout(gpus=512, seq=4096, local_batch=16, micro_batches=2, ac="full", tp=8, sp=True))
    assert by[512, "TP8+SP x FSDP"].result == expected
    assert by[512, "HSDP"].result.layout.dp_replicate == 64
    assert not by[2048, "FSDP"].runs and by[2048, "FSDP"].mfu == 0 and not by[2048, "FSDP"].fits
    best = best_plans(rows)
    fitting = [r for r in rows if r.gpus == 512 and r.fits]
    assert best["Llama-2-70B", 512] is max(fitting, key=lambda r: r.mfu)
    assert tp_crossing(rows, "Llama-2-70B") in (512, 2048)
    with pytest.raises(ValueError, match="whole number of sequences"):
        planner_comparison((LLAMA2_70B,), (512,), global_batch=4097)
