"""Fitting the planner's three constants (`calibration`) to measured runs: torchtitan's published ones, or yours.

One fit for both: `validation.fit` refits the shipped constants on torchtitan's A100 rows with `fit_constants`, and
`python -m fsdp_mini fit RUNS.csv` (`fit_runs`) fits them to a user's own runs, which `runs_file.read_runs` reads.
The fit minimises the sum of squared relative errors of the step time (measured step = tokens per GPU per step /
measured tokens/s per GPU). Memory is not fitted (`memory` has no fitted constant); a run's measured memory is
shown beside the prediction.

A run determines a constant only if its predicted step moves when the constant does. `undetermined` finds those no
run moves (on one node no ring crosses the network, so nothing there says how fast the network is), `inseparable`
two that the runs move only together (runs of one shape); the fit keeps them at their starting values and says so.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fsdp_mini.course.planner.calibration import CALIBRATION, Calibration
from fsdp_mini.course.planner.hardware import GPU, GiB
from fsdp_mini.course.planner.layout import Layout
from fsdp_mini.course.planner.memory import memory_breakdown
from fsdp_mini.course.planner.models import ModelSpec
from fsdp_mini.course.planner.step_time import step_time

__all__ = ["CONSTANTS", "MeasuredRun", "Fit", "fit_constants", "undetermined", "inseparable", "fit_runs"]

CONSTANTS = tuple(f.name for f in dataclasses.fields(Calibration))
"""The fitted constants, in `Calibration`'s order: matmul_fraction, hbm_fraction, network_fraction."""
NETWORK_GRID = tuple(round(0.05 + 0.01 * i, 2) for i in range(96))
"""The network fractions the fit tries (0.05 to 1.00) before refining the best one."""


@dataclass(frozen=True)
class MeasuredRun:
    """One measured run: what ran (model, GPU, layout) and what it reached."""

    model: ModelSpec
    gpu: GPU
    layout: Layout
    tokens_per_s_per_gpu: float
    memory_gib: float | None = None
    label: str = ""

    @property
    def step_s(self) -> float:
        """The measured seconds per optimizer step: the tokens one GPU takes per step over its measured rate."""
        return self.layout.tokens_per_step / self.layout.gpus / self.tokens_per_s_per_gpu


def _steps(runs, calibration: Calibration) -> list[float]:
    return [step_time(r.model, r.gpu, r.layout, calibration).step_s for r in runs]


def undetermined(runs, start: Calibration = CALIBRATION) -> tuple[str, ...]:
    """The constants that move no run's predicted step: halving a compute fraction, or setting the network fraction
    anywhere on the fit's grid (`NETWORK_GRID`'s ends and `start`'s), changes none."""
    base = _steps(runs, start)
    out = []
    for name in CONSTANTS:
        values = (NETWORK_GRID[0], NETWORK_GRID[-1]) if name == "network_fraction" else (getattr(start, name) / 2,)
        moved = any(abs(a / b - 1) > 1e-12 for value in values
                    for a, b in zip(_steps(runs, dataclasses.replace(start, **{name: value})), base))
        if not moved:
            out.append(name)
    return tuple(out)


def inseparable(runs, names, start: Calibration = CALIBRATION) -> bool:
    """Whether the runs move the compute constants `names` only together: each run's step changes by the same
    relative amount per change of one as of the other (runs of one shape), so no fit can tell them apart."""
    import numpy as np

    if len(names) < 2:
        return False
    base = np.array(_steps(runs, start))
    columns = [np.array(_steps(runs, dataclasses.replace(start, **{name: getattr(start, name) * 0.99}))) / base - 1
               for name in names]
    cosine = abs(columns[0] @ columns[1]) / (np.linalg.norm(columns[0]) * np.linalg.norm(columns[1]))
    return bool(cosine > 1 - 1e-9)


def fit_constants(runs, free=CONSTANTS, start: Calibration = CALIBRATION) -> Calibration:
    """The constants in `free` that minimise the sum of squared relative errors of the step times of `runs`; the
    others keep `start`'s values.

    The step time has kinks (a collective hides until it no longer does), so no gradient is trusted across the
    network fraction: for each network fraction on a grid (`NETWORK_GRID`) the compute fractions come from
    Gauss-Newton on their reciprocals (the step is smooth in them), the best grid point is refined by golden-section
    search. Deterministic: fixed grid, fixed starts, fixed passes."""
    import numpy as np

    unknown = [name for name in free if name not in CONSTANTS]
    if unknown:
        raise ValueError(f"unknown constant {unknown[0]!r}; constants: {', '.join(CONSTANTS)}")
    runs = list(runs)
    measured = np.array([r.step_s for r in runs])
    compute = [k for k, name in enumerate(CONSTANTS[:2]) if name in free]

    def steps(x, network) -> np.ndarray:
        return np.array(_steps(runs, Calibration(1 / x[0], 1 / x[1], network)))

    def best_compute(network):
        x = np.array([1.5 if k in compute else 1 / getattr(start, CONSTANTS[k]) for k in range(2)])
        for _ in range(30 if compute else 0):
            now = steps(x, network)
            jac = np.empty((len(runs), len(compute)))
            for j, k in enumerate(compute):
                dx = np.zeros(2)
                dx[k] = 1e-6 * x[k]
                jac[:, j] = (steps(x + dx, network) - now) / dx[k]
            delta, *_ = np.linalg.lstsq(jac / measured[:, None], (measured - now) / measured, rcond=None)
            x[compute] = x[compute] + delta
            if np.max(np.abs(delta / x[compute])) < 1e-12:
                break
        return x, float(np.sum(((steps(x, network) - measured) / measured) ** 2))

    if "network_fraction" in free:
        costs = [best_compute(n)[1] for n in NETWORK_GRID]
        i = int(np.argmin(costs))
        lo, hi = NETWORK_GRID[max(0, i - 1)], NETWORK_GRID[min(len(NETWORK_GRID) - 1, i + 1)]
        ratio = (5 ** 0.5 - 1) / 2
        for _ in range(40):
            a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
            if best_compute(a)[1] <= best_compute(b)[1]:
                hi = b
            else:
                lo = a
        network = (lo + hi) / 2
    else:
        network = start.network_fraction
    x, _ = best_compute(network)
    return Calibration(float(1 / x[0]), float(1 / x[1]), float(network))


