"""One helper for tests of clear errors: what a call raises, as text, so one worker can collect many."""
from __future__ import annotations


def error_text(fn, kind: type[Exception] = ValueError) -> str:
    """The message of the `kind` error `fn()` raises, or "no error"."""
    try:
        fn()
    except kind as e:
        return str(e)
    return "no error"
