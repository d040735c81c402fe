"""Measure the hand-written ring collectives against torch's builtins, side by side in one run.

An nccl-tests-style table: for every size, each (op, impl) pair runs interleaved with the others, several
times, after a barrier; an iteration's time is the slowest rank's, and the table shows the median.
algbw = S / time; busbw = algbw x bus factor (2(n-1)/n for all-reduce, (n-1)/n for reduce-scatter and
all-gather), the number comparable with a link's bandwidth whatever n is.

The worker runs under `launch` or, unchanged, under `torchrun` (`python -m fsdp_mini bench-collectives`).
"""
from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.distributed as dist

from fsdp_mini import collectives as C
from fsdp_mini.course.cost import algbw, busbw
from fsdp_mini.course.language import num, tr

OPS = ("all_reduce", "reduce_scatter", "all_gather")
_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def parse_size(text: str) -> int:
    """"64M" -> 67108864 bytes (binary units K, M, G; a bare number is bytes)."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1] if t and t[-1] in _UNITS else ""
    try:
        value = float(t[: len(t) - len(unit)])
    except ValueError:
        raise ValueError(f"cannot read size {text!r}: use e.g. 4K, 1M, 64M") from None
    if value <= 0:
        raise ValueError(f"size must be positive, got {text!r}")
    return int(value * _UNITS[unit])


def format_size(nbytes: int) -> str:
    for unit in ("G", "M", "K"):
        if nbytes >= _UNITS[unit] and nbytes % _UNITS[unit] == 0:
            return f"{nbytes // _UNITS[unit]}{unit}"
    return f"{nbytes}B"


def _case(op: str, impl: str, numel: int, n: int):
    """Buffers and a zero-argument callable running one collective of S = numel fp32 elements."""
    if op == "all_reduce":
        t = torch.ones(numel)
        return lambda: C.all_reduce(t, impl=impl)
    big, small = torch.ones(numel), torch.empty(numel // n)
    if op == "reduce_scatter":
        return lambda: C.reduce_scatter_tensor(small, big, impl=impl)
    return lambda: C.all_gather_into_tensor(big, small, impl=impl)


def _progress(done: int, total: int, what: str) -> None:
    end = "" if sys.stderr.isatty() else "\n"
    sys.stderr.write(f"\r[{done:>3}/{total}] {what:<40}{end}")
    sys.stderr.flush()


def worker(sizes: list[int], iters: int, warmup: int, ops=OPS, impls=C.IMPLS, progress: bool = True) -> list[dict]:
    """Run on every rank; returns one row per (size, op, impl), the same on every rank."""
    n, rank = dist.get_world_size(), dist.get_rank()
    rows, total = [], len(sizes) * len(ops) * len(impls)
    for size in sizes:
        numel = max(n, size // 4 // n * n)  # fp32; a multiple of n so that S splits into equal chunks
        cases = {(op, impl): _case(op, impl, numel, n) for op in ops for impl in impls}
        times = {key: [] for key in cases}
        for it in range(warmup + iters):
            for key, run in cases.items():  # interleaved: machine noise hits every case alike
                dist.barrier()
                t0 = time.perf_counter()
                run()
                elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
                if it >= warmup:
                    times[key].append(elapsed.item())
        for (op, impl), ts in times.items():
            med, nbytes = statistics.median(ts), numel * 4
            rows.append({"size": nbytes, "op": op, "impl": impl, "world_size": n, "seconds": med,
                         "algbw": algbw(nbytes, med), "busbw": busbw(op, nbytes, n, med), "times": ts})
            if progress and rank == 0:
                _progress(len(rows), total, f"{format_size(nbytes)} {op} {impl}")
    if progress and rank == 0:
        sys.stderr.write("\n")
    return rows


def table(rows: list[dict]) -> str:
    """The nccl-tests-like table, plus ring/builtin busbw ratios for each op and size."""
    lines = [f"{tr('size', 'размер'):>8} {'op':<15}{'impl':<9}{tr('time (ms)', 'время (мс)'):>11}"
             f"{tr('algbw GB/s', 'algbw ГБ/с'):>12}{tr('busbw GB/s', 'busbw ГБ/с'):>12}"]
    for r in rows:
        lines.append(f"{format_size(r['size']):>8} {r['op']:<15}{r['impl']:<9}{num(r['seconds'] * 1e3, 3):>11}"
                     f"{num(r['algbw'] / 1e9, 3):>12}{num(r['busbw'] / 1e9, 3):>12}")
    by_key = {(r["size"], r["op"], r["impl"]): r for r in rows}
    ratios = [f"{format_size(s)} {op}: ring/builtin busbw = {num(by_key[s, op, 'ring']['busbw'] / b['busbw'], 2)}x"
              for (s, op, impl), b in by_key.items() if impl == "builtin" and (s, op, "ring") in by_key
              and b["busbw"] > 0]
    return "\n".join(lines + ([""] + ratios if ratios else []))
