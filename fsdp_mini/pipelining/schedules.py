"""Pipeline schedules: the order in which each stage runs the forwards and backwards of a step's micro-batches.

PyTorch's `ScheduleGPipe(stage, n_microbatches, loss_fn)`, `Schedule1F1B(...)` and
`ScheduleInterleaved1F1B(stages, n_microbatches, loss_fn)`, with its `step`: the rank of the first stage passes the
whole batch (`step(x)`), which is cut into `n_microbatches` along dim 0; the rank of the last stage passes the whole
target (`step(target=y, losses=losses)`), gets its output back, merged, and the loss of each micro-batch in
`losses`; the other ranks call `step()`. After the last backward each stage divides its gradients by the number of
micro-batches (`scale_grads=True`, for a loss that averages), as PyTorch's schedules do.

A schedule here is a list of actions per rank, `pipeline_order()`: ("F", k) runs micro-batch k's forward, ("B", k)
its backward (interleaved: ("F", stage, k), ("B", stage, k)). The orders, for p ranks and m micro-batches, rank r:

    GPipe        F0 F1 ... F(m-1)  B0 B1 ... B(m-1)
                 every forward, then every backward: m micro-batches' activations wait at once
    1F1B         w = min(m, p - r) forwards, then one backward and one forward in turn, then the backwards left
                 (PyTorch's warm-up); a stage holds at most w micro-batches' activations, at most p
    interleaved  v stages per rank (r, r + p, ...); the forwards go through the micro-batches p at a time, stage
                 by stage, and the backwards the same way from the last stage; (p - r - 1) x 2 + (v - 1) x p
                 forwards warm up, then one forward and one backward in turn (Narayanan et al., "Efficient
                 Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", 2021)

GPipe and 1F1B keep each rank busy for m of its m + p - 1 slots per direction: the bubble, (p - 1) / (m + p - 1) of
the step; interleaving shrinks it v times, (p - 1) / (v m + p - 1), for v times the sends. Receives wait and sends do
not, so no order deadlocks.
"""
from __future__ import annotations

from typing import Callable

import torch

from fsdp_mini.pipelining.stage import PipelineStage

__all__ = ["PipelineScheduleSingle", "PipelineScheduleMulti", "ScheduleGPipe", "Schedule1F1B",
           "ScheduleInterleaved1F1B"]


class _PipelineSchedule:
    """What every schedule shares: the checks, the split into micro-batches, running the actions, the losses."""

    def __init__(self, stages: list[PipelineStage], n_microbatches: int, loss_fn: Callable | None,
                 scale_grads: bool):
        if isinstance(n_microbatches, bool) or not isinstance(n_microbatches, int) or n_microbatches < 1:
            raise ValueError(f"n_microbatches must be an integer >= 1, got {n_microbatches!r}")
        self._stages, self._n_microbatches, self._loss_fn = stages, n_microbatches, loss_fn
        self.scale_grads = scale_grads
        self._by_index = {s.stage_index: s for s in stages}
        self._first = self._by_index.get(0)
        self._last = self._by_index.get(stages[0].num_stages - 1)

    def _actions(self) -> list[tuple[str, int, int]]:
        """(kind, stage index, micro-batch) in the order this rank runs them."""
        raise NotImplementedError

    def _split(self, tensor: torch.Tensor, what: str) -> list[torch.Tensor]:
        if not isinstance(tensor, torch.Tensor) or tensor.dim() == 0:
            raise ValueError(f"{what} must be a tensor with a batch dimension, got {type(tensor).__name__}")
        if tensor.shape[0] % self._n_microbatches:
            raise ValueError(f"{what}'s batch of {tensor.shape[0]} does not split into {self._n_microbatches} "
                             f"equal micro-batches (the stages send buffers of one size)")
        return list(torch.tensor_split(tensor, self._n_microbatches, dim=0))

    def step(self, *args, target=None, losses: list | None = None):
        """One step over the whole batch: `args` on the first stage's rank, `target` (and `losses`, a list to
        fill) on the last stage's. Returns the last stage's output of the whole batch, None on other ranks."""
        m, first, last = self._n_microbatches, self._first, self._last
        if first is not None and not args:
            raise ValueError("the first stage's step needs the batch: schedule.step(x)")
        if first is None and args:
            raise ValueError(f"stages {sorted(self._by_index)} receive their input from the stage before: call "
                             f"step() without inputs there")
        if last is not None and self._loss_fn is not None and target is None:
            raise ValueError("the last stage computes the loss: schedule.step(target=y)")
        if losses is not None and not isinstance(losses, list):
            raise TypeError(f"losses must be a list, got {type(losses).__name__}")
        args_mbs = list(zip(*(self._split(a, f"input {i}") for i, a in enumerate(args)))) if args else [()] * m
        target_mbs = self._split(target, "target") if last is not None and target is not None else None
        for stage in self._stages:
            stage.clear_runtime_states()
        mb_losses: dict[int, torch.Tensor] = {}
        for kind, index, mb in self._actions():
            stage = self._by_index[index]
            if kind == "F":
                out = stage.forward_one_chunk(mb, args_mbs[mb] if stage is first else ())
                if stage is last:
                    stage.output_chunks.append(out.detach())
                    if self._loss_fn is not None:
                        mb_losses[mb] = self._loss_fn(out, target_mbs[mb])
            else:
                loss = mb_losses.get(mb) if stage is last else None
                stage.backward_one_chunk(mb, loss=loss, last_backward=mb == m - 1)
        for stage in self._stages:
            stage.wait_sends()
            stage.scale_grads(m if self.scale_grads else 1)
        if last is not None and losses is not None:
            losses.clear()
            losses.extend(mb_losses[k].detach() for k in range(m))
        return torch.cat(last.output_chunks) if last is not None else None


