"""The tensors inside a forward's arguments and outputs, whatever containers hold them.

FSDP hooks a unit's outputs (to know when backward reaches it) and its inputs (to know when backward is
done with it), and casts inputs for mixed precision; a HuggingFace model returns a `ModelOutput`, a GPT
a (logits, loss) tuple, other models namedtuples or dataclasses. These two helpers walk such structures
the same way everywhere: with PyTorch's own tree utilities (`torch.utils._pytree`, what FSDP2 uses:
tuples, lists, dicts, namedtuples, OrderedDicts and every type registered with it, `ModelOutput`
included), and into dataclass instances, which pytree treats as leaves.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable, Iterator

import torch

from fsdp_mini.torch_internals import pytree  # private in torch, public in practice (the reason: there)

__all__ = ["tensors_in", "map_tensors"]


def _is_dataclass_instance(obj: Any) -> bool:
    return dataclasses.is_dataclass(obj) and not isinstance(obj, type)


def tensors_in(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor inside `obj`, in pytree's order (dict values in insertion order)."""
    for leaf in pytree.tree_leaves(obj):
        if isinstance(leaf, torch.Tensor):
            yield leaf
        elif _is_dataclass_instance(leaf):
            for f in dataclasses.fields(leaf):
                yield from tensors_in(getattr(leaf, f.name))


def map_tensors(fn: Callable[[torch.Tensor], torch.Tensor], obj: Any) -> Any:
    """The same structure, of the same types, with every tensor replaced by `fn(tensor)`; other values
    kept as they are."""

    def one(leaf):
        if isinstance(leaf, torch.Tensor):
            return fn(leaf)
        if _is_dataclass_instance(leaf):
            new = copy.copy(leaf)  # a shallow copy, fields replaced without __init__ (frozen ones too)
            for f in dataclasses.fields(leaf):
                object.__setattr__(new, f.name, map_tensors(fn, getattr(leaf, f.name)))
            return new
        return leaf

    return pytree.tree_map(one, obj)
