"""`python -m fsdp_mini bench`: fsdp_mini against PyTorch FSDP2 and DDP, side by side, in one run.

For each GPT size and world size, every *case* (an engine and a strategy) trains the same model on the
same global batch. Two phases:

1. memory, one case at a time (a fresh launch per case, so its RSS is its own): after warm-up steps,
   one profiled step records per-rank
     - model-state bytes kept between steps (parameters, gradients, optimizer state: local shards),
     - peak allocated bytes during the step (torch.profiler's CPU memory events on top of the bytes
       alive when the step starts: activations, gathered parameters, gradients, temporaries),
     - peak RSS growth of the process (VmHWM after the step minus VmRSS before building the model),
     - fsdp_mini's own count of gathered (unsharded) parameter bytes at their peak,
     - bytes communicated per step: CommLog for fsdp_mini, a dispatch mode that sees every c10d
       collective for PyTorch DDP and FSDP2 (both with the ring model's bytes per rank);
2. time, every case of one size in one launch, interleaved (case after case, several rounds, the order
   rotated each round) so machine noise hits them alike; a step is forward + backward + optimizer
   step + zero_grad, timed after a barrier, and its time is the slowest rank's. Medians are reported.
   The same launch calibrates the collectives for `fsdp_mini.simulate` (bench-collectives' rows, for
   the whole world and for the groups of two that the hybrid strategy uses).

The worker functions run under `launch` or, unchanged, under `torchrun` (then phase 1 runs in-process,
case after case, and its RSS numbers include the earlier cases' freed memory).
"""
from __future__ import annotations

import gc
import os
import statistics
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist

from fsdp_mini import collectives as C
from fsdp_mini.comm_log import CommLog, ring_model_sent
from fsdp_mini.cost import algbw, busbw
from fsdp_mini.memory import format_bytes
from fsdp_mini.models import GPT, Block, GPTConfig, make_batch
from fsdp_mini.language import LANGUAGES, set_language, tr
from fsdp_mini.launch import init, launch, under_torchrun
from fsdp_mini.train import local_rows

__all__ = ["SIZES", "CASES", "Case", "parse_cases", "memory_worker", "time_worker", "table", "targets", "plot",
           "model_numel"]

# The small GPT of the course at two sizes (and a tiny one for the smoke test). `batch` is global.
SIZES: dict[str, tuple[GPTConfig, int]] = {
    "tiny": (GPTConfig(n_layer=2), 8),
    "small": (GPTConfig(n_layer=4), 16),
    "medium": (GPTConfig(vocab_size=512, block_size=32, n_layer=4, n_head=4, n_embd=256), 8),
}


@dataclass(frozen=True)
class Case:
    """One contestant. `engine`: "fsdp_mini", "fsdp2" (fully_shard), "ddp" (torch's) or "compute" (the
    plain model on this rank's rows, no communication: the compute the simulator adds to the collectives)."""

    key: str
    engine: str
    strategy: str = ""
    prefetch: bool = True
    impl: str = "builtin"

    @property
    def name(self) -> str:
        if self.engine == "fsdp_mini":
            extra = ("" if self.prefetch else ", no prefetch") + ("" if self.impl == "builtin" else f", {self.impl}")
            return f"fsdp_mini {self.strategy}{extra}"
        return {"fsdp2": f"FSDP2 reshard={self.strategy == 'FULL_SHARD'}", "ddp": "PyTorch DDP",
                "compute": "compute only"}[self.engine]

    @property
    def twin(self) -> str | None:
        """The key of the PyTorch case this one is compared with (the peer a user would otherwise pick)."""
        if self.engine != "fsdp_mini":
            return None
        return {"NO_SHARD": "ddp", "SHARD_GRAD_OP": "fsdp2:noreshard",
                "_HYBRID_SHARD_ZERO2": "fsdp2:noreshard"}.get(self.strategy, "fsdp2:reshard")


def parse_case(key: str) -> Case:
    """A case from its key: `mini:FULL_SHARD[:noprefetch][:ring]`, `fsdp2:reshard`, `fsdp2:noreshard`,
    `ddp` or `compute`."""
    parts = key.strip().split(":")
    if parts[0] == "mini" and len(parts) >= 2:
        from fsdp_mini.strategy import as_strategy

        flags = set(parts[2:])
        if not flags <= {"noprefetch", "ring"}:
            raise ValueError(f"unknown flags {sorted(flags - {'noprefetch', 'ring'})} in case {key!r}")
        strategy = as_strategy(parts[1]).name
        return Case(key.strip(), "fsdp_mini", strategy, prefetch="noprefetch" not in flags,
                    impl="ring" if "ring" in flags else "builtin")
    if parts[0] == "fsdp2" and len(parts) == 2 and parts[1] in ("reshard", "noreshard"):
        return Case(key.strip(), "fsdp2", "FULL_SHARD" if parts[1] == "reshard" else "SHARD_GRAD_OP")
    if key.strip() in ("ddp", "compute"):
        return Case(key.strip(), key.strip())
    raise ValueError(f"unknown case {key!r}: use mini:STRATEGY[:noprefetch][:ring], fsdp2:reshard, "
                     f"fsdp2:noreshard, ddp or compute")


