"""Lesson 11's exercises: which blocks to checkpoint under a memory budget, and how many tokens per GPU
let a unit's AllGather hide behind the previous unit's forward.

`choose_checkpointed(saved, kept, budget)` gets what each block saves for backward (`saved[i]`, measured
with `SavedActivations`), what it still saves when checkpointed (`kept[i]`: its input) and a budget for
the blocks' activations, and returns the blocks to checkpoint. The judge runs a GPT whose blocks differ
in width with exactly those blocks wrapped in `Checkpointed`, measures the activations autograd saved and
counts the recomputations in backward: within budget, and no more recomputations than needed.

`tokens_to_hide(unit_params, param_bytes, cluster, flops_per_s)` returns the tokens per GPU that make one
unit's forward (2 FLOPs per parameter per token) last as long as the next unit's AllGather over the
cluster's slowest ring link. The judge prices each case's AllGather with `fsdp_mini.course.cost`
(the alpha-beta ring) and checks that the answer hides it, and that 2 % fewer tokens would not.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from fsdp_mini.course.activations import checkpoint_blocks, measure_block, recomputations
from fsdp_mini.course.cluster import Cluster
from fsdp_mini.course.cost import ring_all_gather
from fsdp_mini.course.exercise import CodeExercise, Verdict
from fsdp_mini.course.language import num, size, tr
from fsdp_mini.course.models import GPT, GPTConfig, make_batch
from fsdp_mini.memory import SavedActivations

__all__ = ["CHOOSE_CHECKPOINTED", "TOKENS_TO_HIDE", "choose_checkpointed", "tokens_to_hide", "uneven_gpt",
           "BUDGET_CASES", "CLUSTER_CASES"]


# --- the reference solutions (the lesson's folded solutions are their sources) -------------------------

def choose_checkpointed(saved: list[int], kept: list[int], budget: int) -> list[int]:
    total = sum(saved)
    chosen = []
    # checkpointing block i saves saved[i] - kept[i]: take the largest savings first, stop once it
    # fits
    for i in sorted(range(len(saved)), key=lambda i: saved[i] - kept[i], reverse=True):
        if total <= budget:
            break
        chosen.append(i)
        total -= saved[i] - kept[i]
    return sorted(chosen)


def tokens_to_hide(
    unit_params: float, param_bytes: int, cluster: Cluster, flops_per_s: float
) -> int:
    n = cluster.world_size
    alpha, bandwidth = cluster.link(cluster.nodes > 1)  # FULL_SHARD's ring spans every node
    gather = (n - 1) * alpha + (n - 1) / n * unit_params * param_bytes / bandwidth  # seconds
    # forward: 2 FLOPs per parameter per token
    return math.ceil(gather * flops_per_s / (2 * unit_params))


# --- plausible mistakes, which the judges must catch (tests/test_exercise.py) ----------------------------

def _in_order(saved, kept, budget):
    total, chosen = sum(saved), []
    for i in range(len(saved)):  # first blocks first: fits, but checkpoints more blocks than needed
        if total <= budget:
            break
        chosen.append(i)
        total -= saved[i] - kept[i]
    return chosen


def _forgets_kept(saved, kept, budget):
    total, chosen = sum(saved), []
    for i in sorted(range(len(saved)), key=lambda i: saved[i], reverse=True):
        if total <= budget:
            break
        chosen.append(i)
        total -= saved[i]  # as if a checkpointed block kept nothing: its input is still saved
    return sorted(chosen)


def _every_block(saved, kept, budget):
    return list(range(len(saved)))  # always fits, always recomputes everything


def _no_alpha(unit_params, param_bytes, cluster, flops_per_s):
    n = cluster.world_size
    _, bandwidth = cluster.link(cluster.nodes > 1)
    return math.ceil((n - 1) / n * unit_params * param_bytes / bandwidth * flops_per_s / (2 * unit_params))


def _whole_unit_per_rank(unit_params, param_bytes, cluster, flops_per_s):
    n = cluster.world_size
    alpha, bandwidth = cluster.link(cluster.nodes > 1)
    gather = (n - 1) * alpha + unit_params * param_bytes / bandwidth  # forgets that a rank already holds 1/n
    return math.ceil(gather * flops_per_s / (2 * unit_params))


def _six_flops(unit_params, param_bytes, cluster, flops_per_s):
    n = cluster.world_size
    alpha, bandwidth = cluster.link(cluster.nodes > 1)
    gather = (n - 1) * alpha + (n - 1) / n * unit_params * param_bytes / bandwidth
    return math.ceil(gather * flops_per_s / (6 * unit_params))  # forward + backward, but only forward hides it


def _always_nvlink(unit_params, param_bytes, cluster, flops_per_s):
    n = cluster.world_size
    alpha, bandwidth = cluster.link(False)  # the ring over several nodes waits for its network links
    gather = (n - 1) * alpha + (n - 1) / n * unit_params * param_bytes / bandwidth
    return math.ceil(gather * flops_per_s / (2 * unit_params))


# --- exercise 1: the judge ------------------------------------------------------------------------------

class _MLP(nn.Module):
    """The course's MLP with a chosen hidden width (the GPT's is 4h): blocks of different sizes."""

    def __init__(self, h: int, width: int):
        super().__init__()
        self.fc, self.proj = nn.Linear(h, width), nn.Linear(width, h)

    def forward(self, x):
        return self.proj(torch.nn.functional.gelu(self.fc(x)))


WIDTHS = (32, 256, 64, 192, 48, 128)  # MLP widths of the judge's blocks: their activations differ
_CFG = GPTConfig(n_layer=len(WIDTHS), n_embd=32, n_head=2, block_size=32)
_BATCH = 4


def uneven_gpt(widths=WIDTHS, cfg: GPTConfig = _CFG) -> GPT:
    """The course's GPT with block i's MLP `widths[i]` wide, so the blocks save different amounts."""
    model = GPT(cfg)
    for block, width in zip(model.blocks, widths):
        block.mlp = _MLP(cfg.n_embd, width)
    return model


def _saved_by_model(which) -> tuple[int, int]:
    """(bytes autograd saved in one forward, recomputations in its backward) with blocks `which` checkpointed."""
    model = checkpoint_blocks(uneven_gpt(), which)
    idx, targets = make_batch(_CFG, _BATCH)
    with SavedActivations(exclude=model.parameters()) as saved:
        loss = model(idx, targets)
    loss.backward()
    return saved.nbytes, recomputations(model)


def _measured_blocks():
    """What each block saves, and what it keeps when checkpointed (both measured), and the rest of the model."""
    model = uneven_gpt()
    saved = [measure_block(block, _BATCH, _CFG.block_size) for block in model.blocks]
    whole, _ = _saved_by_model(())
    rest = whole - sum(saved)
    kept = [saved[i] - (whole - _saved_by_model([i])[0]) for i in range(len(saved))]
    return saved, kept, rest


def _budget_cases(saved, kept):
    """Budgets for the blocks' activations: none needed, a few, most, all, and one that two blocks would meet
    only if a checkpointed block kept nothing (its input is still saved: it takes a third)."""
    total, floor = sum(saved), sum(kept)
    a, b = sorted(range(len(saved)), key=lambda i: saved[i], reverse=True)[:2]
    tight = total - saved[a] - saved[b] + (kept[a] + kept[b]) // 2
    return [total, int(total * 0.8), tight, int(total * 0.55), int(total * 0.3), floor + 1]


BUDGET_CASES = _budget_cases  # the lesson prints the cases the judge uses


def _fewest(saved, kept, budget) -> int:
    """The fewest checkpointed blocks that fit (largest savings first is optimal for a count)."""
    return len(choose_checkpointed(saved, kept, budget))


def _judge_checkpointed(fn) -> Verdict:
    saved, kept, rest = _measured_blocks()
    for budget in _budget_cases(saved, kept):
        which = fn(list(saved), list(kept), budget)
        which = sorted(set(int(i) for i in which))
        if any(not 0 <= i < len(saved) for i in which):
            return Verdict.wrong(tr(f"budget {size(budget)}: block indices must be 0..{len(saved) - 1}, got {which}",
                                    f"бюджет {size(budget)}: номера блоков должны быть 0..{len(saved) - 1}, "
                                    f"получено {which}"))
        measured, recomputed = _saved_by_model(which)
        blocks = measured - rest
        if blocks > budget:
            return Verdict.wrong(tr(
                f"budget {size(budget)}: with blocks {which} checkpointed the blocks still saved "
                f"{size(blocks)} for backward (measured), over the budget",
                f"бюджет {size(budget)}: с чекпоинтингом блоков {which} блоки всё ещё сохранили для backward "
                f"{size(blocks)} (измерено), больше бюджета"))
        need = _fewest(saved, kept, budget)
        if recomputed > need:
            return Verdict.wrong(tr(
                f"budget {size(budget)}: fits ({size(blocks)}), but backward recomputed {num(recomputed)} blocks' "
                f"forward; {num(need)} would have been enough",
                f"бюджет {size(budget)}: помещается ({size(blocks)}), но backward пересчитал forward "
                f"{num(recomputed)} блоков; хватило бы {num(need)}"))
    return Verdict.right(tr(
        f"{num(len(_budget_cases(saved, kept)))} budgets: each within budget, measured, with the fewest recomputations.",
        f"{num(len(_budget_cases(saved, kept)))} бюджетов: каждый соблюдён (измерено), пересчётов меньше некуда."))


# --- exercise 2: the judge ------------------------------------------------------------------------------

# (description, unit parameters, bytes per parameter, cluster, achieved FLOP/s per GPU)
_H100 = 989e12 * 0.45  # bf16 dense peak at 45 % MFU
CLUSTER_CASES = [
    ("1 x 8 H100, NVLink", 200e6, 2, Cluster(1, 8, 450e9, 50e9, 5e-6, 20e-6), _H100),
    ("1 x 2 H100, NVLink", 200e6, 2, Cluster(1, 2, 450e9, 50e9, 5e-6, 20e-6), _H100),
    ("8 x 8 H100, IB 400 Gb/s", 200e6, 2, Cluster(8, 8, 450e9, 50e9, 5e-6, 20e-6), _H100),
    ("8 x 8 H100, IB, 5M-parameter units", 5e6, 2, Cluster(8, 8, 450e9, 50e9, 5e-6, 20e-6), _H100),
    ("2 x 8 A100, IB 200 Gb/s, fp32 parameters", 50e6, 4, Cluster(2, 8, 300e9, 25e9, 5e-6, 20e-6), 312e12 * 0.4),
]


def _judge_tokens(fn) -> Verdict:
    for name, params, pbytes, cluster, flops in CLUSTER_CASES:
        tokens = fn(params, pbytes, cluster, flops)
        if not isinstance(tokens, (int, float)) or isinstance(tokens, bool) or not tokens > 0:
            return Verdict.wrong(tr(f"{name}: expected a positive number of tokens, got {tokens!r}",
                                    f"{name}: ожидалось положительное число токенов, получено {tokens!r}"))
        alpha, bandwidth = cluster.link(cluster.nodes > 1)
        gather = ring_all_gather(params * pbytes, cluster.world_size, alpha, bandwidth)
        forward = 2 * params * tokens / flops
        if forward < gather * (1 - 1e-9):
            return Verdict.wrong(tr(
                f"{name}: at {num(tokens, 0)} tokens per GPU a unit's forward takes {num(forward * 1e3, 3)} ms, "
                f"but the next unit's AllGather takes {num(gather * 1e3, 3)} ms: it does not hide",
                f"{name}: при {num(tokens, 0)} токенах на GPU forward юнита идёт {num(forward * 1e3, 3)} мс, "
                f"а AllGather следующего — {num(gather * 1e3, 3)} мс: он не прячется"))
        if 2 * params * tokens * 0.98 / flops >= gather:
            return Verdict.wrong(tr(
                f"{name}: {num(tokens, 0)} tokens per GPU hide the AllGather ({num(gather * 1e3, 3)} ms), but so "
                f"would 2 % fewer: more tokens than needed",
                f"{name}: {num(tokens, 0)} токенов на GPU прячут AllGather ({num(gather * 1e3, 3)} мс), но "
                f"спрятали бы и на 2 % меньше: токенов больше, чем нужно"))
    return Verdict.right(tr(f"{num(len(CLUSTER_CASES))} clusters: each AllGather hides, and no sooner.",
                            f"{num(len(CLUSTER_CASES))} кластеров: каждый AllGather прячется, и не раньше."))


CHOOSE_CHECKPOINTED = CodeExercise("11.choose_checkpointed", _judge_checkpointed, choose_checkpointed,
                                   (_in_order, _forgets_kept, _every_block))
TOKENS_TO_HIDE = CodeExercise("11.tokens_to_hide", _judge_tokens, tokens_to_hide,
                              (_no_alpha, _whole_unit_per_rank, _six_flops, _always_nvlink))
