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
    "calls": ("calls", "вызовов"),
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
    "losses": ("losses per step", "лоссы по шагам"),
    "equals_one_process": ("= one process (rtol 1e-5)", "= один процесс (rtol 1e-5)"),
    "one_process": ("one process", "один процесс"),
    "our_ddp": ("our DDP", "наш DDP"),
    "pytorch_ddp": ("PyTorch's DDP", "DDP из PyTorch"),
    "same_weights_after_steps": (
        "weights after {steps} steps: every rank, both DDPs = one process: {same}",
        "веса после {steps} {steps:шага|шагов|шагов}: каждый ранг, оба DDP = один процесс: {same}"),
}

# --- lesson 04 ---------------------------------------------------------------------------------------
LESSON_04 = {
    "stage": ("stage", "стадия"),
    "strategy": ("strategy", "стратегия"),
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
    "sent": ("sent, B", "отправлено, Б"),
    "order": ("order", "порядок"),
    "step_bytes_title": ("Bytes one rank sends in one step, world 4",
                         "Байты, которые ранг отправляет за шаг, 4 ранга"),
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
