"""`fsdp_mini.course.pytorch_equivalent`: the course's GPT wrapped by `wrap_like_pytorch` (PyTorch's DDP or
FSDP2, the way the demo and the benchmarks set them beside fsdp_mini) trains exactly as `fsdp_mini.FSDP`
does under the same strategy, and `pytorch_full_state_dict` gives back the unwrapped keys.

Moved from tests/library/test_fsdp_parity.py, whose engine test now wraps the library tests' own model
with PyTorch directly: this one checks the course's mapping from a strategy to PyTorch's wrappers.
"""
from functools import partial

import pytest
import torch

from fsdp_mini import FSDP, launch
from fsdp_mini.course.models import GPT, Block, GPTConfig
from fsdp_mini.course.pytorch_equivalent import pytorch_full_state_dict, wrap_like_pytorch
from fsdp_mini.course.train import train

CFG = GPTConfig()
STEPS, BATCH = 5, 12
SGD = partial(torch.optim.SGD, lr=0.1, momentum=0.9)
TOL = dict(rtol=1e-5, atol=1e-6)


def _both_ways(strategies):
    """Per strategy: (losses, full state dict) of fsdp_mini's FSDP and of `wrap_like_pytorch`, on this rank."""
    runs = {}
    for strategy in strategies:
        for name, wrapped in (("fsdp_mini", FSDP(GPT(CFG), strategy, wrap=(Block,))),
                              ("pytorch", wrap_like_pytorch(GPT(CFG), strategy, wrap=(Block,)))):
            losses = train(wrapped, SGD(wrapped.parameters()), CFG, STEPS, BATCH)
            state = wrapped.full_state_dict() if name == "fsdp_mini" else pytorch_full_state_dict(wrapped)
            runs[strategy, name] = (losses, state)
    return runs


@pytest.mark.parametrize("world,strategies", [
    (2, ["NO_SHARD", "SHARD_GRAD_OP", "FULL_SHARD"]),
    (4, ["FULL_SHARD", "HYBRID_SHARD"]),
])
def test_wrap_like_pytorch_trains_as_fsdp_mini_does(world, strategies, no_orphans):
    for rank, runs in enumerate(launch(_both_ways, world, args=(strategies,), timeout=150, local_world_size=2)):
        for strategy in strategies:
            (ours, our_state), (theirs, their_state) = runs[strategy, "fsdp_mini"], runs[strategy, "pytorch"]
            assert list(their_state) == list(our_state), (rank, strategy)  # the unwrapped keys, in order
            torch.testing.assert_close((theirs, their_state), (ours, our_state), **TOL,
                                       msg=lambda m: f"rank {rank} {strategy}: {m}")
