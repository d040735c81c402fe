"""Lesson 11's exercises: which blocks to checkpoint under a memory budget, and how many tokens per GPU
let a unit's AllGather hide behind the previous unit's forward.

`choose_checkpointed(saved, kept, budget)` gets what each block saves for backward (`saved[i]`, measured
with `SavedActivations`), what it still saves when checkpointed (`kept[i]`: its input) and a budget for
the blocks' activations, and returns the blocks to checkpoint. The judge runs a model whose blocks differ
in width (each projects its input to its own width, then runs an MLP there: what a block saves and what it
keeps, its input, both differ, so ranking blocks by `saved[i]` and by `saved[i] - kept[i]` disagree) with
exactly those blocks wrapped in `Checkpointed`, measures the activations autograd saved and counts the
recomputations in backward: within budget, and no more recomputations than needed.

`tokens_to_hide(unit_params, param_bytes, cluster, flops_per_s)` returns the tokens per GPU that make one
unit's forward (2 FLOPs per parameter per token) last as long as the next unit's AllGather over the
cluster's slowest ring link. The judge prices each case's AllGather with `fsdp_mini.course.cost`
(the alpha-beta ring) and checks that the answer hides it and one token fewer would not (the smallest
whole number that hides it, also where the exact answer is whole and floating point lands a hair above it).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

import torch.nn.functional as F

from fsdp_mini.course.activations import checkpoint_blocks, recomputations
from fsdp_mini.course.cluster import Cluster
from fsdp_mini.course.cost import ring_all_gather
from fsdp_mini.course.exercise import CodeExercise, Verdict
from fsdp_mini.course.language import num, size, tr
from fsdp_mini.saved_activations import SavedActivations

__all__ = ["CHOOSE_CHECKPOINTED", "TOKENS_TO_HIDE", "choose_checkpointed", "tokens_to_hide", "uneven_model",
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
    alpha, bandwidth = cluster.link(range(n))  # FULL_SHARD's ring: every rank of the cluster
    gather = (n - 1) * alpha + (n - 1) / n * unit_params * param_bytes / bandwidth  # seconds
    # forward: 2 FLOPs per parameter per token
    tokens = gather * flops_per_s / (2 * unit_params)
    # a whole answer can come out a hair above itself (2250.0000000000005):
    # round up only beyond that
    return math.ceil(tokens * (1 - 1e-9))


# --- plausible mistakes, which the judges must catch (tests/course/test_exercise.py) ----------------------------

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


def _sorts_by_saved(saved, kept, budget):
    total, chosen = sum(saved), []
    for i in sorted(range(len(saved)), key=lambda i: saved[i], reverse=True):  # the biggest, not the most freed
        if total <= budget:
            break
        chosen.append(i)
        total -= saved[i] - kept[i]
    return sorted(chosen)


def _every_block(saved, kept, budget):
    return list(range(len(saved)))  # always fits, always recomputes everything


def _no_alpha(unit_params, param_bytes, cluster, flops_per_s):
    n = cluster.world_size
    _, bandwidth = cluster.link(range(n))
    return math.ceil((n - 1) / n * unit_params * param_bytes / bandwidth * flops_per_s / (2 * unit_params))


def _whole_unit_per_rank(unit_params, param_bytes, cluster, flops_per_s):
    n = cluster.world_size
    alpha, bandwidth = cluster.link(range(n))
    gather = (n - 1) * alpha + unit_params * param_bytes / bandwidth  # forgets that a rank already holds 1/n
    return math.ceil(gather * flops_per_s / (2 * unit_params))


def _six_flops(unit_params, param_bytes, cluster, flops_per_s):
    n = cluster.world_size
    alpha, bandwidth = cluster.link(range(n))
    gather = (n - 1) * alpha + (n - 1) / n * unit_params * param_bytes / bandwidth
    return math.ceil(gather * flops_per_s / (6 * unit_params))  # forward + backward, but only forward hides it


def _two_percent_high(unit_params, param_bytes, cluster, flops_per_s):
    n = cluster.world_size
    alpha, bandwidth = cluster.link(range(n))
    gather = (n - 1) * alpha + (n - 1) / n * unit_params * param_bytes / bandwidth
    return math.ceil(1.02 * gather * flops_per_s / (2 * unit_params))  # a safety margin: not the smallest


def _ceil_without_tolerance(unit_params, param_bytes, cluster, flops_per_s):
    n = cluster.world_size
    alpha, bandwidth = cluster.link(range(n))
    gather = (n - 1) * alpha + (n - 1) / n * unit_params * param_bytes / bandwidth
    return math.ceil(gather * flops_per_s / (2 * unit_params))  # 2250.0000000000005 -> 2251, one too many


def _always_nvlink(unit_params, param_bytes, cluster, flops_per_s):
    n = cluster.world_size
    alpha, bandwidth = cluster.link(range(cluster.gpus_per_node))  # one node's ring: the network never counts
    gather = (n - 1) * alpha + (n - 1) / n * unit_params * param_bytes / bandwidth
    return math.ceil(gather * flops_per_s / (2 * unit_params))


def _one_card_per_ring(unit_params, param_bytes, cluster, flops_per_s):
    n = cluster.world_size
    alpha, bandwidth = cluster.link(range(n))
    if cluster.nodes > 1:  # every chunk through a single network card, as if NCCL ran one ring
        bandwidth = cluster.inter_bandwidth
    gather = (n - 1) * alpha + (n - 1) / n * unit_params * param_bytes / bandwidth
    return math.ceil(gather * flops_per_s / (2 * unit_params))


# --- exercise 1: the judge ------------------------------------------------------------------------------

class _WidthBlock(nn.Module):
    """A block of the judge's model: a linear layer from the previous block's width to its own, then an MLP
    at that width with a residual. It saves its input (h_in), the MLP's input (h), the GELU's input and
    output (width each); checkpointed, it keeps its input alone."""

    def __init__(self, h_in: int, h: int, width: int):
        super().__init__()
        self.inp, self.fc, self.proj = nn.Linear(h_in, h), nn.Linear(h, width), nn.Linear(width, h)

    def forward(self, x):
        x = self.inp(x)
        return x + self.proj(F.gelu(self.fc(x)))


class _Stack(nn.Module):
    """Token embeddings, then `blocks` (a ModuleList, so `checkpoint_blocks` wraps them), then a loss."""

    def __init__(self, shapes, vocab: int = 61):
        super().__init__()
        self.embed = nn.Embedding(vocab, shapes[0][0])
        self.blocks = nn.ModuleList(_WidthBlock(*shape) for shape in shapes)

    def forward(self, idx):
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return x.pow(2).mean()


# (input width, own width, MLP width) of the judge's blocks: ranked by what they save (h_in + h + 2 width)
# they come 2, 4, 5, 3, 0, 1; by what checkpointing frees (h + 2 width) 2, 5, 0, 3, 4, 1
SHAPES = ((16, 96, 32), (96, 16, 24), (16, 32, 96), (32, 128, 16), (128, 24, 40), (24, 48, 64))
_BATCH, _SEQ = 4, 32


def uneven_model(shapes=SHAPES) -> nn.Module:
    """The judge's model: blocks of different widths, so that both saved[i] and kept[i] differ by block."""
    with torch.random.fork_rng():  # the same weights every time, the caller's random state untouched
        torch.manual_seed(0)
        return _Stack(shapes)


