"""Stored outputs do not depend on the CPU's kernels.

bf16 arithmetic on a CPU differs between machines: ATen picks vectorised kernels by the CPU's
capability (AVX512, AVX2, none) and oneDNN its own, so a bf16 loss printed to the last digit on one
machine is another digit on the next (lesson 06 once printed 3.673 where the stored output said 3.674).
The lessons print such values only at the precision they are stable to. This test re-runs, under nbval,
every lesson whose code computes in reduced precision with ATen's portable kernels
(`ATEN_CPU_CAPABILITY=default`, which changes the course GPT's bf16 loss here: the setting that moves the
most). `make kernels` runs every lesson under it, under ATen's AVX2 kernels and under oneDNN capped at AVX2
(`ONEDNN_MAX_CPU_ISA=AVX2`, 20 s more here, kept out of `make test` for its 10-minute budget).

The English twin is enough: the Russian one runs the same code (tests/course/test_code_cells.py: the
twins differ only in their `set_language` line) and prints the same values at the same precision, only
with a decimal comma, so a digit that moves under other kernels moves in the English output too.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LESSONS = ROOT / "lessons"
SETTINGS = {"aten-default": {"ATEN_CPU_CAPABILITY": "default"}}
REDUCED_PRECISION = re.compile(r"torch\.(bfloat16|float16|half)\b|\.(bfloat16|half)\(\)")


def reduced_precision_lessons() -> list[Path]:
    """The notebooks (both languages) whose code cells compute in bf16 or fp16."""
    found = []
    for path in sorted(LESSONS.glob("*/*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        if any(c["cell_type"] == "code" and REDUCED_PRECISION.search("".join(c["source"])) for c in cells):
            found.append(path)
    return found


def test_the_scan_finds_the_mixed_precision_lesson_in_both_languages():
    names = {(p.parent.name, p.name) for p in reduced_precision_lessons()}
    assert {("en", "06_prefetch_and_mixed_precision.ipynb"),
            ("ru", "06_prefetch_and_mixed_precision.ipynb")} <= names


@pytest.mark.timeout(900)
@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_reduced_precision_lessons_keep_their_outputs_under_other_cpu_kernels(setting):
    paths = [str(p.relative_to(ROOT)) for p in reduced_precision_lessons() if p.parent.name == "en"]
    env = dict(os.environ, OMP_NUM_THREADS="1", **SETTINGS[setting])
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *paths],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=840)
    assert proc.returncode == 0, f"nbval under {SETTINGS[setting]}:\n" + proc.stdout[-4000:]
