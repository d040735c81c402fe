"""Lesson 13's exercise module: the measurement the first judge relies on, and the cases the second one scores."""
import torch

from fsdp_mini.course.exercises.planning import (LAYOUT_CASES, MEASURED_BLOCKS, HeldAfterForward, course_spec,
                                                 measure_block_held, pick_layout)
from fsdp_mini.course.planner import Layout, get_gpu, get_model, plan
from fsdp_mini.course.planner.activations import block_saved
from fsdp_mini.course.planner.layout import Checkpointing
from fsdp_mini.course.planner.memory import saved_bytes
from fsdp_mini.saved_activations import SavedActivations


def test_held_after_forward_counts_what_is_alive_and_nothing_freed():
    x = torch.randn(64, requires_grad=True)
    with HeldAfterForward() as live:
        y = x.exp()        # exp saves its output for backward: alive through y
        z = (y * 2).sum()  # y * 2 is freed once summed
    assert live.held(exclude=[z]) == 64 * 4


def test_without_checkpointing_the_measurement_equals_what_autograd_saves():
    """Two independent counts of the same thing: live storages, and saved_tensors_hooks."""
    cfg, batch = MEASURED_BLOCKS[0]
    from fsdp_mini.course.models import GPT
    block = GPT(cfg).blocks[0]
    x = torch.randn(batch, cfg.block_size, cfg.n_embd, requires_grad=True)
    with SavedActivations(exclude=block.parameters()) as saved:
        block(x)
    assert measure_block_held(cfg, batch, Checkpointing.NONE) == saved.nbytes


def test_each_mode_measured_equals_the_planner():
    for cfg, batch in MEASURED_BLOCKS:
        tokens = batch * cfg.block_size
        one_gpu = Layout(gpus=1, seq=cfg.block_size, local_batch=batch)
        for mode in (Checkpointing.NONE, Checkpointing.SELECTIVE_OP, Checkpointing.FULL):
            want = saved_bytes(block_saved(course_spec(cfg), mode, element_bytes=4), one_gpu, tokens)
            assert measure_block_held(cfg, batch, mode) == want, (cfg, mode)
    # and the three modes differ, so the equality says something about each
    cfg, batch = MEASURED_BLOCKS[0]
    held = [measure_block_held(cfg, batch, m) for m in (Checkpointing.NONE, Checkpointing.SELECTIVE_OP,
                                                        Checkpointing.FULL)]
    assert held[0] > held[1] > held[2] == batch * cfg.block_size * cfg.n_embd * 4


def test_the_layout_cases_are_well_posed():
    """Each case has a baseline with its global batch, and the reference's layout trains exactly that batch."""
    for case in LAYOUT_CASES:
        base = case.baseline()
        assert base.local_batch * base.dp == case.sequences
        layout = pick_layout(get_model(case.model), get_gpu(case.gpu), case.gpus, case.seq, case.sequences)
        assert layout.local_batch * layout.dp == case.sequences and layout.gpus == case.gpus
        assert plan(get_model(case.model), get_gpu(case.gpu), layout).memory.fits


def test_each_planted_mistake_gets_a_hint_at_its_cause():
    """Issue 41: the hint points at what the mistake did (a per-token log-sum-exp, a missing tensor of the
    residual stream's width, a rule of the lesson broken), not at its symptom alone."""
    from fsdp_mini.course.exercises import planning
    from fsdp_mini.course.language import set_language

    set_language("en")
    expected = {"_log_sum_exp_per_token": "log-sum-exp values does the kernel keep per token",
                "_forgets_the_input": "two tensors of that width", "_saves_the_even_products": "1st, 3rd",
                "_full_checkpointing_first": "rule 2", "_always_tp8_and_full": "rule 1"}
    for exercise in (planning.SELECTIVE_OP_BYTES, planning.PICK_LAYOUT):
        for wrong in exercise.wrong:
            if wrong.__name__ in expected:
                assert expected.pop(wrong.__name__) in exercise.verdict(wrong).detail, wrong.__name__
    assert expected == {}