def _saved_by_model(which) -> tuple[int, int]:
    """(bytes autograd saved in one forward, recomputations in its backward) with blocks `which` checkpointed."""
    model = checkpoint_blocks(uneven_model(), which)
    idx = torch.randint(0, 61, (_BATCH, _SEQ), generator=torch.Generator().manual_seed(0))
    with SavedActivations(exclude=model.parameters()) as saved:
        loss = model(idx)
    loss.backward()
    return saved.nbytes, recomputations(model)


def _measured_blocks():
    """What each block saves (measured alone, on an input that requires grad, as inside the model), what it
    keeps when checkpointed (what it saves less what checkpointing it frees in the whole model, measured),
    and the rest of the model."""
    model = uneven_model()
    saved = []
    for block in model.blocks:
        x = torch.randn(_BATCH, _SEQ, block.inp.in_features, requires_grad=True)
        with SavedActivations(exclude=block.parameters()) as alone:
            block(x)
        saved.append(alone.nbytes)
    whole, _ = _saved_by_model(())
    kept = [saved[i] - (whole - _saved_by_model([i])[0]) for i in range(len(saved))]
    return saved, kept, whole - sum(saved)


def _budget_cases(saved, kept):
    """Budgets for the blocks' activations: none needed; each budget that the k blocks freeing the most meet
    exactly (k = 1..n-1: ranking by saved[i] instead needs more); and one that two blocks would meet only if
    a checkpointed block kept nothing (its input is still saved)."""
    total = sum(saved)
    freed = sorted((s - k for s, k in zip(saved, kept)), reverse=True)
    exact = [total - sum(freed[:k]) for k in range(1, len(saved))]
    a, b = sorted(range(len(saved)), key=lambda i: saved[i], reverse=True)[:2]
    tight = total - saved[a] - saved[b] + (kept[a] + kept[b]) // 2
    cases = [total] + exact + [tight]
    return sorted(set(cases), key=cases.index)


