"""One pipeline stage: a rank's slice of the model, and the point-to-point sends that join it to its neighbours.

PyTorch's `PipelineStage(submodule, stage_index, num_stages, device, group=None)`: stage i runs on rank i mod n of
the n ranks of `group` (the world by default): one stage per rank, or v per rank for an interleaved schedule (rank r
holds stages r, r + n, ...). Per micro-batch, in forward it receives its input from the stage before (the first
stage takes the schedule's micro-batch instead), runs its module and sends the output to the stage after; in
backward it receives the gradient of that output from the stage after (the last stage starts from its loss),
runs autograd through its module and sends the gradient of its input back. The sends are asynchronous (the
stage goes on computing while its output travels, as PyTorch's `isend`s do), the receives wait.

A receiving rank must know what it receives: on the first step each stage first sends a small header (the
output's shape and dtype) before its first activation, as PyTorch infers shapes on its first step. Every later
micro-batch must have that shape: a different one is an error on the sending rank, before it sends.

A stage whose module is sharded by `fully_shard` (fsdp_mini's or PyTorch's: anything with FSDP2's switches) runs
its micro-batches' backwards as PyTorch's stage does: all but the last without gradient sync and without
resharding after backward (the unsharded gradients accumulate, the parameters stay gathered), the last with both,
so each unit reduce-scatters once a step.

Every send and receive is one of fsdp_mini's logged point-to-point calls (`fsdp_mini.collectives.isend`,
`recv`), labelled alike on both ends ("pipeline stage 0 to 1 activation k", "pipeline stage 1 to 0 gradient k"),
so CommLog shows the bytes of each hop and the flight recorder pairs each send with its receive. Each kind of
message across each stage boundary has its own tag: when one pair of ranks carries several (activations one way
and, interleaved, gradients of another boundary the same way), a receive takes the message it waits for.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from fsdp_mini import collectives as C
from fsdp_mini.collective_calls import scope

__all__ = ["PipelineStage", "DTYPES"]

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32)
"""What an activation may be, in the order the header codes them."""
_HEADER = 10  # int64s: the number of dims, up to 8 sizes, the dtype's index in DTYPES


class PipelineStage:
    """Stage `stage_index` of `num_stages`, running `submodule` on rank `stage_index` of `group`."""

    def __init__(self, submodule: nn.Module, stage_index: int, num_stages: int, device, group=None):
        if not isinstance(submodule, nn.Module):
            raise TypeError(f"PipelineStage needs an nn.Module, got {type(submodule).__name__}")
        for name, value in (("num_stages", num_stages), ("stage_index", stage_index)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        if num_stages < 1 or not 0 <= stage_index < num_stages:
            raise ValueError(f"stage_index {stage_index} must be in [0, num_stages={num_stages})")
        if not dist.is_initialized():
            raise RuntimeError("PipelineStage needs torch.distributed: start the ranks with fsdp_mini.launch or "
                               "torchrun first")
        pg = group if group is not None else dist.group.WORLD
        ranks = dist.get_process_group_ranks(pg)
        n = len(ranks)
        if num_stages % n:
            raise ValueError(f"num_stages={num_stages} is not a multiple of the group's {n} ranks: every rank holds "
                             f"the same number of stages")
        if dist.get_rank(pg) != stage_index % n:
            raise ValueError(f"stage {stage_index} runs on rank {stage_index % n} of its group (stage_index mod {n}), "
                             f"not on rank {dist.get_rank(pg)}")
        self.submod, self.stage_index, self.num_stages = submodule, stage_index, num_stages
        self.device, self.group = torch.device(device), pg
        self.group_size = n
        self.prev_rank = ranks[(stage_index - 1) % n] if stage_index > 0 else None
        self.next_rank = ranks[(stage_index + 1) % n] if stage_index < num_stages - 1 else None
        self._in_meta: tuple[tuple[int, ...], torch.dtype] | None = None  # what the stage before sends
        self._out_meta: tuple[tuple[int, ...], torch.dtype] | None = None  # what this stage sends on
        self._inputs: dict[int, torch.Tensor] = {}
        self._outputs: dict[int, torch.Tensor] = {}
        self._sends: list = []
        self.output_chunks: list[torch.Tensor] = []

    @property
    def is_first(self) -> bool:
        return self.stage_index == 0

    @property
    def is_last(self) -> bool:
        return self.stage_index == self.num_stages - 1

    @staticmethod
    def _tag(src: int, dst: int, what: str) -> int:
        """The channel of one kind of message across one stage boundary (the same at both ends)."""
        return 3 * min(src, dst) + ("shape", "activation", "gradient").index(what)

    @staticmethod
    def _label(src: int, dst: int, what: str, mb: int | None = None) -> str:
        """One label for a message at both of its ends: the stages it goes from and to, what it carries."""
        return f"pipeline stage {src} to {dst} {what}" + ("" if mb is None else f" {mb}")

    # --- the header: what an activation's receiver allocates ------------------------------------------------

    def _send_header(self, out: torch.Tensor) -> None:
        if out.dim() > _HEADER - 2 or out.dtype not in DTYPES:
            raise ValueError(f"stage {self.stage_index} returned a {out.dtype} tensor of {out.dim()} dims; a stage's "
                             f"output must have at most {_HEADER - 2} dims and one of {[str(d) for d in DTYPES]}")
        header = torch.zeros(_HEADER, dtype=torch.int64)
        header[0] = out.dim()
        header[1:1 + out.dim()] = torch.tensor(out.shape)
        header[-1] = DTYPES.index(out.dtype)
        with scope(self._label(self.stage_index, self.stage_index + 1, "shape")):
            self._sends.append(C.isend(header, self.next_rank, self.group,
                                       tag=self._tag(self.stage_index, self.stage_index + 1, "shape")))

    def _recv_header(self) -> tuple[tuple[int, ...], torch.dtype]:
        header = torch.empty(_HEADER, dtype=torch.int64)
        with scope(self._label(self.stage_index - 1, self.stage_index, "shape")):
            C.recv(header, self.prev_rank, self.group, tag=self._tag(self.stage_index - 1, self.stage_index, "shape"))
        ndim = int(header[0])
        return tuple(int(s) for s in header[1:1 + ndim]), DTYPES[int(header[-1])]

    # --- one micro-batch ----------------------------------------------------------------------------------

    def forward_one_chunk(self, mb: int, args: tuple = ()) -> torch.Tensor:
        """Micro-batch `mb`'s forward: the schedule's inputs on the first stage, the stage before's output on
        the others; the output is sent on (unless this is the last stage) and returned."""
        if self.is_first:
            inputs = tuple(args)
        else:
            if self._in_meta is None:
                self._in_meta = self._recv_header()
            shape, dtype = self._in_meta
            x = torch.empty(shape, dtype=dtype, device=self.device)
            with scope(self._label(self.stage_index - 1, self.stage_index, "activation", mb)):
                C.recv(x, self.prev_rank, self.group,
                       tag=self._tag(self.stage_index - 1, self.stage_index, "activation"))
            inputs = (x.requires_grad_(dtype.is_floating_point),)
        out = self.submod(*inputs)
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"stage {self.stage_index} returned a {type(out).__name__}; a stage returns one tensor")
        self._inputs[mb], self._outputs[mb] = inputs[0] if inputs else None, out
        if not self.is_last:
            meta = (tuple(out.shape), out.dtype)
            if self._out_meta is None:
                self._send_header(out)
                self._out_meta = meta
            elif meta != self._out_meta:
                raise ValueError(f"stage {self.stage_index} returned {meta[0]} {meta[1]} on micro-batch {mb}, but "
                                 f"{self._out_meta[0]} {self._out_meta[1]} before: every micro-batch's output must "
                                 f"have one shape (the next stage receives into a buffer of that size)")
            with scope(self._label(self.stage_index, self.stage_index + 1, "activation", mb)):
                self._sends.append(C.isend(out.detach().contiguous(), self.next_rank, self.group,
                                           tag=self._tag(self.stage_index, self.stage_index + 1, "activation")))
        return out

    def backward_one_chunk(self, mb: int, loss: torch.Tensor | None = None, last_backward: bool = True) -> None:
        """Micro-batch `mb`'s backward: from `loss` on the last stage, from the gradient the stage after sends on
        the others; the gradient of this stage's input is sent back (unless this is the first stage).
        `last_backward`: the step's last one, where a sharded module reduces its gradients."""
        out, x = self._outputs.pop(mb), self._inputs.pop(mb)
        if hasattr(self.submod, "set_requires_gradient_sync"):  # FSDP2's switches (fsdp_mini's or PyTorch's)
            self.submod.set_is_last_backward(last_backward)
            self.submod.set_reshard_after_backward(last_backward)
            self.submod.set_requires_gradient_sync(last_backward)
        if self.is_last:
            if loss is None:
                raise ValueError("the last stage's backward needs the micro-batch's loss: give the schedule a loss_fn")
            loss.backward()
        else:
            grad = torch.empty_like(out)
            with scope(self._label(self.stage_index + 1, self.stage_index, "gradient", mb)):
                C.recv(grad, self.next_rank, self.group,
                       tag=self._tag(self.stage_index + 1, self.stage_index, "gradient"))
            out.backward(grad)
        if not self.is_first:
            grad_x = x.grad if x is not None and x.grad is not None else torch.zeros_like(x)
            with scope(self._label(self.stage_index, self.stage_index - 1, "gradient", mb)):
                self._sends.append(C.isend(grad_x.contiguous(), self.prev_rank, self.group,
                                           tag=self._tag(self.stage_index, self.stage_index - 1, "gradient")))

    # --- once a step ----------------------------------------------------------------------------------

    def wait_sends(self) -> None:
        """Wait until everything this stage sent has left (its buffers may then be reused or freed)."""
        for work in self._sends:
            work.wait()
        self._sends.clear()

    def scale_grads(self, grad_scale_factor: int) -> None:
        """Divide the stage's gradients by `grad_scale_factor` (the number of micro-batches for a loss that
        averages: each micro-batch's backward added a mean over its own rows), as PyTorch's stage does."""
        if grad_scale_factor != 1:
            for p in self.submod.parameters():
                if p.grad is not None:
                    p.grad.div_(grad_scale_factor)

    def clear_runtime_states(self) -> None:
        self._inputs.clear()
        self._outputs.clear()
        self.output_chunks.clear()
