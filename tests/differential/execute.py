"""Many descriptions per launch of the world: starting ranks (fork, gloo rendezvous, first-call costs) is the
main cost, so every description of one world size runs in one launch, both implementations one after the other
on the same ranks (as tests/library/test_fsdp2_differential.py does), with a barrier between programs. Where
PyTorch raised, or the two computed different values, the program runs a third time unsharded ("plain": the
same model on every rank, gradients averaged by hand): the reference that says which one is right (not for a
program that reloads at another world size). Every launch has a timeout. A launch that fails (a crash, a hang,
ranks out of step after an error on one rank only) is split in halves and run again, down to one description
and then one implementation alone, so one bad program costs a few launches and never the others' results.
"""
from __future__ import annotations

import tempfile
import warnings

import torch
import torch.distributed as dist

from fsdp_mini import LaunchError, launch
from differential import compare, known, runner

IMPLS = ("fsdp_mini", "torch")


def _timeout(descs: list[dict], impls) -> float:
    compiled = sum(1 for d in descs for s in [d["wrap"]] + [x.get("rewrap", {}) for x in d["steps"]]
                   if s.get("compile"))
    return 30.0 + len(impls) * (2.0 * len(descs) + 40.0 * compiled)


def _on_ranks(descs: list[dict], impls: tuple, folder: str, phase: int = 1) -> list[dict]:
    warnings.simplefilter("ignore")  # FSDP1's deprecations, ShardedTensor's: thousands of lines, no finding
    out = []
    for desc in descs:
        per = {}
        for impl in impls:
            per[impl] = runner.run(desc, impl, folder, phase)
            if desc["wrap"].get("compile"):
                torch._dynamo.reset()
            dist.barrier()
        if "torch" in impls and runner.cross_world_step(desc) is None and _needs_reference(desc, per):
            per["plain"] = runner.run(desc, "plain", folder, phase)  # the reference where torch has none
            if desc["wrap"].get("compile"):
                torch._dynamo.reset()
            dist.barrier()
        out.append(per)
    return out


def _world(desc: dict, phase: int) -> int:
    k = runner.cross_world_step(desc)
    return desc["steps"][k]["world"] if phase == 2 else desc["world"]


def _needs_reference(desc: dict, per: dict) -> bool:
    """Whether the unsharded model must decide, on any rank (decided together: its run has collectives):
    PyTorch raised, or the two computed different values (a loss, an output, a parameter), where either
    may be the wrong one."""
    events = per["torch"]
    values_differ = any(d.field in known.VALUES for d in compare.pairwise(desc, [per["fsdp_mini"]], [events], "torch"))
    flag = torch.tensor([float(values_differ or any("error" in e for e in events))])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def _launch(descs: list[dict], impls: tuple, folder: str, phase: int) -> list[dict]:
    """[{impl: [events of rank 0, rank 1, ...]}] for each description, or raises LaunchError."""
    per_rank = launch(_on_ranks, _world(descs[0], phase), args=(descs, impls, folder, phase),
                      timeout=_timeout(descs, impls), capture_output=True)
    return [{impl: [rank[i][impl] for rank in per_rank] for impl in per_rank[0][i]} for i in range(len(descs))]


def _isolated(descs: list[dict], folder: str, phase: int, impls: tuple = IMPLS) -> list[dict]:
    try:
        return _launch(descs, impls, folder, phase)
    except LaunchError as exc:
        if len(descs) > 1:
            half = len(descs) // 2
            return _isolated(descs[:half], folder, phase, impls) + _isolated(descs[half:], folder, phase, impls)
        if len(impls) > 1:
            merged: dict = {}
            for impl in impls:
                merged.update(_isolated(descs, folder, phase, (impl,))[0])
            return [merged]
        kind = "hang" if "Timeout" in type(exc).__name__ else "crash"
        text = str(exc).strip().splitlines()
        event = {"op": "launch", "error": f"{kind}: {text[0][:300] if text else type(exc).__name__}"}
        return [{impls[0]: [[event]] * _world(descs[0], phase)}]


def execute(descs: list[dict]) -> list[dict]:
    """The observations of every description, in order: {impl: [events per rank]}. One launch per
    world size (more only when one fails)."""
    results: list[dict] = [{} for _ in descs]
    descs = [dict(d, index=i) for i, d in enumerate(descs)]
    with tempfile.TemporaryDirectory(prefix="differential_") as folder:
        for phase in (1, 2):  # 2: programs that load a checkpoint at another world size, from the load on
            todo = [d for d in descs if phase == 1 or runner.cross_world_step(d) is not None]
            for world in sorted({_world(d, phase) for d in todo}):
                batch = [d for d in todo if _world(d, phase) == world]
                for d, obs in zip(batch, _isolated(batch, folder, phase)):
                    _merge(results[d["index"]], obs, phase)
    return results


def _merge(into: dict, obs: dict, phase: int) -> None:
    """Phase 1's events per rank; phase 2's appended rank by rank (a rank phase 1 did not have starts
    empty), unless phase 1 did not reach its save."""
    for impl, per_rank in obs.items():
        if phase == 1:
            into[impl] = per_rank
            continue
        mine = into.get(impl)
        saved = mine is not None and all(events and events[-1]["op"] == "save" and "error" not in events[-1]
                                         for events in mine)
        if not saved:
            continue
        for r, events in enumerate(per_rank):
            if r < len(mine):
                mine[r] = mine[r] + events
            else:
                mine.append(list(events))