BUDGET_CASES = _budget_cases  # the lesson prints the cases the judge uses


def _fewest(saved, kept, budget) -> int:
    """The fewest checkpointed blocks that fit (largest savings first is optimal for a count)."""
    return len(choose_checkpointed(saved, kept, budget))


def _why_too_many(which, saved, kept, budget) -> str:
    """What a choice that fits but recomputes too much probably did, in words (never the answer)."""
    if len(which) == len(saved):
        return tr(" You checkpointed every block; this budget needs fewer.",
                  " Вы включили чекпоинтинг у всех блоков, а этому бюджету нужно меньше.")
    if which == _sorts_by_saved(saved, kept, budget):
        return tr(" You ranked blocks by saved[i], what a block saves; checkpointing it frees only "
                  "saved[i] - kept[i], and the biggest block is not always the one that frees the most.",
                  " Вы упорядочили блоки по saved[i] — по тому, что блок сохраняет; чекпоинтинг освобождает "
                  "только saved[i] - kept[i], и самый большой блок не всегда освобождает больше всех.")
    if which == list(range(len(which))):
        return tr(" You took blocks in their order; the blocks that free the most are elsewhere.",
                  " Вы брали блоки по порядку, а больше всего освобождают другие.")
    return tr(" Checkpoint the blocks that free the most first.",
              " Начинайте с блоков, которые освобождают больше всего.")


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
            forgot = sum(saved) - sum(saved[i] for i in which) <= budget
            why = tr(" A checkpointed block still saves its input, kept[i]: it frees saved[i] - kept[i], "
                     "not saved[i].",
                     " Блок с чекпоинтингом всё ещё сохраняет свой вход, kept[i]: он освобождает "
                     "saved[i] - kept[i], а не saved[i].") if forgot else ""
            return Verdict.wrong(tr(
                f"budget {size(budget)}: with blocks {which} checkpointed the blocks still saved "
                f"{size(blocks)} for backward (measured), over the budget.",
                f"бюджет {size(budget)}: с чекпоинтингом блоков {which} блоки всё ещё сохранили для backward "
                f"{size(blocks)} (измерено), больше бюджета.") + why)
        need = _fewest(saved, kept, budget)
        if recomputed > need:
            return Verdict.wrong(tr(
                f"budget {size(budget)}: fits ({size(blocks)}), but backward recomputed {num(recomputed)} blocks' "
                f"forward; {num(need)} would have been enough.",
                f"бюджет {size(budget)}: помещается ({size(blocks)}), но backward пересчитал forward "
                f"{num(recomputed)} блоков; хватило бы {num(need)}.") + _why_too_many(which, saved, kept, budget))
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
    # the exact answer is whole (2,250 tokens), and floating point computes 2250.0000000000005
    ("1 x 4, 200 GB/s links, 2M-parameter units", 2e6, 2, Cluster(1, 4, 200e9, 25e9, 5e-6, 20e-6), 300e12),
]


def _hides(tokens, params, flops, gather) -> bool:
    """Does a unit's forward on `tokens` tokens per GPU last as long as the AllGather (to rounding)?"""
    return 2 * params * tokens / flops >= gather * (1 - 1e-9)


