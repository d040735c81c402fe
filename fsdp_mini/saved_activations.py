"""The bytes autograd saves for backward: what a forward leaves behind besides the model states.

A measuring tool set beside the engines, never used by them (tests/library/test_layout.py): lessons 00 and
11 and the planner's tests compare it with the activation arithmetic.
"""
from __future__ import annotations

__all__ = ["SavedActivations"]


class SavedActivations:
    """Bytes that autograd saves for backward inside the block: the activations.

        with SavedActivations(exclude=model.parameters()) as saved:
            loss = model(x, y)
        saved.nbytes   # grows with batch size and sequence length, unlike the model states

    Counted through `torch.autograd.graph.saved_tensors_hooks`, each storage once (views of one tensor
    share it), leaving out the storages of `exclude` (the parameters, which backward also saves but
    which are model states, not activations). Deterministic: it counts bytes, it does not time anything.
    """

    def __init__(self, exclude=()):
        import torch

        self._torch = torch
        self._skip = {t.untyped_storage().data_ptr() for t in exclude}
        self._seen: set[int] = set()
        self.nbytes = 0

    def _pack(self, t):
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in self._skip and ptr not in self._seen:
            self._seen.add(ptr)
            self.nbytes += storage.nbytes()
        return t

    def __enter__(self) -> "SavedActivations":
        self._hooks = self._torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
