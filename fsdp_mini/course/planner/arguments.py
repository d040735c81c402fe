"""What `plan`'s model, GPU and layout flags accept, for the command line and for the rows of a runs file alike.

`--model` is a preset or a path to a Hugging Face `config.json` (`hf_config`), `--gpu` a preset or a path to a JSON
file of a preset's fields (`hardware.load_gpu`). `LAYOUT_FLAGS` are the layout's flags `plan` exposes, spelled as
`Layout`'s fields; their defaults are `Layout`'s own, so the command line and a runs file's missing columns agree.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from fsdp_mini.course.planner.hardware import GPU, GPUS, load_gpu
from fsdp_mini.course.planner.hf_config import load_model_config
from fsdp_mini.course.planner.layout import Layout
from fsdp_mini.course.planner.models import MODELS, ModelSpec

__all__ = ["LAYOUT_FLAGS", "BOOLEAN_FLAGS", "REQUIRED_FLAGS", "LAYOUT_DEFAULTS", "resolve_model", "resolve_gpu"]

LAYOUT_FLAGS = ("gpus", "gpus_per_node", "dp_replicate", "tp", "sp", "sp_variant", "cp", "seq", "local_batch",
                "micro_batches", "no_sync", "tp_overlap", "ac",
                "float8", "compile", "compile_loss")
"""`Layout`'s fields that `plan` takes as flags (`--local-batch` is `local_batch`)."""
LAYOUT_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Layout)
                   if f.name in LAYOUT_FLAGS and f.default is not dataclasses.MISSING}
"""Each optional flag's default: the layout's."""
REQUIRED_FLAGS = tuple(name for name in LAYOUT_FLAGS if name not in LAYOUT_DEFAULTS)
"""The layout flags without a default (`gpus`, `seq`, `local_batch`)."""
BOOLEAN_FLAGS = tuple(name for name in LAYOUT_FLAGS if isinstance(LAYOUT_DEFAULTS.get(name), bool))
"""Switches: `--sp`, `--float8`, `--compile`, `--compile-loss`."""


def _path(text: str, base: str | Path | None) -> Path:
    path = Path(text)
    return path if base is None or path.is_absolute() else Path(base) / path


def resolve_model(text: str, base: str | Path | None = None) -> ModelSpec:
    """The preset called `text`, or the model of the `config.json` at that path (relative to `base`)."""
    if text in MODELS:
        return MODELS[text]
    path = _path(text, base)
    if path.is_file():
        return load_model_config(path)
    raise ValueError(f"unknown model {text!r}: not a preset ({', '.join(MODELS)}) and not a file (a Hugging Face "
                     f"config.json)")


def resolve_gpu(text: str, base: str | Path | None = None) -> GPU:
    """The preset called `text`, or the GPU described by the JSON file at that path (relative to `base`)."""
    if text in GPUS:
        return GPUS[text]
    path = _path(text, base)
    if path.is_file():
        return load_gpu(path)
    raise ValueError(f"unknown GPU {text!r}: not a preset ({', '.join(GPUS)}) and not a file (JSON of a preset's "
                     f"fields)")
