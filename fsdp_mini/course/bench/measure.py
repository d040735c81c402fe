"""Measuring the cases of `python -m fsdp_mini bench`: memory and bytes (one case per launch), step times
(every case of a size in one launch, interleaved), and the collectives' own times for the simulator.

Memory, one case at a time (a fresh launch per case, so its RSS is its own): after warm-up steps, one
profiled step records per rank the model-state bytes kept between steps (local shards of parameters,
gradients, optimizer state), the peak allocated bytes during the step (torch.profiler's CPU memory events
on top of the bytes alive when the step starts), the peak RSS growth of the process, fsdp_mini's count
of gathered (unsharded) parameter bytes at their peak, and the bytes communicated per step: CommLog for
fsdp_mini, a dispatch mode that sees every c10d collective for PyTorch DDP and FSDP2 (both with the ring
model's bytes per rank).

Time: every case of one size in one launch, interleaved (case after case, several rounds, the order
rotated each round) so machine noise hits them alike; a step is forward + backward + optimizer step +
zero_grad, timed after a barrier, and its time is the slowest rank's. The same launch calibrates the
collectives for `fsdp_mini.course.simulate` (bench-collectives' rows, for the whole world and for the
groups of two that the hybrid strategy uses).

The worker functions run under `launch` or, unchanged, under `torchrun` (then the memory phase runs
in-process, case after case, and its RSS numbers include the earlier cases' freed memory).
"""
from __future__ import annotations

import gc
import os
import statistics
import sys
import time
from contextlib import contextmanager

import torch
import torch.distributed as dist

from fsdp_mini import collectives as C
from fsdp_mini.comm_log import CommLog
from fsdp_mini.course.bench.cases import SIZES, build, local_batch, make_optimizer, parse_case, step
from fsdp_mini.course.cost import algbw, busbw
from fsdp_mini.course.models import GPT, make_batch
from fsdp_mini.fsdp._fully_shard.fully_shard import gathered_memory
from fsdp_mini.fsdp.groups import grid
from fsdp_mini.run import launch
from fsdp_mini.memory import optimizer_state_bytes, tensor_bytes
from fsdp_mini.ring_model import ring_model_sent
from fsdp_mini.runtime import init, under_torchrun

__all__ = ["PHASES", "memory_worker", "time_worker", "timed_step", "calibrate", "bench_worker", "run",
           "environment"]

# --- memory and bytes ---------------------------------------------------------------------------------

def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak_rss() -> bool:
    try:  # Linux >= 4.0: writing 5 resets VmHWM to the current RSS
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class _CollectiveBytes:
    """Counts every c10d collective dispatched in this thread (what PyTorch's DDP and FSDP2 issue),
    with the ring model's bytes per rank (the model CommLog applies to fsdp_mini's builtin calls)."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                counter._see(str(func.overloadpacket), args)
                return func(*args, **(kwargs or {}))

        self.mode, self.calls, self.sent = Mode(), 0, 0

    @staticmethod
    def _group_size(args) -> int:
        from torch._C._distributed_c10d import ProcessGroup

        for a in args:
            if isinstance(a, torch.ScriptObject):
                try:
                    return ProcessGroup.unbox(a).size()
                except Exception:  # noqa: BLE001 - not a process group
                    continue
        return dist.get_world_size()

    def _see(self, name: str, args) -> None:
        if not name.startswith("c10d."):
            return
        op = name.removeprefix("c10d.").rstrip("_")
        flat = [t for a in args for t in (a if isinstance(a, (list, tuple)) else [a])
                if isinstance(t, torch.Tensor)]
        n = self._group_size(args)
        if op in ("allreduce", "allreduce_coalesced"):
            kind, tensors = "all_reduce", flat
        elif op in ("_allgather_base", "allgather_into_tensor_coalesced"):
            kind, tensors = "all_gather", flat[: max(1, len(flat) // 2)]  # outputs come first
        elif op in ("_reduce_scatter_base", "reduce_scatter_tensor_coalesced"):
            kind, tensors = "reduce_scatter", flat[len(flat) // 2:]  # inputs come second
        elif op == "broadcast":
            self.calls += 1
            self.sent += sum(t.numel() * t.element_size() for t in flat)
            return
        else:
            return
        self.calls += 1
        self.sent += sum(ring_model_sent(kind, t.numel(), t.element_size(), n) for t in tensors)

    def __enter__(self):
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)


@contextmanager
def _quiet_stderr():
    """Silence file descriptor 2 (the profiler's C++ start/stop lines); exceptions still propagate."""
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def _profiled_peak(fn) -> int:
    """Peak of (bytes allocated - bytes freed) while `fn()` runs, from torch.profiler's memory events."""
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]")
    current = peak = 0
    for _, nbytes in events:
        current += nbytes
        peak = max(peak, current)
    return peak


