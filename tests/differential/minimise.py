"""Shrink a description that differs while it still differs the same way (same step kind, same field):
drop steps, switch model features off, simplify the wrapping, the steps and the optimizer.

Each round builds every one-change-smaller candidate and runs them in batches, a launch per batch and
world size (starting ranks costs more than a small program); the first candidate that still shows the
difference becomes the description, until no candidate does (or `rounds` is spent).
"""
from __future__ import annotations

import copy

from differential.compare import Difference, differences
from differential.execute import execute
from differential.models import FEATURES


def _wrap_simpler(wrap: dict, design: str, depth: int) -> list[dict]:
    out = []
    if wrap.get("compile"):
        out.append(dict(wrap, compile=None))
    if wrap["hsdp"]:
        out.append(dict(wrap, hsdp=False, **({"strategy": "FULL_SHARD"} if design == "flat" else {})))
    for policy in (("none", "blocks") if design == "flat" else ("root", "blocks")):
        if wrap["policy"] != policy and not (policy == "blocks" and wrap["policy"] in ("none", "root")):
            out.append(dict(wrap, policy=policy))
    if design == "flat" and wrap["strategy"] not in ("FULL_SHARD", "HYBRID_SHARD"):
        out.append(dict(wrap, strategy="FULL_SHARD"))
    if design == "per_param" and wrap["reshard_after_forward"] is False:
        out.append(dict(wrap, reshard_after_forward=True))
    return out


def candidates(desc: dict) -> list[dict]:
    """Every description one change smaller than `desc`, biggest cuts first."""
    out = []

    def variant(change):
        d = copy.deepcopy(desc)
        change(d)
        out.append(d)

    steps = desc["steps"]
    for i in range(len(steps)):
        if len(steps) > 1:
            variant(lambda d, i=i: d["steps"].pop(i))
    for f in FEATURES:
        if desc["model"].get(f):
            variant(lambda d, f=f: d["model"].__setitem__(f, False))
    depth = desc["model"]["depth"]
    if depth > 1 and not (depth == 2 and desc["wrap"]["policy"] == "group"):
        variant(lambda d: d["model"].__setitem__("depth", depth - 1))
    if desc["model"]["width"] != 4:
        variant(lambda d: d["model"].__setitem__("width", 4))
    for w in _wrap_simpler(desc["wrap"], desc["design"], depth):
        variant(lambda d, w=w: d.__setitem__("wrap", w))
    uses_hsdp = desc["wrap"]["hsdp"] or any(s.get("rewrap", {}).get("hsdp") for s in steps)
    if desc["world"] == 4 and not uses_hsdp and not any(s.get("world") == 2 for s in steps):
        variant(lambda d: d.__setitem__("world", 2))
    for i, s in enumerate(steps):
        if s["op"] == "train":
            for key, simple in (("accum", 1), ("no_sync", False), ("clip", None)):
                if s[key] != simple:
                    variant(lambda d, i=i, key=key, simple=simple: d["steps"][i].__setitem__(key, simple))
        if s["op"] == "checkpoint" and "world" in s:
            variant(lambda d, i=i: (d["steps"][i].pop("world"),
                                    d["steps"][i].__setitem__("rewrap", copy.deepcopy(d["wrap"]))))
        elif s["op"] == "checkpoint" and s["rewrap"] != desc["wrap"]:
            variant(lambda d, i=i: d["steps"][i].__setitem__("rewrap", copy.deepcopy(d["wrap"])))
        if s["op"] == "to" and s["dtype"] != "float64":
            variant(lambda d, i=i: d["steps"][i].__setitem__("dtype", "float64"))
    if desc["optim"]["kind"] != "sgd":
        variant(lambda d: d.__setitem__("optim", dict(d["optim"], kind="sgd")))
    return out


def minimise(desc: dict, target: Difference, rounds: int = 40, log=print) -> tuple[dict, Difference]:
    """(the smallest description found that still shows `target`'s kind of difference, that difference)."""
    for _ in range(rounds):
        cands = candidates(desc)
        found = None
        # in small batches: the first candidate that still differs is taken, so running all of them would
        # mostly be wasted (a compiled program takes many seconds; a launch about one)
        size = 2 if desc["wrap"].get("compile") else 8
        for start in range(0, len(cands), size):
            batch = cands[start:start + size]
            for cand, obs in zip(batch, execute(batch)):
                same = [d for d in differences(cand, obs)[0] if d.signature == target.signature]
                if same:
                    found = cand, same[0]
                    break
            if found:
                break
        if not found:
            break
        desc, target = found
        log(f"  minimised to {len(desc['steps'])} steps: {target}")
    return desc, target
