"""Shared fixtures: every distributed test checks that no child process outlives it, and the site's
tests (tests/site/) share one build of the site per session."""
import fnmatch
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


# The files that take longest, longest first: seconds of one worker's time under `make test`, in two runs
# of 2026-12-06 (before and after the site's tests and lesson 10 were made faster). pytest-xdist hands out
# whole files in collection order (`--no-loadscope-reorder` in the Makefile), so a long file collected last
# would run alone at the end while the other workers sit idle. The site's tests lead: they are one chain
# (the mkdocs build, then the browser). A file missing from this list only runs later than it could; a
# stale number costs minutes, never a check.
LONGEST_FIRST = (
    "tests/site/test_site.py",                  # 185-300 s
    "lessons/en/10_*.ipynb",                    # 85-105 s
    "tests/course/test_pytorch_claims.py",      # 65-120 s
    "tests/course/test_exercise.py",            # 100-105 s
    # the twins apart: each times out hung ranks after 5 s on purpose, and together with the build they
    # were both once too slow to reach their hang in time
    "lessons/ru/10_*.ipynb",                    # 85-105 s
    "tests/library/test_launch.py",             # 35-70 s
    "tests/course/test_cpu_kernels.py",         # 20-35 s
    "tests/course/test_cli.py",                 # 65-85 s
    "tests/library/test_flight_recorder.py",    # 60-70 s
    "tests/library/test_checkpoint.py",         # 35-50 s
    "tests/library/test_fully_shard.py",        # 45-60 s
    "tests/library/test_failure_causes.py",     # 40-45 s
    "tests/library/test_checkpoint_integrity.py",  # 35-50 s
    "tests/library/test_layout.py",             # 30 s
    "tests/course/test_bench.py",               # 30 s
    "lessons/*/11_*.ipynb",                     # 25-30 s each
    "lessons/*/08_*.ipynb",                     # 20-25 s each
    "tests/library/test_fsdp2_differential.py",  # 25-30 s
    "tests/library/test_zero_drop_in.py",       # 20-25 s
    "lessons/*/*.ipynb",                        # the other lessons, 10-20 s each
)


def _longest_first(item) -> int:
    path = Path(item.path).relative_to(ROOT).as_posix()
    return next((i for i, pattern in enumerate(LONGEST_FIRST) if fnmatch.fnmatch(path, pattern)),
                len(LONGEST_FIRST))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Longest files first (LONGEST_FIRST), everything else after them in its own order. A stable sort:
    every file keeps its own order, and a notebook's cells theirs."""
    items.sort(key=_longest_first)
