"""The links of the course site's prose (lessons/_site/links.py): lessons, API reference, glossary, PyTorch
docs and papers.

Two halves. The first runs the hook's functions on small pieces of HTML, no build: every case of a
Russian "lesson N", what must never be linked (code, headings, links, math, notebook code cells), the
first-mention rule, which names are the library's and which PyTorch's. The second reads the built site
(the session's `site` fixture, tests/conftest.py): every lesson page links inside the site, "lesson N"
in prose is always a link to that lesson in the page's language, named API names and glossary terms
land on their headings and entries in the same language, and every external link is one of the
hook's table or written in the page's own source. That every link and anchor of the site resolves is
tests/site/test_site.py's test_no_broken_internal_links_or_anchors, over the same build.
"""
from __future__ import annotations

import functools
import importlib.util
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]
LESSONS = ROOT / "lessons"
LANGS = ("en", "ru")
PREFIX = {"en": "", "ru": "ru/"}
NOTEBOOKS = sorted(p.stem for p in (LESSONS / "en").glob("*.ipynb"))
pytestmark = pytest.mark.timeout(900)  # the first test that needs the site builds it


def _load_links():
    spec = importlib.util.spec_from_file_location("site_links", LESSONS / "_site" / "links.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


links = _load_links()


# --- the hook on pieces of HTML ----------------------------------------------------------------------------
def linker(lang: str = "en", stem: str = "05_fsdp", glossary: bool = True):
    urls = {"lessons": {n: f"../L{n:02d}/" for n in range(12)}, "self": int(stem[:2]) if stem[:2].isdigit()
            else None, "glossary": "../glossary/"}
    urls["next"] = urls["lessons"].get(urls["self"] + 1) if urls["self"] is not None else None
    return links._Linker(lang, urls, stem, {"lessons": True, "api": True, "glossary": glossary})


def anchors(html: str) -> list[tuple[str, str]]:
    """(href, text) of every link in a piece of HTML; an autoref counts as a link to its identifier."""
    found = re.finditer(r'<a href="([^"]*)">(.*?)</a>|<autoref identifier="([^"]*)" optional>(.*?)</autoref>',
                        html, re.S)
    return [(m.group(1) or "autoref:" + m.group(3), re.sub(r"<[^>]+>", "", m.group(2) or m.group(4)))
            for m in found]


@pytest.mark.parametrize("lang, text, expected", [
    ("en", "as lesson 06 shows", [("../L06/", "lesson 06")]),
    ("en", "Lesson 2 builds it", [("../L02/", "Lesson 2")]),
    ("en", "lesson 00's arithmetic", [("../L00/", "lesson 00")]),
    ("en", "(lessons 03, 07 and 09)", [("../L03/", "lessons 03"), ("../L07/", "07"), ("../L09/", "09")]),
    ("en", "lessons 1–2 build", [("../L01/", "lessons 1"), ("../L02/", "2")]),
    ("en", "lesson 06, 2 ranks", [("../L06/", "lesson 06")]),  # singular: the 2 is not a lesson
    ("en", "lesson 12 does not exist", []),
    ("ru", "урок 06 сравнивает", [("../L06/", "урок 06")]),
    ("ru", "В уроке 3 мы", [("../L03/", "уроке 3")]),
    ("ru", "из урока 07.", [("../L07/", "урока 07")]),
    ("ru", "Урок 07 добавляет", [("../L07/", "Урок 07")]),
    ("ru", "перед уроком 02", [("../L02/", "уроком 02")]),
    ("ru", "к уроку 04", [("../L04/", "уроку 04")]),
    ("ru", "В уроках 1–2 мы", [("../L01/", "уроках 1"), ("../L02/", "2")]),
    ("ru", "(уроки 04–09)", [("../L04/", "уроки 04"), ("../L09/", "09")]),
    ("ru", "после уроков 03 и 08", [("../L03/", "уроков 03"), ("../L08/", "08")]),
    ("ru", "по урокам 02, 03", [("../L02/", "урокам 02"), ("../L03/", "03")]),
])
def test_lesson_mentions_become_links_in_every_case(lang, text, expected):
    html = links.link_html(f"<p>{text}</p>", linker(lang, glossary=False))
    assert anchors(html) == expected, html


def test_the_page_does_not_link_to_itself_and_next_lesson_links_forward():
    html = links.link_html("<p>In lesson 05, unlike lesson 04. From the next lesson on.</p>",
                           linker("en", "05_fsdp", glossary=False))
    assert anchors(html) == [("../L04/", "lesson 04"), ("../L06/", "next lesson")]
    html = links.link_html("<p>Дальше, со следующего урока.</p>", linker("ru", "05_fsdp", glossary=False))
    assert anchors(html) == [("../L06/", "следующего урока")]


@pytest.mark.parametrize("html", [
    "<pre><code>see lesson 06 and FSDP shard</code></pre>",
    '<div class="highlight"><pre><span>lesson 06</span></pre></div>',
    "<h2>Lesson 06: shards <code>FSDP</code></h2>",
    '<p><a href="x">lesson 06, a shard, <code>FSDP</code></a></p>',
    "<p>$\\text{lesson 06 shard}$</p>",
    '<div class="jp-Cell jp-CodeCell"><div><p>lesson 06 rank <code>FSDP</code></p></div></div>',
    '<div class="jp-OutputArea"><pre>rank 0 of lesson 06</pre></div>',
    '<label>world size <code>FSDP</code></label>',
    "<p><autoref identifier=\"x\" optional>shard</autoref></p>",
])
def test_nothing_is_linked_inside_code_headings_links_math_or_notebook_code(html):
    assert links.link_html(html, linker("en")) == html


def test_math_in_a_paragraph_stays_whole_but_its_prose_links():
    html = links.link_html("<p>Each rank holds $1/n$ of a shard, see lesson 04.</p>", linker("en"))
    assert "$1/n$" in html
    assert anchors(html) == [("../glossary/#rank", "rank"), ("../glossary/#shard", "shard"),
                             ("../L04/", "lesson 04")]


@pytest.mark.parametrize("name, before, after, target", [
    ("FSDP", "", "", "autoref:fsdp_mini.fsdp.fully_sharded_data_parallel.FSDP"),
    ("fsdp_mini.FSDP", "", "", "autoref:fsdp_mini.fsdp.fully_sharded_data_parallel.FSDP"),
    ("fsdp_mini.launch", "", "", "autoref:fsdp_mini.run.launch"),  # the export, as Python binds it
    ("fsdp_mini.launch(fn, world_size)", "", "", "autoref:fsdp_mini.run.launch"),
    ("ShardingStrategy.FULL_SHARD", "", "", "autoref:fsdp_mini.fsdp.strategy.ShardingStrategy.FULL_SHARD"),
    ("estimate_memory", "", "", "autoref:fsdp_mini.estimates.estimate_memory"),
    ("CommLog", "", "", "autoref:fsdp_mini.comm_log.CommLog"),
    ("fsdp_mini/parallel/ddp.py", "", "", "autoref:fsdp_mini.parallel.ddp"),
    ("fsdp_mini.course.cost.predict", "", "", "autoref:fsdp_mini.course.cost.predict"),
    ("DistributedDataParallel", "our ", "", "autoref:fsdp_mini.parallel.ddp.DistributedDataParallel"),
    ("DistributedDataParallel", "plain data parallelism, PyTorch's\n", "",
     links.EXTERNAL["api"]["torch.nn.parallel.DistributedDataParallel"]),
    ("dist.send", "", "", links.EXTERNAL["api"]["torch.distributed.send"]),
    ("torch.distributed", "", "", links.EXTERNAL["api"]["torch.distributed"]),
    ("torchrun", "", "", links.EXTERNAL["api"]["torchrun"]),
    ("FullyShardedDataParallel", "", "", links.EXTERNAL["api"]["torch.distributed.fsdp.FullyShardedDataParallel"]),
    ("size", "", "", None),         # a course function, but also a word: not linked bare
    ("train", "", "", None),
    ("model(x, y)", "", "", None),
    ("x.grad = None", "", "", None),
])
def test_code_names_link_to_the_library_reference_or_pytorch(name, before, after, target):
    opening = linker("en", "03_ddp").code(name, before, after)
    if target is None:
        assert opening is None
    elif target.startswith("autoref:"):
        assert opening == f'<autoref identifier="{target[8:]}" optional>'
    else:
        assert opening == f'<a href="{target}">'


def test_russian_text_names_pytorch_after_the_name():
    opening = linker("ru", "03_ddp").code("DistributedDataParallel", "", " (DDP) из PyTorch;")
    assert opening == f'<a href="{links.EXTERNAL["api"]["torch.nn.parallel.DistributedDataParallel"]}">'


def test_the_pytorch_lesson_means_pytorch_by_a_shared_name():
    assert linker("en", "08_pytorch_fsdp2").code("fully_shard", "", "") == \
        f'<a href="{links.EXTERNAL["api"]["torch.distributed.fsdp.fully_shard"]}">'
    assert linker("en", "09_flat_or_per_parameter").code("fully_shard", "", "") == \
        '<autoref identifier="fsdp_mini.fsdp._fully_shard.fully_shard.fully_shard" optional>'


def test_each_target_is_linked_once_per_page_and_glossary_links_are_few_per_paragraph():
    html = links.link_html("<p><code>FSDP</code> then <code>FSDP</code> again.</p>"
                           "<p>A rank, a shard, a bucket and a ring.</p><p>Another rank and a ring.</p>",
                           linker("en"))
    assert anchors(html) == [("autoref:fsdp_mini.fsdp.fully_sharded_data_parallel.FSDP", "FSDP"), ("../glossary/#rank", "rank"),
                             ("../glossary/#shard", "shard"), ("../glossary/#ring", "ring")]


@pytest.mark.parametrize("lang, text, anchor", [
    ("en", "two ranks", "rank"), ("en", "shard groups", "shard-group"), ("en", "FSDP units", "unit"),
    ("en", "the world size", "world-size"), ("en", "per-parameter sharding", "per-parameter-sharding"),
    ("ru", "двух рангов", "rank"), ("ru", "на ранге", "rank"), ("ru", "внутри узла", "node"),
    ("ru", "между узлами", "node"), ("ru", "юниты", "unit"), ("ru", "группу шардирования", "shard-group"),
    ("ru", "шардирования по параметрам", "per-parameter-sharding"), ("ru", "плоского параметра", "flat-parameter"),
    ("ru", "состояние оптимизатора", "optimizer-state"), ("ru", "смешанной точности", "mixed-precision"),
])
def test_glossary_terms_in_their_forms(lang, text, anchor):
    html = links.link_html(f"<p>{text}</p>", linker(lang))
    assert [h for h, _ in anchors(html)] == [f"../glossary/#{anchor}"], html


def test_external_table_is_https_and_glossary_rows_are_twins():
    urls = [*links.EXTERNAL["api"].values(), *links.EXTERNAL["papers"]]
    assert urls and all(u.startswith("https://") for u in urls)
    assert all(set(phrases) == set(LANGS) for phrases in links.EXTERNAL["papers"].values())
    en, ru = links.glossary("en"), links.glossary("ru")
    assert len(en) >= 30 and [a for a, _ in en] == [a for a, _ in ru]


# --- the built site ------------------------------------------------------------------------------------------
class Body(HTMLParser):
    """A page's article: its links (href, text, is code) and its prose outside links, code, headings,
    math and notebook code cells ("\\x00" where a link or code was, so no match spans one)."""

    SKIP_TAGS = {"pre", "code", "h1", "h2", "h3", "h4", "h5", "h6", "script", "style", "svg", "label",
                 "button", "select", "textarea", "summary", "nav"}
    SKIP_CLASS = re.compile(r"\b(?:jp-CodeCell|jp-OutputArea|arithmatex|highlight|headerlink|anchor-link)\b")

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.depth = 0          # inside <article>
        self.stack: list[tuple[str, bool]] = []
        self.links: list[dict] = []
        self.prose: list[str] = []
        self.link = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "article":
            self.depth += 1
        if not self.depth or tag in ("br", "img", "hr", "input", "meta", "link", "wbr", "source"):
            return
        skip = bool(self.stack and self.stack[-1][1]) or tag in self.SKIP_TAGS or bool(
            self.SKIP_CLASS.search(a.get("class") or ""))
        self.stack.append((tag, skip))
        if tag == "a" and a.get("href") is not None and not self.SKIP_CLASS.search(a.get("class") or ""):
            self.link = {"href": a["href"], "text": "", "code": False, "skipped": skip}
            self.prose.append("\x00")
        if tag == "code" and self.link is not None:
            self.link["code"] = True
        if tag == "code" or tag in ("p", "li", "td", "div"):
            self.prose.append("\x00")

    def handle_endtag(self, tag):
        if tag == "article":
            self.depth -= 1
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                del self.stack[i:]
                break
        if tag == "a" and self.link is not None:
            self.links.append(self.link)
            self.link = None

    def handle_data(self, data):
        if not self.depth:
            return
        if self.link is not None:
            self.link["text"] += data
        elif not (self.stack and self.stack[-1][1]):
            self.prose.append(re.sub(r"\$[^$]*\$", "\x00", data))


@functools.lru_cache(maxsize=None)
def body(path: Path) -> Body:
    b = Body()
    b.feed(path.read_text(encoding="utf-8"))
    return b


def built(site_dir: Path, lang: str, name: str) -> Path:
    return site_dir / PREFIX[lang] / (f"{name}/" if name else "") / "index.html"


def target_of(site_dir: Path, page: Path, href: str) -> tuple[str, str]:
    """Where an internal link lands: (path inside the site without index.html, fragment)."""
    parts = urlsplit(urljoin("/" + page.relative_to(site_dir).as_posix(), href))
    path = unquote(parts.path).lstrip("/")
    return re.sub(r"(^|/)index\.html$", r"\1", path), unquote(parts.fragment)


def internal(href: str) -> bool:
    return not re.match(r"^(https?:|mailto:|data:|javascript:|//|#)", href)


def test_every_lesson_page_links_to_glossary_and_reference(site):
    """Before links.py, 22 of the 24 lesson pages had no link in their body; now each links to the
    glossary and the API reference of its language (every lesson names the library and its terms).
    Links to other lessons depend on the text mentioning them: the next test checks those."""
    site_dir, missing = site[0], []
    for lang in LANGS:
        for name in NOTEBOOKS:
            page = built(site_dir, lang, name)
            kinds = set()
            for link in body(page).links:
                if internal(link["href"]):
                    path, _ = target_of(site_dir, page, link["href"])
                    path = path[len(PREFIX[lang]):] if path.startswith(PREFIX[lang]) else path
                    kinds.add("glossary" if path.startswith("glossary/") else "reference"
                              if path.startswith("reference/") else "lesson" if path[:2].isdigit() else "other")
            wanted = {"glossary", "reference"}
            if not wanted <= kinds:
                missing.append(f"{lang}/{name}: no link to {sorted(wanted - kinds)}")
    assert not missing, "\n".join(missing)


_MENTION = {"en": re.compile(r"(?<!\w)[Ll]essons?\s+(\d{1,2})(?!\d)"),
            "ru": re.compile(r"(?<!\w)[Уу]рок(?:ами|ам|ах|ов|ом|а|у|е|и)?\s+(\d{1,2})(?!\d)")}


def pages_of(site_dir: Path, lang: str) -> list[Path]:
    root = site_dir / PREFIX[lang]
    pages = [p for p in root.rglob("index.html") if not (lang == "en" and p.relative_to(root).parts[0] == "ru")]
    return sorted(p for p in pages if "assets" not in p.parts)


def test_lesson_mentions_in_prose_are_links_to_that_lesson(site):
    site_dir, plain, wrong = site[0], [], []
    for lang in LANGS:
        for page in pages_of(site_dir, lang):
            own = page.parent.name[:2] if page.parent.name[:2].isdigit() else None
            b = body(page)
            for m in _MENTION[lang].finditer("".join(b.prose)):
                if f"{int(m.group(1)):02d}" != own and f"{int(m.group(1)):02d}" in [n[:2] for n in NOTEBOOKS]:
                    plain.append(f"{page.relative_to(site_dir)}: {m.group(0)!r} is not a link")
            for link in b.links:
                m = _MENTION[lang].fullmatch(" ".join(link["text"].split()))
                if m and internal(link["href"]):
                    path, _ = target_of(site_dir, page, link["href"])
                    expected = PREFIX[lang] + next(n for n in NOTEBOOKS if int(n[:2]) == int(m.group(1))) + "/"
                    if path != expected:
                        wrong.append(f"{page.relative_to(site_dir)}: {link['text']!r} -> {path}, not {expected}")
    assert not plain and not wrong, "\n".join(plain + wrong)


# a few names a learner meets early: each must link to its heading in the reference of the page's language
NAMED_API = {"FSDP": "fsdp_mini.fsdp.fully_sharded_data_parallel.FSDP", "fully_shard": "fsdp_mini.fsdp._fully_shard.fully_shard.fully_shard",
             "CommLog": "fsdp_mini.comm_log.CommLog", "fsdp_mini.estimate_memory": "fsdp_mini.estimates.estimate_memory",
             "fsdp_mini.launch": "fsdp_mini.run.launch", "fsdp_mini.collectives": "fsdp_mini.collectives"}


@pytest.mark.parametrize("lang", LANGS)
def test_named_api_names_link_to_the_reference_of_the_page_language(site, lang):
    site_dir, found, wrong = site[0], {}, []
    for name in NOTEBOOKS:
        page = built(site_dir, lang, name)
        for link in body(page).links:
            path, fragment = target_of(site_dir, page, link["href"]) if internal(link["href"]) else ("", "")
            if path.startswith(PREFIX[lang] + "reference/") or (lang == "en" and path.startswith("reference/")):
                found.setdefault(link["text"].strip(), set()).add(fragment)
            elif "reference/" in path:
                wrong.append(f"{lang}/{name}: {link['text']!r} -> {path} (another language)")
    missing = {n: a for n, a in NAMED_API.items() if a not in found.get(n, set())}
    assert not missing and not wrong, f"not linked: {missing}\n" + "\n".join(wrong)


# terms in the forms the lessons use: somewhere in the lessons of that language, such a word links to the entry
NAMED_TERMS = {"en": [("rank", "rank"), ("flat parameter", "flat-parameter"), ("shard group", "shard-group")],
               "ru": [("ранг", "rank"), ("узл", "node"), ("плоск", "flat-parameter"), ("групп", "shard-group")]}


@pytest.mark.parametrize("lang", LANGS)
def test_glossary_terms_link_to_their_entries(site, lang):
    site_dir, found = site[0], set()
    ids = set(re.findall(r'<tr id="([^"]+)"', built(site_dir, lang, "glossary").read_text(encoding="utf-8")))
    assert ids == {a for a, _ in links.glossary(lang)}, "every row of the glossary has its term's id"
    for name in NOTEBOOKS:
        page = built(site_dir, lang, name)
        for link in body(page).links:
            path, fragment = target_of(site_dir, page, link["href"]) if internal(link["href"]) else ("", "")
            if path.endswith("glossary/"):
                assert path == PREFIX[lang] + "glossary/" and fragment in ids, (name, link)
                found.add((" ".join(link["text"].lower().split()), fragment))
    missing = [(text, anchor) for text, anchor in NAMED_TERMS[lang]
               if not any(t.startswith(text) and f == anchor for t, f in found)]
    assert not missing, f"no link from {missing}; links: {sorted(found)}"


def test_cited_papers_are_links_wherever_cited(site):
    """A page that cites a paper in the words of links.py's table links to it; and the table's words do
    occur (the ZeRO paper is cited in both languages)."""
    site_dir, unlinked, cited = site[0], [], {lang: set() for lang in LANGS}
    for lang in LANGS:
        for page in pages_of(site_dir, lang):
            b = body(page)
            text = "".join(b.prose) + "\x00".join(link["text"] for link in b.links)
            hrefs = {link["href"] for link in b.links}
            for url, phrases in links.EXTERNAL["papers"].items():
                if any(re.search(p, text) for p in phrases[lang]):
                    cited[lang].add(url)
                    if url not in hrefs:
                        unlinked.append(f"{page.relative_to(site_dir)}: cites {url} without a link")
    assert not unlinked, "\n".join(unlinked)
    assert all("https://arxiv.org/abs/1910.02054" in urls for urls in cited.values()), cited


@pytest.mark.parametrize("lang", LANGS)
def test_pytorch_names_link_to_pytorch_docs(site, lang):
    hrefs = {link["href"] for name in NOTEBOOKS for link in body(built(site[0], lang, name)).links}
    api = links.EXTERNAL["api"]
    wanted = {api["torch.distributed"], api["torch.distributed.fsdp.fully_shard"], api["torchrun"]}
    assert wanted <= hrefs, wanted - hrefs


def test_external_links_are_the_tables_or_the_pages_own(site):
    """Every link that leaves the site from a lesson page is https and comes from links.py's table or
    from the notebook itself: no URL is made up anywhere else."""
    site_dir = site[0]
    table = set(links.EXTERNAL["api"].values()) | set(links.EXTERNAL["papers"])
    stray = []
    for lang in LANGS:
        for name in NOTEBOOKS:
            source = (LESSONS / lang / f"{name}.ipynb").read_text(encoding="utf-8")
            for link in body(built(site_dir, lang, name)).links:
                href = link["href"]
                if re.match(r"^(https?:)?//", href) and not (href in table or href in source) \
                        or href.startswith("http:"):
                    stray.append(f"{lang}/{name}: {href}")
    assert not stray, "\n".join(stray)
