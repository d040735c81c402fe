"""Pipeline schedules: the order in which each stage runs the forwards and backwards of a step's micro-batches.

PyTorch's `ScheduleGPipe(stage, n_microbatches, loss_fn)` and `Schedule1F1B(...)`, with its `step`: the first stage
passes the whole batch (`step(x)`), which is cut into `n_microbatches` along dim 0; the last stage passes the whole
target (`step(target=y, losses=losses)`), gets its output back, merged, and the loss of each micro-batch in
`losses`; the stages between call `step()`. After the last backward each stage divides its gradients by the number
of micro-batches (`scale_grads=True`, for a loss that averages), as PyTorch's schedules do.

A schedule here is a list of actions per stage, `pipeline_order()`: ("F", k) runs micro-batch k's forward,
("B", k) its backward. The two orders, for p stages and m micro-batches, stage s:

    GPipe   F0 F1 ... F(m-1)  B0 B1 ... B(m-1)
            every forward, then every backward: m micro-batches' activations wait at once
    1F1B    w = min(m, p - s) forwards, then one backward and one forward in turn, then the backwards left
            (PyTorch's warm-up); a stage holds at most w micro-batches' activations, at most p

Both keep every stage busy for m of its m + p - 1 slots per direction: the bubble, (p - 1) / (m + p - 1) of the
step, is the same; 1F1B holds fewer activations. Receives wait and sends do not, so neither order deadlocks.
"""
from __future__ import annotations

from typing import Callable

import torch

from fsdp_mini.pipelining.stage import PipelineStage

__all__ = ["PipelineScheduleSingle", "ScheduleGPipe", "Schedule1F1B", "Action"]

Action = tuple[str, int]
"""("F", k): micro-batch k's forward; ("B", k): its backward."""


class PipelineScheduleSingle:
    """A schedule of one stage per rank. Subclasses say the order: `pipeline_order()`."""

    def __init__(self, stage: PipelineStage, n_microbatches: int, loss_fn: Callable | None = None,
                 scale_grads: bool = True):
        if not isinstance(stage, PipelineStage):
            raise TypeError(f"a schedule takes a PipelineStage, got {type(stage).__name__}")
        if isinstance(n_microbatches, bool) or not isinstance(n_microbatches, int) or n_microbatches < 1:
            raise ValueError(f"n_microbatches must be an integer >= 1, got {n_microbatches!r}")
        self._stage, self._n_microbatches, self._loss_fn = stage, n_microbatches, loss_fn
        self.scale_grads = scale_grads

    def pipeline_order(self) -> list[Action]:
        raise NotImplementedError

    def _split(self, tensor: torch.Tensor, what: str) -> list[torch.Tensor]:
        if not isinstance(tensor, torch.Tensor) or tensor.dim() == 0:
            raise ValueError(f"{what} must be a tensor with a batch dimension, got {type(tensor).__name__}")
        if tensor.shape[0] % self._n_microbatches:
            raise ValueError(f"{what}'s batch of {tensor.shape[0]} does not split into {self._n_microbatches} "
                             f"equal micro-batches (the stages send buffers of one size)")
        return list(torch.tensor_split(tensor, self._n_microbatches, dim=0))

    def step(self, *args, target=None, losses: list | None = None):
        """One step over the whole batch: `args` on the first stage, `target` (and `losses`, a list to fill)
        on the last. Returns the last stage's output of the whole batch, None on the others."""
        stage, m = self._stage, self._n_microbatches
        if stage.is_first and not args:
            raise ValueError("the first stage's step needs the batch: schedule.step(x)")
        if not stage.is_first and args:
            raise ValueError(f"stage {stage.stage_index} receives its input from the stage before: call step() "
                             f"without inputs there")
        if stage.is_last and self._loss_fn is not None and target is None:
            raise ValueError("the last stage computes the loss: schedule.step(target=y)")
        if losses is not None and not isinstance(losses, list):
            raise TypeError(f"losses must be a list, got {type(losses).__name__}")
        args_mbs = list(zip(*(self._split(a, f"input {i}") for i, a in enumerate(args)))) if args else [()] * m
        target_mbs = self._split(target, "target") if stage.is_last and target is not None else None
        stage.clear_runtime_states()
        mb_losses: dict[int, torch.Tensor] = {}
        for kind, mb in self.pipeline_order():
            if kind == "F":
                out = stage.forward_one_chunk(mb, args_mbs[mb])
                if stage.is_last:
                    stage.output_chunks.append(out.detach())
                    if self._loss_fn is not None:
                        mb_losses[mb] = self._loss_fn(out, target_mbs[mb])
            else:
                stage.backward_one_chunk(mb, loss=mb_losses.get(mb), last_backward=mb == m - 1)
        stage.wait_sends()
        stage.scale_grads(m if self.scale_grads else 1)
        if stage.is_last and losses is not None:
            losses.clear()
            losses.extend(mb_losses[k].detach() for k in range(m))
        return torch.cat(stage.output_chunks) if stage.is_last else None


class ScheduleGPipe(PipelineScheduleSingle):
    """Every micro-batch's forward, then every backward (Huang et al., "GPipe", 2019)."""

    def pipeline_order(self) -> list[Action]:
        m = self._n_microbatches
        return [("F", k) for k in range(m)] + [("B", k) for k in range(m)]


class Schedule1F1B(PipelineScheduleSingle):
    """One forward, one backward in turn after a warm-up (Narayanan et al., "PipeDream", 2019), as PyTorch
    orders it: stage s warms up with min(m, p - s) forwards. Fewer micro-batches than stages is an error, as in
    PyTorch: the pipeline never fills."""

    def __init__(self, stage: PipelineStage, n_microbatches: int, loss_fn: Callable | None = None,
                 scale_grads: bool = True):
        super().__init__(stage, n_microbatches, loss_fn, scale_grads)
        if n_microbatches < stage.num_stages:
            raise ValueError(f"Schedule1F1B needs at least as many micro-batches as stages: n_microbatches="
                             f"{n_microbatches} < {stage.num_stages} stages")

    def pipeline_order(self) -> list[Action]:
        m, stage = self._n_microbatches, self._stage
        warmup = min(m, stage.num_stages - stage.stage_index)
        order: list[Action] = [("F", k) for k in range(warmup)]
        forward, backward = warmup, 0
        while backward < m:
            order.append(("B", backward))
            backward += 1
            if forward < m:
                order.append(("F", forward))
                forward += 1
        return order
