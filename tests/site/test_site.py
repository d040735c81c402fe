"""The course site (mkdocs.yml): it builds strictly, every link lands, and it works in a real browser.

The site is built once, into a temporary folder, with `mkdocs build --strict`. The static checks read
the HTML; the browser checks serve it on 127.0.0.1 and drive Debian's headless Chromium through
Playwright (`/usr/bin/chromium`, never a downloaded browser), saving screenshots to test-artifacts/site/.
Where Chromium is absent the browser checks skip, saying so; `.ci/run` installs it in CI.
"""
from __future__ import annotations

import contextlib
import functools
import http.server
import json
import re
import shutil
import threading
from html import escape
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]
LESSONS = ROOT / "lessons"
LANGS = ("en", "ru")
PREFIX = {"en": "", "ru": "ru/"}  # English at the site's root, Russian under /ru/
NOTEBOOKS = sorted(p.stem for p in (LESSONS / "en").glob("*.ipynb"))
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = ROOT / "test-artifacts" / "site"
CYRILLIC = re.compile("[а-яё]", re.I)
# The build and the browser tour of every page run inside the first tests that need them: on a loaded
# 2-core machine that takes longer than the suite's default deadline per test.
pytestmark = pytest.mark.timeout(900)


# --- the build: the session's `site` fixture, in conftest.py (tests/site/test_site_links.py uses it too) ---
def page_path(site_dir: Path, lang: str, name: str) -> Path:
    """The built file of a page: name is a notebook's stem, a page's name ('reference') or '' (home)."""
    return site_dir / PREFIX[lang] / name / "index.html" if name else site_dir / PREFIX[lang] / "index.html"


def stored_pngs(lang: str, name: str) -> int:
    nb = json.loads((LESSONS / lang / f"{name}.ipynb").read_text(encoding="utf-8"))
    return sum("image/png" in o.get("data", {}) for c in nb["cells"] if c["cell_type"] == "code"
               for o in c["outputs"])


def test_build_is_strict_and_prints_no_warning(site):
    _, log = site
    noisy = [line for line in log.splitlines() if re.match(r"\s*(WARNING|ERROR)\b", line)]
    assert not noisy, "\n".join(noisy)
    assert "MkDocs 2" not in log and "NO_MKDOCS_2_WARNING" not in log, "the end-of-life notice is back"


def test_there_are_lessons_to_render():
    assert NOTEBOOKS, "no notebooks in lessons/en"


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_lessons_are_rendered_with_their_stored_outputs(site, lang, name):
    html = page_path(site[0], lang, name).read_text(encoding="utf-8")
    assert "jp-Notebook" in html and '"cell_type"' not in html, "the notebook came out as raw JSON"
    figures = re.findall(r'<img\b[^>]*\bsrc="(figures/[0-9a-f]{16}\.png)"', html)  # lesson_files.py
    assert len(figures) >= stored_pngs(lang, name), "a stored plot is missing"
    assert all((page_path(site[0], lang, name).parent / f).is_file() for f in figures)
    assert 'src="data:image/png' not in html, "a plot is still inlined: the lightbox would store it twice"
    assert "jp-OutputArea-output" in html, "no stored outputs rendered"
    nb = json.loads((LESSONS / lang / f"{name}.ipynb").read_text(encoding="utf-8"))
    title = re.search(r"^# (.+)$", "".join(nb["cells"][0]["source"]), re.M)
    if title:
        assert f"<title>{escape(title.group(1), quote=False)} - " in html, "titled by its first heading"


@pytest.mark.parametrize("lang,readme", [("en", "README.md"), ("ru", "README.ru.md")])
def test_developer_pages_are_the_readmes(site, lang, readme):
    html = page_path(site[0], lang, "develop").read_text(encoding="utf-8")
    text = (ROOT / readme).read_text(encoding="utf-8")
    for heading in re.findall(r"^## (.+)$", re.sub(r"```.*?```", "", text, flags=re.S), re.M):
        plain = re.sub(r"`([^`]*)`", r"\1", heading)
        assert plain in re.sub(r"<[^>]+>", "", html), f"{readme}: section {heading!r} is not on the page"
    assert 'href="README' not in html, "the README's own language link belongs to GitHub, not the site"


@pytest.mark.parametrize("lang", LANGS)
def test_home_pages_are_written_for_learners(site, lang):
    """Outcomes, prerequisites, a map of every lesson with a time, how to run them, a start link."""
    site_dir = site[0]
    home = page_path(site_dir, lang, "")
    html = home.read_text(encoding="utf-8")
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", html))
    sections = {"en": ["What you will be able to do", "What you need", "The lessons", "Run the notebooks yourself"],
                "ru": ["Что вы будете уметь", "Что нужно заранее", "Уроки", "Как запустить блокноты у себя"]}[lang]
    for heading in sections:
        assert re.search(rf"<h2[^>]*>{re.escape(heading)}", html), f"no section {heading!r}"
    table = html[html.index("<table>"):html.index("</table>")]
    rows = re.findall(r"<tr>(.*?)</tr>", table, re.S)[1:]  # the heading row aside
    lessons = {page_path(site_dir, lang, name) for name in NOTEBOOKS}
    linked = {resolve(site_dir, home, href)[0] for href in re.findall(r'href="([^"#]+)', table)}
    assert linked & lessons == lessons, "the map misses a lesson"  # (its text also links the glossary)
    minutes = [re.search(r"≈ (\d+) (min|мин)", row) for row in rows[:len(NOTEBOOKS)]]
    assert all(m and 5 <= int(m.group(1)) <= 200 for m in minutes), rows  # lesson 12: 190
    assert "make setup" in text and "jupyter lab" in text
    start = re.search(r'<a (?=[^>]*md-button--primary)[^>]*href="([^"]+)"', html)
    assert start and resolve(site_dir, home, start.group(1))[0] == page_path(site_dir, lang, NOTEBOOKS[0])
    assert "develop/" in html, "no link to the developers' page"
    if lang == "ru":
        article = re.search(r"<article\b[^>]*>(.*?)</article>", html, re.S).group(1)
        prose = re.sub(r"<(pre|code|table)\b.*?</\1>", " ", article, flags=re.S)
        words = re.findall(r"[A-Za-zА-Яа-яЁё]{4,}", re.sub(r"<[^>]+>", " ", prose))
        latin = [w for w in words if not CYRILLIC.search(w)]
        assert len(latin) < len(words) / 4, f"the Russian home page is mostly not Russian: {latin[:30]}"


