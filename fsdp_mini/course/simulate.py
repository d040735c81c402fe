"""A calibrated alpha-beta simulator of an FSDP step: fit the links of this machine, predict, compare, extrapolate.

    python -m fsdp_mini bench --json bench.json     # measures the steps and calibrates the collectives
    python -m fsdp_mini simulate bench.json         # prediction vs measurement, then a bigger cluster

Three steps, each a plain function of plain data (so it can be tested without a process group):

1. `fit`: for each collective and group size, a latency alpha and a bandwidth from bench-collectives
   rows (the ring model of `fsdp_mini.course.cost`: t = steps * alpha + bus_factor * S / bandwidth, a straight
   line in S, fitted to relative errors so that 4 KiB and 4 MiB calls are both right). `bench` measures
   these rows in the same launch as the steps, for the whole world and, at world 4, for the pairs of
   ranks that the hybrid strategy's groups are, over the sizes the engine's calls span.
2. `predict`: a step = compute + communication. Communication: every collective that one real step
   issued (fsdp_mini's CommLog of that step, so nothing is left out: the root's single AllGather, the
   padding, the replica AllReduces), each priced with its fit. Compute: the same model without any
   communication on this rank's rows ("compute only", measured in the same run, under the same CPU
   contention) for forward and backward, plus the case's own measured optimizer step.
   Two bounds: `serial` (nothing overlaps: compute + communication) and `overlapped` (every collective
   hidden behind forward and backward: max(forward + backward, communication) + optimizer step).
3. `extrapolate`: the same per-step collectives on a stated cluster (`fsdp_mini.course.cluster`: NVLink inside
   a node, the network between nodes), for the benchmarked GPT and for a large model, with compute from
   the FLOP count (6 x parameters x tokens) at a stated GPU throughput.

What the model leaves out, and where the measurement therefore differs: the engine's own CPU time
(hooks, flattening gradients, allocating gathered buffers), the CPU that gloo's transport takes from
compute on a machine with few cores (loopback TCP is memcpy by the kernel: on 2 cores, overlap is not
free), contention between concurrent groups, and noise. The error column says how much that is.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass

from fsdp_mini.course.cluster import Cluster, step_communication
from fsdp_mini.course.cost import AlphaBeta, fit_alpha_beta, predict as predict_collective

__all__ = ["DEFAULT_CLUSTER", "fit", "fit_relative", "price", "comm_seconds", "compute_seconds", "Prediction", "predict",
           "gpt_units", "extrapolate", "report", "add_subcommand"]

DEFAULT_CLUSTER = Cluster(nodes=8, gpus_per_node=8, intra_bandwidth=300e9, inter_bandwidth=400e9 / 8,
                          alpha_intra=5e-6, alpha_inter=20e-6)
"""8 nodes x 8 GPUs: NVLink inside a node (300 GB/s per GPU), 400 Gb/s = 50 GB/s per GPU between nodes;
the numbers of the hybrid-sharding lesson."""


# --- 1. calibration ----------------------------------------------------------------------------------

def fit_relative(op: str, n: int, sizes, seconds) -> AlphaBeta:
    """`fsdp_mini.course.cost.fit_alpha_beta`'s line, fitted to *relative* errors: minimises the sum of
    ((t - alpha' - slope * S) / t)^2, i.e. least squares with weights 1/t^2. The plain fit is ruled by the
    largest messages, whose times are largest, and gets the latency of small ones wrong by 2x; FSDP's
    calls span 4 KiB to a few MiB, so each should be predicted to a similar relative accuracy. A negative
    intercept is refitted through the origin (alpha = 0), as in the plain fit."""
    from fsdp_mini.course.cost import bus_factor, ring_steps

    xs, ts = [float(x) for x in sizes], [float(t) for t in seconds]
    if len(xs) != len(ts) or len(set(xs)) < 2 or any(not t > 0 for t in ts) or any(not x >= 0 for x in xs):
        raise ValueError("need positive times for at least two distinct sizes")
    w = [1 / t**2 for t in ts]
    sw, sx = sum(w), sum(wi * x for wi, x in zip(w, xs))
    sxx = sum(wi * x * x for wi, x in zip(w, xs))
    st, sxt = sum(wi * t for wi, t in zip(w, ts)), sum(wi * x * t for wi, x, t in zip(w, xs, ts))
    slope = (sw * sxt - sx * st) / (sw * sxx - sx * sx)
    intercept = (st - slope * sx) / sw
    if intercept < 0:
        slope, intercept = sxt / sxx, 0.0
    if not slope > 0:
        raise ValueError("times do not grow with size, so bandwidth cannot be fitted")
    return AlphaBeta(alpha=intercept / ring_steps(op, n), bandwidth=bus_factor(op, n) / slope)


def fit(rows: list[dict], weighting: str = "relative") -> dict[tuple[str, str, int], AlphaBeta]:
    """(op, impl, group size) -> fitted alpha and bandwidth, from bench-collectives rows (keys size, op,
    impl, world_size, seconds). `weighting`: "relative" (`fit_relative`, the default) or "absolute"
    (`fsdp_mini.course.cost.fit_alpha_beta`, plain least squares). Sets that cannot be fitted (fewer than two
    distinct sizes, or times that do not grow with size: noise) are left out, so pricing them raises
    KeyError."""
    if weighting not in ("relative", "absolute"):
        raise ValueError(f"weighting must be 'relative' or 'absolute', got {weighting!r}")
    by: dict[tuple[str, str, int], list[tuple[int, float]]] = defaultdict(list)
    for r in rows:
        by[r["op"], r["impl"], int(r["world_size"])].append((int(r["size"]), float(r["seconds"])))
    fitter = fit_relative if weighting == "relative" else fit_alpha_beta
    out = {}
    for (op, impl, n), points in by.items():
        if n < 2 or len({s for s, _ in points}) < 2:
            continue
        try:
            out[op, impl, n] = fitter(op, n, [s for s, _ in points], [t for _, t in points])
        except ValueError:
            continue
    return out


def price(op: str, nbytes: int, n: int, fits: dict, impl: str = "builtin") -> float:
    """Seconds of one collective on S = nbytes over n ranks, with the fit for (op, impl, n), falling back
    to the builtin fit. KeyError when this group size was not calibrated."""
    if n == 1:
        return 0.0
    ab = fits.get((op, impl, n)) or fits[op, "builtin", n]
    return predict_collective(op, nbytes, n, ab.alpha, ab.bandwidth)


def comm_seconds(records, fits: dict) -> float:
    """Predicted seconds of one step's collectives run one after another. `records`: CommRecords or
    (op, impl, nbytes, group_size, ...) tuples, as `bench` stores CommLog's records."""
    total = 0.0
    for r in records:
        op, impl, nbytes, n = (r.op, r.impl, r.nbytes, r.group_size) if hasattr(r, "op") else tuple(r[:4])
        total += price(op, nbytes, n, fits, impl)
    return total


def compute_seconds(compute_row: dict, case_row: dict) -> dict:
    """Compute of one step of a case: forward + backward of the "compute only" row (the same model and
    rows, no communication, measured in the same run) plus the case's own optimizer step (which
    communicates nothing in fsdp_mini; its cost depends on how many tensors and elements the rank
    keeps, so it is taken as measured rather than modelled)."""
    fwd_bwd = compute_row["forward_s"] + compute_row["backward_s"]
    opt = case_row["optimizer_s"]
    return {"forward_backward": fwd_bwd, "optimizer": opt, "total": fwd_bwd + opt}


# --- 2. prediction on this machine ----------------------------------------------------------------------

@dataclass(frozen=True)
class Prediction:
    world_size: int
    size: str
    case: str
    name: str
    compute_s: float
    comm_s: float
    serial_s: float
    overlapped_s: float
    measured_s: float

    @property
    def error(self) -> float:
        """serial / measured - 1: how far the no-overlap prediction is from the measured median."""
        return self.serial_s / self.measured_s - 1

    @property
    def hidden(self) -> float:
        """The share of the predicted communication that the measurement did not pay for: 1 - (measured -
        compute) / comm. 0: none overlapped (or overheads ate the gain), 1: all of it hidden."""
        return 1 - (self.measured_s - self.compute_s) / self.comm_s if self.comm_s > 0 else 0.0

    @property
    def within_bounds(self) -> bool:
        return self.overlapped_s <= self.measured_s <= self.serial_s


def predict(bench_report: dict, rows: list[dict] | None = None) -> tuple[list[Prediction], list[str]]:
    """Predictions for every fsdp_mini case of a `bench --json` report; notes on what was skipped.
    `rows`: bench-collectives rows to calibrate with instead of the report's own."""
    from fsdp_mini.course.bench.cases import parse_case

    out, notes = [], []
    table = {(r["world_size"], r["size"], r["case"]): r for r in bench_report["rows"]}
    for res in bench_report["results"]:
        world, size = res["world_size"], res["size"]
        fits = fit(rows if rows is not None else res.get("collectives", []))
        compute = table.get((world, size, "compute"))
        if compute is None:
            notes.append(f"{size}, world {world}: no 'compute' case measured, nothing to predict")
            continue
        for key, mem in res["memory"].items():
            case = parse_case(key)
            if case.engine != "fsdp_mini" or (world, size, key) not in table:
                continue
            c = compute_seconds(compute, table[world, size, key])
            try:
                comm = comm_seconds(mem["records"], fits)
            except KeyError as exc:
                notes.append(f"{size}, world {world}, {case.name}: no calibration for {exc.args[0]}")
                continue
            out.append(Prediction(world, size, key, table[world, size, key]["name"], c["total"], comm,
                                  c["total"] + comm, max(c["forward_backward"], comm) + c["optimizer"],
                                  table[world, size, key]["step_s"]))
    return out, notes


# --- 3. extrapolation ------------------------------------------------------------------------------------

def gpt_units(cfg) -> list[int]:
    """Parameters per FSDP unit of `GPT(cfg)` wrapped with wrap=(Block,): the root first (embeddings,
    final LayerNorm, the tied head counted once), then one entry per block. Built on the meta device."""
    import torch

    from fsdp_mini.course.models import GPT

    with torch.device("meta"):
        model = GPT(cfg)
    block = sum(p.numel() for p in model.blocks[0].parameters())
    total = sum(p.numel() for p in model.parameters())
    return [total - cfg.n_layer * block] + [block] * cfg.n_layer


def extrapolate(cluster: Cluster, units: list[int], compute_s: float, strategies=("NO_SHARD", "FULL_SHARD",
                "HYBRID_SHARD"), param_bytes: int = 2, grad_bytes: int = 2) -> list[dict]:
    """Per strategy on `cluster`: the step's communication (inside nodes, across nodes), and the step
    time without overlap and with perfect overlap, for a model cut into `units` (parameter counts, the
    root first: it is gathered once per step, as in fsdp_mini) and `compute_s` seconds of compute."""
    out = []
    for s in strategies:
        sc = step_communication(cluster, s, units, param_bytes=param_bytes, grad_bytes=grad_bytes,
                                root_stays_gathered=True)
        out.append({"strategy": sc.strategy, "shard_size": sc.shard_size, "replicas": sc.replicas,
                    "comm_s": sc.seconds, "intra_s": sc.intra_seconds, "inter_s": sc.inter_seconds,
                    "sent": sc.sent, "sent_inter": sc.sent_inter, "compute_s": compute_s,
                    "serial_s": compute_s + sc.seconds, "overlapped_s": max(compute_s, sc.seconds)})
    return out


def flops_seconds(params: float, tokens: float, flops: float, mfu: float) -> float:
    """Training compute of one step: 6 x parameters x tokens FLOPs (forward 2, backward 4) at `mfu` of
    the GPU's peak `flops`."""
    return 6 * params * tokens / (flops * mfu)


# --- the report --------------------------------------------------------------------------------------------

def _ms(x: float) -> str:
    return f"{x * 1e3:.1f}"


def _fit_text(fits: dict) -> list[str]:
    lines = []
    for (op, impl, n), ab in sorted(fits.items(), key=lambda kv: (kv[0][2], kv[0][1], kv[0][0])):
        lines.append(f"  {op:<15}{impl:<8} n={n}: alpha {ab.alpha * 1e6:7.1f} us, bandwidth {ab.bandwidth / 1e9:6.2f} GB/s")
    return lines


def report(bench_report: dict, rows: list[dict] | None = None, cluster: Cluster = DEFAULT_CLUSTER,
           big_params: float = 7e9, big_units: int = 32, tokens_per_gpu: int = 16384, gpu_flops: float = 989e12,
           mfu: float = 0.4) -> str:
    """The text `simulate` prints: fits, prediction vs measurement, extrapolation to `cluster`."""
    from fsdp_mini.course.bench.cases import SIZES

    preds, notes = predict(bench_report, rows)
    lines = ["alpha-beta fits of this machine's collectives (gloo):"]
    seen = set()
    for res in bench_report["results"]:
        key = res["world_size"]
        if key in seen:
            continue
        seen.add(key)
        fits = fit(rows if rows is not None else res.get("collectives", []))
        lines.append(f" world {key}:" if fits else f" world {key}: no calibration rows")
        lines += _fit_text(fits)
    head = (f"{'case':<40}{'compute':>9}{'comm':>8}{'serial':>9}{'overlap':>9}{'measured':>10}{'serial err':>11}"
            f"{'hidden':>8}")
    lines += ["", "prediction vs measurement, ms per step (serial: no overlap; overlap: all comm hidden by compute)"]
    for key in dict.fromkeys((p.size, p.world_size) for p in preds):
        lines += ["", f"{key[0]} GPT, world size {key[1]}", head]
        for p in (p for p in preds if (p.size, p.world_size) == key):
            mark = "" if p.within_bounds else (" <" if p.measured_s < p.overlapped_s else " >")
            lines.append(f"{p.name:<40}{_ms(p.compute_s):>9}{_ms(p.comm_s):>8}{_ms(p.serial_s):>9}"
                         f"{_ms(p.overlapped_s):>9}{_ms(p.measured_s):>10}{100 * p.error:>+10.0f}%"
                         f"{100 * p.hidden:>7.0f}%{mark}")
    if preds:
        inside = sum(p.within_bounds for p in preds)
        mean_abs = sum(abs(p.error) for p in preds) / len(preds)
        lines += ["", f"measured within [overlap, serial]: {inside} of {len(preds)}; mean |serial error| "
                  f"{100 * mean_abs:.0f}%. hidden: share of the predicted communication the step did not pay "
                  f"for (1 - (measured - compute) / comm);",
                  "'>': measured above serial (engine and CPU overheads the model omits), '<': below overlap"]
    lines += notes
    c = cluster
    lines += ["", f"extrapolation: {c.nodes} nodes x {c.gpus_per_node} GPUs, {c.intra_bandwidth / 1e9:g} GB/s "
              f"inside a node (alpha {c.alpha_intra * 1e6:g} us), {c.inter_bandwidth * 8 / 1e9:g} Gb/s per GPU "
              f"between nodes (alpha {c.alpha_inter * 1e6:g} us; a ring leaves a node on the cards of all its "
              f"ranks there); bf16 parameters and gradients; compute = "
              f"6 x params x {tokens_per_gpu} tokens per GPU at {mfu:.0%} of {gpu_flops / 1e12:g} TFLOP/s"]
    models = [(f"{s} GPT", gpt_units(SIZES[s][0])) for s in dict.fromkeys(r["size"] for r in bench_report["results"])]
    base, extra = divmod(int(big_params), big_units)
    models.append((f"{big_params / 1e9:g}B-parameter model, {big_units} units",
                   [base + (1 if i < extra else 0) for i in range(big_units)]))
    head = f"{'strategy':<14}{'comm':>10}{'inside':>10}{'across':>10}{'compute':>10}{'serial':>10}{'overlap':>10}"
    for name, units in models:
        compute = flops_seconds(sum(units), tokens_per_gpu, gpu_flops, mfu)
        lines += ["", f"{name} ({sum(units):,} parameters), ms per step", head]
        for e in extrapolate(cluster, units, compute):
            lines.append(f"{e['strategy']:<14}" + "".join(f"{e[k] * 1e3:>10.3f}" for k in
                         ("comm_s", "intra_s", "inter_s", "compute_s", "serial_s", "overlapped_s")))
    return "\n".join(lines)


def to_dict(bench_report: dict, rows: list[dict] | None = None) -> dict:
    preds, notes = predict(bench_report, rows)
    return {"predictions": [asdict(p) | {"error": p.error, "hidden": p.hidden, "within_bounds": p.within_bounds}
                            for p in preds],
            "notes": notes}


# --- the command --------------------------------------------------------------------------------------------

def add_subcommand(sub) -> None:
    s = sub.add_parser("simulate", help="alpha-beta prediction of fsdp_mini's step time from a `bench --json` file")
    s.add_argument("bench_json", metavar="BENCH_JSON", help="the file `python -m fsdp_mini bench --json` wrote")
    s.add_argument("--collectives", metavar="FILE", help="bench-collectives --json rows to calibrate with instead")
    s.add_argument("--nodes", type=int, default=DEFAULT_CLUSTER.nodes, help="nodes of the cluster to extrapolate to")
    s.add_argument("--gpus-per-node", type=int, default=DEFAULT_CLUSTER.gpus_per_node, help="GPUs (ranks) per node")
    s.add_argument("--intra-gbytes", type=float, default=DEFAULT_CLUSTER.intra_bandwidth / 1e9,
                   help="GB/s per GPU inside a node (NVLink)")
    s.add_argument("--inter-gbits", type=float, default=DEFAULT_CLUSTER.inter_bandwidth * 8 / 1e9,
                   help="Gb/s per GPU between nodes")
    s.add_argument("--params", type=float, default=7e9, help="parameters of the large model to extrapolate")
    s.add_argument("--units", type=int, default=32, help="FSDP units of the large model")
    s.add_argument("--tokens-per-gpu", type=int, default=16384,
                   help="tokens per GPU in one step of the large model")
    s.add_argument("--gpu-tflops", type=float, default=989, help="peak bf16 TFLOP/s of one GPU")
    s.add_argument("--mfu", type=float, default=0.4, help="fraction of the peak reached")
    s.add_argument("--json", metavar="FILE", help="also write the predictions as JSON")
    s.set_defaults(func=command)


def command(args) -> int:
    import json

    with open(args.bench_json) as f:
        bench_report = json.load(f)
    rows = None
    if args.collectives:
        with open(args.collectives) as f:
            rows = json.load(f)
    for name in ("nodes", "gpus_per_node", "units", "tokens_per_gpu"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    for name in ("intra_gbytes", "inter_gbits", "params", "gpu_tflops", "mfu"):
        if not getattr(args, name) > 0 or not math.isfinite(getattr(args, name)):
            raise ValueError(f"--{name.replace('_', '-')} must be a positive number")
    cluster = Cluster(args.nodes, args.gpus_per_node, args.intra_gbytes * 1e9, args.inter_gbits * 1e9 / 8,
                      DEFAULT_CLUSTER.alpha_intra, DEFAULT_CLUSTER.alpha_inter)
    print(report(bench_report, rows, cluster, args.params, args.units, args.tokens_per_gpu, args.gpu_tflops * 1e12,
                 args.mfu))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(to_dict(bench_report, rows), f, indent=1)
        print(f"wrote {args.json}")
    return 0
