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
    # what a layer keeps
    "megatron_fp32": ("Megatron, fp32", "Megatron, fp32"),
    "our_formula": ("our formula", "наша формула"),
    "measured_bytes": ("measured", "измерено"),
    "formula_agreement": ("agreement", "совпадение"),
    "megatron_over_measured": ("Megatron/measured", "Megatron/измерено"),
    "llama_sbh": ("{model}, s = {s}, h = {h}, a = {a}: Megatron's 34 + 5as/h = {megatron} bytes per sbh; "
                  "the planner's Llama block (bf16, flash attention): {planner:.1}",
                  "{model}, s = {s}, h = {h}, a = {a}: у Megatron 34 + 5as/h = {megatron} байт на sbh; "
                  "блок Llama у планировщика (bf16, flash attention): {planner:.1}"),
    "attention_call": ("attention", "внимание"),
    "default_kernel_no_dropout": ("default kernel, no dropout", "ядро по умолчанию, без dropout"),
    "default_kernel_dropout": ("default kernel, dropout 0.1", "ядро по умолчанию, dropout 0,1"),
    "math_kernel_no_dropout": ("math kernel, no dropout", "ядро math, без dropout"),
    "backward_node": ("backward node", "узел backward"),
    "square_tensors": ("s x s tensors", "тензоров s × s"),
    "one_square_tensor": ("one s x s tensor of all heads, fp32: {n} B", "один тензор s × s всех голов, fp32: {n} Б"),
    "layers_2_and_3": ("2 layers: {two:size} | 3 layers: {three:size} | difference: {difference} B; "
                       "one layer by the formula: {formula} B",
                       "2 слоя: {two:size} | 3 слоя: {three:size} | разница: {difference} Б; "
                       "один слой по формуле: {formula} Б"),
    # checkpointing
    "under_checkpoint": ("checkpointed", "чекпоинтинг"),
    "no_blocks": ("none", "нет"),
    "blocks_1_2": ("blocks 1, 2", "блоки 1, 2"),
    "all_4_blocks": ("all 4", "все 4"),
    "saved_for_backward": ("saved for backward", "сохранено для backward"),
    "blocks_recomputed_in_backward": ("blocks recomputed in backward", "блоков пересчитано в backward"),
    "per_checkpointed_block": ("per checkpointed block: {less:size} less, plus its input kept {kept:size}",
                               "блок с чекпоинтингом сохраняет на {less:size} меньше и добавляет свой вход: "
                               "{kept:size}"),
    "whole_forward_recomputed": ("whole forward recomputed", "forward пересчитан целиком"),
    "early_stop_default": ("early stop (the default)", "ранняя остановка (по умолчанию)"),
    "early_stop_saves": ("early stop saves, per block: {share:.1%} of its forward FLOPs",
                         "ранняя остановка экономит на каждом блоке {share:.1%} FLOP его forward"),
    "ms_per_step": ("ms per step", "мс на шаг"),
    "against_none": ("against none", "относительно «нет»"),
    # selective recomputation
    "attention_kernel": ("kernel", "ядро"),
    "nothing_checkpointed": ("nothing", "ничего"),
    "attention_core": ("attention core", "внутренняя часть"),
    "whole_block": ("whole block", "весь блок"),
    "saved_for_backward_bytes": ("saved for backward, B", "сохранено для backward, Б"),
    "core_gives_back": ("the core gives back: math {math} B = 4as²b (the softmax); "
                        "flash {flash} B = 4asb (the log-sum-exp)",
                        "внутренняя часть отдаёт: math {math} Б = 4as²b (softmax); flash {flash} Б = 4asb "
                        "(log-sum-exp)"),
    "core_costs": ("recomputing the core costs {share:.1%} of this block's FLOPs (the whole block: {whole:.1%})",
                   "пересчёт внутренней части стоит {share:.1%} FLOP этого блока (весь блок: {whole:.1%})"),
    "gpt3_core": ("a GPT-3 175B layer (s = {s}, h = {h}, a = {a}): the core costs {flops:.1%} of the FLOPs "
                  "and holds {memory:.0%} of the activations",
                  "слой модели GPT-3 на 175 млрд параметров (s = {s}, h = {h}, a = {a}): внутренняя часть "
                  "стоит {flops:.1%} FLOP и хранит {memory:.0%} активаций"),
    # the AllGathers under checkpointing
    "fsdp_engine": ("engine", "движок"),
    "sharding_strategy": ("strategy", "стратегия"),
    "every_block": ("every block", "каждый блок"),
    "blocks_0_1_together": ("blocks 0+1 together", "блоки 0+1 вместе"),
    "allgathers_per_step": ("AllGathers/step", "AllGather/шаг"),
    "gathered_peak": ("gathered peak", "пик собранных"),
    "weights_match_one_process": ("every run's weights equal one process's to within 1e-6 (asserted)",
                                  "веса каждого запуска совпадают с обучением в одном процессе с точностью "
                                  "до 1e-6 (проверено assert)"),
    "wrap_order": ("order", "порядок"),
    "no_checkpointing": ("no checkpointing", "без чекпоинтинга"),
    "wrapper_then_fully_shard": ("wrapper, then fully_shard", "обёртка, потом fully_shard"),
    "fully_shard_then_wrapper": ("fully_shard, then wrapper", "fully_shard, потом обёртка"),
    "recomputed_per_step": ("recomputed/step", "пересчётов/шаг"),
    "first_block_unit": ("first block unit", "юнит блока 0"),
    "weights_match_no_checkpointing": ("each order's weights equal those without checkpointing to within 1e-6 "
                                       "(asserted)",
                                       "при любом порядке веса совпадают с обучением без чекпоинтинга с "
                                       "точностью до 1e-6 (проверено assert)"),
    # when an AllGather hides
    "hiding_assumptions": ("assumptions: GPU {gpu}, {tflops} TFLOP/s bf16 x 45 % MFU, NVLink {nvlink:size}/s, "
                           "network {network:size}/s per GPU, alpha {alpha_inside} / {alpha_across} us inside / "
                           "across nodes",
                           "допущения: GPU {gpu}, {tflops} TFLOP/s bf16 × 45 % MFU, NVLink {nvlink:size}/с, "
                           "сеть {network:size}/с на GPU, α {alpha_inside} / {alpha_across} мкс внутри узла / "
                           "между узлами"),
    "setup_cluster": ("cluster", "кластер"),
    "one_node_nvlink": ("1 node x 8, NVLink", "1 узел × 8 GPU, NVLink"),
    "eight_nodes_ib": ("8 nodes x 8, IB 400 Gb/s", "8 узлов × 8 GPU, IB 400 Гбит/с"),
    "eight_nodes_ib_small_units": ("8 nodes x 8, IB, 5 M-parameter units",
                                   "8 узлов × 8 GPU, IB, юниты по 5 млн параметров"),
    "allgather_ms": ("AllGather, ms", "AllGather, мс"),
    "tokens_per_gpu_to_hide": ("tokens per GPU to hide it", "токенов на GPU, чтобы его скрыть"),
    "tokens_per_rank": ("tokens/rank", "токенов/ранг"),
    "block_forward_ms": ("block forward, ms", "forward блока, мс"),
    "step_no_prefetch_ms": ("step, no prefetch, ms", "шаг без предвыборки, мс"),
    "step_prefetch_ms": ("step, prefetch, ms", "шаг с предвыборкой, мс"),
    "gather_same_bytes": ("each block's AllGather moves {nbytes:size} at every size; a block's forward on {many} "
                          "tokens per rank takes\nmore than 2 times as long as on {few} (asserted)",
                          "AllGather каждого блока пересылает {nbytes:size} при любом размере; forward блока на "
                          "{many} токенах на ранг идёт\nбольше чем вдвое дольше, чем на {few} (проверено assert)"),
    "on_paper_unit": ("on paper, H100s, {tokens} {tokens:token|tokens|tokens} per GPU, a 200 M-parameter unit:",
                      "на бумаге, H100: {tokens} {tokens:токен|токена|токенов} на GPU, юнит из 200 млн "
                      "параметров:"),
    "forward_ms": ("forward, ms", "forward, мс"),
    "unit_no_prefetch_ms": ("unit without prefetch, ms", "юнит без предвыборки, мс"),
    "unit_prefetch_ms": ("unit with prefetch, ms", "юнит с предвыборкой, мс"),
    "planner_block": ("the planner, {model} block ({params} parameters), {tokens} {tokens:token|tokens|tokens} "
                      "per GPU:",
                      "планировщик, блок {model} ({params} {params:параметр|параметра|параметров}), {tokens} "
                      "{tokens:токен|токена|токенов} на GPU:"),
    "gpu_count": ("GPUs", "GPU"),
    "hides_from_tokens_per_gpu": ("hides from about, tokens per GPU", "скрывается примерно с, токенов на GPU"),
    "planner_network": ("its network across nodes: 8 NICs x {nic:size}/s x the fitted {fraction:.1%} = "
                        "{network:size}/s per GPU",
                        "сеть между узлами у него: 8 карт × {nic:size}/с × подобранные {fraction:.1%} = "
                        "{network:size}/с на GPU"),
    # CPU offload
    "one_unshard": ("one unshard of blocks.0, for each of its {n} parameters:\n"
                    "  1. {shard} shard copied to the compute device\n  2. the copy cast to {cast}",
                    "один вызов unshard у blocks.0; для каждого из {n} его параметров:\n"
                    "  1. {shard} — шард копируется на устройство\n  2. копия приводится к {cast}"),
    "after_offloaded_step": ("after a step: the shard {shard} | its gradient {grad} | AdamW's two moments "
                             "{moments}",
                             "после шага: шард {shard} | его градиент {grad} | два момента AdamW {moments}"),
    "offload_assumptions": ("the planner's assumptions, {gpu}: PCIe {pcie_nominal:size}/s x {pcie_share:.0%} = "
                            "{pcie:size}/s per direction; host memory {n} x {socket:size}/s x "
                            "{host_share:.0%} = {host:size}/s",
                            "допущения планировщика, {gpu}: PCIe {pcie_nominal:size}/с × {pcie_share:.0%} = "
                            "{pcie:size}/с в каждую сторону; память хоста {n} × {socket:size}/с × "
                            "{host_share:.0%} = {host:size}/с"),
    "offload_per_gpu": ("per GPU per step: {to_gpu:size} to the GPU, {to_host:size} back",
                        "за шаг на каждую GPU: {to_gpu:size} туда, {to_host:size} обратно"),
    "offload_pcie": ("  PCIe: {alone:.0} ms on its own x16 link, {shared:.0} ms when two GPUs share one",
                     "  PCIe: {alone:.0} мс по своему каналу x16, {shared:.0} мс, если канал делят две GPU"),
    "offload_host_copies": ("host memory, the 8 GPUs together: {copies:size} of copies ({ms:.0} ms)",
                            "память хоста, все 8 GPU вместе: {copies:size} копий ({ms:.0} мс)"),
    "cpu_adamw_counted": ("AdamW on the CPU, counted: it reads and writes {adamw:.0} B per parameter; "
                          "fused=True: {fused:.0}",
                          "AdamW на CPU, подсчитано: читает и пишет {adamw:.0} Б на параметр; "
                          "fused=True: {fused:.0}"),
    "cpu_adamw_step": ("  the step over all {billions:.0} billion parameters of the host: {adamw_bytes:size} = "
                       "{adamw_ms:.0} ms, fused {fused_bytes:size} = {fused_ms:.0} ms",
                       "  шаг по всем {billions:.0} млрд параметров хоста: {adamw_bytes:size} = "
                       "{adamw_ms:.0} мс, fused {fused_bytes:size} = {fused_ms:.0} мс"),
    "tokens_per_gpu": ("tokens per GPU", "токенов на GPU"),
    "compute_ms": ("compute, ms", "вычисления, мс"),
    "cpu_step_adds": ("the CPU step adds", "шаг на CPU добавляет"),
    "fused_adds": ("fused adds", "fused добавляет"),
    "planner_offload": ("the planner, {model} on {n} {gpu}, {tokens} {tokens:token|tokens|tokens} per GPU, "
                        "full recomputation: step {step:.2} s, with offload {offloaded:.2} s",
                        "планировщик, {model} на {n} {gpu}, {tokens} {tokens:токен|токена|токенов} на GPU, "
                        "полный пересчёт: шаг {step:.2} с, с выгрузкой {offloaded:.2} с"),
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