def modules() -> list[str]:
    """Every public module of fsdp_mini, found on disk (what the reference must cover)."""
    names = []
    for path in sorted((ROOT / "fsdp_mini").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        if not any(p.startswith("__") for p in parts):  # `_fully_shard`, `_composable`: PyTorch's names, public here
            names.append(".".join(parts))
    return names


def reference_pages(site_dir: Path, lang: str) -> dict[str, str]:
    """The API reference's pages of one language, {folder name: html}: its index and one page per group."""
    folder = site_dir / PREFIX[lang] / "reference"
    return {p.parent.name: p.read_text(encoding="utf-8") for p in sorted(folder.glob("*/index.html"))} | {
        "": (folder / "index.html").read_text(encoding="utf-8")}


def signature_of(html: str, anchor: str) -> str:
    """The text of the signature block that follows a heading's anchor (mkdocstrings' separate_signature)."""
    start = html.index(f'id="{anchor}"')
    block = re.search(r'<div class="doc-signature.*?</div>|class="doc-signature.*?</code>', html[start:], re.S)
    assert block, f"no signature under {anchor}"
    return re.sub(r"<[^>]+>", "", block.group(0))


@pytest.mark.parametrize("lang", LANGS)
def test_api_reference_covers_every_module(site, lang):
    pages = reference_pages(site[0], lang)
    assert len(pages) >= 5, f"the reference is not split into pages: {sorted(pages)}"
    where = {m: [name for name, html in pages.items() if f'id="{m}"' in html] for m in modules()}
    missing = [m for m, found in where.items() if not found]
    assert not missing, f"modules missing from the API reference: {missing}"
    twice = {m: found for m, found in where.items() if len(found) > 1 and m != "fsdp_mini"}
    assert not twice, f"modules on more than one reference page: {twice}"
    # the library's pages come before the course's, in the navigation as in the index
    library = [where[m][0] for m in modules() if m.count(".") == 1 and ".course" not in m]
    course = [where[m][0] for m in modules() if m.startswith("fsdp_mini.course")]
    assert max(library) < min(course), (library, course)
    nav = re.findall(r'href="(?:\.\./)*(?:reference/)?([\w-]+)/"', pages[""].split("md-sidebar--secondary")[0])
    order = list(dict.fromkeys(n for n in nav if n in pages))
    assert order == sorted(order) and len(order) == len(pages) - 1, order


@pytest.mark.parametrize("lang", LANGS)
def test_api_reference_shows_constructors_and_lists(site, lang):
    html = "\n".join(reference_pages(site[0], lang).values())
    for anchor, parameters in [("fsdp_mini.fsdp.fully_sharded_data_parallel.FSDP", ["module", "sharding_strategy", "wrap", "mixed_precision"]),
                               ("fsdp_mini.parallel.ddp.DistributedDataParallel", ["module", "bucket_cap_mb"]),
                               ("fsdp_mini.optim.zero.ZeroRedundancyOptimizer", ["params", "optimizer_class"])]:
        signature = signature_of(html, anchor)
        assert all(p in signature for p in parameters), f"{anchor}: {signature}"
    index = reference_pages(site[0], lang)[""]
    package = index[index.index('id="fsdp_mini"'):]
    assert re.search(r"<ol>\s*<li>\s*<p>one process|<ol>\s*<li>one process", package), \
        "the package docstring's layers are not a list"


# --- links --------------------------------------------------------------------------------------------
class _Page(HTMLParser):
    """The ids of one HTML page and what it points to: (tag, attribute, value, rel)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.refs: list[tuple[str, str, str, str]] = []
        self.alternates: dict[str, str] = {}

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for key in ("id", "name"):
            if a.get(key) and (key == "id" or tag == "a"):
                self.ids.add(a[key])
        for key in ("href", "src"):
            if a.get(key) is not None:
                self.refs.append((tag, key, a[key], a.get("rel") or ""))
        if tag == "a" and a.get("hreflang") and "md-select__link" in (a.get("class") or ""):
            self.alternates[a["hreflang"]] = a["href"]


@functools.lru_cache(maxsize=None)
def parse(path: Path) -> _Page:
    p = _Page()
    p.feed(path.read_text(encoding="utf-8"))
    return p


def html_pages(site_dir: Path) -> list[Path]:
    return sorted(p for p in site_dir.rglob("*.html") if "assets" not in p.relative_to(site_dir).parts)


def resolve(site_dir: Path, page: Path, ref: str) -> tuple[Path, str]:
    """The file a reference in `page` lands on, and its fragment."""
    base = "/" + page.relative_to(site_dir).as_posix()
    parts = urlsplit(urljoin(base, ref))
    target = site_dir / unquote(parts.path).lstrip("/")
    if parts.path.endswith("/") or target.is_dir():
        target = target / "index.html"
    return target, unquote(parts.fragment)


def test_no_broken_internal_links_or_anchors(site):
    site_dir = site[0]
    pages = html_pages(site_dir)
    assert len(pages) >= 2 * (len(NOTEBOOKS) + 2)
    broken = []
    for page in pages:
        for tag, key, ref, _ in parse(page).refs:
            if ref == "" or re.match(r"^(https?:|mailto:|data:|javascript:|//)", ref) or ref == "#":
                continue
            target, fragment = resolve(site_dir, page, ref)
            where = f"{page.relative_to(site_dir)}: <{tag} {key}={ref!r}>"
            if not target.is_file():
                broken.append(f"{where}: no {target.relative_to(site_dir)}")
            elif fragment and target.suffix == ".html" and fragment not in parse(target).ids:
                broken.append(f"{where}: no anchor #{fragment} in {target.relative_to(site_dir)}")
    assert not broken, f"{len(broken)} broken links:\n" + "\n".join(broken[:40])


def test_nothing_is_loaded_from_outside_the_site(site):
    """Offline: no script, style sheet, font, image or frame from another host (links may leave)."""
    site_dir = site[0]
    outside = []
    for page in html_pages(site_dir):
        for tag, key, ref, rel in parse(page).refs:
            loads = tag != "a" and not (tag == "link" and rel in ("canonical", "alternate", "sitemap"))
            if loads and re.match(r"^(https?:)?//", ref):
                outside.append(f"{page.relative_to(site_dir)}: <{tag} {key}={ref!r}>")
    for css in site_dir.rglob("*.css"):
        for url in re.findall(r"url\(\s*['\"]?((?:https?:)?//[^'\")]+)", css.read_text(encoding="utf-8")):
            outside.append(f"{css.relative_to(site_dir)}: url({url})")
    assert not outside, "\n".join(outside)


@pytest.mark.parametrize("name", ["", "develop", "calculator", "reference", *NOTEBOOKS])
def test_language_switch_points_to_the_twin(site, name):
    site_dir = site[0]
    for lang, other in (("en", "ru"), ("ru", "en")):
        page = page_path(site_dir, lang, name)
        href = parse(page).alternates.get(other)
        assert href is not None, f"{page.relative_to(site_dir)} has no switch to {other}"
        target, _ = resolve(site_dir, page, href)
        assert target == page_path(site_dir, other, name), f"{page}: the switch leads to {target}"


def test_russian_navigation_is_translated(site):
    html = page_path(site[0], "ru", NOTEBOOKS[0]).read_text(encoding="utf-8")
    nav = re.search(r'md-sidebar--primary.*?md-sidebar--secondary', html, re.S).group(0)
    labels = [re.sub(r"<[^>]+>|\s+", " ", x).strip()
              for x in re.findall(r'<span class="md-ellipsis">(.*?)</span>', nav, re.S)]
    assert labels and "Главная" in labels and "Справочник API" in labels, labels
    english = [x for x in labels if x and not CYRILLIC.search(x)]
    assert len(english) <= len(labels) // 4, f"untranslated navigation entries: {english}"


# --- in a browser ----------------------------------------------------------------------------------------
class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server(site):
    handler = functools.partial(_QuietHandler, directory=str(site[0]))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


# Every host name but the test server's fails to resolve: nothing leaves the machine, and a request to another
# host fails at once instead of waiting on the network (Tab records it as a problem).
OFFLINE = "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: `apt-get install chromium` (.ci/run does in CI)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright: pip install -e '.[docs]'")
    with sync_api.sync_playwright() as p:
        # Debian's Chromium, never a browser Playwright downloads; flags that keep it off the network
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-dev-shm-usage", OFFLINE])
        yield browser
        browser.close()


class Tab:
    """One browser tab on the served site, recording console errors, page errors, failed requests,
    error responses and any request to another host (which the browser's OFFLINE rule makes fail).

    It listens to requests rather than routing them (`context.route`): routing sends every request through
    Playwright and turns off the browser's cache, so each page would fetch and compile the theme's scripts,
    fonts and MathJax anew."""

    def __init__(self, browser, base: str, width: int = 1280):
        self.base, self.problems = base, []
        self.context = browser.new_context(viewport={"width": width, "height": 900})
        self.context.on("request", self._only_local)
        self.page = self.context.new_page()
        self.page.set_default_timeout(30_000)
        self.page.on("console", lambda m: m.type == "error" and self.problems.append(f"console: {m.text}"))
        self.page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        self.page.on("requestfailed", self._failed)
        self.page.on("response", lambda r: r.status >= 400 and self.problems.append(f"{r.status}: {r.url}"))

    def _only_local(self, request):
        if not request.url.startswith((self.base, "data:")):
            self.problems.append(f"request outside the site: {request.url}")

    def _failed(self, request):
        if request.failure != "net::ERR_ABORTED":  # cut short by leaving the page: not a failure
            self.problems.append(f"failed: {request.url} ({request.failure})")

    def open(self, path: str):
        self.page.goto(self.base + path, wait_until="load")
        self.settle()

    def settle(self):
        """Wait for the page's math to be typeset (MathJax is on every page)."""
        self.page.evaluate("() => window.MathJax?.startup?.promise ?? null")

    def path(self) -> str:
        return self.page.url[len(self.base):].split("#")[0]

    def switch_to(self, lang: str, wait: bool = True):
        """Use the header's language switch as a reader does: hover, then click the language.
        wait=False: only until the browser is on the new address (the page is checked elsewhere)."""
        self.page.hover(".md-header__option .md-select")
        with self.page.expect_navigation(wait_until="load" if wait else "commit"):
            self.page.click(f'a.md-select__link[hreflang="{lang}"]')
        if wait:
            self.settle()

    def inspect(self) -> dict:
        """What the page shows now: images that did not load, formulas typeset, math errors."""
        found = self.page.evaluate("""() => ({
            broken_images: [...document.images].filter(i => !i.complete || i.naturalWidth === 0)
                                               .map(i => i.src.slice(0, 80)),
            formulas: document.querySelectorAll("mjx-container").length,
            math_errors: document.querySelectorAll("mjx-merror").length,
            copy_buttons: document.querySelectorAll(".md-code__button, clipboard-copy").length,
            lang: document.documentElement.lang,
        })""")
        found["problems"], self.problems = self.problems, []
        return found

    def close(self):
        self.context.close()


def url(lang: str, name: str) -> str:
    return PREFIX[lang] + (f"{name}/" if name else "")


def has_math(lang: str, name: str) -> bool:
    path = LESSONS / lang / f"{name}.ipynb"
    return path.exists() and bool(re.search(r"\$[^$\s][^$]*\$", "".join(
        "".join(c["source"]) for c in json.loads(path.read_text(encoding="utf-8"))["cells"]
        if c["cell_type"] == "markdown")))


@contextlib.contextmanager
def at_width(page, width: int):
    """The page as a window `width` px wide shows it, then the window as it was. Narrowing a loaded page
    gives what a fresh load at that width gives: on 2026-12-07, LAYOUT_JS's measures of all 32 layout pages
    at 390 px were equal both ways, and the screenshots equal pixel for pixel; a load costs about a CPU-second
    here, a resize a fraction of that. Two animation frames let the theme's scripts follow the resize."""
    before = page.viewport_size
    if width != before["width"]:
        page.set_viewport_size({"width": width, "height": before["height"]})
        page.evaluate(NEXT_FRAMES)
    try:
        yield
    finally:
        if width != before["width"]:
            page.set_viewport_size(before)
            page.evaluate(NEXT_FRAMES)


NEXT_FRAMES = "() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))"


@pytest.fixture(scope="module")
def browsed(site, server, browser):
    """Every page of the site, visited once in Chromium at 1440 px; each page's language switch used both ways.

    Returns {path: what inspect() found}, {name: (where the switch to ru led, where back to en led)} and, for
    the pages `layout` measures (LAYOUT_PAGES), {(width, lang, name): what LAYOUT_JS found} at every width of
    WIDTHS from the same load: the window is narrowed to each width and widened back (`at_width`).
    Screenshots of the home page, the first lesson and the calculator in each language and width go to
    test-artifacts/site/ (NAME-LANG-WIDTH.png; the home page and the lesson at 1440 also as NAME-LANG.png)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    tab, seen, switches, measured = Tab(browser, server, width=WIDTHS[0]), {}, {}, {}

    def look(lang: str, name: str, path: str):
        seen[path] = tab.inspect()
        if name in LAYOUT_PAGES and path == url(lang, name):
            shot = LAYOUT_SHOTS.get(name)
            for width in WIDTHS:
                with at_width(tab.page, width):
                    measured[(width, lang, name)] = tab.page.evaluate(LAYOUT_JS)
                    if shot:
                        tab.page.screenshot(path=str(ARTIFACTS / f"{shot}-{lang}-{width}.png"))
            if shot and shot != "calculator":
                shutil.copyfile(ARTIFACTS / f"{shot}-{lang}-{WIDTHS[0]}.png", ARTIFACTS / f"{shot}-{lang}.png")

    try:
        for name in ["", "reference", *NOTEBOOKS]:
            tab.open(url("en", name))
            look("en", name, url("en", name))
            tab.switch_to("ru")
            landed = tab.path()
            look("ru", name, landed)  # (a switch that lands elsewhere: `layout` loads the twin itself)
            tab.switch_to("en", wait=False)  # the English page was checked above
            switches[name] = (landed, tab.path())
            seen[landed]["problems"] += tab.problems
            tab.problems = []
        for page in html_pages(site[0]):  # whatever the walk above did not reach (404.html, say)
            path = page.relative_to(site[0]).as_posix().removesuffix("index.html")
            if path not in seen:
                tab.open(path)
                lang = "ru" if path.startswith(PREFIX["ru"]) else "en"
                look(lang, path.removeprefix(PREFIX[lang]).removesuffix("/"), path)
    finally:
        tab.close()
    return seen, switches, measured


@pytest.fixture(scope="module")
def tour(browsed):
    """{path: what inspect() found} for every page, {name: (where the switch to ru led, where back to en led)}."""
    seen, switches, _ = browsed
    return seen, switches


def test_every_page_loads_cleanly_in_chromium(site, tour):
    """No console error, no failed request, nothing fetched from another host, every image shown."""
    seen, _ = tour
    assert len(seen) == len(html_pages(site[0]))
    report = {path: found["problems"] + [f"image not loaded: {src}" for src in found["broken_images"]]
              for path, found in seen.items()}
    report = {path: problems for path, problems in report.items() if problems}
    assert not report, json.dumps(report, indent=1, ensure_ascii=False)


@pytest.mark.parametrize("name", ["", "reference", *NOTEBOOKS])
def test_language_switch_lands_on_the_twin_and_back(tour, name):
    seen, switches = tour
    assert switches[name] == (url("ru", name), url("en", name))
    assert seen[url("ru", name)]["lang"] == "ru" and seen[url("en", name)]["lang"] == "en"


@pytest.mark.parametrize("lang", LANGS)
def test_math_is_typeset(tour, lang):
    seen, _ = tour
    with_math = [name for name in NOTEBOOKS if has_math(lang, name)]
    assert with_math, "no lesson has math to typeset"
    for name in with_math:
        found = seen[url(lang, name)]
        assert found["formulas"] > 0 and found["math_errors"] == 0, f"{lang}/{name}: {found}"


@pytest.mark.parametrize("name", ["", *NOTEBOOKS])
def test_code_has_copy_buttons(tour, name):
    seen, _ = tour
    for lang in LANGS:
        assert seen[url(lang, name)]["copy_buttons"] > 0, f"{lang}/{name}: no copy button on the code"


def test_screenshots_are_saved(tour):
    for shot in ("home-en", "home-ru", "lesson-en", "lesson-ru"):
        assert (ARTIFACTS / f"{shot}.png").stat().st_size > 10_000, shot


def lesson_title(lang: str, name: str) -> str:
    nb = json.loads((LESSONS / lang / f"{name}.ipynb").read_text(encoding="utf-8"))
    heading = re.search(r"^# (.+)$", "".join(nb["cells"][0]["source"]), re.M).group(1)
    return re.sub(r"^[\d\s·.:-]+", "", heading)  # "00 · Why shard" -> "Why shard"


@pytest.mark.parametrize("lang", LANGS)
def test_search_finds_the_lesson_in_both_languages(browser, server, lang):
    name = NOTEBOOKS[0]
    query = lesson_title(lang, name)
    assert lang == "en" or CYRILLIC.search(query), f"the Russian lesson's title is not Russian: {query}"
    tab = Tab(browser, server)
    try:
        tab.open(url(lang, ""))
        tab.page.click("input.md-search__input")
        tab.page.keyboard.type(query)
        results = tab.page.locator(".md-search-result__item a")
        results.first.wait_for(timeout=30_000)
        hrefs = [re.split(r"[?#]", h)[0] for h in results.evaluate_all("(links) => links.map(a => a.href)")]
        assert tab.base + url(lang, name) in hrefs, f"searching {query!r} found {hrefs}"
        assert not tab.inspect()["problems"]
    finally:
        tab.close()


# --- the memory calculator (lessons/*/calculator.md, lessons/assets/calculator/calculator.js) -------------
# Each case: what a reader sets on the page, and the call of fsdp_mini.estimate_memory that must give the
# same bytes. Inputs not named keep the page's defaults: the ZeRO paper's Figure 1 (7.5e9 parameters, 64
# ranks, FULL_SHARD, bf16 parameters and gradients, Adam with fp32 state and an fp32 master copy: K = 12).
CALCULATOR_CASES = [
    ({}, (7.5e9, 64, "FULL_SHARD"), {}),
    ({"strategy": "NO_SHARD"}, (7.5e9, 64, "NO_SHARD"), {}),
    ({"strategy": "ZERO1"}, (7.5e9, 64, "ZERO1"), {}),
    ({"strategy": "SHARD_GRAD_OP"}, (7.5e9, 64, "SHARD_GRAD_OP"), {}),
    ({"params": "7B", "world": "16", "strategy": "HYBRID_SHARD", "shard": "8", "grad_dtype": "4:fp32"},
     (7_000_000_000, 16, "HYBRID_SHARD"), {"shard_size": 8, "grad_bytes": 4}),
    ({"params": "1,300,001", "world": "6", "strategy": "_HYBRID_SHARD_ZERO2", "shard": "3"},
     (1_300_001, 6, "_HYBRID_SHARD_ZERO2"), {"shard_size": 3}),
    ({"params": "125M", "world": "3", "param_dtype": "4:fp32", "grad_dtype": "4:fp32"},  # no master copy
     (125_000_000, 3, "FULL_SHARD"), {"param_bytes": 4, "grad_bytes": 4, "optimizer_bytes": 8}),
    ({"params": "1000003", "world": "7", "strategy": "ZERO1", "param_dtype": "2:fp16", "optimizer": "sgd_momentum"},
     (1_000_003, 7, "ZERO1"), {"optimizer_bytes": 8}),
    ({"params": "999", "world": "2", "strategy": "NO_SHARD", "param_dtype": "4:fp32", "grad_dtype": "4:fp32",
      "optimizer": "sgd"}, (999, 2, "NO_SHARD"), {"param_bytes": 4, "grad_bytes": 4, "optimizer_bytes": 0}),
    ({"params": "625e6", "world": "8", "strategy": "NO_SHARD", "grad_dtype": "4:fp32"},  # 1.25 GB: a tie
     (625_000_000, 8, "NO_SHARD"), {"grad_bytes": 4}),
    ({"params": "70B", "world": "1", "state_dtype": "2:bf16", "master": False},
     (70_000_000_000, 1, "FULL_SHARD"), {"optimizer_bytes": 4}),
    ({"params": "175e9", "world": "1024", "strategy": "HYBRID_SHARD", "shard": "64", "optimizer": "sgd_momentum",
      "state_dtype": "2:bf16", "master": False}, (175e9, 1024, "HYBRID_SHARD"), {"shard_size": 64, "optimizer_bytes": 2}),
    # a tensor-parallel degree: ceil(N / tp) per TP rank, then the strategy over world / tp data-parallel ranks
    ({"params": "68,976,648,192", "world": "512", "tp": "8"}, (68_976_648_192, 512, "FULL_SHARD"), {"tp": 8}),
    ({"params": "1,300,001", "world": "24", "tp": "3", "strategy": "HYBRID_SHARD", "shard": "4"},  # dp 8, groups of 4
     (1_300_001, 24, "HYBRID_SHARD"), {"tp": 3, "shard_size": 4}),
    ({"params": "7B", "world": "16", "tp": "2", "strategy": "SHARD_GRAD_OP", "grad_dtype": "4:fp32"},
     (7_000_000_000, 16, "SHARD_GRAD_OP"), {"tp": 2, "grad_bytes": 4}),
    ({"params": "1000003", "world": "4", "tp": "4", "strategy": "ZERO1"}, (1_000_003, 4, "ZERO1"), {"tp": 4}),
    ({"params": "999", "world": "6", "tp": "2", "strategy": "NO_SHARD", "param_dtype": "4:fp32",
      "grad_dtype": "4:fp32"}, (999, 6, "NO_SHARD"), {"tp": 2, "param_bytes": 4, "grad_bytes": 4, "optimizer_bytes": 8}),
]
RU_UNITS = {"B": "Б", "kB": "кБ", "MB": "МБ", "GB": "ГБ", "TB": "ТБ", "PB": "ПБ"}


def shown_size(nbytes: int, lang: str) -> str:
    """fsdp_mini.format_bytes, as the page in `lang` writes it."""
    from fsdp_mini.byte_format import format_bytes

    number, unit = format_bytes(nbytes).split(" ")
    return f"{number} {unit}" if lang == "en" else f"{number.replace('.', ',')} {RU_UNITS[unit]}"


SET_INPUTS_JS = r"""([reset, steps]) => {
  // What a reader does, in one call instead of one Playwright action per field: the reset button is clicked,
  // then each field is set in order and sends the events Playwright's own actions send (and the page listens
  // to): fill -> input; select_option -> input, change; set_checked -> a click (input, change). As those
  // actions would, it refuses a field a reader could not change: hidden, disabled, read-only, no such option.
  document.querySelector(reset).click();
  for (const [selector, value] of steps) {
    const e = document.querySelector(selector);
    if (!e) throw new Error(`no ${selector} on the page`);
    if (e.disabled || e.readOnly || !e.checkVisibility()) throw new Error(`${selector} cannot be changed: ` +
                                                                          `disabled, read-only or hidden`);
    if (e.type === 'checkbox') {
      if (e.checked !== value) e.click();
      if (e.checked !== value) throw new Error(`clicking ${selector} did not change it`);
    } else if (e.tagName === 'SELECT') {
      if (![...e.options].some(o => o.value === value)) throw new Error(`${selector} has no option ${value}`);
      e.value = value;
      e.dispatchEvent(new Event('input', {bubbles: true, composed: true}));
      e.dispatchEvent(new Event('change', {bubbles: true}));
    } else {
      e.value = value;
      e.dispatchEvent(new InputEvent('input', {bubbles: true, composed: true, inputType: 'insertText', data: value}));
    }
  }
}"""


def set_inputs(page, reset: str, steps: list[tuple[str, str | bool]]) -> None:
    """Click `reset`, then set each (selector, value) in order as a reader would (SET_INPUTS_JS)."""
    page.evaluate(SET_INPUTS_JS, [reset, [list(step) for step in steps]])


def set_calculator(page, inputs: dict) -> None:
    set_inputs(page, "#mc-reset", [("#mc-" + key.replace("_", "-"), value) for key, value in inputs.items()])


def read_calculator(page) -> dict:
    """What the calculator shows: its result rows, the Python call, the errors and its whole text."""
    return page.evaluate("""() => ({
        rows: Object.fromEntries([...document.querySelectorAll('#mc-result tr')].map(
            tr => [tr.dataset.state, {bytes: tr.querySelector('.mc-bytes').dataset.bytes,
                                      size: tr.querySelector('.mc-size').textContent,
                                      exact: tr.querySelector('.mc-bytes').textContent}])),
        call: document.querySelector('#mc-call')?.textContent ?? null,
        errors: document.querySelectorAll('#memory-calculator .mc-error').length,
        results: document.querySelectorAll('#mc-result').length,
        text: document.querySelector('#memory-calculator').textContent,
    })""")


@pytest.fixture(scope="module")
def calculator_page(browser, server):
    """The calculator page of a language, loaded once for the tests of its two tools (the memory calculator,
    the planner): a function lang -> Tab, opening the page on first use. Each test starts from its tool's
    reset button and ends by checking the tab's problems since the test before it."""
    tabs = {}

    def tab(lang: str) -> Tab:
        if lang not in tabs:
            tabs[lang] = Tab(browser, server)
            tabs[lang].open(url(lang, "calculator"))
        return tabs[lang]

    yield tab
    for opened in tabs.values():
        opened.close()


@pytest.mark.parametrize("lang", LANGS)
def test_memory_calculator_equals_estimate_memory(calculator_page, lang):
    from fsdp_mini import estimate_memory

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    tab = calculator_page(lang)
    figure = tab.page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('#mc-all tr[data-strategy]')]
        .map(tr => [tr.dataset.strategy, tr.querySelector('.mc-size').textContent]))""")
    paper = {"NO_SHARD": "120.0 GB", "ZERO1": "31.4 GB", "SHARD_GRAD_OP": "16.6 GB", "FULL_SHARD": "1.9 GB"}
    if lang == "ru":
        paper = {k: v.replace(".", ",").replace("GB", "ГБ") for k, v in paper.items()}
    assert {k: figure[k].replace("\xa0", " ") for k in paper} == paper, "the default is not ZeRO's Figure 1"
    tab.page.screenshot(path=str(ARTIFACTS / f"calculator-{lang}.png"), full_page=True)
    for inputs, args, kwargs in CALCULATOR_CASES:
        set_calculator(tab.page, inputs)
        found = read_calculator(tab.page)
        shown = found["rows"]
        expected = estimate_memory(*args, **kwargs)
        for state in ("params", "grads", "optimizer", "total"):
            nbytes = getattr(expected, state)
            where = f"{lang} {inputs} {state}"
            assert int(shown[state]["bytes"]) == nbytes, where
            assert shown[state]["size"].replace("\xa0", " ") == shown_size(nbytes, lang), where
            sep = "," if lang == "en" else "\xa0"
            assert shown[state]["exact"] == f"{nbytes:,}".replace(",", sep) + "\xa0" + ("B" if lang == "en" else "Б")
        call = found["call"]
        assert "estimate_memory(" in call
        tp = kwargs.get("tp", 1)
        assert (f", tp={tp})" in call) if tp > 1 else ("tp=" not in call), call
    # a shard group that does not divide the world: Python refuses, and so does the page
    set_calculator(tab.page, {"world": "16", "strategy": "HYBRID_SHARD", "shard": "5"})
    with pytest.raises(ValueError):
        estimate_memory(7.5e9, 16, "HYBRID_SHARD", shard_size=5)
    found = read_calculator(tab.page)
    assert found["errors"] == 1
    assert found["results"] == 0
    # a TP degree that does not divide the world, and a shard group that does not divide world / tp
    for inputs, kwargs in [({"world": "16", "tp": "3"}, {"tp": 3}),
                           ({"world": "16", "tp": "4", "strategy": "HYBRID_SHARD", "shard": "8"},
                            {"tp": 4, "shard_size": 8})]:
        set_calculator(tab.page, inputs)
        with pytest.raises(ValueError):
            estimate_memory(7.5e9, int(inputs["world"]), inputs.get("strategy", "FULL_SHARD"), **kwargs)
        found = read_calculator(tab.page)
        assert found["errors"] == 1, inputs
        assert found["results"] == 0, inputs
    set_calculator(tab.page, {"world": "16", "tp": "3"})
    text = read_calculator(tab.page)["text"]
    if lang == "ru":
        assert "Размер группы шардирования" in text and "Число рангов (GPU)" in text and "World size" not in text
        assert "Степень TP должна быть целым числом" in text and "тензорного параллелизма" in text
    else:
        assert "TP degree must be a whole number" in text and "Tensor-parallel degree" in text
    assert not tab.inspect()["problems"]


# --- the planner (lessons/*/calculator.md, lessons/assets/calculator/planner.js and planner_page.js) --------
# Each case: what a reader sets on the page; inputs not named keep the page's start (fsdp_mini.course.
# planner_site.site_data()["start"]: torchtitan's Llama 3 8B run on 64 A100). Python's numbers come from the CLI,
# `python -m fsdp_mini plan ... --json` and `--compare --json`, run in this process; a custom model from
# `custom_model` and `plan` / `compare`, as the page's Python snippet says.
PLANNER_CASES = [
    {},
    {"ac": "selective-op"},
    {"ac": "full", "local_batch": "2", "micro_batches": "2"},
    {"model": "llama2-13b", "seq": "4096", "local_batch": "2", "ac": "none"},
    {"model": "llama3-70b", "gpu": "h100-sxm", "gpus": "256", "tp": "8", "sp": True, "local_batch": "16", "ac": "full",
     "compile": True},  # TP with SP, compiled
    {"model": "llama3-8b", "gpu": "h100-96gb", "tp": "8", "sp": True, "local_batch": "12", "ac": "selective-op",
     "compile": True, "float8": True, "compile_loss": True},  # float8, the loss compiled
    {"model": "llama3-70b", "gpu": "h200", "gpus": "128", "seq": "32768", "tp": "8", "sp": True, "cp": "4", "ac": "full"},
    {"model": "llama2-7b", "gpu": "h100-sxm", "seq": "4096", "local_batch": "4", "dp_replicate": "4",
     "micro_batches": "2", "ac": "selective-op"},  # HSDP
    {"model": "gpt2-xl", "gpus": "8", "seq": "1024", "local_batch": "16", "micro_batches": "4", "ac": "none", "compile": True},
    {"model": "gpt2", "gpu": "h100-sxm", "gpus": "2", "gpus_per_node": "2", "seq": "1024", "local_batch": "8", "tp": "2",
     "sp": True, "ac": "selective-op"},
    {"model": "llama3-405b", "gpu": "h100-sxm", "gpus": "512", "tp": "8", "sp": True, "cp": "2", "dp_replicate": "2",
     "ac": "full", "float8": True},  # every degree at once
    {"model": "llama2-70b", "seq": "4096", "local_batch": "2", "ac": "full"},
    {"model": "gpt2-medium", "gpu": "h200", "gpus": "16", "gpus_per_node": "4", "seq": "2048", "local_batch": "4",
     "cp": "2", "ac": "selective-layer"},  # CP across nodes of 4
    {"gpu": "h100-sxm", "gpus": "16", "local_batch": "3", "cp": "2", "dp_replicate": "2", "ac": "none"},  # HSDP x CP
    {"model": "llama3-8b", "gpus": "8", "local_batch": "4", "tp": "2", "ac": "none"},  # TP without SP; does not fit
    {"model": "custom", "family": "gpt2", "hidden": "2048", "layers": "24", "heads": "16", "kv_heads": "16",
     "ffn": "8192", "vocab": "50257", "gpus": "16", "seq": "2048", "local_batch": "8", "ac": "none"},
    {"model": "custom", "family": "llama3-8b", "hidden": "3072", "layers": "28", "heads": "24", "kv_heads": "8",
     "ffn": "8192", "vocab": "128256", "gpus": "32", "tp": "4", "seq": "4096", "local_batch": "2", "ac": "full"},
]
# Bad input: the page shows the error Python raises (argparse's for a value that is not an integer)
PLANNER_ERRORS = [
    {"gpus": "abc"}, {"seq": "8192.5"}, {"gpus": "0"}, {"micro_batches": "-1"}, {"gpus": "12", "tp": "8"},
    {"gpus": "12"}, {"sp": True}, {"gpus": "48", "cp": "3"}, {"cp": "2", "seq": "8194"},
    {"local_batch": "3", "micro_batches": "2"}, {"tp": "8", "sp": True, "seq": "8196"}, {"gpus": "48", "tp": "3"},
    {"float8": True}, {"tp": "8", "gpus_per_node": "4"},
    {"model": "custom", "heads": "7"}, {"model": "custom", "kv_heads": "5"}, {"model": "custom", "hidden": "0"},
    {"model": "custom", "vocab": "lots"}, {"model": "custom", "layers": "2", "tp": "8", "ffn": "1001"},
]
PLANNER_INTS = ("gpus", "gpus_per_node", "dp_replicate", "tp", "cp", "seq", "local_batch", "micro_batches")
PLANNER_SHAPES = ("hidden", "layers", "heads", "kv_heads", "ffn", "vocab")
PLANNER_FLAGS = ("sp", "float8", "compile", "compile_loss")


def planner_inputs(case: dict) -> dict:
    """Every input of the page for `case`: the page's start, the case's changes, a preset's shapes."""
    from fsdp_mini.course.planner_site import site_data

    data = site_data()
    start, defaults = data["start"], data["layout_defaults"]
    out = {k: str(defaults.get(k, "")) for k in PLANNER_INTS} | {k: defaults[k] for k in PLANNER_FLAGS}
    out |= {"ac": defaults["ac"]} | {k: (v if isinstance(v, bool) else str(v)) for k, v in start.items()
                                     if not k.startswith("published")}
    model = data["models"][start["model"]]
    out |= {"family": "llama3-8b"} | {k: str(model[k]) for k in PLANNER_SHAPES}
    return out | case


