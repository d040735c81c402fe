"""Published measurements the planner is checked against, and the table of predicted against published.

`CALIBRATION_ROWS` are torchtitan's A100 runs (docs/performance.md of pytorch/torchtitan: "Llama 3 performance
numbers" and "Llama 2 performance numbers"): 64 A100-80GB, FSDP2 over all 64 ranks, bf16 parameters with
fp32 reduction, Llama 3 at sequence 8,192 and Llama 2 at 4,096, local batch as given. How they were run,
from the train configs of the time (train_configs/llama3_8b.toml, "a preset for 64 A100 GPUs"): `compile =
false`, `enable_float8_linear = false`, `norm_type = "rmsnorm"` (eager), selective layer checkpointing with
torchtitan's default `selective_ac_option = "2"` (every second block). These eight rows fit the three
constants of `calibration`; nothing else does.

`HELD_OUT_ROWS` are published runs of other GPUs, layouts and scales that nothing was fitted on: torchtitan's
H100 benchmarks (December 2024: FSDP on 8 and 128 GPUs, CP up to 262,144 tokens, FSDP x TP on 256; June 2025:
the async TP benchmark's vanilla TP runs) and Trainy's H200 runs (June 2025), tokens/s and, where published,
memory. `HELD_OUT_BOUNDS` is the promise the docs page makes about them, checked by the tests.

The page lessons/en/planner.md (and its Russian twin) shows `table()` and `held_out_table()`;
tests/course/test_planner.py checks every calibration row within `TOLERANCE` and the held-out rows within
`HELD_OUT_BOUNDS`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from fsdp_mini.course.language import ru_cell
from fsdp_mini.course.planner.calibration import CALIBRATION, Calibration
from fsdp_mini.course.planner.fitting import MeasuredRun, fit_constants
from fsdp_mini.course.planner.hardware import GiB, get_gpu
from fsdp_mini.course.planner.layout import Checkpointing, Layout
from fsdp_mini.course.planner.memory import memory_breakdown
from fsdp_mini.course.planner.models import get_model
from fsdp_mini.course.planner.step_time import step_time

__all__ = ["PublishedRow", "CALIBRATION_ROWS", "HELD_OUT_ROWS", "HELD_OUT_BOUNDS", "CHECK_ROWS", "TOLERANCE",
           "Validated", "validate", "fit", "table", "held_out_table", "bound_of", "bounds_text", "layout_cell"]

TOLERANCE = 0.10
"""The target: predicted tokens/s within 10 % of the published on every row."""


@dataclass(frozen=True)
class PublishedRow:
    """One published run: the model, its local batch and checkpointing, tokens/s per GPU and MFU as published."""

    model: str
    local_batch: int
    ac: Checkpointing
    tokens_per_s: float
    mfu: float | None
    gpu: str = "a100-80gb"
    gpus: int = 64
    tp: int = 1
    compile: bool = False
    float8: bool = False
    cp: int = 1
    seq_len: int = 0
    compile_loss: bool = False
    memory_gib: float | None = None
    source: str = "A100, docs/performance.md"

    @property
    def seq(self) -> int:
        """The sequence as run: `seq_len`, or torchtitan's default of the model's family."""
        return self.seq_len or (8192 if self.model.startswith("llama3") else 4096)

    def layout(self) -> Layout:
        """The run as configured; torchtitan's TP always comes with sequence parallelism on the norms."""
        return Layout(gpus=self.gpus, seq=self.seq, local_batch=self.local_batch, ac=self.ac, tp=self.tp,
                      sp=self.tp > 1, cp=self.cp, compile=self.compile, float8=self.float8,
                      compile_loss=self.compile_loss)


_A = Checkpointing
CALIBRATION_ROWS = (
    PublishedRow("llama3-8b", 1, _A.SELECTIVE_LAYER, 2904, 0.568),
    PublishedRow("llama3-8b", 1, _A.SELECTIVE_OP, 2973, 0.582),
    PublishedRow("llama3-70b", 1, _A.FULL, 331, 0.517),
    PublishedRow("llama2-13b", 2, _A.NONE, 2162, 0.611),
    PublishedRow("llama2-13b", 2, _A.SELECTIVE_LAYER, 1914, 0.541),
    PublishedRow("llama2-13b", 2, _A.SELECTIVE_OP, 1904, 0.538),
    PublishedRow("llama2-70b", 1, _A.SELECTIVE_OP, 355, 0.508),
    PublishedRow("llama2-70b", 2, _A.FULL, 353, 0.505),
)

