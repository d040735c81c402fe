# The two commands of this project: `make demo` and `make test`. Each sets everything up first.
VENV   ?= .venv
PYTHON ?= python3
# A CPU build, installed before the project so that pip does not pull a multi-GB CUDA build.
# On a GPU machine: make TORCH=torch setup
TORCH  ?= torch==2.13.0
PY      = $(VENV)/bin/python

.PHONY: setup demo test bench
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -e ".[test,notebooks]"
	touch $@

demo: setup
	OMP_NUM_THREADS=1 $(PY) -m fsdp_mini demo

test: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest

bench: setup
	OMP_NUM_THREADS=1 $(PY) -m fsdp_mini bench-collectives --world-size 2
