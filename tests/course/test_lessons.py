"""The lessons' twin structure and hygiene (nbval runs the notebooks themselves: `--nbval` on lessons/).

English and Russian twins have the same file names, the same cells in the same order, identical code
(but for the language line of the imports cell), Russian prose in Russian and English prose in English, stored
outputs, a generic kernel, nothing of this machine in their outputs, and exercises with solutions.
"""
import json
import re
from pathlib import Path

import pytest

LESSONS = Path(__file__).resolve().parents[2] / "lessons"
NAMES = sorted(p.name for p in (LESSONS / "en").glob("*.ipynb"))
CYRILLIC, LATIN = re.compile("[а-яёА-ЯЁ]"), re.compile("[a-zA-Z]")


def load(lang, name):
    return json.loads((LESSONS / lang / name).read_text(encoding="utf-8"))


def prose(source: str) -> str:
    """Markdown without code, inline code, links' targets, math and HTML tags: the words a reader reads."""
    text = re.sub(r"```.*?```", " ", source, flags=re.S)
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"\$\$.*?\$\$|\$[^$]*\$", " ", text, flags=re.S)
    return re.sub(r"<[^>]+>", " ", text)


def src(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def test_there_are_lessons_and_every_one_has_a_twin():
    assert NAMES, "no lessons in lessons/en"
    assert NAMES == sorted(p.name for p in (LESSONS / "ru").glob("*.ipynb"))
    assert all(re.fullmatch(r"\d\d_[a-z0-9_]+\.ipynb", n) for n in NAMES), NAMES


@pytest.mark.parametrize("name", NAMES)
def test_twins_have_the_same_cells(name):
    """The same cells in the same order (their code: tests/course/test_code_cells.py)."""
    en, ru = load("en", name), load("ru", name)
    assert [c["cell_type"] for c in en["cells"]] == [c["cell_type"] for c in ru["cells"]]


@pytest.mark.parametrize("name", NAMES)
def test_prose_is_in_the_lesson_language(name):
    for lang in ("en", "ru"):
        for i, cell in enumerate(load(lang, name)["cells"]):
            if cell["cell_type"] != "markdown":
                continue
            words = prose(src(cell))
            cyr, lat = len(CYRILLIC.findall(words)), len(LATIN.findall(words))
            if lang == "ru" and cyr + lat > 20:
                assert cyr > lat, f"{lang}/{name} cell {i} is not mostly Russian"
            if lang == "en":
                assert cyr == 0, f"{lang}/{name} cell {i} has Cyrillic"


@pytest.mark.parametrize("lang", ["en", "ru"])
@pytest.mark.parametrize("name", NAMES)
def test_notebooks_are_executed_clean_and_have_exercises(lang, name):
    nb = load(lang, name)
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code and all(c["execution_count"] is not None for c in code), "run lessons/execute.py"
    assert any(o.get("output_type") == "display_data" and "image/png" in o.get("data", {})
               for c in code for o in c["outputs"]), "at least one stored plot"
    assert not [o for c in code for o in c["outputs"] if o.get("output_type") == "error"], "a cell failed"
    dump = json.dumps([c["outputs"] for c in code])
    for leak in ("/work/", "/tmp/", "/home/", "/root/", "site-packages"):
        assert leak not in dump, f"outputs contain {leak!r}: a path of this machine"
    checks = sum(src(c).count("check(") for c in code)
    solutions = sum(src(c).count("<details>") for c in nb["cells"] if c["cell_type"] == "markdown")
    assert checks >= 2 and solutions >= 2, f"{checks} exercise checks, {solutions} solutions"
    assert "show_source(" in "".join(src(c) for c in code), "show the library's real source"


@pytest.mark.parametrize("readme", ["README.md", "README.ru.md"])
def test_the_readmes_list_every_lesson_once(readme):
    text = (LESSONS.parent / readme).read_text(encoding="utf-8")
    listed = re.findall(r"^\| `(\d\d_[a-z0-9_]+)` \|", text, flags=re.M)
    assert listed == [n[:-len(".ipynb")] for n in NAMES]


def _site_hooks():
    """lessons/_site/hooks.py, where the lesson map's time estimate lives (one home for that figure)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("site_hooks", LESSONS / "_site" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


STATED_TIME = {"en": re.compile(r"About (\d+) minutes"), "ru": re.compile(r"(?:Примерно|Около)\s+(\d+)\s+минут")}


@pytest.mark.parametrize("lang", ["en", "ru"])
def test_each_lesson_states_the_time_the_lesson_map_gives(lang):
    """A lesson's introduction says how long it takes, and that is the home pages' figure: reading,
    running and the code exercises (hooks.lesson_minutes), not a guess written once and left behind."""
    hooks = _site_hooks()
    for name in NAMES:
        intro = "\n".join(src(c) for c in load(lang, name)["cells"][:3] if c["cell_type"] == "markdown")
        stated = STATED_TIME[lang].findall(intro)
        assert len(stated) == 1, f"{lang}/{name}: one stated time in the introduction, found {stated}"
        expected = hooks.lesson_minutes(LESSONS / "en" / name)
        assert int(stated[0]) == expected, f"{lang}/{name} says {stated[0]} minutes; the lesson map says {expected}"


@pytest.mark.parametrize("lang", ["en", "ru"])
def test_the_home_page_explains_the_time_model_from_its_constants(lang):
    """The sentence on how times are estimated is generated from hooks.py's constants (one home for
    them): the home page holds the marker, and the text names every constant's value."""
    hooks = _site_hooks()
    assert hooks.TIME_MODEL in (LESSONS / lang / "index.md").read_text(encoding="utf-8")
    text = hooks.time_model(lang)
    for value in (hooks.WORDS_PER_MINUTE, hooks.CODE_LINES_PER_MINUTE, hooks.LISTING_LINES_PER_MINUTE,
                  hooks.RUN_MINUTES, hooks.EXERCISE_MINUTES):
        assert f" {value} " in text
    assert (CYRILLIC.search(text) is not None) == (lang == "ru")