_H100_2412 = "H100, Dec 2024"
_H100_2506 = "H100, Jun 2025"
_H200_2506 = "H200, Jun 2025"
HELD_OUT_ROWS = (
    # torchtitan benchmarks/llama3_h100_202412_torchtitan.md: Grand Teton H100 96 GB HBM2e at 500 W, 8 per host,
    # 400 Gb/s per GPU; torchtitan 9dec370 (2024-12-26), whose llama3_8b.toml checkpoints "selective" / "op" at
    # sequence 8,192, keeps the loss eager (its train.py: "compiling loss function causes CUDA errors"); float8:
    # tensorwise. Memory: torchtitan's max_reserved. Table 1: FSDP 8, local batch 2, selective checkpointing.
    PublishedRow("llama3-8b", 2, _A.SELECTIVE_OP, 5762, None, "h100-96gb", 8, memory_gib=82.4, source=_H100_2412),
    PublishedRow("llama3-8b", 2, _A.SELECTIVE_OP, 6667, None, "h100-96gb", 8, compile=True, memory_gib=77.0,
                 source=_H100_2412),
    PublishedRow("llama3-8b", 2, _A.SELECTIVE_OP, 8532, None, "h100-96gb", 8, compile=True, float8=True,
                 memory_gib=76.8, source=_H100_2412),
    # Table 2: FSDP x CP on 8 GPUs, local batch 1, full checkpointing, compile and float8, sequence 32k to 256k
    *(PublishedRow("llama3-8b", 1, _A.FULL, tps, None, "h100-96gb", 8, compile=True, float8=True, cp=cp,
                   seq_len=32768 * cp, memory_gib=gib, source=_H100_2412)
      for cp, tps, gib in ((1, 3890, 83.9), (2, 2540, 84.2), (4, 1071, 84.0), (8, 548, 84.5))),
    # Table 3: FSDP 128, as table 1
    PublishedRow("llama3-8b", 2, _A.SELECTIVE_OP, 5605, None, "h100-96gb", 128, memory_gib=67.0, source=_H100_2412),
    PublishedRow("llama3-8b", 2, _A.SELECTIVE_OP, 6514, None, "h100-96gb", 128, compile=True, memory_gib=62.0,
                 source=_H100_2412),
    PublishedRow("llama3-8b", 2, _A.SELECTIVE_OP, 8380, None, "h100-96gb", 128, compile=True, float8=True,
                 memory_gib=61.8, source=_H100_2412),
    # Table 4, "2D": FSDP 32 x TP 8, local batch 16, full checkpointing, compile, float8 (its "2D + AsyncTP" row
    # overlaps TP's collectives with the products, which the planner does not model; tables 5 and 6 use
    # pipeline parallelism, which it does not model either: both left out)
    PublishedRow("llama3-70b", 16, _A.FULL, 829, None, "h100-96gb", 256, 8, True, True, memory_gib=71.9,
                 source=_H100_2412),
    # torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md, "Vanilla TP" column (tensorwise float8;
    # the rowwise runs' figure is an issue torchtitan names there): the same cluster, FSDP x TP 8, compile
    # (the loss too, since 2025), sequence 8,192; no memory published.
    PublishedRow("llama3-8b", 12, _A.SELECTIVE_OP, 4378, None, "h100-96gb", 64, 8, True, compile_loss=True,
                 source=_H100_2506),
    PublishedRow("llama3-8b", 12, _A.SELECTIVE_OP, 5078.1, None, "h100-96gb", 64, 8, True, True, compile_loss=True,
                 source=_H100_2506),
    PublishedRow("llama3-70b", 16, _A.FULL, 597.3, None, "h100-96gb", 256, 8, True, compile_loss=True,
                 source=_H100_2506),
    PublishedRow("llama3-70b", 16, _A.FULL, 809.8, None, "h100-96gb", 256, 8, True, True, compile_loss=True,
                 source=_H100_2506),
    # torchtitan benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md: 4 and 8 hosts of 8 H200, 400 Gb/s per
    # GPU; llama3_8b.toml (selective "op", sequence 8,192), local batch 2, compile (model and loss), float8 with
    # float8 all-gather. Memory sampled at step 100.
    *(PublishedRow("llama3-8b", 2, _A.SELECTIVE_OP, tps, None, "h200", gpus, compile=True, float8=True,
                   compile_loss=True, memory_gib=gib, source=_H200_2506)
      for gpus, tps, gib in ((32, 10938, 47.96), (64, 10753, 46.97))),
)
"""Published runs the constants were not fitted on: other GPUs, layouts and scales."""

