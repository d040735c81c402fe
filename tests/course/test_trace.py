"""Trace records each unit's compute between FSDP's own hooks, the engine's gathered-memory events, and
leaves the model as it found it; issue_order / sequence / by_unit put a step's events in program order."""
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from fsdp_mini import FSDP, CommLog, CommRecord, launch
from fsdp_mini.course.models import GPT, Block, GPTConfig, make_batch
from fsdp_mini.course.trace import (MemoryEvent, Span, Trace, by_unit, compute_modules, issue_order, sequence,
                                    unit_of_label)
from fsdp_mini.fsdp.plan import plan_units
from fsdp_mini.course.train import local_rows, train

CFG = GPTConfig(n_layer=3)
BLOCKS = [f"blocks.{i}" for i in range(CFG.n_layer)]


def _step_worker(strategy, prefetch):
    model = FSDP(GPT(CFG), strategy, wrap=(Block,), prefetch=prefetch)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train(model, opt, CFG, 1, 8)  # records the order that prefetch follows
    model.gathered_memory.reset_peak()
    x, y = (local_rows(t, dist.get_rank(), dist.get_world_size()) for t in make_batch(CFG, 8, 1))
    with CommLog() as log, Trace(model) as trace:
        model(x, y).backward()
    trackers_restored = all(h.gathered_memory is model.gathered_memory for u in model.units for h in u.handles)
    spans, memory = len(trace.spans), len(trace.memory)
    train(model, opt, CFG, 1, 8)  # outside the trace: nothing more is recorded
    untouched = (len(trace.spans), len(trace.memory)) == (spans, memory)
    modules = [(label, path, len(leaves)) for label, path, _, leaves in compute_modules(model)]
    return dict(records=log.records, spans=trace.spans, memory=trace.memory, peak=model.gathered_memory.peak,
                units={u.label: sum(h.nbytes for h in u.handles) for u in model.units},
                restored=trackers_restored, untouched=untouched, modules=modules)


@pytest.fixture(scope="module")
def steps():
    return {(s, p): launch(_step_worker, 2, args=(s, p), timeout=120)
            for s, p in (("FULL_SHARD", False), ("FULL_SHARD", True), ("SHARD_GRAD_OP", True))}


def _first(items, **match):
    return [x for x in items if all(getattr(x, k) == v for k, v in match.items())]


def test_spans_cover_every_unit_once_per_pass(steps, no_orphans):
    for rank, res in enumerate(steps[("FULL_SHARD", False)]):
        spans = res["spans"]
        assert all(s.rank == rank and s.start <= s.end for s in spans)
        for b in BLOCKS:
            assert len(_first(spans, label=b, kind="forward")) == 1
            assert len(_first(spans, label=b, kind="backward")) == 1
        root = {(s.module, s.kind) for s in spans if s.label == "root"}
        assert root == {(m, k) for m in ("tok_emb", "pos_emb", "ln_f", "lm_head") for k in ("forward", "backward")}
        assert spans == sorted(spans, key=lambda s: s.start)
        assert res["modules"] == [("root", "tok_emb", 1), ("root", "pos_emb", 1), ("root", "ln_f", 2),
                                  ("root", "lm_head", 1)] + [(b, b, 12) for b in BLOCKS]


def test_spans_sit_between_the_engines_collectives(steps, no_orphans):
    """Forward starts after the unit's AllGather was issued and ends before the next one; backward ends
    before the unit's ReduceScatter is issued: a span is compute, not communication."""
    for res in steps[("FULL_SHARD", False)]:
        recs, spans = res["records"], res["spans"]
        for b in BLOCKS:
            ag = sorted(r.start for r in _first(recs, op="all_gather", label=b))
            rs = _first(recs, op="reduce_scatter", label=b)[0]
            fwd, bwd = _first(spans, label=b, kind="forward")[0], _first(spans, label=b, kind="backward")[0]
            assert ag[0] < fwd.start <= fwd.end < ag[1] < bwd.start <= bwd.end < rs.start


def test_memory_events_follow_the_tracker(steps, no_orphans):
    for key, results in steps.items():
        for res in results:
            mem = res["memory"]
            running = 0
            for e in mem:
                running += e.nbytes if e.kind == "alloc" else -e.nbytes
                assert e.current == running and e.nbytes == res["units"][e.label]
            assert running == 0 and max(e.current for e in mem) == res["peak"]
            assert res["restored"] and res["untouched"], key


