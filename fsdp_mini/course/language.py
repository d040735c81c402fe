"""The language of everything a lesson prints or plots: English or Russian.

The English and Russian twins of a lesson run identical code; the one line allowed to differ is the imports
cell's `set_language("ru")` (or "en"). What a cell prints then comes out in the lesson's language through
`fsdp_mini.course.show` (its sentences and headers in `messages`); plot labels and exercise messages, which
live in the course's modules, through `tr(en, ru)` here.
"""
from __future__ import annotations

from fsdp_mini.byte_format import decimal_scale

__all__ = ["LANGUAGES", "set_language", "get_language", "tr", "num", "size", "plural", "ru_cell"]

LANGUAGES = ("en", "ru")
_current = "en"


def set_language(language: str) -> None:
    """Choose "en" or "ru" for labels and messages from here on."""
    global _current
    if language not in LANGUAGES:
        raise ValueError(f"language must be one of {LANGUAGES}, got {language!r}")
    _current = language


def get_language() -> str:
    return _current


def tr(en: str, ru: str) -> str:
    """The text in the current language."""
    return ru if _current == "ru" else en


def yes(flag) -> str:
    """A check's verdict as the lesson's language prints it: True / False in English (Python's own words), да /
    нет in Russian (lessons/ru/STYLE.md: a Russian phrase is not answered in Python)."""
    return tr(str(bool(flag)), "да" if flag else "нет")


def num(value: float, digits: int | None = None) -> str:
    """A number as the lesson's language writes it: 49,152 and 1.5 in English, 49 152 and 1,5 in Russian
    (a thin no-break space between thousands, a decimal comma). `digits`: places after the point (floats
    default to 2, integers to none)."""
    if digits is None:
        digits = 0 if isinstance(value, int) else 2
    text = f"{value:,.{digits}f}"
    if _current == "ru":
        text = text.replace(",", "\u202f").replace(".", ",")
    return text


def ru_cell(text: str) -> str:
    """A number already written the English way ("2,048", "+2.8 %", "-0.5"), in Russian typography: thin-space
    thousands, decimal comma, a no-break space before %, the minus sign (the planner's Markdown tables)."""
    text = text.replace(",", "\u202f").replace(".", ",").replace(" %", "\u00a0%")
    return "\u2212" + text[1:] if text.startswith("-") else text


def size(nbytes: float) -> str:
    """A decimal size as the lesson's language writes it (1 kB = 1000 B, as `fsdp_mini.format_bytes`):
    "512 B", "4.0 kB", "31.4 GB" in English; "512 Б", "4,0 кБ", "31,4 ГБ" in Russian."""
    units = (tr("B", "Б"), tr("kB", "кБ"), tr("MB", "МБ"), tr("GB", "ГБ"), tr("TB", "ТБ"))
    if nbytes < 1000:
        return f"{num(nbytes, 0 if float(nbytes).is_integer() else 1)} {units[0]}"
    value, unit = decimal_scale(nbytes, len(units))
    return f"{num(value, 1)} {units[unit]}"



def plural(n: float, one: str, few: str, many: str) -> str:
    """The form of a word that agrees with the number `n` in the lesson's language (the word only, not the
    number). Russian has three forms: `one` for 1, 21, 101 (1 токен), `few` for 2-4, 22-24 (3 токена),
    `many` for 0, 5-20, 25-30, 111-114 (10 164 токенов), and `few` for a fraction (1,5 токена).
    English uses `one` for exactly 1 and `many` otherwise (`few` is ignored). Pass each form through
    `tr` when the English and Russian words differ:
    `plural(n, tr("token", "токен"), tr("tokens", "токена"), tr("tokens", "токенов"))`."""
    if _current != "ru":
        return one if n == 1 else many
    if not float(n).is_integer():
        return few
    n = abs(int(n))
    if n % 10 == 1 and n % 100 != 11:
        return one
    if 2 <= n % 10 <= 4 and not 12 <= n % 100 <= 14:
        return few
    return many