CASES = ("mini:NO_SHARD", "mini:SHARD_GRAD_OP", "mini:FULL_SHARD", "mini:FULL_SHARD:noprefetch",
         "mini:HYBRID_SHARD", "fsdp2:reshard", "fsdp2:noreshard", "ddp", "compute")


def parse_cases(text: str) -> list[Case]:
    cases = [parse_case(k) for k in text.split(",") if k.strip()]
    if not cases:
        raise ValueError("no cases given")
    return cases


def parse_sizes(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in names if s not in SIZES]
    if bad or not names:
        raise ValueError(f"unknown size(s) {bad or text!r}: choose from {', '.join(SIZES)}")
    return names


def model_numel(size: str) -> int:
    """Parameters of the GPT of `size` (the tied head counted once)."""
    return sum(p.numel() for p in GPT(SIZES[size][0]).parameters())


def hybrid_shard_size(world: int) -> int:
    """Two "nodes" when the world splits evenly (4 ranks: a 2 x 2 grid), else one (as the demo)."""
    return world // 2 if world >= 4 and world % 2 == 0 else world


# --- building and stepping a case -------------------------------------------------------------------

def _optimizer(params):
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1)


def build(case: Case, cfg: GPTConfig):
    """(model, optimizer) for one case on this rank."""
    from fsdp_mini.fsdp import FSDP
    from fsdp_mini.pytorch_equivalent import wrap_like_pytorch

    world = dist.get_world_size()
    if case.engine == "fsdp_mini":
        hybrid = "HYBRID" in case.strategy
        model = FSDP(GPT(cfg), case.strategy, wrap=(Block,), prefetch=case.prefetch, impl=case.impl,
                     shard_size=hybrid_shard_size(world) if hybrid else None)
    elif case.engine == "fsdp2":
        model = wrap_like_pytorch(GPT(cfg), case.strategy, wrap=(Block,))
    elif case.engine == "ddp":
        model = wrap_like_pytorch(GPT(cfg), "NO_SHARD")
    else:
        model = GPT(cfg)
    return model, _optimizer(model.parameters())


def _batch(cfg: GPTConfig, batch: int, step: int):
    return tuple(local_rows(t, dist.get_rank(), dist.get_world_size()) for t in make_batch(cfg, batch, step))


def step(model, opt, x, y) -> None:
    model(x, y).backward()
    opt.step()
    opt.zero_grad()


# --- memory and bytes ---------------------------------------------------------------------------------

