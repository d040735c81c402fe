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
    "unit": ("unit", "юнит"),
    "param_tensors": ("tensors", "тензоры"),
    "elements": ("elements", "элементы"),
    "root_unit_holds": ("root unit: {names}", "корневой юнит: {names}"),
    "layout_over_ranks": ("{world} {world:rank|ranks|ranks}: {layout}",
                          "{world} {world:ранг|ранга|рангов}: {layout}"),
    "rank_holds": ("rank {rank} of {world} holds:", "ранг {rank} из {world} хранит:"),
    "bytes_kept": ("bytes", "байт"),
    "whole_quarter_kept": ("whole model {whole} B, a quarter {quarter} B, each rank keeps {kept} B",
                           "вся модель {whole} Б, четверть {quarter} Б, каждый ранг хранит {kept} Б"),
    "all_gathers_for_blocks": ("{n} {n:AllGather|AllGathers|AllGathers} for L = {layers} blocks",
                               "{n} AllGather для L = {layers} блоков"),
    "events": ("events", "события"),
    "completed_last": ("completed last:", "завершились последними:"),
    "ideal_step_title": ("FULL_SHARD, two units: an idealised step (computed, not measured)",
                         "FULL_SHARD, два юнита: идеализированный шаг (вычислен, не измерен)"),
    "full_shard_step_title": ("FULL_SHARD, 2 ranks, no prefetch: one step",
                              "FULL_SHARD, 2 ранга, без предвыборки: один шаг"),
    "gathered_peak_is_root_and_block": (
        "gathered peak {peak} B = root {root} + one block {block}; whole model {whole} B",
        "пик собранных {peak} Б = корневой юнит {root} + один блок {block}; вся модель {whole} Б"),
    "full_shard_no_prefetch": ("FULL_SHARD, no prefetch", "FULL_SHARD без предвыборки"),
    "root_and_one_block": ("root + 1 block", "корневой юнит + 1 блок"),
    "whole_model": ("whole model", "вся модель"),
    "gathered_on_rank_0_title": ("gathered parameters on rank 0 during one step",
                                 "собранные параметры на ранге 0 за шаг"),
    "bytes_per_rank": ("bytes per rank", "байт на ранг"),
    "unsharded_peak": ("gathered peak", "пик собранных"),
    "kilobytes": ("kB", "кБ"),
    "model_states_per_rank_title": ("model states per rank, 2 ranks", "состояния модели на ранг, 2 ранга"),
    "bytes_sent_per_step": ("bytes sent per step: NO_SHARD (DDP) {ddp}, FULL_SHARD {full} (x{ratio:.3})",
                            "отправлено байт за шаг: NO_SHARD (DDP) {ddp}, FULL_SHARD {full} (x{ratio:.3})"),
    "parity_run": ("training", "обучение"),
    "step_losses": ("losses", "лоссы"),
    "one_process_run": ("one process", "один процесс"),
    "full_shard_on_ranks": ("FULL_SHARD x{n}", "FULL_SHARD, {n} {n:ранг|ранга|рангов}"),
    "losses_and_weights_match": ("losses and all weights match to rtol 1e-5",
                                 "лоссы и все веса совпадают с rtol 1e-5"),
}

# --- lesson 06 ---------------------------------------------------------------------------------------
LESSON_06 = {
    "issued_before": ("issued before", "запущен до"),
    "no_prefetch": ("no prefetch", "без предвыборки"),
    "with_prefetch": ("prefetch", "с предвыборкой"),
    "gathered_peak_with_prefetch": (
        "gathered peak: no prefetch {without} B, prefetch {prefetch} B, whole model {whole} B",
        "пик собранных: без предвыборки {without} Б, с предвыборкой {prefetch} Б, вся модель {whole} Б"),
    "root_and_two_blocks": ("root + 2 blocks", "корневой юнит + 2 блока"),
    "gathered_on_rank_0_full_shard_title": ("FULL_SHARD, rank 0: gathered parameters during one step",
                                            "FULL_SHARD, ранг 0: собранные параметры за шаг"),
    "full_shard_two_ranks_step_title": ("FULL_SHARD, 2 ranks: one step", "FULL_SHARD, 2 ранга: один шаг"),
    "prefetch_case": ("case", "вариант"),
    "median_step_ms": ("median step, ms", "медиана шага, мс"),
    "median_forward_ms": ("forward, ms", "forward, мс"),
    "median_backward_ms": ("backward, ms", "backward, мс"),
    "prefetch_over_no_prefetch": ("prefetch / no prefetch: {ratio:.2}", "с предвыборкой / без: {ratio:.2}"),
    "strategy_name": ("strategy", "стратегия"),
    "all_gather_bytes": ("AllGather, B", "AllGather, Б"),
    "reduce_scatter_bytes": ("ReduceScatter, B", "ReduceScatter, Б"),
    "tradeoff_title": ("GPT with {layers} blocks, 2 ranks, prefetch on",
                       "GPT из {layers} блоков, 2 ранга, предвыборка включена"),
    "precision_run": ("precision", "точность"),
    "master_shards": ("master shards", "мастер-шарды"),
    "compute_dtype": ("compute", "вычисления"),
    "fp32_loss": ("fp32 loss", "лосс fp32"),
    "bf16_within_2_percent": ("bf16 within 2% of it", "bf16 в пределах 2\u00a0% от него"),
    "bf16_fp32_master": ("bf16, fp32 master", "bf16, мастер в fp32"),
    "loss_per_step_title": ("FULL_SHARD, 2 ranks: loss per step", "FULL_SHARD, 2 ранга: лосс по шагам"),
    "full_shard_states_per_rank_title": ("FULL_SHARD, 2 ranks: model states per rank",
                                         "FULL_SHARD, 2 ранга: состояния модели на ранг"),
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
