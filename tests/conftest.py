"""Shared fixtures: every distributed test checks that no child process outlives it, and the site's
tests (tests/site/) share one build of the site per session."""
import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from filelock import FileLock

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
    """Build the site once per test run; return (its folder, everything mkdocs printed). Under
    pytest-xdist (`make test` runs three workers) every worker asks for it: the first builds it under a
    lock in the run's shared temporary folder, the others wait and reuse that build."""
    shared = tmp_path_factory.getbasetemp().parent if "PYTEST_XDIST_WORKER" in os.environ \
        else tmp_path_factory.getbasetemp()
    out, log_file = shared / "site", shared / "site-build.log"
    with FileLock(str(shared / "site.lock")):
        if log_file.exists():
            log, returncode = log_file.read_text(encoding="utf-8"), int((shared / "site-build.rc").read_text())
        else:
            env = dict(os.environ, NO_MKDOCS_2_WARNING="1")  # mkdocs-material's end-of-life notice
            proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                                  cwd=ROOT, env=env, capture_output=True, text=True,
                                  timeout=420)  # ~80 s here, more on a loaded CI machine
            log, returncode = proc.stdout + proc.stderr, proc.returncode
            (shared / "site-build.rc").write_text(str(returncode))
            log_file.write_text(log, encoding="utf-8")
    if returncode != 0:
        why = [line for line in log.splitlines() if re.match(r"\s*(WARNING|ERROR)\b", line)]
        pytest.fail("mkdocs build --strict failed:\n" + "\n".join(why or log.splitlines()[-30:]),
                    pytrace=False)
    return out, log


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """The site's tests first: under `make test`'s workers they are one long chain (mkdocs, then the browser),
    and started last they would leave the other workers idle while they finish. A stable sort: every file
    keeps its own order, and a notebook's cells theirs."""
    items.sort(key=lambda item: Path(item.path).parent.name != "site")