def _cli(argv: list[str]):
    """`python -m fsdp_mini plan ARGV`, in this process: (parsed JSON, None) or (None, argparse's error message)."""
    import contextlib
    import io

    from fsdp_mini.course.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(["plan", *argv])
        except SystemExit:
            return None, err.getvalue().strip().splitlines()[-1].split(": error: ", 1)[1]
    return json.loads(out.getvalue()), None


@functools.lru_cache(maxsize=None)
def _python_planner(frozen: tuple) -> tuple:
    """(plan's to_dict, the ranking as --compare --json prints it, None), or (None, None, the error message)."""
    from fsdp_mini.course.planner import Layout, custom_model, get_gpu, plan
    from fsdp_mini.course.planner.compare import compare, describe
    from fsdp_mini.course.planner_site import site_data

    v = dict(frozen)
    argv = ["--model", "llama3-8b" if v["model"] == "custom" else v["model"], "--gpu", v["gpu"]]
    for k in PLANNER_INTS:  # the order the CLI defines them in, which is the order argparse reads them in
        argv += [f"--{k.replace('_', '-')}", v[k]]
    argv += ["--ac", v["ac"]] + [f"--{k.replace('_', '-')}" for k in PLANNER_FLAGS if v[k]]
    if v["model"] != "custom":
        one, error = _cli(argv + ["--json"])
        if error:
            return None, None, error
        return one, _cli(argv + ["--compare", "--json"])[0], None
    # custom_model takes what the page read: an integer, or the text as it was typed
    _, error = _cli(argv + ["--json"]) if not all(re.fullmatch(r"\s*[+-]?\d+\s*", v[k]) for k in PLANNER_INTS) else (0, None)
    if error:
        return None, None, error
    family = site_data()["models"][v["family"]]
    shapes = {k: int(v[k]) if re.fullmatch(r"\s*[+-]?\d+\s*", v[k]) else v[k] for k in PLANNER_SHAPES}
    try:
        model = custom_model("custom", **shapes, **{k: family[k] for k in ("mlp", "norm", "bias", "tied", "positions")})
        layout = Layout(**{k: int(v[k]) for k in PLANNER_INTS}, ac=v["ac"], **{k: v[k] for k in PLANNER_FLAGS})
        gpu = get_gpu(v["gpu"])
        result = plan(model, gpu, layout).to_dict()
        ranked = [{"rank": c.rank, "summary": describe(c.plan.layout), "why": c.why} | c.plan.to_dict()
                  for c in compare(model, gpu, layout)]
    except ValueError as exc:
        return None, None, str(exc)
    return result, ranked, None


