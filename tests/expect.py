"""One helper for tests of clear errors: what a call raises, as text, so one worker can collect many."""
from __future__ import annotations


def error_text(fn, kind: type[Exception] = ValueError) -> str:
    """The message of the `kind` error `fn()` raises, or "no error"."""
    try:
        fn()
    except kind as e:
        return str(e)
    return "no error"


def raised(fn) -> str:
    """"Type: message" of whatever `fn()` raises, or "no error": for comparing what two implementations raise."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the type and message are what is tested
        return f"{type(e).__name__}: {e}"
    return "no error"