def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (FSDP2), or the tensor itself."""
    return getattr(t, "_local_tensor", t)


def _nbytes(tensors) -> int:
    return sum(_local(t).numel() * _local(t).element_size() for t in tensors if t is not None)


def _optimizer_bytes(opt) -> int:
    return _nbytes(v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor))


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
    opt = _optimizer(model.parameters())
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
        step(model, opt, *_batch(cfg, batch, s))
    # RSS: a plain step (the profiler's own buffers would count otherwise), peak since the reset.
    dist.barrier()
    _reset_peak_rss()
    step(model, opt, *_batch(cfg, batch, warmup))
    rss_peak = max(0, _status_kib("VmHWM") - rss_before)
    x, y = _batch(cfg, batch, warmup + 1)
    if case.engine == "fsdp_mini":
        model.memory.reset_peak()
    at_start = _nbytes(model.parameters()) + _optimizer_bytes(opt)
    state = {}

    def one_step():
        model(x, y).backward()
        state["params"] = _nbytes(model.parameters())
        state["grads"] = _nbytes(p.grad for p in model.parameters())
        opt.step()
        state["optimizer"] = _optimizer_bytes(opt)
        opt.zero_grad()

    dist.barrier()
    peak = at_start + _profiled_peak(one_step)
    out = dict(state, model_state=state["params"] + state["grads"] + state["optimizer"], peak_alloc=peak,
               rss_peak=rss_peak)
    records, units = [], []
    following = _batch(cfg, batch, warmup + 2)
    if case.engine == "fsdp_mini":
        out["unsharded_peak"] = model.memory.peak
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
            step(*built[c.key], *_batch(cfg, batch, s))
    times = {c.key: {p: [] for p in PHASES} for c in cases}
    batches = [_batch(cfg, batch, warmup + s) for s in range(steps)]
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
        from fsdp_mini.groups import grid

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


# --- the report -----------------------------------------------------------------------------------------

def summarize(results: list[dict]) -> list[dict]:
    """One row per (world, size, case): medians and ratios, from the raw results of `run`."""
    rows = []
    for res in results:
        world, size = res["world_size"], res["size"]
        for key, phases in res["times"].items():
            case = parse_case(key)
            mem = res["memory"].get(key, {})
            name = case.name
            if "HYBRID" in case.strategy:
                s = hybrid_shard_size(world)
                name += f" ({world // s}x{s})"
            rows.append({"world_size": world, "size": size, "case": key, "name": name,
                         **{f"{p}_s": statistics.median(phases[p]) for p in PHASES}, "times": phases["step"],
                         **{k: v for k, v in mem.items() if k not in ("records", "units")}})
        by = {r["case"]: r for r in rows if r["world_size"] == world and r["size"] == size}
        for r in by.values():
            case = parse_case(r["case"])
            twin = by.get(case.twin) if case.twin else None
            r["vs_twin"] = r["step_s"] / twin["step_s"] if twin else None
            r["twin"] = case.twin if twin else None
            r["vs_fsdp2"] = r["step_s"] / by["fsdp2:reshard"]["step_s"] if "fsdp2:reshard" in by else None
            r["vs_ddp"] = r["step_s"] / by["ddp"]["step_s"] if "ddp" in by else None
    return rows


def _fmt(v, spec: str, missing: str = "-") -> str:
    return missing if v is None else format(v, spec)


def table(rows: list[dict]) -> str:
    """The results table: one block per (size, world size)."""
    head = (f"{'case':<34}{'step ms':>9}{'x twin':>8}{'x FSDP2':>8}{'x DDP':>7}{'sent/step':>11}"
            f"{'state/rank':>11}{'gathered':>10}{'peak alloc':>11}{'RSS peak':>10}")
    lines = []
    for key in dict.fromkeys((r["size"], r["world_size"]) for r in rows):
        block = [r for r in rows if (r["size"], r["world_size"]) == key]
        numel = model_numel(key[0])
        lines += ["", f"{key[0]} GPT ({numel:,} parameters), world size {key[1]}, global batch "
                  f"{SIZES[key[0]][1]}, median of {len(block[0]['times'])} steps", head, "-" * len(head)]
        for r in block:
            b = lambda k: format_bytes(r[k]) if r.get(k) is not None else "-"  # noqa: E731
            lines.append(f"{r['name']:<34}{r['step_s'] * 1e3:>9.1f}{_fmt(r['vs_twin'], '.2f'):>8}"
                         f"{_fmt(r['vs_fsdp2'], '.2f'):>8}{_fmt(r['vs_ddp'], '.2f'):>7}{b('sent'):>11}"
                         f"{b('model_state'):>11}{b('unsharded_peak'):>10}{b('peak_alloc'):>11}{b('rss_peak'):>10}")
    lines += ["", "x twin: step time / the PyTorch peer's (NO_SHARD: DDP; SHARD_GRAD_OP: FSDP2 reshard=False; "
              "the others: FSDP2 reshard=True)",
              "sent/step: bytes one rank sends per step (ring model); state/rank: parameters + gradients + "
              "optimizer state kept per rank;",
              "gathered: fsdp_mini's peak of unsharded parameters; peak alloc: profiled peak of allocated bytes "
              "in a step; RSS peak: growth of the process's peak RSS"]
    return "\n".join(lines[1:])


def targets(rows: list[dict], results: list[dict]) -> list[dict]:
    """The issue's targets, each with the measured value, the limit and whether it is met."""
    out = []
    units = {(res["world_size"], res["size"], k): m.get("units", []) for res in results for k, m in res["memory"].items()}

    def get(world, size, key):
        return next((r for r in rows if r["world_size"] == world and r["size"] == size and r["case"] == key), None)

    for world, size in dict.fromkeys((r["world_size"], r["size"]) for r in rows):
        full, fsdp2 = get(world, size, "mini:FULL_SHARD"), get(world, size, "fsdp2:reshard")
        no_shard, ddp = get(world, size, "mini:NO_SHARD"), get(world, size, "ddp")
        off, compute = get(world, size, "mini:FULL_SHARD:noprefetch"), get(world, size, "compute")
        where = f"{size}, world {world}"
        if full and fsdp2 and world == 2:
            v = full["step_s"] / fsdp2["step_s"]
            out.append(dict(target="FULL_SHARD step <= 0.9x FSDP2 (world 2)", where=where, value=v, limit=0.9, met=v <= 0.9))
        if no_shard and ddp:
            v = no_shard["step_s"] / ddp["step_s"]
            out.append(dict(target="NO_SHARD step <= 1.1x DDP", where=where, value=v, limit=1.1, met=v <= 1.1))
        if full and no_shard and full.get("model_state") and no_shard.get("model_state"):
            v = full["model_state"] * world / no_shard["model_state"] - 1
            out.append(dict(target="FULL_SHARD state/rank <= NO_SHARD's / N + 1%", where=where, value=v,
                            limit=0.01, met=v <= 0.01))
        u = sorted(units.get((world, size, "mini:FULL_SHARD"), []), reverse=True)
        if full and full.get("unsharded_peak") is not None and len(u) >= 2:
            v = full["unsharded_peak"] / (u[0] + u[1])
            out.append(dict(target="FULL_SHARD gathered peak <= two largest units", where=where, value=v,
                            limit=1.0, met=v <= 1.0))
        if full and off:
            share = 1 - compute["step_s"] / off["step_s"] if compute else None
            v = full["step_s"] / off["step_s"]
            out.append(dict(target="prefetch on faster than off", where=where, value=v, limit=1.0, met=v < 1.0,
                            comm_share=share))
    return out


