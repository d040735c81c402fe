"""What a lesson's code cell prints, in the lesson's language: `say` a sentence, `show` a table.

Why a layer of its own: a code cell should be the few lines that do the thing (the call, the assert, the
plot), and the twins should share their code because the code carries no language, not because it carries
both. So a cell names what it prints by a key, `say("num_params", n=num_params)`, or hands its rows to
`show(rows)`; the sentences and column headers live in one table, `fsdp_mini.course.messages`, in English
and Russian side by side, and the numbers come out as the lesson's language writes them (49,152 and 1.5;
49 152 and 1,5). The language is chosen once, in the lesson's imports cell (`set_language`).

A placeholder in a message takes a format spec of its own:

- `{n}`: the value as the language writes it: an int with thousands separators, a float with 2 places,
  True/False as True/False or да/нет, a list as its items joined, anything else as `str`;
- `{x:.3}`: a number with 3 places after the point;
- `{x:.1%}`: a fraction as a percentage with 1 place ("52.4%"; "52,4 %" with a no-break space in
  Russian); `{x:+.1%}` signs it;
- `{b:size}`: a size in decimal units ("4.0 kB"; "4,0 кБ");
- `{n:parameter|parameters|parameters}`: the word form that agrees with the number n (one|few|many:
  "параметр|параметра|параметров"), the word only.
"""
from __future__ import annotations

import dataclasses
import enum
import re
import string
from collections.abc import Iterable, Mapping

from fsdp_mini.course.language import get_language, num, plural, size, yes
from fsdp_mini.course.messages import MESSAGES
from fsdp_mini.course.viz import set_language

__all__ = ["set_language", "text", "say", "show", "cell", "header", "MISSING"]

MISSING = "\u2014"
"""A number a source does not give, in a table of numbers: a dash, aligned with the numbers."""

_DIGITS = re.compile(r"(?P<sign>\+?)\.(?P<digits>\d+)(?P<percent>%?)")


def cell(value, spec: str = "") -> str:
    """One value as the lesson's language writes it (the format specs of the module's docstring)."""
    if value == MISSING:
        return MISSING
    if "|" in spec:
        one, few, many = (spec.split("|") + ["", ""])[:3]
        return plural(value, one, few or many, many or few)
    if spec == "size":
        return size(value)
    if isinstance(value, (list, tuple)):
        numbers = any(isinstance(v, float) for v in value)
        return ("; " if numbers and get_language() == "ru" else ", ").join(cell(v, spec) for v in value)
    if isinstance(value, bool):
        return yes(value)
    if isinstance(value, enum.Enum):
        return str(value.value)
    match = _DIGITS.fullmatch(spec)
    if match and isinstance(value, (int, float)):
        percent = bool(match["percent"])
        shown = num(100 * value if percent else value, int(match["digits"]))
        if match["sign"] and value > 0:
            shown = "+" + shown
        if get_language() == "ru":
            shown = shown.replace("-", "\u2212")
        return shown + ("\u00a0%" if get_language() == "ru" else "%") if percent else shown
    if spec:
        return format(value, spec)
    if isinstance(value, int):
        return num(value)
    if isinstance(value, float):
        return num(value, 2)
    return str(value)


class _Formatter(string.Formatter):
    def format_field(self, value, format_spec):
        return cell(value, format_spec)


def _template(key: str) -> str:
    try:
        english, russian = MESSAGES[key]
    except KeyError:
        raise KeyError(f"no message {key!r} in fsdp_mini/course/messages.py") from None
    return russian if get_language() == "ru" else english


def text(key: str, **values) -> str:
    """The message `key` in the lesson's language, its placeholders filled with `values`."""
    return _Formatter().vformat(_template(key), (), values)


def say(key: str, **values) -> None:
    """Print the message `key` (see `text`)."""
    print(text(key, **values))


def header(key: str) -> str:
    """A column's header: its message when the table has one, else the key itself (a name from the code,
    such as FULL_SHARD, reads the same in both languages)."""
    return _template(key) if key in MESSAGES else key


def _as_dict(row) -> dict:
    if dataclasses.is_dataclass(row) and not isinstance(row, type):
        return {f.name: getattr(row, f.name) for f in dataclasses.fields(row)}
    if isinstance(row, Mapping):
        return dict(row)
    raise TypeError(f"show() takes dataclass instances or dicts as rows, got {type(row).__name__}")


def _numeric(value) -> bool:
    if isinstance(value, (list, tuple)):
        return bool(value) and all(_numeric(v) for v in value)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def show(rows: Iterable, columns: Iterable[str] | None = None, formats: Mapping[str, str] | None = None,
         indent: int = 0) -> None:
    """Print `rows` (dataclass instances or dicts) as a table: one column per field (or per name in
    `columns`, in that order), headed by its message in the lesson's language (`header`), each value
    written by `cell` with the spec `formats[column]`; numbers right-aligned, words left-aligned."""
    rows = [_as_dict(r) for r in rows]
    if not rows:
        raise ValueError("show() needs at least one row")
    columns = list(columns) if columns is not None else list(rows[0])
    missing = [c for c in columns if any(c not in r for r in rows)]
    if missing:
        raise KeyError(f"show(): rows lack the columns {missing}")
    formats = dict(formats or {})
    table = [[cell(r[c], formats.get(c, "")) for c in columns] for r in rows]
    heads = [header(c) for c in columns]
    right = [all(_numeric(r[c]) or r[c] == MISSING for r in rows) and any(_numeric(r[c]) for r in rows)
             for c in columns]
    widths = [max(len(h), *(len(t[i]) for t in table)) for i, h in enumerate(heads)]

    def line(values):
        parts = [v.rjust(w) if r else v.ljust(w) for v, w, r in zip(values, widths, right)]
        return (" " * indent + "  ".join(parts)).rstrip()

    print("\n".join([line(heads)] + [line(t) for t in table]))
