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
}

# --- lesson 11 ---------------------------------------------------------------------------------------
LESSON_11 = {
}

# --- lesson 12 ---------------------------------------------------------------------------------------
LESSON_12 = {
    # where FSDP alone stops scaling
    "one_block_and_batch": ("one block of {model}: {n} parameters; global batch {tokens} tokens",
                            "один блок {model}: {n} {n:параметр|параметра|параметров}; глобальный батч "
                            "{tokens} {tokens:токен|токена|токенов}"),
    "tokens_each_gpu_gets": ("tokens/GPU", "токенов/GPU"),
    "tokens_to_hide_gather": ("to hide", "порог"),
    "unit_forward_ms": ("forward, ms", "forward, мс"),
    "unit_all_gather_ms": ("AllGather, ms", "AllGather, мс"),
    "ring_latency_ms": ("latency, ms", "задержка, мс"),
    "ring_bytes_ms": ("bytes, ms", "байты, мс"),
    "gather_hides": ("hides", "скрыт"),
    "fsdp_stops_hiding": ("the AllGather stops hiding at {gpus} GPUs; from {split} GPUs a GPU holds less than "
                          "one sequence of {seq} tokens and latency outweighs bandwidth",
                          "AllGather перестаёт скрываться за вычислениями на {gpus} GPU; с {split} GPU каждой "
                          "GPU достаётся меньше одной последовательности из {seq} токенов, и задержка "
                          "перевешивает пропускную способность"),
    "fsdp_scaling_title": ("FULL_SHARD of one Llama-2-70B block, 4M tokens per step",
                           "FULL_SHARD одного блока Llama-2-70B, 4 млн токенов на шаг"),
    "planner_asked": ("planner, {gpu}, sequences of {seq} tokens, micro-batches {micro_batches}, "
                      "activation checkpointing {ac}:",
                      "планировщик, {gpu}, последовательности по {seq} токенов, микробатчей {micro_batches}, "
                      "чекпоинтинг активаций {ac}:"),
    "block_forward_ms": ("block forward, ms", "forward блока, мс"),
    # tensor parallelism by hand, attention
    "partial_equals_whole": ("rank 0's partial output equals the whole: {equal}",
                             "частичный выход ранга 0 равен целому: {equal}"),
    "sum_equals_whole": ("the sum of the two partial outputs equals it: {equal}",
                         "сумма двух частичных выходов равна ему: {equal}"),
    "qkv_cut": ("cut", "разрез"),
    "rows_on_rank_0": ("rows on rank 0", "строки на ранге 0"),
    "contiguous_cut": ("contiguous", "сплошной"),
    "one_process_loss": ("one process", "один процесс"),
    # one step on two ranks, sequence parallelism
    "commlog_label": ("label", "метка"),
    "tensor_size": ("size", "размер"),
    "group_ranks": ("ranks", "рангов"),
    "whole_activation": ("each one is a whole activation, {batch} x {seq} x {h} x 4 B = {b:size}",
                         "каждый — целая активация, {batch} × {seq} × {h} × 4 Б = {b:size}"),
    "traffic": ("traffic", "трафик"),
    "collective_counts": ("collectives", "коллективные операции"),
    "collective_calls": ("calls", "вызовов"),
    "message_bytes": ("S, bytes", "S, байт"),
    "bytes_sent": ("sent", "отправлено"),
    "tp_in_blocks": ("TP, in the blocks", "TP, в блоках"),
    "sp_in_blocks": ("TP + SP, in the blocks", "TP + SP, в блоках"),
    "sp_at_the_ends": ("TP + SP, at the model's ends", "TP + SP, на концах модели"),
    "sp_replicated_gradients": ("TP + SP, replicated weights' gradients",
                                "TP + SP, градиенты реплицированных весов"),
    "kept_for_backward_per_rank": ("kept for backward per rank:", "сохранено для backward на ранг:"),
    "parallelism": ("parallelism", "параллелизм"),
    "kept_by_norms": ("by the LayerNorms", "в LayerNorm"),
    "kept_by_rest": ("by the rest", "в остальном"),
    "flows_in_and_out": ("{module:<19}in: {input:<40}out: {output}",
                         "{module:<19}вход: {input:<40}выход: {output}"),
    # TP x FSDP on four ranks
    "mean_of_dp_ranks": ("loss, mean of the two data-parallel ranks", "лосс, среднее двух рангов по данным"),
    "one_process_whole_batch": ("loss, one process on the whole batch", "лосс, один процесс на всём батче"),
    "weight_difference_after": ("largest weight difference after {steps} steps: below 1e-5 (asserted)",
                                "наибольшая разница весов после {steps} {steps:шага|шагов|шагов}: меньше 1e-5 "
                                "(проверено assert)"),
    "param_name": ("parameter", "параметр"),
    "whole_shape": ("whole", "целиком"),
    "tp_slice_shape": ("TP slice", "срез TP"),
    "kept_shape": ("kept", "хранит"),
    "rank_0_keeps": ("rank 0 keeps {kept} of {total} elements: {share:.1%}",
                     "ранг 0 хранит {kept} из {total} {total:элемента|элементов|элементов}: {share:.1%}"),
    "tp_inside_the_node": ("TP, inside the node (NVLink)", "TP, внутри узла (NVLink)"),
    "fsdp_across_nodes": ("FSDP, across nodes (network)", "FSDP, между узлами (сеть)"),
    "one_tp_all_reduce_on_paper": ("on paper, {tokens} tokens per rank, h = {h}, bf16: one TP AllReduce "
                                   "carries {b:size}",
                                   "на бумаге, {tokens} {tokens:токен|токена|токенов} на ранг, h = {h}, bf16: "
                                   "один AllReduce тензорного параллелизма передаёт {b:size}"),
    "pytorch_placements": ("PyTorch: mlp.fc.weight is a DTensor with placements {placements}",
                           "PyTorch: mlp.fc.weight — DTensor с placements {placements}"),
    "rank_0_losses_equal": ("losses of rank 0, PyTorch and fsdp_mini, equal to 1e-5 (asserted):",
                            "лосс ранга 0 у PyTorch и fsdp_mini совпадает до 1e-5 (проверено assert):"),
    "weights_equal_asserted": ("largest weight difference: below 1e-5 (asserted)",
                               "наибольшая разница весов: меньше 1e-5 (проверено assert)"),
    # when to choose what
    "params_per_gpu": ("parameters per GPU", "параметров на GPU"),
    "nvlink_per_step": ("NVLink per step", "NVLink за шаг"),
    "network_per_step": ("network per step", "сеть за шаг"),
    "planner_assumptions": ("planner: GPU {gpu}; sequences of {seq} tokens, {sequences} a step; local batch = "
                            "sequences / data-parallel ranks; micro-batches {micro_batches}; activation "
                            "checkpointing {ac}",
                            "планировщик: GPU {gpu}; последовательности по {seq} токенов, {sequences} за шаг; "
                            "локальный батч = последовательности / ранги по данным; микробатчей "
                            "{micro_batches}; чекпоинтинг активаций {ac}"),
    "model_name": ("model", "модель"),
    "parallel_layout": ("plan", "раскладка"),
    "peak_gib_per_gpu": ("GiB/GPU", "ГиБ/GPU"),
    "step_seconds": ("step, s", "шаг, с"),
    "fits_in_memory": ("fits", "помещается"),
    "fewer_sequences_than_ranks": ("fewer sequences than data-parallel ranks: {plans}",
                                   "последовательностей меньше, чем рангов по данным: {plans}"),
    "plan_on_gpus": ("{model} {plan} on {gpus} GPUs", "{model} {plan} на {gpus} GPU"),
    "cluster_gpus": ("GPUs", "число GPU"),
    "best_layout_that_fits": ("the best layout that fits, one micro-batch, full recomputation:",
                              "лучшая раскладка из помещающихся, один микробатч, полный пересчёт:"),
    "crossing_title": ("{model}: first GPU count where a layout fits, and from which TP wins",
                       "{model}: первое число GPU, где раскладка помещается, и с какого выигрывает TP"),
    "ac_mode": ("checkpointing", "чекпоинтинг"),
    "micro_batch_count": ("micro-batches", "микробатчей"),
    "fits_from_gpus": ("fits from", "помещается с"),
    "tp_wins_from_gpus": ("TP from", "TP с"),
    "one_sequence_no_recomputation": ("one sequence per micro-batch, no recomputation, 512 GPUs:",
                                      "одна последовательность на микробатч, без пересчёта, 512 GPU:"),
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
