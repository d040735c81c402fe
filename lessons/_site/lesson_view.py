"""What a lesson page shows of its notebook: the lesson, not the plumbing that makes it run and test.

A notebook holds cells a learner needs in Jupyter but not on the page; the page is rendered from a
copy of the notebook with these changes (the notebook itself is untouched, so Jupyter, nbval and the
downloaded notebook keep every cell):

- the imports cell's `set_language("ru")` line is dropped: the page is already in its language;
- a code cell of `assert` statements only, with no output, is dropped: it is the notebook's own check
  that the prose's claims hold (nbval runs it), and says nothing the prose does not;
- `# NBVAL_...` lines (nbval's markers) are removed from the code shown;
- a stored plot is shown with its alt text and 1x size (the output's metadata: mkdocs-jupyter's
  template writes neither, and nbconvert then puts a placeholder in English on every image);
- the first code cell made of imports (and maybe a few constants or short helpers) is folded: a `<details>` whose summary names it, the code
  one click away, with a copy button;
- a `show_source(...)` listing (fsdp_mini.course.source renders it as a Markdown code block) becomes
  a folded `<details>`, its summary the object's name and length, its code a highlighted `pre > code`
  (the theme's code style and copy button); a listing whose code was already shown on the page is
  replaced by a link to the first one.

mkdocs-jupyter converts a notebook through nbconvert with one preprocessor of its own, `SubCell`
(a slice of the cells); `ViewCells` extends it, and is put in its place. The conversion is cached by
mkdocs-jupyter; hooks.py's cache key covers every file of lessons/_site, this one included.
"""
from __future__ import annotations

import ast
import html
import re
from copy import deepcopy
from pathlib import Path

from mkdocs_jupyter import nbconvert2
from mkdocs_jupyter.preprocessors import SubCell
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import PythonLexer

NBVAL_LINE = re.compile(r"^[ \t]*# NBVAL_\w+[ \t]*\n?", re.M)
LANGUAGE_LINE = re.compile(r'\n*^set_language\("\w+"\)[ \t]*$', re.M)  # the imports cell's last line
LISTING = re.compile(r"\A\s*```python\n(.*?)\n```\s*\Z", re.S)
TEXT = {
    "en": {"imports": "Imports of this lesson", "setup": "Imports and setup of this lesson", "source": "Source of {name}", "lines": ("line", "lines"),
           "shown": "The source of {name} is shown above."},
    "ru": {"imports": "Импорты этого урока", "setup": "Импорты и настройка этого урока", "source": "Исходный код {name}",
           "lines": ("строка", "строки", "строк"), "shown": "Исходный код {name} показан выше."},
}


def _source(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _tags(cell) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def _parse(code: str) -> ast.Module | None:
    try:
        return ast.parse(code)
    except SyntaxError:  # IPython syntax (magics): shown as it is
        return None


def is_assert_only(cell) -> bool:
    tree = _parse(_source(cell))
    return bool(tree and tree.body) and all(isinstance(n, ast.Assert) for n in tree.body) \
        and not cell.get("outputs")


def import_block(cell) -> str | None:
    """"imports" for a cell of imports only, "setup" for imports and a few plain assignments (a config
    built once, say) or one-line helpers, None otherwise."""
    tree = _parse(_source(cell))
    if not tree or not tree.body or cell.get("outputs"):
        return None
    imports = sum(isinstance(n, (ast.Import, ast.ImportFrom)) for n in tree.body)
    small_def = lambda n: isinstance(n, ast.FunctionDef) and n.end_lineno - n.lineno < 5  # a helper
    if imports * 2 < len(tree.body) or not all(
            isinstance(n, (ast.Import, ast.ImportFrom, ast.Assign)) or small_def(n) for n in tree.body):
        return None
    return "imports" if imports == len(tree.body) else "setup"


def listed_objects(code: str) -> list[str]:
    """The first argument of each `show_source(...)` call of a cell, as written, in order."""
    tree = _parse(code)
    if tree is None:
        return []
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "show_source"
             and n.args]
    calls.sort(key=lambda n: (n.lineno, n.col_offset))
    return [ast.get_source_segment(code, n.args[0]) or "?" for n in calls]