def test_the_calibration_lessons_take_the_time_the_calibration_states():
    """hooks.py states one calibration (the lessons timed and the minutes a learner needs for each): its
    rates must put those lessons inside that range, and the home pages' sentence names the same figures."""
    hooks = _site_hooks()
    (first, last), low, high = hooks.CALIBRATION[0].split("-"), hooks.CALIBRATION[1], hooks.CALIBRATION[2]
    timed = [n for n in NAMES if int(first) <= int(n[:2]) <= int(last)]
    assert timed
    for name in timed:
        assert low <= hooks.lesson_minutes(LESSONS / "en" / name) <= high, name
    for lang, dash in (("en", "-"), ("ru", "–")):
        assert f"{first}{dash}{last}" in hooks.time_model(lang) and f"{low}{dash}{high}" in hooks.time_model(lang)


def test_library_code_a_lesson_names_without_showing_it_is_read_too():
    """A lesson whose prose sends the reader to a library file it never shows pays for reading that file;
    a file the lesson shows listings from is counted through those listings only."""
    hooks = _site_hooks()
    def md(text):
        return {"cell_type": "markdown", "source": text}
    def shown(listing):
        return {"cell_type": "code", "source": "show_source(f)",
                "outputs": [{"data": {"text/markdown": f"```python\n{listing}\n```"}}]}
    scaling = LESSONS.parent / "fsdp_mini" / "course" / "scaling.py"
    lines = len([x for x in scaling.read_text(encoding="utf-8").splitlines() if x.strip()])
    named = md("the model's limits (`fsdp_mini/course/scaling.py` lists all of it)")
    assert hooks.library_read([named]) == lines
    first = next(x for x in scaling.read_text(encoding="utf-8").splitlines() if x.startswith("def "))
    assert hooks.library_read([named, shown(first)]) == 0
    assert hooks.library_read([md("`fsdp_mini/not_there.py`")]) == 0


COURSE_MAP = re.compile(r"^- \*\*(\d\d) · ", re.MULTILINE)


@pytest.mark.parametrize("lang", ["en", "ru"])
def test_lesson_00s_course_map_lists_every_lesson(lang):
    """Lesson 00 shows the road through the course (`- **NN · title**` items): a new lesson belongs on it,
    so the map's numbers are exactly the notebooks' numbers, in order."""
    cells = [src(c) for c in load(lang, NAMES[0])["cells"] if c["cell_type"] == "markdown"]
    maps = [COURSE_MAP.findall(text) for text in cells if len(COURSE_MAP.findall(text)) > 1]
    assert len(maps) == 1, f"{lang}/{NAMES[0]}: one course map expected, found {len(maps)}"
    assert maps[0] == [name[:2] for name in NAMES], f"{lang}: the map lists {maps[0]}"
