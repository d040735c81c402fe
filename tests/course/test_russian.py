"""The Russian edition: twins with the same structure and numbers, one term per concept, Russian typography,
no English output.

The rules live in lessons/ru/STYLE.md and are read from there: its table of terms (per concept, each ruled-out
form's regular expression and an example it catches, and an example of the chosen form that no expression
catches) and its table of typography rules (their ids and examples; the code of each rule is below). For every
lesson twin (lessons/en/NN_*.ipynb and lessons/ru/NN_*.ipynb):

- the same headings, level and order;
- the same numbers in the prose of each markdown cell (49 152 / 1,5 in Russian, 49,152 / 1.5 in English);
- no ruled-out form of a term in the Russian markdown, in the Russian printed outputs, in lessons/ru/**/*.md
  (STYLE.md itself excepted) and in README.ru.md;
- the typography rules in the Russian markdown, the Russian pages and README.ru.md (prose only: never inside
  code, fences, math, links or HTML);
- no English-only line in the Russian printed outputs (code identifiers, API names, tensor reprs, paths and
  tracebacks excepted), and library exception text followed by its Russian reading.

`typeset(text)` applies the typography rules to a Markdown text's prose;
`python tests/course/test_russian.py --fix FILE...` rewrites Russian notebooks' markdown cells and .md files in place.
"""
from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parents[2]
LESSONS = ROOT / "lessons"
STYLE = LESSONS / "ru" / "STYLE.md"
README_RU = ROOT / "README.ru.md"
NAMES = sorted(p.name for p in (LESSONS / "en").glob("*.ipynb") if (LESSONS / "ru" / p.name).exists())
RU_PAGES = sorted(p.relative_to(LESSONS / "ru").as_posix() for p in (LESSONS / "ru").rglob("*.md") if p != STYLE)
CYRILLIC = re.compile("[а-яёА-ЯЁ]")
NBSP, NNBSP = "\u00a0", "\u202f"


def load(lang: str, name: str) -> dict:
    return json.loads((LESSONS / lang / name).read_text(encoding="utf-8"))


