"""A minimised difference as a pytest file: tests/differential/found/test_found_<seed>.py, which rebuilds
the description literally and asserts that fsdp_mini and PyTorch agree on it. It fails while they differ;
once fsdp_mini is fixed it passes and stays as a regression test. `xfail`: a reason marks it as a known
bug (strict: the test then fails as soon as the fix lands, so that the marker is removed).
"""
from __future__ import annotations

import pprint
import re
import textwrap
from pathlib import Path

FOUND = Path(__file__).resolve().parent / "found"

TEMPLATE = '''"""Found by the differential harness (tests/differential, seed {seed}), minimised:

{difference}

In words: {words}

fsdp_mini and PyTorch ({reference}) differ on the program below; this test passes once they agree.
"""
{imports}from differential.check import assert_agrees
{marker}
DESCRIPTION = {description}


def test_found_{name}(no_orphans):
    assert_agrees(DESCRIPTION)
'''


def _step_words(s: dict) -> str:
    args = [f"{k}={v}" for k, v in s.items() if k != "op" and v not in (None, False) and not (k == "accum" and v == 1)]
    return f"{s['op']}({', '.join(args)})" if args else s["op"]


def describe(desc: dict) -> str:
    """One sentence: the design, world, model features, wrapping and steps of a description."""
    feats = [k for k, v in desc["model"].items() if v is True]
    w = {k: v for k, v in desc["wrap"].items() if v not in (None, False)}
    api = "fsdp_mini.FSDP vs FSDP1" if desc["design"] == "flat" else "fully_shard vs FSDP2"
    return (f"{api} on {desc['world']} ranks; Net(width {desc['model']['width']}, depth {desc['model']['depth']}"
            f"{', ' + ', '.join(feats) if feats else ''}) wrapped with {w}; {desc['optim']['kind']}; steps: "
            + ", ".join(_step_words(s) for s in desc["steps"]))


def write(desc: dict, difference, folder: Path = FOUND, xfail: str | None = None, name: str | None = None) -> Path:
    name = name or str(desc["seed"])
    marker = f"\npytestmark = pytest.mark.xfail(strict=True, reason={xfail!r})\n" if xfail else ""
    compact = {k: v for k, v in desc.items() if k != "index"}
    compact["model"] = {k: v for k, v in desc["model"].items() if v is not False}  # features off: left out
    said = re.sub(r"/tmp/differential_\w+/", "<folder>/", str(difference)).replace('"""', "'''")
    said = textwrap.fill(said, 110)
    text = TEMPLATE.format(seed=desc["seed"], difference=said, marker=marker,
                           reference="FSDP1" if desc["design"] == "flat" else "FSDP2", name=name,
                           words=textwrap.fill(describe(desc), 110, subsequent_indent=""),
                           imports="import pytest\n\n" if xfail else "",
                           description=pprint.pformat(compact, width=100, sort_dicts=False))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"test_found_{name}.py"
    path.write_text(text, encoding="utf-8")
    return path
