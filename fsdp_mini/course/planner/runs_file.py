"""A CSV file of measured runs, for `python -m fsdp_mini fit`: one run a row, its columns `plan`'s flags.

The header names `plan`'s flags without the dashes, `-` written `_` (`model,gpu,gpus,seq,local_batch,ac,...`),
plus `tokens_per_s_per_gpu` (measured) and, optionally, `memory_gib` (measured peak, torch.cuda.max_memory_reserved
/ 2**30). A column left out, or a cell left empty, takes the flag's default (`arguments.LAYOUT_DEFAULTS`); `model`,
`gpu`, `gpus`, `seq`, `local_batch` and `tokens_per_s_per_gpu` are required. A model or GPU that is not a preset is a
path to its file, relative to the CSV's folder. Switches read true/false (also 1/0, yes/no).

    model,gpu,gpus,seq,local_batch,ac,compile,tokens_per_s_per_gpu,memory_gib
    llama3-8b,h100-sxm,64,8192,2,selective-op,true,6120,71.5
"""
from __future__ import annotations

import csv
from pathlib import Path

from fsdp_mini.course.planner.arguments import (BOOLEAN_FLAGS, LAYOUT_DEFAULTS, LAYOUT_FLAGS, REQUIRED_FLAGS,
                                                resolve_gpu, resolve_model)
from fsdp_mini.course.planner.fitting import MeasuredRun
from fsdp_mini.course.planner.layout import SP_VARIANTS, Checkpointing, Layout

__all__ = ["COLUMNS", "REQUIRED_COLUMNS", "read_runs"]

MEASURED = ("tokens_per_s_per_gpu", "memory_gib")
COLUMNS = ("model", "gpu") + LAYOUT_FLAGS + MEASURED
"""Every column a runs file may have."""
REQUIRED_COLUMNS = ("model", "gpu") + REQUIRED_FLAGS + ("tokens_per_s_per_gpu",)
"""The columns it must have."""
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


def _value(column: str, text: str, where: str):
    """A cell as its flag's type; a bad one is an error naming the row, the column and the value."""
    try:
        if column in BOOLEAN_FLAGS:
            if text.lower() not in _TRUE + _FALSE:
                raise ValueError
            return text.lower() in _TRUE
        if column == "ac":
            return Checkpointing(text).value
        if column == "sp_variant":
            if text not in SP_VARIANTS:
                raise ValueError
            return text
        if column in MEASURED:
            value = float(text)
            if not value > 0:
                raise ValueError
            return value
        return int(text)
    except ValueError:
        kind = ("true or false" if column in BOOLEAN_FLAGS else
                "one of " + ", ".join(c.value for c in Checkpointing) if column == "ac" else
                "one of " + ", ".join(SP_VARIANTS) if column == "sp_variant" else
                "a positive number" if column in MEASURED else "an integer")
        raise ValueError(f"{where}: {column}={text!r} must be {kind}") from None


def read_runs(path: str | Path) -> list[MeasuredRun]:
    """The runs of the CSV file at `path`; a bad header (an unknown or missing column) or a bad cell is an error that
    names it."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read runs file {str(path)!r}: {exc.strerror}") from None
    reader = csv.DictReader(text.splitlines())
    header = [name.strip() for name in reader.fieldnames or []]
    unknown = [name for name in header if name not in COLUMNS]
    if unknown:
        raise ValueError(f"{path.name}: unknown column {unknown[0]!r}; columns: {', '.join(COLUMNS)}")
    missing = [name for name in REQUIRED_COLUMNS if name not in header]
    if missing:
        raise ValueError(f"{path.name}: missing column {missing[0]!r}; required: {', '.join(REQUIRED_COLUMNS)}")
    runs = []
    for line, row in enumerate(reader, start=2):
        if None in row:
            raise ValueError(f"{path.name} line {line}: more cells than the header's {len(header)} columns")
        cells = {name.strip(): (value or "").strip() for name, value in row.items()}
        where = f"{path.name} line {line}"
        for name in REQUIRED_COLUMNS:
            if not cells[name]:
                raise ValueError(f"{where}: {name} is empty")
        flags = dict(LAYOUT_DEFAULTS)
        flags.update({name: _value(name, cells[name], where) for name in LAYOUT_FLAGS if cells.get(name)})
        memory = _value("memory_gib", cells["memory_gib"], where) if cells.get("memory_gib") else None
        try:
            model, gpu = resolve_model(cells["model"], path.parent), resolve_gpu(cells["gpu"], path.parent)
            layout = Layout(**flags)
            layout.check(model, gpu)
            model.check_seq(layout.seq)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        label = f"{model.name} {layout.gpus}x{gpu.name} {layout.local_batch}x{layout.seq} {layout.ac.value}"
        label += "".join(f" {name} {flags[name]}" for name in ("dp_replicate", "tp", "cp", "micro_batches")
                         if flags[name] != LAYOUT_DEFAULTS[name])
        label += "".join(f" {name}" for name in BOOLEAN_FLAGS if flags[name] and name != "sp")
        runs.append(MeasuredRun(model, gpu, layout, _value("tokens_per_s_per_gpu", cells["tokens_per_s_per_gpu"],
                                                           where), memory, label))
    if not runs:
        raise ValueError(f"{path.name}: no runs under the header")
    return runs