def src(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def without_fences(text: str) -> str:
    return re.sub(r"^[ \t]*```.*?^[ \t]*```", " ", text, flags=re.S | re.M)


def prose(text: str) -> str:
    """Markdown a reader reads: no code blocks, inline code, comments, links' targets or HTML tags (math stays)."""
    text = without_fences(text)
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    return re.sub(r"<[^>]+>", " ", text)


# ---------------------------------------------------------------------------------------- headings

def headings(nb: dict) -> list[tuple[int, str | None]]:
    """(level, section number such as "4" or None) of every heading, in order."""
    found = []
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            for hashes, title in re.findall(r"^(#{1,6}) +(.*)$", without_fences(src(cell)), flags=re.M):
                number = re.match(r"(\d+)\.? ", title)
                found.append((len(hashes), number.group(1) if number else None))
    return found


@pytest.mark.parametrize("name", NAMES)
def test_twins_have_the_same_headings(name):
    en, ru = headings(load("en", name)), headings(load("ru", name))
    assert en, f"{name}: no headings"
    assert ru == en, f"{name}: headings (level, section number) differ:\nen {en}\nru {ru}"


# ----------------------------------------------------------------------------------------- numbers

_THOUSANDS_RU = re.compile(r"(?<![\d,.])\d{1,3}(?:[ \u00a0\u202f]\d{3})+(?![\d])")
_THOUSANDS_EN = re.compile(r"(?<![\d,.])\d{1,3}(?:,\d{3})+(?![\d])")
_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?")


def numbers(text: str, lang: str) -> list[str]:
    """The numbers of a markdown text's prose, normalised (49152, 1.5; leading zeros dropped), sorted."""
    text = prose(text).replace("{,}", ",").replace("{.}", ".")
    if lang == "ru":
        text = _THOUSANDS_RU.sub(lambda m: re.sub(r"\D", "", m.group()), text)
        text = re.sub(r"(?<=\d),(?=\d)", ".", text)  # the decimal comma
    else:
        text = _THOUSANDS_EN.sub(lambda m: m.group().replace(",", ""), text)
    found = []
    for value in _NUMBER.findall(text):
        whole, _, fraction = value.partition(".")
        found.append(str(int(whole)) + ("." + fraction if fraction else ""))
    return sorted(found)


def test_numbers_are_normalised():
    assert numbers("49 152 байт, 1,5 × S, 7{,}5 млрд, урок 02, 2, 3 и 4", "ru") == sorted(
        ["49152", "1.5", "7.5", "2", "2", "3", "4"])
    assert numbers("49\u202f152 байт, 28,6\u00a0%", "ru") == sorted(["49152", "28.6"])
    assert numbers("49,152 bytes, 1.5 × S, 7.5B, lesson 02, 2, 3 and 4, fp32, `64`", "en") == sorted(
        ["49152", "1.5", "7.5", "2", "2", "3", "4"])


@pytest.mark.parametrize("name", NAMES)
def test_twins_have_the_same_numbers_in_prose(name):
    en, ru = load("en", name), load("ru", name)
    differ = []
    for i, (a, b) in enumerate(zip(en["cells"], ru["cells"])):
        if a["cell_type"] == b["cell_type"] == "markdown":
            na, nb = numbers(src(a), "en"), numbers(src(b), "ru")
            if na != nb:
                only_en = sorted(set(na) - set(nb)) or "counts"
                only_ru = sorted(set(nb) - set(na)) or "counts"
                differ.append(f"cell {i}: only en {only_en}, only ru {only_ru}")
    assert not differ, f"{name}: numbers in prose differ:\n" + "\n".join(differ)


# ------------------------------------------------------------------------------- the style sheet

def _cells(line: str) -> list[str]:
    """The cells of a Markdown table row; `\\|` inside a cell is a `|` of its text."""
    body = line.strip()
    body = body[1:] if body.startswith("|") else body
    body = body[:-1] if body.endswith("|") and not body.endswith("\\|") else body
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", body)]


def style_tables(text: str) -> dict[str, list[dict[str, str]]]:
    """Every table of a Markdown text, keyed by its first header cell, as a list of {header: cell}."""
    tables, lines = {}, text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and re.fullmatch(r"[|:\- ]+", lines[i + 1].strip()):
            header = _cells(lines[i])
            rows = []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(dict(zip(header, _cells(lines[i]))))
                i += 1
            tables[header[0]] = rows
        else:
            i += 1
    return tables


def _items(cell: str) -> list[str]:
    return [x.strip() for x in cell.split("<br>")] if cell.strip() else []


@dataclass(frozen=True)
class Term:
    """One ruled-out form of a concept: where a text contains `pattern`, it should say `chosen`."""
    concept: str
    chosen: str
    form: str
    pattern: re.Pattern
    bad: str    # an example the pattern catches
    good: str   # the concept's example in its chosen form: no pattern of the table catches it

    def __str__(self):
        return f"{self.concept}: «{self.form}» (нужно: {self.chosen})"


def read_terms(text: str) -> list[Term]:
    terms = []
    for row in style_tables(text)["понятие"]:
        forms, patterns, bad = (_items(row[k]) for k in ("исключено", "регулярные выражения", "нарушение"))
        assert len(forms) == len(patterns) == len(bad), f"STYLE.md, {row['понятие']}: one expression and " \
            f"one example per ruled-out form ({len(forms)} forms, {len(patterns)} expressions, {len(bad)} examples)"
        for form, pattern, example in zip(forms, patterns, bad):
            code = re.fullmatch(r"`(.+)`", pattern)
            assert code, f"STYLE.md, {row['понятие']}: the expression {pattern!r} is not in a code span"
            terms.append(Term(row["понятие"], row["термин"], form, re.compile(code.group(1), re.I), example,
                              row["как надо"]))
    return terms


def read_typography(text: str) -> list[tuple[str, list[tuple[str, str]]]]:
    """(rule id, [(violation, its fix)]) per row of the typography table, in its order."""
    rows = []
    for row in style_tables(text)["правило"]:
        rule = re.fullmatch(r"`([\w-]+)`", row["правило"]).group(1)
        bad, good = _items(row["нарушение"]), _items(row["как надо"])
        assert len(bad) == len(good), f"STYLE.md, {rule}: a fix for every violation"
        rows.append((rule, list(zip(bad, good))))
    return rows


STYLE_TEXT = STYLE.read_text(encoding="utf-8")
TERMS = read_terms(STYLE_TEXT)
TYPOGRAPHY_TABLE = read_typography(STYLE_TEXT)


# ------------------------------------------------------------------------------------------- terms

_MATH = re.compile(r"\$\$.+?\$\$|(?<![\\$])\$[^$\n]+?\$|\\\(.+?\\\)|\\\[.+?\\\]", re.S)
# Latin titles of papers and products (three words or more) in «» or *italics*: names, not running text
_TITLE = re.compile(r"«(?:[^«»а-яёА-ЯЁ\s]+\s+){2,}[^«»а-яёА-ЯЁ]*»"
                    r"|(?<![\w*])\*(?:[^*а-яёА-ЯЁ\s]+\s+){2,}[^*а-яёА-ЯЁ\n]*\*(?![\w*])")


def term_paragraphs(markdown: str) -> list[str]:
    """The paragraphs of a Markdown text's prose as the term rules read them: math reduced to its
    `\\text{...}`, Latin titles in «» or *italics* left out, white space collapsed."""
    text = _MATH.sub(lambda m: " " + " ".join(re.findall(r"\\text\{([^}]*)\}", m.group())) + " ", prose(markdown))
    text = _TITLE.sub(" ", text)
    return [" ".join(p.split()) for p in re.split(r"\n[ \t]*\n", text) if p.strip()]


def _context(text: str, start: int, end: int, width: int = 30) -> str:
    """The match with `width` characters on each side (a long match: its last 80 characters)."""
    start = max(start, end - 80)
    return f"…{text[max(0, start - width):end + width]}…"


def ruled_out(paragraph: str) -> list[str]:
    """Every ruled-out form in one paragraph (white space collapsed), with its context."""
    hits = []
    for term in TERMS:
        for m in term.pattern.finditer(paragraph):
            hits.append(f"{term}: {_context(paragraph, m.start(), m.end())}")
    return hits


def test_the_style_sheet_is_read():
    assert len(TERMS) >= 30 and len({t.concept for t in TERMS}) >= 25
    concepts = {t.concept for t in TERMS}
    for concept in ("chunk", "link", "communication", "latency", "loss", "parity", "node", "mesh (DeviceMesh)",
                    "collective", "padding", "world size", "activation checkpointing", "flight recorder",
                    "warm-up", "data parallelism", "placements (DTensor)", "million, billion", "timeline",
                    "notebook", "laptop", "GPU (род)", "GPT (род)", "root (корень иерархии FSDP)", "unsharded",
                    "forward, backward", "hook (хуки FSDP)", "core (ядро процессора)", "stream (CUDA)", "layout",
                    "TP group", "AllReduce, AllGather, ReduceScatter", "род латинских названий",
                    "cost (калька «стоит»)", "шаблон вступления"):
        assert concept in concepts, f"STYLE.md has no row for {concept}"
    assert [rule for rule, _ in TYPOGRAPHY_TABLE] == list(TYPOGRAPHY), \
        "STYLE.md's typography table and this file's rules: the same ids in the same order"


def test_the_style_sheet_has_a_guide_for_editors_and_then_the_tables_the_test_reads():
    """Part 1 is prose for a human editor (terms decided, the gender rule, calques, fixed phrases, code
    comments); part 2 holds every table this file reads, and nothing of part 1 is a machine table."""
    guide, _, tables = STYLE_TEXT.partition("\n# Часть 2.")
    assert "\n# Часть 1." in guide and tables
    for heading in ("## Термины", "## Род и склонение латинских названий", "## Кальки", "## Устойчивые фразы",
                    "## Комментарии в коде"):
        assert f"\n{heading}" in guide, heading
    assert not {"понятие", "правило", "правило вывода"} & set(style_tables(guide))
    assert {"понятие", "правило", "правило вывода"} <= set(style_tables(tables))


@pytest.mark.parametrize("term", TERMS, ids=lambda t: f"{t.concept}/{t.form[:24]}")
def test_each_term_rule_catches_its_example_and_not_the_chosen_form(term):
    assert term.bad and term.good
    assert term.pattern.search(term_paragraphs(term.bad)[0]), f"{term} misses its own example «{term.bad}»"
    assert not term.pattern.search(term.good), f"{term} catches the chosen form «{term.good}»"
    assert not ruled_out(term_paragraphs(term.good)[0]), f"«{term.good}» breaks another rule"


def test_the_earlier_hard_coded_rules_still_hold():
    """The rules tests/course/test_russian.py hard-coded before the style sheet, now read from STYLE.md."""
    assert len(ruled_out("режем на куски по звеньям; связь; одна нода; ячейка ноутбука; каждый GPU")) == 6
    assert len(ruled_out("латентность; потери; паритет; решётка; коллективы; дополнение; лэптоп")) == 7
    assert not ruled_out("чанки по каналам; обмен данными; один узел; ячейка блокнота; каждая GPU; "
                         "на обычном ноутбуке; коллективные операции; задержка; лосс; сетка; паддинг")


def test_term_rules_read_paragraphs_not_code_math_or_titles():
    assert ruled_out(term_paragraphs("бортовой самописец\nранга 0\n\nсамописец ранга 1")[1])
    assert not ruled_out(term_paragraphs("бортовой самописец (Flight Recorder) ранга 0,\nи самописец ранга 1")[0])
    assert not [h for p in term_paragraphs("```\nкуски\n```\n\n`world_size` и `checkpoint` $2B$ [урок](x-3.ipynb)")
                for h in ruled_out(p)]
    assert ruled_out(term_paragraphs("*world size* — число процессов")[0])  # a term in italics is no title
    assert ruled_out(term_paragraphs(r"$\text{потери} = 1$")[0])
    assert not ruled_out(term_paragraphs("«Accelerating Data Parallel Training» и *Data Parallel Training*")[0])
    assert ruled_out(term_paragraphs("обычный data parallel")[0])


def output_lines(nb: dict) -> list[tuple[int, str, str]]:
    """(cell index, output type, line) of everything a notebook's code cells print or display as text."""
    lines = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        for out in cell.get("outputs", []):
            kind = out.get("output_type")
            if kind == "stream":
                text = src({"source": out["text"]})
            elif kind == "error":
                text = "\n".join(out.get("traceback", []))
            else:
                data = out.get("data", {})
                if "text/markdown" in data:
                    text = without_fences(src({"source": data["text/markdown"]}))
                elif "text/plain" in data and not any(k.startswith("image/") or k == "text/html" for k in data):
                    text = src({"source": data["text/plain"]})
                else:
                    continue
            lines += [(i, kind, line) for line in text.splitlines() if line.strip()]
    return lines


def ruled_out_in_outputs(nb: dict) -> list[str]:
    """Ruled-out forms in what a notebook prints, leaving out library exception text and tracebacks."""
    hits = []
    for i, kind, line in output_lines(nb):
        if kind == "error" or line.lstrip().startswith(("Traceback", "File ")):
            continue
        error = _ERROR.search(line)
        text = line[:error.start()] if error else line
        text = _UNIT_NAME.sub(" ", text)
        hits += [f"cell {i} output: {h}" for h in ruled_out(" ".join(text.split()))]
    return hits


# "root" printed as the root unit's name (`unit.label`, beside "blocks.0"): a name, not prose
_UNIT_NAME = re.compile(r"(?<![\w.])root(?![\w])")


# ----------------------------------------------------------------------------------- output rules

_SEPARATED = r"(?:\d{1,3}(?:[\u00a0\u202f]\d{3})+)"
# code in a printed line: key=value, slices [a, b), calls, paths, names with digits or underscores
_OUTPUT_CODE = re.compile(r"\S*[_/\\]\S*|\S+=\S*|\[[^\]\n]*\)|\b[A-Za-z]+\d+\w*|\w+\([^)]*\)")
OUTPUT_RULES = {
    # a multiplication in printed dimensions: 8 × 16, TP8 × FSDP (a ratio "1,16x" stays)
    "times": re.compile(r"(?<=\w)[ \t]+[xх][ \t]+(?=\w)|(?<=\d)[xх](?=\d)"),
    # thousands grouped by an ordinary space, or a number from 1 000 with no separator (n = 1024 is a formula,
    # [2798] a list, порт 29500 a name)
    "thousands": re.compile(r"(?<![\d,.])\d{1,3}(?: \d{3})+(?![\d,])|(?<![\w.,:/#=\[\u00a0\u202f-])(?<!= )(?<!порт )\d{4,}(?![\w.,\]])"),
    # a boolean answering a Russian phrase ("…совпадает: True"): да / нет
    "bool": re.compile(r"(?<=:)[ \t]*\b(?:True|False)\b(?![=\w(])"),
}


def output_violations(line: str, rules=None) -> list[str]:
    """What the output rules of STYLE.md find in one printed line (library exception text and code left out)."""
    error = _ERROR.search(line)
    text = line[:error.start()] if error else line
    if line.lstrip().startswith(("Traceback", "File ")):
        return []
    found = []
    for rule in rules or OUTPUT_RULES:
        probe = _OUTPUT_CODE.sub(lambda m: " " * len(m.group()), text) if rule != "times" else text
        if rule == "bool" and not CYRILLIC.search(text):
            continue  # a boolean in an English or code line is Python's
        found += [f"{rule}: «{m.group().strip()}» в …{text[max(0, m.start() - 30):m.end() + 20].strip()}…"
                  for m in OUTPUT_RULES[rule].finditer(probe)]
    return found


def read_output_rules(text: str) -> list[tuple[str, list[tuple[str, str]]]]:
    rows = []
    for row in style_tables(text)["правило вывода"]:
        rule = re.fullmatch(r"`([\w-]+)`", row["правило вывода"]).group(1)
        bad, good = [x.strip() for x in row["нарушение"].split(";")], [x.strip() for x in row["как надо"].split(";")]
        rows.append((rule, list(zip(bad, good))))
    return rows


OUTPUT_TABLE = read_output_rules(STYLE_TEXT)


def test_the_output_rules_are_the_style_sheets():
    assert [rule for rule, _ in OUTPUT_TABLE] == list(OUTPUT_RULES)


@pytest.mark.parametrize("rule, bad, good", [(r, b, g) for r, pairs in OUTPUT_TABLE for b, g in pairs])
def test_each_output_rule_catches_its_example(rule, bad, good):
    assert output_violations(bad, [rule]), f"{rule} misses «{bad}»"
    assert not output_violations(good), f"«{good}»: {output_violations(good)}"


def test_output_rules_leave_code_and_names_alone():
    for fine in ["numel=11190, n=4", "[    0,  1756) из 3\u202f600", "n = 1024: bus_factor = 1,9980", "H100, порт 29500",
                 "ratio 1,16x", "use_orig_params=False", "tensor([True, False])", "ранг 0: да", "pytorch#190489",
                 "RuntimeError: Timed out after 3000 ms"]:
        assert not output_violations(fine), (fine, output_violations(fine))


@pytest.mark.parametrize("name", NAMES)
def test_russian_outputs_follow_the_output_rules(name):
    found = [f"cell {i}: {v}" for i, kind, line in output_lines(load("ru", name)) if kind != "error"
             for v in output_violations(line)]
    assert not found, f"ru/{name}: {len(found)} output lines break lessons/ru/STYLE.md's output rules:\n" + \
        "\n".join(found)


def markdown_of(nb: dict) -> list[tuple[int, str]]:
    return [(i, src(c)) for i, c in enumerate(nb["cells"]) if c["cell_type"] == "markdown"]


def page_text(page: str) -> str:
    """A Russian page as its prose is checked: the glossary's English column is names, not Russian text."""
    text = (LESSONS / "ru" / page).read_text(encoding="utf-8") if page != "README.ru.md" else \
        README_RU.read_text(encoding="utf-8")
    if page == "glossary.md":
        text = "\n".join("| " + " | ".join(c for k, c in enumerate(_cells(line)) if k != 1) + " |"
                         if line.startswith("|") else line for line in text.splitlines())
    return text


@pytest.mark.parametrize("name", NAMES)
def test_russian_markdown_and_outputs_use_the_agreed_terms(name):
    nb = load("ru", name)
    hits = [f"cell {i}: {h}" for i, text in markdown_of(nb) for p in term_paragraphs(text) for h in ruled_out(p)]
    hits += ruled_out_in_outputs(nb)
    assert not hits, f"ru/{name}: {len(hits)} ruled-out forms (lessons/ru/STYLE.md):\n" + "\n".join(hits)


@pytest.mark.parametrize("page", [*RU_PAGES, "README.ru.md"])
def test_russian_pages_use_the_agreed_terms(page):
    hits = [h for p in term_paragraphs(page_text(page)) for h in ruled_out(p)]
    assert not hits, f"{page}: {len(hits)} ruled-out forms (lessons/ru/STYLE.md):\n" + "\n".join(hits)


_FIRST_MENTION = re.compile(r"бортов\w*\s+самопис\w*(?P<after>\s*\(\s*flight\s+recorder)?", re.I)


def flight_recorder_named(paragraphs: list[str]) -> bool:
    """Whether the first «бортовой самописец» of a lesson is followed by «(Flight Recorder)» (or there is none)."""
    for paragraph in paragraphs:
        m = _FIRST_MENTION.search(paragraph)
        if m:
            return bool(m.group("after"))
    return True


def test_flight_recorder_is_checked_at_the_first_mention_only():
    assert flight_recorder_named(["бортовой самописец (Flight Recorder) ранга", "бортовой самописец PyTorch"])
    assert not flight_recorder_named(["бортовой самописец ранга", "бортовой самописец (Flight Recorder)"])
    assert flight_recorder_named(["ни слова о нём"])


@pytest.mark.parametrize("name", NAMES)
def test_flight_recorder_is_named_in_english_at_its_first_mention(name):
    paragraphs = [p for _, text in markdown_of(load("ru", name)) for p in term_paragraphs(text)]
    assert flight_recorder_named(paragraphs), \
        f"ru/{name}: the first «бортовой самописец» should read «бортовой самописец (Flight Recorder)»"


# -------------------------------------------------------------------------------------- typography

# What typography never touches: front matter, fences, comments, raw HTML blocks, math, inline code, links
# (text and target), URLs, HTML tags, snippet and mkdocstrings lines, attribute lists.
_PROTECTED = re.compile("|".join([
    r"\A---\n.*?\n---[ \t]*(?:\n|\Z)",
    r"^[ \t]*(?P<fence>`{3,}|~{3,})[^\n]*\n.*?^[ \t]*(?P=fence)[ \t]*$",
    r"<!--.*?-->",
    r"<(?P<raw>script|style|pre|code|kbd|math|svg)\b.*?</(?P=raw)\s*>",
    r"\$\$.*?\$\$",
    r"(?P<tick>`+).+?(?<!`)(?P=tick)(?!`)",
    r"(?<![\\$])\$(?=\S)[^$\n]+?(?<![\s\\])\$",
    r"\\\(.*?\\\)|\\\[.*?\\\]",
    r"!?\[(?:[^\[\]\n]|\[[^\[\]\n]*\])*\](?:\([^)\n]*\)|\[[^\]\n]*\])(?:\{[^}\n]*\})?",
    r"^[ \t]*\[[^\]\n]+\]:[^\n]*$",
    r"<https?://[^>\s]+>|https?://[^\s)>\]]+",
    r"</?[A-Za-z][^>]*>",
    r"^[ \t]*--8<--[^\n]*$|^:::[^\n]*(?:\n[ \t]+[^\n]*)*",
    r"\{[ \t]*[.#:][^}\n]*\}",
]), re.S | re.M)


def segments(markdown: str) -> list[tuple[bool, str]]:
    """A Markdown text cut into (is prose, piece); the pieces joined give the text back."""
    out, pos = [], 0
    for m in _PROTECTED.finditer(markdown):
        if m.start() > pos:
            out.append((True, markdown[pos:m.start()]))
        out.append((False, m.group()))
        pos = m.end()
    if pos < len(markdown):
        out.append((True, markdown[pos:]))
    return out


FLAG = object()  # a violation with no mechanical fix
_NUM = r"\d+(?:[\u00a0\u202f]\d{3})*(?:,\d+)?"
_START = r"(?<![\w.,\u00a0\u202f/#№:-])"  # a number's start, not part of a name, a version or a path


@dataclass(frozen=True)
class Check:
    """One pattern of a typography rule; `fix(match, text)` gives the replacement, None where the match is
    fine as it is (an exception), or FLAG where it is wrong but has no mechanical fix."""
    pattern: re.Pattern
    fix: Callable


def _sub(template: str) -> Callable:
    return lambda m, text: m.expand(template)


# --- quotes
def _quotes():
    return [Check(re.compile(r'"([^"\n]*)"|“([^”\n]*)”|„([^“”\n]*)[“”]'),
                  lambda m, text: "«" + next(g for g in m.groups() if g is not None) + "»"),
            Check(re.compile(r'["“”„]'), lambda m, text: FLAG)]


# --- ё
_YO_WORDS = {"еще": "ещё", "ее": "её", "нее": "неё", "трех": "трёх", "четырех": "четырёх"}
_YO_VERBS = ("ид", "жд", "вед", "бер", "раст", "жив", "нес", "зов", "займ", "пойм", "начн", "прид", "пойд",
             "пройд", "найд", "привед", "перейд")
_YO = re.compile(r"\b(?:" + "|".join(_YO_WORDS) + r"|объем(?:а|у|ом|е|ы|ов|ам|ами|ах)?"
                 r"|(?:" + "|".join(_YO_VERBS) + r")ет"
                 r"|(?:пере|раз|со|от|за|по|вы|из|про|пре)?дает(?:ся)?|(?:о|пере|за|при|на|в)?стает(?:ся)?)\b",
                 re.I)


def _yo(m, text):
    word = m.group()
    low = word.lower()
    if low in _YO_WORDS:
        new = _YO_WORDS[low]
    elif low.startswith("объем"):
        new = "объём" + low[5:]
    else:  # a verb: the е of its ending -ет
        at = low.rindex("ет")
        new = low[:at] + "ё" + low[at + 1:]
    return new[0].upper() + new[1:] if word[0].isupper() else new


# --- decimal comma
_VERSION_BEFORE = re.compile(r"(?:Python|PyTorch|torch|CUDA|NCCL|MPI|PCIe|NVLink|InfiniBand|transformers|MkDocs|"
                             r"mkdocs\S*|верси\w*|раздел\w*|глав\w*|пункт\w*|§|v)\s*(?:[<>=≥≤~!]=?\s*)?$")


def _decimal(m, text):
    if _VERSION_BEFORE.search(text[max(0, m.start() - 40):m.start()]):
        return None
    return f"{m.group(1)},{m.group(2)}"


# --- units
_LATIN_UNITS = {"TFLOP/s": "TFLOP/с", "FLOP/s": "FLOP/с", "Gbit/s": "Гбит/с", "Gb/s": "Гбит/с", "GB/s": "ГБ/с",
                "TiB": "ТиБ", "GiB": "ГиБ", "MiB": "МиБ", "KiB": "КиБ", "kB": "кБ", "KB": "кБ", "MB": "МБ",
                "GB": "ГБ", "TB": "ТБ", "ms": "мс", "µs": "мкс", "us": "мкс", "ns": "нс", "s": "с"}
_UNITS = ["TFLOP/с", "FLOP/с", "Гбит/с", "ГБ/с", "ТиБ", "ГиБ", "МиБ", "КиБ", "кБ", "МБ", "ГБ", "ТБ", "мкс",
          "мс", "нс", "мин", "Б"]
_PREPOSITION_LIKE = ("с", "ч")  # units only before punctuation or at the end: «ранг 0 с предвыборкой»
_UNIT_END = r"(?![\w/])"


def _unit(m, text):
    if m.group("unit") in _PREPOSITION_LIKE and not re.match(r"[ \t]*(?:[,.;:!?)\]»]|—|–|$)",
                                                               text[m.end():m.end() + 3]):
        return None
    return f"{m.group('num')}{NBSP}{_LATIN_UNITS.get(m.group('unit'), m.group('unit'))}"


# --- ranges, multiplication
def _times(m, text):
    new = f"{m.group('a')} × {m.group('b')}"
    return None if m.group() == new else new


# --- thousands
_YEAR_AFTER = re.compile(r"\)|[ \t]*(?:год|гг?\.)|-[а-яё]")
_NOT_A_QUANTITY_BEFORE = re.compile(r"(?:строк\w*|lines?|issue|PR|порт\w*|port|seed|№|#)\s*"
                                    r"(?:\d+\s*(?:[–,-]|\bи\b)\s*)*$", re.I)


def _group(digits: str) -> str:
    return re.sub(r"(?<=\d)(?=(?:\d{3})+$)", NNBSP, digits)


def _thousands(m, text):
    digits = m.group("n")
    before, after = text[max(0, m.start() - 60):m.start()], text[m.end():m.end() + 6]
    if 1900 <= int(digits) <= 2099 and len(digits) == 4 and (before.endswith("(") or _YEAR_AFTER.match(after)):
        return None
    if _NOT_A_QUANTITY_BEFORE.search(before):
        return None
    return _group(digits)


def _spaced_thousands(m, text):
    if _NOT_A_QUANTITY_BEFORE.search(text[max(0, m.start() - 60):m.start()]):
        return None
    return m.group().replace(" ", NNBSP)


# --- dashes
def _dash(m, text):
    before = re.search(r"(\S+)$", text[:m.start()])
    after = re.match(r"(\S+)", text[m.end():])
    letters = lambda w: len(re.findall(r"[^\W\d_]", w)) >= 2  # noqa: E731
    if not (before and after and letters(before.group(1)) and (letters(after.group(1))
                                                                or after.group(1)[0] in "«(*")):
        return None
    return (NBSP if NBSP in m.group("sp") else " ") + "— "


TYPOGRAPHY: dict[str, list[Check]] = {
    "quotes": _quotes(),
    "yo": [Check(_YO, _yo)],
    "decimal": [Check(re.compile(_START + r"(\d+)\.(\d+)(?!\.?\d)(?![^\W\dxх])"), _decimal)],
    "latin-unit": [Check(re.compile(_START + rf"(?P<num>{_NUM})[ \t]*(?P<unit>"
                                    + "|".join(re.escape(u) for u in _LATIN_UNITS) + ")" + _UNIT_END), _unit)],
    "times": [Check(re.compile(_START + rf"(?P<a>{_NUM})(?:[xх]|[ \t]+[xх][ \t]+|[ \t]*×[ \t]*)"
                               rf"(?P<b>{_NUM})(?![\w])"), _times)],
    "range": [Check(re.compile(_START + rf"(?P<a>{_NUM})(?:-|—|[ \t]*[-–][ \t]+|[ \t]+[-–][ \t]*)"
                               rf"(?P<b>{_NUM})(?![\w-]|[.,]\d)"), _sub(r"\g<a>–\g<b>"))],
    "thousands": [Check(re.compile(_START + r"(?P<n>\d{4,})(?![\w]|\.\d|-\d)"), _thousands),
                  Check(re.compile(_START + r"\d{1,3}(?: \d{3})+(?![\d]|,\d{3})"), _spaced_thousands)],
    "percent": [Check(re.compile(r"(?<=\d)[^\S\u00a0\u202f]*%"), lambda m, text: NBSP + "%")],
    "unit": [Check(re.compile(_START + rf"(?P<num>{_NUM})[^\S\u00a0\u202f]*(?P<unit>"
                              + "|".join(re.escape(u) for u in [*_UNITS, *_PREPOSITION_LIKE]) + ")" + _UNIT_END),
                   _unit)],
    "dash": [Check(re.compile(r"(?<=\S)(?P<sp>[ \t\u00a0]+)(?:--|-|–)[ \t]+(?=\S)"), _dash),
             Check(re.compile(r"(?<=[^\W\d_])—(?=[^\W\d_])"), lambda m, text: " — ")],
    # a one-letter variable minus a number or another variable, outside formulas: n − 1 (GPT-2, ZeRO-1, 1-D stay)
    "minus": [Check(re.compile(r"(?<![\w-])(?P<a>[A-Za-z])[ \t]?-[ \t]?(?P<b>\d+|[A-Za-z])(?![\w-])"),
                    _sub("\\g<a> \u2212 \\g<b>"))],
    # an empty cell of a table is an em dash, as in the Russian tables' prose, not a hyphen
    "empty-cell": [Check(re.compile(r"(?<=\|)(?P<a>[ \t]+)-(?P<b>[ \t]+)(?=\|)"), _sub("\\g<a>—\\g<b>"))],
}


@dataclass(frozen=True)
class Violation:
    rule: str
    found: str
    fixed: str | None  # None: no mechanical fix
    context: str

    def __str__(self):
        fix = f" → {self.fixed!r}" if self.fixed is not None else " (поправьте руками)"
        return f"{self.rule}: {self.found!r}{fix} в {self.context}"


def _apply(piece: str, rules=None) -> tuple[str, list[Violation]]:
    """One prose piece with every rule applied in STYLE.md's order, and what each rule found on the way."""
    found = []
    for rule in rules or TYPOGRAPHY:
        for check in TYPOGRAPHY[rule]:
            out, pos = [], 0
            for m in check.pattern.finditer(piece):
                new = check.fix(m, piece)
                if new is None or new == m.group():
                    continue
                ctx = " ".join(_context(piece, m.start(), m.end(), 25).split())
                found.append(Violation(rule, m.group(), None if new is FLAG else new, ctx))
                if new is not FLAG:
                    out += [piece[pos:m.start()], new]
                    pos = m.end()
            piece = "".join(out) + piece[pos:]
    return piece, found


def typeset(text: str) -> str:
    """A Markdown text with the typography rules of lessons/ru/STYLE.md applied to its prose (never inside
    code spans, fences, math, links, HTML or front matter)."""
    return "".join(_apply(piece)[0] if is_prose else piece for is_prose, piece in segments(text))


def typography(text: str, rules=None) -> list[Violation]:
    """What the typography rules find in a Markdown text's prose."""
    return [v for is_prose, piece in segments(text) if is_prose for v in _apply(piece, rules)[1]]


@pytest.mark.parametrize("rule, bad, good", [(r, b, g) for r, pairs in TYPOGRAPHY_TABLE for b, g in pairs],
                         ids=lambda x: x if isinstance(x, str) and re.fullmatch(r"[\w-]+", x) else "")
def test_each_typography_rule_fixes_its_example(rule, bad, good):
    assert bad != good
    assert typography(bad, [rule]), f"{rule} misses «{bad}»"
    assert not typography(good, [rule]), f"{rule} finds something in «{good}»: {typography(good, [rule])}"
    assert typeset(bad) == good, f"{rule}: typeset(«{bad}») = «{typeset(bad)}», STYLE.md says «{good}»"
    assert not typography(good), f"«{good}» breaks another rule: {typography(good)}"


@pytest.mark.parametrize("rule, fine", [
    ("quotes", "«уже так»"),
    ("yo", "все ранги, быстрее, падает, делает"),
    ("decimal", "Python 3.10, Python >= 3.10, torch 2.13.0, PCIe 5.0, раздел 3.4, 04.12.2026, 10.0.0.1"),
    ("latin-unit", "fp32 s, 5 ранков, 2 ГБ, ratio 1,16x"),
    ("times", "PCIe 5.0 x16, 1,16x шага, 8 × 8, 0x1F"),
    ("range", "GPT-2, ZeRO-1, 2026-12-04, 1–2, n - 1, 10 — за два шага"),
    ("thousands", "(2019), USENIX ATC 2021), в 2021 году, строки 2919–2925, H100, DDR5-4800, 4\u202f096, 3,1416, "
                  "pytorch#190489, порт 29500, 512, 04.12.2026"),
    ("percent", "28,6\u00a0%, 5\u202f%"),
    ("unit", "ранг 0 с предвыборкой, FSDP2 с ним, на 4 с другой стратегией, 120\u00a0ГБ, bf16 с"),
    ("dash", "- пункт списка\n| - | 1 |\nn - 1, GPT-2, по-русски, а — б"),
    ("minus", "GPT-2, ZeRO-1, 1-D, 2-D, x-axis, по-русски, k-й, n \u2212 1, Llama-3-8B, A-B-тест"),
    ("empty-cell", "|---|---|\n| — | 1 |\n| a - b |"),
])
def test_typography_rules_leave_exceptions_alone(rule, fine):
    assert not typography(fine, [rule]), typography(fine, [rule])


@pytest.mark.parametrize("rule, bad", [
    ("quotes", 'без пары " кавычка'), ("yo", "Еще"), ("decimal", "1.5x"), ("latin-unit", "5 ms"),
    ("times", "8 x 1024"), ("range", "10 – 20"), ("thousands", "по умолчанию 2000, и 1024"),
    ("percent", "5%"), ("unit", "таймаут 3 с, после"), ("dash", "шард -- доля"),
    ("minus", "r-1 и r+1, 2(n - 1)"), ("empty-cell", "| 1 | - |"),
])
def test_typography_rules_catch_more_than_their_style_sheet_example(rule, bad):
    assert typography(bad, [rule])


def test_typeset_touches_prose_only():
    text = ('---\ntitle: "Курс: 50%"\n---\n# 10% и 8x8\n\n```python\nx = "a" - 2x2 # 50%\n```\n'
            "`4096 ms` $2x2 - 50\\%$ [1-2 ГБ](a-1-2.ipynb) <span title=\"50%\">5-6</span> <!-- 3-4 -->\n"
            "https://x.org/1-2 и 1-2\n")
    assert typeset(text) == text.replace("# 10% и 8x8", "# 10\u00a0% и 8 × 8").replace("и 1-2\n", "и 1–2\n") \
        .replace("\">5-6</span>", "\">5–6</span>")
    assert typeset(typeset(text)) == typeset(text)
    assert [p for p, _ in segments("a `b` c")] == [True, False, True]


@pytest.mark.parametrize("name", NAMES)
def test_russian_markdown_follows_the_typography(name):
    found = [f"cell {i}: {v}" for i, text in markdown_of(load("ru", name)) for v in typography(text)]
    assert not found, f"ru/{name}: {len(found)} typography violations (lessons/ru/STYLE.md; " \
        f"`python tests/course/test_russian.py --fix lessons/ru/{name}` fixes the mechanical ones):\n" + "\n".join(found)


@pytest.mark.parametrize("page", [*RU_PAGES, "README.ru.md"])
def test_russian_pages_follow_the_typography(page):
    found = [str(v) for v in typography(page_text(page))]
    assert not found, f"{page}: {len(found)} typography violations (lessons/ru/STYLE.md):\n" + "\n".join(found)


# --------------------------------------------------------------------------- English-only output lines

# Latin words that are names, not English text, when printed in a Russian lesson (small and explicit).
ALLOWED_WORDS = {"naive", "ring", "builtin", "tree", "flat", "root", "blocks", "bucket", "grad", "params",
                 "grads", "optimizer", "forward", "backward"}  # forward/backward: Latin in Russian too (STYLE.md)
_ERROR = re.compile(r"\b[A-Z]\w*(?:Error|Exception|Warning|Timeout)\b:?")
_NOT_WORDS = re.compile(
    r"'[^']*'|\"[^\"]*\""            # quoted: dict keys, string reprs
    r"|\S*[_./\\()\[\]{}=<>@]\S*|\w+:\w\S*"  # identifiers, attributes, calls, paths, reprs, key=value
    r"|\b\w*\d\w*\b"                 # anything with a digit: fp32, 4K, n2
    r"|\b[A-Za-z]*[a-z][A-Z]\w*\b"   # CamelCase API names: AllReduce, ReduceScatter, LaunchError
    r"|\b[A-Z]{2,}\b")                # acronyms: DDP, FSDP, GPU


def _english_words(text: str) -> list[str]:
    return [w for w in re.findall(r"[A-Za-z]{3,}", _NOT_WORDS.sub(" ", text)) if w.lower() not in ALLOWED_WORDS]


def english_only(line: str) -> bool:
    """A line with no Cyrillic and two or more English words of 3+ letters outside names and code."""
    if CYRILLIC.search(line) or line.lstrip().startswith(("Traceback", "File ", "^")):
        return False
    error = _ERROR.search(line)
    if error:  # Python's and PyTorch's own messages stay as they are; what precedes them must not be English
        line = line[:error.start()]
    return len(_english_words(line)) >= 2


def test_english_only_detects_sentences_not_code():
    assert english_only("the sum over the four ranks: [10.0, 20.0, 30.0]")
    assert english_only("bucket 0: issued at 1.0 ms, waited for until 21.8 ms")
    assert english_only("flat, called directly             RuntimeError: tok_emb is inside")
    assert not english_only("ранг 0: [1.0, 2.0] -> None")
    assert not english_only("RuntimeError: aten.embedding.default got mixed torch.Tensor and DTensor")
    assert not english_only("['all_gather(root)', 'all_gather(blocks.0)', 'reduce_scatter(root)']")
    assert not english_only("  4K all_reduce     builtin       1.613       0.003")
    assert not english_only("tensor([1., 2.]) torch.float32 NO_SHARD FULL_SHARD")


def library_messages(lines: list[tuple[int, str, str]]) -> tuple[list[str], set[int]]:
    """Library exception text (an exception's name, then English) in printed lines: those with no Russian
    reading after them in the same cell (the rest of the line or a following line), and the indices of the
    English lines that continue a message which does have its reading."""
    unread, continued = [], set()
    for k, (cell, kind, line) in enumerate(lines):
        error = _ERROR.search(line)
        if kind == "error" or not error:
            continue
        rest = line[error.end():]
        message = CYRILLIC.split(rest, maxsplit=1)[0]
        if len(_english_words(message)) < 2 or CYRILLIC.search(rest):
            continue  # not English text, or read in Russian on the same line
        after = [j for j in range(k + 1, len(lines)) if lines[j][0] == cell and lines[j][1] != "error"]
        reading = next((j for j in after if CYRILLIC.search(lines[j][2])), None)
        if reading is None:
            unread.append(f"cell {cell}: {line.strip()[:120]}")
        else:
            continued.update(range(k + 1, reading))
    return unread, continued


def test_library_messages_need_a_russian_reading():
    read = [(1, "stream", "LaunchTimeout | ranks [0, 1] did not finish within 5 s: same order?"),
            (1, "stream", "rank 0 waits in all_gather while the others went on"),
            (1, "stream", "    ранги [0, 1] не завершились за 5 с")]
    assert library_messages(read) == ([], {1})
    assert library_messages(read[:2])[0] and library_messages([read[0], (2, "stream", "ранги")])[0]
    read_on_the_line = (1, "stream", "ранг 0: RuntimeError: Timed out waiting 2000ms; ранг 1 ушёл")
    not_english = (1, "stream", "оно всё ещё выбрасывает NotImplementedError) и запустите")
    assert library_messages([read_on_the_line]) == library_messages([not_english]) == ([], set())


@pytest.mark.parametrize("name", NAMES)
def test_russian_outputs_have_no_english_only_lines(name):
    lines = output_lines(load("ru", name))
    _, continued = library_messages(lines)
    english = [f"cell {i}: {line.strip()[:120]}" for k, (i, _, line) in enumerate(lines)
               if english_only(line) and k not in continued]
    assert not english, f"ru/{name}: {len(english)} of {len(lines)} output lines are English only:\n" + \
        "\n".join(english)


@pytest.mark.parametrize("name", NAMES)
def test_library_messages_are_followed_by_a_russian_reading(name):
    unread, _ = library_messages(output_lines(load("ru", name)))
    assert not unread, f"ru/{name}: library messages with no Russian reading after them:\n" + "\n".join(unread)


def test_sizes_and_numbers_in_both_languages():
    from fsdp_mini.course.language import get_language, num, set_language, size, yes
    before = get_language()
    try:
        set_language("en")
        assert [size(512), size(4000), size(1e8), size(31.4e9), num(49152), num(1.5, 1)] == [
            "512 B", "4.0 kB", "100.0 MB", "31.4 GB", "49,152", "1.5"]
        assert [yes(True), yes(False)] == ["True", "False"]
        set_language("ru")
        assert [size(512), size(4000), size(1e8), size(31.4e9), num(49152), num(1.5, 1)] == [
            "512 Б", "4,0 кБ", "100,0 МБ", "31,4 ГБ", "49\u202f152", "1,5"]
        assert [yes(True), yes(0), yes(1e-6 < 1e-5)] == ["да", "нет", "да"]  # a verdict (STYLE.md, output rule bool)
    finally:
        set_language(before)


# ------------------------------------------------------------------------------------------ --fix

def fix_file(path: Path) -> int:
    """Apply `typeset` to a notebook's markdown cells or to a Markdown file, in place; the number of
    changed cells (or 1 for a changed file)."""
    if path.suffix == ".ipynb":
        nb = json.loads(path.read_text(encoding="utf-8"))
        changed = 0
        for cell in nb["cells"]:
            if cell["cell_type"] == "markdown":
                text = src(cell)
                new = typeset(text)
                if new != text:
                    cell["source"] = new.splitlines(keepends=True) if isinstance(cell["source"], list) else new
                    changed += 1
        if changed:
            with path.open("w", encoding="utf-8") as f:
                json.dump(nb, f, ensure_ascii=False, indent=1)
                f.write("\n")
        return changed
    text = path.read_text(encoding="utf-8")
    new = typeset(text)
    if new != text:
        path.write_text(new, encoding="utf-8")
    return int(new != text)


def test_fix_rewrites_markdown_cells_and_files(tmp_path):
    nb = {"cells": [{"cell_type": "markdown", "metadata": {}, "source": ["Блоки 0-3: 120 ГБ,\n", "`0-3`"]},
                    {"cell_type": "code", "metadata": {}, "source": ["x = 0-3  # 120 ГБ"], "outputs": [],
                     "execution_count": None}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "lesson.ipynb"
    path.write_text(json.dumps(nb, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    assert fix_file(path) == 1 and fix_file(path) == 0
    fixed = json.loads(path.read_text(encoding="utf-8"))
    assert fixed["cells"][0]["source"] == ["Блоки 0–3: 120\u00a0ГБ,\n", "`0-3`"]
    assert fixed["cells"][1]["source"] == nb["cells"][1]["source"]
    assert path.read_text(encoding="utf-8").endswith("}\n") and "\u00a0" in path.read_text(encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text("Около 5%.\n", encoding="utf-8")
    assert fix_file(page) == 1 and page.read_text(encoding="utf-8") == "Около 5\u00a0%.\n"


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "--fix" or len(argv) < 2:
        print("usage: python tests/course/test_russian.py --fix FILE...  (Russian .ipynb or .md files)", file=sys.stderr)
        return 2
    for name in argv[1:]:
        path = Path(name)
        if path.resolve() == STYLE:
            print(f"{name}: the style sheet itself, left alone")
            continue
        before = typography(path.read_text(encoding="utf-8")) if path.suffix == ".md" else None
        changed = fix_file(path)
        left = [v for v in (typography(path.read_text(encoding="utf-8")) if path.suffix == ".md" else
                            [v for _, t in markdown_of(json.loads(path.read_text(encoding="utf-8")))
                             for v in typography(t)])]
        what = "cells" if path.suffix == ".ipynb" else "file"
        print(f"{name}: {changed} {what} changed" + (f" ({len(before)} fixes)" if before else "")
              + (f"; {len(left)} left to fix by hand:" if left else ""))
        for v in left:
            print(f"  {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


_PLACEHOLDER = re.compile(r"\{[^{}]*\}")
_JS_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')
SITE_SCRIPTS = sorted((LESSONS / "assets").rglob("*.js"))


def russian_strings(source: str) -> list[str]:
    """The Russian string literals of a script (JavaScript or Python), escapes decoded, placeholders left out."""
    out = []
    for m in _JS_STRING.finditer(source):
        text = re.sub(r"\\u([0-9a-fA-F]{4})", lambda u: chr(int(u.group(1), 16)), m.group(1))
        if CYRILLIC.search(text):
            out.append(" ".join(_PLACEHOLDER.sub(" ", text).split()))
    return out


def test_russian_strings_are_found_and_placeholders_dropped():
    assert russian_strings('a: "ранг {rank} из {world}", b: "rank", c: "\\u0433руппа"') == ["ранг из", "группа"]


def test_russian_messages_use_the_agreed_terms():
    """Issue 41: every Russian message the course can print (fsdp_mini/course/messages.py), printed by an executed
    lesson or not, follows the glossary; placeholders are code, not prose."""
    from fsdp_mini.course.messages import MESSAGES

    hits = [f"{key}: {h}" for key, (_, ru) in MESSAGES.items()
            for h in ruled_out(" ".join(_PLACEHOLDER.sub(" ", ru).split()))]
    assert not hits, "messages.py: ruled-out forms (lessons/ru/STYLE.md):\n" + "\n".join(hits)


@pytest.mark.parametrize("script", [p.relative_to(LESSONS).as_posix() for p in SITE_SCRIPTS])
def test_the_sites_russian_strings_use_the_agreed_terms(script):
    """The Russian pages' calculators print their own strings: the glossary holds for them as for the lessons."""
    hits = [h for text in russian_strings((LESSONS / script).read_text(encoding="utf-8")) for h in ruled_out(text)]
    assert not hits, f"{script}: ruled-out forms (lessons/ru/STYLE.md):\n" + "\n".join(hits)


def test_the_site_check_catches_a_planted_second_rendering():
    planted = 'ru: {mm: "матричные умножения", head: "выходной слой и лосс"}'
    assert len([h for text in russian_strings(planted) for h in ruled_out(text)]) == 2
