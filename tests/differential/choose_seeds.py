"""Choose the CI set: seeds that together cover every feature the generator reaches, few and short.

    PYTHONPATH=tests python -m differential.choose_seeds [--avoid 12,40]

Greedy set cover over the first 2000 seeds (each pick: the most uncovered features per program step,
no compile unless it is the only way to cover a feature: compiling costs seconds). Then every chosen
seed is run, and those that differ for a reason outside the CI's KNOWN_BROKEN list are printed, to be
avoided (--avoid) in a second choice. Prints the tuple to paste into test_fixed_seeds.py.
"""
from __future__ import annotations

import argparse

from differential.compare import differences
from differential.execute import execute
from differential.generator import features_of, generate, reachable_features


def choose(avoid: set[int], seeds: int = 2000) -> list[int]:
    feats = {s: features_of(generate(s)) for s in range(seeds) if s not in avoid}
    todo, chosen = reachable_features(seeds), []
    while todo:
        def score(s):
            d = generate(s)
            cost = 1 + len(d["steps"]) + (20 if d["wrap"].get("compile") else 0) + (2 if d["world"] == 4 else 0)
            return len(feats[s] & todo) / cost
        best = max(feats, key=score)
        if not feats[best] & todo:
            break
        chosen.append(best)
        todo -= feats[best]
    return sorted(chosen)


def main() -> None:
    from differential.test_fixed_seeds import KNOWN_BROKEN
    ap = argparse.ArgumentParser()
    ap.add_argument("--avoid", default="")
    avoid = {int(s) for s in ap.parse_args().avoid.split(",") if s}
    chosen = choose(avoid)
    print(f"{len(chosen)} seeds: {tuple(chosen)}")
    descs = [generate(s) for s in chosen]
    for d, o in zip(descs, execute(descs)):
        broken = features_of(d) & set(KNOWN_BROKEN)
        findings = differences(d, o)[0]
        if findings and not broken:
            print(f"seed {d['seed']} differs outside KNOWN_BROKEN: {findings[0]}")


if __name__ == "__main__":
    main()
