"""The lessons' code cells teach, in no language: the twins share their code because it carries no
translation, not because it carries both.

- No `tr(` and no Cyrillic in any code cell of either edition: what a cell prints comes from the display
  layer (`fsdp_mini.course.show`) and its message table (`fsdp_mini.course.messages`).
- The twins' code cells are identical but for one line of the imports cell, `set_language("en")` or
  `set_language("ru")`.
- Lines that only format output (a `print` call, a loop or branch that only prints, a string built for
  printing) are at most 8 % of a lesson's non-blank code lines.
- Code cells are short: at most one in ten of a lesson's cells runs past 20 non-blank lines (so the 90th
  percentile of the course's cell lengths is at most 20).
- The message table is whole: every entry has English and Russian with the same placeholders, English
  without Cyrillic, every key the lessons use exists, and every key is used somewhere.
"""
import ast
import json
import re
import string
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LESSONS = ROOT / "lessons"
NAMES = sorted(p.name for p in (LESSONS / "en").glob("*.ipynb"))
CYRILLIC = re.compile("[а-яёА-ЯЁ]")
LANGUAGE_LINE = re.compile(r'^set_language\("(en|ru)"\)$', re.M)
FORMATTING_SHARE = 0.08
LONG_CELL, LONG_SHARE = 20, 0.10


def code_cells(lang: str, name: str) -> list[str]:
    nb = json.loads((LESSONS / lang / name).read_text(encoding="utf-8"))
    cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
    return ["".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in cells]


def non_blank(source: str) -> list[str]:
    return [line for line in source.splitlines() if line.strip()]


def _is_print(node) -> bool:
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
            and getattr(node.value.func, "id", None) == "print")


def _builds_text(node) -> bool:
    """An assignment of a string made for printing: an f-string, a literal, "...".join(...), "...".format."""
    if not isinstance(node, (ast.Assign, ast.AugAssign)):
        return False
    value = node.value
    if isinstance(value, ast.JoinedStr) or (isinstance(value, ast.Constant) and isinstance(value.value, str)):
        return True
    return (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
            and value.func.attr in ("join", "format", "ljust", "rjust") and isinstance(value.func.value, ast.Constant))


def _only_formats(node) -> bool:
    if _is_print(node) or _builds_text(node):
        return True
    if isinstance(node, (ast.For, ast.If)):
        body = node.body + node.orelse
        return bool(body) and all(_only_formats(n) for n in body)
    return False


def formatting_lines(source: str) -> set[int]:
    """The line numbers (1-based) of a cell's statements that only format output, and of any line with `tr(`."""
    lines = {i for i, line in enumerate(source.splitlines(), 1) if re.search(r"\btr\(", line)}
    try:
        tree = ast.parse(source)
    except SyntaxError:  # a cell with IPython magics: count nothing but tr(
        return lines
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and _only_formats(node):
            lines |= set(range(node.lineno, node.end_lineno + 1))
    return {i for i in lines if source.splitlines()[i - 1].strip()}


def test_formatting_lines_are_counted_as_the_docstring_says():
    cell = ('x = f(1)\nprint(f"{x:>9}",\n      x)\nfor r in rows:\n    print(r)\nlabel = f"{x}"\n'
            'say("key", n=x)\nassert x\nfor r in rows:\n    y = r\n    print(y)\n')
    assert formatting_lines(cell) == {2, 3, 4, 5, 6, 11}  # a print in a loop that computes: its line only


@pytest.mark.parametrize("lang", ["en", "ru"])
@pytest.mark.parametrize("name", NAMES)
def test_code_cells_carry_no_translation(lang, name):
    for i, source in enumerate(code_cells(lang, name)):
        assert not re.search(r"\btr\(", source), f"{lang}/{name}, code cell {i} calls tr(: use say/show/text"
        assert not CYRILLIC.search(source), f"{lang}/{name}, code cell {i} has Cyrillic: move it to messages.py"


@pytest.mark.parametrize("name", NAMES)
def test_twins_differ_only_in_the_language_line(name):
    en, ru = code_cells("en", name), code_cells("ru", name)
    assert len(en) == len(ru)
    assert LANGUAGE_LINE.findall(en[0]) == ["en"] and LANGUAGE_LINE.findall(ru[0]) == ["ru"], (
        "the first code cell (the imports) sets the language, once")
    assert en[0].replace('set_language("en")', 'set_language("ru")') == ru[0]
    for i, (a, b) in enumerate(zip(en[1:], ru[1:]), 1):
        assert a == b, f"code cell {i} differs between the twins"
        assert not LANGUAGE_LINE.search(a), f"code cell {i} sets the language again"


@pytest.mark.parametrize("name", NAMES)
def test_code_is_not_mostly_formatting(name):
    cells = code_cells("en", name)
    total = sum(len(non_blank(c)) for c in cells)
    formatting = sum(len(formatting_lines(c)) for c in cells)
    assert formatting <= FORMATTING_SHARE * total, (
        f"{name}: {formatting} of {total} code lines only format output (at most {FORMATTING_SHARE:.0%})")


@pytest.mark.parametrize("name", NAMES)
def test_code_cells_are_short(name):
    lengths = [len(non_blank(c)) for c in code_cells("en", name)]
    long = [(i, n) for i, n in enumerate(lengths) if n > LONG_CELL]
    assert len(long) <= max(1, int(LONG_SHARE * len(lengths))), (
        f"{name}: code cells (index, lines) longer than {LONG_CELL} lines: {long}")


def test_the_course_s_cells_are_short_and_free_of_formatting():
    cells = [c for name in NAMES for c in code_cells("en", name)]
    lengths = sorted(len(non_blank(c)) for c in cells)
    assert lengths[int(0.9 * (len(lengths) - 1))] <= LONG_CELL
    total = sum(lengths)
    assert sum(len(formatting_lines(c)) for c in cells) <= FORMATTING_SHARE * total


# --- the message table ------------------------------------------------------------------------------------

def _fields(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}


def test_every_message_has_both_languages_with_the_same_placeholders():
    from fsdp_mini.course.messages import MESSAGES

    for key, entry in MESSAGES.items():
        assert isinstance(entry, tuple) and len(entry) == 2, key
        english, russian = entry
        assert english.strip() and russian.strip(), key
        assert _fields(english) == _fields(russian), f"{key}: placeholders differ"
        assert not CYRILLIC.search(english), f"{key}: Cyrillic in the English text"


def _used_keys() -> tuple[set[str], str]:
    sources = [c for lang in ("en",) for name in NAMES for c in code_cells(lang, name)]
    course = ROOT / "fsdp_mini" / "course"
    sources += [p.read_text() for p in course.rglob("*.py") if p.name != "messages.py"]
    code = "\n".join(sources)
    said = set(re.findall(r"\b(?:say|text)\(\s*\"([^\"]+)\"", code))
    return said, code


def test_every_key_a_lesson_says_exists_and_every_entry_is_used():
    from fsdp_mini.course.messages import MESSAGES

    said, code = _used_keys()
    assert not said - set(MESSAGES), f"keys said but not in messages.py: {sorted(said - set(MESSAGES))}"
    unused = [k for k in MESSAGES if not re.search(rf"\b{re.escape(k)}\b", code)]
    assert not unused, f"entries of messages.py no code uses: {unused}"
