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
