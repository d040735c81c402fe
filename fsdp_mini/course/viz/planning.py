"""Lesson 13's picture: layouts (or checkpointing modes) side by side, each with its memory per GPU split
into what holds it and its training speed, both from `fsdp_mini.course.planner.plan`."""
from __future__ import annotations

from fsdp_mini.course.language import get_language, num, ru_cell, tr
from fsdp_mini.course.planner.memory import VERDICT_MESSAGES
from fsdp_mini.course.planner.validation import layout_cell
from fsdp_mini.course.show import MISSING, text
from fsdp_mini.course.viz import figure
from fsdp_mini.course.viz.style import SMALL

__all__ = ["memory_parts", "plot_memory_and_speed", "PART_COLORS", "STATES", "LOSS", "model_state_bytes",
           "memory_rows", "time_rows", "validation_rows", "verdict_word"]

PART_COLORS = ("#4C72B0", "#DD8452", "#8C8C8C")
STATES = ("parameters (fp32 shard)", "gradients (fp32 shard)", "AdamW moments (fp32 shard)")
"""The planner's memory terms of the sharded model states."""
LOSS = "logits and loss (bf16 logits, fp32 copy, log_softmax)"
"""The planner's memory term of the loss."""
_ACTIVATIONS = ("activations: blocks", "activations: final norm")


def memory_parts(p) -> list[tuple[str, float]]:
    """A plan's peak memory per GPU (bytes, as `max_memory_reserved` reads it) in three parts that add up to
    it: the sharded model states, the activations kept for backward, and the rest of the peak moment (gathered
    parameters, gradient buffers, the loss, the allocator's overhead)."""
    terms, memory = p.memory.terms, p.memory
    states = sum(terms.get(k, 0.0) for k in STATES)
    activations = sum(terms.get(k, 0.0) for k in _ACTIVATIONS)
    return [(tr("model states (sharded)", "состояния модели (шарды)"), states),
            (tr("activations", "активации"), activations),
            (tr("gathered parameters, buffers, loss", "собранные параметры, буферы, лосс"),
             memory.peak_reserved - states - activations)]


def plot_memory_and_speed(plans, labels: list[str], title: str = ""):
    """Left: each plan's peak memory per GPU (GiB) in `memory_parts`, the GPU's capacity as a line; a plan
    that does not fit is hatched. Right: its tokens per second per GPU, its MFU written beside the bar (none
    for a plan that does not fit: it would not run)."""
    from matplotlib.patches import Patch

    gib = 1024 ** 3
    fig, (left, right) = figure(width=9.5, height=0.55 * len(plans) + 2.0, ncols=2, sharey=True)
    rows = list(range(len(plans)))[::-1]  # the first plan on top
    for y, p in zip(rows, plans):
        start = 0.0
        for (name, nbytes), color in zip(memory_parts(p), PART_COLORS):
            left.barh(y, nbytes / gib, left=start, color=color, hatch=None if p.memory.fits else "//",
                      edgecolor="white")
            start += nbytes / gib
        left.text(start, y, f" {num(start, 1)}", va="center", fontsize=SMALL)
        rate = p.time.tokens_per_s_per_gpu
        right.barh(y, rate if p.memory.fits else 0, color=PART_COLORS[0])
        note = f" MFU {num(100 * p.time.mfu, 0)} %" if p.memory.fits else tr(" does not fit", " не помещается")
        right.text(rate if p.memory.fits else 0, y, note, va="center", fontsize=SMALL)
    capacity = plans[0].memory.capacity / gib
    left.axvline(capacity, color="#C44E52", linewidth=1.2, linestyle="--")
    left.text(capacity, -0.55, tr(f" {plans[0].gpu.name}: {num(capacity, 0)} GiB",
                                              f" {plans[0].gpu.name}: {num(capacity, 0)} ГиБ"),
              color="#C44E52", fontsize=SMALL, va="top")
    left.set_yticks(rows, labels)
    left.set_ylim(-0.8, len(plans) - 0.4)
    left.set_xlabel(tr("peak memory per GPU, GiB", "пиковая память на GPU, ГиБ"))
    handles = [Patch(color=color, label=name) for (name, _), color in zip(memory_parts(plans[0]), PART_COLORS)]
    handles.append(Patch(facecolor="white", edgecolor="#555555", hatch="//",
                         label=tr("does not fit", "не помещается")))
    right.set_xlabel(tr("tokens/s per GPU", "токенов/с на GPU"))
    right.set_xlim(0, 1.35 * max(p.time.tokens_per_s_per_gpu for p in plans))
    if title:
        fig.suptitle(title)
    fig.legend(handles=handles, loc="lower center", ncol=4, frameon=False, fontsize=SMALL)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


