"""The course's language helpers: words that agree with numbers (fsdp_mini.course.language), and the
library's messages read in the lesson's language (fsdp_mini.course.readings)."""
import os
import time

import pytest
import torch
import torch.distributed as dist

from fsdp_mini import LaunchError, LaunchTimeout, launch
from fsdp_mini import collectives as C
from fsdp_mini.course.language import get_language, plural, set_language, tr
from fsdp_mini.course.readings import parse_verdict, print_with_reading, read, read_budget
from fsdp_mini.flight_recorder import Entry, FlightRecorder, diagnose, find_divergence, record_path
from fsdp_mini.memory_ledger import LedgerSnapshot, MemoryBudgetExceeded


@pytest.fixture
def language():
    before = get_language()
    yield set_language
    set_language(before)


def test_plural_picks_the_russian_form_by_the_last_digits(language):
    language("ru")
    forms = ("токен", "токена", "токенов")
    cases = {0: "токенов", 1: "токен", 2: "токена", 4: "токена", 5: "токенов", 11: "токенов",
             12: "токенов", 14: "токенов", 21: "токен", 22: "токена", 25: "токенов", 101: "токен",
             111: "токенов", 112: "токенов", 1001: "токен", 10164: "токена", 10165: "токенов",
             -1: "токен", -3: "токена"}
    assert {n: plural(n, *forms) for n in cases} == cases
    assert plural(1.5, *forms) == "токена" and plural(2.0, *forms) == "токена"
    assert plural(5.0, *forms) == "токенов"


def test_plural_in_english_is_one_or_many(language):
    language("en")
    assert [plural(n, "token", "tokens?", "tokens") for n in (0, 1, 2, 5, 21, 1.5)] == [
        "tokens", "token", "tokens", "tokens", "tokens", "tokens"]


def test_plural_with_tr_gives_each_language_its_word(language):
    def tokens(n):
        return plural(n, tr("token", "токен"), tr("tokens", "токена"), tr("tokens", "токенов"))
    language("en")
    assert (tokens(1), tokens(3)) == ("token", "tokens")
    language("ru")
    assert (tokens(1), tokens(3), tokens(7)) == ("токен", "токена", "токенов")


# --- the library's messages read in the lesson's language (fsdp_mini.course.readings) -----------------

def _e(seq, op="all_gather", group=(0, 1, 2), shape=(4,), label="", phase="", done=False):
    return Entry(seq, op, group, (shape,), "float32", label, phase, done)


# verdicts the library writes, on hand-made records: (records, world)
VERDICT_RECORDS = {
    "units": ({0: [_e(1), _e(2, label="blocks.3", phase="backward", op="reduce_scatter")],
               1: [_e(1), _e(2, label="blocks.2", phase="forward")],
               2: [_e(1), _e(2, label="blocks.3", phase="backward", op="reduce_scatter")]}, 3),
    "shapes": ({0: [_e(1, shape=(4,), done=True)], 1: [_e(1, shape=(5,))], 2: [_e(1, shape=(6,), done=True)]}, 3),
    "none issued": ({0: [_e(1, done=True), _e(2, label="root", phase="forward", done=True)],
                     1: [_e(1, done=True)], 2: [_e(1, done=True), _e(2, label="root", phase="forward")]}, 3),
    "subgroup": ({0: [_e(1, group=(0, 2)), _e(2, group=(0, 2), label="full_state_dict")], 1: [],
                  2: [_e(1, group=(0, 2)), _e(2, group=(0, 2), op="all_reduce")]}, 3),
}
READINGS = {
    "units": "ранг 1 ждёт в AllGather #2 (blocks.2, forward), а ранги 0, 2 — в ReduceScatter #2 (blocks.3, "
             "backward)",
    # the verb is left out only where the side before has the same one
    "shapes": "ранг 0 запустил AllGather #1 с тензором (4,) float32, а ранг 1 ждёт в AllGather #1 с тензором "
              "(5,) float32 и ранг 2 запустил AllGather #1 с тензором (6,) float32",
    "none issued": "ранг 1 не запускал коллективную операцию #2 (последняя запущенная — AllGather #1), а ранги "
                   "0, 2 запустили AllGather #2 (root, forward)",
    "subgroup": "ранг 0 ждёт в AllGather #2 (full_state_dict), а ранг 2 — в AllReduce #2 (в группе рангов 0, 2)",
}


@pytest.mark.parametrize("case", VERDICT_RECORDS)
def test_a_verdict_parsed_and_rendered_in_english_is_the_library_sentence(case, language):
    records, world = VERDICT_RECORDS[case]
    verdict = find_divergence(records, world=world)
    language("en")
    for sentence in (verdict, "ranks diverged: " + verdict):
        assert parse_verdict(sentence) is not None, sentence
        assert parse_verdict(sentence).render() == sentence == read(sentence)
    language("ru")
    assert read(verdict) == READINGS[case]
    assert read("ranks diverged: " + verdict) == "ранги разошлись: " + READINGS[case]


