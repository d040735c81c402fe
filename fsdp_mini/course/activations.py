"""Activations: what autograd keeps for backward, the formula for it, and checkpointing an FSDP unit.

Per transformer layer, Korthikanti et al. ("Reducing Activation Recomputation in Large Transformer
Models", 2022, the Megatron sequence-parallel paper) count s*b*h*(34 + 5*a*s/h) bytes in 16-bit: s tokens
per sequence, b sequences, h hidden, a heads. Their terms assume dropout (1-byte masks), a softmax
that stores its s x s probabilities, and 2-byte tensors. The course's GPT (`fsdp_mini.course.models`)
has none of the dropout, stores fp32 (4 bytes), and calls `F.scaled_dot_product_attention`, whose CPU
kernel (flash attention) keeps q, k, v, the output and one log-sum-exp per row instead of the s x s
matrix. `course_terms` lists what is left, op by op; `measure_block` counts what autograd really saves
(`fsdp_mini.memory.SavedActivations`), so a lesson can set one beside the other.

`Checkpointed(block)` runs a block under `torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`:
forward keeps only the block's input, backward recomputes the block's forward first. Put around an FSDP
unit, the recomputation runs inside the unit's backward, when pre-backward has already gathered its
parameters: `fsdp_mini.FSDP` and `fsdp_mini.fully_shard` leave a unit in that state alone, so it costs
compute, not an extra AllGather.
"""
from __future__ import annotations

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from fsdp_mini.memory import SavedActivations

__all__ = ["megatron_bytes", "course_terms", "course_bytes", "measure_block", "Checkpointed", "checkpoint_blocks",
           "recomputations"]


def megatron_bytes(s: int, b: int, h: int, a: int) -> int:
    """Korthikanti et al.'s activation bytes of one layer, as written: 16-bit tensors, 1-byte dropout masks,
    the softmax's s x s output (and its dropout) stored: s*b*h*34 + 5*a*s^2*b."""
    return 34 * s * b * h + 5 * a * s * s * b


def course_terms(s: int, b: int, h: int, a: int, element_bytes: int = 4) -> dict[str, int]:
    """What one `Block` of the course's GPT saves for backward, op by op (fp32 by default): each tensor
    once, in the units of Korthikanti et al.'s table (sbh = one activation of the residual stream)."""
    sbh = s * b * h * element_bytes
    return {
        "ln_1 input": sbh,
        "qkv input (ln_1 output)": sbh,
        "q, k, v (one qkv output)": 3 * sbh,
        "attention output = proj input": sbh,
        "ln_2 input": sbh,
        "fc input (ln_2 output)": sbh,
        "GELU input (fc output, 4h)": 4 * sbh,
        "proj input (GELU output, 4h)": 4 * sbh,
        "LayerNorm mean and 1/std (2 per LayerNorm)": 4 * s * b * element_bytes,
        "attention log-sum-exp (a per token)": a * s * b * element_bytes,
    }


def course_bytes(s: int, b: int, h: int, a: int, element_bytes: int = 4) -> int:
    """The sum of `course_terms`: 64*sbh + 16*sb + 4*a*sb bytes in fp32."""
    return sum(course_terms(s, b, h, a, element_bytes).values())


def measure_block(block: nn.Module, b: int, s: int) -> int:
    """Bytes autograd saves in one forward of `block` on a (b, s, h) input that requires grad (as a block
    inside the model gets), its parameters excluded: `SavedActivations`."""
    h = next(block.parameters()).shape[-1]
    x = torch.randn(b, s, h, requires_grad=True)
    with SavedActivations(exclude=block.parameters()) as saved:
        block(x)
    return saved.nbytes


class Checkpointed(nn.Module):
    """A block run under activation checkpointing: forward saves nothing inside it but its input (which the
    checkpoint saves for backward, so `SavedActivations` counts it); backward recomputes the block's
    forward, then runs its backward. `recomputed` counts the recomputations."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block
        self.recomputed = 0
        self._in_forward = False
        block.register_forward_pre_hook(self._count)

    def _count(self, module, args) -> None:
        if self._in_forward:
            self._in_forward = False
        else:
            self.recomputed += 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._in_forward = True
        return checkpoint(self.block, x, use_reentrant=False)


def checkpoint_blocks(model: nn.Module, which) -> nn.Module:
    """Wrap `model.blocks[i]` in `Checkpointed` for each i in `which` (before FSDP wraps the model: the
    blocks stay the units, the checkpoint sits around each). Returns the model."""
    for i in sorted(set(which)):
        model.blocks[i] = Checkpointed(model.blocks[i])
    return model


def recomputations(model: nn.Module) -> int:
    """How many block forwards were recomputed in backward so far, over the checkpointed blocks of `model`."""
    return sum(m.recomputed for m in model.modules() if isinstance(m, Checkpointed))
