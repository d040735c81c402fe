"""seed -> a program description: plain data (dicts, lists, strings, numbers) that prints, compares and
pastes into a test file. The same seed always gives the same description (`random.Random(seed)`).

A description: the design ("flat": fsdp_mini.FSDP against FSDP1; "per_param": fsdp_mini.fully_shard
against FSDP2), the world size, the model's features (`models.FEATURES`), the wrapping (policy, HSDP,
strategy, compile), the optimizer, and the steps of the program (`STEP_OPS`), run in order.
"""
from __future__ import annotations

import random

from differential.models import FEATURES

STEP_OPS = ("train", "eval", "nograd", "state_dict", "load_state_dict", "freeze", "unfreeze", "to",
            "checkpoint")
FLAT_POLICIES = ("blocks", "none", "linear")
PER_PARAM_POLICIES = ("blocks", "root", "group", "partial", "blocks_noroot", "linear")
FLAT_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD")


def wrapping(rng: random.Random, design: str, world: int, depth: int) -> dict:
    """A random wrapping of `design` at `world` ranks (HSDP only at world 4: a 2 x 2 mesh)."""
    hsdp = world == 4 and rng.random() < 0.5
    if design == "flat":
        strategy = "HYBRID_SHARD" if hsdp else rng.choice(FLAT_STRATEGIES)
        return {"policy": rng.choice(FLAT_POLICIES), "strategy": strategy, "hsdp": hsdp, "compile": None}
    policies = [p for p in PER_PARAM_POLICIES if depth >= 2 or p != "group"]
    return {"policy": rng.choice(policies), "hsdp": hsdp, "reshard_after_forward": rng.random() < 0.7,
            "compile": None}


def generate(seed: int) -> dict:
    rng = random.Random(seed)
    design = rng.choice(("flat", "per_param"))
    world = rng.choice((2, 2, 4))
    depth = rng.randint(1, 3)
    model = {"width": rng.choice((4, 6, 8)), "depth": depth}
    model.update({f: rng.random() < 0.25 for f in FEATURES})
    wrap = wrapping(rng, design, world, depth)
    if rng.random() < 0.08:
        wrap["compile"] = "blocks"
    optim = {"kind": rng.choice(("sgd", "adamw")), "lr": rng.choice((0.05, 0.1))}
    steps = []
    for _ in range(rng.randint(1, 6)):
        op = rng.choices(STEP_OPS, weights=(8, 2, 1, 2, 2, 1, 1, 1, 1))[0]
        step = {"op": op}
        if op == "train":
            step.update(accum=rng.choice((1, 1, 2, 3)), no_sync=rng.random() < 0.5,
                        clip=rng.choice((None, None, 0.5)))
        elif op in ("state_dict", "load_state_dict"):
            step["of"] = rng.choice(("model", "owner"))
        elif op == "freeze":
            step["path"] = rng.choice(["emb", "heads.main"] + [f"blocks.{i}" for i in range(depth)])
        elif op == "unfreeze":
            step["path"] = "emb"
        elif op == "to":
            step["dtype"] = rng.choice(("float64", "bfloat16"))
        elif op == "checkpoint":
            # load at another world size (a second launch), at most once per program
            other = 6 - world if rng.random() < 0.4 and not any("world" in s for s in steps) else world
            if other != world:
                step["world"] = other
            step["rewrap"] = wrapping(rng, design, other, depth)
        steps.append(step)
    if any(s["op"] == "checkpoint" for s in steps):
        # fully_shard on the blocks alone leaves the other parameters unsynced: ranks drift apart, and a
        # checkpoint keeps one rank's copy, each implementation its own choice
        for w in [wrap] + [s["rewrap"] for s in steps if s["op"] == "checkpoint"]:
            if w["policy"] == "blocks_noroot":
                w["policy"] = "blocks"
    if not any(s["op"] == "train" for s in steps):
        steps.append({"op": "train", "accum": 1, "no_sync": False, "clip": None})
    return {"seed": seed, "design": design, "world": world, "model": model, "wrap": wrap, "optim": optim,
            "steps": steps}


def features_of(desc: dict) -> set[str]:
    """Names of what a description exercises (for the CI set's coverage and the known-broken list)."""
    out = {f"design:{desc['design']}", f"world:{desc['world']}", f"optim:{desc['optim']['kind']}"}
    out |= {f"model:{f}" for f in FEATURES if desc["model"].get(f)}
    w = desc["wrap"]
    out |= {f"policy:{w['policy']}", f"hsdp:{w['hsdp']}"}
    if w.get("strategy"):
        out.add(f"strategy:{w['strategy']}")
    if w.get("compile"):
        out.add(f"compile:{w['compile']}")
    if w.get("reshard_after_forward") is False:
        out.add("reshard_after_forward:False")
    for s in desc["steps"]:
        out.add(f"op:{s['op']}")
        if s["op"] == "train":
            out |= {f"train:accum{s['accum']}"} | ({"train:no_sync"} if s["no_sync"] and s["accum"] > 1 else set())
            out |= {"train:clip"} if s["clip"] else set()
        if s.get("of"):
            out.add(f"op:{s['op']}:{s['of']}")
        if s.get("world"):
            out.add("op:checkpoint:other_world")
        if s["op"] == "checkpoint" and not any(t["op"] == "train" for t in desc["steps"][:desc["steps"].index(s)]):
            out.add("op:checkpoint:before_training")
        if s.get("dtype"):
            out.add(f"op:to:{s['dtype']}")
    # the same, per design: a feature can be broken in one design only
    return out | {f"{desc['design']}:{f}" for f in out if f.split(":")[0] in ("model", "op", "compile", "train")}


def reachable_features(seeds: int = 2000) -> set[str]:
    """Every feature the generator produces within the first `seeds` seeds (what the CI set must cover)."""
    out: set[str] = set()
    for s in range(seeds):
        out |= features_of(generate(s))
    return out
