"""`python -m fsdp_mini bench`: the command line of the benchmark (measure, or load a saved run, then report)."""
from __future__ import annotations

import json
import os

from fsdp_mini.course import simulate
from fsdp_mini.course.bench.cases import CASES, SIZES, parse_cases, parse_sizes
from fsdp_mini.course.bench.measure import environment, run
from fsdp_mini.course.bench.report import judge_by_size, plot, summarize, table, targets, targets_text
from fsdp_mini.course.language import LANGUAGES, set_language
from fsdp_mini.rank_environment import under_torchrun

__all__ = ["add_subcommand", "command", "print_report"]


def add_subcommand(sub) -> None:
    """Register `bench` on the CLI's subparsers."""
    b = sub.add_parser("bench", help="fsdp_mini vs PyTorch FSDP2 and DDP: step time, memory, bytes per step")
    b.add_argument("--world-sizes", default="2,4", help="comma-separated, e.g. 2,4")
    b.add_argument("--sizes", default="small,medium", help=f"comma-separated GPT sizes: {', '.join(SIZES)}")
    b.add_argument("--cases", default=",".join(CASES),
                   help="comma-separated: mini:STRATEGY[:noprefetch][:ring][:norecord], fully_shard:reshard, "
                        "fully_shard:noreshard, fsdp2:reshard, fsdp2:noreshard, ddp, compute")
    b.add_argument("--reps", type=int, default=5, help="interleaved rounds over the cases")
    b.add_argument("--steps", type=int, default=3, help="timed steps per case and round")
    b.add_argument("--warmup", type=int, default=2, help="untimed steps per case first")
    b.add_argument("--no-calibrate", action="store_true", help="skip measuring the collectives for simulate")
    b.add_argument("--calibration-iters", type=int, default=10, help="iterations per collective and size")
    b.add_argument("--simulate", action="store_true", help="also print fsdp_mini.course.simulate's prediction")
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
    set_language(args.language)
    if args.load:
        with open(args.load) as f:
            return print_report(json.load(f), args)
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
    return print_report(report, args)


def print_report(report: dict, args) -> int:
    """Print a run's table and targets (and the simulation); write the plot."""
    env, rows = report["environment"], report["rows"]
    items, note = judge_by_size(report["targets"])
    a = report["args"]
    load = (f"; load average {env['load_before'][0]:.1f} before, {env['load_after'][0]:.1f} after"
            if env.get("load_before") else "")
    print(f"fsdp_mini bench: gloo on {env['cpus']} CPUs, {report['results'][0].get('threads', '?')} thread(s) "
          f"per rank, torch {env['torch']}; {a['reps']} interleaved rounds x {a['steps']} steps per case{load}")
    print(table(rows))
    if items:
        print("\nperformance targets:")
        if note:
            print(note)
        print(targets_text(items))
    if args.simulate:
        print()
        print(simulate.report(report))
    if args.json and not args.load:
        print(f"wrote {args.json}")
    if args.plot:
        plot(rows, args.plot)
        print(f"wrote {args.plot}")
    return 0
