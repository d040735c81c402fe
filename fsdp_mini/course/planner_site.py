"""What the site's planner (lessons/assets/calculator/planner.js) knows: the planner's presets and constants,
taken from `fsdp_mini.course.planner` when the site is built.

One source of truth for the numbers: the page's JavaScript ports the planner's formulas but restates none of
its numbers. Model shapes, GPU specifications, the three fitted fractions, every named constant and the
layout's defaults come from here; lessons/_site/planner_data.py puts `data_script()` into the calculator page
at build time, and tests/site/test_site.py checks that the page's data equals `site_data()` and that the page's
plans equal Python's, number for number.
"""
from __future__ import annotations

import dataclasses
import json

from fsdp_mini.course.planner import CALIBRATION, GPUS, MODELS, GiB
import fsdp_mini.course.planner.activations as activations
import fsdp_mini.course.planner.hardware as hardware
from fsdp_mini.course.viz.planning import RU_NAMES
from fsdp_mini.course.planner.memory import ALLOCATOR_OVERHEAD, MEMORY_ERROR_BAND, STATE_BYTES, VERDICTS
from fsdp_mini.course.planner.step_time import (ATTENTION_BACKWARD_RATIO, COMPILED_LOSS_BYTES_PER_LOGIT,
                                                FSDP_COPY_BYTES_PER_PARAM, LOSS_BYTES_PER_LOGIT,
                                                OPTIMIZER_BYTES_PER_PARAM)
from fsdp_mini.course.planner.layout import SP_VARIANTS, Checkpointing, Layout
from fsdp_mini.course.planner.validation import CALIBRATION_ROWS

__all__ = ["site_data", "data_script"]


def _fields(obj) -> dict:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def _start() -> dict:
    row = CALIBRATION_ROWS[0]
    layout = row.layout()
    return {"model": row.model, "gpu": row.gpu, "gpus": layout.gpus, "seq": layout.seq, "local_batch": layout.local_batch,
            "tp": layout.tp, "sp": layout.sp, "ac": layout.ac.value, "compile": layout.compile, "float8": layout.float8,
            "published_tokens_per_s": row.tokens_per_s, "published_mfu": row.mfu}


def site_data() -> dict:
    """Presets, constants and defaults as plain JSON values (floats as Python's repr writes them: exact)."""
    return {
        "models": {name: _fields(m) | {"params": m.params} for name, m in MODELS.items()},
        "gpus": {name: _fields(g) for name, g in GPUS.items()},
        "calibration": _fields(CALIBRATION),
        "checkpointing": [c.value for c in Checkpointing],
        "sp_variants": list(SP_VARIANTS),
        "layout_defaults": {f.name: (f.default.value if isinstance(f.default, Checkpointing) else f.default)
                            for f in dataclasses.fields(Layout) if f.default is not dataclasses.MISSING},
        "model_defaults": {f.name: f.default for f in dataclasses.fields(next(iter(MODELS.values())))
                           if f.default is not dataclasses.MISSING},
        # the page opens on the first published run the constants were fitted on, and says what was published
        "start": _start(),
        # the Russian page names the planner's terms as the lessons do: one home, viz.planning.RU_NAMES
        "ru_names": RU_NAMES,
        "constants": {
            "GiB": GiB,
            "ALPHA_NVLINK": hardware.ALPHA_NVLINK,
            "ALPHA_NETWORK": hardware.ALPHA_NETWORK,
            "ALLOCATOR_OVERHEAD": ALLOCATOR_OVERHEAD,
            "MEMORY_ERROR_BAND": list(MEMORY_ERROR_BAND),
            "VERDICTS": list(VERDICTS),
            "STATE_BYTES": STATE_BYTES,
            "LOSS_FP32": activations.LOSS_FP32,
            "ATTENTION_BACKWARD_RATIO": ATTENTION_BACKWARD_RATIO,
            "OPTIMIZER_BYTES_PER_PARAM": OPTIMIZER_BYTES_PER_PARAM,
            "LOSS_BYTES_PER_LOGIT": LOSS_BYTES_PER_LOGIT,
            "COMPILED_LOSS_BYTES_PER_LOGIT": COMPILED_LOSS_BYTES_PER_LOGIT,
            "FSDP_COPY_BYTES_PER_PARAM": list(FSDP_COPY_BYTES_PER_PARAM),
        },
    }


def data_script() -> str:
    """`site_data()` as JavaScript that sets `window.PLANNER_DATA`; its `</` are escaped, so it can sit inside an HTML
    script element."""
    text = json.dumps(site_data(), separators=(",", ":")).replace("</", "<\\/")
    return f"window.PLANNER_DATA = {text};"


if __name__ == "__main__":  # python -m fsdp_mini.course.planner_site: the JSON, for node or a look
    print(json.dumps(site_data(), indent=1))
