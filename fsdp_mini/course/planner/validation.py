"""Published measurements the planner is checked against, and the table of predicted against published.

`CALIBRATION_ROWS` are torchtitan's A100 runs (docs/performance.md of pytorch/torchtitan: "Llama 3 performance
numbers" and "Llama 2 performance numbers"): 64 A100-80GB, FSDP2 over all 64 ranks, bf16 parameters with
fp32 reduction, Llama 3 at sequence 8,192 and Llama 2 at 4,096, local batch as given. How they were run,
from the train configs of the time (train_configs/llama3_8b.toml, "a preset for 64 A100 GPUs"): `compile =
false`, `enable_float8_linear = false`, `norm_type = "rmsnorm"` (eager), selective layer checkpointing with
torchtitan's default `selective_ac_option = "2"` (every second block). These eight rows fit the three
constants of `calibration`; nothing else does.

The page lessons/en/planner.md (and its Russian twin) shows `table()`; tests/course/test_planner.py checks
every row within `TOLERANCE`.
"""
from __future__ import annotations

from dataclasses import dataclass

from fsdp_mini.course.planner.calibration import CALIBRATION, Calibration
from fsdp_mini.course.planner.hardware import get_gpu
from fsdp_mini.course.planner.layout import Checkpointing, Layout
from fsdp_mini.course.planner.models import get_model
from fsdp_mini.course.planner.step_time import step_time

__all__ = ["PublishedRow", "CALIBRATION_ROWS", "CHECK_ROWS", "TOLERANCE", "Validated", "validate", "fit", "table"]

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

    @property
    def seq(self) -> int:
        return 8192 if self.model.startswith("llama3") else 4096

    def layout(self) -> Layout:
        """The run as configured; torchtitan's TP always comes with sequence parallelism on the norms."""
        return Layout(gpus=self.gpus, seq=self.seq, local_batch=self.local_batch, ac=self.ac, tp=self.tp,
                      sp=self.tp > 1, compile=self.compile, float8=self.float8)


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

CHECK_ROWS = (
    # torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md, "Vanilla TP" column: Grand Teton H100
    # 96 GB at 500 W, FSDP x TP 8, torch.compile; sequence 8,192 (torchtitan's Llama 3 configs). Not fitted on:
    # shown on the docs page as a check of what the A100 constants say about another GPU and layout.
    PublishedRow("llama3-8b", 12, _A.SELECTIVE_OP, 4378, None, "h100-96gb", 64, 8, True),
    PublishedRow("llama3-8b", 12, _A.SELECTIVE_OP, 5078.1, None, "h100-96gb", 64, 8, True, True),
    PublishedRow("llama3-70b", 16, _A.FULL, 597.3, None, "h100-96gb", 256, 8, True),
    PublishedRow("llama3-70b", 16, _A.FULL, 809.8, None, "h100-96gb", 256, 8, True, True),
)
"""Published runs the constants were not fitted on (float8: tensorwise scaling; their MFU is not published)."""


@dataclass(frozen=True)
class Validated:
    """A published row beside the planner's prediction for it."""

    row: PublishedRow
    tokens_per_s: float
    mfu: float

    @property
    def error(self) -> float:
        """Relative error of the predicted tokens/s: (predicted - published) / published."""
        return self.tokens_per_s / self.row.tokens_per_s - 1


def validate(rows=CALIBRATION_ROWS, calibration: Calibration = CALIBRATION) -> list[Validated]:
    out = []
    for row in rows:
        t = step_time(get_model(row.model), get_gpu(row.gpu), row.layout(), calibration)
        out.append(Validated(row, t.tokens_per_s_per_gpu, t.mfu))
    return out


def fit(rows=CALIBRATION_ROWS) -> Calibration:
    """The three constants that minimise the sum of squared relative errors of the step times of `rows`.

    The step time has kinks (a collective hides until it no longer does), so no gradient is trusted: for
    each network fraction on a grid (0.05 to 1.00, step 0.01) the two compute fractions come from
    Gauss-Newton (smooth in them), the best grid point is refined by golden-section search on the network
    fraction. Deterministic: fixed grid, fixed starts, fixed passes."""
    import numpy as np

    cases = [(get_model(r.model), get_gpu(r.gpu), r.layout()) for r in rows]
    published = np.array([lay.tokens_per_step / lay.gpus / r.tokens_per_s for (_, _, lay), r in zip(cases, rows)])

    def steps(x, network) -> np.ndarray:
        cal = Calibration(1 / x[0], 1 / x[1], network)
        return np.array([step_time(m, g, lay, cal).step_s for m, g, lay in cases])

    def best_compute(network):
        x = np.array([1.5, 1.5])
        for _ in range(30):
            now = steps(x, network)
            jac = np.empty((len(cases), 2))
            for k in range(2):
                dx = np.zeros(2)
                dx[k] = 1e-6 * x[k]
                jac[:, k] = (steps(x + dx, network) - now) / dx[k]
            delta, *_ = np.linalg.lstsq(jac / published[:, None], (published - now) / published, rcond=None)
            x = x + delta
            if np.max(np.abs(delta / x)) < 1e-12:
                break
        return x, float(np.sum(((steps(x, network) - published) / published) ** 2))

    grid = [round(0.05 + 0.01 * i, 2) for i in range(96)]
    costs = [best_compute(n)[1] for n in grid]
    i = int(np.argmin(costs))
    lo, hi = grid[max(0, i - 1)], grid[min(len(grid) - 1, i + 1)]
    ratio = (5 ** 0.5 - 1) / 2
    for _ in range(40):
        a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        if best_compute(a)[1] <= best_compute(b)[1]:
            hi = b
        else:
            lo = a
    network = (lo + hi) / 2
    x, _ = best_compute(network)
    return Calibration(float(1 / x[0]), float(1 / x[1]), float(network))


def _ru(text: str) -> str:
    """A cell in Russian typography: thin-space thousands, decimal comma, no-break space before %, minus sign."""
    text = text.replace(",", "\u202f").replace(".", ",").replace(" %", "\u00a0%")
    return "\u2212" + text[1:] if text.startswith("-") else text


def table(validated=None, language: str = "en") -> str:
    """The validation table as Markdown, English or Russian (headers and number typography)."""
    validated = validate() if validated is None else validated
    fmt = _ru if language == "ru" else (lambda x: x)
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


def rewrite_pages(root=".") -> None:
    """Put the current tables into lessons/en/planner.md and lessons/ru/planner.md (each Markdown table of a
    page is replaced: the one with float8 rows by `CHECK_ROWS`' table, the other by the calibration table).
    `python -m fsdp_mini.course.planner.validation` runs it; tests/course/test_planner.py says when it is due."""
    import re
    from pathlib import Path

    checks = validate(CHECK_ROWS)
    for language in ("en", "ru"):
        path = Path(root) / "lessons" / language / "planner.md"
        text = path.read_text(encoding="utf-8")
        text = re.sub(r"(?:^\|.*\n)+", lambda m: (table(checks, language) if "float8" in m.group(0)
                                                  else table(language=language)) + "\n", text, flags=re.M)
        path.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    rewrite_pages()