def python_planner(case: dict) -> tuple:
    return _python_planner(tuple(sorted(planner_inputs(case).items())))


def set_planner(page, case: dict) -> None:
    inputs = dict(case)
    steps = [("#pl-model", inputs.pop("model"))] if "model" in inputs else []  # first: a preset fills the shapes
    set_inputs(page, "#pl-reset", steps + [("#pl-" + key.replace("_", "-"), value) for key, value in inputs.items()])


READ_PLANNER_JS = """(full) => {
    const text = selector => document.querySelector(selector)?.textContent ?? null;
    const state = window.planner.state();
    if (!full && state.ranked) {  // the ranking's first rows, as the page shows them, and its length
        state.ranked_count = state.ranked.length;
        state.ranked = state.ranked.slice(0, 12);
    }
    return {
        state: state,
        memory: Object.fromEntries([...document.querySelectorAll('#pl-memory tr')]
            .map(tr => [tr.dataset.key, [tr.cells[0].textContent, tr.querySelector('.pl-num').textContent]])),
        times: Object.fromEntries([...document.querySelectorAll('#pl-time tr')]
            .map(tr => [tr.dataset.key, tr.querySelector('.pl-num').textContent])),
        rate: text('#pl-rate'),
        verdict: text('#pl-verdict'),
        rows: [...document.querySelectorAll('#pl-rank tr[data-rank]')].map(tr => [...tr.cells].map(td => td.textContent)),
        text: text('#planner'),
        errors: document.querySelectorAll('#pl-error').length,
        rankings: document.querySelectorAll('#pl-rank').length,
        error: text('#pl-error'),
        error_key: document.querySelector('#pl-error')?.getAttribute('data-key') ?? null,
    };
}"""