def test_the_readings_use_the_agreed_russian_terms(language):
    language("ru")
    text = " ".join(read(find_divergence(r, world=w)) for r, w in VERDICT_RECORDS.values())
    assert "выда" not in text and "мир" not in text  # issue -> запускать; world size -> число рангов


def _skip_a_collective():
    C.all_reduce(torch.ones(2))
    if dist.get_rank() != 1:
        C.all_reduce(torch.ones(2))  # rank 1 never joins
    return dist.get_rank()


def test_a_real_launch_timeout_is_read_line_by_line(language, no_orphans):
    with pytest.raises(LaunchTimeout) as info:
        launch(_skip_a_collective, 3, timeout=3)
    verdict, headline = str(info.value).splitlines()[:2]
    language("en")
    assert read(verdict) == verdict and read(headline) == headline
    language("ru")
    assert read(verdict) == ("ранги разошлись: ранг 1 не запускал коллективную операцию #2 (последняя "
                             "запущенная — AllReduce #1), а ранги 0, 2 ждут в AllReduce #2")
    assert read(headline) == ("ранги 0, 2 не завершились за 3 с (ранг 1 вернул результат): все ли ранги "
                              "вызывают одни и те же коллективные операции в одном и том же порядке?")


def _die_silently():
    if dist.get_rank() == 1:
        os._exit(7)
    dist.all_reduce(torch.zeros(1))


def test_a_rank_that_died_is_read(language, no_orphans):
    with pytest.raises(LaunchError) as info:
        launch(_die_silently, 2, timeout=30)
    headline = next(line for line in str(info.value).splitlines() if line.startswith("rank 1 "))
    language("ru")
    assert read(headline) == "ранг 1 завершился с кодом 7, ничего не сообщив (os._exit?)"
    assert read("rank 0 was killed by signal 6 (SIGABRT)") == "ранг 0 убит сигналом 6 (SIGABRT)"
    assert read("rank 2 failed: RuntimeError: boom") == "ранг 2 упал: RuntimeError: boom"


def test_diagnose_notes_on_what_it_left_out_are_read_line_by_line(tmp_path, language):
    old = FlightRecorder(capacity=4)
    old.attach(record_path(str(tmp_path), 2), run="20260101-000000-aaaa", rank=2, world=3)
    time.sleep(0.01)
    new = FlightRecorder(capacity=4)
    new.attach(record_path(str(tmp_path), 1), run="20260101-000001-bbbb", rank=1, world=2)
    new.issue("all_reduce", (0, 1), [torch.ones(2)], "")
    del old, new
    text = diagnose(str(tmp_path))
    language("en")
    assert read(text) == text and len(text.splitlines()) == 3
    language("ru")
    assert read(text).splitlines() == [
        "ранги согласны во всех записанных коллективных операциях; ждут: ранг 1 — в AllReduce #1",
        "(пропущены rank2.flight: они от прошлого запуска на 3 ранга, 20260101-000000-aaaa)",
        "(нет записей ранга 0; в этом запуске 2 ранга)"]


def test_diagnose_sentences_are_read(tmp_path, language):
    rec = FlightRecorder(capacity=4)
    rec.attach(record_path(str(tmp_path), 1))
    rec.issue("reduce_scatter", (0, 1), [torch.ones(3)], "blocks.0")
    del rec
    waiting = diagnose(str(tmp_path))
    language("ru")
    assert read(waiting) == ("ранги согласны во всех записанных коллективных операциях; ждут: "
                             "ранг 1 — в ReduceScatter #1 (blocks.0)")
    (tmp_path / "empty").mkdir()
    assert read(diagnose(str(tmp_path / "empty"))) == (
        f"в {tmp_path / 'empty'} нет файлов бортового самописца (rank<r>.flight)")
    with pytest.raises(ValueError):
        read("something the library never says")


def test_a_budget_error_is_read_from_its_fields(language):
    snapshot = LedgerSnapshot("optimizer step", {"parameters": 71_880, "gradients": 71_880,
                                                 "optimizer state": 143_776, "gathered": 0, "prefetch": 0,
                                                 "activations": 0})
    language("en")
    assert read_budget(snapshot, 200_000) == str(MemoryBudgetExceeded(snapshot, 200_000))
    language("ru")
    assert read_budget(snapshot, 200_000) == (
        "бюджет памяти 200,0 кБ превышен во время шага оптимизатора: занято 287,5 кБ, больше всего — "
        "состояние оптимизатора (143,8 кБ); параметры 71,9 кБ, градиенты 71,9 кБ, состояние оптимизатора "
        "143,8 кБ")


def test_print_with_reading_adds_the_reading_only_in_russian(language, capsys):
    sentence = "rank 0 issued AllReduce #5 while rank 1 issued no collective #5 (its last: AllReduce #4)"
    language("en")
    print_with_reading("verdict: ", sentence)
    assert capsys.readouterr().out == f"verdict: {sentence}\n"
    language("ru")
    print_with_reading("вердикт: ", sentence)
    assert capsys.readouterr().out == (
        f"вердикт: {sentence}\n"
        "         ранг 0 запустил AllReduce #5, а ранг 1 не запускал коллективную операцию #5 "
        "(последняя запущенная — AllReduce #4)\n")