CHECK_ROWS = tuple(r for r in HELD_OUT_ROWS if r.source == _H100_2506)
"""The async TP benchmark's rows of `HELD_OUT_ROWS` (the name the first version of the page used)."""

HELD_OUT_BOUNDS = {"tokens/s": (-0.05, 0.30), "tokens/s, CP 4 and 8": (-0.05, 0.65), "memory": (-0.20, 0.0)}
"""What the docs page promises about `HELD_OUT_ROWS`: the range of the relative error (predicted / published - 1)
of tokens/s (`bound_of`: rows with CP up to 2; rows with CP 4 and 8) and of memory (rows that publish it)."""


def bound_of(row: PublishedRow) -> str:
    """Which of `HELD_OUT_BOUNDS`' tokens/s ranges a row is promised."""
    return "tokens/s, CP 4 and 8" if row.cp >= 4 else "tokens/s"


def bounds_text(language: str = "en") -> list[str]:
    """`HELD_OUT_BOUNDS` as the docs pages write them (the tests look for each on the page)."""
    out = []
    for lo, hi in HELD_OUT_BOUNDS.values():
        if language == "ru":
            out.append(f"от {lo * 100:+.0f} до {hi * 100:+.0f}\u00a0%".replace("-", "\u2212").replace("+0", "0"))
        else:
            out.append(f"{lo * 100:+.0f} % to {hi * 100:+.0f} %".replace("+0 %", "0 %"))
    return out


@dataclass(frozen=True)
class Validated:
    """A published row beside the planner's prediction for it."""

    row: PublishedRow
    tokens_per_s: float
    mfu: float
    memory_gib: float = 0.0

    @property
    def error(self) -> float:
        """Relative error of the predicted tokens/s: (predicted - published) / published."""
        return self.tokens_per_s / self.row.tokens_per_s - 1

    @property
    def memory_error(self) -> float | None:
        """Relative error of the predicted peak reserved memory, where the row publishes it."""
        return None if self.row.memory_gib is None else self.memory_gib / self.row.memory_gib - 1


def validate(rows=CALIBRATION_ROWS, calibration: Calibration = CALIBRATION) -> list[Validated]:
    out = []
    for row in rows:
        model, gpu, layout = get_model(row.model), get_gpu(row.gpu), row.layout()
        t = step_time(model, gpu, layout, calibration)
        out.append(Validated(row, t.tokens_per_s_per_gpu, t.mfu, memory_breakdown(model, gpu, layout).peak_reserved / GiB))
    return out


def fit(rows=CALIBRATION_ROWS) -> Calibration:
    """The three constants that minimise the sum of squared relative errors of the step times of `rows`
    (`fitting.fit_constants`: the same fit `python -m fsdp_mini fit` runs on a user's own runs)."""
    return fit_constants([MeasuredRun(get_model(r.model), get_gpu(r.gpu), r.layout(), r.tokens_per_s) for r in rows])


