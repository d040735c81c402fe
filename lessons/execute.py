"""Re-execute every lesson notebook in place, so the stored outputs are real outputs of running it.

    python lessons/execute.py                 # all lessons, both languages
    python lessons/execute.py 02_ring         # the twins whose name starts with 02_ring

Runs each notebook top to bottom in a fresh kernel from its own folder (as nbval and Jupyter do),
then normalises the metadata that would otherwise leak this machine into the repository: a generic
kernel name, no execution timestamps.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


def clean(nb) -> None:
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata["language_info"] = {"name": "python", "pygments_lexer": "ipython3"}
    for key in ("widgets", "vscode", "colab"):
        nb.metadata.pop(key, None)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        cell.metadata.pop("ExecuteTime", None)


def execute(path: Path, timeout: int = 300) -> float:
    nb = nbformat.read(path, as_version=4)
    start = time.time()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    os.environ.update(env)
    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    clean(nb)
    nbformat.write(nb, path)
    return time.time() - start


def main(prefixes: list[str]) -> int:
    paths = sorted(p for lang in ("en", "ru") for p in (HERE / lang).glob("*.ipynb")
                   if not prefixes or any(p.name.startswith(x) for x in prefixes))
    if not paths:
        print("no notebooks matched", file=sys.stderr)
        return 1
    for path in paths:
        seconds = execute(path)
        print(f"{path.relative_to(HERE)}: {seconds:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
