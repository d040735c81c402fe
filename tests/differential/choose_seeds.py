"""Choose the CI set: seeds that together cover every feature the generator reaches, few and short.

    PYTHONPATH=tests python -m differential.choose_seeds [--avoid 12,40] [--cover 2]

Greedy set cover over the first 2000 seeds (each pick: the most uncovered features per program step,
no compile unless it is the only way to cover a feature: compiling costs seconds), first among seeds that
use nothing in KNOWN_BROKEN, then one seed per broken feature (skipped until it is fixed). Then every chosen
seed is run, and those that differ for a reason outside the CI's KNOWN_BROKEN list are printed, to be
avoided (--avoid) in a second choice. Prints the tuple to paste into test_fixed_seeds.py.
"""
from __future__ import annotations

import argparse

from differential.compare import differences
from differential.execute import execute
from differential.generator import features_of, generate, reachable_features


def _cover(todo: set[str], feats: dict[int, set[str]], chosen: list[int]) -> set[str]:
    """Greedy: add seeds of `feats` to `chosen` until `todo` is covered or nothing more can be; the rest."""
    while todo:
        def score(s):
            d = generate(s)
            cost = 1 + len(d["steps"]) + (20 if d["wrap"].get("compile") else 0) + (2 if d["world"] == 4 else 0)
            return len(feats[s] & todo) / cost
        best = max(feats, key=score)
        if not feats[best] & todo:
            break
        chosen.append(best)
        todo = todo - feats[best]
    return todo


def choose(avoid: set[int], broken: set[str], seeds: int = 2000) -> list[int]:
    """Seeds covering every reachable feature: first from seeds that use nothing in `broken` (they run in
    CI today), then, for what only broken seeds reach, seeds using one broken feature each where possible
    (skipped until its fix lands, then they check that fix)."""
    feats = {s: features_of(generate(s)) for s in range(seeds) if s not in avoid}
    chosen: list[int] = []
    clean = {s: f for s, f in feats.items() if not f & broken}
    rest = _cover(reachable_features(seeds), clean, chosen)
    for b in sorted(broken):
        if b in rest:
            single = {s: f for s, f in feats.items() if len(f & broken) == 1 and b in f}
            rest = _cover(rest, single or {s: f for s, f in feats.items() if b in f}, chosen)
    _cover(rest, feats, chosen)
    return sorted(chosen)


def main() -> None:
    from differential.test_fixed_seeds import KNOWN_BROKEN
    ap = argparse.ArgumentParser()
    ap.add_argument("--avoid", default="")
    ap.add_argument("--cover", type=int, default=2, help="how many times each feature is covered (disjoint covers)")
    args = ap.parse_args()
    avoid = {int(s) for s in args.avoid.split(",") if s}
    chosen: list[int] = []
    for _ in range(args.cover):
        chosen = sorted(chosen + choose(avoid | set(chosen), set(KNOWN_BROKEN)))
    print(f"{len(chosen)} seeds: {tuple(chosen)}")
    descs = [generate(s) for s in chosen]
    for d, o in zip(descs, execute(descs)):
        broken = features_of(d) & set(KNOWN_BROKEN)
        findings = differences(d, o)[0]
        if findings and not broken:
            print(f"seed {d['seed']} differs outside KNOWN_BROKEN: {findings[0]}")


if __name__ == "__main__":
    main()
