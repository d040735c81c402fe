"""MkDocs hook (mkdocs.yml: `hooks:`): the links of the course site's prose, made when a page is rendered.

The notebooks are written for Jupyter and GitHub, where a link to the site's API reference or glossary
would lead nowhere, and a course page that names "lesson 06", `FSDP`, a shard or the ZeRO paper without
a link sends the learner to the search box. So the links are made here, on the site only, from what
the text already says; the notebooks and pages stay as they are (issue 14, item 5):

1. "lesson 06", "lessons 03, 05 and 09", "урок 06", "в уроке 3", "из урока 05", "в уроках 1–2" (every
   case), and "the next lesson" / "следующий урок" on a lesson page: to the lesson's page in the same
   language. (A Markdown link to a notebook is made a page link by hooks.py, hook 8.)
2. Inline code that names the library, `FSDP`, `fsdp_mini.launch`, `ShardingStrategy.FULL_SHARD`,
   `estimate_memory(...)`, `fsdp_mini/parallel/ddp.py`: to its heading in the API reference of the same
   language, through mkdocs-autorefs (an `optional` autoref: a name the reference does not render stays
   plain text, never a broken link). Which names exist comes from griffe, the reader mkdocstrings uses.
3. PyTorch's API (`torch.distributed`, `DistributedDataParallel`, `torchrun`, ...) and the papers the
   lessons cite: to their public pages, from the one table below, `EXTERNAL`. A name both PyTorch and
   the library define is the library's, unless the text says it is PyTorch's ("PyTorch's `X`",
   "`X` из PyTorch") or the page is the lesson about PyTorch's FSDP (`PYTORCH_PAGES`).
4. Glossary terms: to their entries in the same language's glossary, whose table rows get their ids
   here, from the English term (the same ids in both languages, so they survive a Russian rewording).

What is never touched: code blocks, notebook code cells and their outputs, headings, existing links,
math, form controls. What is linked once: each target at its first mention on a page (a page of
links is as useless as a page of none), and at most `GLOSSARY_PER_BLOCK` glossary links per paragraph,
so a dense opening paragraph does not turn blue. tests/site/test_site_links.py checks all of it on the
built site.
"""
from __future__ import annotations

import ast
import functools
import re
from html import escape
from pathlib import Path

from pymdownx.slugs import slugify

ROOT = Path(__file__).resolve().parents[2]
LESSONS = ROOT / "lessons"
SLUG = slugify(case="lower")
GLOSSARY_PER_BLOCK = 2
PYTORCH_PAGES = {"08_pytorch_fsdp2"}  # the lesson about PyTorch's own FSDP: a shared name is PyTorch's

