"""The planner: which layout fits a model on a cluster, and how fast it trains, from shapes and specifications.

    from fsdp_mini.course.planner import plan, get_model, get_gpu, Layout
    result = plan(get_model("llama3-8b"), get_gpu("h100-sxm"), Layout(gpus=64, seq=8192, local_batch=1))
    result.memory.verdict(), result.time.tokens_per_s_per_gpu, result.time.mfu

One concept per module: `models` (presets and parameter counts), `hardware` (GPU presets with sources),
`layout` (degrees, switches, their checks), `activations` (what a block saves per checkpointing mode),
`memory` (the per-GPU breakdown and peak), `step_time` (work, links, overlap), `calibration` (the three
fitted constants, and profiles of them), `validation` (the published rows they were fitted on), `compare` (every
layout ranked); for models, GPUs and runs of your own: `hf_config` (a model from a Hugging Face `config.json`),
`arguments` (what `--model`, `--gpu` and the layout flags accept), `fitting` (the constants fitted to measured
runs), `runs_file` (a CSV of measured runs).
Course floor: the library never imports it.
"""
from __future__ import annotations

from dataclasses import dataclass

from fsdp_mini.course.planner.calibration import CALIBRATION, Calibration
from fsdp_mini.course.planner.hardware import GPU, GPUS, GiB, get_gpu
from fsdp_mini.course.planner.layout import Checkpointing, Layout
from fsdp_mini.course.planner.memory import MemoryBreakdown, memory_breakdown
from fsdp_mini.course.planner.models import MODELS, ModelSpec, custom_model, get_model
from fsdp_mini.course.planner.step_time import StepTime, step_time

__all__ = ["Plan", "plan", "ModelSpec", "MODELS", "get_model", "custom_model", "GPU", "GPUS", "get_gpu", "GiB",
           "Layout", "Checkpointing", "MemoryBreakdown", "memory_breakdown", "StepTime", "step_time",
           "Calibration", "CALIBRATION"]


@dataclass(frozen=True)
class Plan:
    """One model on one cluster under one layout: its memory per GPU and its step time."""

    model: ModelSpec
    gpu: GPU
    layout: Layout
    memory: MemoryBreakdown
    time: StepTime

    def to_dict(self) -> dict:
        """What `python -m fsdp_mini plan --json` prints."""
        t, m = self.time, self.memory
        return {
            "model": self.model.name, "gpu": self.gpu.name, "params": self.model.params,
            "layout": {"gpus": self.layout.gpus, "gpus_per_node": self.layout.gpus_per_node,
                       "dp_replicate": self.layout.dp_replicate, "dp_shard": self.layout.dp_shard,
                       "tp": self.layout.tp, "sp": self.layout.sp, "sp_variant": self.layout.sp_variant,
                       "cp": self.layout.cp, "seq": self.layout.seq,
                       "local_batch": self.layout.local_batch, "micro_batches": self.layout.micro_batches,
                       "ac": self.layout.ac.value, "float8": self.layout.float8, "compile": self.layout.compile,
                       "compile_loss": self.layout.compile_loss, "no_sync": self.layout.no_sync,
                       "tp_overlap": self.layout.tp_overlap},
            "memory_gib": m.peak_reserved / GiB,
            "memory_allocated_gib": m.peak_allocated / GiB,
            "memory_capacity_gib": m.capacity / GiB,
            "memory": {k: v / GiB for k, v in m.terms.items()},
            "memory_peak_moment": m.peak_moment,
            "fits": m.fits,
            "verdict": m.fit_verdict,
            "memory_band_gib": [b / GiB for b in m.likely_peak],
            "short_by_gib": m.short_by / GiB,
            "step_s": t.step_s,
            "step_parts_s": dict(t.parts),
            "tokens_per_s_per_gpu": t.tokens_per_s_per_gpu,
            "mfu": t.mfu,
        }


def plan(model: ModelSpec, gpu: GPU, layout: Layout, calibration: Calibration = CALIBRATION) -> Plan:
    """Memory and step time of `model` on `gpu`s laid out as `layout`; bad combinations raise ValueError."""
    return Plan(model, gpu, layout, memory_breakdown(model, gpu, layout), step_time(model, gpu, layout, calibration))
