"""Show the library's real source in a lesson: the code a learner reads is the code that runs.

Lessons never paste a copy of library code; they call `show_source(fsdp_mini.collectives.ring_all_gather)`,
which renders `inspect.getsource` as a highlighted code block (plain text outside a notebook).
"""
from __future__ import annotations

import ast
import inspect
import textwrap

__all__ = ["show_source", "source_of"]


def source_of(obj, start: str | None = None, end: str | None = None, header: bool = False) -> str:
    """The source of a function, class or module; with `start`/`end`, only the lines from the first one
    containing `start` up to (and including) the first later one containing `end`; with `header`, only
    the signature and the docstring of a function or class (what it promises, not how)."""
    text = textwrap.dedent(inspect.getsource(obj))
    if header:
        node = ast.parse(text).body[0]
        first = node.body[0]
        if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)):
            raise ValueError(f"{getattr(obj, '__qualname__', obj)} has no docstring")
        return "\n".join(text.splitlines()[:first.end_lineno]).rstrip()
    if start is None and end is None:
        return text.rstrip()
    lines = text.splitlines()
    lo = next((i for i, line in enumerate(lines) if start is None or start in line), None)
    if lo is None:
        raise ValueError(f"{start!r} not found in the source of {getattr(obj, '__qualname__', obj)}")
    hi = next((i for i in range(lo, len(lines)) if end is not None and end in lines[i]), None if end else len(lines) - 1)
    if hi is None:  # a marker the source lost would silently show the rest of it
        raise ValueError(f"{end!r} not found after {start!r} in the source of {getattr(obj, '__qualname__', obj)}")
    return textwrap.dedent("\n".join(lines[lo:hi + 1])).rstrip()


def show_source(obj, start: str | None = None, end: str | None = None, header: bool = False) -> None:
    """Display the (partial) source of `obj` as a Python code block (arguments as in `source_of`)."""
    code = source_of(obj, start, end, header)
    try:
        from IPython import get_ipython
        from IPython.display import Markdown, display
    except ImportError:
        print(code)
        return
    if get_ipython() is None:
        print(code)
    else:
        display(Markdown(f"```python\n{code}\n```"))
