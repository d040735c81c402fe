"""Where `torch.compile` stops: FSDP's hooks run eagerly, at graph breaks, in both designs.

Both engines' hooks gather, free and swap parameters, issue collectives and keep Python state. Traced by
Dynamo, the in-place refill of a gathered parameter became a mutation of graph inputs aliasing the module's
parameter, which AOTAutograd refuses ("does not yet handle non-differentiable view input mutations"), and the
flat design's placeholders of freed parameters (`gathered_storage.FreedParameter`) were read while tracing.
FSDP2 keeps its hooks out of Dynamo the same way (`_dynamo_disable`, torch/distributed/fsdp/_fully_shard/
_fsdp_common.py:25, on `FSDPState._pre_forward`, `_post_forward`, `_pre_backward` and
`_root_post_backward_final_callback`, _fsdp_state.py:289, 323, 380, 394). Only public API: `torch.compiler.disable`.
"""
from __future__ import annotations

import functools

import torch

__all__ = ["dynamo_disable", "skipped_by_dynamo"]


def dynamo_disable(func):
    """Run `func` outside `torch.compile`: Dynamo neither traces it nor anything it calls, and a compiled
    module breaks its graph at the call and runs it eagerly. As in FSDP2, the disabled function is made at the
    first call, so that importing fsdp_mini does not import `torch._dynamo` (`torch.compiler.disable` imports
    it); unlike there, it is made once, not at every call: measured 3 us a call instead of 30 on this
    machine's CPU, paid by every hook of every unit."""
    disabled = None

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        nonlocal disabled
        if disabled is None:
            disabled = torch.compiler.disable(func, recursive=True, reason="skipping FSDP hooks")
        return disabled(*args, **kwargs)

    return wrapper


def skipped_by_dynamo(hook):
    """`hook`, which a compiled module calls at a graph break, as a function Dynamo skips whole
    (`torch.compiler.disable`), made once when the hook is registered. A hook that is only `dynamo_disable`d
    is a Python frame of fsdp_mini's, which Dynamo compiles on its own (empty graphs) and recompiles for each
    new hook signature (a block's output, the root's loss) up to `recompile_limit`: measured on a 10-block
    TinyLM over 3 steps with fully_shard, 7 frames compiled instead of 1 with `block.compile()` (FSDP2: 3), 16
    instead of 6 with `torch.compile(model)` (FSDP2: 8). Registering imports `torch._dynamo`, which the first
    optimizer step imports anyway (`torch_internals.warm_dynamo`)."""
    return torch.compiler.disable(hook, recursive=True, reason="skipping FSDP hooks")
