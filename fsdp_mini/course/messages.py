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
    "calls": ("calls", "вызовов"),
    "losses": ("losses per step", "лоссы по шагам"),
    "one_process": ("one process", "один процесс"),
    "strategy": ("strategy", "стратегия"),
    "sent": ("sent, B", "отправлено, Б"),
    "block_forward_ms": ("block forward, ms", "forward блока, мс"),
    "model_name": ("model", "модель"),
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
    "own_process": ("own process", "свой процесс"),
    "held_hop_by_hop": ("held, hop by hop", "держал, шаг за шагом"),
    "before": ("before", "до"),
    "after": ("after", "после"),
    "sum_over_four_ranks": ("the sum over the four ranks: [{total}]", "сумма по четырём рангам: [{total}]"),
    "rank_0_naive_and_builtin": ("rank 0, naive and builtin: [{naive}] and [{builtin}]",
                                 "ранг 0, наивный и встроенный: [{naive}] и [{builtin}]"),
    "bytes_sent_by_each_rank": ("bytes sent by each rank:", "байт отправил каждый ранг:"),
    "naive": ("naive", "наивный"),
    "ring": ("ring", "кольцо"),
    "link_and_sizes": ("B = {bandwidth:g} GB/s, alpha = {alpha:g} µs, S = {big:size} and {small:size}",
                       "B = {bandwidth:g} ГБ/с, alpha = {alpha:g} мкс, S = {big:size} и {small:size}"),
    "s_equals": ("S = {s:size}", "S = {s:size}"),
    "big_then_small": ("S = {big:size}; in the last column S = {small:size}",
                       "S = {big:size}; в последнем столбце S = {small:size}"),
    "naive_ms": ("naive, ms", "наивный, мс"),
    "ring_ms": ("ring, ms", "кольцо, мс"),
    "naive_over_ring": ("naive/ring", "наивный/кольцо"),
    "naive_over_ring_small": ("naive/ring, small S", "наивный/кольцо, малое S"),
    "at_64_ranks": ("at 64 ranks: naive/ring = {ratio_big:.1} ({big:size}), {ratio_small:.4} ({small:size}); "
                    "the tree beats the ring on {small:size} from n = {tree_from}",
                    "на 64 рангах: наивный/кольцо = {ratio_big:.1} ({big:size}), {ratio_small:.4} "
                    "({small:size}); дерево быстрее кольца на {small:size} начиная с n = {tree_from}"),
    "bad_batch": ("rank {rank} got a bad batch", "ранг {rank} получил плохой батч"),
    "failed_rank": ("{error} | failed rank: {rank}", "{error} | упавший ранг: {rank}"),
    "its_message": ("its message: {message}", "его сообщение: {message}"),
    "failed_first": ("that is: rank {rank} failed first, and launch stopped the other ranks",
                     "то есть: первым упал ранг {rank}, и launch остановил остальные ранги"),
}