def table(validated=None, language: str = "en") -> str:
    """The validation table as Markdown, English or Russian (headers and number typography)."""
    validated = validate() if validated is None else validated
    fmt = ru_cell if language == "ru" else (lambda x: x)
    heads = {"en": ("model", "local batch", "AC", "published tokens/s", "predicted", "error", "published MFU",
                    "predicted MFU"),
             "ru": ("модель", "локальный батч", "чекпоинтинг", "опубликовано, токенов/с", "предсказано", "ошибка",
                    "опубликованный MFU", "предсказанный MFU")}[language]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for v in validated:
        r = v.row
        published_mfu = "\u2014" if r.mfu is None else f"{r.mfu * 100:.1f} %"
        cells = [f"{r.tokens_per_s:,.0f}", f"{v.tokens_per_s:,.0f}", f"{v.error * 100:+.1f} %", published_mfu,
                 f"{v.mfu * 100:.1f} %"]
        run = r.ac.value + (", float8" if r.float8 else "")
        lines.append(f"| {r.model} | {r.local_batch} | {run} | " + " | ".join(fmt(c) for c in cells) + " |")
    return "\n".join(lines)


def layout_cell(r: PublishedRow, fmt=lambda x: x) -> str:
    """FSDP's degree, then TP's and CP's where they are not 1, and a sequence other than 8,192 (`fmt` writes
    the number in the page's language)."""
    layout = r.layout()
    text = f"FSDP {layout.fsdp_group // r.cp}" + (f" × TP {r.tp}" if r.tp > 1 else "") + (
        f" × CP {r.cp}" if r.cp > 1 else "")
    return text + (f", seq {fmt(f'{r.seq:,}')}" if r.seq != 8192 else "")


def held_out_table(validated=None, language: str = "en") -> str:
    """The held-out rows as Markdown: tokens/s and memory, published, predicted, and the errors."""
    validated = validate(HELD_OUT_ROWS) if validated is None else validated
    fmt = ru_cell if language == "ru" else (lambda x: x)
    heads = {"en": ("published", "model", "GPUs", "layout", "local batch", "run", "tokens/s", "predicted", "error",
                    "memory GiB", "predicted", "error"),
             "ru": ("источник", "модель", "GPU", "раскладка", "локальный батч", "запуск", "токенов/с", "предсказано",
                    "ошибка", "память, ГиБ", "предсказано", "ошибка")}[language]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for v in validated:
        r = v.row
        run = ", ".join([r.ac.value] + (["compile"] if r.compile else []) + (["float8"] if r.float8 else []))
        if r.memory_gib is None:
            memory = ["\u2014", f"{v.memory_gib:.1f}", "\u2014"]
        else:
            memory = [f"{r.memory_gib:.1f}", f"{v.memory_gib:.1f}", f"{v.memory_error * 100:+.1f} %"]
        cells = [f"{r.tokens_per_s:,.0f}", f"{v.tokens_per_s:,.0f}", f"{v.error * 100:+.1f} %"] + memory
        source = r.source if language == "en" else re.sub(  # «дек. 2024 г.»: a year, not 2 024 of something
            r"(\d{4})$", r"\1 г.", r.source.replace("Dec", "дек.").replace("Jun", "июнь"))
        lines.append(f"| {source} | {r.model} | {r.gpus} | {layout_cell(r, fmt)} | {r.local_batch} | {run} | "
                     + " | ".join(fmt(c) for c in cells) + " |")
    return "\n".join(lines)


def rewrite_pages(root=".") -> None:
    """Put the current tables into lessons/en/planner.md and lessons/ru/planner.md (each Markdown table of a
    page is replaced: the one whose header starts with MPT by `llm_foundry.table`, the one whose header counts
    memory in GiB by the held-out table, the other by the calibration table). `python -m fsdp_mini.course.planner.validation` runs it; tests/course/test_planner.py
    says when it is due."""
    import re
    from pathlib import Path

    from fsdp_mini.course.planner import llm_foundry

    held_out = validate(HELD_OUT_ROWS)

    def current(header: str, language: str) -> str:
        if header.startswith("| MPT |"):
            return llm_foundry.table(language=language)
        return held_out_table(held_out, language) if re.search("GiB|ГиБ", header) else table(language=language)

    for language in ("en", "ru"):
        path = Path(root) / "lessons" / language / "planner.md"
        text = path.read_text(encoding="utf-8")
        text = re.sub(r"(?:^\|.*\n)+", lambda m: current(m.group(0).split("\n")[0], language) + "\n", text,
                      flags=re.M)
        path.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    rewrite_pages()
