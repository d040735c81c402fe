"""The five ways a run fails that tests/library/test_failure_causes.py reproduces, each under `launch` and
under torchrun (this file is also the torchrun script: `python -m torch.distributed.run ... failure_scenarios.py
NAME FOLDER`). Two ranks, TinyLM under the flat FSDP, one step on every rank, then the failure in the second.
"""
from __future__ import annotations

import os
import signal
import sys

import torch.distributed as dist

from fsdp_mini import FSDP
from fsdp_mini.checkpoint import save_checkpoint
from small_model import Block, TinyConfig, TinyLM, batch, rank_rows

CFG = TinyConfig(depth=3)
ROWS = 8  # the global batch's rows, split between the two ranks
BAD_BATCH = "bad batch on rank 1"


class ShapeErrorInABlock(TinyLM):
    """Once `broken`, feeds block 1 a residual stream one feature short: a shape error, on every rank alike,
    while the AllGather of block 2 that forward prefetches is in flight."""

    broken = False

    def run_blocks(self, x):
        for i, block in enumerate(self.blocks):
            x = block(x[..., :-1] if i == 1 and self.broken else x)
        return x


def _step(model, step):
    x, y = (rank_rows(t, dist.get_rank(), dist.get_world_size()) for t in batch(CFG, ROWS, step))
    model(x, y).backward()


def raises_on_one_rank(folder):
    model = FSDP(TinyLM(CFG), "FULL_SHARD", wrap=(Block,))
    _step(model, 0)
    if dist.get_rank() == 1:
        raise ValueError(BAD_BATCH)
    _step(model, 1)


def raises_on_every_rank(folder):
    model = FSDP(ShapeErrorInABlock(CFG), "FULL_SHARD", wrap=(Block,))
    _step(model, 0)  # records the order of the units: from now on forward prefetches the next one
    model.module.broken = True
    _step(model, 1)


def killed_rank(folder):
    model = FSDP(TinyLM(CFG), "FULL_SHARD", wrap=(Block,))
    _step(model, 0)
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer does
    _step(model, 1)


def skipped_collective(folder):
    model = FSDP(TinyLM(CFG), "FULL_SHARD", wrap=(Block,))
    for step in range(2 if dist.get_rank() == 0 else 1):  # rank 1 has a batch fewer
        _step(model, step)


def checkpoint_on_rank0(folder):
    model = FSDP(TinyLM(CFG), "FULL_SHARD", wrap=(Block,))
    _step(model, 0)
    if dist.get_rank() == 0:
        save_checkpoint(os.path.join(folder, "ckpt"), model)  # a collective, called by one rank
    _step(model, 1)


def ends_well(folder):
    model = FSDP(TinyLM(CFG), "FULL_SHARD", wrap=(Block,))
    _step(model, 0)


SCENARIOS = {fn.__name__: fn for fn in (raises_on_one_rank, raises_on_every_rank, killed_rank, skipped_collective,
                                        checkpoint_on_rank0, ends_well)}

if __name__ == "__main__":  # under torchrun: NAME FOLDER TIMEOUT_S
    import fsdp_mini

    fsdp_mini.init(timeout=float(sys.argv[3]))
    SCENARIOS[sys.argv[1]](sys.argv[2])
    fsdp_mini.finish()
