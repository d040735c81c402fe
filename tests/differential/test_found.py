"""Every difference the harness found, minimised (tests/differential/found/<name>.py: its description, and what
differed in words), run as one test case each: a bug fixed stays fixed, a known open one (`XFAIL` in its file)
is expected to differ until its fix lands (strict: then the case fails, so that the mark is removed).

All of them run in one launch per world size (`differential.execute`), as the fixed seeds do: a launch per
case, as a test file per case had, cost the suite some 3 CPU-seconds each.
"""
from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from differential.compare import differences
from differential.execute import execute

FOUND = sorted(p.stem for p in (Path(__file__).resolve().parent / "found").glob("*.py") if p.stem != "__init__")


def _case(name: str):
    return importlib.import_module(f"differential.found.{name}")


@pytest.fixture(scope="module")
def observed():
    """{name: observation} of every found case, from one launch per world size."""
    return dict(zip(FOUND, execute([_case(name).DESCRIPTION for name in FOUND])))


def _param(name: str):
    reason = getattr(_case(name), "XFAIL", None)
    return pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=reason)) if reason else name


@pytest.mark.parametrize("name", [_param(name) for name in FOUND])
def test_found_difference_stays_as_its_file_says(name, observed):
    findings, _known = differences(_case(name).DESCRIPTION, observed[name])
    assert not findings, f"fsdp_mini and PyTorch differ on found/{name}.py:\n" + "\n".join(f"  {d}" for d in findings)
