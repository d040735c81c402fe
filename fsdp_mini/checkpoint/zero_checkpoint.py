"""What a sharded checkpoint (`fsdp_mini.checkpoint.sharded_checkpoint`) holds for a replicated model, plain or wrapped in
DistributedDataParallel, and its ZeRO-1 optimizer: every rank holds the whole model and 1/n of the
optimizer state, and writes only its share of each.

    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)
    save_checkpoint("ckpt/step_100", model, opt, extra_state={"scheduler": sched.state_dict()})
    extra = load_checkpoint("ckpt/step_100", model, opt)  # at any world size, plain or DDP

The model's tensors go to DCP as they are, under the unwrapped module's names (so a DDP model's checkpoint
and a plain one's are the same): every rank offers them, and DCP's deduplication writes each once.

Each optimizer state tensor shaped like a flat shard (Adam's exp_avg and exp_avg_sq, SGD's momentum_buffer)
is shown to DCP per original parameter, under `optim.<parameter name>.<state name>`, as a BoxedTensor
(`fsdp_mini.checkpoint.sharded_boxes`) of the flattened parameter, shape (numel,): a shard holds elements [start, end)
of a flattened parameter, which is one box, a view of the state tensor (`FlatLayout.pieces`), so saving
copies nothing and loading writes straight into the state. Each rank describes only its own boxes, with no
communication. A checkpoint saved at n ranks loads at m: DCP reads, for each box a rank needs, the
overlapping parts of the saved boxes. A scalar state (Adam's step) is one replicated value per parameter;
the hyperparameters of the groups are one object, as `fsdp_mini.checkpoint.sharded_checkpoint` stores them.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn as nn

from fsdp_mini.parallel.ddp import DistributedDataParallel
from fsdp_mini.fsdp.fully_sharded_data_parallel import FSDP
from fsdp_mini.fsdp._fully_shard.fully_shard import FSDPModule
from fsdp_mini.rank_environment import require_distributed
from fsdp_mini.checkpoint.sharded_boxes import Box, BoxedTensor
from fsdp_mini.optim.zero import ZeroRedundancyOptimizer

__all__ = ["is_replicated", "unwrapped", "replicated_state_dict"]


def is_replicated(model) -> bool:
    """A module that every rank holds whole: a plain one, or one wrapped in fsdp_mini's or PyTorch's
    DistributedDataParallel, with no FSDP anywhere inside."""
    return isinstance(model, nn.Module) and not any(isinstance(m, (FSDP, FSDPModule)) for m in model.modules())


def unwrapped(model: nn.Module) -> nn.Module:
    """The module a DistributedDataParallel wraps (fsdp_mini's or PyTorch's), else `model`: its names are the
    checkpoint's, so a DDP model's checkpoint and a plain one's are the same."""
    return model.module if isinstance(model, (DistributedDataParallel, nn.parallel.DistributedDataParallel)) else model


def replicated_state_dict(model: nn.Module, optimizer, saving: bool, optim_prefix: str):
    """The flat dict handed to DCP for `model` (see `is_replicated`) and its ZeroRedundancyOptimizer's state
    (or None), with the steps to run before a load reads (zero the sharded states, so their padding stays
    zero) and after it (move scalars and objects into place): `fsdp_mini.checkpoint.sharded_checkpoint`'s protocol. The
    optimizer keys are `optim_prefix` + name; the param groups (matched by name) are the caller's, as for
    the sharded designs."""
    if optimizer is not None and not isinstance(optimizer, ZeroRedundancyOptimizer):
        raise ValueError(f"a checkpoint of a plain or DistributedDataParallel model takes its "
                         f"ZeroRedundancyOptimizer (or no optimizer), got {type(optimizer).__name__}")
    require_distributed("a sharded checkpoint")
    sd: dict[str, Any] = {}
    name_of: dict[int, str] = {}
    for name, t in unwrapped(model).state_dict(keep_vars=True).items():
        if not torch.is_tensor(t) or id(t) in name_of:
            continue  # tied: loaded through its first name (fsdp_mini.checkpoint.sharded_checkpoint adds its other names)
        name_of[id(t)] = name
        sd[name] = t.detach()  # a view: DCP loads in place
    prepare: list[Callable[[], Any]] = []
    finish: list[Callable[[], Any]] = []
    if optimizer is None:
        return sd, prepare, finish

    for fs in optimizer.flat_shards:
        missing = [p for p in fs.params if id(p) not in name_of]
        if missing:
            raise ValueError(f"the optimizer holds {len(missing)} tensor(s) that are not this model's parameters: "
                             "build it over the model's parameters")
        names = [name_of[id(p)] for p in fs.params]
        boxes: list[list[Box]] = [[] for _ in fs.params]  # per parameter: this rank's run of its flattened elements
        for piece in fs.layout.pieces(optimizer.rank):
            boxes[fs.layout.params.index(piece.param)].append(
                Box((piece.start,), (piece.end - piece.start,), piece.shard_offset))
        for key, value in optimizer.state.get(fs.shard, {}).items():
            keys = [f"{optim_prefix}{name}.{key}" for name in names]
            if torch.is_tensor(value) and value.shape == fs.shard.shape:
                if not saving:
                    prepare.append(value.zero_)
                for k, param_boxes, p in zip(keys, boxes, fs.params):
                    if p.numel():  # a parameter with no elements has no boxes anywhere
                        sd[k] = BoxedTensor(value.detach(), param_boxes, (p.numel(),))
            elif torch.is_tensor(value) and value.numel() == 1:  # replicated: one copy per parameter
                sd.update({k: value if saving else torch.empty_like(value) for k in keys})
                if not saving:
                    finish.append(lambda v=value, k=keys[0]: v.copy_(sd[k]))
            elif torch.is_tensor(value):
                raise ValueError(f"optimizer state {key!r} of shape {tuple(value.shape)} is neither shaped like "
                                 f"its shard {tuple(fs.shard.shape)} nor a scalar: it cannot be resharded")
            else:  # a plain Python value: a pickled object
                sd.update({k: value if saving else None for k in keys})
                if not saving:
                    finish.append(lambda s=optimizer.state[fs.shard], key=key, k=keys[0]: s.__setitem__(key, sd[k]))
    return sd, prepare, finish
