"""Gradient hooks that hold their engine weakly, so that a dropped model is freed.

A hook registered on a tensor (`register_post_accumulate_grad_hook`) is held by the tensor's autograd
metadata, in C++, and Python's garbage collector cannot follow a reference out of C++. A hook that holds
its engine strongly (a bound method, a `partial` of one) closes a cycle engine → model → parameter → hook →
engine that the collector never sees: `del model` then frees nothing, gathered buffers included, until the
process ends. PyTorch's own DDP and FSDP2 are freed; with these hooks fsdp_mini's engines are too
(tests/library/test_dropped_models_are_freed.py).

Pass the engine's method and plain values (indices): an argument that references the hooked tensor, or an
object holding it, closes the same invisible cycle through the argument.
"""
from __future__ import annotations

import weakref
from typing import Callable

__all__ = ["weak_hook"]


def weak_hook(method: Callable, *args) -> Callable:
    """A hook calling `method(*args, *hook_args)` while `method`'s object lives, and nothing after."""
    ref = weakref.WeakMethod(method)

    def hook(*hook_args):
        bound = ref()
        if bound is not None:
            return bound(*args, *hook_args)
    return hook