def read_planner(page, full_ranking: bool = True) -> dict:
    """What the planner shows, in one call: window.planner.state(), its tables, texts and error. Without
    `full_ranking` the state carries the ranking's first 12 layouts and `ranked_count` (the page's JSON of
    every layout is what takes the time; tests/site/test_planner_port.py compares all of it)."""
    return evaluate_as_json(page, f"() => ({READ_PLANNER_JS})({'true' if full_ranking else 'false'})")


NON_FINITE = "\u0000non-finite"


def evaluate_as_json(page, function: str):
    """page.evaluate(function), the result carried as one JSON text: the planner's state (every layout it ranks,
    ~400 kB) takes Playwright ~15x longer to carry value by value. Values come back as page.evaluate gives them:
    undefined as None, and NaN and the infinities as floats (JSON has neither)."""
    text = page.evaluate(f"""() => JSON.stringify(({function})(), (key, value) =>
        value === undefined ? null
        : typeof value === 'number' && !Number.isFinite(value) ? {{{json.dumps(NON_FINITE)}: String(value)}} : value)""")
    return json.loads(text, object_hook=lambda d: float(d[NON_FINITE]) if NON_FINITE in d else d)


def shown_number(value: float, digits: int, lang: str) -> str:
    """fsdp_mini.course.language.num in the page's language."""
    from fsdp_mini.course import language

    before = language.get_language()
    language.set_language(lang)
    try:
        return language.num(value, digits)
    finally:
        language.set_language(before)