@dataclass(frozen=True)
class Fit:
    """A fit to measured runs: the constants before and after, which were fitted and which the runs leave
    undetermined, and each run's predicted tokens/s and memory."""

    runs: tuple
    before: Calibration
    after: Calibration
    fitted: tuple
    undetermined: dict
    """Each constant the runs leave undetermined, and why."""
    predicted_before: tuple
    predicted_after: tuple
    memory_gib: tuple

    def errors(self, after: bool = True) -> list[float]:
        """Each run's relative error of tokens/s: predicted / measured - 1, with the fitted constants or the
        starting ones."""
        predicted = self.predicted_after if after else self.predicted_before
        return [p / r.tokens_per_s_per_gpu - 1 for p, r in zip(predicted, self.runs)]

    def report(self) -> str:
        """What `python -m fsdp_mini fit` prints: each run's error before and after, then the constants."""
        width = max(len(r.label) for r in self.runs) + 2
        lines = [f"{'run':<{width}}{'measured':>10}{'before':>9}{'error':>8}{'after':>9}{'error':>8}"
                 f"{'GiB':>8}{'predicted':>10}{'error':>8}",
                 f"{'':<{width}}{'tokens/s per GPU':>44}{'memory':>26}"]
        for run, b, a, eb, ea, gib in zip(self.runs, self.predicted_before, self.predicted_after, self.errors(False),
                                          self.errors(True), self.memory_gib):
            memory = (f"{run.memory_gib:8.1f}{gib:10.1f}{(gib / run.memory_gib - 1) * 100:+7.1f}%"
                      if run.memory_gib is not None else f"{'-':>8}{gib:10.1f}{'-':>8}")
            lines.append(f"{run.label:<{width}}{run.tokens_per_s_per_gpu:10,.0f}{b:9,.0f}{eb * 100:+7.1f}%{a:9,.0f}"
                         f"{ea * 100:+7.1f}%{memory}")
        lines.append("")
        lines.append(f"{'constant':<20}{'before':>8}{'after':>8}")
        for name in CONSTANTS:
            note = f"  kept: {self.undetermined[name]}" if name in self.undetermined else ""
            if getattr(self.after, name) > 1:
                note = ("  above 1: these runs are faster than the planner's count of this work allows at the peak; "
                        "it overcounts their work here, so read the fit with care")
            lines.append(f"{name:<20}{getattr(self.before, name):8.3f}{getattr(self.after, name):8.3f}{note}")
        return "\n".join(lines)


def fit_runs(runs, start: Calibration = CALIBRATION) -> Fit:
    """Fit the constants the runs determine (`undetermined` names the others, kept at `start`). Fewer runs than
    constants, or runs that determine none, are an error that says so."""
    runs = tuple(runs)
    if len(runs) < len(CONSTANTS):
        raise ValueError(f"{len(runs)} run{'s' if len(runs) != 1 else ''} cannot fit {len(CONSTANTS)} constants "
                         f"({', '.join(CONSTANTS)}): give at least {len(CONSTANTS)}")
    left = {name: "no run's predicted step depends on it" + (
        " (no ring of theirs crosses nodes, or every crossing hides behind compute)" if name == "network_fraction"
        else "") for name in undetermined(runs, start)}
    if inseparable(runs, [name for name in CONSTANTS[:2] if name not in left], start):
        left["hbm_fraction"] = ("the runs move it only together with matmul_fraction (runs of one shape): give runs "
                                "of other shapes, batches or switches to tell them apart")
    free = tuple(name for name in CONSTANTS if name not in left)
    if not free:
        raise ValueError("no run's predicted step depends on any constant: nothing to fit")
    after = fit_constants(runs, free, start)

    def rates(calibration):
        return tuple(step_time(r.model, r.gpu, r.layout, calibration).tokens_per_s_per_gpu for r in runs)

    memory = tuple(memory_breakdown(r.model, r.gpu, r.layout).peak_reserved / GiB for r in runs)
    return Fit(runs, start, after, free, left, rates(start), rates(after), memory)
