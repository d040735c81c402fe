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
    "grid_rows_and_cols": ("shard groups (rows):   {rows!r}\nreplica groups (cols): {cols!r}",
                           "группы шардирования (строки): {rows!r}\nгруппы реплик (столбцы):      {cols!r}"),
    "strategy": ("strategy", "стратегия"),
    "shard_groups": ("shard groups", "группы шардирования"),
    "replica_groups": ("replica groups", "группы реплик"),
    "node": ("node", "узел"),
    "shard_group": ("shard group", "группа шардирования"),
    "replica_group": ("replica group", "группа реплик"),
    "shard_numel_per_unit": ("shard numel per unit", "элементов шарда по юнитам"),
    "replicas_equal_shards_differ": (
        "equal within replica groups, different within shard groups: before and after 5 steps",
        "в группах реплик шарды равны, в группах шардирования различны: до и после 5 шагов"),
    "hybrid_one_step_one_rank": ("HYBRID_SHARD, one step, one rank", "HYBRID_SHARD, один шаг, один ранг"),
    "group": ("group", "группа"),
    "calls": ("calls", "вызовов"),
    "nbytes": ("S, B", "S, Б"),
    "sent": ("sent, B", "отправлено, Б"),
    "unit_sizes": ("parameters per unit: {params}; padded bytes per unit: {padded}",
                   "параметров в юните: {params}; байт с паддингом в юните: {padded}"),
    "losses_one_process": ("losses, 1 process:    {losses:.4}", "лоссы, 1 процесс:     {losses:.4}"),
    "losses_hybrid_shard": ("losses, HYBRID_SHARD: {losses:.4}", "лоссы, HYBRID_SHARD:  {losses:.4}"),
    "parity_within_1e_5": ("max |loss diff| < 1e-5 and max |weight diff| < 1e-5: {holds}",
                           "max |разница лоссов| < 1e-5 и max |разница весов| < 1e-5: {holds}"),
    "sent_inside_a_node": ("sent inside a node", "отправлено в узле"),
    "sent_across_nodes": ("sent across nodes", "отправлено между узлами"),
    "total_per_rank": ("total per rank", "всего на ранг"),
    "memory_7b_title": ("7B parameters, mixed-precision Adam, 8 nodes x 8 GPUs",
                        "7 млрд параметров, Adam со смешанной точностью, 8 узлов × 8 GPU"),
    "seconds_inside": ("s inside", "с в узле"),
    "seconds_across": ("s across", "с между"),
    "seconds_per_step": ("s per step", "с на шаг"),
    "step_comm_7b_title": ("7B, 8 nodes x 8 GPUs: one training step, per rank",
                           "7 млрд, 8 узлов × 8 GPU: один шаг обучения, на ранг"),
    "hybrid_speedup": (
        "HYBRID_SHARD is {over_full:.1}x faster than FULL_SHARD and {over_ddp:.1}x faster than DDP",
        "HYBRID_SHARD быстрее FULL_SHARD в {over_full:.1} раза и быстрее DDP в {over_ddp:.1} раза"),
    "holds": ("holds", "верно"),
    "rule": ("rule of thumb", "правило"),
    "rule_7b_ddp_does_not_fit": ("7B: DDP does not fit", "7 млрд: DDP не помещается"),
    "rule_7b_node_copy_fits": ("7B: one copy per node fits, with room for activations",
                               "7 млрд: копия на узел помещается, есть место для активаций"),
    "rule_7b_hybrid_is_fastest": ("7B: HYBRID_SHARD is the fastest", "7 млрд: HYBRID_SHARD быстрее всех"),
    "rule_below_a_node_is_worse": ("shard groups smaller than a node: slower and bigger",
                                   "группы меньше узла: медленнее и больше"),
    "rule_70b_node_copy_does_not_fit": ("70B: one copy per node does not fit",
                                        "70 млрд: копия на узел не помещается"),
    "rule_70b_full_shard_fits": ("70B: FULL_SHARD over 64 GPUs fits",
                                 "70 млрд: FULL_SHARD на 64 GPU помещается"),
    "rule_one_node_hybrid_is_full": ("one node: HYBRID_SHARD is FULL_SHARD",
                                     "один узел: HYBRID_SHARD совпадает с FULL_SHARD"),
}

