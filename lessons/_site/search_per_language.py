"""MkDocs hooks of the course site, second file: search per language (mkdocs.yml: `hooks:`).

mkdocs-static-i18n builds every language into one site and merges their entries into one search index
(`search/search_index.json`), which mkdocs-material's pages all load: an English reader searching
"AllReduce" got the Russian lessons too, and the other way round. It has no option for an index per
language. So, after the last language's build:

1. The index is split: the entries under `ru/` (each non-default language's folder) go to
   `ru/search/search_index.json`, their locations relative to that folder; the default language's stay
   in `search/search_index.json`.
2. Each page of a non-default language tells material that its search lives there: material fetches
   `search/search_index.json` relative to the `base` of the page's `__config` and resolves results'
   locations against the same base, so on a Russian page `base` points at `ru/` instead of the site's
   root. (Nothing else of material reads `base` on this site: `navigation.instant` and versioning are
   off.)
3. The entries are cleaned for reading: the headings' permalink sign "¶" that notebook pages put in
   their titles is dropped, the notebooks' raw TeX (`$N_d$`, `$2\\frac{n-1}{n}S$`) becomes text
   (N<sub>d</sub>, 2(n-1)/n S): search results show HTML, not typeset math; and a code cell is
   indexed once, without its prompt (`In [3]:`), its tags and the copy button's "Copied!".
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from mkdocs.plugins import event_priority

# 1. + 3. -------------------------------------------------------------------------------------------------
_NAMES = {
    "alpha": "α", "beta": "β", "gamma": "γ", "delta": "δ", "Delta": "Δ", "epsilon": "ε", "varepsilon": "ε",
    "theta": "θ", "lambda": "λ", "mu": "μ", "pi": "π", "rho": "ρ", "sigma": "σ", "Sigma": "Σ", "tau": "τ",
    "phi": "φ", "psi": "ψ", "Psi": "Ψ", "omega": "ω", "Omega": "Ω",
    "cdot": " · ", "times": " × ", "approx": " ≈ ", "to": " → ", "rightarrow": " → ", "leftarrow": " ← ",
    "le": " ≤ ", "leq": " ≤ ", "ge": " ≥ ", "geq": " ≥ ", "ne": " ≠ ", "neq": " ≠ ", "lceil": "⌈", "rceil": "⌉", "lfloor": "⌊",
    "rfloor": "⌋", "infty": "∞", "sum": "Σ", "ldots": "…", "dots": "…", "cdots": "⋯", "in": " ∈ ", "pm": " ± ",
    "min": "min", "max": "max", "log": "log", "sqrt": "√", "quad": " ", "qquad": " ",
}
_ARG = r"\{((?:[^{}]|\{[^{}]*\})*)\}"  # one {group}, with at most one level of braces inside
_MATH = re.compile(r"\$\$(.+?)\$\$|\$([^$\n]+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.S)
_CODE = re.compile(r"(<code\b.*?</code>|<pre\b.*?</pre>)", re.S)
# a notebook's code cell, as the search plugin flattens it: the prompt, the cell's tags, the copy
# button's "Copied!", the highlighted code, then the same code again as plain text (the copy source)
_PROMPT = re.compile(r"In\s*\[[^\]]*\]:\s*(?:[^<\s]+\s+){0,3}?Copied!\s*")
_PRE = re.compile(r"<pre>(.*?)</pre>", re.S)


def _drop_cell_noise(html: str) -> str:
    html = _PROMPT.sub("", html)
    out, pos = [], 0
    for m in _PRE.finditer(html):
        out.append(html[pos:m.end()])
        pos = m.end()
        rest = html[pos:].lstrip()
        copy = m.group(1).replace("\n", " ").strip()
        if copy and rest.startswith(copy):
            pos = len(html) - len(rest) + len(copy)
    out.append(html[pos:])
    return "".join(out)


def _wrap(part: str) -> str:
    return part if re.fullmatch(r"[\w.·]+", part) else f"({part})"


def tex_to_text(tex: str) -> str:
    """Readable text (HTML) for a TeX formula as the lessons write them: symbols become Unicode,
    fractions a/b, sub- and superscripts <sub> and <sup>, the rest of the markup goes."""
    s = tex.strip()
    s = re.sub(r"\\(?:left|right|displaystyle|big|Big)\b", "", s)
    s = re.sub(r"\\(?:text|mathrm|mathbf|mathit|operatorname|textrm|mathsf)\s*" + _ARG, r"\1", s)
    for _ in range(3):  # nested fractions, innermost first
        s = re.sub(r"\\[dt]?frac\s*" + _ARG + r"\s*" + _ARG,
                   lambda m: f"{_wrap(m.group(1))}/{_wrap(m.group(2))}"
                   + (" " if re.match(r"\w", m.string[m.end():m.end() + 1]) else ""), s)
    s = s.replace("{,}", ",")  # a decimal comma: 7{,}5
    s = re.sub(r"\\[,;:! ]", " ", s)
    s = re.sub(r"\\([A-Za-z]+)", lambda m: _NAMES.get(m.group(1), m.group(1)), s)
    s = re.sub(r"_" + _ARG + r"|_([^\s{}\\])", lambda m: f"<sub>{m.group(1) or m.group(2)}</sub>", s)
    s = re.sub(r"\^" + _ARG + r"|\^([^\s{}\\])", lambda m: f"<sup>{m.group(1) or m.group(2)}</sup>", s)
    s = s.replace("{", "").replace("}", "").replace("\\", "")
    return re.sub(r"\s+", " ", s).strip()


def clean_text(html: str) -> str:
    """An index entry's text or title, without "¶" and with its formulas as text (code left alone), and
    a notebook's code cells without their prompts and second copy."""
    parts = _CODE.split(_drop_cell_noise(html))
    for i in range(0, len(parts), 2):  # the even parts are outside <code> and <pre>
        parts[i] = _MATH.sub(lambda m: tex_to_text(next(g for g in m.groups() if g is not None)), parts[i])
        parts[i] = parts[i].replace("¶", "")
    return "".join(parts).strip()


