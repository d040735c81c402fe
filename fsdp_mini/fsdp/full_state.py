"""What a full state dict must be, in both designs: the keys and shapes of the unwrapped module's own
`state_dict()`. One check for the flat design (`FSDP.load_full_state_dict`) and the per-parameter one
(`fully_shard.load_full_state_dict`), run before anything is copied, so a wrong file fails on every rank
with the same clear message and leaves the model as it was."""
from __future__ import annotations

import torch

__all__ = ["check_full_state_dict"]


def check_full_state_dict(expected: dict[str, tuple[int, ...]], state_dict: dict[str, torch.Tensor]) -> None:
    """Strict: every key of `expected` (name -> shape) and no other, each with its shape; else ValueError."""
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected]
    if missing or unexpected:
        raise ValueError(f"state dict does not match the model: missing keys {missing}, unexpected keys {unexpected}")
    for name, shape in expected.items():
        if tuple(state_dict[name].shape) != tuple(shape):
            raise ValueError(f"{name}: shape {tuple(state_dict[name].shape)} in the state dict, "
                             f"{tuple(shape)} in the model")
