"""A griffe extension of the course site (mkdocs.yml: mkdocstrings' `extensions`): docstrings as Markdown.

fsdp_mini's docstrings are prose written for `help()` and the source: a list often follows its
introducing line directly, as in the package docstring ("The library, bottom up (...):" then
"  1. one process, ..."). Python-Markdown, which renders them on the site, needs a blank line before a
list, so the whole list ran into the paragraph. Here a blank line is put before the first item of such a
list (outside fenced code), on the docstrings as griffe loaded them: the source stays as it is.
"""
from __future__ import annotations

import re

import griffe

_ITEM = re.compile(r"^\s{0,3}(?:\d+[.)]|[-*+])\s+\S")
_FENCE = re.compile(r"^\s*(```|~~~)")


def separate_lists(text: str) -> str:
    lines, out, fenced, in_list = text.splitlines(), [], False, False
    for line in lines:
        if _FENCE.match(line):
            fenced = not fenced
        if not fenced and _ITEM.match(line):
            if out and out[-1].strip() and not in_list:
                out.append("")
            in_list = True
        elif not line.strip():
            in_list = False
        out.append(line)
    return "\n".join(out)


class SeparateLists(griffe.Extension):
    """Put a blank line before each docstring list that follows its paragraph directly."""

    def on_object(self, *, obj: griffe.Object, **kwargs) -> None:  # every member, at any depth
        if obj.docstring is not None:
            obj.docstring.value = separate_lists(obj.docstring.value)

    def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:  # the package itself is no member
        self.on_object(obj=pkg)