def _max_over_ranks(values: dict[str, int]) -> dict[str, int]:
    t = torch.tensor([float(v) for v in values.values()], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return {k: int(v) for k, v in zip(values, t.tolist())}


def _warm_process() -> None:
    """One step of a throwaway model, so that what a process allocates once (autograd's threads, the
    optimizer's lazy imports, allocator arenas) is not charged to the first case measured."""
    cfg = SIZES["tiny"][0]
    model = GPT(cfg)
    opt = make_optimizer(model.parameters())
    step(model, opt, *make_batch(cfg, 2, 0))
    del model, opt
    gc.collect()


def memory_worker(size: str, case_key: str, warmup: int = 2) -> dict:
    """One case on every rank: its memory and its bytes per step (max over ranks), and for fsdp_mini the
    collectives of one step (rank 0's CommLog records) and its units' gathered bytes."""
    case, (cfg, batch) = parse_case(case_key), SIZES[size]
    _warm_process()
    rss_before = _status_kib("VmRSS")
    model, opt = build(case, cfg)
    for s in range(warmup):
        step(model, opt, *local_batch(cfg, batch, s))
    # RSS: a plain step (the profiler's own buffers would count otherwise), peak since the reset.
    dist.barrier()
    _reset_peak_rss()
    step(model, opt, *local_batch(cfg, batch, warmup))
    rss_peak = max(0, _status_kib("VmHWM") - rss_before)
    x, y = local_batch(cfg, batch, warmup + 1)
    tracker = model.gathered_memory if case.engine == "fsdp_mini" else (
        gathered_memory(model) if case.engine == "fully_shard" else None)
    if tracker is not None:
        tracker.reset_peak()
    at_start = tensor_bytes(model.parameters()) + optimizer_state_bytes(opt)
    state = {}

    def one_step():
        model(x, y).backward()
        state["params"] = tensor_bytes(model.parameters())
        state["grads"] = tensor_bytes(p.grad for p in model.parameters())
        opt.step()
        state["optimizer"] = optimizer_state_bytes(opt)
        opt.zero_grad()

    dist.barrier()
    peak = at_start + _profiled_peak(one_step)
    out = dict(state, model_state=state["params"] + state["grads"] + state["optimizer"], peak_alloc=peak,
               rss_peak=rss_peak)
    records, units = [], []
    following = local_batch(cfg, batch, warmup + 2)
    if case.engine in ("fsdp_mini", "fully_shard"):
        out["unsharded_peak"] = tracker.peak
        if case.engine == "fsdp_mini":
            units = [sum(h.nbytes for h in u.handles) for u in model.units]
        with CommLog() as log:
            step(model, opt, *following)
        records = [(r.op, r.impl, r.nbytes, r.group_size, r.sent) for r in log.records]
        out["sent"], out["calls"] = log.sent, len(log.records)
    elif case.engine != "compute":
        counter = _CollectiveBytes()
        with counter:
            step(model, opt, *following)
        out["sent"], out["calls"] = counter.sent, counter.calls
    else:
        out["sent"], out["calls"] = 0, 0
    out = _max_over_ranks(out)
    out.update(records=records, units=units)
    del model, opt
    gc.collect()
    return out


# --- time -----------------------------------------------------------------------------------------------

def _progress(done: int, total: int, what: str) -> None:
    end = "" if sys.stderr.isatty() else "\n"
    sys.stderr.write(f"\r[{done:>3}/{total}] {what:<60}{end}")
    sys.stderr.flush()


def _timed(fn) -> float:
    """fn's seconds on the slowest rank, all ranks starting together."""
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return elapsed.item()


def timed_step(model, opt, x, y) -> tuple[float, float, float, float]:
    """One training step after a barrier: (step, forward, backward, optimizer step + zero_grad) seconds,
    each the slowest rank's."""
    dist.barrier()
    t0 = time.perf_counter()
    loss = model(x, y)
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    opt.step()
    opt.zero_grad()
    t3 = time.perf_counter()
    t = torch.tensor([t3 - t0, t1 - t0, t2 - t1, t3 - t2], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return tuple(t.tolist())


PHASES = ("step", "forward", "backward", "optimizer")


def time_worker(size: str, case_keys: list[str], reps: int, steps: int, warmup: int = 2,
                progress: bool = True) -> dict[str, dict[str, list[float]]]:
    """Every case of one size, interleaved: `reps` rounds of `steps` timed steps each, the order of the
    cases rotated every round. Returns each case's times per phase (`PHASES`, slowest rank), the same
    on every rank."""
    (cfg, batch), rank = SIZES[size], dist.get_rank()
    cases = [parse_case(k) for k in case_keys]
    built = {c.key: build(c, cfg) for c in cases}
    for s in range(warmup):  # the first step records fsdp_mini's prefetch order; imports, page faults
        for c in cases:
            step(*built[c.key], *local_batch(cfg, batch, s))
    times = {c.key: {p: [] for p in PHASES} for c in cases}
    batches = [local_batch(cfg, batch, warmup + s) for s in range(steps)]
    total, done = reps * len(cases), 0
    for rep in range(reps):
        order = cases[rep % len(cases):] + cases[:rep % len(cases)]
        for c in order:
            model, opt = built[c.key]
            for x, y in batches:
                for p, t in zip(PHASES, timed_step(model, opt, x, y)):
                    times[c.key][p].append(t)
            done += 1
            if progress and rank == 0:
                _progress(done, total, f"{size} x{dist.get_world_size()}: {c.name}")
    del built
    gc.collect()
    return times


def calibrate(sizes: list[int], iters: int = 5, warmup: int = 1, impls=("builtin",)) -> list[dict]:
    """bench-collectives' rows for the collectives the strategies issue: over the whole world and, at
    world 4, over groups of two ranks running side by side (the hybrid strategy's shard and replica
    groups). `world_size` in a row is the group's size."""
    n = dist.get_world_size()
    groups = [(n, None)]
    if n >= 4 and n % 2 == 0:
        from fsdp_mini.fsdp.groups import grid

        rows, _ = grid(n, 2)
        pgs = [dist.new_group(r) for r in rows]  # collective: every rank creates every group
        groups.append((2, pgs[dist.get_rank() // 2]))
    out = []
    for size, pg in groups:
        for nbytes in sizes:
            numel = max(size, nbytes // 4 // size * size)
            cases = {}
            for op in ("all_reduce", "reduce_scatter", "all_gather"):
                for impl in impls:
                    big, small = torch.ones(numel), torch.empty(numel // size)
                    if op == "all_reduce":
                        cases[op, impl] = (lambda t=big, i=impl: C.all_reduce(t, group=pg, impl=i))
                    elif op == "reduce_scatter":
                        cases[op, impl] = (lambda o=small, t=big, i=impl: C.reduce_scatter_tensor(o, t, group=pg, impl=i))
                    else:
                        cases[op, impl] = (lambda o=big, t=small, i=impl: C.all_gather_into_tensor(o, t, group=pg, impl=i))
            times = {k: [] for k in cases}
            for it in range(warmup + iters):
                for k, fn in cases.items():
                    t = _timed(fn)
                    if it >= warmup:
                        times[k].append(t)
            for (op, impl), ts in times.items():
                med = statistics.median(ts)
                out.append({"size": numel * 4, "op": op, "impl": impl, "world_size": size, "seconds": med,
                            "algbw": algbw(numel * 4, med), "busbw": busbw(op, numel * 4, size, med), "times": ts})
    return out


def bench_worker(sizes: list[str], case_keys: list[str], reps: int, steps: int, warmup: int,
                 calibration_sizes: list[int], progress: bool = True, calibration_iters: int = 10,
                 calibration_impls: tuple[str, ...] = ("builtin",)) -> dict:
    """The time phase of one world size (every size), then the calibration of its collectives."""
    out = {"times": {}, "world_size": dist.get_world_size(), "threads": torch.get_num_threads()}
    for size in sizes:
        out["times"][size] = time_worker(size, case_keys, reps, steps, warmup, progress)
    if calibration_sizes:
        if progress and dist.get_rank() == 0:
            sys.stderr.write(f"\ncalibrating the collectives of world {dist.get_world_size()} ...")
        out["collectives"] = calibrate(calibration_sizes, iters=calibration_iters, impls=calibration_impls)
    if progress and dist.get_rank() == 0:
        sys.stderr.write("\n")
    return out


def environment() -> dict:
    return {"torch": torch.__version__, "cpus": os.cpu_count(), "omp_threads": os.environ.get("OMP_NUM_THREADS"),
            "load_before": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}


def _calibration_sizes(sizes: list[str], world: int) -> list[int]:
    """Powers of 4 from 4 KiB up to the first one at or above the largest unit's bytes (at least 1 MiB,
    so that the bandwidth term shows): the range the engine's calls span."""
    largest = max(4 * sum(p.numel() for p in GPT(SIZES[s][0]).blocks[0].parameters()) for s in sizes)
    out, size = [], 4096
    while size < max(largest, 2**20):
        out.append(size)
        size *= 4
    return out + [size]


def run(world_sizes: list[int], sizes: list[str], case_keys: list[str], reps: int, steps: int, warmup: int,
        timeout: float, calibrate_collectives: bool = True, progress: bool = True, calib_iters: int = 10) -> list[dict]:
    """Both phases for every world size; one result per (world size, size)."""

    def on(world, fn, args):
        if under_torchrun():
            init()
            return fn(*args)
        return launch(fn, world, args=args, timeout=timeout, capture_output=False)[0]

    results = []
    for world in world_sizes:
        memory = {size: {} for size in sizes}
        total, done = len(sizes) * len(case_keys), 0
        for size in sizes:
            for key in case_keys:
                memory[size][key] = on(world, memory_worker, (size, key, warmup))
                done += 1
                if progress and os.environ.get("RANK", "0") == "0":
                    _progress(done, total, f"memory {size} x{world}: {parse_case(key).name}")
        if progress and os.environ.get("RANK", "0") == "0":
            sys.stderr.write("\n")
        calib = _calibration_sizes(sizes, world) if calibrate_collectives else []
        impls = ("builtin", "ring") if any(parse_case(k).impl == "ring" for k in case_keys) else ("builtin",)
        timing = on(world, bench_worker, (sizes, case_keys, reps, steps, warmup, calib, progress, calib_iters, impls))
        for size in sizes:
            results.append({"world_size": world, "size": size, "threads": timing["threads"],
                            "times": timing["times"][size],
                            "memory": memory[size], "collectives": timing.get("collectives", [])})
    return results
