"""MkDocs hooks of the course site (mkdocs.yml: `hooks:`). Each one closes a known gap.

1. Notebooks are documentation pages (mkdocs-static-i18n issue 198). mkdocs-jupyter marks `.ipynb`
   files as pages by wrapping their `File` objects, but mkdocs-static-i18n then re-creates every file
   as a plain `File`, and MkDocs counts only Markdown as pages: the notebooks would be copied as raw
   JSON, with no twin for the language switch. Teaching `File` that `.ipynb` is a page lets i18n
   treat the notebooks like Markdown pages (twins, alternates, fallback) and mkdocs-jupyter render
   them.
2. One anchor per notebook heading, in any language. mkdocs-jupyter slugs headings to ASCII (a
   Russian heading gets an empty id), and builds the table of contents from a copy of the markdown
   with all inline code removed, so a heading like "Point to point: `send` and `recv`" got a TOC
   entry "Point to point:  and" pointing nowhere. Here the TOC comes from the markdown cells as they
   are, and headings and TOC entries share one slug function (`pymdownx.slugs`, as the Markdown pages
   use) and one de-duplication.
3. No CDN. nbconvert's template puts a MathJax 2 `<script src>` from a CDN and a Mermaid loader on
   every notebook page; both are removed: the site's own MathJax (4.) typesets the notebooks too.
4. MathJax is served from the site: `on_post_build` copies MathJax 3 (the `django-static-mathjax`
   package, a plain copy of MathJax's npm release, pinned in pyproject's `docs` extra) and
   mathjax-config.js beside this file to `assets/mathjax/`, which mkdocs.yml's `extra_javascript`
   loads. (Not through a theme `custom_dir` inside lessons/: mkdocs-static-i18n would take its files
   for documents and look for them in the wrong folder.)
5. The notebook cache survives two languages. mkdocs-jupyter caches each converted notebook (in
   build/mkdocs-jupyter) and, after a build, deletes what that build did not use; mkdocs-static-i18n
   builds once per language, so each language deleted the other's and nothing was ever reused. Now
   only the last language's build evicts, keeping what any language used; and a cache entry's key
   also covers the files of lessons/_site (these hooks, lesson_view.py) and the converter's versions,
   so a change to either converts again.
6. No sitemap requests from every page. mkdocs-material's script fetches `sitemap.xml` next to each
   `<link rel="alternate" hreflang>` of a page's head, expecting language roots; with the switch
   landing on the twin page (what i18n puts there) that is a 404 for every page and language. The
   head links are dropped: the header's language switch keeps its links to the twins, and the
   site's sitemap.xml lists each page's alternates for search engines. The 404 page, built by
   every language into the same file, is kept in English, its language switch to the home pages.
7. The API reference covers every module, one page per group of modules: a page containing
   `<!-- fsdp_mini modules: PATTERN ... -->` gets one mkdocstrings block per module of `fsdp_mini` found
   on disk that its patterns name (exact names or globs). A module named by several pages goes to the
   closest name (an exact name, then the longest glob), so a catch-all like `fsdp_mini.*` on one page
   takes a new module until a page names it (and tests/site/test_site.py checks that every module is on a page).
8. A notebook's link to another notebook lands on its page. A lesson links the next one as Jupyter and
   GitHub need it, `[lesson 09](09_flat_or_per_parameter.ipynb)`; MkDocs rewrites such links in
   Markdown pages only, mkdocs-jupyter leaves them as they are, so on the site they pointed at a file
   that is not there. Here they point at the twin page of the same language (a missing target is left
   alone, for the link check to report).
"""
from __future__ import annotations

import fnmatch
import hashlib
import importlib.util
import json
import posixpath
import re
import shutil
from copy import deepcopy
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote
from xml.etree.ElementTree import Element

from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File
from mkdocs.utils import is_markdown_file
from pymdownx.slugs import slugify

ROOT = Path(__file__).resolve().parents[2]
SLUG = slugify(case="lower")  # what mkdocs.yml gives the `toc` extension of the Markdown pages


# 1. notebooks are pages ----------------------------------------------------------------------------
def _is_documentation_page(self: File) -> bool:
    return is_markdown_file(self.src_uri) or self.src_uri.endswith(".ipynb")


File.is_documentation_page = _is_documentation_page


