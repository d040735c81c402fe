"""Lesson 13's exercises: the activation bytes of one block under op-level selective checkpointing, and the
layout for a model, a cluster and a global batch.

`selective_op_bytes(model, element_bytes)` returns the bytes per token that one block keeps for backward
under torchtitan's op-level policy (no tensor parallelism). The judge compares it with the planner
(`fsdp_mini.course.planner.activations.block_saved`) on Llama and GPT-2 presets in bf16, and with a
*measurement*: a block of the course's GPT run on CPU in fp32 under `torch.utils.checkpoint` with the same
policy (`op_level_policy`), counting the bytes the forward leaves alive (`HeldAfterForward`).

`pick_layout(model, gpu, gpus, seq, sequences)` returns a `Layout` for `sequences` sequences of `seq` tokens
per step on `gpus` GPUs. The judge plans it (`fsdp_mini.course.planner.plan`) on each case of
`LAYOUT_CASES`: it must train that global batch on those GPUs, be well-formed, fit, and train within
`SLOWER_ALLOWED` of the fastest layout `compare` finds; a verdict says which of these failed and why (the
memory term that does not fit, the part of the step that makes it slow), never which layout wins.
"""
from __future__ import annotations

import gc
from dataclasses import dataclass

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from fsdp_mini.course.exercise import CodeExercise, Verdict
from fsdp_mini.course.language import num, plural, tr
from fsdp_mini.course.models import GPT, GPTConfig
from fsdp_mini.course.planner import GiB, Layout, ModelSpec, get_gpu, get_model, plan
from fsdp_mini.course.planner.activations import block_saved, matmul_outputs
from fsdp_mini.course.planner.compare import compare
from fsdp_mini.course.planner.layout import Checkpointing
from fsdp_mini.course.viz.planning import memory_parts, term_name

__all__ = ["SELECTIVE_OP_BYTES", "PICK_LAYOUT", "selective_op_bytes", "pick_layout", "HeldAfterForward",
           "op_level_policy", "measure_block_held", "course_spec", "planner_selective_op", "MEASURED_BLOCKS",
           "LAYOUT_CASES", "SLOWER_ALLOWED", "LayoutCase"]


# --- the reference solutions (the lesson's folded solutions are their sources) -------------------------

def selective_op_bytes(model: ModelSpec, element_bytes: int) -> float:
    e = element_bytes
    # the block's products, in forward order
    widths = [width for _, width, _ in matmul_outputs(model)]
    # the 1st, 3rd, ... are saved; the others run again in backward
    products = e * sum(widths[0::2])
    # the kernel's output, its fp32 log-sum-exp per head
    attention = e * model.hidden + 4 * model.heads
    # the block's input first: the checkpoint keeps it
    return e * model.hidden + products + attention


