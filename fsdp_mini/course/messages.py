"""Every sentence and column header a lesson's code cell prints, in English and Russian: the one table.

`fsdp_mini.course.show` looks a key up here (`say("num_params", n=...)`, `show(rows)` for the headers),
so the lessons' code carries no language. Each entry is (English, Russian), side by side so that an
editor sees both; the two must have the same placeholders (a test reads them), and the Russian follows
lessons/ru/STYLE.md. A placeholder's format spec (`{n:.2}`, `{b:size}`, `{n:one|few|many}`) is
described in `show`'s docstring.

One section per lesson (its keys are printed by that lesson only) and a common one for headers many
lessons share; a key lives in exactly one section (`_merge` refuses a second).
"""
from __future__ import annotations

# --- shared by several lessons ----------------------------------------------------------------------------
COMMON = {
    "rank": ("rank", "ранг"),
    "params": ("params", "параметры"),
    "grads": ("grads", "градиенты"),
    "optimizer": ("optimizer", "оптимизатор"),
    "step": ("step", "шаг"),
    "loss": ("loss", "лосс"),
}

# --- lesson 00 ---------------------------------------------------------------------------------------
LESSON_00 = {
    "num_params": ("{n} {n:parameter|parameters|parameters}", "{n} {n:параметр|параметра|параметров}"),
    "state": ("model state", "состояние модели"),
    "bytes": ("bytes", "байт"),
    "bytes_per_param": ("bytes/parameter", "байт/параметр"),
    "activations_batch_8": ("activations (batch 8)", "активации (батч 8)"),
    "batch": ("batch", "батч"),
    "batch_16_over_8": ("batch 16 / batch 8: {ratio:.3}", "батч 16 / батч 8: {ratio:.3}"),
    "sharding": ("sharding", "шардирование"),
    "per_gpu": ("per GPU", "на GPU"),
    "paper_example_title": ("7.5B parameters, N_d = 64, mixed-precision Adam",
                            "7,5 млрд параметров, N_d = 64, Adam в смешанной точности"),
    "rank_computes_on": ("rank {rank} of {world}: backend {backend}, computes on {device}",
                         "ранг {rank} из {world}: бэкенд {backend}, вычисляет на {device}"),
}

# --- lesson 01 ---------------------------------------------------------------------------------------
LESSON_01 = {
}

# --- lesson 02 ---------------------------------------------------------------------------------------
LESSON_02 = {
}

# --- lesson 03 ---------------------------------------------------------------------------------------
LESSON_03 = {
}

# --- lesson 04 ---------------------------------------------------------------------------------------
LESSON_04 = {
}

# --- lesson 05 ---------------------------------------------------------------------------------------
LESSON_05 = {
}

# --- lesson 06 ---------------------------------------------------------------------------------------
LESSON_06 = {
}

# --- lesson 07 ---------------------------------------------------------------------------------------
LESSON_07 = {
}

# --- lesson 08 ---------------------------------------------------------------------------------------
LESSON_08 = {
}

# --- lesson 09 ---------------------------------------------------------------------------------------
LESSON_09 = {
}