# --- the one table of external links -----------------------------------------------------------------
_DOCS = "https://docs.pytorch.org/docs/stable/"
_DIST = _DOCS + "distributed.html#torch.distributed."
_FSDP2 = _DOCS + "distributed.fsdp.fully_shard.html"
EXTERNAL = {
    # PyTorch's API, by the names the lessons write (`dist.`, `nn.` and `dcp.` are the usual aliases)
    "api": {
        "torch.distributed": _DOCS + "distributed.html",
        **{f"torch.distributed.{name}": _DIST + name for name in (
            "init_process_group", "new_group", "send", "recv", "isend", "irecv", "broadcast", "reduce",
            "all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "barrier")},
        "torchrun": _DOCS + "elastic/run.html",
        "torch.nn.parallel.DistributedDataParallel":
            _DOCS + "generated/torch.nn.parallel.DistributedDataParallel.html",
        "torch.distributed.fsdp.FullyShardedDataParallel": _DOCS + "fsdp.html",
        "torch.distributed.fsdp.ShardingStrategy": _DOCS + "fsdp.html#torch.distributed.fsdp.ShardingStrategy",
        "torch.distributed.fsdp.MixedPrecision": _DOCS + "fsdp.html#torch.distributed.fsdp.MixedPrecision",
        "torch.distributed.fsdp.fully_shard": _FSDP2,
        "torch.distributed.fsdp.FSDPModule": _FSDP2,
        "torch.distributed.fsdp.MixedPrecisionPolicy": _FSDP2,
        "torch.distributed.fsdp.register_fsdp_forward_method": _FSDP2,
        "torch.distributed.tensor.DTensor": _DOCS + "distributed.tensor.html",
        "torch.distributed.device_mesh.DeviceMesh": _DIST + "device_mesh.DeviceMesh",
        "torch.distributed.device_mesh.init_device_mesh": _DIST + "device_mesh.init_device_mesh",
        "torch.distributed.checkpoint": _DOCS + "distributed.checkpoint.html",
        "torch.distributed.optim.ZeroRedundancyOptimizer":
            _DOCS + "distributed.optim.html#torch.distributed.optim.ZeroRedundancyOptimizer",
        "torch.Tensor.register_post_accumulate_grad_hook":
            _DOCS + "generated/torch.Tensor.register_post_accumulate_grad_hook.html",
        "torch.nn.Parameter": _DOCS + "generated/torch.nn.parameter.Parameter.html",
        "torch.chunk": _DOCS + "generated/torch.chunk.html",
        "torch.tensor_split": _DOCS + "generated/torch.tensor_split.html",
        "torch.utils.checkpoint": _DOCS + "checkpoint.html",
    },
    # papers: the phrases that cite them, per language (regular expressions)
    "papers": {
        "https://arxiv.org/abs/1910.02054": {  # Rajbhandari et al., ZeRO (SC 2020)
            "en": [r"ZeRO paper", r"Rajbhandari et al\.,? 2020"],
            "ru": [r"стать[яиеюё]й? ZeRO", r"Rajbhandari и др\.,? 2020"]},
        "https://arxiv.org/abs/2304.11277": {  # Zhao et al., PyTorch FSDP (VLDB 2023)
            "en": [r"PyTorch FSDP paper", r"Zhao et al\.,? 2023"],
            "ru": [r"стать[яиеюё]й? (?:о )?PyTorch FSDP", r"Zhao и др\.,? 2023"]},
        "https://arxiv.org/abs/2205.05198": {  # Korthikanti et al., Megatron's sequence parallelism
            "en": [r"Korthikanti et al\.", r"Megatron sequence-parallel paper",
                   r"Reducing Activation Recomputation in Large\s+Transformer Models"],
            "ru": [r"Korthikanti et al\.", r"стать[яиеюё]й? Megatron(?: о sequence parallelism)?",
                   r"Reducing Activation Recomputation in Large\s+Transformer Models"]},
        "https://doi.org/10.1016/j.jpdc.2008.09.002": {  # bandwidth-optimal all-reduce (JPDC 2009)
            "en": [r"Patarasuk and Yuan"], "ru": [r"Патарасук и Юань"]},
        "https://arxiv.org/abs/2306.10209": {"en": [r"ZeRO\+\+"], "ru": [r"ZeRO\+\+"]},  # hpZ
        "https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md": {  # algbw and busbw
            "en": [r"nccl-tests"], "ru": [r"nccl-tests"]},
    },
}
_PREFIXES = {"dist.": "torch.distributed.", "nn.": "torch.nn.", "dcp.": "torch.distributed.checkpoint.",
             "fsdp.": "torch.distributed.fsdp."}
_TAIL_API = {}  # a bare name (`fully_shard`, `DTensor`, `send`) -> its torch path
for _path in EXTERNAL["api"]:
    _tail = _path.rsplit(".", 1)[-1]
    if _tail not in ("distributed", "checkpoint", "chunk"):  # too generic alone: which checkpoint?
        _TAIL_API.setdefault(_tail, _path)
_PYTORCH_BEFORE = re.compile(r"(?:PyTorch|FSDP1|FSDP2)(?:'s|’s)\s*$")
_PYTORCH_AFTER = re.compile(r"^\s*(?:\([^)]*\)\s*)?из (?:PyTorch|FSDP1|FSDP2)\b")


def pytorch_url(name: str) -> str | None:
    """The PyTorch page of a name as the lessons write it (`dist.send`, `nn.Parameter`, `torchrun`)."""
    for short, full in _PREFIXES.items():
        if name.startswith(short):
            name = full + name[len(short):]
    api = EXTERNAL["api"]
    if name in api:
        return api[name]
    if name.startswith("torch.distributed.checkpoint."):
        return api["torch.distributed.checkpoint"]
    return api.get(_TAIL_API.get(name, ""))


# --- the library's names (what the API reference renders) -------------------------------------------
@functools.lru_cache(maxsize=1)
def library_names() -> dict[str, str]:
    """Every way the lessons name a documented object of `fsdp_mini` -> its reference anchor (its path).

    Keys: the full path; `fsdp_mini.X` for the package's exports (which Python rebinds: after
    `from fsdp_mini.run import launch`, `fsdp_mini.launch` is the function); a module's file
    (`fsdp_mini/parallel/ddp.py`); a class, or a function with a compound name (`plan_buckets`, not `size` or
    `train`, which prose uses as words), by its bare name, and a class's member as `Class.member`, when
    only one module defines it; `module.name` (`cost.bus_factor`); UPPER_CASE class members (`NO_SHARD`)
    bare. An ambiguous short name is left out rather than guessed."""
    import griffe

    package = griffe.load("fsdp_mini", search_paths=[str(ROOT)], resolve_aliases=False)
    full, short = {}, {}

    def add_short(key: str, path: str) -> None:
        short.setdefault(key, set()).add(path)

    def walk(obj) -> None:
        for name, member in obj.members.items():
            if member.is_alias:
                continue
            if name.startswith("_") and not (member.is_module and not name.startswith("__")):
                continue  # a private name; a package `_fully_shard`, `_composable` is PyTorch's name, public here
            if member.is_module:
                full[member.path] = member.path
                full[str(member.relative_filepath).replace("\\", "/")] = member.path
                walk(member)
                continue
            if not member.has_docstrings:  # mkdocstrings renders no heading for it
                continue
            full[member.path] = member.path
            if obj.is_module:
                if member.is_class or (member.is_function and "_" in name):
                    add_short(name, member.path)
                add_short(f"{obj.name}.{name}", member.path)
            elif obj.is_class:
                add_short(f"{obj.name}.{name}", member.path)
                if name.isupper():
                    add_short(name, member.path)
            if member.is_class:
                walk(member)

    walk(package)
    names = {key: next(iter(paths)) for key, paths in short.items() if len(paths) == 1}
    names.update(full)
    tree = ast.parse((ROOT / "fsdp_mini" / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:  # the package's exports (loaded on first use, fsdp_mini/lazy_exports.py) win over a module
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["_EXPORTS"]:
            for name, where in ast.literal_eval(node.value).items():  # "module:name", or "module"
                module, _, attr = where.partition(":")
                target = f"{module}.{attr}" if attr else module
                if target in full:
                    names[f"fsdp_mini.{name}"] = names[name] = target
    return names


_CODE_NAME = re.compile(r"^(?P<name>[A-Za-z_][\w.]*|fsdp_mini/[\w/]+\.py)(?:\(.*\))?$", re.S)


# --- lesson mentions ----------------------------------------------------------------------------------
_SEP = {"en": r"(?:,|–|—|-|\band\b|\bor\b|\bto\b)", "ru": r"(?:,|–|—|-|\bи\b|\bили\b|\bпо\b)"}
_LESSON_WORD = {"en": r"[Ll]essons?", "ru": r"[Уу]рок(?:ами|ам|ах|ов|ом|а|у|е|и)?"}
_PLURAL = {"en": re.compile(r"s$"), "ru": re.compile(r"(?:и|ов|ам|ами|ах)$")}
_LESSON = {lang: re.compile(
    rf"(?<!\w)(?P<word>{_LESSON_WORD[lang]})\s+(?P<n>\d{{1,2}})(?!\d|[.,]\d)"
    rf"(?P<rest>(?:\s*{_SEP[lang]}\s*\d{{1,2}}(?!\d|[.,]\d))*)") for lang in _SEP}
_NEXT = {"en": re.compile(r"(?<!\w)next\s+lesson(?!\w)", re.I),
         "ru": re.compile(r"(?<!\w)следующ[а-яё]*\s+урок[а-яё]*(?!\w)", re.I)}


# --- glossary ------------------------------------------------------------------------------------------
_EXTRA_FORMS = {  # stems a suffix rule cannot find: a fleeting vowel, a term the glossary writes in full
    "ru": {"node": ["узл"], "unit": ["юнит"]},
}


def _variants(cell: str) -> list[str]:
    """`unit (FSDP unit)` -> unit, FSDP unit; `bandwidth, algbw, busbw` -> three; code-like terms none."""
    inner = re.findall(r"\(([^)]*)\)", cell)
    parts = [re.sub(r"\([^)]*\)", "", cell), *inner]
    out = []
    for part in parts:
        for v in re.split(r",\s*|\s+/\s+|\s+и\s+", part):
            v = " ".join(v.split())
            if v and not re.search(r"[_=`]", v):
                out.append(v)
    return out


def _ru_word(word: str) -> str:
    """A Russian word with any case ending: its stem (the word less up to two final vowels) and up to
    four letters; an English or short word as it is."""
    if not re.fullmatch(r"[а-яё]{4,}", word, re.I):
        return re.escape(word)
    stem = re.sub(r"[аеёиоуыэюяйь]{1,2}$", "", word, flags=re.I)
    return re.escape(stem) + r"[а-яё]{0,4}"


def _term_pattern(variant: str, lang: str) -> str:
    words = variant.split()
    if lang == "ru" and re.search(r"[а-яё]", variant, re.I):
        body = r"\s+".join(_ru_word(w) for w in words)
    else:
        body = r"\s+".join(re.escape(w) for w in words) + r"(?:s|es)?"
    if variant == variant.lower():
        body = f"(?i:{body})"
    return rf"(?<![\w-]){body}(?![\w-])"


@functools.lru_cache(maxsize=None)
def glossary(lang: str) -> list[tuple[str, str]]:
    """The glossary of `lang` as (anchor, English term) per table row, in the table's order: the anchor
    is the slug of the English term's first variant, the same in both languages."""
    path = LESSONS / lang / "glossary.md"
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 3 or set(cells[0]) <= set("-: "):
            continue
        rows.append(cells)
    rows = rows[1:]  # the header
    out, seen = [], set()
    for cells in rows:
        english = cells[0] if lang == "en" else cells[1]
        native = cells[0]
        anchor = base = SLUG((_variants(english) or [english])[0], "-")
        i = 1
        while anchor in seen:
            i += 1
            anchor = f"{base}_{i}"
        seen.add(anchor)
        out.append((anchor, native))
    return out


@functools.lru_cache(maxsize=None)
def glossary_pattern(lang: str) -> tuple[re.Pattern, list[str]]:
    """One regular expression for every term of `lang`'s glossary (longest variants first, so
    "shard group" wins over "shard"), and the anchor of each of its groups."""
    entries = []
    for anchor, native in glossary(lang):
        variants = _variants(native)
        for extra in _EXTRA_FORMS.get(lang, {}).get(anchor, []):
            variants.append(extra)
        for v in variants:
            pattern = (rf"(?<![\w-])(?i:{re.escape(v)}[а-яё]{{0,4}})(?![\w-])"
                       if v in _EXTRA_FORMS.get(lang, {}).get(anchor, []) else _term_pattern(v, lang))
            entries.append((len(v), pattern, anchor))
    entries.sort(key=lambda e: -e[0])
    anchors = [a for _, _, a in entries]
    return re.compile("|".join(f"({p})" for _, p, _ in entries)), anchors


# --- the HTML walk -------------------------------------------------------------------------------------
_TOKEN = re.compile(r"(<!--.*?-->|<(script|style)\b.*?</\2\s*>|<(?:[^>\"']|\"[^\"]*\"|'[^']*')*>)",
                    re.S | re.I)
_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
_NO_LINKS_TAGS = {"a", "autoref", "code", "pre", "kbd", "samp", "h1", "h2", "h3", "h4", "h5", "h6", "svg",
                  "math", "button", "label", "select", "option", "textarea", "summary", "nav", "script",
                  "style", "title"}
_NO_LINKS_CLASSES = re.compile(r"\b(?:jp-CodeCell|jp-OutputArea|jp-InputPrompt|jp-OutputPrompt|arithmatex|"
                               r"highlight|doc-signature|doc-label|headerlink|md-button|MathJax)\b")
_BLOCKS = {"p", "li", "td", "th", "dd", "dt", "blockquote", "figcaption", "div"}
_TAG = re.compile(r"<\s*(/)?\s*([a-zA-Z][\w-]*)([^>]*?)(/)?\s*>", re.S)
_CLASS = re.compile(r"""\bclass\s*=\s*(?:"([^"]*)"|'([^']*)')""")
_MATH = re.compile(r"(?<!\\)(\$\$|\$)")


class _Linker:
    """The state of one page's walk: what is already linked, and where to."""

    def __init__(self, lang: str, urls: dict, page_stem: str, options: dict):
        self.lang, self.urls, self.page_stem, self.options = lang, urls, page_stem, options
        self.used: set[str] = set()  # targets already linked on this page
        self.block_terms: dict[int, int] = {}  # glossary links per block

    # what a match becomes
    def lesson_link(self, text: str, number: int) -> str | None:
        url = self.urls["lessons"].get(number)
        if url is None or number == self.urls.get("self"):
            return None
        return f'<a href="{url}">{text}</a>'

    def text(self, text: str, block: int, in_math: bool) -> tuple[str, bool]:
        """Links in one text node; math ($...$, which MathJax typesets later) is left alone."""
        out, pos = [], 0
        pieces = []  # (start, end, in math)
        for m in _MATH.finditer(text):
            pieces.append((pos, m.start(), in_math))
            pieces.append((m.start(), m.end(), True))
            in_math, pos = not in_math, m.end()
        pieces.append((pos, len(text), in_math))
        for start, end, math in pieces:
            out.append(text[start:end] if math else self._prose(text[start:end], block))
        return "".join(out), in_math

    def _prose(self, text: str, block: int) -> str:
        if not text.strip():
            return text
        found = []  # (start, end, replacement): lessons, then papers, then glossary terms
        if self.options["lessons"]:
            for m in _LESSON[self.lang].finditer(text):
                found.extend(self._lesson_mention(m))
            nxt = self.urls.get("next")
            if nxt is not None:
                for m in _NEXT[self.lang].finditer(text):
                    found.append((m.start(), m.end(), f'<a href="{nxt}">{m.group(0)}</a>'))
        for url, phrases in EXTERNAL["papers"].items():
            for phrase in phrases.get(self.lang, []):
                for m in re.finditer(phrase, text):
                    if url not in self.used:
                        found.append((m.start(), m.end(), f'<a href="{url}">{m.group(0)}</a>', url))
        if self.options["glossary"] and self.block_terms.get(block, 0) < GLOSSARY_PER_BLOCK:
            pattern, anchors = glossary_pattern(self.lang)
            for m in pattern.finditer(text):
                anchor = anchors[m.lastindex - 1]
                target = "glossary#" + anchor
                if target not in self.used:
                    url = f'{self.urls["glossary"]}#{anchor}'
                    found.append((m.start(), m.end(), f'<a href="{url}">{m.group(0)}</a>', target))
        out, pos = [], 0
        for item in sorted(found, key=lambda f: (f[0], -f[1])):
            start, end, html = item[:3]
            target = item[3] if len(item) > 3 else None
            if start < pos or (target and target in self.used):
                continue
            if target and target.startswith("glossary#"):
                if self.block_terms.get(block, 0) >= GLOSSARY_PER_BLOCK:
                    continue
                self.block_terms[block] = self.block_terms.get(block, 0) + 1
            if target:
                self.used.add(target)
            out.append(text[pos:start] + html)
            pos = end
        return "".join(out) + text[pos:]

    def _lesson_mention(self, m: re.Match) -> list[tuple]:
        """"lesson 06" is one link; in "lessons 03, 05 and 09" the first words and each number are."""
        first = int(m.group("n"))
        head_end = m.end("n")
        out = []
        link = self.lesson_link(m.group(0)[: head_end - m.start()], first)
        if link:
            out.append((m.start(), head_end, link))
        if m.group("rest") and _PLURAL[self.lang].search(m.group("word")):
            for n in re.finditer(r"\d{1,2}", m.group("rest")):
                link = self.lesson_link(n.group(0), int(n.group(0)))
                if link:
                    start = m.start("rest") + n.start()
                    out.append((start, start + len(n.group(0)), link))
        return out

    def code(self, name: str, before: str, after: str) -> str | None:
        """The opening tag of a link around `<code>name</code>`, or None: the library's reference, or
        PyTorch's docs when the name is PyTorch's."""
        m = _CODE_NAME.match(name)
        if not m:
            return None
        name = m.group("name")
        library = library_names().get(name) if self.options["api"] else None
        torch = pytorch_url(name)
        pytorch_context = (self.page_stem in PYTORCH_PAGES or _PYTORCH_BEFORE.search(before)
                           or (self.lang == "ru" and _PYTORCH_AFTER.match(after)))
        if torch and (library is None or pytorch_context or name.startswith("torch.")):
            if torch in self.used:
                return None
            self.used.add(torch)
            return f'<a href="{escape(torch)}">'
        if library:
            if library in self.used:
                return None
            self.used.add(library)
            return f'<autoref identifier="{escape(library)}" optional>'
        return None


def link_html(html: str, linker: _Linker) -> str:
    """Walk the page's HTML: text nodes and inline code outside the no-link zones get their links."""
    tokens = _TOKEN.split(html)
    # split() also returns the inner group of script/style: drop those (every third item after a tag)
    parts, i = [], 0
    while i < len(tokens):
        parts.append(tokens[i])
        if i + 1 < len(tokens):
            parts.append(tokens[i + 1])
            i += 3
        else:
            i += 1
    stack: list[tuple[str, bool, int]] = []  # (tag, no links inside, block id)
    blocks, in_math = 0, False
    out, last_text = [], ""
    i = 0
    while i < len(parts):
        part = parts[i]
        if i % 2 == 0:  # text
            forbidden = stack and stack[-1][1]
            if part and not forbidden:
                block = next((b for _, _, b in reversed(stack) if b >= 0), -1)
                part, in_math = linker.text(part, block, in_math)
                last_text = part
            elif part.strip():
                last_text = ""
            out.append(part)
            i += 1
            continue
        tag = _TAG.match(part)
        if tag is None or part.startswith("<!--") or re.match(r"<(script|style)\b", part, re.I):
            out.append(part)
            i += 1
            continue
        closing, name, attrs, selfclosing = tag.group(1), tag.group(2).lower(), tag.group(3), tag.group(4)
        if closing:
            for j in range(len(stack) - 1, -1, -1):
                if stack[j][0] == name:
                    del stack[j:]
                    break
            out.append(part)
            i += 1
            continue
        inherited = bool(stack and stack[-1][1])
        klass = _CLASS.search(attrs)
        klass = (klass.group(1) or klass.group(2) or "") if klass else ""
        # inline code with a plain name: a link around it
        if (name == "code" and not inherited and i + 2 < len(parts)
                and re.match(r"</\s*code\s*>", parts[i + 2] or "", re.I) and not in_math):
            after = parts[i + 3] if i + 3 < len(parts) else ""
            opening = linker.code(_unescape(parts[i + 1]), last_text, after)
            if opening:
                closer = "</a>" if opening.startswith("<a ") else "</autoref>"
                out.append(opening + part + parts[i + 1] + parts[i + 2] + closer)
                last_text = ""
                i += 3
                continue
        if name in _VOID or selfclosing:
            out.append(part)
            i += 1
            continue
        forbidden = inherited or name in _NO_LINKS_TAGS or bool(_NO_LINKS_CLASSES.search(klass))
        block = -1
        if name in _BLOCKS:
            blocks += 1
            block = blocks
        stack.append((name, forbidden, block))
        if name in _BLOCKS:  # neither math nor "PyTorch's" runs on across paragraphs
            last_text, in_math = "", False
        out.append(part)
        i += 1
    return "".join(out)


def _unescape(text: str) -> str:
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"').replace("&amp;", "&")


# --- glossary anchors ----------------------------------------------------------------------------------
_ROW = re.compile(r"<tr>(\s*<td[^>]*>)(.*?)</td>", re.S)


# a row a link lands on is marked, and clear of the sticky header (material does this for headings only)
_GLOSSARY_STYLE = ("<style>.md-typeset tr[id]{scroll-margin-top:4rem}"
                   ".md-typeset tr:target{background-color:var(--md-accent-fg-color--transparent)}</style>")


def glossary_ids(html: str, lang: str) -> str:
    """Each row of the glossary's table gets the id of its term (`<tr id="shard-group">`)."""
    anchors = {SLUG(native, "-"): anchor for anchor, native in glossary(lang)}

    def row(m: re.Match) -> str:
        text = re.sub(r"<[^>]+>", "", m.group(2)).strip()
        anchor = anchors.get(SLUG(_unescape(text), "-"))
        return f'<tr id="{anchor}">' + m.group(1) + m.group(2) + "</td>" if anchor else m.group(0)

    return _GLOSSARY_STYLE + _ROW.sub(row, html)


# --- the hook ------------------------------------------------------------------------------------------
def _page_parts(page) -> tuple[str, str, str]:
    """(language, folder inside it, file stem) of a page: ('ru', '', '03_ddp'), ('en', 'reference', 'index')."""
    rel = Path(page.file.abs_src_path).resolve().relative_to(LESSONS)
    return rel.parts[0], "/".join(rel.parts[1:-1]), rel.stem


def _urls(page, files, lang: str, stem: str) -> dict:
    lessons, by_number = {}, {}
    for f in files:
        parts = f.src_uri.split("/")
        if len(parts) == 2 and parts[0] == lang and re.match(r"\d\d_.*\.ipynb$", parts[1]):
            by_number[int(parts[1][:2])] = f
    for number, f in by_number.items():
        lessons[number] = f.url_relative_to(page.file)
    glossary_file = files.get_file_from_path(f"{lang}/glossary.md")
    own = int(stem[:2]) if page.file.src_uri.endswith(".ipynb") and stem[:2].isdigit() else None
    return {"lessons": lessons, "self": own,
            "next": lessons.get(own + 1) if own is not None else None,
            "glossary": glossary_file.url_relative_to(page.file) if glossary_file else None}


def on_page_content(html: str, page, config, files) -> str:
    try:
        lang, folder, stem = _page_parts(page)
    except ValueError:  # not a page of lessons/<lang>/
        return html
    if lang not in _LESSON:
        return html
    urls = _urls(page, files, lang, stem)
    options = {
        "lessons": True,
        "api": True,
        # the glossary does not link to itself; the API reference's docstrings are not prose to gloss
        "glossary": urls["glossary"] is not None and stem != "glossary" and folder != "reference",
    }
    if stem == "glossary" and not folder:
        html = glossary_ids(html, lang)
    return link_html(html, _Linker(lang, urls, stem, options))
