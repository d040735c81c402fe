"""The Russian edition: twins with the same structure and numbers, the agreed terms, no English output.

Decisions in /work/shared/RU_STYLE.md (issue 12). For every lesson twin (lessons/en/NN_*.ipynb and
lessons/ru/NN_*.ipynb):

- the same headings, level and order;
- the same numbers in the prose of each markdown cell (49 152 / 1,5 in Russian, 49,152 / 1.5 in English);
- no ruled-out variant of a term in the Russian markdown, in the Russian printed outputs and in
  lessons/ru/*.md;
- no English-only line in the Russian printed outputs (code identifiers, API names, tensor reprs, paths,
  tracebacks and Python/PyTorch error messages excepted).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

LESSONS = Path(__file__).resolve().parent.parent / "lessons"
NAMES = sorted(p.name for p in (LESSONS / "en").glob("*.ipynb") if (LESSONS / "ru" / p.name).exists())
RU_PAGES = sorted(p.name for p in (LESSONS / "ru").glob("*.md"))
CYRILLIC = re.compile("[а-яёА-ЯЁ]")


def load(lang: str, name: str) -> dict:
    return json.loads((LESSONS / lang / name).read_text(encoding="utf-8"))


def src(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def without_fences(text: str) -> str:
    return re.sub(r"^```.*?^```", " ", text, flags=re.S | re.M)


def prose(text: str) -> str:
    """Markdown a reader reads: no code blocks, inline code, links' targets or HTML tags (math stays)."""
    text = without_fences(text)
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


# ------------------------------------------------------------------------------------------- terms

# RU_STYLE.md's "never" column, as Cyrillic word forms.
RULED_OUT = {
    "кусок (use: чанк)": r"\bкус(?:ок|ка|ку|ком|ке|ки|ков|кам|ками|ках|оч\w*)\b",
    "звено, линк (use: канал)": r"\bзвен(?:о|а|у|ом|е|ья|ьев|ьям|ьями|ьях)\b|\bлинк\w*",
    "связь (use: обмен данными, коммуникации)": r"\bсвяз(?:ь|и|ью|ей|ям|ями|ях)\b",
    "латентность (use: задержка)": r"\bлатентн\w*",
    "потери (use: лосс)": r"\bпотер(?:и|ь|ей|ям|ями|ях)\b",
    "паритет, сверка (use: совпадение с эталоном)": r"\bпаритет\w*|\bсверк(?:а|и|е|у|ой|ами|ах|ам)?\b",
    "нода (use: узел)": r"\bнод(?:а|ы|у|е|ой|ою|ам|ами|ах)?\b",
    "решётка (use: сетка)": r"\bреш[её]тк\w*",
    "коллектив as a noun (use: коллективная операция)": r"\bколлектив(?:|а|у|ом|е|ы|ов|ам|ами|ах)\b",
    "лэптоп (use: ноутбук)": r"\bл[эа]птоп\w*",
    "GPU is feminine (одна GPU, каждая GPU)":
        r"\b(?:один|одного|одному|одним|одном|каждый|каждого|каждому|каждым|каждом|этот|этого|этому|этим|"
        r"этом|весь|всего|свой|своего|своему|своим|своём|любой|любого|любому|любым|любом|другой|другого|"
        r"другому|другим|другом|первый|второй|целый)\s+GPU\b",
    "дополнение (use: паддинг)": r"\bдополнени\w*",
}
# «ноутбук» is a laptop only after these words («на ноутбуке», «CPU обычного ноутбука»); else a notebook.
_LAPTOP_BEFORE = re.compile(r"^(?:на|обычн\w*|одн(?:ом|ого)|своём|вашем|любом)$", re.I)


def ruled_out(text: str) -> list[str]:
    hits = []
    for rule, pattern in RULED_OUT.items():
        for m in re.finditer(pattern, text, flags=re.I):
            hits.append(f"{rule}: …{text[max(0, m.start() - 30):m.end() + 20]}…".replace("\n", " "))
    for m in re.finditer(r"\bноутбук\w*", text, flags=re.I):
        before = re.findall(r"[\w-]+", text[max(0, m.start() - 40):m.start()])
        if not (before and _LAPTOP_BEFORE.match(before[-1])):
            hits.append(f"«ноутбук» for a notebook (use: блокнот): …{text[max(0, m.start() - 30):m.end() + 20]}…"
                        .replace("\n", " "))
    return hits


def test_ruled_out_terms_are_found():
    assert ruled_out("режем на куски по звеньям; связь; одна нода; ячейка ноутбука; каждый GPU")
    assert len(ruled_out("режем на куски по звеньям; связь; одна нода; ячейка ноутбука; каждый GPU")) == 6
    assert not ruled_out("чанки по каналам; обмен данными; один узел; ячейка блокнота; каждая GPU; "
                         "на обычном ноутбуке; коллективные операции")


