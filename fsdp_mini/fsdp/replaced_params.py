"""Parameters a wrapper replaced, so that an optimizer built before wrapping fails loudly at its first step.

Both FSDP designs put new tensors where a module's parameters were: the flat design a shard of one flat
buffer per unit, the per-parameter design a DTensor shard of each parameter. An optimizer built from
`model.parameters()` *before* wrapping still holds the old tensors; they get no gradients, its step does
nothing to the model, and training silently never learns. PyTorch's FSDP has the same rule ("build the
optimizer after wrapping") and no check. Here every replaced parameter is remembered (weakly: nothing is
kept alive) and a global optimizer step pre-hook, installed once, raises at the first step of an optimizer
that holds one.
"""
from __future__ import annotations

import weakref

from torch.optim.optimizer import register_optimizer_step_pre_hook

__all__ = ["mark_replaced", "OptimizerBuiltBeforeWrapping", "mark_wrapped", "wrapper_of"]

# id -> weak reference (a WeakSet would compare tensors with `==`, which is elementwise)
_REPLACED: dict[int, weakref.ref] = {}
_hook = None
# module -> the name of the flat wrapper that replaced its parameters (`fully_shard` refuses such modules)
_WRAPPED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class OptimizerBuiltBeforeWrapping(RuntimeError):
    """An optimizer steps parameters that FSDP replaced: it was built before the model was wrapped."""


def mark_replaced(params) -> None:
    """Remember `params` as replaced by a wrapper; install the step check the first time."""
    global _hook
    for p in params:
        _REPLACED[id(p)] = weakref.ref(p, _forget(id(p)))
    if _hook is None:
        _hook = register_optimizer_step_pre_hook(_check_step)


def _forget(key: int):
    def callback(ref) -> None:
        if _REPLACED.get(key) is ref:
            del _REPLACED[key]
    return callback


def _check_step(optimizer, args, kwargs) -> None:
    for group in optimizer.param_groups:
        for p in group["params"]:
            ref = _REPLACED.get(id(p))
            if ref is not None and ref() is p:
                raise OptimizerBuiltBeforeWrapping(
                    f"{type(optimizer).__name__} holds parameters that fsdp_mini's FSDP / fully_shard replaced "
                    f"(shape {tuple(p.shape)}): it was built before the model was wrapped, so its steps would "
                    f"never reach the model. Wrap first, then build the optimizer from the wrapped model's "
                    f"parameters(), as with PyTorch's FSDP.")


def mark_wrapped(module, wrapper: str) -> None:
    """Remember every module of `module`'s tree as wrapped by `wrapper`: their parameters are gone (the
    flat design holds them in its flat shards), so the other design must refuse them, not find nothing."""
    for m in module.modules():
        _WRAPPED[m] = wrapper


def wrapper_of(module) -> str | None:
    """The name of the wrapper `mark_wrapped` recorded for `module`, or None."""
    return _WRAPPED.get(module)
