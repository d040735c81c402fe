"""`make fuzz MINUTES=30`: random seeds, in batches (one launch per world size per batch), until the time
is up; prints how many programs ran and every difference; minimises the first program of each distinct
difference and writes it as a failing test case (tests/differential/found/seed_<seed>.py, run by test_found.py).

    PYTHONPATH=tests python -m differential.fuzz --minutes 15 [--start SEED] [--batch 32] [--no-write]

Seeds run from --start upwards (default: derived from the clock, printed), so a run is reproducible.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time

from differential import writer
from differential.compare import differences
from differential.execute import execute
from differential.generator import generate
from differential.minimise import minimise


def _kind(desc: dict, diff) -> tuple:
    """What makes two differences the same finding: design, step kind, field and the words of the text
    (numbers and names of parameters stripped)."""
    words = re.sub(r"\S*[0-9_.]\S*|'[^']*'|\[[^\]]*\]|\([^)]*\)", "#", diff.text).split()[:7]
    return desc["design"], diff.op, diff.field, " ".join(words)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--start", type=int, default=None)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seeds", default=None, help="only these seeds (comma-separated), then stop")
    ap.add_argument("--no-write", action="store_true", help="print, do not write test files")
    ap.add_argument("--log", default=None, help="append each finding as a JSON line to this file")
    args = ap.parse_args(argv)
    start = args.start if args.start is not None else int(time.time()) % 1_000_000 * 100
    deadline = time.monotonic() + args.minutes * 60
    print(f"fuzzing from seed {start} for {args.minutes} min", flush=True)
    seed, ran, known_count, seen = start, 0, 0, {}
    only = [int(s) for s in args.seeds.split(",")] if args.seeds else None
    while time.monotonic() < deadline and (only is None or seed == start):
        batch = only or range(seed, seed + args.batch)
        descs = [generate(s) for s in batch]
        seed += args.batch
        for desc, obs in zip(descs, execute(descs)):
            ran += 1
            findings, known = differences(desc, obs)
            known_count += len(known)
            # the first difference of a program is its finding: later ones are mostly its consequences
            # (a step that went wrong changes every value after it)
            for diff in findings[:1]:
                kind = _kind(desc, diff)
                if kind in seen:
                    seen[kind]["seeds"].append(desc["seed"])
                    continue
                print(f"[seed {desc['seed']}] {desc['design']}: {diff}", flush=True)
                for later in findings[1:]:
                    print(f"    then {later}", flush=True)
                seen[kind] = {"seeds": [desc["seed"]], "diff": diff, "desc": desc}
                if time.monotonic() < deadline:
                    small, small_diff = minimise(desc, diff, log=lambda m: print(m, flush=True))
                    seen[kind].update(desc=small, diff=small_diff)
                    print(f"  minimal: {json.dumps({k: v for k, v in small.items() if k != 'index'})}", flush=True)
                    if not args.no_write:
                        print(f"  written: {writer.write(small, small_diff)}", flush=True)
                if args.log:
                    with open(args.log, "a", encoding="utf-8") as f:
                        f.write(json.dumps({"kind": list(kind), "diff": str(seen[kind]["diff"]),
                                            "desc": seen[kind]["desc"]}) + "\n")
    print(f"\n{ran} programs ran (seeds {start}..{seed - 1}); {known_count} known differences set apart; "
          f"{len(seen)} distinct differences:")
    for kind, item in seen.items():
        print(f"- {item['diff']}  [{kind[0]}; {len(item['seeds'])} programs, e.g. seeds {item['seeds'][:5]}]")
    return 1 if seen else 0


if __name__ == "__main__":
    sys.exit(main())