# --- the lesson's printed tables: the planner's rows in the lesson's language ------------------------------

RU_NAMES = {
    "parameters (fp32 shard)": "параметры (шард fp32)",
    "gradients (fp32 shard)": "градиенты (шард fp32)",
    "AdamW moments (fp32 shard)": "моменты AdamW (шард fp32)",
    "root unit gathered (bf16)": "корневой юнит, собранный (bf16)",
    "activations: blocks": "активации: блоки",
    "activations: final norm": "активации: финальная нормализация",
    "blocks gathered in flight (bf16)": "собранные блоки в работе (bf16)",
    "gradient buffers (block bf16 + fp32 for ReduceScatter, root bf16)":
        "буферы градиентов (блок bf16 + fp32 для ReduceScatter, корневой юнит bf16)",
    "checkpointed block rebuilt in backward": "блок, пересчитанный в backward",
    "logits and loss (bf16 logits, fp32 copy, log_softmax)": "логиты и лосс (логиты bf16, копия fp32, log_softmax)",
    "unsharded gradients accumulated (no sync, fp32)": "полные градиенты, накопленные без синхронизации (fp32)",
    "matmuls (blocks and head)": "матричные произведения (блоки и голова)",
    "attention": "внимание",
    "memory-bound ops (norms, rotary, SwiGLU, loss)": "операции, упирающиеся в память (нормализации, RoPE, SwiGLU, лосс)",
    "recomputation": "пересчёт",
    "TP collectives (exposed)": "коллективные операции TP (не скрыты)",
    "CP ring (exposed)": "кольцо CP (не скрыто)",
    "FSDP AllGather (exposed)": "AllGather FSDP (не скрыт)",
    "FSDP ReduceScatter / HSDP AllReduce (exposed)": "ReduceScatter FSDP / AllReduce HSDP (не скрыты)",
    "FSDP copy-in / copy-out": "копирование FSDP в буфер и из буфера",
    "optimizer step": "шаг оптимизатора",
    "end of forward (the loss)": "конец forward (лосс)",
    "start of backward": "начало backward",
}
"""The Russian names of the planner's memory terms, step parts and peak moments: the lessons print them, and the
site's planner page gets them from here (`planner_site.site_data`), so the two cannot drift apart."""


def term_name(key: str) -> str:
    """A planner's memory term, step part or peak moment in the lesson's language (the key itself in English,
    and for a key this table does not know yet)."""
    return tr(key, RU_NAMES.get(key, key))


def layout_label(layout) -> str:
    """A layout's degrees in one short label: "FSDP 256", "FSDP 64 × TP 4 + SP", "HSDP 2 × FSDP 16 × CP 2"; TP's
    backward overlap and Megatron-LM's SP variant named after TP, a step with one gradient sync at its end."""
    parts = [f"FSDP {layout.dp_shard}"]
    if layout.dp_replicate > 1:
        parts.insert(0, f"HSDP {layout.dp_replicate}")
    if layout.tp > 1:
        sp = (" + SP (Megatron)" if layout.sp_variant == "megatron" else " + SP") if layout.sp else ""
        parts.append(f"TP {layout.tp}{sp}" + (tr(" overlapped", " с перекрытием") if layout.tp_overlap else ""))
    if layout.cp > 1:
        parts.append(f"CP {layout.cp}")
    return " × ".join(parts) + (tr(", one gradient sync", ", одна синхронизация градиентов") if layout.no_sync
                                else "")


def show_assumptions(gpu, calibration) -> None:
    """Print what every number of the lesson assumes: the GPU's datasheet figures and the planner's three
    fitted fractions."""
    print(tr(f"{gpu.name}: {num(gpu.bf16_flops / 1e12, 0)} TFLOP/s bf16 (dense), {num(gpu.memory_bytes / 1024 ** 3, 0)} GiB "
             f"at {num(gpu.hbm_bandwidth / 1e12, 2)} TB/s, NVLink {num(gpu.nvlink_bandwidth / 1e9, 0)} GB/s and network "
             f"{num(gpu.network_bandwidth / 1e9, 0)} GB/s per GPU and direction, 8 GPUs per node",
             f"{gpu.name}: {num(gpu.bf16_flops / 1e12, 0)} TFLOP/с bf16 (плотные), {num(gpu.memory_bytes / 1024 ** 3, 0)} ГиБ "
             f"на {num(gpu.hbm_bandwidth / 1e12, 2)} ТБ/с, NVLink {num(gpu.nvlink_bandwidth / 1e9, 0)} ГБ/с и сеть "
             f"{num(gpu.network_bandwidth / 1e9, 0)} ГБ/с на GPU в одну сторону, 8 GPU в узле"))
    print(tr(f"fitted on torchtitan's A100 runs: matrix products at {num(calibration.matmul_fraction, 3)} of the "
             f"peak, memory-bound kernels at {num(calibration.hbm_fraction, 3)} of HBM, rings across nodes at "
             f"{num(calibration.network_fraction, 3)} of the network",
             f"подобрано по запускам torchtitan на A100: матричные произведения — {num(calibration.matmul_fraction, 3)} "
             f"пика, ядра, упирающиеся в память, — {num(calibration.hbm_fraction, 3)} HBM, кольца между узлами — "
             f"{num(calibration.network_fraction, 3)} сети"))


