"""Every figure a lesson's prose states is one of its cells printed: the prose cannot go stale silently.

A lesson's markdown says "148.3 GiB per GPU" because a cell computed it. When the code behind it changes
(the planner's memory model, say) and the lesson is re-executed, the outputs move and prose written once by
hand would not. So every number the prose gives with a unit (GiB, GB, %, tokens/s, TFLOP/s, in Russian ГиБ,
ГБ, %, токенов/с, TFLOP/с), and every count of tokens, GPUs, sequences, parameters, blocks or nodes (small
ones pass easily; a vocabulary of 128,256 tokens does not), must appear among the notebook's stored outputs,
written as that language writes numbers (31.1 and 8,192 in English; 31,1 and 8 192 in Russian). A figure
the prose needs and no cell prints is printed by the cell it comes from; one that is not computed at all (a
datasheet's 80 GiB is printed by `show_assumptions`) has to be printed too, or said without a number.

LESSONS lists the lessons held to this rule (12 and 13, whose verdicts rest on the planner; the others state
datasheet figures in prose).
"""
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "lessons"
LESSONS = ["12_tensor_parallel.ipynb", "13_planning_a_real_run.ipynb"]

_GROUP = "[\u202f\u00a0 ]"  # a Russian thousands separator as prose may write it; num() prints U+202F
NUMBER = {"en": r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?",
          "ru": rf"\d{{1,3}}(?:{_GROUP}\d{{3}})+(?:,\d+)?|\d+(?:,\d+)?"}
UNITS = {"en": ["GiB", "GB", "%", "tokens/s", "TFLOP/s", "token", "GPU", "H100", "sequence", "parameter", "block",
                "node"],
         "ru": ["ГиБ", "ГБ", "%", "токенов/с", "TFLOP/с", "токен", "GPU", "H100", "последовательност", "параметр",
                "блок", "узл", "узел"]}
"""Units, then the nouns of plain counts (stems: 1 sequence, 8 sequences; 1 узел, 32 узла)."""
RANGE = "[–-]"  # 14–29 %: both ends are stated figures


def stated_pattern(lang: str) -> re.Pattern:
    """A number (or a range of two) followed by one of the units, with nothing of a longer number around it."""
    n = NUMBER[lang]
    units = "|".join(re.escape(u) for u in UNITS[lang])
    return re.compile(rf"(?<![\w.,\u202f])(?P<a>{n})(?:{RANGE}(?P<b>{n}))?[\s\u00a0\u202f]*(?:{units})")


def normal(number: str) -> str:
    """One spelling for a thousands separator (prose may use U+00A0 or U+202F, num() prints U+202F)."""
    return re.sub(r"(?<=\d)[\u202f\u00a0 ](?=\d{3})", "\u202f", number)


def src(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def prose(cell) -> str:
    """What the reader reads as the lesson's claims: no code, inline code, link targets, math, HTML, nor the
    folded solutions (their code is the exercise module's source)."""
    text = re.sub(r"<details>.*?</details>", " ", src(cell), flags=re.S)
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"\$\$.*?\$\$|\$[^$]*\$", " ", text, flags=re.S)
    return re.sub(r"<[^>]+>", " ", text)


def printed_numbers(nb, lang: str) -> set[str]:
    """Every number the code cells printed (streams and results' plain text; not `show_source` listings,
    whose digits are code)."""
    texts = []
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                texts.append("".join(out["text"]))
            elif "text/plain" in out.get("data", {}):
                texts.append("".join(out["data"]["text/plain"]))
    number = re.compile(rf"(?<![\d.,\u202f])(?:{NUMBER[lang]})(?![\d])")
    return {normal(m.group()) for text in texts for m in number.finditer(text)}


def stated_figures(nb, lang: str) -> list[tuple[int, str]]:
    """(cell index, number) for every number with a unit in the markdown cells."""
    found = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        for m in stated_pattern(lang).finditer(prose(cell)):
            found += [(i, normal(m.group(g))) for g in ("a", "b") if m.group(g)]
    return found


def unprinted(lang: str, name: str) -> list[str]:
    nb = json.loads((ROOT / lang / name).read_text(encoding="utf-8"))
    printed = printed_numbers(nb, lang)
    return [f"cell {i}: {n!r}" for i, n in stated_figures(nb, lang) if n not in printed]


@pytest.mark.parametrize("lang", ["en", "ru"])
@pytest.mark.parametrize("name", LESSONS)
def test_every_figure_the_prose_states_is_printed_by_a_cell(lang, name):
    nb = json.loads((ROOT / lang / name).read_text(encoding="utf-8"))
    assert len(stated_figures(nb, lang)) >= 10, "the pattern finds the lesson's figures"
    missing = unprinted(lang, name)
    assert not missing, (f"{lang}/{name}: figures the prose states that no cell prints (print them in the cell "
                         "they come from, or say them without a number):\n" + "\n".join(missing))


@pytest.mark.parametrize("lang, text, figures", [
    ("en", "It needs 148.3 GiB, 8,192 tokens/s and 14–29 %; 989 TFLOP/s, 96 GB, 2M tokens, lesson 13, "
     "1 sequence on 32 nodes.", ["148.3", "8,192", "14", "29", "989", "96", "1", "32"]),
    ("ru", "Нужно 148,3\u00a0ГиБ, 8\u202f192\u00a0токенов/с и 14–29\u00a0%; 989 TFLOP/с, 96\u00a0ГБ, урок 13, "
     "1 последовательность на 32 узлах.", ["148,3", "8\u202f192", "14", "29", "989", "96", "1", "32"]),
])
def test_the_pattern_finds_numbers_with_units_in_each_language(lang, text, figures):
    nb = {"cells": [{"cell_type": "markdown", "source": text}]}
    assert [n for _, n in stated_figures(nb, lang)] == figures


def test_a_figure_no_cell_prints_is_reported_and_a_printed_one_is_not():
    nb = {"cells": [{"cell_type": "markdown", "source": "Peaks at 73.8 GiB, not 73.9 GiB nor 3.8 GiB."},
                    {"cell_type": "code", "source": "", "outputs": [
                        {"output_type": "stream", "name": "stdout", "text": ["peak  73.82 173.8 73.8\n"]}]}]}
    printed = printed_numbers(nb, "en")
    assert [n for _, n in stated_figures(nb, "en") if n not in printed] == ["73.9", "3.8"]