def split_index(site_dir: Path, languages: list[str]) -> dict[str, int]:
    """Split the merged index into one per language; returns how many entries each got."""
    path = site_dir / "search" / "search_index.json"
    index = json.loads(path.read_text(encoding="utf-8"))
    per_language: dict[str, list] = {lang: [] for lang in languages}
    default = []
    for doc in index["docs"]:
        doc = dict(doc, title=clean_text(doc["title"]), text=clean_text(doc["text"]))
        lang = next((x for x in languages if doc["location"].startswith(f"{x}/")), None)
        if lang is None:
            default.append(doc)
        else:
            per_language[lang].append(dict(doc, location=doc["location"][len(lang) + 1:]))
    for folder, docs in [(site_dir, default)] + [(site_dir / x, per_language[x]) for x in languages]:
        out = folder / "search" / "search_index.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(dict(index, docs=docs), ensure_ascii=False, separators=(",", ":")),
                       encoding="utf-8")
    return {"": len(default), **{x: len(v) for x, v in per_language.items()}}


def _other_languages(config) -> list[str]:
    i18n = config.plugins.get("i18n")
    return [] if i18n is None else [x for x in i18n.build_languages if x != i18n.default_language]


@event_priority(-200)  # after mkdocs-static-i18n's on_post_build (-100), which writes the merged index
def on_post_build(config) -> None:
    i18n = config.plugins.get("i18n")
    if i18n is None or i18n.building:  # one language's build inside i18n's loop: the index is not whole
        return
    split_index(Path(config.site_dir), _other_languages(config))


# 2. ------------------------------------------------------------------------------------------------------
_BASE = re.compile(r'(<script id="__config" type="application/json">\{.*?"base": ")([^"]*)(")', re.S)


def on_post_page(output: str, page, config) -> str:
    lang = next((x for x in _other_languages(config) if page.url.startswith(f"{x}/")), None)
    if lang is None:
        return output

    def to_language_root(m: re.Match) -> str:
        base = m.group(2)
        if base == "..":
            base = "."
        elif base.endswith("/.."):
            base = base[:-3]
        else:  # not a page under the language's folder after all: leave it
            return m.group(0)
        return m.group(1) + base + m.group(3)

    return _BASE.sub(to_language_root, output, count=1)