def targets_text(items: list[dict]) -> str:
    lines = []
    for t in items:
        value = f"{100 * t['value']:+.2f}%" if t["limit"] == 0.01 else f"{t['value']:.2f}x"
        limit = "1%" if t["limit"] == 0.01 else f"{t['limit']:g}x"
        extra = f" (communication ~{100 * t['comm_share']:.0f}% of a step without prefetch)" \
            if t.get("comm_share") is not None else ""
        lines.append(f"{'met   ' if t['met'] else 'MISSED'} {t['target']:<46} {t['where']:<18} {value:>8} "
                     f"(limit {limit}){extra}")
    return "\n".join(lines)


def plot(rows: list[dict], path: str) -> None:
    """A PNG, one row of panels per (size, world size), one bar per case: step time split into forward,
    backward and optimizer step (left); per-rank peak allocated bytes in a step, with the model state
    kept between steps drawn inside it (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys((r["size"], r["world_size"]) for r in rows))
    fig, axes = plt.subplots(len(groups), 2, figsize=(12, 1.2 + 0.33 * len(set(r["case"] for r in rows)) * len(groups) + 0.8 * len(groups)),
                             squeeze=False)
    phases = (("forward_s", "forward", "#4C72B0"), ("backward_s", "backward", "#DD8452"),
              ("optimizer_s", tr("optimizer step", "шаг оптимизатора"), "#55A868"))
    for g, (size, world) in enumerate(groups):
        block = [r for r in rows if (r["size"], r["world_size"]) == (size, world)]
        ys = range(len(block))
        ax = axes[g][0]
        left = [0.0] * len(block)
        for field, label, color in phases:
            width = [r.get(field, 0.0) * 1e3 for r in block]
            ax.barh(ys, width, left=left, color=color, label=label if g == 0 else None)
            left = [a + b for a, b in zip(left, width)]
        ax.scatter([r["step_s"] * 1e3 for r in block], ys, marker="|", color="black", s=200, zorder=3,
                   label=tr("step (median)", "шаг (медиана)") if g == 0 else None)
        ax.set_yticks(ys, [r["name"] for r in block], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(tr("ms per step (medians)", "мс на шаг (медианы)"))
        ax.set_title(tr(f"{size} GPT, {world} ranks: step time", f"GPT {size}, рангов: {world}; время шага"), fontsize=9)
        ax = axes[g][1]
        ax.barh(ys, [(r.get("peak_alloc") or 0) / 1e6 for r in block], color="#C9D5E8",
                label=tr("peak allocated in a step", "пик выделенной памяти за шаг") if g == 0 else None)
        ax.barh(ys, [(r.get("model_state") or 0) / 1e6 for r in block], height=0.4, color="#4C72B0",
                label=tr("params + grads + optimizer state", "параметры + градиенты + состояние оптимизатора") if g == 0 else None)
        ax.set_yticks(ys, [r["name"] for r in block], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(tr("MB per rank", "МБ на ранг"))
        ax.set_title(tr(f"{size} GPT, {world} ranks: memory", f"GPT {size}, рангов: {world}; память"), fontsize=9)
    handles = [h for ax in axes[0] for h in ax.get_legend_handles_labels()[0]]
    fig.legend(handles, [h.get_label() for h in handles], loc="lower center", ncol=len(handles), fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0.7 / fig.get_figheight(), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def environment() -> dict:
    return {"torch": torch.__version__, "cpus": os.cpu_count(), "omp_threads": os.environ.get("OMP_NUM_THREADS"),
            "load_before": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}


# --- the command --------------------------------------------------------------------------------------

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


def add_subcommand(sub) -> None:
    """Register `bench` on the CLI's subparsers."""
    b = sub.add_parser("bench", help="fsdp_mini vs PyTorch FSDP2 and DDP: step time, memory, bytes per step")
    b.add_argument("--world-sizes", default="2,4", help="comma-separated, e.g. 2,4")
    b.add_argument("--sizes", default="small,medium", help=f"comma-separated GPT sizes: {', '.join(SIZES)}")
    b.add_argument("--cases", default=",".join(CASES),
                   help="comma-separated: mini:STRATEGY[:noprefetch][:ring], fsdp2:reshard, fsdp2:noreshard, "
                        "ddp, compute")
    b.add_argument("--reps", type=int, default=5, help="interleaved rounds over the cases")
    b.add_argument("--steps", type=int, default=3, help="timed steps per case and round")
    b.add_argument("--warmup", type=int, default=2, help="untimed steps per case first")
    b.add_argument("--no-calibrate", action="store_true", help="skip measuring the collectives for simulate")
    b.add_argument("--calibration-iters", type=int, default=10, help="iterations per collective and size")
    b.add_argument("--simulate", action="store_true", help="also print fsdp_mini.simulate's prediction")
    b.add_argument("--json", metavar="FILE", help="write every measurement as JSON (input of `simulate`)")
    b.add_argument("--plot", metavar="FILE", help="write a PNG of step time and peak memory")
    b.add_argument("--language", choices=LANGUAGES, default="en", help="of the plot's labels")
    b.add_argument("--load", metavar="FILE", help="measure nothing: print and plot a saved --json run")
    b.add_argument("--timeout", type=float, default=1800, help="seconds per launch")
    b.set_defaults(func=command)


