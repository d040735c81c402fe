"""The language of everything a lesson prints or plots: English or Russian.

The English and Russian twins of a lesson run identical code; the only cell allowed to differ is the one
tagged `language`, which calls `set_language("ru")` (or "en"). Plot labels and exercise messages then
come out in the lesson's language through `tr(en, ru)`.
"""
from __future__ import annotations

__all__ = ["LANGUAGES", "set_language", "get_language", "tr"]

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