def test_planner_page_carries_site_data(site):
    """The numbers the page's JavaScript uses are Python's: the built page holds exactly site_data()."""
    from fsdp_mini.course.planner_site import site_data

    expected = json.loads(json.dumps(site_data()))
    for lang in LANGS:
        html = page_path(site[0], lang, "calculator").read_text(encoding="utf-8")
        found = re.search(r'<script id="planner-data">window\.PLANNER_DATA = (.*?);</script>', html, re.S)
        assert found, lang
        assert json.loads(found.group(1).replace("<\\/", "</")) == expected, lang
    js = (LESSONS / "assets" / "calculator" / "planner.js").read_text(encoding="utf-8")
    for number in ("0.729", "0.604", "0.246", "312e12", "989e12", "1.02", "2.5", "128256", "14336"):
        assert number not in js, f"planner.js restates {number}: it belongs in PLANNER_DATA"


@pytest.mark.parametrize("lang", LANGS)
def test_planner_equals_python(calculator_page, lang):
    """Every number of plan --json and of plan --compare --json, bit for bit, on each case; the page's tables
    print them as the course prints numbers in the page's language."""
    from fsdp_mini.course.planner import Layout
    from fsdp_mini.course.planner.compare import describe

    from fsdp_mini.course.planner import Checkpointing

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    full = [planner_inputs(case) for case in PLANNER_CASES]
    assert len(full) >= 12
    assert {c["ac"] for c in full} == {mode.value for mode in Checkpointing}
    for what in (lambda c: int(c["tp"]) > 1 and c["sp"], lambda c: int(c["tp"]) > 1 and not c["sp"],
                 lambda c: int(c["cp"]) > 1, lambda c: int(c["dp_replicate"]) > 1, lambda c: int(c["micro_batches"]) > 1,
                 lambda c: c["float8"], lambda c: c["compile"], lambda c: c["compile_loss"],
                 lambda c: c["model"] == "custom"):
        assert any(what(c) for c in full)
    tab = calculator_page(lang)
    tab.page.locator("#planner").screenshot(path=str(ARTIFACTS / f"planner-{lang}.png"))
    published = tab.page.text_content("#planner .pl-published")
    assert shown_number(2904, 0, lang) in published, published
    # English: every case; Russian (what it adds is the language of the same numbers): the first seven, which
    # hold every kind of row the page words differently
    for case in PLANNER_CASES if lang == "en" else PLANNER_CASES[:7]:
        expected, ranked, error = python_planner(case)
        assert error is None, (case, error)
        set_planner(tab.page, case)
        # every layout of the first cases once (the port test, tests/site/test_planner_port.py, compares all of
        # every case): carrying the page's JSON of thousands of layouts is what takes the time
        full = lang == "en" and PLANNER_CASES.index(case) < 4
        shown = read_planner(tab.page, full_ranking=full)
        state = shown["state"]
        assert "error" not in state, (case, state.get("error"))
        assert state["plan"] == expected, case
        if full:
            assert state["ranked"] == ranked, case
        else:
            assert state["ranked"] == ranked[:12] and state["ranked_count"] == len(ranked), case
        # what the page prints
        memory = shown["memory"]
        for key, gib in expected["memory"].items():
            assert memory[key][1] == shown_number(gib, 2, lang), (case, key)
        assert memory["peak_reserved"][1] == shown_number(expected["memory_gib"], 2, lang)
        assert memory["peak_allocated"][1] == shown_number(expected["memory_allocated_gib"], 2, lang)
        times = shown["times"]
        for key, seconds in expected["step_parts_s"].items():
            assert times[key] == shown_number(seconds, 3, lang), (case, key)
        assert times["step"] == shown_number(expected["step_s"], 3, lang)
        rate = shown["rate"]
        assert shown_number(expected["tokens_per_s_per_gpu"], 0, lang) in rate, rate
        assert shown_number(expected["mfu"] * 100, 1, lang) in rate, rate
        verdict = shown["verdict"]
        assert shown_number(expected["memory_gib"], 1, lang) in verdict
        assert all(shown_number(gib, 1, lang) in verdict for gib in expected["memory_band_gib"]), verdict
        assert verdict.startswith({"en": {"fits": "Fits", "undecided": "Undecided", "does not fit": "Does not fit"},
                                   "ru": {"fits": "Помещается", "undecided": "Неясно",
                                          "does not fit": "Не помещается"}}[lang][expected["verdict"]]), verdict
        if not expected["fits"]:
            assert shown_number(expected["short_by_gib"], 1, lang) in verdict
        rows = shown["rows"]
        assert len(rows) == min(12, len(ranked))
        for row, want in zip(rows, ranked):
            assert row[0] == (str(want["rank"]) if want["rank"] else "–")
            assert row[2:5] == [shown_number(want["memory_gib"], 1, lang),
                                shown_number(want["tokens_per_s_per_gpu"], 0, lang),
                                shown_number(want["mfu"] * 100, 1, lang)], (case, want["layout"])
            described = want["summary"]
            assert described == describe(Layout(**{k: v for k, v in want["layout"].items() if k != "dp_shard"}))
            if lang == "en":
                assert row[1] == described and row[5] == want["why"], (case, row)
            else:
                assert row[1] == re.sub(r" in (\d+) micro-batches", r" в \1 микробатчах",
                                        described.replace(", batch ", ", батч ")).replace(
                    " (sync the last)", " (синхронизация на последнем)").replace(" overlapped", " с перекрытием"), row
                assert CYRILLIC.search(row[5]), row
        text = shown["text"]
        assert "undefined" not in text and "NaN" not in text, case
        if lang == "ru":
            assert "ГиБ" in text and "GiB" not in text
        if case == PLANNER_CASES[6]:
            tab.page.locator("#planner").screenshot(path=str(ARTIFACTS / f"planner-cp-{lang}.png"))
    assert not tab.inspect()["problems"]


