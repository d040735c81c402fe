"""What lesson 12 measures on its ranks beyond one CommLog: what the LayerNorms keep for backward under TP and
under TP + SP, and what flows into and out of a module of a PyTorch-parallelized model.

Why a module: the measurement is plumbing (hooks that open and close a tracker around each norm, hooks that
write down a tensor's type and placements), while the lesson's cell should show the step it measures and the
asserts on the result. The cells call these functions inside `launch`, one step on two ranks.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from fsdp_mini.comm_log import CommLog, CommRecord
from fsdp_mini.course.models import GPT, GPTConfig, make_batch
from fsdp_mini.course.tensor_parallel_plan import gpt_sp_plan, gpt_tp_plan
from fsdp_mini.saved_activations import SavedActivations
from fsdp_mini.tensor.parallel.parallelize import ParallelDims, parallelize_module

__all__ = ["StepProbe", "tp_or_sp_step", "describe", "watch_placements"]


@dataclass(frozen=True)
class StepProbe:
    """One training step of the course GPT on a TP group, as one rank saw it."""

    parallelism: str  # "TP", "TP + SP (PyTorch)" (the gathered inputs kept) or "TP + SP (Megatron)" (their shards)
    sent: list[CommRecord]  # every collective CommLog recorded, forward and backward
    kept_by_norms: int  # bytes the LayerNorms saved for backward
    kept_by_rest: int  # bytes everything else saved for backward


def tp_or_sp_step(cfg: GPTConfig, batch_size: int, sequence_parallel: bool, tp: int = 2,
                  save_gathered_input: bool = True) -> StepProbe:
    """One step of the course GPT under `gpt_tp_plan` or `gpt_sp_plan` on a TP group of `tp` ranks (the whole
    world): what CommLog saw, and what the LayerNorms and the rest of the model keep for backward.
    `save_gathered_input=False`: SP as Megatron-LM runs it (the column-parallel layers keep their input's shard).

    Autograd packs a saved tensor with the innermost saved-tensor hooks only, so a tracker opened inside each
    LayerNorm's forward takes the norm's tensors and the outer tracker skips them."""
    model = GPT(cfg)
    if not save_gathered_input and not sequence_parallel:
        raise ValueError("save_gathered_input=False is a variant of sequence parallelism: pass sequence_parallel=True")
    plan = gpt_sp_plan(cfg, tp, save_gathered_input) if sequence_parallel else gpt_tp_plan(cfg, tp)
    parallelize_module(model, ParallelDims(1, tp, tp).build_mesh()["tp"], plan)
    kept_by_norms = []
    trackers: dict[nn.Module, SavedActivations] = {}

    def enter(norm, args):
        trackers[norm] = SavedActivations(exclude=model.parameters()).__enter__()

    def leave(norm, args, out):
        tracker = trackers.pop(norm)
        tracker.__exit__(None, None, None)
        kept_by_norms.append(tracker.nbytes)

    for norm in (m for m in model.modules() if isinstance(m, nn.LayerNorm)):
        norm.register_forward_pre_hook(enter)
        norm.register_forward_hook(leave)
    with CommLog() as log:
        with SavedActivations(exclude=model.parameters()) as the_rest:
            loss = model(*make_batch(cfg, batch_size))
        loss.backward()
    name = "TP" if not sequence_parallel else "TP + SP (PyTorch)" if save_gathered_input else "TP + SP (Megatron)"
    return StepProbe(name, list(log.records), sum(kept_by_norms), the_rest.nbytes)


def describe(t: torch.Tensor) -> str:
    """A tensor as the lesson prints it: its type, a DTensor's placements, and its shape (a DTensor's is
    global)."""
    placements = f" {t.placements}" if hasattr(t, "placements") else ""
    return f"{type(t).__name__}{placements} {tuple(t.shape)}"


def watch_placements(model: nn.Module, names) -> dict[str, dict[str, str]]:
    """Forward hooks on the submodules `names` that fill the returned dict as the model runs:
    {name: {"module": name, "input": describe(first input), "output": describe(output)}}."""
    seen: dict[str, dict[str, str]] = {}

    def record(name):
        def hook(module, args, out):  # returns None: the output stays as it is
            seen[name] = {"module": name, "input": describe(args[0]), "output": describe(out)}
        return hook

    for name in names:
        model.get_submodule(name).register_forward_hook(record(name))
    return seen