# --- lesson 02 ---------------------------------------------------------------------------------------
LESSON_02 = {
    "chunk_sum": ("chunk {chunk} [{ranks}]", "чанк {chunk} [{ranks}]"),
    "reduce_scatter_on_a_ring": ("ReduceScatter on a ring of {n} ranks", "ReduceScatter на кольце из {n} рангов"),
    "all_gather_on_a_ring": ("AllGather on a ring of {n} ranks", "AllGather на кольце из {n} рангов"),
    "owns_chunk_r": ("holds chunk r of the sum", "держит чанк r суммы"),
    "equals_all_reduce": ("equals all_reduce", "равно all_reduce"),
    "sent_reduce_scatter": ("sent by reduce_scatter, B", "отправил reduce_scatter, Б"),
    "sent_all_gather": ("sent by all_gather, B", "отправил all_gather, Б"),
    "each_rank_sent": ("S = {S} bytes; each rank sent {sent} = {factor:.1} × S",
                       "S = {S} байт; каждый ранг отправил {sent} = {factor:.1} × S"),
    "ring_n": ("ring, n = {n}", "кольцо, n = {n}"),
    "ring_model_title": ("Ring all-reduce, alpha-beta model (α = {alpha:g} µs, B = {bandwidth:g} GB/s)",
                         "Кольцевой AllReduce, модель alpha-beta (α = {alpha:g} мкс, B = {bandwidth:g} ГБ/с)"),
    "size": ("size", "размер"),
    "t64_over_t2": ("t(n=64) / t(n=2)", "t(n=64) / t(n=2)"),
    "terms_equal_at": ("n = {n}: the terms are equal at S = {size}", "n = {n}: слагаемые равны при S = {size}"),
    "algbw_gbs": ("algbw, GB/s", "algbw, ГБ/с"),
    "busbw_gbs": ("busbw, GB/s", "busbw, ГБ/с"),
    "impl": ("impl", "реализация"),
    "time_ms": ("time, ms", "время, мс"),
    "builtin": ("builtin", "встроенная"),
    "busbw_climb": ("{impl}: busbw at {big} / at {small} = {x:.0}×", "{impl}: busbw на {big} / на {small} = {x:.0}×"),
    "alpha_us": ("alpha, µs", "alpha, мкс"),
    "bandwidth_gbs": ("bandwidth, GB/s", "пропускная способность, ГБ/с"),
    "ring_over_builtin": ("ring / builtin: alpha {alpha:.2}×, bandwidth {bandwidth:.2}×",
                          "кольцо / встроенная: alpha {alpha:.2}×, пропускная способность {bandwidth:.2}×"),
    "impl_fit": ("{impl} (fit)", "{impl} (модель)"),
    "fit_title": ("All-reduce at 2 ranks: fastest times (dots) and the fitted alpha-beta line",
                  "AllReduce на 2 рангах: лучшие времена (точки) и прямая alpha-beta"),
}

# --- lesson 03 ---------------------------------------------------------------------------------------
LESSON_03 = {
    "slices_average_to_full_batch": (
        "{n} gradient tensors; mean of the slices' gradients = full-batch gradient (to float rounding):"
        " {same}",
        "{n} {n:тензор|тензора|тензоров} градиентов; среднее градиентов частей = градиент всего батча"
        " (с точностью до округления): {same}"),
    "naive_calls": (
        "{calls} AllReduce calls per step for {tensors} parameter tensors, {nbytes} bytes in all",
        "{calls} {calls:вызов|вызова|вызовов} AllReduce за шаг на {tensors} {tensors:тензор|тензора|тензоров}"
        " параметров, всего {nbytes} {nbytes:байт|байта|байт}"),
    "naive_small_calls": ("{small} of them are smaller than 1 kB; the largest is {largest} bytes",
                          "{small} из них меньше 1 кБ; самый большой — {largest} {largest:байт|байта|байт}"),
    "averaged_is_full_batch": ("the averaged gradient is the full-batch gradient: {same}",
                               "усреднённый градиент равен градиенту всего батча: {same}"),
    "gpt2_gradients": (
        "GPT-2 small: {millions:.0}M parameters, {nbytes:size} of gradients in {tensors} tensors",
        "GPT-2 small: {millions:.0} млн параметров, {nbytes:size} градиентов"
        " в {tensors} {tensors:тензоре|тензорах|тензорах}"),
    "all_reduce_scheme": ("AllReduce", "AllReduce"),
    "one_per_tensor": ("one per tensor", "один на тензор"),
    "one_per_bucket": ("one per bucket", "один на бакет"),
    "all_reduce_ms": ("time, ms", "время, мс"),
    "bandwidth_ms": ("of it bytes / bandwidth, ms", "из них байты / пропускная способность, мс"),
    "bucket": ("bucket", "бакет"),
    "tensors": ("tensors", "тензоров"),
    "first_tensor": ("first tensor", "первый тензор"),
    "last_tensor": ("last tensor", "последний тензор"),
    "bucket_cap_bytes": (
        "{nbytes} bytes of parameters; the cap is {cap} bytes",
        "{nbytes} {nbytes:байт|байта|байт} параметров; предел — {cap} {cap:байт|байта|байт}"),
    "bucket_layout_title": ("DDP buckets of the course GPT, bucket_cap_mb={cap!s}",
                            "Бакеты DDP для GPT курса, bucket_cap_mb={cap!s}"),
    "cap_extremes": (
        "bucket_cap_mb=1e-9: {tiny} {tiny:bucket|buckets|buckets}; bucket_cap_mb=1e6: {huge}"
        " {huge:bucket|buckets|buckets}",
        "bucket_cap_mb=1e-9: {tiny} {tiny:бакет|бакета|бакетов}; bucket_cap_mb=1e6: {huge}"
        " {huge:бакет|бакета|бакетов}"),
    "issue_order": ("AllReduces in the order they were issued, buckets: {buckets}",
                    "AllReduce в порядке запуска, бакеты: {buckets}"),
    "issued_ms": ("issued at, ms", "запущен, мс"),
    "waited_ms": ("waited for until, ms", "дождались к, мс"),
    "backward_returned": ("loss.backward() returned after {ms:.1} ms",
                          "loss.backward() вернулся через {ms:.1} мс"),
    "window_after_last_gradient": (
        "of the communication window (first start to last end), after the last gradient: {share:.0%}",
        "доля окна обмена данными (от первого запуска до последнего завершения) после последнего"
        " градиента: {share:.0%}"),
    "one_backward_title": ("One backward on 4 ranks (rank 0)", "Один backward на 4 рангах (ранг 0)"),
    "setup": ("setup", "конфигурация"),
    "equals_one_process": ("= one process (rtol 1e-5)", "= один процесс (rtol 1e-5)"),
    "our_ddp": ("our DDP", "наш DDP"),
    "pytorch_ddp": ("PyTorch's DDP", "DDP из PyTorch"),
    "same_weights_after_steps": (
        "weights after {steps} steps: every rank, both DDPs = one process: {same}",
        "веса после {steps} {steps:шага|шагов|шагов}: каждый ранг, оба DDP = один процесс: {same}"),
}