@pytest.mark.parametrize("lang", LANGS)
def test_planner_refuses_what_python_refuses(calculator_page, lang):
    """Bad input: the English page shows Python's own message; the Russian page the same message in Russian,
    with every option, number and name of Python's."""
    tab = calculator_page(lang)
    seen = set()
    for case in PLANNER_ERRORS:
        _, _, error = python_planner(case)
        assert error, case
        set_planner(tab.page, case)
        found = read_planner(tab.page)
        assert found["errors"] == 1, case
        assert found["rankings"] == 0, case
        shown = found["error"]
        state = found["state"]
        assert state["error"]["en"] == error, case  # word for word, in either page's language
        if lang == "en":
            assert shown == error, case
        else:
            assert shown == state["error"]["ru"] and CYRILLIC.search(shown), case
            for token in re.findall(r"--[a-z0-9-]+|'[^']*'|(?<![\w.])\d+(?![\w.])", error):
                assert token in shown, (case, token, shown)
        seen.add(found["error_key"])
    assert len(seen) >= 15, seen  # the cases reach that many of Python's distinct checks
    tab.page.click("#pl-reset")
    assert read_planner(tab.page)["errors"] == 0
    assert not tab.inspect()["problems"]


# --- search, one index per language (lessons/_site/search_per_language.py) -------------------------------
TEX = re.compile(r"\$[^$\s][^$]*\$|\\\(|\\\[|\\(frac|cdot|alpha|beta|Psi|lceil|approx)\b")


def outside_code(html: str) -> str:
    return re.sub(r"<code\b.*?</code>|<pre\b.*?</pre>", "", html, flags=re.S)


@pytest.mark.parametrize("lang", LANGS)
def test_search_index_per_language(site, lang):
    site_dir = site[0]
    index = json.loads((site_dir / PREFIX[lang] / "search" / "search_index.json").read_text(encoding="utf-8"))
    docs = index["docs"]
    pages = {d["location"].split("#")[0] for d in docs}
    assert url(lang, NOTEBOOKS[0]) [len(PREFIX[lang]):] in pages and "reference/" in pages, sorted(pages)
    for location in pages:  # relative to the language's root, and landing on a page of that language
        assert not location.startswith(tuple(f"{x}/" for x in LANGS)), location
        assert (site_dir / PREFIX[lang] / location / "index.html").is_file() or location == "", location
    stray = [d["title"] for d in docs if "¶" in d["title"] + d["text"]]
    assert not stray, f"permalink signs in the index: {stray[:5]}"
    noise = [d["location"] for d in docs if re.search(r"Copied!|In\s\[\d*\]:", d["text"])]
    assert not noise, f"notebook prompts or copy-button text in the index: {noise[:5]}"
    tex = [(d["location"], TEX.search(outside_code(d["title"] + " " + d["text"])).group(0))
           for d in docs if TEX.search(outside_code(d["title"] + " " + d["text"]))]
    assert not tex, f"raw TeX in the index: {tex[:5]}"
    titles = " ".join(d["title"] for d in docs)
    assert (CYRILLIC.search(titles) is not None) == (lang == "ru")


@pytest.mark.parametrize("lang", LANGS)
def test_search_results_stay_in_the_page_language(browser, server, lang):
    """A term both languages use: the results come from this language's pages only, as readable text."""
    tab = Tab(browser, server)
    try:
        tab.open(url(lang, NOTEBOOKS[0]))
        tab.page.click("input.md-search__input")
        tab.page.keyboard.type("ZeRO")
        results = tab.page.locator(".md-search-result__item a")
        results.first.wait_for(timeout=30_000)
        hrefs = results.evaluate_all("(links) => links.map(a => a.href)")
        assert len(hrefs) >= 3
        here = tab.base + PREFIX[lang]
        wrong = [h for h in hrefs if not h.startswith(here) or (lang == "en" and h.startswith(tab.base + "ru/"))]
        assert not wrong, f"results from another language on a {lang} page: {wrong}"
        shown = tab.page.text_content(".md-search-result")
        assert "¶" not in shown and not re.search(r"\$[^$\s][^$]*\$", shown), shown[:500]
        assert lang == "en" or CYRILLIC.search(shown)
        tab.page.screenshot(path=str(ARTIFACTS / f"search-{lang}.png"))
        results.first.click()
        tab.page.wait_for_load_state("load")
        assert tab.page.url.startswith(here) and tab.page.evaluate("document.documentElement.lang") == lang
        assert not tab.inspect()["problems"]
    finally:
        tab.close()


def test_russian_pages_have_russian_theme_strings(site):
    """The copy button, search and footer speak Russian on the Russian pages (material's `ru`), and the
    strings material has no translation for are translated by the site's hooks."""
    site_dir = site[0]
    for name in ["", "calculator", "reference", NOTEBOOKS[0]]:
        html = page_path(site_dir, "ru", name).read_text(encoding="utf-8")
        config = json.loads(re.search(r'<script id="__config" type="application/json">(.*?)</script>', html, re.S).group(1))
        assert config["translations"]["clipboard.copy"] == "Копировать в буфер", config["translations"]
        assert CYRILLIC.search(config["translations"]["search.result.none"])
        assert "Permanent link" not in html and "Made with" not in html, name
        footer = re.search(r'<footer class="md-footer">.*?</footer>', html, re.S).group(0)
        assert CYRILLIC.search(re.sub(r"<[^>]+>", "", footer)), name



# --- lesson pages: layout, plumbing, figures, running them (issue 14) ------------------------------------
# lessons/assets/layout/lessons.css widens the column; lessons/_site/lesson_view.py hides the plumbing;
# lessons/_site/lesson_files.py writes figures as files and adds the download / Colab buttons;
# fsdp_mini/course/viz/display.py stores figures at 2x with their title as alt text.
CODE_LINE_LIMIT = 100  # characters of a code line that fit the code column at 1440 px (~110 measured)
FENCED_PYTHON = re.compile(r"^[ \t]*```(?:python|py)[ \t]*\n(.*?)\n[ \t]*```", re.M | re.S)
WIDTHS = (1440, 390)


def notebook_cells(lang: str, name: str) -> list[dict]:
    return json.loads((LESSONS / lang / f"{name}.ipynb").read_text(encoding="utf-8"))["cells"]


def cell_source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_code_lines_fit_the_code_column(lang, name):
    """Code cells, and the Python blocks of the prose, keep to CODE_LINE_LIMIT characters a line."""
    long = []
    for i, cell in enumerate(notebook_cells(lang, name)):
        code = cell_source(cell) if cell["cell_type"] == "code" else "\n".join(
            FENCED_PYTHON.findall(cell_source(cell)) if cell["cell_type"] == "markdown" else [])
        long += [f"cell {i}: {len(line)} chars: {line.strip()[:60]}" for line in code.split("\n")
                 if len(line) > CODE_LINE_LIMIT]
    assert not long, f"{lang}/{name}: over {CODE_LINE_LIMIT} characters (wrap them alike in both " \
                     f"twins, e.g. with black --line-length {CODE_LINE_LIMIT}):\n" + "\n".join(long)


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_lesson_pages_hide_the_plumbing(site, lang, name):
    """No language line, no assert-only cell, no nbval marker; the imports and every source listing folded,
    a listing's code shown once per page (lessons/_site/lesson_view.py)."""
    html = page_path(site[0], lang, name).read_text(encoding="utf-8")
    assert "celltag_language" not in html and 'set_language("' not in html, "the language line is shown"
    assert "NBVAL_" not in html, "an nbval marker is shown"
    for cell in notebook_cells(lang, name):
        code = cell_source(cell)
        if cell["cell_type"] == "code" and not cell["outputs"] and code.strip() and all(
                line.lstrip().startswith(("assert ", "#")) or not line.strip() or line.startswith(" ")
                for line in code.splitlines()) and code.lstrip().startswith("assert "):
            first = escape(code.strip().splitlines()[0][:40], quote=False)
            assert first not in re.sub(r"<[^>]+>", "", html), f"an assert-only cell is shown: {first}"
    imports = re.findall(r'<details class="lesson-imports"><summary>([^<]+)</summary>', html)
    assert len(imports) == 1, "the import block is not folded"
    assert (CYRILLIC.search(imports[0]) is not None) == (lang == "ru"), imports
    stored = sum(bool(re.match(r"\s*```python\n", "".join(o.get("data", {}).get("text/markdown", ""))))
                 for c in notebook_cells(lang, name) if c["cell_type"] == "code" for o in c["outputs"])
    listings = re.findall(r'<details class="source-listing" id="([^"]+)"><summary>(.*?)</summary>\s*'
                          r'<div class="language-python highlight"><pre><span></span><code>(.*?)</code></pre>',
                          html, re.S)
    shown_again = re.findall(r'<p class="source-shown"><a href="#([^"]+)"', html)
    assert len(listings) + len(shown_again) == stored, "a source listing is not folded"
    codes = [code for _, _, code in listings]
    assert len(codes) == len(set(codes)), "the same source is listed twice on the page"
    assert set(shown_again) <= {anchor for anchor, _, _ in listings}
    for _, summary, _ in listings:
        assert re.search(r"<code>[^<]+</code> · \d+ (lines?|строк[аи]?)$", summary), summary


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_each_lesson_can_be_downloaded(site, lang, name):
    """A download button for the notebook itself; with no REPO_URL (as here) no Colab button, no repository
    link, and the notebook unchanged (lesson_files.py adds the install cell only for a known repository)."""
    page = page_path(site[0], lang, name)
    html = page.read_text(encoding="utf-8")
    link = re.search(r'<a class="md-button lesson-download" href="([^"]+)" download', html)
    assert link, "no download button"
    target, _ = resolve(site[0], page, link.group(1))
    assert target.read_bytes() == (LESSONS / lang / f"{name}.ipynb").read_bytes()
    assert "lesson-colab" not in html and "md-source" not in html, "a repository link with no REPO_URL"


