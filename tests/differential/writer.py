"""A minimised difference as a pytest file: tests/differential/found/test_found_<seed>.py, which rebuilds
the description literally and asserts that fsdp_mini and PyTorch agree on it. It fails while they differ;
once fsdp_mini is fixed it passes and stays as a regression test. `xfail`: a reason marks it as a known
bug (strict: the test then fails as soon as the fix lands, so that the marker is removed).
"""
from __future__ import annotations

import pprint
from pathlib import Path

FOUND = Path(__file__).resolve().parent / "found"

TEMPLATE = '''"""Found by the differential harness (tests/differential, seed {seed}), minimised:

{difference}

fsdp_mini and PyTorch ({reference}) differ on the program below; this test passes once they agree.
"""
import pytest

from differential.check import assert_agrees
{marker}
DESCRIPTION = {description}


def test_found_{name}(no_orphans):
    assert_agrees(DESCRIPTION)
'''


def write(desc: dict, difference, folder: Path = FOUND, xfail: str | None = None, name: str | None = None) -> Path:
    name = name or str(desc["seed"])
    marker = f"\npytestmark = pytest.mark.xfail(strict=True, reason={xfail!r})\n" if xfail else ""
    text = TEMPLATE.format(seed=desc["seed"], difference=str(difference).replace('"""', "'''"), marker=marker,
                           reference="FSDP1" if desc["design"] == "flat" else "FSDP2", name=name,
                           description=pprint.pformat({k: v for k, v in desc.items() if k != "index"},
                                                      width=100, sort_dicts=False))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"test_found_{name}.py"
    path.write_text(text, encoding="utf-8")
    return path