# 2. one anchor per notebook heading ----------------------------------------------------------------
def _patch_notebook_headings() -> None:
    import markdown
    from defusedxml import ElementTree
    from markdown.extensions.toc import TocExtension, unique
    from mkdocs_jupyter import convert, plugin
    from nbconvert.filters.strings import html2text

    # `mkdocs serve` executes this file again at each rebuild: wrap the originals, once
    original_nb2html = getattr(convert, "_original_nb2html", convert.nb2html)
    convert._original_nb2html = original_nb2html
    seen: set[str] = set()  # the ids of the notebook being converted

    def nb2html(*args, **kwargs):
        seen.clear()
        return original_nb2html(*args, **kwargs)

    def add_anchor(html: str, anchor_link_text: str = "¶") -> str:
        try:
            heading = ElementTree.fromstring(html)
        except Exception:  # not well-formed: leave it as nbconvert made it
            return html
        slug = unique(SLUG(html2text(heading).strip(), "-"), seen)
        heading.set("id", slug)
        link = Element("a", {"class": "anchor-link", "href": "#" + slug})
        link.text = anchor_link_text
        heading.append(link)
        return ElementTree.tostring(heading).decode("utf-8", "replace")

    def toc_tokens(path: str, toc_depth: int):
        nb = json.loads(Path(path).read_text(encoding="utf-8"))
        source = "\n\n".join("".join(c["source"]) if isinstance(c["source"], list) else c["source"]
                             for c in nb["cells"] if c["cell_type"] == "markdown")
        md = markdown.Markdown(extensions=["fenced_code", TocExtension(toc_depth=toc_depth, slugify=SLUG)])
        md.convert(source)
        title = next((t["name"] for t in md.toc_tokens if t["level"] == 1), None)
        return md.toc_tokens, title

    # the cache of converted notebooks must not outlive a change of these hooks or of the toolchain
    original_key = getattr(plugin, "_original_cache_key", plugin._compute_cache_key)
    plugin._original_cache_key = original_key
    salt = hashlib.sha256()
    for source in sorted(Path(__file__).parent.glob("*.py")):  # these hooks and lesson_view.py
        salt.update(source.read_bytes())
    for package in ("mkdocs-jupyter", "nbconvert", "mistune"):
        salt.update(f"{package}={metadata.version(package)}".encode())

    def cache_key(*args, **kwargs) -> str:
        return hashlib.sha256((original_key(*args, **kwargs) + salt.hexdigest()).encode()).hexdigest()

    convert.nb2html = nb2html                 # called by the plugin as convert.nb2html
    convert.add_anchor_lower_id = add_anchor  # called by mkdocs-jupyter's heading renderer
    plugin._get_nb_toc_tokens = toc_tokens
    plugin._compute_cache_key = cache_key


_patch_notebook_headings()


# 3. no CDN scripts in notebook pages ---------------------------------------------------------------
_CDN_BLOCKS = [
    re.compile(r"<!-- Load mathjax -->.*?<!-- End of mathjax configuration -->", re.S),
    re.compile(r'<script type="module">(?:(?!</script>).)*?mermaid(?:(?!</script>).)*</script>', re.S),
]


def on_page_content(html: str, page, config, files) -> str:
    if page.file.src_uri.endswith(".ipynb"):
        for block in _CDN_BLOCKS:
            html = block.sub("", html)
        html = _link_notebooks(html, page, files)
    return html


# 8. links between notebooks -----------------------------------------------------------------------
_NOTEBOOK_LINK = re.compile(r'(<a\b[^>]*?\bhref=")([^":/?#]+\.ipynb)(#[^"]*)?(")')


def _link_notebooks(html: str, page, files) -> str:
    def to_page(m: re.Match) -> str:
        target = files.get_file_from_path(posixpath.normpath(posixpath.join(
            posixpath.dirname(page.file.src_uri), unquote(m.group(2)))))
        if target is None:
            return m.group(0)
        return m.group(1) + target.url_relative_to(page.file) + (m.group(3) or "") + m.group(4)

    return _NOTEBOOK_LINK.sub(to_page, html)


# 4. MathJax from the site itself -------------------------------------------------------------------
def _mathjax_dir() -> Path:
    spec = importlib.util.find_spec("mathjax")
    es5 = Path(spec.origin).parent / "static" / "mathjax" / "es5" if spec and spec.origin else None
    if es5 is None or not (es5 / "tex-chtml.js").is_file():
        raise PluginError("MathJax 3 not found: install the docs extra, pip install -e '.[docs]'")
    return es5


def on_config(config):
    _mathjax_dir()  # fail before building, not after


