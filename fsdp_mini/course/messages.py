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
    "flat_design": ("flat (FSDP)", "плоский (FSDP)"),
    "per_parameter_design": ("per-parameter (fully_shard)", "по параметрам (fully_shard)"),
    "training_run": ("run", "запуск"),
    "one_process": ("1 process", "1 процесс"),
    "three_losses": ("losses of 3 steps", "лоссы 3 шагов"),
    "weights_vs_one_process": ("weights: max |difference| from 1 process",
                               "веса: max |разница| с 1 процессом"),
    "fsdp_unit": ("unit", "юнит"),
    "all_gather_flat": ("AllGather: flat", "AllGather: плоский"),
    "all_gather_per_parameter": ("AllGather: per-parameter", "AllGather: по параметрам"),
    "reduce_scatter_flat": ("ReduceScatter: flat", "ReduceScatter: плоский"),
    "reduce_scatter_per_parameter": ("ReduceScatter: per-parameter", "ReduceScatter: по параметрам"),
    "padding_cost": ("every byte above follows from the shapes; per-parameter padding costs {extra} B more"
                     " per step ({share:.1%} of the gathered bytes)",
                     "каждый байт таблицы выводится из форм параметров; паддинг по параметрам добавляет"
                     " {extra} Б за шаг ({share:.1%} собираемых байтов)"),
    "names_held": ("{design}: {n} {n:parameter|parameters|parameters}: {names}",
                   "{design}: {n} {n:параметр|параметра|параметров}: {names}"),
    "names_are_the_models": ("per-parameter names are the model's own: {own}",
                             "имена при шардировании по параметрам — имена модели: {own}"),
    "gather_buffer_title": ("the root unit's AllGather buffer on 4 ranks: copy-in fills a row, "
                            "copy-out reads a column block",
                            "буфер AllGather корневого юнита на 4 рангах: copy-in заполняет строку, "
                            "copy-out читает блок столбцов"),
    "lora_quantity": ("one rank, the logged step", "один ранг, записанный шаг"),
    "block0_tensors": ("block 0's tensors on a rank", "тензоров блока 0 на ранге"),
    "block0_allgathers": ("AllGathers of block 0 per step", "AllGather блока 0 за шаг"),
    "block0_reduce_scatter_bytes": ("ReduceScatter bytes of block 0 per step",
                                    "байт ReduceScatter блока 0 за шаг"),
    "param_bytes_per_rank": ("parameter bytes per rank", "байт параметров на ранг"),
    "grad_bytes_per_rank": ("gradient bytes per rank", "байт градиентов на ранг"),
    "optimizer_bytes_per_rank": ("optimizer state bytes per rank", "байт состояния оптимизатора на ранг"),
    "both_match_after_3_steps": ("both designs match one process after 3 steps: {same}",
                                 "после 3 шагов оба варианта совпадают с одним процессом: {same}"),
    "flat_tensors_of_block0": ("flat design's tensors of block 0: {names}",
                               "тензоры блока 0 в плоском варианте: {names}"),
    "fsdp1_by_hand": ("FSDP1, use_orig_params=False, blocks wrapped by hand:",
                      "FSDP1, use_orig_params=False, блоки обёрнуты вручную:"),
    "fsdp1_by_policy": ("FSDP1, use_orig_params=False, auto_wrap_policy:",
                        "FSDP1, use_orig_params=False, политика auto_wrap_policy:"),
    "fsdp1_orig_params": ("FSDP1, use_orig_params=True, auto_wrap_policy:",
                          "FSDP1, use_orig_params=True, политика auto_wrap_policy:"),
    "fsdp1_gradient_bytes": ("FSDP1, use_orig_params=True: gradient bytes per rank after backward {theirs}"
                             " ({ratio:.1} times fsdp_mini's flat design, {ours})",
                             "FSDP1, use_orig_params=True: после backward градиенты занимают {theirs}"
                             " {theirs:байт|байта|байт} на ранг — в {ratio:.1} раза больше, чем у плоского"
                             " варианта fsdp_mini ({ours})"),
    "decay_groups": ("decay / no-decay parameters", "с decay / без decay"),
    "vs_one_process": ("max |difference| from 1 process", "max |разница| с 1 процессом"),
    "flat_called_directly": ("flat, called directly", "плоский, вызов напрямую"),
    "flat_under_summon_full_params": ("flat, under summon_full_params()", "плоский, в summon_full_params()"),
    "per_parameter_not_registered": ("per-parameter, not registered", "по параметрам, без регистрации"),
    "per_parameter_registered": ("per-parameter, registered", "по параметрам, с регистрацией"),
    "generated_tokens": ("{case:<34}tokens {tokens}, equal to 1 process: {same}",
                         "{case:<34}токены {tokens}, совпадают с 1 процессом: {same}"),
    "allgathers_during_generate": ("AllGathers during the registered generate(): {gathers}",
                                   "AllGather во время зарегистрированного generate(): {gathers}"),
    "kept_after_forward": ("kept after forward, B", "оставлено после forward, Б"),
    "peak_gathered": ("peak gathered, B", "пик собранного, Б"),
    "allgather_over_4": ("AllGather over 4, B", "AllGather на 4 рангах, Б"),
    "allgather_over_2": ("over 2, B", "на 2 рангах, Б"),
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
    "llama8_first_plan": ("\nLlama-3-8B, {params} {params:parameter|parameters|parameters}; FSDP over 8 GPUs of one"
                          " node, 2 sequences of 8,192 tokens per GPU, AC selective-op",
                          "\nLlama-3-8B, {params} {params:параметр|параметра|параметров}; FSDP на 8 GPU одного"
                          " узла, 2 последовательности по 8\u202f192 токена на GPU, AC selective-op"),
    "memory_term": ("memory per GPU", "память на GPU"),
    "gib": ("GiB", "ГиБ"),
    "peak_reserved_at": ("peak, as max_memory_reserved reads it: {moment}",
                         "пик, как его видит max_memory_reserved: {moment}"),
    "largest_terms": ("the largest: model states {states:.1} GiB, activations of the blocks {activations:.1} GiB,"
                      " the loss {loss:.1} GiB (a vocabulary of {vocab} tokens)",
                      "больше всего занимают состояния модели — {states:.1} ГиБ, активации блоков —"
                      " {activations:.1} ГиБ и лосс — {loss:.1} ГиБ (словарь из {vocab} токенов)"),
    "step_part": ("one step", "один шаг"),
    "seconds": ("s", "с"),
    "rate_and_mfu": ("tokens/s per GPU: {rate:.0}, MFU: {mfu:.1%}", "токенов/с на GPU: {rate:.0}, MFU: {mfu:.1%}"),
    "llama8_on_8_h100": ("Llama-3-8B, FSDP over 8 H100s, 2 sequences of 8,192 tokens per GPU:",
                         "Llama-3-8B, FSDP на 8 H100, 2 последовательности по 8\u202f192 токена на GPU:"),
    "ac_mode": ("mode", "режим"),
    "block_activations_gib": ("activations of the blocks, GiB", "активации блоков, ГиБ"),
    "recomputation_share": ("recomputation, share of the step", "пересчёт, доля шага"),
    "llama8_modes_title": ("Llama-3-8B on 8 H100s: the four checkpointing modes",
                           "Llama-3-8B на 8 H100: четыре режима чекпоинтинга"),
    "matmul_widths": ("matrix products in forward order (output width per token):",
                      "матричные произведения в порядке forward (ширина выхода на токен):"),
    "course_gpt": ("the course's GPT", "GPT курса"),
    "fits_in_memory": ("fits", "влезает"),
    "course_gpt_block": ("course GPT block", "блок GPT курса"),
    "gpt_block_shape": ("h={h}, {heads} {heads:head|heads|heads}, {tokens} tokens",
                        "h={h}, {heads} {heads:голова|головы|голов}, {tokens} {tokens:токен|токена|токенов}"),
    "measured_bytes": ("measured, B", "измерено, Б"),
    "planner_bytes": ("planner, B", "планировщик, Б"),
    "llama70_on_256": ("Llama-3-70B on 256 H100s (32 nodes), 256 sequences of 8,192 tokens per step",
                       "Llama-3-70B на 256 H100 (32 узла), 256 последовательностей по 8\u202f192 токена за шаг"),
    "fitting_layouts": ("\nlayouts of these GPUs and this batch that fit: {n}; the fastest: {layout}, AC {ac}",
                        "\nраскладок этих GPU с этим батчем, которые помещаются: {n}; самая быстрая: {layout},"
                        " AC {ac}"),
    "tp8_slower": ("TP 8 + SP with full AC trains {slower:.0%} slower; its TP collectives (never hidden) take"
                   " {exposed:.0%} of its step",
                   "TP 8 + SP с полным чекпоинтингом обучает на {slower:.0%} медленнее; его коллективные операции"
                   " TP (не скрытые) занимают {exposed:.0%} шага"),
    "llama405_alone": ("Llama-3-405B, FSDP over 256 H100s, 1 sequence of 8,192 tokens per GPU, full AC:",
                       "Llama-3-405B, FSDP на 256 H100, 1 последовательность из 8\u202f192 токенов на GPU,"
                       " полный чекпоинтинг:"),
    "states_sharded_over_256": ("model states, sharded over 256 GPUs: {gib:.1} GiB",
                                "состояния модели, шардированные на 256 GPU: {gib:.1} ГиБ"),
    "llama405_blocks": ("{layers} blocks of {params} parameters, {gib:.1} GiB in bf16",
                        "{layers} {layers:блок|блока|блоков} по {params} {params:параметру|параметра|параметров},"
                        " {gib:.1} ГиБ в bf16"),
    "llama405_title": ("Llama-3-405B on 256 H100s, full AC, 256 sequences per step",
                       "Llama-3-405B на 256 H100, полный чекпоинтинг, 256 последовательностей за шаг"),
    "layout_name": ("layout", "раскладка"),
    "tp4_without_sp": ("TP 4 without SP", "TP 4 без SP"),
    "tp4_with_sp": ("TP 4 with SP", "TP 4 с SP"),
    "peak_gib": ("peak, GiB", "пик, ГиБ"),
    "llama70_long_context": ("Llama-3-70B on 256 H100s, 16 sequences of 131,072 tokens per step: data-parallel"
                             " ranks may be at most {sequences}",
                             "Llama-3-70B на 256 H100, 16 последовательностей по 131\u202f072 токена за шаг:"
                             " рангов по данным может быть не больше {sequences}"),
    "model_name": ("model", "модель"),
    "fitted_on": ("fitted on", "подгонка"),
    "fitted_yes": ("yes", "да"),
    "fitted_no": ("no", "нет"),
    "published_rate": ("published", "опубликовано"),
    "planner_rate": ("planner", "планировщик"),
    "planner_error": ("error", "ошибка"),
    "validation_summary": ("fitted rows: largest error {largest:.1%} (the test allows {tolerance:.0%}); H100 rows"
                           " it was not fitted on: too fast by {low:.0}–{high:.0}%",
                           "строки подгонки: наибольшая ошибка {largest:.1%} (тест допускает {tolerance:.0%});"
                           " строки H100 вне подгонки: быстрее на {low:.0}–{high:.0}\u00a0%"),
    "layout_passes": ("a layout passes if it fits and trains within {slower:.0%} of the fastest",
                      "раскладка проходит, если помещается и медленнее самой быстрой не больше чем на"
                      " {slower:.0%}"),
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