def verdict_word(p) -> str:
    """A plan's memory verdict with its error band ("fits", "undecided", "does not fit"), in the lesson's language."""
    return text(VERDICT_MESSAGES[p.memory.fit_verdict])


def show_plans(plans, labels: list[str]) -> None:
    """Print one line per plan: its label, its peak memory per GPU (GiB, as max_memory_reserved reads it),
    the verdict with the memory error band, its tokens/s per GPU and MFU (torchtitan's), the seconds of a step."""
    width = max(len(label) for label in labels) + 2
    print(f"{'':<{width}}{tr('GiB/GPU', 'ГиБ/GPU'):>9}{tr('verdict', 'вердикт'):>15}"
          f"{tr('tokens/s/GPU', 'токенов/с/GPU'):>15}{'MFU':>7}{tr('step, s', 'шаг, с'):>9}")
    percent = tr("%", "\u00a0%")  # Russian puts a no-break space before the sign
    for label, p in zip(labels, plans):
        print(f"{label:<{width}}{num(p.memory.peak_reserved / 1024 ** 3, 1):>9}{verdict_word(p):>15}"
              f"{num(p.time.tokens_per_s_per_gpu, 0):>15}{num(100 * p.time.mfu, 1):>6}{percent}"
              f"{num(p.time.step_s, 2):>9}")


# --- rows for `fsdp_mini.course.show.show`: the lesson's tables without formatting code in its cells --------

def model_state_bytes(p) -> float:
    """A plan's sharded model states per GPU (parameters, gradients, AdamW moments), bytes."""
    return sum(p.memory.terms[k] for k in STATES)


def memory_rows(p) -> list[dict]:
    """A plan's memory per GPU, term by term (GiB), then its peak as max_memory_reserved reads it and the
    moment it happens."""
    gib = 1024 ** 3
    rows = [{"memory_term": term_name(name), "gib": nbytes / gib} for name, nbytes in p.memory.terms.items()]
    rows.append({"memory_term": text("peak_reserved_at", moment=term_name(p.memory.peak_moment)),
                 "gib": p.memory.peak_reserved / gib})
    return rows


def time_rows(p) -> list[dict]:
    """A plan's optimizer step, part by part (seconds), then the whole step."""
    rows = [{"step_part": term_name(name), "seconds": s} for name, s in p.time.parts.items()]
    rows.append({"step_part": text("step"), "seconds": p.time.step_s})
    return rows


def validation_rows(validations, fitted_rows) -> list[dict]:
    """One row per published run `validate` compared: the run (model, GPUs, layout, AC and switches), whether
    the planner was fitted on it, the published tokens/s per GPU, the planner's and the relative error; then the
    published peak memory where the run reports it, the planner's and the relative error (`MISSING`: not
    published)."""
    rows = []
    for v in validations:
        r = v.row
        run = r.ac.value + (" compile" if r.compile else "") + (" float8" if r.float8 else "")
        fitted = text("fitted_yes" if r in fitted_rows else "fitted_no")
        memory_error = MISSING if v.memory_error is None else round(v.memory_error, 3) + 0.0
        layout = layout_cell(r, ru_cell if get_language() == "ru" else str)
        rows.append({"model_name": r.model, "GPU": f"{r.gpus} × {r.gpu}", "layout_name": layout, "AC": run, "fitted_on": fitted, "published_rate": r.tokens_per_s, "planner_rate": v.tokens_per_s,
                     "planner_error": round(v.error, 3) + 0.0,  # + 0.0: no -0.0
                     "published_gib": MISSING if r.memory_gib is None else r.memory_gib,
                     "planner_gib": v.memory_gib, "memory_error": memory_error})
    return rows