def pick_layout(model: ModelSpec, gpu, gpus: int, seq: int, sequences: int) -> Layout:
    # the fewest GPUs sharing one sequence first; at equal count less TP (its collectives
    # never hide)
    splits = sorted(((tp, cp) for tp in (1, 2, 4, 8) for cp in (1, 2, 4, 8)),
                    key=lambda s: (s[0] * s[1], s[0]))
    for tp, cp in splits:
        if gpus % (tp * cp) or sequences % (gpus // (tp * cp)):
            continue  # each data-parallel rank takes whole sequences
        dp = gpus // (tp * cp)
        for ac in ("none", "selective-op", "full"):  # then the cheapest checkpointing that fits
            layout = Layout(gpus=gpus, seq=seq, local_batch=sequences // dp, tp=tp, sp=tp > 1,
                            cp=cp, ac=ac)
            if plan(model, gpu, layout).memory.fits:
                return layout
    raise ValueError("nothing fits")


# --- plausible mistakes, which the judges must catch (tests/course/test_exercise.py) --------------------

def _saves_every_product(model, element_bytes):
    e = element_bytes
    widths = [width for _, width, _ in matmul_outputs(model)]
    return e * model.hidden + e * sum(widths) + e * model.hidden + 4 * model.heads  # none recomputed


def _saves_the_even_products(model, element_bytes):
    e = element_bytes
    widths = [width for _, width, _ in matmul_outputs(model)]
    return e * model.hidden + e * sum(widths[1::2]) + e * model.hidden + 4 * model.heads  # 2nd, 4th, ...


def _forgets_the_input(model, element_bytes):
    e = element_bytes
    widths = [width for _, width, _ in matmul_outputs(model)]
    return e * sum(widths[0::2]) + e * model.hidden + 4 * model.heads


def _log_sum_exp_in_bf16(model, element_bytes):
    e = element_bytes
    widths = [width for _, width, _ in matmul_outputs(model)]
    return e * model.hidden + e * sum(widths[0::2]) + e * model.hidden + e * model.heads  # it is fp32


def _log_sum_exp_per_token(model, element_bytes):
    e = element_bytes
    widths = [width for _, width, _ in matmul_outputs(model)]
    return e * model.hidden + e * sum(widths[0::2]) + e * model.hidden + 4  # one per head, not one per token


def _forgets_the_attention(model, element_bytes):
    e = element_bytes
    widths = [width for _, width, _ in matmul_outputs(model)]
    return e * model.hidden + e * sum(widths[0::2])  # the attention kernel's output is saved too


def _fsdp_alone(model, gpu, gpus, seq, sequences):
    for ac in ("none", "selective-op", "full"):  # FSDP over every GPU, whatever the model
        layout = Layout(gpus=gpus, seq=seq, local_batch=max(1, sequences // gpus), ac=ac)
        if plan(model, gpu, layout).memory.fits:
            return layout
    return layout


def _always_tp8_and_full(model, gpu, gpus, seq, sequences):
    for cp in (1, 2, 4, 8):  # the most memory saved everywhere, needed or not
        if sequences % (gpus // (8 * cp)) == 0:
            return Layout(gpus=gpus, seq=seq, local_batch=sequences // (gpus // (8 * cp)), tp=8, sp=True, cp=cp,
                          ac="full")


def _full_checkpointing_first(model, gpu, gpus, seq, sequences):
    splits = sorted(((tp, cp) for tp in (1, 2, 4, 8) for cp in (1, 2, 4, 8)), key=lambda s: (s[0] * s[1], s[0]))
    for tp, cp in splits:
        if gpus % (tp * cp) or sequences % (gpus // (tp * cp)):
            continue
        layout = Layout(gpus=gpus, seq=seq, local_batch=sequences // (gpus // (tp * cp)), tp=tp, sp=tp > 1, cp=cp,
                        ac="full")  # full checkpointing even where less would fit
        if plan(model, gpu, layout).memory.fits:
            return layout


def _local_batch_per_gpu(model, gpu, gpus, seq, sequences):
    splits = sorted(((tp, cp) for tp in (1, 2, 4, 8) for cp in (1, 2, 4, 8)), key=lambda s: (s[0] * s[1], s[0]))
    for tp, cp in splits:
        for ac in ("none", "selective-op", "full"):
            # the sequences of a step spread over every GPU, as if TP and CP ranks took their own
            layout = Layout(gpus=gpus, seq=seq, local_batch=max(1, sequences // gpus), tp=tp, sp=tp > 1, cp=cp,
                            ac=ac)
            if plan(model, gpu, layout).memory.fits:
                return layout


def _tp_without_sp(model, gpu, gpus, seq, sequences):
    splits = sorted(((tp, cp) for tp in (1, 2, 4, 8) for cp in (1, 2, 4, 8)), key=lambda s: (s[0] * s[1], s[0]))
    for tp, cp in splits:
        if gpus % (tp * cp) or sequences % (gpus // (tp * cp)):
            continue
        for ac in ("none", "selective-op", "full"):
            layout = Layout(gpus=gpus, seq=seq, local_batch=sequences // (gpus // (tp * cp)), tp=tp, cp=cp,
                            ac=ac)  # TP, but the residual stream's activations stay whole on every TP rank
            if plan(model, gpu, layout).memory.fits:
                return layout
    return Layout(gpus=gpus, seq=seq, local_batch=sequences // (gpus // 8), tp=8, ac="full")


def _without_cp(model, gpu, gpus, seq, sequences):
    for tp in (1, 2, 4, 8):  # TP inside a node, never CP
        dp = gpus // tp
        for ac in ("none", "selective-op", "full"):
            layout = Layout(gpus=gpus, seq=seq, local_batch=max(1, sequences // dp), tp=tp, sp=tp > 1, ac=ac)
            if plan(model, gpu, layout).memory.fits:
                return layout


# --- exercise 1: the measurement and the judge ----------------------------------------------------------

class HeldAfterForward(TorchDispatchMode):
    """While open, every tensor an operator returns is noted by its storage (a weak reference, so noting it
    keeps nothing alive); `held(exclude)` sums the bytes of those storages still alive, each once, leaving
    out `exclude`'s (the parameters, the block's output). After a forward, what is still alive is what autograd
    and a checkpoint keep for backward: a measurement that does not depend on how they keep it
    (`saved_tensors_hooks` see neither a checkpoint's recomputed tensors nor selective checkpointing's cache).
    `StorageWeakRef` is torch's own (torch/multiprocessing/reductions.py)."""

    def __init__(self):
        super().__init__()
        self._noted: list[tuple[StorageWeakRef, int, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                self._noted.append((StorageWeakRef(storage), storage.data_ptr(), storage.nbytes()))
        return out

    def held(self, exclude=()) -> int:
        gc.collect()
        skip = {t.untyped_storage().data_ptr() for t in exclude}
        alive = {ptr: n for ref, ptr, n in self._noted if not ref.expired() and ptr not in skip}
        return sum(alive.values())


_MATMULS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
_ATTENTION = (torch.ops.aten._scaled_dot_product_flash_attention.default,
              torch.ops.aten._scaled_dot_product_efficient_attention.default,
              torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default)


def op_level_policy():
    """torchtitan's op-level selective checkpointing as a `context_fn` for `torch.utils.checkpoint`: save the
    outputs of the attention kernels and of every odd matrix product in forward order (1st, 3rd, ...),
    recompute everything else. torchtitan counts `aten.mm` (Llama has no biases); the course's GPT has biases,
    so its products are `aten.addmm` and count alike; the CPU's flash attention kernel joins the list."""
    products = {False: 0, True: 0}  # matrix products seen in forward, and in backward's recomputation

    def policy(ctx, func, *args, **kwargs):
        if func in _MATMULS:
            products[ctx.is_recompute] += 1  # counted apart, so that both passes decide alike
            odd = products[ctx.is_recompute] % 2 == 1
            return CheckpointPolicy.MUST_SAVE if odd else CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if func in _ATTENTION else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def measure_block_held(cfg: GPTConfig, batch: int, mode: Checkpointing = Checkpointing.SELECTIVE_OP) -> int:
    """Bytes one block of the course's GPT keeps for backward after its forward on `batch` sequences of
    `cfg.block_size` tokens (fp32, CPU): what the forward leaves alive, its parameters and output excluded, plus
    its input (which the checkpoint, or without one the first LayerNorm, keeps). `mode`: SELECTIVE_OP runs it
    under `op_level_policy`, FULL under a plain checkpoint, NONE without one. The backward then runs, so
    the measurement is of a block that trains."""
    block = GPT(cfg).blocks[0]
    x = torch.randn(batch, cfg.block_size, cfg.n_embd, generator=torch.Generator().manual_seed(0),
                    requires_grad=True)
    with HeldAfterForward() as live:
        if mode == Checkpointing.SELECTIVE_OP:
            out = checkpoint(block, x, use_reentrant=False, context_fn=op_level_policy)
        elif mode == Checkpointing.FULL:
            out = checkpoint(block, x, use_reentrant=False)
        else:
            out = block(x)
    held = live.held(exclude=[out, *block.parameters()]) + x.numel() * x.element_size()
    out.sum().backward()
    return held


def course_spec(cfg: GPTConfig) -> ModelSpec:
    """The course's GPT as the planner describes a model: GPT-2's family (LayerNorm, GELU, biases, tied head)."""
    return ModelSpec("course GPT", cfg.n_embd, cfg.n_layer, cfg.n_head, cfg.n_head, 4 * cfg.n_embd, cfg.vocab_size,
                     mlp="gelu", norm="layernorm", bias=True, tied=True, positions=cfg.block_size)


def planner_selective_op(model: ModelSpec, element_bytes: int = 2) -> float:
    """The planner's bytes per token of one block under SELECTIVE_OP, without tensor parallelism."""
    return sum(x.bytes_per_token for x in block_saved(model, Checkpointing.SELECTIVE_OP, element_bytes)
               if x.split != "sp-only")


PLANNER_MODELS = ("llama3-8b", "llama2-13b", "llama3-405b", "gpt2-xl")
MEASURED_BLOCKS = ((GPTConfig(n_embd=32, n_head=2, block_size=16), 8), (GPTConfig(n_embd=64, n_head=4, block_size=64), 2),
                   (GPTConfig(n_embd=48, n_head=6, block_size=32), 3))
"""(config, batch) of the course GPT blocks the judge measures."""


def _why_bytes(got: float, want: float, model: ModelSpec, e: int) -> str:
    """What a wrong count probably left out or added, from the difference (never the answer)."""
    diff = got - want
    h = model.hidden
    if diff == -e * h:
        return tr(" That is one activation of the residual stream's width (hidden values per token) fewer: besides "
                  "the saved products the block keeps two tensors of that width; are both in your count, and are the saved "
                  "products the 1st, 3rd, ... in forward order?",
                  " Это на одну активацию шириной остаточного потока (hidden значений на токен) меньше: кроме "
                  "сохранённых произведений блок хранит два тензора такой ширины; оба ли есть в вашем счёте и сохраняются "
                  "ли произведения 1-е, 3-е, ... в порядке forward?")
    if diff == e * h:
        return tr(" That is one activation of the residual stream's width too many: is a tensor counted twice, and "
                  "are the saved products the 1st, 3rd, ... in forward order?",
                  " Это на одну активацию шириной остаточного потока больше: не учтён ли тензор дважды и "
                  "сохраняются ли произведения 1-е, 3-е, ... в порядке forward?")
    if model.heads > 1 and abs(diff) == 4 * (model.heads - 1):
        return tr(f" That is 4 bytes for every head but one ({model.heads} heads): how many log-sum-exp values does "
                  "the kernel keep per token?",
                  f" Это по 4 байта на каждую голову, кроме одной (у модели {model.heads} "
                  f"{plural(model.heads, 'голова', 'головы', 'голов')}): сколько значений "
                  "log-sum-exp ядро хранит на токен?")
    if abs(diff) == e * h + 4 * model.heads:
        return tr(" That is what the attention kernel keeps: check that your count has it.",
                  " Ровно столько хранит ядро внимания: проверьте, есть ли оно в вашем счёте.")
    if abs(diff) == (4 - e) * model.heads:
        return tr(" The difference is per head: what precision does the kernel keep its log-sum-exp in?",
                  " Разница — на каждую голову: в какой точности ядро хранит log-sum-exp?")
    widths = [w for _, w, _ in matmul_outputs(model)]
    if diff > 0 and diff in (e * sum(widths[1::2]), e * (sum(widths[1::2]) - sum(widths[0::2]))):
        return tr(" Some products you count run again in backward: the policy saves every second one only.",
                  " Часть произведений, которые вы считаете, пересчитывается в backward: политика сохраняет "
                  "только каждое второе.")
    if abs(diff) == e * abs(sum(widths[1::2]) - sum(widths[0::2])):
        return tr(" Which products are saved: the 1st, 3rd, ... in forward order, or the others?",
                  " Какие произведения сохраняются: 1-е, 3-е, ... в порядке forward или остальные?")
    return ""


def _judge_bytes(fn) -> Verdict:
    for name in PLANNER_MODELS:
        model = get_model(name)
        got, want = fn(model, 2), planner_selective_op(model, 2)
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            return Verdict.wrong(tr(f"{name}: expected a number of bytes per token, got {got!r}",
                                    f"{name}: ожидалось число байт на токен, получено {got!r}"))
        if got != want:
            more = tr("more", "больше") if got > want else tr("fewer", "меньше")
            return Verdict.wrong(tr(
                f"{name} in bf16: your count differs from the planner's by {num(abs(got - want))} bytes per token "
                f"({more}).",
                f"{name} в bf16: ваш счёт расходится с планировщиком на {num(abs(got - want))} байт на токен "
                f"({more}).") + _why_bytes(got, want, model, 2))
    for cfg, batch in MEASURED_BLOCKS:
        model, tokens = course_spec(cfg), batch * cfg.block_size
        got = fn(model, 4) * tokens
        held = measure_block_held(cfg, batch)
        if got != held:
            more = tr("more", "больше") if got > held else tr("fewer", "меньше")
            return Verdict.wrong(tr(
                f"course GPT block (h = {cfg.n_embd}, {cfg.n_head} heads, {tokens} tokens, fp32, measured on CPU): "
                f"your count is {num(abs(got - held))} bytes {more} than what the block kept.",
                f"блок GPT курса (h = {cfg.n_embd}, {cfg.n_head} "
                f"{plural(cfg.n_head, 'голова', 'головы', 'голов')}, {tokens} токенов, fp32, измерено на CPU): "
                f"ваш счёт на {num(abs(got - held))} байт {more}, чем блок сохранил.")
                + _why_bytes(got / tokens, held / tokens, model, 4))
    return Verdict.right(tr(
        f"{len(PLANNER_MODELS)} presets equal the planner's count, {len(MEASURED_BLOCKS)} course GPT blocks equal "
        f"the bytes measured on CPU.",
        f"{len(PLANNER_MODELS)} пресета совпадают со счётом планировщика, {len(MEASURED_BLOCKS)} блока GPT курса — "
        f"с байтами, измеренными на CPU."))


# --- exercise 2: the judge ------------------------------------------------------------------------------

@dataclass(frozen=True)
class LayoutCase:
    """One question of the layout exercise: a model, H100s, the sequence length and sequences per step."""

    model: str
    gpus: int
    seq: int
    sequences: int
    gpu: str = "h100-sxm"

    def __str__(self) -> str:
        return tr(f"{self.model} on {self.gpus} x {self.gpu}, {self.sequences} sequences of {num(self.seq)} tokens "
                  f"per step",
                  f"{self.model} на {self.gpus} × {self.gpu}, {self.sequences} "
                  f"{plural(self.sequences, 'последовательность', 'последовательности', 'последовательностей')} по "
                  f"{num(self.seq)} {plural(self.seq, 'токену', 'токена', 'токенов')} за шаг")

    def baseline(self) -> Layout:
        """A well-formed layout of this global batch, for `compare` to vary."""
        for tp, cp in ((1, 1), (8, 1), (8, 2), (8, 4), (8, 8)):
            dp = self.gpus // (tp * cp)
            if self.sequences % dp == 0:
                return Layout(gpus=self.gpus, seq=self.seq, local_batch=self.sequences // dp, tp=tp, sp=tp > 1, cp=cp)
        raise ValueError(f"{self}: no layout splits this batch")


LAYOUT_CASES = (  # not the lesson's own examples: the rules, not their answers, carry over
    LayoutCase("llama3-8b", 16, 8192, 32),
    LayoutCase("llama3-70b", 128, 8192, 128),
    LayoutCase("llama3-405b", 512, 8192, 512),
    LayoutCase("llama3-8b", 64, 131072, 8),
)
SLOWER_ALLOWED = 0.05
"""A layout passes if its tokens/s per GPU are within 5 % of the fastest layout the planner finds."""


def _largest(terms: dict) -> tuple[str, float]:
    return max(terms.items(), key=lambda kv: kv[1])


def _which_rule(mine: Layout, best: Layout) -> str:
    """The rule of the lesson a slow layout breaks, from how it differs from the fastest (its cause, not its
    symptom; never the fastest layout itself)."""
    if mine.tp * mine.cp > best.tp * best.cp:
        return tr(" More GPUs share each sequence than needed (rule 1: the fewest GPUs per sequence).",
                  " Одну последовательность делят больше GPU, чем нужно (правило 1: как можно меньше GPU на "
                  "последовательность).")
    if mine.tp * mine.cp == best.tp * best.cp and mine.tp > best.tp:
        return tr(" As many GPUs per sequence as needed, but more of them through TP, whose collectives wait on the "
                  "critical path (rule 1: at an equal count, less TP).",
                  " GPU на последовательность столько, сколько нужно, но больше из них за счёт TP, чьи коллективные "
                  "операции ждут на критическом пути (правило 1: при равном числе — меньше TP).")
    order = (Checkpointing.NONE, Checkpointing.SELECTIVE_OP, Checkpointing.FULL)  # the rule's, cheapest first
    if mine.ac in order and best.ac in order and order.index(mine.ac) > order.index(best.ac):
        return tr(" Its checkpointing recomputes more than a layout this size needs (rule 2: the cheapest mode "
                  "that fits).",
                  " Его чекпоинтинг пересчитывает больше, чем нужно раскладке такого размера (правило 2: самый "
                  "дешёвый режим, который помещается).")
    return ""


def _judge_layout(fn) -> Verdict:
    for case in LAYOUT_CASES:
        model, gpu = get_model(case.model), get_gpu(case.gpu)
        layout = fn(model, gpu, case.gpus, case.seq, case.sequences)
        if not isinstance(layout, Layout):
            return Verdict.wrong(tr(f"{case}: expected a Layout, got {layout!r}",
                                    f"{case}: ожидался Layout, получено {layout!r}"))
        if layout.gpus != case.gpus or layout.seq != case.seq:
            return Verdict.wrong(tr(f"{case}: your layout uses {layout.gpus} GPUs and sequences of {layout.seq}",
                                    f"{case}: ваша раскладка берёт {layout.gpus} GPU и последовательности по "
                                    f"{layout.seq}"))
        trained = layout.local_batch * layout.dp
        if trained != case.sequences:
            return Verdict.wrong(tr(
                f"{case}: your layout trains {trained} sequences per step ({layout.dp} data-parallel ranks x local "
                f"batch {layout.local_batch}); TP and CP ranks share their group's sequences.",
                f"{case}: ваша раскладка обучает {trained} "
                f"{plural(trained, 'последовательность', 'последовательности', 'последовательностей')} за шаг "
                f"({layout.dp} {plural(layout.dp, 'ранг', 'ранга', 'рангов')} по данным × локальный батч "
                f"{layout.local_batch}); ранги TP и CP делят последовательности своей группы."))
        try:
            mine = plan(model, gpu, layout)
        except ValueError as e:
            return Verdict.wrong(tr(f"{case}: the planner refuses your layout: {e}",
                                    f"{case}: планировщик отвергает вашу раскладку: {e}"))
        if not mine.memory.fits:
            term, nbytes = _largest(dict(memory_parts(mine)))
            return Verdict.wrong(tr(
                f"{case}: does not fit, {mine.memory.short_by / GiB:.1f} GiB short per GPU; the largest part of its "
                f"peak is «{term}», {nbytes / GiB:.1f} GiB.",
                f"{case}: не помещается, не хватает {num(mine.memory.short_by / GiB, 1)} ГиБ на GPU; самая "
                f"большая часть пика — «{term}», {num(nbytes / GiB, 1)} ГиБ."))
        best = compare(model, gpu, case.baseline())[0].plan
        ratio = mine.time.tokens_per_s_per_gpu / best.time.tokens_per_s_per_gpu
        if ratio < 1 - SLOWER_ALLOWED:
            extra = {k: mine.time.parts[k] - best.time.parts.get(k, 0.0) for k in mine.time.parts}
            part, seconds = _largest(extra)
            cause = _which_rule(mine.layout, best.layout)
            return Verdict.wrong(tr(
                f"{case}: fits, but trains {(1 - ratio) * 100:.0f} % slower than the fastest layout the planner "
                f"finds; most of the extra time is «{term_name(part)}», +{seconds / mine.time.step_s * 100:.0f} % of your step.",
                f"{case}: помещается, но обучает на {num((1 - ratio) * 100, 0)} % медленнее самой быстрой "
                f"раскладки, которую находит планировщик; больше всего лишнего времени уходит на «{term_name(part)}», "
                f"+{num(seconds / mine.time.step_s * 100, 0)} % вашего шага.") + cause)
    return Verdict.right(tr(f"{len(LAYOUT_CASES)} clusters: each layout fits and trains within "
                            f"{SLOWER_ALLOWED * 100:.0f} % of the fastest.",
                            f"{len(LAYOUT_CASES)} кластера: каждая раскладка помещается и обучает не более чем на "
                            f"{num(SLOWER_ALLOWED * 100, 0)} % медленнее самой быстрой."))


SELECTIVE_OP_BYTES = CodeExercise("13.selective_op_bytes", _judge_bytes, selective_op_bytes,
                                  (_saves_every_product, _saves_the_even_products, _forgets_the_input,
                                   _log_sum_exp_in_bf16, _log_sum_exp_per_token, _forgets_the_attention))
PICK_LAYOUT = CodeExercise("13.pick_layout", _judge_layout, pick_layout,
                           (_fsdp_alone, _always_tp8_and_full, _full_checkpointing_first, _local_batch_per_gpu,
                            _tp_without_sp, _without_cp))
