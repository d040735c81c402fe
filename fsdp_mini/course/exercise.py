"""Exercise checks for the lessons: a learner replaces `None` with an answer, and a cell says whether it
is right, without ever raising, so an unanswered notebook still runs from top to bottom."""
from __future__ import annotations

import math

import torch

from fsdp_mini.course.language import tr

__all__ = ["check", "Checked"]


class Checked:
    """The verdict of `check`: true when the answer is right. It shows nothing when it ends a notebook
    cell (the printed message is the output), so an exercise cell's stored output is that line alone."""

    def __init__(self, ok: bool):
        self.ok = ok

    def __bool__(self) -> bool:
        return self.ok

    def __eq__(self, other) -> bool:
        return bool(self) == bool(other)

    def __hash__(self) -> int:
        return hash(self.ok)

    def __repr__(self) -> str:
        return repr(self.ok)

    def _ipython_display_(self) -> None:
        pass


def _close(answer, expected, rtol: float) -> bool:
    if isinstance(expected, torch.Tensor):
        return isinstance(answer, torch.Tensor) and answer.shape == expected.shape and bool(
            torch.allclose(answer.double(), expected.double(), rtol=rtol, atol=0))
    if isinstance(expected, bool) or not isinstance(expected, (int, float)):
        if isinstance(expected, (list, tuple)) and isinstance(answer, (list, tuple)):
            return len(answer) == len(expected) and all(_close(a, e, rtol) for a, e in zip(answer, expected))
        return answer == expected
    return isinstance(answer, (int, float)) and not isinstance(answer, bool) and math.isclose(
        answer, expected, rel_tol=rtol, abs_tol=0)


def check(answer, expected, rtol: float = 1e-6, hint: str | None = None) -> Checked:
    """Print whether `answer` matches `expected` (numbers within `rtol`, tensors, sequences, anything
    comparable with ==) and return it; `None` means "not answered yet"."""
    if answer is None:
        print(tr("Not answered yet: replace None with your answer and run the cell again.",
                 "Ответа пока нет: замените None своим ответом и запустите ячейку ещё раз."))
        return Checked(False)
    if _close(answer, expected, rtol):
        print(tr("Correct!", "Верно!"))
        return Checked(True)
    print(tr("Not quite.", "Пока неверно.") + (f" {hint}" if hint else ""))
    return Checked(False)