def test_sequence_is_the_recipe_without_prefetch(steps, no_orphans):
    expected = ([("root", ["all_gather", "forward"])] + [(b, ["all_gather", "forward", "free"]) for b in BLOCKS]
                + [("root", ["forward", "backward"])]
                + [(b, ["all_gather", "backward", "reduce_scatter", "free"]) for b in reversed(BLOCKS)]
                + [("root", ["backward", "reduce_scatter", "free"])])
    for rank, res in enumerate(steps[("FULL_SHARD", False)]):
        assert by_unit(sequence(res["records"], res["spans"], res["memory"], rank=rank)) == expected


def test_prefetch_issues_the_next_gather_before_the_current_compute(steps, no_orphans):
    for rank, res in enumerate(steps[("FULL_SHARD", True)]):
        seq = sequence(res["records"], res["spans"], res["memory"], rank=rank)
        for cur, nxt in zip(BLOCKS, BLOCKS[1:]):
            assert seq.index(("all_gather", nxt)) < seq.index(("forward", cur))
        bwd = seq[seq.index(("backward", "root")):]
        for cur, nxt in zip(BLOCKS[::-1], BLOCKS[::-1][1:]):
            assert bwd.index(("all_gather", nxt)) < bwd.index(("backward", cur))
        assert sorted(issue_order(res["records"])) == sorted(issue_order(steps[("FULL_SHARD", False)][rank]["records"]))


def test_shard_grad_op_gathers_only_in_forward(steps, no_orphans):
    for rank, res in enumerate(steps[("SHARD_GRAD_OP", True)]):
        seq = sequence(res["records"], res["spans"], res["memory"], rank=rank)
        first_backward = seq.index(("backward", "root"))
        assert all(what != "all_gather" for what, _ in seq[first_backward:])
        assert all(what != "free" for what, _ in seq[:first_backward])


def _rec(op, label, start, end, rank=0):
    return CommRecord(op, "builtin", 8, 4, 2, rank, start, end, label)


def test_issue_order_sorts_by_issue_and_filters_ranks():
    records = [_rec("all_gather", "a", 1.0, 2.0), _rec("reduce_scatter", "b", 0.5, 3.0),
               _rec("all_gather", "c", 0.2, 0.3, rank=1)]
    assert issue_order(records, rank=0) == [("reduce_scatter", "b"), ("all_gather", "a")]
    assert issue_order(records) == [("all_gather", "c"), ("reduce_scatter", "b"), ("all_gather", "a")]


def test_sequence_merges_runs_of_one_unit_and_folds_frozen_labels():
    records = [_rec("all_gather", "root", 0.0, 0.1), _rec("all_gather", "u", 0.3, 0.4),
               _rec("all_gather", "u (frozen)", 0.31, 0.4)]
    spans = [Span(0, "root", "forward", 0.1, 0.15, "emb"), Span(0, "root", "forward", 0.16, 0.2, "pos"),
             Span(0, "u", "forward", 0.5, 0.6, "u"), Span(1, "u", "forward", 0.5, 0.6, "u")]
    memory = [MemoryEvent(0, "u", "free", 4, 0, 0.7), MemoryEvent(0, "u (frozen)", "free", 4, 0, 0.71),
              MemoryEvent(0, "u", "alloc", 4, 4, 0.29)]
    seq = sequence(records, spans, memory, rank=0)
    assert seq == [("all_gather", "root"), ("forward", "root"), ("all_gather", "u"), ("all_gather", "u"),
                   ("forward", "u"), ("free", "u")]
    assert by_unit(seq) == [("root", ["all_gather", "forward"]), ("u", ["all_gather", "all_gather", "forward", "free"])]
    assert by_unit([]) == []


def test_unit_of_label_folds_every_flat_parameter_label_back_to_its_unit():
    """The plan labels a unit's frozen and per-dtype flat parameters after the unit ("inner (frozen) (float32)");
    a timeline's row is the unit's."""
    model = nn.Sequential(nn.Linear(3, 3), nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3).double()))
    model[1][0].bias.requires_grad_(False)
    plan = plan_units(model, nn.Sequential)
    labels = {fp.label: unit.label for unit in plan.units for fp in unit.flat_params}
    assert len(labels) == 4 and len(set(labels.values())) == 2  # three flat parameters in one unit
    assert {label: unit_of_label(label) for label in labels} == labels