def _copy_mathjax(config) -> None:
    es5, target = _mathjax_dir(), Path(config.site_dir) / "assets" / "mathjax"
    if not (target / "tex-chtml.js").is_file():  # i18n builds each language into the same site
        # tex-chtml.js is the typesetter; the folders hold what it loads on demand (TeX extensions,
        # fonts, the menu and its accessibility tools). The other combined builds are not needed.
        shutil.copytree(es5, target, dirs_exist_ok=True, ignore=lambda folder, names: [
            n for n in names if Path(folder) == es5 and n.endswith(".js") and n != "tex-chtml.js"])
    shutil.copy2(Path(__file__).with_name("mathjax-config.js"), target / "mathjax-config.js")


# 5. one notebook cache for all languages -----------------------------------------------------------
_cache_used: set = set()  # cache files used by this run's builds so far, all languages


def _keep_notebook_cache(config) -> None:
    jupyter, i18n = config.plugins.get("mkdocs-jupyter"), config.plugins.get("i18n")
    if jupyter is None or i18n is None or not jupyter.config["cache"]:
        return
    _cache_used.update(jupyter._used_cache_paths)
    order = [i18n.default_language] + [x for x in i18n.build_languages if x != i18n.default_language]
    if i18n.current_language != order[-1]:  # more languages to build: evict nothing yet
        jupyter._used_cache_paths = set(Path(jupyter.config["cache_dir"]).glob("*.json"))
    else:
        jupyter._used_cache_paths = set(_cache_used)
        _cache_used.clear()


@event_priority(100)  # before mkdocs-jupyter's own on_post_build, which evicts from its cache
def on_post_build(config) -> None:
    _keep_notebook_cache(config)
    _copy_mathjax(config)


# 6. no head links that make material fetch a sitemap per page -------------------------------------
_HEAD_ALTERNATE = re.compile(r'\s*<link rel="alternate" href="[^"]*" hreflang="[^"]*">')


def _drop_head_alternates(output: str) -> str:
    head, sep, body = output.partition("</head>")
    return _HEAD_ALTERNATE.sub("", head) + sep + body


def on_post_page(output: str, page, config) -> str:
    return _translate_theme(_drop_head_alternates(output), config)


# 10. the theme's last English strings on the Russian pages -----------------------------------------
# mkdocs-static-i18n gives each language material's own translations (search, copy button, footer
# links); two strings have none: the headings' permalink title, which comes from the `toc` extension's
# one setting for all languages, and the footer's "Made with", which material's template hard-codes.
_THEME_STRINGS = {"ru": [('title="Permanent link"', 'title="Постоянная ссылка"'),
                         ("\n    Made with\n", "\n    Сделано на\n")]}


def _translate_theme(output: str, config) -> str:
    i18n = config.plugins.get("i18n")
    for old, new in _THEME_STRINGS.get(i18n.current_language if i18n else "", []):
        output = output.replace(old, new)
    return output


# ... and one 404 page, in English, whose language switch leads to each language's home page. -------
def on_pre_template(template, template_name: str, config):
    i18n = config.plugins.get("i18n")
    if template_name == "404.html" and i18n is not None and i18n.extra_alternate:
        config.extra["alternate"] = deepcopy(i18n.extra_alternate)  # not the last page's twins
    return template


def on_post_template(output: str, template_name: str, config) -> str:
    if template_name != "404.html":
        return output
    i18n = config.plugins.get("i18n")
    if i18n is not None and i18n.current_language != i18n.default_language:
        return ""  # every language builds into the same site: keep the default language's 404.html
    return _drop_head_alternates(output)


# 7. the API reference covers every module ----------------------------------------------------------
MODULES_MARKER = re.compile(r"<!-- fsdp_mini modules: (.*?) -->", re.S)


