"""The Russian readings of what `diagnose` and a failing torchrun rank now say first (fsdp_mini.course.readings):
a rank that died, an interrupted run, ranks that failed the same way; each sentence taken from the library
itself, on records written by processes that then exit."""
import multiprocessing
import os

import pytest
import torch

from fsdp_mini.course.language import get_language, set_language
from fsdp_mini.course.readings import read
from fsdp_mini.flight_recorder import Ending, FlightRecorder, diagnose, record_path


@pytest.fixture
def language():
    before = get_language()
    yield set_language
    set_language(before)


def _end_in_a_process(folder, rank, world, issued, how, what):
    rec = FlightRecorder(capacity=8)
    rec.attach(record_path(folder, rank), run="20260101-000000-aaaaaaaa", rank=rank, world=world)
    for _ in range(issued):
        rec.complete(rec.issue("all_reduce", tuple(range(world)), [torch.ones(2)], ""))
    if how is not None:
        rec.end(how, what)
    os._exit(0)


def _diagnosed(folder, ranks) -> list[str]:
    """diagnose's lines on a run whose rank r issued `ranks[r][0]` AllReduces and ended with `ranks[r][1:]`
    (None: its process ended without an end record)."""
    ctx = multiprocessing.get_context("fork")
    for rank, (issued, how, what) in enumerate(ranks):
        p = ctx.Process(target=_end_in_a_process, args=(str(folder), rank, len(ranks), issued, how, what))
        p.start()
        p.join(30)
    return diagnose(str(folder)).splitlines()


CASES = {
    "died": ([(2, Ending.FAILED_IN_COLLECTIVE, "RuntimeError: Connection closed by peer"), (1, None, ""), (1, None, "")],
             ["ранги 1, 2 умерли: их процессы завершились, не оставив записи о завершении (убиты сигналом или os._exit?)",
              "ранги разошлись: ранг 0 запустил AllReduce #2, а ранги 1, 2 не запускали коллективную операцию #2"]),
    "interrupted": ([(2, None, ""), (1, None, "")],
                    ["запуск прерван: ни один ранг не оставил записи о завершении (ранги 0, 1; их убили разом, "
                     "например вместе с агентом?)"]),
    "same way": ([(1, Ending.RAISED, "ValueError: bad batch"), (1, Ending.RAISED, "ValueError: bad batch")],
                 ["ранг 0 упал: ValueError: bad batch", "(ранг 1 упал так же)"]),
}


@pytest.mark.parametrize("case", CASES)
def test_what_diagnose_says_first_is_read(case, tmp_path, language):
    ranks, readings = CASES[case]
    lines = _diagnosed(tmp_path, ranks)
    language("en")
    assert [read(line) for line in lines] == lines  # every sentence is known, and English stays as it is
    language("ru")
    assert [read(line) for line in lines] == readings


def test_one_rank_that_died_is_read_in_the_singular(tmp_path, language):
    lines = _diagnosed(tmp_path, [(2, Ending.FINISHED, "0"), (1, None, "")])
    language("ru")
    assert read(lines[0]) == ("ранг 1 умер: его процесс завершился, не оставив записи о завершении "
                              "(убит сигналом или os._exit?)")