def count_lines(n: int, lang: str) -> str:
    forms = TEXT[lang]["lines"]
    if lang == "ru":
        form = forms[0] if n % 10 == 1 and n % 100 != 11 else (
            forms[1] if 2 <= n % 10 <= 4 and not 12 <= n % 100 <= 14 else forms[2])
    else:
        form = forms[0] if n == 1 else forms[1]
    return f"{n} {form}"


def code_block(code: str) -> str:
    """Highlighted Python as the theme shows code: `div.highlight > pre > code` (copy button included)."""
    body = highlight(code, PythonLexer(), HtmlFormatter(nowrap=True))
    return f'<div class="language-python highlight"><pre><span></span><code>{body}</code></pre></div>'


def folded(summary: str, code: str, css: str, anchor: str | None = None) -> str:
    ident = f' id="{anchor}"' if anchor else ""
    return (f'<details class="{css}"{ident}><summary>{summary}</summary>\n{code_block(code)}\n</details>')


def figure(output) -> str:
    """A stored plot as an `<img>` with its alt text and 1x size: the output's metadata, which
    fsdp_mini.course.viz.display writes and mkdocs-jupyter's template does not read."""
    meta = output.get("metadata", {}).get("image/png", {}) or {}
    data = "".join(output["data"]["image/png"]).replace("\n", "")
    size = "".join(f' {key}="{int(meta[key])}"' for key in ("width", "height") if meta.get(key))
    alt = html.escape(meta.get("alt") or "", quote=True)
    return f'<div class="jp-RenderedImage"><img src="data:image/png;base64,{data}" alt="{alt}"{size}></div>'


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "source"


def view(nb, lang: str):
    """The notebook as its page shows it (a changed copy; see the module's docstring)."""
    nb = deepcopy(nb)
    text = TEXT.get(lang, TEXT["en"])
    cells, shown, folded_imports = [], {}, False
    for cell in nb.cells:
        if cell.cell_type != "code":
            cells.append(cell)
            continue
        if is_assert_only(cell):
            continue
        cell.source = LANGUAGE_LINE.sub("", NBVAL_LINE.sub("", _source(cell)))
        block = None if folded_imports else import_block(cell)
        if block:
            folded_imports = True
            cells.append(_raw_html(folded(text[block], cell.source.rstrip(), "lesson-imports")))
            continue
        names = iter(listed_objects(cell.source))
        for output in cell.get("outputs", []):
            if "image/png" in output.get("data", {}):
                output["data"] = {"text/html": figure(output)}
                continue
            listing = LISTING.match(output.get("data", {}).get("text/markdown", "") or "")
            if not listing:
                continue
            code, name = listing.group(1), next(names, "?")
            label = f"<code>{html.escape(name)}</code>"
            if code in shown:
                page = (f'<p class="source-shown"><a href="#{shown[code]}">'
                        f'{text["shown"].format(name=label)}</a></p>')
            else:
                anchor = f"source-{_slug(name)}"
                while anchor in shown.values():
                    anchor += "-"
                shown[code] = anchor
                summary = f'{text["source"].format(name=label)} · {count_lines(len(code.splitlines()), lang)}'
                page = folded(summary, code, "source-listing", anchor)
            output["data"] = {"text/html": page}
        cells.append(cell)
    nb.cells = cells
    return nb


def _raw_html(content: str):
    from nbformat.v4 import new_raw_cell

    return new_raw_cell(content, metadata={"format": "text/html"})


class ViewCells(SubCell):
    """mkdocs-jupyter's slice of the cells, then `view` in the notebook's language (its folder's name)."""

    def preprocess(self, nb, resources):
        nb, resources = super().preprocess(nb, resources)
        folder = Path((resources.get("metadata") or {}).get("path") or ".").name
        return view(nb, folder if folder in TEXT else "en"), resources


nbconvert2.SubCell = ViewCells  # nb2html builds its exporter with `preprocessors=[SubCell]`