def _modules() -> list[str]:
    names = []
    for path in sorted((ROOT / "fsdp_mini").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        if len(parts) > 1 and not any(p.startswith("__") for p in parts):  # not the package itself, nor __main__
            names.append(".".join(parts))
    return names


def _specificity(pattern: str, module: str) -> tuple[int, int] | None:
    """How closely `pattern` names `module`: an exact name beats any glob, a longer glob a shorter."""
    if pattern == module:
        return (2, len(pattern))
    if "*" in pattern and fnmatch.fnmatchcase(module, pattern):
        return (1, len(pattern.split("*")[0]))
    return None


def _reference_pages(page) -> dict[str, list[str]]:
    """The marker patterns of every page in the folder of `page` (one language's reference)."""
    found = {}
    for path in sorted(Path(page.file.abs_src_path).parent.glob("*.md")):
        marker = MODULES_MARKER.search(path.read_text(encoding="utf-8"))
        if marker:
            found[path.name] = marker.group(1).split()
    return found


def _modules_of(page) -> list[str]:
    """The modules the page's marker claims: each module goes to the page whose pattern names it most
    closely, in the order of the page's patterns (a glob's matches in the order of the files)."""
    pages, mine = _reference_pages(page), Path(page.file.abs_src_path).name
    best = {}
    for module in _modules():
        scored = [(score, name, i) for name, patterns in pages.items()
                  for i, pattern in enumerate(patterns) if (score := _specificity(pattern, module))]
        if scored:
            _, name, i = max(scored, key=lambda x: x[0])
            best[module] = (name, i)
    return sorted((m for m, (name, _) in best.items() if name == mine), key=lambda m: best[m][1])


def on_page_markdown(markdown: str, page, config, files) -> str:
    if LESSON_MAP in markdown:
        folder = Path(page.file.abs_src_path).parent
        markdown = markdown.replace(LESSON_MAP, _lesson_map(folder, folder.name))
    if TIME_MODEL in markdown:
        markdown = markdown.replace(TIME_MODEL, time_model(Path(page.file.abs_src_path).parent.name))
    marker = MODULES_MARKER.search(markdown)
    if marker is None:
        return markdown
    blocks = "\n".join(f"::: {name}\n" for name in _modules_of(page))
    return markdown[:marker.start()] + blocks + markdown[marker.end():]



# 9. the lesson map of the home pages ---------------------------------------------------------------
LESSON_MAP = "<!-- lesson map -->"
# How long a learner takes. One calibration for every lesson: lessons 09-11, worked through as a learner
# works (reading, running, writing the exercises), take 120-150 minutes each, and these rates put each of them
# at 135. Technical prose with formulas reads slower than plain prose, code is read line by line, library
# code is read too (the listings a lesson shows, and a library file its prose sends the reader to without
# showing it), and a code exercise is a cycle of writing, running its check on real ranks, reading the verdict
# and fixing.
CALIBRATION = ("09-11", 120, 150)  # the lessons timed, and the range a learner needs for each of them
WORDS_PER_MINUTE = 100     # technical prose, formulas and tables included (folded solutions too)
CODE_LINES_PER_MINUTE = 8  # the lesson's own code cells (calls and asserts; printing lives in fsdp_mini.course.show)
LISTING_LINES_PER_MINUTE = 20  # library source: shown by show_source (already explained), or a file named in prose
RUN_MINUTES = 2            # running every cell once (the longest lesson runs about two minutes here)
EXERCISE_MINUTES = 15      # one code exercise: write the body, run the check, read the verdict, fix
_CODE_EXERCISE = re.compile(r"^[A-Z][A-Z0-9_]*\.check\(", re.M)  # a CodeExercise's check cell
TIME_MODEL = "<!-- time model -->"


def time_model(lang: str) -> str:
    """The home pages' sentence on how the lesson times are estimated, from the constants above."""
    (first, last), low, high = CALIBRATION[0].split("-"), CALIBRATION[1], CALIBRATION[2]
    if lang == "ru":
        return (f"Время — оценка, а не замер. Текст английского блокнота читается со скоростью "
                f"{WORDS_PER_MINUTE} слов в минуту, его код — {CODE_LINES_PER_MINUTE} строк в минуту, показанный "
                f"исходный код библиотеки — {LISTING_LINES_PER_MINUTE} строк в минуту; ещё {RUN_MINUTES} мин "
                f"уходит на выполнение блокнота и {EXERCISE_MINUTES} мин — на каждое упражнение с кодом "
                f"(написать, запустить проверку, прочитать вердикт, исправить). Исходный файл библиотеки, на который "
                f"урок ссылается, но не показывает, читается с той же скоростью, что и показанный код. Оценка "
                f"откалибрована на уроках {first}–{last}: ученик проходит каждый из них за {low}–{high} минут.")
    return (f"Times are estimates, not measurements: each English notebook's prose read at {WORDS_PER_MINUTE} "
            f"words a minute, its code at {CODE_LINES_PER_MINUTE} lines a minute, the library source it shows at "
            f"{LISTING_LINES_PER_MINUTE} lines a minute, {RUN_MINUTES} minutes for running it and "
            f"{EXERCISE_MINUTES} minutes per code exercise (write, run the check, read the verdict, fix); a library "
            f"file a lesson sends the reader to without showing it is read at the listing rate. The figures are "
            f"calibrated on lessons {first}-{last}, which a learner works through in {low}-{high} minutes each. "
            f"Each notebook states its own estimate at the top.")
_MAP_TEXT = {
    "en": {"head": "| | lesson | you will learn | time |", "min": "min", "h": "h", "total": "the whole course"},
    "ru": {"head": "| | урок | что вы узнаете | время |", "min": "мин", "h": "ч", "total": "весь курс"},
}
# "**You will learn:** a; b." or "You will learn:" and a list: the first item is the lesson's headline
_LEARN = re.compile(r"(?:You will learn|Что вы узнаете|Вы узнаете):(?:\*\*)?\s*(?:[-*]\s+)?(.+?)(?:\n\s*[-*]\s|\n\n|$)",
                    re.S)


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


_LIBRARY_FILE = re.compile(r"`(fsdp_mini/[\w/]+\.py)`")


def _listings(cells: list[dict]) -> list[str]:
    """The library source a notebook shows: the code of each show_source output."""
    return ["".join(o.get("data", {}).get("text/markdown", "")).removeprefix("```python\n").removesuffix("```")
            for c in cells if c["cell_type"] == "code" and "show_source(" in _source(c) for o in c.get("outputs", [])]


def library_read(cells: list[dict]) -> int:
    """Lines of library code a notebook relies on without showing them: each `fsdp_mini/....py` file its prose
    names, none of whose source the notebook shows, is read whole (non-blank lines). A file the lesson shows
    from is read through its listings, counted apart."""
    shown = [x.strip() for listing in _listings(cells) for x in listing.splitlines()[:1]]
    total = 0
    for name in sorted({m for c in cells if c["cell_type"] == "markdown" for m in _LIBRARY_FILE.findall(_source(c))}):
        path = ROOT / name
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        if not any(first and first in text for first in shown):
            total += len([x for x in text.splitlines() if x.strip()])
    return total


def lesson_minutes(path: Path) -> int:
    """Time to work through one notebook, rounded up to 5 minutes: its prose at WORDS_PER_MINUTE, its code
    at CODE_LINES_PER_MINUTE (non-blank lines), the library listings it shows and the library files it names
    without showing (`library_read`) at LISTING_LINES_PER_MINUTE, RUN_MINUTES for running it and
    EXERCISE_MINUTES per code exercise. Each lesson states this figure in its introduction
    (tests/course/test_lessons.py checks it)."""
    cells = _cells(path)
    words = sum(len(re.findall(r"\w+", _source(c))) for c in cells if c["cell_type"] == "markdown")
    code = [c for c in cells if c["cell_type"] == "code"]
    lines = sum(len([x for x in _source(c).splitlines() if x.strip()]) for c in code)
    listing = sum(len("".join(o.get("data", {}).get("text/markdown", "")).splitlines())
                  for c in code if "show_source(" in _source(c) for o in c.get("outputs", []))
    exercises = sum(len(_CODE_EXERCISE.findall(_source(c))) for c in code)
    minutes = (words / WORDS_PER_MINUTE + lines / CODE_LINES_PER_MINUTE
               + (listing + library_read(cells)) / LISTING_LINES_PER_MINUTE + RUN_MINUTES
               + exercises * EXERCISE_MINUTES)
    return 5 * -(-int(minutes + 0.999) // 5)


def _lesson_map(folder: Path, lang: str) -> str:
    text = _MAP_TEXT.get(lang, _MAP_TEXT["en"])
    rows, total = [text["head"], "|---|---|---|---|"], 0
    for path in sorted(folder.glob("*.ipynb")):
        cells = _cells(path)
        first = _source(cells[0]) if cells else ""
        heading = re.search(r"^# (.+)$", first, re.M)
        number, _, title = (heading.group(1) if heading else path.stem).partition(" · ")
        if not title:
            number, title = path.stem.split("_")[0], heading.group(1) if heading else path.stem
        learn = _LEARN.search("\n\n".join(_source(c) for c in cells[:3] if c["cell_type"] == "markdown"))
        clause = re.split(r";|\.\s", learn.group(1))[0].strip().rstrip(".") if learn else ""
        clause = " ".join(clause.split()).replace("|", "\\|")
        english = ROOT / "lessons" / "en" / path.name  # one estimate per lesson, whatever the language
        minutes = lesson_minutes(english if english.is_file() else path)
        total += minutes
        rows.append(f"| {number} | [{title}]({path.name}) | {clause} | ≈ {minutes} {text['min']} |")
    hours, minutes = divmod(total, 60)
    rows.append(f"| | **{text['total']}** | | **≈ {hours} {text['h']} {minutes} {text['min']}** |")
    return "\n".join(rows) + "\n"