def output_lines(nb: dict) -> list[tuple[int, str]]:
    """(cell index, line) of everything a notebook's code cells print or display as text."""
    lines = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                text = src({"source": out["text"]})
            elif out.get("output_type") == "error":
                text = "\n".join(out.get("traceback", []))
            else:
                data = out.get("data", {})
                if "text/markdown" in data:
                    text = without_fences(src({"source": data["text/markdown"]}))
                elif "text/plain" in data and not any(k.startswith("image/") or k == "text/html" for k in data):
                    text = src({"source": data["text/plain"]})
                else:
                    continue
            lines += [(i, line) for line in text.splitlines() if line.strip()]
    return lines


@pytest.mark.parametrize("name", NAMES)
def test_russian_markdown_and_outputs_use_the_agreed_terms(name):
    nb = load("ru", name)
    hits = [f"cell {i}: {h}" for i, c in enumerate(nb["cells"]) if c["cell_type"] == "markdown"
            for h in ruled_out(prose(src(c)))]
    hits += [f"cell {i} output: {h}" for i, line in output_lines(nb) for h in ruled_out(line)]
    assert not hits, f"ru/{name}:\n" + "\n".join(hits)


@pytest.mark.parametrize("page", RU_PAGES)
def test_russian_pages_use_the_agreed_terms(page):
    hits = ruled_out(prose((LESSONS / "ru" / page).read_text(encoding="utf-8")))
    assert not hits, f"ru/{page}:\n" + "\n".join(hits)


# --------------------------------------------------------------------------- English-only output lines

# Latin words that are names, not English text, when printed in a Russian lesson (small and explicit).
ALLOWED_WORDS = {"naive", "ring", "builtin", "tree", "flat", "root", "blocks", "bucket", "grad", "params",
                 "grads", "optimizer"}
_ERROR = re.compile(r"\b[A-Z]\w*(?:Error|Exception|Warning|Timeout)\b:?")
_NOT_WORDS = re.compile(
    r"'[^']*'|\"[^\"]*\""            # quoted: dict keys, string reprs
    r"|\S*[_./\\()\[\]{}=<>@]\S*|\w+:\w\S*"  # identifiers, attributes, calls, paths, reprs, key=value
    r"|\b\w*\d\w*\b"                 # anything with a digit: fp32, 4K, n2
    r"|\b[A-Za-z]*[a-z][A-Z]\w*\b"   # CamelCase API names: AllReduce, ReduceScatter, LaunchError
    r"|\b[A-Z]{2,}\b")                # acronyms: DDP, FSDP, GPU


def english_only(line: str) -> bool:
    """A line with no Cyrillic and two or more English words of 3+ letters outside names and code."""
    if CYRILLIC.search(line) or line.lstrip().startswith(("Traceback", "File ", "^")):
        return False
    error = _ERROR.search(line)
    if error:  # Python's and PyTorch's own messages stay as they are; what precedes them must not be English
        line = line[:error.start()]
    words = [w for w in re.findall(r"[A-Za-z]{3,}", _NOT_WORDS.sub(" ", line)) if w.lower() not in ALLOWED_WORDS]
    return len(words) >= 2


def test_english_only_detects_sentences_not_code():
    assert english_only("the sum over the four ranks: [10.0, 20.0, 30.0]")
    assert english_only("bucket 0: issued at 1.0 ms, waited for until 21.8 ms")
    assert english_only("flat, called directly             RuntimeError: tok_emb is inside")
    assert not english_only("ранг 0: [1.0, 2.0] -> None")
    assert not english_only("RuntimeError: aten.embedding.default got mixed torch.Tensor and DTensor")
    assert not english_only("['all_gather(root)', 'all_gather(blocks.0)', 'reduce_scatter(root)']")
    assert not english_only("  4K all_reduce     builtin       1.613       0.003")
    assert not english_only("tensor([1., 2.]) torch.float32 NO_SHARD FULL_SHARD")


@pytest.mark.parametrize("name", NAMES)
def test_russian_outputs_have_no_english_only_lines(name):
    lines = output_lines(load("ru", name))
    english = [f"cell {i}: {line.strip()[:120]}" for i, line in lines if english_only(line)]
    share = len(english) / max(1, len(lines))
    assert share == 0, f"ru/{name}: {len(english)} of {len(lines)} output lines are English only:\n" + "\n".join(english)


def test_sizes_and_numbers_in_both_languages():
    from fsdp_mini.course.language import get_language, num, set_language, size
    before = get_language()
    try:
        set_language("en")
        assert [size(512), size(4000), size(1e8), size(31.4e9), num(49152), num(1.5, 1)] == [
            "512 B", "4.0 kB", "100.0 MB", "31.4 GB", "49,152", "1.5"]
        set_language("ru")
        assert [size(512), size(4000), size(1e8), size(31.4e9), num(49152), num(1.5, 1)] == [
            "512 Б", "4,0 кБ", "100,0 МБ", "31,4 ГБ", "49\u202f152", "1,5"]
    finally:
        set_language(before)
