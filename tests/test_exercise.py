"""Exercise checks: None is "not answered", right and wrong answers are told apart, nothing raises."""
import torch

from fsdp_mini.course.exercise import check
from fsdp_mini.course.language import set_language


def test_verdicts_and_messages(capsys):
    assert not check(None, 3)
    assert check(3, 3) and check(0.1 + 0.2, 0.3) and check([1, 2.0], [1, 2.0]) and check("B", "B")
    assert check(torch.ones(2), torch.ones(2)) and not check(torch.ones(3), torch.ones(2))
    assert not check(4, 3, hint="count again") and not check(True, 1) and not check("3", 3)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("Not answered yet") and out[1] == "Correct!" and out[-3] == "Not quite. count again"
    try:
        set_language("ru")
        check(None, 1)
        check(1, 1)
        assert capsys.readouterr().out.splitlines() == [
            "Ответа пока нет: замените None своим ответом и запустите ячейку ещё раз.", "Верно!"]
    finally:
        set_language("en")


def test_the_verdict_compares_like_a_bool_and_shows_nothing_in_a_notebook():
    assert check(1, 1) == True and check(2, 1) == False  # noqa: E712
    assert repr(check(1, 1)) == "True" and check(1, 1)._ipython_display_() is None
