"""A minimised difference as a test case: tests/differential/found/<name>.py holds the description literally
(and what differed, in words); tests/differential/test_found.py runs every one of them, in one launch per
world size, and asserts that fsdp_mini and PyTorch agree on it. It fails while they differ; once fsdp_mini is
fixed it passes and stays as a regression test. `xfail`: a reason marks it as a known open bug (strict: the
case then fails as soon as the fix lands, so that the mark is removed).
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

fsdp_mini and PyTorch ({reference}) differ on the program below; tests/differential/test_found.py passes on it
once they agree.
"""
{marker}
DESCRIPTION = {description}
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
    name = name or f"seed_{desc['seed']}"
    marker = f"\nXFAIL = {xfail!r}  # an open bug: test_found.py expects the difference until it is fixed\n" if xfail else ""
    compact = {k: v for k, v in desc.items() if k != "index"}
    compact["model"] = {k: v for k, v in desc["model"].items() if v is not False}  # features off: left out
    said = re.sub(r"/tmp/differential_\w+/", "<folder>/", str(difference)).replace('"""', "'''")
    said = textwrap.fill(said, 110)
    text = TEMPLATE.format(seed=desc["seed"], difference=said, marker=marker,
                           reference="FSDP1" if desc["design"] == "flat" else "FSDP2", name=name,
                           words=textwrap.fill(describe(desc), 110, subsequent_indent=""),
                           description=pprint.pformat(compact, width=100, sort_dicts=False))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    path.write_text(text, encoding="utf-8")
    return path