def _positive(name: str, value: int) -> int:
    if value < 1:
        raise ValueError(f"--{name} must be >= 1, got {value}")
    return value


def command(args) -> int:
    import json

    set_language(args.language)
    if args.load:
        with open(args.load) as f:
            return _report(json.load(f), args)
    try:
        worlds = [int(w) for w in args.world_sizes.split(",") if w.strip()]
    except ValueError:
        raise ValueError(f"cannot read --world-sizes {args.world_sizes!r}: use e.g. 2,4") from None
    if not worlds or any(w < 1 for w in worlds):
        raise ValueError(f"--world-sizes must be positive integers, got {args.world_sizes!r}")
    if under_torchrun():
        worlds = [int(os.environ["WORLD_SIZE"])]
    sizes, cases = parse_sizes(args.sizes), parse_cases(args.cases)
    for name in ("reps", "steps"):
        _positive(name, getattr(args, name))
    env = environment()
    results = run(worlds, sizes, [c.key for c in cases], args.reps, args.steps, args.warmup, args.timeout,
                  calibrate_collectives=not args.no_calibrate, calib_iters=_positive("calibration-iters", args.calibration_iters))
    if os.environ.get("RANK", "0") != "0":
        return 0
    env["load_after"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    rows = summarize(results)
    items = targets(rows, results)
    report = {"environment": env, "args": {k: v for k, v in vars(args).items() if k != "func"},
              "results": results, "rows": rows, "targets": items}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return _report(report, args)


def _report(report: dict, args) -> int:
    """Print a run's table and targets (and the simulation); write the plot."""
    env, rows, items = report["environment"], report["rows"], report["targets"]
    a = report["args"]
    load = (f"; load average {env['load_before'][0]:.1f} before, {env['load_after'][0]:.1f} after"
            if env.get("load_before") else "")
    print(f"fsdp_mini bench: gloo on {env['cpus']} CPUs, {report['results'][0].get('threads', '?')} thread(s) "
          f"per rank, torch {env['torch']}; {a['reps']} interleaved rounds x {a['steps']} steps per case{load}")
    print(table(rows))
    if items:
        print("\ntargets (issue 6):")
        print(targets_text(items))
    if args.simulate:
        from fsdp_mini import simulate

        print()
        print(simulate.report(report))
    if args.json and not args.load:
        print(f"wrote {args.json}")
    if args.plot:
        plot(rows, args.plot)
        print(f"wrote {args.plot}")
    return 0