# --- lesson 08 ---------------------------------------------------------------------------------------
LESSON_08 = {
    "every_pytorch_name_exists": ("every PyTorch name in the table exists",
                                  "все имена PyTorch из таблицы существуют"),
    "one_process": ("one process", "один процесс"),
    "run": ("run", "обучение"),
    "losses": ("losses per step", "лоссы по шагам"),
    "weights_match": (
        "weights: max |fsdp_mini - FSDP2| < 1e-5: {fsdp2}   max |fsdp_mini - 1 process| < 1e-5: {one_process}",
        "веса: max |fsdp_mini - FSDP2| < 1e-5: {fsdp2}   max |fsdp_mini - 1 процесс| < 1e-5: {one_process}"),
    "dtensor_layout": (
        "mesh:       {mesh}\nplacements: {placements}\nshape: {shape!r}  local shape: {local!r}",
        "сетка:      {mesh}\nplacements: {placements}\nформа: {shape!r}  локальная форма: {local!r}"),
    "fsdp2_parameter": ("FSDP2 parameter", "параметр FSDP2"),
    "shape": ("shape", "форма"),
    "local_rank_0": ("local, rank 0", "ранг 0"),
    "local_rank_1": ("local, rank 1", "ранг 1"),
    "flat_shards_rank_0": ("fsdp_mini flat shards, rank 0: {shards}",
                           "плоские шарды fsdp_mini, ранг 0: {shards}"),
    "dtensor_after_forward": (
        "blocks.0.mlp.fc.weight after forward is a DTensor (a shard):"
        " reshard_after_forward=True: {resharded}, False: {kept}",
        "blocks.0.mlp.fc.weight после forward — DTensor (шард):"
        " при reshard_after_forward=True: {resharded}, при False: {kept}"),
    "one_block_on_2_ranks_title": ("one block on 2 ranks: who holds which element",
                                   "один блок на 2 рангах: кто хранит какой элемент"),
    "picture_matches_both_libraries": ("the picture matches both libraries' shards on both ranks",
                                       "рисунок совпадает с шардами обеих библиотек на обоих рангах"),
    "losses_resumed_and_uninterrupted": (
        "2 ranks FULL_SHARD, then 4 ranks HYBRID_SHARD: {resumed:.4}\n"
        "1 process, 5 steps without stopping:           {uninterrupted:.4}",
        "2 ранга FULL_SHARD, затем 4 ранга HYBRID_SHARD: {resumed:.4}\n"
        "1 процесс, 5 шагов без остановки:               {uninterrupted:.4}"),
    "resumed_training_matches": ("resumed training matches, losses and weights within 1e-5: {holds}",
                                 "продолженное обучение совпадает, лоссы и веса в пределах 1e-5: {holds}"),
    "entry": ("entry", "запись"),
    "shape_or_type": ("shape or type", "форма или тип"),
    "checkpoint_entries": ("{n} {n:entry|entries|entries}", "{n} {n:запись|записи|записей}"),
    "demo_under_torchrun": (
        "Training a {blocks}-block GPT ({params} parameters) for {steps} AdamW steps, global batch {batch},"
        " on {procs} processes, under every strategy",
        "Обучаем GPT из {blocks} {blocks:блока|блоков|блоков}"
        " ({params} {params:параметр|параметра|параметров}) каждой стратегией:"
        " {steps} {steps:шаг|шага|шагов} AdamW, глобальный батч {batch},"
        " {procs} {procs:процесс|процесса|процессов}"),
    "every_strategy_matches": ("every strategy matches single-process training: {holds}",
                               "каждая стратегия совпадает с обучением в одном процессе: {holds}"),
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