class PipelineScheduleSingle(_PipelineSchedule):
    """A schedule of one stage per rank. Subclasses say the order: `pipeline_order()`, a list of ("F", k) and
    ("B", k)."""

    def __init__(self, stage: PipelineStage, n_microbatches: int, loss_fn: Callable | None = None,
                 scale_grads: bool = True):
        if not isinstance(stage, PipelineStage):
            raise TypeError(f"a schedule takes a PipelineStage, got {type(stage).__name__}")
        if stage.num_stages != stage.group_size:
            raise ValueError(f"{type(self).__name__} runs one stage per rank, but there are {stage.num_stages} "
                             f"stages on {stage.group_size} ranks: use ScheduleInterleaved1F1B")
        super().__init__([stage], n_microbatches, loss_fn, scale_grads)
        self._stage = stage

    def pipeline_order(self) -> list[tuple[str, int]]:
        raise NotImplementedError

    def _actions(self) -> list[tuple[str, int, int]]:
        return [(kind, self._stage.stage_index, mb) for kind, mb in self.pipeline_order()]


class ScheduleGPipe(PipelineScheduleSingle):
    """Every micro-batch's forward, then every backward (Huang et al., "GPipe", 2019)."""

    def pipeline_order(self) -> list[tuple[str, int]]:
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

    def pipeline_order(self) -> list[tuple[str, int]]:
        m, stage = self._n_microbatches, self._stage
        warmup = min(m, stage.num_stages - stage.stage_index)
        order: list[tuple[str, int]] = [("F", k) for k in range(warmup)]
        forward, backward = warmup, 0
        while backward < m:
            order.append(("B", backward))
            backward += 1
            if forward < m:
                order.append(("F", forward))
                forward += 1
        return order


class PipelineScheduleMulti(_PipelineSchedule):
    """A schedule of several stages per rank: `stages`, this rank's, in order (r, r + p, ...)."""

    def __init__(self, stages: list[PipelineStage], n_microbatches: int, loss_fn: Callable | None = None,
                 scale_grads: bool = True):
        if not isinstance(stages, (list, tuple)) or not stages or not all(isinstance(s, PipelineStage)
                                                                          for s in stages):
            raise TypeError("a multi-stage schedule takes a list of this rank's PipelineStages")
        stages = sorted(stages, key=lambda s: s.stage_index)
        p, total = stages[0].group_size, stages[0].num_stages
        expected = list(range(stages[0].stage_index, total, p))
        if [s.stage_index for s in stages] != expected:
            raise ValueError(f"this rank holds stages {expected} of {total} (one in every {p}), got "
                             f"{[s.stage_index for s in stages]}")
        super().__init__(list(stages), n_microbatches, loss_fn, scale_grads)


class ScheduleInterleaved1F1B(PipelineScheduleMulti):
    """Megatron-LM's interleaved 1F1B: v stages per rank, micro-batches in groups of p (the number of ranks, which
    must divide the micro-batches, as in Megatron-LM). `pipeline_order()`: ("F" or "B", stage, micro-batch)."""

    def __init__(self, stages: list[PipelineStage], n_microbatches: int, loss_fn: Callable | None = None,
                 scale_grads: bool = True):
        super().__init__(stages, n_microbatches, loss_fn, scale_grads)
        p = self._stages[0].group_size
        if n_microbatches % p:
            raise ValueError(f"ScheduleInterleaved1F1B takes the micro-batches {p} at a time (one per rank): "
                             f"n_microbatches={n_microbatches} is not a multiple of {p}")

    def pipeline_order(self) -> list[tuple[str, int, int]]:
        stages = self._stages
        p, v, m = stages[0].group_size, len(stages), self._n_microbatches
        rank = stages[0].stage_index

        def action(kind: str, k: int) -> tuple[str, int, int]:
            group, within = divmod(k, p * v)
            chunk = within // p if kind == "F" else v - 1 - within // p
            return kind, stages[chunk].stage_index, group * p + within % p

        total = m * v
        warmup = min((p - rank - 1) * 2 + (v - 1) * p, total)
        order = [action("F", k) for k in range(warmup)]
        for i in range(total - warmup):
            order += [action("F", warmup + i), action("B", i)]
        return order + [action("B", i) for i in range(total - warmup, total)]

    def _actions(self) -> list[tuple[str, int, int]]:
        return self.pipeline_order()