# --- lesson 10 ---------------------------------------------------------------------------------------
LESSON_10 = {
    # the six failure modes, by the name of the function that makes each one
    "skipped_block": ("a block skipped on one rank", "блок пропущен на одном ранге"),
    "one_batch_fewer": ("one batch fewer", "на один батч меньше"),
    "state_dict_on_rank0": ("state_dict() on rank 0 only", "state_dict() только на ранге 0"),
    "generate_on_rank0": ("generate() on rank 0 only", "generate() только на ранге 0"),
    "different_shapes": ("tensors of different shapes", "тензоры разных форм"),
    "dies_mid_step": ("a rank dies mid-step", "ранг умирает посреди шага"),
    "mode_heading": ("{mode}:", "{mode}:"),
    "rank_waits_in": ("rank {rank} waits in: {stack}", "ранг {rank} ждёт в: {stack}"),
    "mode_outcome": ("{mode} ({n} {n:rank|ranks|ranks}): {ended}, {took}",
                     "{mode} ({n} {n:ранг|ранга|рангов}): {ended}, {took}"),
    "timed_out": ("timeout", "таймаут"),
    "a_rank_failed": ("a rank failed", "ранг упал"),
    "under_s": ("under {s} s", "меньше {s}\u00a0с"),
    "slow": ("slow", "долго"),
    "verdict_label": ("verdict:", "вердикт:"),
    "ranks_named": ("{n:rank|ranks|ranks} {ranks}", "{n:ранг|ранги|ранги} {ranks}"),
    "rank_said": ("{rank}: {said}", "{rank}: {said}"),
    "detail_mismatch_reading": ("(the ranks found they are running different collectives)",
                                "(ранги обнаружили, что запускают разные коллективные операции)"),
    "detail_fingerprints": ("{pad}fingerprints: {prints}", "{pad}отпечатки: {prints}"),
    "detail_barrier_reading": ("(ranks {ranks} did not reach the monitored barrier within {ms} ms)",
                               "(ранги {ranks} не дошли до контролируемого барьера за {ms}\u00a0мс)"),
    "detail_finished": ("{pad}{ranks}: no error, they finished their loop",
                        "{pad}{ranks}: без ошибки, они закончили свой цикл"),
    "exit_code_of": ("{rank} (exit code {code})", "{rank} (код выхода {code})"),
    "fr_no_dump": ("no dump from rank {ranks}", "нет дампа ранга {ranks}"),
    "fr_not_joined": ("{where}: ranks {ranks} did not join", "{where}: ранги {ranks} в неё не вошли"),
    "fr_mismatch": ("{where}: {errors}, {meaning} ({values})", "{where}: {errors} — {meaning} ({values})"),
    "fr_type_mismatch": ("different op types", "разные типы операций"),
    "fr_size_mismatch": ("different input sizes", "разные размеры входов"),
    "fr_dumps_agree": ("nothing: the dumps agree", "ничего: дампы согласны"),
    "fsdp_mini_says": ("fsdp_mini:", "вердикт fsdp_mini:"),
    "fr_trace_finds": ("fr_trace:", "fr_trace находит:"),
    "after_group_timeout": ("rank 0, after the group's timeout (under 4 s: {quick}):",
                            "ранг 0, после таймаута группы (меньше 4\u00a0с: {quick}):"),
    "timed_out_reading": ("(did not get its {op} within {ms} ms)",
                          "(не дождался операции {op} за {ms}\u00a0мс)"),
    "torchrun_exit_code": ("torchrun exit code: {code}", "код выхода torchrun: {code}"),
    "diagnose_prints": ("$ python -m fsdp_mini diagnose DIR  # prints:",
                        "$ python -m fsdp_mini diagnose DIR  # печатает:"),
    # the memory ledger
    "flat_design": ("flat", "плоский"),
    "fully_shard_design": ("fully_shard", "fully_shard"),
    "ledger_design": ("{design}", "{design}"),
    "ledger_kind": ("kind", "категория"),
    "end_of_forward": ("end of forward", "конец forward"),
    "ledger_total_bytes": ("total, B", "всего, Б"),
    "ledger_peak": ("peak: {total} B in {phase}, the largest part {kind}",
                    "пик: {total}\u00a0Б в фазе {phase}, больше всего — {kind}"),
    "ledger_peaks_title": ("each phase's peak by kind, rank 0 of 2, 8 rows",
                           "пик каждой фазы по категориям, ранг 0 из 2, 8 строк"),
    "flat_8_rows": ("flat, 8 rows", "плоский, 8 строк"),
    "flat_32_rows": ("flat, 32 rows", "плоский, 32 строки"),
    "flat_8_rows_no_prefetch": ("flat, 8 rows, no prefetch", "плоский, 8 строк, без предвыборки"),
    "peaks_setup": ("setup", "вариант"),
    "peaks_total": ("peak, B", "пик, Б"),
    "peaks_phase": ("phase", "фаза"),
    "peaks_activations": ("activations", "активации"),
    "peaks_prefetch": ("prefetch", "предвыборка"),
    "peaks_end_activations": ("activations, end of forward", "активации, конец forward"),
    "activations_32_over_8": ("activations at the end of forward, 32 rows over 8: {ratio:.2}",
                              "активации в конце forward, 32 строки к 8: {ratio:.2}"),
    "head_and_block": ("the head's activations at 8 rows: {head} B; one block: {block} B",
                       "активации головы при 8 строках: {head}\u00a0Б; один блок: {block}\u00a0Б"),
    "rows_fit": ("{rows} rows: fits", "{rows} {rows:строка|строки|строк}: помещается"),
    "rows_label": ("{rows} rows:", "{rows} {rows:строка|строки|строк}:"),
    "ledger_name": ("ledger", "журнал памяти"),
    "not_counted": ("(not counted)", "(не считает)"),
    "ledger_total": ("total", "всего"),
    "tracker_without": ("backward's peak less Temp, Inputs and {padding} B of padding: {without} B "
                        "(the ledger: {ledger} B)",
                        "пик backward без Temp, Inputs и {padding}\u00a0Б паддинга: {without}\u00a0Б "
                        "(журнал памяти: {ledger}\u00a0Б)"),
}

# --- lesson 11 ---------------------------------------------------------------------------------------
LESSON_11 = {
}

# --- lesson 12 ---------------------------------------------------------------------------------------
LESSON_12 = {
}

# --- lesson 13 ---------------------------------------------------------------------------------------
LESSON_13 = {
}


def _merge(*sections: dict) -> dict[str, tuple[str, str]]:
    merged: dict[str, tuple[str, str]] = {}
    for section in sections:
        for key, entry in section.items():
            if key in merged:
                raise ValueError(f"message {key!r} is in two sections of fsdp_mini/course/messages.py")
            merged[key] = entry
    return merged


MESSAGES = _merge(COMMON, LESSON_00, LESSON_01, LESSON_02, LESSON_03, LESSON_04, LESSON_05, LESSON_06,
                  LESSON_07, LESSON_08, LESSON_09, LESSON_10, LESSON_11, LESSON_12, LESSON_13)
