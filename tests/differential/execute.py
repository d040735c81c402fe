"""Many descriptions per launch of the world: starting ranks (fork, gloo rendezvous, first-call costs) is
the main cost, so every description of one world size runs in one launch, both implementations one after
the other on the same ranks (as tests/library/test_fsdp2_differential.py does), with a barrier between
programs. Every launch has a timeout. A launch that fails (a crash, a hang, ranks out of step after an
error on one rank only) is split in halves and run again, down to one description and then one
implementation alone, so one bad program costs a few launches and never the others' results.
"""
from __future__ import annotations

import tempfile
import warnings

import torch
import torch.distributed as dist

from fsdp_mini import LaunchError, launch
from differential import runner

IMPLS = ("fsdp_mini", "torch")


def _timeout(descs: list[dict], impls) -> float:
    compiled = sum(1 for d in descs for s in [d["wrap"]] + [x.get("rewrap", {}) for x in d["steps"]]
                   if s.get("compile"))
    return 30.0 + len(impls) * (2.0 * len(descs) + 40.0 * compiled)


def _on_ranks(descs: list[dict], impls: tuple, folder: str) -> list[dict]:
    warnings.simplefilter("ignore")  # FSDP1's deprecations, ShardedTensor's: thousands of lines, no finding
    out = []
    for desc in descs:
        per = {}
        for impl in impls:
            per[impl] = runner.run(desc, impl, folder)
            if desc["wrap"].get("compile"):
                torch._dynamo.reset()
            dist.barrier()
        out.append(per)
    return out


def _launch(descs: list[dict], impls: tuple) -> list[dict]:
    """[{impl: [events of rank 0, rank 1, ...]}] for each description, or raises LaunchError."""
    world = descs[0]["world"]
    with tempfile.TemporaryDirectory(prefix="differential_") as folder:
        per_rank = launch(_on_ranks, world, args=(descs, impls, folder), timeout=_timeout(descs, impls),
                          capture_output=True)
    return [{impl: [rank[i][impl] for rank in per_rank] for impl in impls} for i in range(len(descs))]


def _isolated(descs: list[dict], impls: tuple = IMPLS) -> list[dict]:
    try:
        return _launch(descs, impls)
    except LaunchError as exc:
        if len(descs) > 1:
            half = len(descs) // 2
            return _isolated(descs[:half], impls) + _isolated(descs[half:], impls)
        if len(impls) > 1:
            return [{impl: _isolated(descs, (impl,))[0][impl] for impl in impls}]
        kind = "hang" if "Timeout" in type(exc).__name__ else "crash"
        text = str(exc).strip().splitlines()
        event = {"op": "launch", "error": f"{kind}: {text[0][:300] if text else type(exc).__name__}"}
        return [{impls[0]: [[event]] * descs[0]["world"]}]


def execute(descs: list[dict]) -> list[dict]:
    """The observations of every description, in order: {impl: [events per rank]}. One launch per
    world size (more only when one fails)."""
    results: list[dict | None] = [None] * len(descs)
    for world in sorted({d["world"] for d in descs}):
        idx = [i for i, d in enumerate(descs) if d["world"] == world]
        batch = [dict(descs[i], index=i) for i in idx]
        for i, obs in zip(idx, _isolated(batch)):
            results[i] = obs
    return results
