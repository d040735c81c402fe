"""Shared fixtures: every distributed test checks that no child process outlives it, and the site's
tests (tests/site/) share one build of the site per session."""
import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def no_orphans():
    """Yield, then assert that this process has no live children left (launch must reap them all)."""
    yield
    children = [c for c in psutil.Process().children(recursive=True) if c.is_running()
                and c.status() != psutil.STATUS_ZOMBIE]
    assert not children, f"processes left behind: {children}"


@pytest.fixture(scope="session")
def site(tmp_path_factory):
    """Build the site once per session; return (its folder, everything mkdocs printed)."""
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")  # mkdocs-material's end-of-life notice
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=420)  # ~80 s here, more on a loaded CI machine
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        why = [line for line in log.splitlines() if re.match(r"\s*(WARNING|ERROR)\b", line)]
        pytest.fail("mkdocs build --strict failed:\n" + "\n".join(why or log.splitlines()[-30:]),
                    pytrace=False)
    return out, log
