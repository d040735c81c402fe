# The two commands of this project: `make demo` and `make test`. Each sets everything up first.
# `make site` serves the course site at http://127.0.0.1:8000 (English; Russian at /ru/).
VENV   ?= .venv
PYTHON ?= python3
# A CPU build, installed before the project so that pip does not pull a multi-GB CUDA build.
# On a GPU machine: make TORCH=torch setup
TORCH  ?= torch==2.13.0
PY      = $(VENV)/bin/python
# mkdocs-material's notice about its end of life, printed at every build: known, silenced
export NO_MKDOCS_2_WARNING := 1

.PHONY: setup demo test test-fast bench kernels site fuzz
setup: $(VENV)/.installed

# pip byte-compiles what it installs one file at a time; compileall on every core afterwards takes the install of
# torch and the project from 61 s to 44 s here. A file that does not compile (torch ships one in Python 3.12
# syntax) is skipped, as pip skips it.
$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --no-compile "$(TORCH)"
	$(PY) -m pip install --quiet --no-compile -e ".[test,notebooks,docs]"
	$(PY) -m compileall -q -j 0 $(VENV)/lib > /dev/null || true
	touch $@

demo: setup
	OMP_NUM_THREADS=1 $(PY) -m fsdp_mini demo

# Three workers (pytest-xdist), each test file on one worker: a notebook's cells share one kernel, a file its
# module fixtures; files are handed out longest first (tests/conftest.py's LONGEST_FIRST; xdist's
# --no-loadscope-reorder keeps that order). Three on two cores, because many tests wait (for processes to
# start, for a timeout they provoke) and a third worker fills those waits; four made a torchrun test's
# teardown slow enough to fail it. The run is CPU-bound: on a fresh clone here, `.ci/run` (setup included) took
# 7:35 to 9:49 in seven runs on 2026-12-07, tests 6:47 to 8:52 for 850-1,120 CPU-seconds of both cores' busy
# time (the machine's speed varies by up to 20 % within an hour; session 31's HEAD took 9:11 and 9:20 in the
# same hour as 8:25 and 8:47 here); 15 min with one worker.
test: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -n 3 --dist loadfile --no-loadscope-reorder

# The development loop: the library's tests only (no lessons, site or course), without the few that start
# torchrun (marker `torchrun`, a quarter of the library's time); CI runs `make test`, which runs them all.
test-fast: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m "not torchrun" tests/library

# The differential harness (tests/differential): random programs on fsdp_mini and on PyTorch (FSDP1 / FSDP2)
# until MINUTES are up; prints each difference, minimises it and writes it as a failing test under
# tests/differential/found/. START=<seed> repeats a run (the first seed is printed).
MINUTES ?= 10
fuzz: setup
	OMP_NUM_THREADS=1 PYTHONPATH=tests $(PY) -m differential.fuzz --minutes $(MINUTES) $(if $(START),--start $(START))

bench: setup  # about 5 minutes on 2 cores; lessons/en/performance.md shows a run
	mkdir -p build
	OMP_NUM_THREADS=1 $(PY) -m fsdp_mini bench --simulate --json build/bench.json --plot build/bench.png

# Every lesson under nbval with the CPU kernels of other machines: stored outputs must not depend on them
# (tests/course/test_cpu_kernels.py runs the reduced-precision lessons so in `make test`). About 15 minutes.
kernels: setup
	for limit in ATEN_CPU_CAPABILITY=default ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2; do \
		echo "== $$limit"; env $$limit OMP_NUM_THREADS=1 $(PY) -m pytest -p no:cacheprovider -q lessons || exit 1; \
	done

site: setup
	$(PY) -m mkdocs serve --dev-addr 127.0.0.1:8000
