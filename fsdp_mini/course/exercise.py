"""Exercise checks for the lessons, of two kinds, neither of which ever raises, so an unanswered notebook
still runs from top to bottom:

- `check(answer, expected)`: the learner replaces `None` with a value;
- `CodeExercise`: the learner writes a function's body, and the exercise *runs* it (in real processes,
  when it is distributed code) and judges what it did: its results against the library's or a single
  process's, the collectives CommLog saw, the memory it held. The verdict says what is wrong, never what
  the right code is. A function whose body still raises `NotImplementedError` is "not yet".

Every `CodeExercise` carries its reference solution and plausible wrong ones; `tests/course/test_exercise.py`
runs each through the judge (the reference must pass, every wrong one must fail), and the lesson's
collapsible solution is checked to be the reference's source, so the two cannot drift.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from fsdp_mini.course.language import num, tr

__all__ = ["check", "Checked", "CodeExercise", "Outcome", "Verdict", "NotYet", "summed_not_averaged",
           "one_collective_problem"]


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


class Outcome(enum.Enum):
    NOT_YET = "not yet"   # the body still raises NotImplementedError
    WRONG = "wrong"
    RIGHT = "right"


@dataclass(frozen=True)
class Verdict:
    """What a judge found: the outcome and, when wrong, what is wrong (in the lesson's language)."""

    outcome: Outcome
    detail: str = ""

    @classmethod
    def right(cls, detail: str = "") -> "Verdict":
        return cls(Outcome.RIGHT, detail)

    @classmethod
    def wrong(cls, detail: str) -> "Verdict":
        return cls(Outcome.WRONG, detail)


class NotYet(Exception):
    """Raised by a judge's trial (also inside a rank) when the learner's function is not written yet."""


@dataclass(frozen=True)
class CodeExercise:
    """An exercise whose answer is code: `judge(fn)` runs the learner's function and returns a `Verdict`.

    `reference` is the solution the lesson shows (folded); `wrong` are plausible mistakes the judge must
    catch (a test runs both)."""

    name: str
    judge: Callable[[Callable], Verdict]
    reference: Callable
    wrong: tuple[Callable, ...] = field(default_factory=tuple)

    def verdict(self, fn: Callable) -> Verdict:
        """The judge's verdict, with "not yet" for an unwritten body and a learner's exception turned
        into a wrong verdict that names it (a check never raises)."""
        try:
            return self.judge(fn)
        except (NotYet, NotImplementedError):
            return Verdict(Outcome.NOT_YET)
        except Exception as e:  # the learner's code failed: say how, as a verdict
            return Verdict.wrong(tr("your function raised ", "ваша функция выбросила ") + _first_line(e))

    def check(self, fn: Callable) -> Checked:
        """Judge `fn` and print the verdict: what a lesson's exercise cell calls."""
        v = self.verdict(fn)
        if v.outcome is Outcome.NOT_YET:
            print(tr("Not yet: write the function's body (it still raises NotImplementedError) and run the cell again.",
                     "Пока нет ответа: напишите тело функции (оно всё ещё выбрасывает NotImplementedError) "
                     "и запустите ячейку ещё раз."))
        elif v.outcome is Outcome.RIGHT:
            print(tr("Correct!", "Верно!") + (f" {v.detail}" if v.detail else ""))
        else:
            print(tr("Not quite: ", "Пока неверно: ") + v.detail)
        return Checked(v.outcome is Outcome.RIGHT)


def _first_line(e: BaseException) -> str:
    """An exception as one line: its type and its message's first line (a rank's failure included)."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


# --- pieces of verdicts that several exercises share ----------------------------------------------------

_OP_NAMES = {"all_gather": "AllGather", "reduce_scatter": "ReduceScatter", "all_reduce": "AllReduce"}


def summed_not_averaged(got: torch.Tensor, want: torch.Tensor, n: int) -> bool:
    """True when `got` is n times `want` (by norm): values summed over n ranks where their average was due,
    the mistake that SGD shows at once and Adam hides. Verdicts add a hint when it is so."""
    want_norm = want.norm().item()
    return want_norm > 0 and math.isclose(got.norm().item() / want_norm, n, rel_tol=1e-3)


def one_collective_problem(collectives, op: str, nbytes: int, world: int, rank: int, what: tuple[str, str]) -> str:
    """"" when CommLog saw exactly one `op` (a unit's one AllGather or ReduceScatter) of `nbytes`, else
    what it saw instead. `collectives`: (op, bytes) pairs; `what`: the expected bytes explained (en, ru)."""
    name = _OP_NAMES[op]
    seen = ", ".join(f"{o} ({num(b)} B)" for o, b in collectives) or tr("none", "ни одной")
    if len(collectives) != 1 or collectives[0][0] != op:
        return tr(f"world {world}, rank {rank}: a unit needs exactly one {name} (through fsdp_mini.collectives, "
                  f"so that CommLog sees it); CommLog saw: {seen}",
                  f"число рангов {world}, ранг {rank}: юниту нужен ровно один {name} (через fsdp_mini.collectives, "
                  f"чтобы его видел CommLog); CommLog увидел: {seen}")
    if collectives[0][1] != nbytes:
        return tr(f"world {world}: the {name} moved {num(collectives[0][1])} B, not {what[0]} {num(nbytes)} B",
                  f"число рангов {world}: {name} передал {num(collectives[0][1])} Б, а не {num(nbytes)} Б {what[1]}")
    return ""
