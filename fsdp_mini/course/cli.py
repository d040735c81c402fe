"""The command line, `python -m fsdp_mini` (or `fsdp-mini`): the demo, the benchmarks, `diagnose`, `plan` and `fit`.

Each subcommand starts its ranks with `launch` or, when run under `torchrun` (RANK is set), runs the
same worker in this process after `init()`; rank 0 prints.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from fsdp_mini.course import cost
from fsdp_mini.course.planner.arguments import LAYOUT_DEFAULTS
from fsdp_mini.course.planner.hardware import GPUS
from fsdp_mini.course.planner.hf_config import ARCHITECTURES
from fsdp_mini.course.planner.models import MODELS
from fsdp_mini.course.planner.layout import SP_VARIANTS, Checkpointing

# The subcommands that start ranks import torch and the library where they run: `plan`, `fit` and `diagnose`
# answer without loading torch (`plan` in well under 2 s).


def _run(worker, world_size: int, args: tuple, timeout: float):
    """Results of rank 0, or None on the other ranks under torchrun (whose collectives then time out,
    and explain the hang, after `timeout` seconds, as they do under `launch`)."""
    import torch.distributed as dist

    from fsdp_mini.run import launch
    from fsdp_mini.runtime import init, under_torchrun

    if under_torchrun():
        init(timeout=timeout)
        result = worker(*args)
        return result if dist.get_rank() == 0 else None
    return launch(worker, world_size, args=args, timeout=timeout, capture_output=False)[0]


def _demo_worker(numel: int) -> dict:
    import torch
    import torch.distributed as dist

    from fsdp_mini.collectives import ring_all_reduce
    from fsdp_mini.comm_log import CommLog
    from fsdp_mini.course.naive_collectives import naive_all_reduce

    n = dist.get_world_size()
    x = torch.arange(numel, dtype=torch.float32) * (dist.get_rank() + 1)
    expected = x.clone()
    dist.all_reduce(expected)
    ring, naive = x.clone(), x.clone()
    with CommLog() as log:
        ring_all_reduce(ring)
        naive_all_reduce(naive)
    return {"n": n, "equal": bool(torch.equal(ring, expected) and torch.equal(naive, expected)),
            "table": log.table()}


def demo(args) -> int:
    from fsdp_mini.course import demo as D
    from fsdp_mini.rank_environment import under_torchrun

    world = args.world_size if not under_torchrun() else int(os.environ["WORLD_SIZE"])
    if os.environ.get("RANK", "0") == "0":
        print(f"Training a {D.CFG.n_layer}-block GPT ({sum(p.numel() for p in D.GPT(D.CFG).parameters()):,} parameters) "
              f"for {D.STEPS} AdamW steps, global batch {D.BATCH}, on {world} processes, under every strategy")
    rows = _run(D.worker, args.world_size, (not args.no_pytorch,), args.timeout)
    if rows is None:
        return 0
    ref = D.reference()
    print(D.table(ref, rows, world))
    print("loss: mean over ranks of the last step; max|dw|: largest weight difference after training; memory: rank 0's")
    print("params/grads/optim: bytes each rank keeps; gathered: peak bytes of unsharded parameters during a step")
    worst = max(max((r["sd"][k] - ref["sd"][k]).abs().max().item() for k in ref["sd"]) for r in rows)
    ok = worst < 1e-4
    print(f"every strategy matches single-process training: {ok} (largest difference {worst:.1e})")
    return 0 if ok else 1


def ring_demo(args) -> int:
    numel = 1_000_003  # not a multiple of the world size: the ring pads its last chunk
    print(f"Ring and naive all-reduce of {numel:,} fp32 values on {args.world_size} gloo processes")
    out = _run(_demo_worker, args.world_size, (numel,), args.timeout)
    if out is None:
        return 0
    print(f"both equal torch.distributed.all_reduce: {out['equal']}")
    print("CommLog of rank 0 (the naive root sends (n-1)*S, the ring 2(n-1)/n*S):")
    print(out["table"])
    s, n = numel * 4, out["n"]
    print("alpha-beta prediction, 10 us latency, 10 GB/s links:")
    for algo in ("ring", "naive", "tree"):
        t = cost.predict("all_reduce", s, n, alpha=10e-6, bandwidth=10e9, algorithm=algo)
        print(f"  {algo:<6}{t * 1e3:8.3f} ms")
    return 0 if out["equal"] else 1


def bench_collectives_cmd(args) -> int:
    from fsdp_mini.course import bench_collectives

    sizes = [bench_collectives.parse_size(s) for s in args.sizes.split(",") if s.strip()]
    rows = _run(bench_collectives.worker, args.world_size, (sizes, args.iters, args.warmup), args.timeout)
    if rows is None:
        return 0
    print(f"world size {rows[0]['world_size']}, fp32, median of {args.iters} iterations (slowest rank)")
    print(bench_collectives.table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
        print(f"wrote {args.json}")
    return 0


def diagnose_cmd(args) -> int:
    """Print the verdict of `fsdp_mini.flight_recorder.diagnose` on the newest run in the folder, with the
    files of earlier runs it ignored (exit code 1 when there is no record)."""
    from fsdp_mini.flight_recorder import diagnose

    if not os.path.isdir(args.folder):
        raise ValueError(f"{args.folder} is not a folder")
    verdict = diagnose(args.folder)
    print(verdict)
    return 1 if verdict.startswith("no flight records") else 0


def _sp_label(layout) -> str:
    if not layout.sp:
        return ""
    return " (SP, Megatron's: shards kept)" if layout.sp_variant == "megatron" else " (SP)"


def plan_cmd(args) -> int:
    """Memory per GPU and step time of one layout (`fsdp_mini.course.planner`), or with --compare every layout
    of the same GPUs and global batch, ranked."""
    from fsdp_mini.course import planner
    from fsdp_mini.course.planner.arguments import LAYOUT_FLAGS, resolve_gpu, resolve_model
    from fsdp_mini.course.planner.calibration import load_profile
    from fsdp_mini.course.planner.compare import compare, describe

    model, gpu = resolve_model(args.model), resolve_gpu(args.gpu)
    if args.sp_variant != "pytorch" and not args.sp:
        raise ValueError(f"--sp-variant {args.sp_variant} is a kind of sequence parallelism: add --sp (and --tp > 1)")
    layout = planner.Layout(**{name: getattr(args, name) for name in LAYOUT_FLAGS})
    if args.model not in MODELS:
        # a config file's learned position table bounds --seq; a preset keeps what `plan` and the site's calculator
        # (its JavaScript port, tests/site/test_site.py's PLANNER_CASES) answer for it today: GPT-2 presets at any
        # sequence. Moving the check into Layout.check means porting it to lessons/assets/calculator/planner.js.
        model.check_seq(layout.seq)
    calibration = load_profile(args.profile) if args.profile else planner.CALIBRATION
    if args.compare:
        ranked = compare(model, gpu, layout, calibration)
        if args.json:
            # to_dict()'s "layout" is the layout's fields; its one-line reading goes under "summary"
            print(json.dumps([{"rank": c.rank, "summary": describe(c.plan.layout), "why": c.why} | c.plan.to_dict()
                              for c in ranked], indent=1))
            return 0
        print(f"{model.name} on {args.gpus} x {gpu.name}, {layout.local_batch * layout.dp} sequences of "
              f"{args.seq} per step: every layout, fastest first")
        width = max(len(describe(c.plan.layout)) for c in ranked) + 2
        print(f"{'rank':>4}  {'layout':<{width}}{'GiB':>7}  {'verdict':<13}{'tokens/s/GPU':>13}{'MFU':>7}  why not first")
        for c in ranked:
            p = c.plan
            print(f"{c.rank if c.rank else '-':>4}  {describe(p.layout):<{width}}{p.memory.peak_reserved / planner.GiB:7.1f}"
                  f"  {p.memory.fit_verdict:<13}{p.time.tokens_per_s_per_gpu:13,.0f}{p.time.mfu * 100:6.1f}%  {c.why}")
        low, high = (1 / (1 + e) - 1 for e in reversed(planner.memory.MEMORY_ERROR_BAND))
        print(f"ranked by verdict (the memory count with its error: measured peaks {low * 100:.0f}-{high * 100:.0f} % "
              f"above it), then by speed")
        return 0
    result = planner.plan(model, gpu, layout, calibration)
    if args.json:
        print(json.dumps(result.to_dict(), indent=1))
        return 0
    m, t = result.memory, result.time
    print(f"{model.name} ({model.params:,} parameters) on {args.gpus} x {gpu.name}: "
          f"FSDP {layout.dp_shard} x HSDP {layout.dp_replicate} x TP {layout.tp}{_sp_label(layout)} "
          f"x CP {layout.cp}, {layout.local_batch} x {layout.seq} tokens per data-parallel rank, AC {layout.ac.value}"
          + (", float8" if layout.float8 else "") + (", compiled" if layout.compile else ""))
    print("\nmemory per GPU                                                         GiB")
    for name, nbytes in m.terms.items():
        print(f"  {name:<68}{nbytes / planner.GiB:8.2f}")
    print(f"  {'peak allocated (' + m.peak_moment + ')':<68}{m.peak_allocated / planner.GiB:8.2f}")
    print(f"  {'peak reserved (torch.cuda.max_memory_reserved)':<68}{m.peak_reserved / planner.GiB:8.2f}")
    print(f"  of {m.capacity / planner.GiB:.1f} GiB: {m.verdict()}")
    print("\ntime per step                                                            s")
    for name, seconds in t.parts.items():
        print(f"  {name:<68}{seconds:8.3f}")
    print(f"  {'step':<68}{t.step_s:8.3f}")
    print(f"\ntokens/s per GPU {t.tokens_per_s_per_gpu:,.0f}, MFU {t.mfu * 100:.1f} % (torchtitan's 6N + 12 L H T "
          f"per token, of the bf16 peak)")
    if layout.compile:
        print("compile: norms fused with the residual add, SwiGLU fused (fewer memory-bound passes; rotary stays "
              "op by op: Inductor falls back on complex numbers); norms keep their bf16 input, SwiGLU only w1 and "
              "w3's outputs (fewer saved intermediates)")
    if layout.compile_loss:
        print("compile-loss: the loss reads the bf16 logits and writes their bf16 gradient, no fp32 copies")
    if args.profile:
        print(f"constants from {args.profile}: " + ", ".join(f"{k} {v:.3f}" for k, v in vars(calibration).items()))
    return 0


def fit_cmd(args) -> int:
    """Fit the planner's constants to the runs of a CSV file, print each run's error before and after, write the
    profile `plan --profile` reads."""
    from fsdp_mini.course.planner.calibration import save_profile
    from fsdp_mini.course.planner.fitting import fit_runs
    from fsdp_mini.course.planner.runs_file import read_runs

    runs = read_runs(args.runs)
    result = fit_runs(runs)
    print(f"{len(runs)} runs of {args.runs}; fitted: {', '.join(result.fitted)}; predicted / measured - 1 with the "
          f"shipped constants (before) and the fitted ones (after)")
    print(result.report())
    save_profile(result.after, args.out, fitted=list(result.fitted), undetermined=result.undetermined,
                 runs=len(runs), source=os.path.basename(args.runs))
    print(f"wrote {args.out}: python -m fsdp_mini plan ... --profile {args.out}")
    return 0


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose help shows each option's default; the subcommands' parsers are of this class
    too (`add_subparsers(parser_class=...)`), also those that other modules register (bench, simulate)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", argparse.ArgumentDefaultsHelpFormatter)
        super().__init__(*args, **kwargs)


def _subcommand(argv: list[str]) -> str | None:
    """The subcommand `argv` names (its first argument that is not an option), or None."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line: every subcommand, every option with its help and its default. `only`: a subcommand
    of this module about to run, so `bench` and `simulate`, whose modules load torch, are left out."""
    parser = _Parser(prog="python -m fsdp_mini", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    d = sub.add_parser("demo", help="train a small GPT under every strategy, side by side with PyTorch")
    d.add_argument("--world-size", type=int, default=4, help="ranks to launch (under torchrun: its WORLD_SIZE)")
    d.add_argument("--no-pytorch", action="store_true", help="skip the comparison with PyTorch DDP / FSDP2")
    d.add_argument("--timeout", type=float, default=300, help="seconds before a hung run is stopped and explained")
    d.set_defaults(func=demo)
    r = sub.add_parser("ring-demo", help="ring and naive all-reduce, with their CommLog")
    r.add_argument("--world-size", type=int, default=4, help="ranks to launch (under torchrun: its WORLD_SIZE)")
    r.add_argument("--timeout", type=float, default=120, help="seconds before a hung run is stopped and explained")
    r.set_defaults(func=ring_demo)
    b = sub.add_parser("bench-collectives", help="ring vs builtin collectives, nccl-tests style")
    b.add_argument("--world-size", type=int, default=2, help="ranks to launch (under torchrun: its WORLD_SIZE)")
    b.add_argument("--sizes", default="4K,64K,1M,16M,64M", help="message sizes, comma-separated, e.g. 4K,1M,64M")
    b.add_argument("--iters", type=int, default=5, help="timed iterations per collective and size")
    b.add_argument("--warmup", type=int, default=1, help="untimed iterations first")
    b.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    b.add_argument("--timeout", type=float, default=600, help="seconds before a hung run is stopped and explained")
    b.set_defaults(func=bench_collectives_cmd)
    g = sub.add_parser("diagnose", help="where the ranks of a hung or failed job diverged, from their flight records")
    g.add_argument("folder", help="the folder of the ranks' flight records (files rank<r>.flight): the one a "
                                  "failed rank's error names, or FSDP_MINI_FLIGHT_DIR")
    g.set_defaults(func=diagnose_cmd)
    D = LAYOUT_DEFAULTS
    p = sub.add_parser("plan", help="which layout fits a model on a cluster, and how fast it trains (estimates)")
    p.add_argument("--model", required=True, help=f"a preset ({', '.join(MODELS)}) or a path to a Hugging Face "
                   f"config.json ({', '.join(ARCHITECTURES)})")
    p.add_argument("--gpu", required=True, help=f"a preset ({', '.join(GPUS)}) or a path to a JSON file with a "
                   "preset's fields")
    p.add_argument("--gpus", type=int, required=True, help="GPUs in all")
    p.add_argument("--gpus-per-node", type=int, default=D["gpus_per_node"], help="GPUs per node (NVLink inside, "
                                                                                  "network between)")
    p.add_argument("--dp-replicate", type=int, default=D["dp_replicate"], help="HSDP replicas (FSDP shards over gpus / "
                                                                               "(dp-replicate x tp x cp))")
    p.add_argument("--tp", type=int, default=D["tp"], help="tensor-parallel degree")
    p.add_argument("--sp", action="store_true", help="sequence parallelism with TP")
    p.add_argument("--sp-variant", default=D["sp_variant"], choices=SP_VARIANTS,
                   help="with --sp, what its column-parallel layers keep for backward: the gathered input (pytorch) "
                        "or its shard, all-gathered again in backward (megatron: less memory, one more AllGather "
                        "per layer)")
    p.add_argument("--cp", type=int, default=D["cp"], help="context-parallel degree (ring attention over the sequence)")
    p.add_argument("--seq", type=int, required=True, help="tokens per sequence (the whole sequence: CP splits it)")
    p.add_argument("--local-batch", type=int, required=True, help="sequences per data-parallel rank (its TP and CP "
                                                                  "ranks share them)")
    p.add_argument("--micro-batches", type=int, default=D["micro_batches"], help="gradient-accumulation steps the "
                                                                                  "local batch is split into")
    p.add_argument("--tp-overlap", action="store_true", help="with --tp > 1, overlap each column-parallel layer's "
                   "backward collectives with its weight-gradient product, as Megatron-LM does")
    p.add_argument("--no-sync", action="store_true", help="with --micro-batches > 1, reduce-scatter the gradients "
                   "once a step, not once per micro-batch (FSDP2's set_requires_gradient_sync(False); unsharded fp32 "
                   "gradients accumulate)")
    p.add_argument("--ac", default=D["ac"].value, choices=[c.value for c in Checkpointing],
                   help="activation checkpointing (selective-layer: every 2nd block)")
    p.add_argument("--float8", action="store_true", help="float8 linears (compute and FSDP AllGather)")
    p.add_argument("--compile", action="store_true", help="torch.compile each block: fused memory-bound ops, fewer "
                                                          "saved intermediates")
    p.add_argument("--compile-loss", action="store_true", help="torch.compile the loss too: no fp32 copies of the "
                                                                "logits (torchtitan's --training.compile since 2025)")
    p.add_argument("--profile", metavar="PROFILE.json", help="the constants `fit` wrote for your own stack, in place "
                                                             "of those fitted to torchtitan's runs")
    p.add_argument("--compare", action="store_true", help="rank every layout of these GPUs and this global batch")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.set_defaults(func=plan_cmd)
    f = sub.add_parser("fit", help="fit the planner's constants to your own measured runs (a CSV of plan's flags)")
    f.add_argument("runs", metavar="RUNS.csv", help="one run a row; header: plan's flags without the dashes (model,gpu,"
                                                    "gpus,seq,local_batch,ac,...; a missing column takes the flag's "
                                                    "default), tokens_per_s_per_gpu and, optionally, memory_gib")
    f.add_argument("--out", required=True, metavar="PROFILE.json", help="where to write the fitted constants")
    f.set_defaults(func=fit_cmd)
    if only not in sub.choices:  # not one of the subcommands above
        from fsdp_mini.course import simulate
        from fsdp_mini.course.bench import command as bench_command

        bench_command.add_subcommand(sub)
        simulate.add_subcommand(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(_subcommand(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as exc:
        parser.error(str(exc))


def entry_point() -> None:
    """`python -m fsdp_mini` and the `fsdp-mini` script: run `main`, then exit with its code; a torchrun
    rank ends without interpreter shutdown (see `fsdp_mini.finish`)."""
    code = main()
    if "RANK" in os.environ:  # possibly under torchrun: its rank ends as `finish` says
        from fsdp_mini.runtime import finish, under_torchrun

        if under_torchrun():
            finish(code)
    sys.exit(code)
