"""Lesson 12's helpers beside its cells: the rows its tables print (fsdp_mini.course.tensor_parallel_tables) are
the numbers the library computed, in the lesson's units; the probes (fsdp_mini.course.tensor_parallel_probes)
measure what the lesson says they measure. Expectations come from the inputs and the shapes, not from runs."""
import math

import pytest
import torch
import torch.nn as nn

from fsdp_mini import launch
from fsdp_mini.comm_log import CommRecord
from fsdp_mini.course.language import get_language
from fsdp_mini.course.models import GPTConfig
from fsdp_mini.course.scaling import LLAMA2_70B, fsdp_scaling
from fsdp_mini.course.show import set_language
from fsdp_mini.course.tensor_parallel_probes import tp_or_sp_step, watch_placements
from fsdp_mini.course.tensor_parallel_tables import (best_plan_rows, hiding_rows, plan_label, qkv_spans,
                                                     traffic_rows)


@pytest.fixture
def language():
    before = get_language()
    yield set_language
    set_language(before)


def test_hiding_rows_are_fsdp_scaling_in_milliseconds():
    rows = fsdp_scaling(LLAMA2_70B.block_params)
    table = hiding_rows(rows)
    assert [t["GPU"] for t in table] == [r.gpus for r in rows]
    for r, t in zip(rows, table):
        assert math.isclose(t["unit_forward_ms"], 1e3 * r.forward_s)
        assert math.isclose(t["unit_all_gather_ms"], 1e3 * r.gather_s)
        assert math.isclose(t["ring_latency_ms"] + t["ring_bytes_ms"], 1e3 * (r.latency_s + r.bandwidth_s))
        assert t["gather_hides"] is r.hides and t["tokens_each_gpu_gets"] == round(r.tokens_per_gpu)


def test_qkv_spans_name_each_matrix_s_rows():
    c = 4  # q rows 0-3, k rows 4-7, v rows 8-11
    assert qkv_spans(range(6), c) == "q[0:4] k[0:2]"
    assert qkv_spans([s * c + i for s in range(3) for i in range(2)], c) == "q[0:2] k[0:2] v[0:2]"
    assert qkv_spans([9, 10, 11], c) == "v[1:4]"


def _record(op, nbytes, sent, label=""):
    return CommRecord(op=op, impl="builtin", nbytes=nbytes, sent=sent, group_size=2, rank=0, start=0.0,
                      end=0.0, label=label)


def test_traffic_rows_count_each_collective_and_add_the_bytes():
    records = [_record("all_gather", 8, 4), _record("reduce_scatter", 8, 4), _record("all_gather", 16, 8)]
    (row,) = traffic_rows({"tp_in_blocks": records})
    assert row["collective_calls"] == 3
    assert row["collective_counts"] == "2 AllGather, 1 ReduceScatter"
    assert (row["message_bytes"], row["bytes_sent"]) == (32, 16)
    assert row["traffic"] == "TP, in the blocks"


def test_plan_labels_follow_the_language(language):
    language("en")
    assert plan_label("TP8 x FSDP") == "TP8 x FSDP"
    language("ru")
    assert plan_label("TP8 x FSDP") == "TP8 \u00d7 FSDP"
    assert plan_label(None) == "\u2014"


def test_best_plan_rows_put_one_gpu_count_a_row_and_one_model_a_column():
    class Row:
        plan = "FSDP"

    best = {("a", 64): None, ("a", 128): Row(), ("b", 64): Row(), ("b", 128): Row()}
    assert best_plan_rows(best, ["a", "b"]) == [{"cluster_gpus": 64, "a": "\u2014", "b": "FSDP"},
                                                {"cluster_gpus": 128, "a": "FSDP", "b": "FSDP"}]


def test_watch_placements_writes_down_what_flows_in_and_out():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
    seen = watch_placements(model, ["0", "1"])
    model(torch.zeros(2, 3))
    assert seen == {"0": {"module": "0", "input": "Tensor (2, 3)", "output": "Tensor (2, 4)"},
                    "1": {"module": "1", "input": "Tensor (2, 4)", "output": "Tensor (2, 4)"}}


def _both_steps(cfg, batch):
    return [tp_or_sp_step(cfg, batch, sequence_parallel=sp) for sp in (False, True)]


def test_sequence_parallel_halves_what_the_layer_norms_keep_and_nothing_else():
    cfg, batch, tp = GPTConfig(), 4, 2
    with_tp, with_sp = launch(_both_steps, tp, args=(cfg, batch), timeout=90)[0]
    per_norm = 4 * batch * cfg.block_size * (cfg.n_embd + 2)  # fp32 input, a mean and a 1/std a position
    norms = 2 * cfg.n_layer + 1
    assert (with_tp.parallelism, with_sp.parallelism) == ("TP", "TP + SP (PyTorch)")
    assert with_tp.kept_by_norms == norms * per_norm
    assert with_sp.kept_by_norms == norms * per_norm // tp
    assert with_sp.kept_by_rest == with_tp.kept_by_rest > 0
    activation = 4 * batch * cfg.block_size * cfg.n_embd
    assert [(r.op, r.nbytes) for r in with_tp.sent] == [("all_reduce", activation)] * 4 * cfg.n_layer