def _why_tokens(tokens, case) -> str:
    """What a wrong answer probably did, when it is what a known mistake gives (never the answer)."""
    _, params, pbytes, cluster, flops = case
    hints = (
        (_ceil_without_tolerance, tr(" Here the exact answer is a whole number, and floating-point arithmetic "
                                     "puts it a hair above (like 0.1 + 0.2 > 0.3): rounding up then adds one "
                                     "token. Round up only beyond a small tolerance.",
                                     " Здесь точный ответ целый, а вычисления с плавающей точкой дают чуть "
                                     "больше (в Python и 0.1 + 0.2 > 0.3), и округление вверх добавляет лишний токен. "
                                     "Округляйте вверх, только если превышение больше малого допуска.")),
        (_no_alpha, tr(" Your AllGather leaves out the latency: a ring of n ranks takes n - 1 steps, each "
                       "paying alpha.",
                       " В вашем AllGather нет задержки: кольцо из n рангов делает n - 1 шагов, и каждый "
                       "платит alpha.")),
        (_whole_unit_per_rank, tr(" A rank already holds 1/n of the unit: the ring brings it (n - 1)/n of S.",
                                  " Ранг уже хранит 1/n юнита: кольцо доставляет ему (n - 1)/n от S.")),
        (_six_flops, tr(" Only the forward of the unit before (2 FLOPs per parameter per token) runs while "
                        "the AllGather is in flight, not a whole step's 6.",
                        " Пока идёт AllGather, выполняется только forward предыдущего юнита (2 FLOP на "
                        "параметр на токен), а не все 6 FLOP шага.")),
        (_always_nvlink, tr(" FULL_SHARD's ring spans the whole cluster: across nodes it waits for the "
                            "network between them (cluster.link of every rank), not NVLink alone.",
                            " Кольцо FULL_SHARD охватывает весь кластер: между узлами оно ждёт сеть "
                            "(cluster.link по всем рангам), а не только NVLink.")),
        (_one_card_per_ring, tr(" The ring leaves a node on the network cards of all its ranks there, not on "
                                "one: NCCL runs one ring per card (cluster.link counts them).",
                                " Кольцо выходит из узла через сетевые карты всех своих рангов на нём, а не "
                                "через одну: NCCL запускает по кольцу на карту (cluster.link это учитывает).")),
        (_two_percent_high, tr(" No safety margin: the answer is the smallest whole number that hides it.",
                               " Без запаса: ответ — наименьшее целое число токенов, которое его прячет.")),
    )
    if tokens != math.ceil(tokens):
        return tr(" Tokens come whole: round up.", " Токены бывают только целыми: округлите вверх.")
    for mistake, hint in hints:
        if tokens == mistake(params, pbytes, cluster, flops) != tokens_to_hide(params, pbytes, cluster, flops):
            return hint
    return ""


def _judge_tokens(fn) -> Verdict:
    for case in CLUSTER_CASES:
        name, params, pbytes, cluster, flops = case
        tokens = fn(params, pbytes, cluster, flops)
        if not isinstance(tokens, (int, float)) or isinstance(tokens, bool) or not tokens > 0:
            return Verdict.wrong(tr(f"{name}: expected a positive number of tokens, got {tokens!r}",
                                    f"{name}: ожидалось положительное число токенов, получено {tokens!r}"))
        alpha, bandwidth = cluster.link(range(cluster.world_size))
        gather = ring_all_gather(params * pbytes, cluster.world_size, alpha, bandwidth)
        forward = 2 * params * tokens / flops
        if not _hides(tokens, params, flops, gather):
            return Verdict.wrong(tr(
                f"{name}: at {num(tokens, 0)} tokens per GPU a unit's forward takes {num(forward * 1e3, 3)} ms, "
                f"but the next unit's AllGather takes {num(gather * 1e3, 3)} ms: it does not hide.",
                f"{name}: при {num(tokens, 0)} токенах на GPU forward юнита идёт {num(forward * 1e3, 3)} мс, "
                f"а AllGather следующего — {num(gather * 1e3, 3)} мс: он не прячется.") + _why_tokens(tokens, case))
        if _hides(tokens - 1, params, flops, gather):
            return Verdict.wrong(tr(
                f"{name}: {num(tokens, 0)} tokens per GPU hide the AllGather ({num(gather * 1e3, 3)} ms), but so "
                f"would one token fewer: more tokens than needed.",
                f"{name}: {num(tokens, 0)} токенов на GPU прячут AllGather ({num(gather * 1e3, 3)} мс), но "
                f"спрятал бы и на один токен меньше: токенов больше, чем нужно.") + _why_tokens(tokens, case))
    return Verdict.right(tr(f"{num(len(CLUSTER_CASES))} clusters: each AllGather hides, and not one token sooner.",
                            f"{num(len(CLUSTER_CASES))} кластеров: каждый AllGather прячется, и ни токеном раньше."))


CHOOSE_CHECKPOINTED = CodeExercise("11.choose_checkpointed", _judge_checkpointed, choose_checkpointed,
                                   (_in_order, _forgets_kept, _sorts_by_saved, _every_block))
TOKENS_TO_HIDE = CodeExercise("11.tokens_to_hide", _judge_tokens, tokens_to_hide,
                              (_no_alpha, _whole_unit_per_rank, _six_flops, _always_nvlink, _one_card_per_ring,
                               _two_percent_high, _ceil_without_tolerance))
