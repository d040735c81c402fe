"""README.md and README.ru.md are twins: the same headings, the same code, the same tables."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CYRILLIC = re.compile("[а-яё]", re.I)


def _parts(text: str):
    code = re.findall(r"```.*?```", text, re.S)
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    headings = [len(m.group(1)) for m in re.finditer(r"^(#+) ", prose, re.M)]
    table_rows = [line.count("|") for line in prose.splitlines() if line.startswith("|")]
    return code, headings, table_rows, prose


def test_readmes_are_twins():
    en_code, en_heads, en_rows, en_prose = _parts((ROOT / "README.md").read_text())
    ru_code, ru_heads, ru_rows, ru_prose = _parts((ROOT / "README.ru.md").read_text())
    assert ru_code == en_code, "code blocks must be identical"
    assert ru_heads == en_heads, "same headings, same levels, same order"
    assert ru_rows == en_rows, "same tables"
    def words(prose):  # without inline code and links (the language switch names the other language)
        return re.sub(r"`[^`]*`|\[[^]]*\]\([^)]*\)", "", prose)
    assert not CYRILLIC.search(words(en_prose))
    letters = re.findall(r"[^\W\d_]", words(ru_prose))
    assert sum(bool(CYRILLIC.match(c)) for c in letters) > 0.6 * len(letters), "the Russian README is mostly Russian"