def test_repository_and_colab_from_repo_url(monkeypatch, tmp_path):
    """With REPO_URL set (the Pages workflow): Colab opens the published copy on the hosted branch, and
    that copy (also the downloaded one) starts with the install cell, the lesson unchanged after it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("lesson_files", LESSONS / "_site" / "lesson_files.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setenv("REPO_URL", "https://github.com/someone/fsdp-from-scratch.git")
    repo = module.repository()
    assert repo == "https://github.com/someone/fsdp-from-scratch"
    assert module.colab_url(repo, "lessons/ru/00_why_shard.ipynb") == (
        "https://colab.research.google.com/github/someone/fsdp-from-scratch/blob/"
        f"{module.HOSTED_BRANCH}/lessons/ru/00_why_shard.ipynb")
    assert module.colab_url("https://gitlab.com/someone/fsdp-from-scratch", "lessons/en/x.ipynb") is None
    written = module.write_hosted_notebooks(ROOT, tmp_path, repo)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in written) == sorted(
        f"lessons/{lang}/{name}.ipynb" for lang in LANGS for name in NOTEBOOKS)
    for lang in LANGS:
        nb = json.loads((tmp_path / "lessons" / lang / f"{NOTEBOOKS[0]}.ipynb").read_text(encoding="utf-8"))
        first = cell_source(nb["cells"][0])
        assert 'find_spec("fsdp_mini") is None' in first and f"git+{repo}" in first
        assert nb["cells"][1:] == notebook_cells(lang, NOTEBOOKS[0])
    monkeypatch.delenv("REPO_URL")
    assert module.repository() is None


LAYOUT_JS = r"""() => {
  const article = document.querySelector('article');
  const visible = e => e.checkVisibility();  // not inside a closed <details>
  const code = [...article.querySelectorAll('.jp-InputArea-editor pre, .jp-RenderedMarkdown pre, .highlight pre')]
    .filter((e, i, all) => all.indexOf(e) === i && visible(e) && !e.closest('.jp-OutputArea'));
  const outputs = [...article.querySelectorAll('.jp-RenderedText pre')].filter(visible);
  const lang = document.documentElement.lang;
  return {
    sideways: document.documentElement.scrollWidth - document.documentElement.clientWidth,
    code: code.length,
    code_scrolling: code.filter(e => e.scrollWidth > e.clientWidth + 1)
                        .map(e => e.textContent.split('\n').reduce((a, b) => b.length > a.length ? b : a, '').slice(0, 70)),
    outputs: outputs.length,
    outputs_wrapped: outputs.filter(e => {
      const style = getComputedStyle(e);
      const lines = e.textContent.replace(/\n$/, '').split('\n').length;
      return style.whiteSpace !== 'pre' || e.getBoundingClientRect().height > (lines + 0.5) * parseFloat(style.lineHeight);
    }).length,
    images: [...article.querySelectorAll('img')].map(i => i.alt),
    zoomable: [...article.querySelectorAll('.jp-RenderedImage img')].filter(i => i.closest('a.glightbox')).length,
    column: Math.round(article.getBoundingClientRect().width),
    lang,
  };
}"""


LAYOUT_PAGES = ("", "calculator", *NOTEBOOKS)
LAYOUT_SHOTS = {"": "home", "calculator": "calculator", NOTEBOOKS[0]: "lesson"}


@pytest.fixture(scope="module")
def layout(browsed, server, browser):
    """Every lesson, the home pages and the calculator at 1440 and 390 px, both languages: what LAYOUT_JS
    measures, {(width, lang, name): found}; screenshots of the home page, the first lesson and the
    calculator at each width go to test-artifacts/site/ (NAME-LANG-WIDTH.png). The tour (`browsed`) measured
    them as it passed; a page it did not reach (a language switch that landed elsewhere) is loaded here."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    found = dict(browsed[2])
    for width in WIDTHS:
        missing = [(lang, name) for lang in LANGS for name in LAYOUT_PAGES if (width, lang, name) not in found]
        if not missing:
            continue
        context = browser.new_context(viewport={"width": width, "height": 900})
        page = context.new_page()
        try:
            for lang, name in missing:
                page.goto(server + url(lang, name), wait_until="load")
                page.evaluate("() => window.MathJax?.startup?.promise ?? null")
                found[(width, lang, name)] = page.evaluate(LAYOUT_JS)
                shot = LAYOUT_SHOTS.get(name)
                if shot:
                    page.screenshot(path=str(ARTIFACTS / f"{shot}-{lang}-{width}.png"))
        finally:
            context.close()
    return found


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("lang", LANGS)
def test_no_page_scrolls_sideways(layout, width, lang):
    wide = {name: f["sideways"] for (w, l, name), f in layout.items() if (w, l) == (width, lang) and f["sideways"] > 0}
    assert not wide, f"pages wider than the window at {width} px: {wide}"


@pytest.mark.parametrize("lang", LANGS)
def test_code_fits_the_column_at_1440(layout, lang):
    found = {name: f for (w, l, name), f in layout.items() if (w, l) == (1440, lang)}
    assert all(f["column"] >= 880 for f in found.values()), {n: f["column"] for n, f in found.items()}
    scrolling = {name: f["code_scrolling"] for name, f in found.items() if f["code_scrolling"]}
    assert not scrolling, f"code that scrolls sideways at 1440 px: {scrolling}"
    assert sum(f["code"] for f in found.values()) > 100


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("lang", LANGS)
def test_outputs_keep_their_columns(layout, width, lang):
    """Text outputs are never wrapped (inside a word or a number): a wide one scrolls as a whole."""
    found = {name: f for (w, l, name), f in layout.items() if (w, l) == (width, lang)}
    assert sum(f["outputs"] for f in found.values()) > 50
    wrapped = {name: f["outputs_wrapped"] for name, f in found.items() if f["outputs_wrapped"]}
    assert not wrapped, f"wrapped outputs at {width} px: {wrapped}"


@pytest.mark.parametrize("lang", LANGS)
def test_every_image_has_alt_text_in_the_page_language(layout, lang):
    found = {name: f for (w, l, name), f in layout.items() if (w, l) == (1440, lang)}
    images = [(name, alt) for name, f in found.items() for alt in f["images"]]
    assert len(images) >= 10
    bad = [(name, alt) for name, alt in images if len(alt) < 12 or "No description" in alt
           or (lang == "ru") != bool(CYRILLIC.search(alt))]
    assert not bad, f"images without real alt text in {lang}: {bad[:10]}"
    for name in NOTEBOOKS:  # every plot of a lesson opens in the lightbox
        assert found[name]["zoomable"] == stored_pngs(lang, name), name


def test_layout_screenshots_are_saved(layout):
    for shot in ("home", "lesson", "calculator"):
        for lang in LANGS:
            for width in WIDTHS:
                assert (ARTIFACTS / f"{shot}-{lang}-{width}.png").stat().st_size > 10_000, (shot, lang, width)
