"""The tensors inside a forward's arguments and outputs, which may be nested tuples, lists and dicts.

FSDP hooks a unit's outputs (to know when backward reaches it), checks the inputs' device and casts
them for mixed precision; a HuggingFace model returns a dict-like output, a GPT a (logits, loss) tuple.
These two helpers walk such structures the same way everywhere.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

import torch

__all__ = ["tensors_in", "map_tensors"]


def tensors_in(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor inside nested tuples, lists and dicts (dict values, in order)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from tensors_in(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from tensors_in(x)


def map_tensors(fn: Callable[[torch.Tensor], torch.Tensor], obj: Any) -> Any:
    """The same structure with every tensor replaced by `fn(tensor)`; other values kept as they are
    (a dict comes back as a plain dict)."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_tensors(fn, x) for x in obj)
    if isinstance(obj, dict):
        return {k: map_tensors(fn, v) for k, v in obj.items()}
    return obj
