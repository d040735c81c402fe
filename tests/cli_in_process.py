"""`python -m fsdp_mini ARGS` run in the test's own process, for commands that compute from tables or files.

The entry point only runs `fsdp_mini.course.cli.main(ARGS)` and exits with its code, so `main`'s output and code
are the command's; a new interpreter per call would import torch again (seconds each on 2 busy cores).
tests/course/test_cli.py starts the entry point itself (`python -m fsdp_mini`, and under torchrun), and
commands that launch ranks or set the display language stay in their own process.
"""
import contextlib
import io
import subprocess

from fsdp_mini.course.cli import main

__all__ = ["run_main"]


def run_main(*args: str) -> subprocess.CompletedProcess:
    """What `subprocess.run([python, -m, fsdp_mini, *args], capture_output=True, text=True)` returns."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's usage errors exit with 2
            code = exc.code
    return subprocess.CompletedProcess(["fsdp_mini", *args], code or 0, out.getvalue(), err.getvalue())