# --- lesson 04 ---------------------------------------------------------------------------------------
LESSON_04 = {
    "stage": ("stage", "стадия"),
    "sharded": ("sharded", "шардировано"),
    "params_in_fp32": ("{n} parameters = {nbytes} bytes in fp32",
                       "{n} {n:параметр|параметра|параметров} = {nbytes} {nbytes:байт|байта|байт} в fp32"),
    "first_loss": ("loss, first step", "лосс, первый шаг"),
    "last_loss": ("loss, last step", "лосс, последний шаг"),
    "bytes_after_backward": ("bytes of model states on each rank, after backward:",
                             "байты состояний модели на каждом ранге после backward:"),
    "ddp_world_bytes": (
        "per rank {per_rank} bytes; all {world} ranks together {together}, of them distinct {per_rank}",
        "на ранг {per_rank} {per_rank:байт|байта|байт}; все {world} {world:ранг|ранга|рангов} вместе —"
        " {together}, из них различных {per_rank}"),
    "losses_within": ("losses within 1e-5", "лоссы в пределах 1e-5"),
    "weights_within": ("weights within 1e-5", "веса в пределах 1e-5"),
    "ranks_bitwise_equal": ("ranks bitwise equal", "ранги побитово равны"),
    "estimate": ("estimate", "оценка"),
    "shard_and_ratio": (
        "shard: {shard} elements per rank, {padding} of them padding; DDP's optimizer state / ZeRO-1's"
        " = {ratio:.3}",
        "шард: {shard} {shard:элемент|элемента|элементов} на ранг, из них {padding} — паддинг; состояние"
        " оптимизатора DDP / ZeRO-1 = {ratio:.3}"),
    "kB": ("kB", "кБ"),
    "small_gpt_memory_title": ("Small GPT, 4 ranks, fp32 AdamW (measured)",
                               "Маленький GPT, 4 ранга, AdamW в fp32 (измерено)"),
    "total": ("total per rank", "всего на ранг"),
    "zero_paper_memory_title": ("ZeRO paper: 7.5B parameters, 64 ranks (estimate)",
                                "Статья ZeRO: 7,5 млрд параметров, 64 ранга (оценка)"),
    "order": ("order", "порядок"),
    "step_bytes_title": ("Bytes one rank sends in one step, world 4",
                         "Байты, которые ранг отправляет за шаг, 4 ранга"),
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
    "grid_rows_and_cols": ("shard groups (rows):   {rows!r}\nreplica groups (cols): {cols!r}",
                           "группы шардирования (строки): {rows!r}\nгруппы реплик (столбцы):      {cols!r}"),
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
    "nbytes": ("S, B", "S, Б"),
    "unit_sizes": ("parameters per unit: {params}; padded bytes per unit: {padded}",
                   "параметров в юните: {params}; байт с паддингом в юните: {padded}"),
    "losses_one_process": ("losses, 1 process:    {losses:.4}", "лоссы, 1 процесс:     {losses:.4}"),
    "losses_hybrid_shard": ("losses, HYBRID_SHARD: {losses:.4}", "лоссы, HYBRID_SHARD:  {losses:.4}"),
    "parity_within_1e_5": ("max |loss diff| < 1e-5 and max |weight diff| < 1e-5: {holds}",
                           "max |разница лоссов| < 1e-5 и max |разница весов| < 1e-5: {holds}"),
    "sent_over_nvlink": ("sent over NVLink", "отправлено по NVLink"),
    "sent_per_card": ("sent per network card", "отправлено через сетевую карту"),
    "total_per_rank": ("total per rank", "всего на ранг"),
    "memory_7b_title": ("7B parameters, mixed-precision Adam, 8 nodes x 8 GPUs",
                        "7 млрд параметров, Adam со смешанной точностью, 8 узлов × 8 GPU"),
    "seconds_card_per_gpu": ("s per step, a card per GPU", "с на шаг, карта на GPU"),
    "seconds_card_per_node": ("s per step, a card per node", "с на шаг, карта на узел"),
    "card_per_gpu": ("a card per GPU", "карта на GPU"),
    "card_per_node": ("a card per node", "карта на узел"),
    "step_comm_7b_title": ("7B, 8 nodes x 8 GPUs: one training step, per rank",
                           "7 млрд, 8 узлов × 8 GPU: один шаг обучения, на ранг"),
    "hybrid_per_card": (
        "under HYBRID_SHARD a network card carries {ddp:.2f}x DDP's bytes and {full:.2f}x FULL_SHARD's",
        "при HYBRID_SHARD сетевая карта везёт {ddp:.2f} от байтов DDP и {full:.2f} от байтов FULL_SHARD"),
    "hybrid_speedup": (
        "HYBRID_SHARD is {rich:.1f}x faster than FULL_SHARD with a card per GPU, {thin:.1f}x with a card per node",
        "HYBRID_SHARD быстрее FULL_SHARD в {rich:.1f} раза с картой на GPU и в {thin:.1f} раза с картой на узел"),
    "holds": ("holds", "верно"),
    "rule": ("rule of thumb", "правило"),
    "rule_7b_ddp_does_not_fit": ("7B: DDP does not fit", "7 млрд: DDP не помещается"),
    "rule_7b_node_copy_fits": ("7B: one copy per node fits, with room for activations",
                               "7 млрд: копия на узел помещается, есть место для активаций"),
    "rule_7b_hybrid_is_fastest_that_fits": ("7B: HYBRID_SHARD is the fastest that fits, on both networks",
                                            "7 млрд: HYBRID_SHARD быстрее всех, кто помещается, в обеих сетях"),
    "rule_thin_below_a_node_is_worse": ("a card per node: shard groups smaller than a node, slower and bigger",
                                        "карта на узел: группы меньше узла медленнее и больше"),
    "rule_rich_two_node_groups_cost_no_more": ("a card per GPU: a shard group of two nodes costs no more than one",
                                               "карта на GPU: группа из двух узлов обходится не дороже одного"),
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
    "run": ("run", "обучение"),
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
    "flat_design": ("flat (FSDP)", "плоский (FSDP)"),
    "per_parameter_design": ("per-parameter (fully_shard)", "по параметрам (fully_shard)"),
    "training_run": ("run", "запуск"),
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
    "flat_short": ("flat", "плоский"),
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
    # where FSDP alone stops scaling
    "one_block_and_batch": ("one block of {model}: {n} parameters; global batch {tokens} tokens",
                            "один блок {model}: {n} {n:параметр|параметра|параметров}; глобальный батч "
                            "{tokens} {tokens:токен|токена|токенов}"),
    "tokens_each_gpu_gets": ("tokens/GPU", "токенов/GPU"),
    "tokens_to_hide_gather": ("to hide", "порог"),
    "unit_forward_ms": ("forward, ms", "forward, мс"),
    "unit_all_gather_ms": ("AllGather, ms", "AllGather, мс"),
    "tp_forward_ms": ("TP collectives, ms", "коллективные операции TP, мс"),
    "why_the_crossing": ("why: one block of {model} (one micro-batch, full recomputation)",
                         "почему: один блок {model} (один микробатч, полный пересчёт)"),
    "ring_latency_ms": ("latency, ms", "задержка, мс"),
    "ring_bytes_ms": ("bytes, ms", "байты, мс"),
    "gather_hides": ("hides", "скрыт"),
    "fsdp_stops_hiding": ("the ring's latency outweighs its bytes from {latency} GPUs; the AllGather stops hiding at "
                          "{gpus} GPUs; from {split} GPUs a GPU holds less than one sequence of {seq} tokens",
                          "задержка кольца перевешивает его байты начиная с {latency} GPU; AllGather перестаёт "
                          "скрываться за вычислениями на {gpus} GPU; с {split} GPU каждой GPU достаётся меньше "
                          "одной последовательности из {seq} токенов"),
    "ring_one_node": ("one node, 8 ranks", "один узел, 8 рангов"),
    "ring_two_nodes": ("two nodes, all 16 ranks", "два узла, все 16 рангов"),
    "ring_eight_nodes": ("8 nodes, all 64 ranks", "8 узлов, все 64 ранга"),
    "ring_one_rank_per_node": ("8 nodes, one rank on each", "8 узлов, по одному рангу на узле"),
    "cards_per_node": ("cards per node", "карт на узел"),
    "one_card_per_ring": ("the two-node ring if each crossing went through one card: {ms:.2f} ms",
                          "кольцо на двух узлах, если бы каждый переход шёл через одну карту: {ms:.2f} мс"),
    "fsdp_scaling_title": ("FULL_SHARD of one Llama-2-70B block, 4M tokens per step",
                           "FULL_SHARD одного блока Llama-2-70B, 4 млн токенов на шаг"),
    "planner_asked": ("planner, {gpu}, sequences of {seq} tokens, micro-batches {micro_batches}, "
                      "activation checkpointing {ac}:",
                      "планировщик, {gpu}, последовательности по {seq} {seq:токену|токена|токенов}, "
                      "микробатчей {micro_batches}, "
                      "чекпоинтинг активаций {ac}:"),
    # tensor parallelism by hand, attention
    "partial_equals_whole": ("rank 0's partial output equals the whole: {equal}",
                             "частичный выход ранга 0 равен целому: {equal}"),
    "sum_equals_whole": ("the sum of the two partial outputs equals it: {equal}",
                         "сумма двух частичных выходов равна ему: {equal}"),
    "qkv_cut": ("cut", "разбиение"),
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
    "block_0_in_order": ("block 0's collectives in the order CommLog saw them (forward, then backward):",
                         "коллективные операции блока 0 в том порядке, в каком их увидел CommLog (forward, затем"
                         " backward):"),
    "collective_op": ("collective", "операция"),
    "layer_name": ("layer", "слой"),
    "collective_calls": ("calls", "вызовов"),
    "message_bytes": ("S, bytes", "S, байт"),
    "bytes_sent": ("sent", "отправлено"),
    "tp_in_blocks": ("TP, in the blocks", "TP, в блоках"),
    "sp_in_blocks": ("TP + SP, in the blocks", "TP + SP, в блоках"),
    "sp_at_the_ends": ("TP + SP, at the model's ends", "TP + SP, на концах модели"),
    "sp_replicated_gradients": ("TP + SP, replicated weights' gradients",
                                "TP + SP, градиенты реплицированных весов"),
    "kept_for_backward_per_rank": ("kept for backward per rank:", "сохранено для backward на ранг:"),
    "kept_and_sent_per_rank": ("one step per rank: bytes sent, and kept for backward",
                               "один шаг на ранг: отправлено байтов и сохранено для backward"),
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
    "network_per_step": ("network card per step", "сетевая карта за шаг"),
    "planner_assumptions": ("planner: GPU {gpu}; sequences of {seq} tokens, {sequences} a step; local batch = "
                            "sequences / data-parallel ranks; micro-batches {micro_batches}; activation "
                            "checkpointing {ac}",
                            "планировщик: GPU {gpu}; последовательности по {seq} {seq:токену|токена|токенов}, "
                            "{sequences} за шаг; "
                            "локальный батч = последовательности / ранги по данным; микробатчей "
                            "{micro_batches}; чекпоинтинг активаций {ac}"),
    "parallel_layout": ("plan", "раскладка"),
    "peak_gib_per_gpu": ("GiB/GPU", "ГиБ/GPU"),
    "step_seconds": ("step, s", "шаг, с"),
    "fits_in_memory": ("fits", "помещается"),
    "memory_verdict": ("verdict", "вердикт"),
    "verdict_fits": ("fits", "помещается"),
    "verdict_undecided": ("undecided", "неясно"),
    "verdict_does_not_fit": ("does not fit", "не помещается"),
    "published_peak": ("torchtitan measured this configuration at {published:.1} GiB (table 1 of its H100 benchmark,"
                       " 96 GB cards); the planner counts {count:.1} GiB, and the measured errors of its memory put"
                       " the peak at {low:.1}–{high:.1} GiB against the H100's {capacity:.0}: {verdict}",
                       "torchtitan измерил эту конфигурацию: {published:.1} ГиБ (таблица 1 его замеров на H100,"
                       " карты по 96 ГБ); по расчёту планировщика {count:.1} ГиБ, а с учётом погрешности оценки"
                       " памяти пик лежит в пределах {low:.1}–{high:.1} ГиБ при {capacity:.0} ГиБ у H100: {verdict}"),
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
    "micro_batches_there": ("micro-batches there", "микробатчей при этом"),
    "crossing_searched": ("{model}, the micro-batches chosen (for each layout and cluster the fastest that fits even "
                          "at the top of the memory error, with or without a gradient sync per micro-batch and TP's "
                          "backward overlap):",
                          "{model}, микробатчи выбраны (для каждой раскладки и кластера — самый быстрый вариант из тех, "
                          "что помещаются даже с верхней погрешностью оценки памяти, с синхронизацией градиентов на "
                          "каждом микробатче или без неё и с перекрытием backward TP или без него):"),
    "tp_wins_from_gpus": ("TP from", "TP с"),
    "one_sequence_no_recomputation": ("one sequence per micro-batch, no recomputation, 512 GPUs:",
                                      "одна последовательность на микробатч, без пересчёта, 512 GPU:"),
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
    "ac_column": ("mode", "режим"),
    "block_activations_gib": ("activations of the blocks, GiB", "активации блоков, ГиБ"),
    "recomputation_share": ("recomputation, share of the step", "пересчёт, доля шага"),
    "llama8_modes_title": ("Llama-3-8B on 8 H100s: the four checkpointing modes",
                           "Llama-3-8B на 8 H100: четыре режима чекпоинтинга"),
    "matmul_widths": ("matrix products in forward order (output width per token):",
                      "матричные произведения в порядке forward (ширина выхода на токен):"),
    "course_gpt": ("the course's GPT", "GPT курса"),
    "course_gpt_block": ("course GPT block", "блок GPT курса"),
    "gpt_block_shape": ("h={h}, {heads} {heads:head|heads|heads}, {tokens} tokens",
                        "h={h}, {heads} {heads:голова|головы|голов}, {tokens} {tokens:токен|токена|токенов}"),
    "measured_b": ("measured, B", "измерено, Б"),
    "planner_bytes": ("planner, B", "планировщик, Б"),
    "block_activations_by_variant": ("no checkpointing, activations of the blocks by SP variant:",
                                     "без чекпоинтинга, активации блоков по вариантам SP:"),
    "llama70_on_256": ("Llama-3-70B on 256 H100s (32 nodes), 256 sequences of 8,192 tokens per step",
                       "Llama-3-70B на 256 H100 (32 узла), 256 последовательностей по 8\u202f192 токена за шаг"),
    "fitting_layouts": ("\nlayouts of these GPUs and this batch that fit: {n}; the fastest: {layout}, AC {ac}",
                        "\nраскладок этих GPU с этим батчем, которые помещаются: {n}; самая быстрая: {layout},"
                        " чекпоинтинг {ac}"),
    "tp8_slower": ("TP 8 + SP with full AC, nothing overlapped, trains {slower:.0%} slower; its TP collectives take"
                   " {exposed:.0%} of its step",
                   "TP 8 + SP с полным чекпоинтингом и без перекрытия обучает на {slower:.0%} медленнее; его"
                   " коллективные операции TP занимают {exposed:.0%} шага"),
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
    "search_space": ("searched: {n} layouts (HSDP replicas {replicas}; TP {tp}, with and without SP, with and"
                     " without its backward overlap; CP {cp}; {modes} checkpointing modes; micro-batches {micro},"
                     " with and without a gradient sync on each): {verdicts[fits]} fit,"
                     " {verdicts[undecided]} undecided, {verdicts[does not fit]} do not fit",
                     "в переборе {n} {n:раскладка|раскладки|раскладок} (реплик HSDP {replicas}; TP {tp}, с SP и"
                     " без, с перекрытием backward и без; CP {cp};"
                     " {modes} режима чекпоинтинга; микробатчей {micro}, с синхронизацией градиентов на каждом и"
                     " без): помещаются {verdicts[fits]},"
                     " неясно — {verdicts[undecided]}, не помещаются {verdicts[does not fit]}"),
    "micro_batches_of_step": ("{m} {m:micro-batch|micro-batches|micro-batches}",
                          "{m} {m:микробатч|микробатча|микробатчей}"),
    "micro_batches_win": ("fastest: {m} micro-batches of {per} {per:sequence|sequences|sequences} each, AC {ac},"
                          " {faster:.0%} faster than the fastest with one micro-batch per step ({plain_ac} AC)",
                          "самая быстрая: {m} {m:микробатч|микробатча|микробатчей} по {per}"
                          " {per:последовательности|последовательности|последовательностей}, чекпоинтинг {ac};"
                          " она на {faster:.0%} быстрее самой быстрой раскладки с одним микробатчем за шаг"
                          " (чекпоинтинг {plain_ac})"),
    "fitted_on": ("fitted on", "в подборе"),
    "fitted_yes": ("yes", "да"),
    "fitted_no": ("no", "нет"),
    "published_rate": ("published", "опубликовано"),
    "planner_rate": ("planner", "планировщик"),
    "planner_error": ("error", "ошибка"),
    "published_gib": ("published GiB", "опубликовано, ГиБ"),
    "planner_gib": ("planner GiB", "планировщик, ГиБ"),
    "memory_error": ("memory error", "ошибка по памяти"),
    "validation_summary": ("fitted rows: largest error {largest:.1%} (the test allows {tolerance:.0%}); the {held_out}"
                           " rows it was not fitted on: tokens/s {low:+.0}% to {high:+.0}% with CP up to 2, {cp_low:+.0}%"
                           " and {cp_high:+.0}% with CP 4 and 8 (too fast on {too_fast} of {held_out}); memory short on"
                           " all {memory_rows} rows that publish it, by {memory_low:.1}–{memory_high:.1}%",
                           "строки подбора: наибольшая ошибка {largest:.1%} (тест допускает {tolerance:.0%});"
                           " на {held_out} строках вне подбора скорость отличается от опубликованной на"
                           " {low:+.0}…{high:+.0}\u00a0% при CP не больше 2 и на {cp_low:+.0} и {cp_high:+.0}\u00a0% при CP 4"
                           " и 8 (завышена в {too_fast} из {held_out}); память во всех {memory_rows} строках, где она"
                           " опубликована, недосчитана на {memory_low:.1}–{memory_high:.1}\u00a0%"),
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
