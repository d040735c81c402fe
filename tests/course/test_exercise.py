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


# --- code exercises: every reference solution passes its judge, every planted mistake fails it ---------

import json  # noqa: E402

import pytest  # noqa: E402

from fsdp_mini.course.exercise import CodeExercise, Outcome, Verdict  # noqa: E402
from fsdp_mini.course.exercises import all_exercises  # noqa: E402
from fsdp_mini.course.language import num  # noqa: E402

EXERCISES = {ex.name: ex for ex in all_exercises()}


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_the_reference_solution_passes(name, no_orphans):
    verdict = EXERCISES[name].verdict(EXERCISES[name].reference)
    assert verdict.outcome is Outcome.RIGHT, verdict.detail


@pytest.mark.parametrize("name, wrong", [(name, w) for name, ex in sorted(EXERCISES.items()) for w in ex.wrong],
                         ids=lambda x: getattr(x, "__name__", x))
def test_a_plausible_wrong_solution_fails_and_the_verdict_says_what_is_wrong(name, wrong, no_orphans):
    verdict = EXERCISES[name].verdict(wrong)
    assert verdict.outcome is Outcome.WRONG and len(verdict.detail) > 20


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_an_unwritten_body_is_not_yet_and_nothing_raises(name, capsys, no_orphans):
    def stub(*args):
        raise NotImplementedError

    assert EXERCISES[name].verdict(stub).outcome is Outcome.NOT_YET
    assert not EXERCISES[name].check(stub)
    assert capsys.readouterr().out.startswith("Not yet: write the function's body")


def test_an_unwritten_first_divergence_is_not_yet_before_any_run_is_recorded():
    # the lesson's cell with the stub answers at once, not after the judge's recorded runs (seconds of timeouts)
    from fsdp_mini.course.exercises.diagnosis import recorded_runs

    def stub(records):
        raise NotImplementedError

    before = recorded_runs.cache_info()
    assert EXERCISES["10.first_divergence"].verdict(stub).outcome is Outcome.NOT_YET
    after = recorded_runs.cache_info()
    assert (after.hits, after.misses) == (before.hits, before.misses)


def test_every_exercise_has_wrong_solutions_to_catch():
    assert EXERCISES and all(len(ex.wrong) >= 2 for ex in EXERCISES.values())


def test_a_learner_exception_is_a_wrong_verdict_naming_it(capsys):
    def judge(fn):
        fn()
        return Verdict.right()

    def broken():
        raise KeyError("blocks.0")

    ex = CodeExercise("demo", judge, lambda: None)
    assert ex.verdict(broken) == Verdict.wrong("your function raised KeyError: 'blocks.0'")
    assert not ex.check(broken) and capsys.readouterr().out == "Not quite: your function raised KeyError: 'blocks.0'\n"
    assert ex.check(lambda: None) and capsys.readouterr().out == "Correct!\n"


def test_numbers_in_each_language():
    assert (num(49152), num(1.5, 1), num(0.25)) == ("49,152", "1.5", "0.25")
    try:
        set_language("ru")
        assert (num(49152), num(1.5, 1), num(-1234567.891)) == ("49\u202f152", "1,5", "-1\u202f234\u202f567,89")
    finally:
        set_language("en")


def _solution_blocks(path):
    """The code of every folded solution (<details> ... ```python ... ``` ...) of a notebook."""
    import json
    import re
    cells = json.loads(path.read_text())["cells"]
    text = ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]
    return [m.group(1).strip() for t in text if t.lstrip().startswith("<details>")
            for m in re.finditer(r"```python\n(.*?)```", t, re.S)]


def test_the_lessons_folded_solutions_are_the_references_and_every_exercise_is_in_both_languages():
    from pathlib import Path

    from fsdp_mini.course.source import source_of
    lessons = Path(__file__).resolve().parents[2] / "lessons"
    for ex in EXERCISES.values():
        name = ex.reference.__name__
        for lang in ("en", "ru"):
            found = [(path, block) for path in sorted((lessons / lang).glob("*.ipynb"))
                     for block in _solution_blocks(path) if block.startswith(f"def {name}(")]
            assert len(found) == 1, f"{lang}: the solution of {ex.name} should appear once, found {len(found)}"
            assert found[0][1] == source_of(ex.reference), f"{found[0][0].name}: the solution differs from {name}"
            cells = json.loads(found[0][0].read_text())["cells"]
            checks = [c for c in cells if c["cell_type"] == "code" and f".check({name})" in "".join(c["source"])]
            assert len(checks) == 1, f"{found[0][0].name}: one cell should check {name}"


# --- lesson 12's layout: three dimensions on the nodes, any grid DeviceMesh accepts ---------------------------

LAYOUT_REASONS = {  # each planted mistake of 12.dp_tp_layout, and the words its verdict must contain
    "_layout_shard_across_nodes": "8 ranks, 4 GPUs per node, tp 2: your shard group [0, 4] spans nodes [0, 1]",
    "_layout_tp_across_nodes": "your TP group [0, 4] spans nodes [0, 1]",
    "_layout_two_dims": "the mesh has three dimensions (replicate, shard, tp) of sizes (2, 2, 2)",
    "_layout_fsdp_over_all_nodes": "yours has shape (1, 4, 2)",
    "_layout_repeats_a_rank": "every rank 0..7 must appear exactly once",
}


@pytest.mark.parametrize("wrong", EXERCISES["12.dp_tp_layout"].wrong, ids=lambda f: f.__name__)
def test_each_wrong_layout_is_told_which_group_crosses_the_nodes(wrong):
    """All of them fail on paper, before any process starts: the verdict names the case and the group."""
    verdict = EXERCISES["12.dp_tp_layout"].verdict(wrong)
    assert verdict.outcome is Outcome.WRONG and LAYOUT_REASONS[wrong.__name__] in verdict.detail, verdict.detail


def test_every_layout_devicemesh_accepts_is_taken_on_paper():
    """A tensor, nested lists or tuples, a NumPy array; TP innermost or the shard group innermost inside a node:
    each is a mesh DeviceMesh takes with every TP and shard group inside a node. A float grid is not."""
    import numpy as np

    from fsdp_mini.course.exercises.tensor_parallel import LAYOUT_CASES, REAL_CASE, _as_mesh, _node_problem

    def shard_innermost(world, per_node, tp):
        return torch.arange(world).reshape(world // per_node, tp, per_node // tp).transpose(1, 2)

    forms = [lambda g: g, lambda g: g.tolist(), lambda g: tuple(map(tuple, g.tolist())), lambda g: g.numpy()]
    for case in LAYOUT_CASES + (REAL_CASE,):
        for layout in (EXERCISES["12.dp_tp_layout"].reference, shard_innermost):
            for form in forms:
                grid, problem = _as_mesh(form(torch.as_tensor(layout(*case))), *case)
                assert not problem and not _node_problem(grid, *case), (case, problem)
        _, problem = _as_mesh(np.arange(case[0], dtype=float).reshape(case[0] // case[1], case[1] // case[2],
                                                                       case[2]), *case)
        assert "a tensor or nested lists of ints" in problem
