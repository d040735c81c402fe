"""A tensor that this rank holds as arbitrary boxes of a run, and the DCP planners that write and read it.

Both sharded checkpoints write their pieces this way: the flat design's (`fsdp_mini.checkpoint.sharded_checkpoint`: a shard is
a run of a flat buffer, a few rectangular boxes of each parameter) and ZeRO-1's (`fsdp_mini.checkpoint.zero_checkpoint`:
a run of each flattened parameter). A DTensor cannot describe either, since its shards are the even
`torch.chunk` pieces of a device mesh, and PyTorch deprecates the older list of boxes with owners
(`torch.distributed._shard`'s sharded tensor, which FSDP v1 uses).

DCP needs neither. Its checkpoint metadata is, per tensor, a global size and a list of chunks (offsets and
sizes, `ChunkStorageMetadata`), whoever wrote them; a save plan is a list of `WriteItem`s (one per chunk
this rank writes) and a load plan a list of `ReadItem`s (the overlaps of the chunks this rank wants with
the saved ones, `create_read_items_for_chunk_list`). Planners are DCP's documented extension point, so a
`BoxedTensor` (this rank's boxes, each a view of its run) goes through `BoxesSavePlanner` and
`BoxesLoadPlanner`: the first offers one write item per box and hands DCP the box's view to write; the
second asks for the saved parts that overlap each box and hands DCP the view to fill. Saving copies nothing,
loading writes in place, and no rank needs another rank's boxes: DCP's coordinator gathers the plans, and the
metadata it writes is the one that sharded tensor's would have been (so a plain module's `dcp.load` reads it).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import torch
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner, create_default_local_load_plan
from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, MetadataIndex, TensorProperties,
                                                   TensorStorageMetadata)
from torch.distributed.checkpoint.planner import LoadPlan, SavePlan, TensorWriteData, WriteItem, WriteItemType
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from fsdp_mini.checkpoint.integrity import InPlaceLoadPlanner

__all__ = ["Box", "BoxedTensor", "BoxesSavePlanner", "BoxesLoadPlanner"]


class Box(NamedTuple):
    """One rectangular box of a tensor: where it lies in the tensor (offsets, sizes), and where its elements
    start in the run that holds them (`at`): the next prod(sizes) elements there, in row-major order."""
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    at: int


class BoxedTensor:
    """A tensor of shape `size` of which this rank holds `boxes`, each a contiguous stretch of `run` (its flat
    shard, or an optimizer state shaped like it). Other ranks hold the rest; none needs to know where."""

    def __init__(self, run: torch.Tensor, boxes: list[Box], size: tuple[int, ...]):
        self.run, self.boxes, self.shape = run, list(boxes), torch.Size(size)
        self._by_offsets = {tuple(b.offsets): b for b in self.boxes}

    def size(self) -> torch.Size:
        return self.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.run.dtype

    def view(self, box: Box) -> torch.Tensor:
        """The elements of `box`, a view of the run: DCP writes from it and loads into it."""
        return self.run[box.at:box.at + math.prod(box.sizes)].view(box.sizes)

    def box_at(self, offsets) -> Box:
        box = self._by_offsets.get(tuple(offsets))
        if box is None:
            raise ValueError(f"no box of this rank starts at {tuple(offsets)} (its boxes start at "
                             f"{sorted(self._by_offsets)})")
        return box

    def chunks(self) -> list[ChunkStorageMetadata]:
        return [ChunkStorageMetadata(offsets=torch.Size(b.offsets), sizes=torch.Size(b.sizes)) for b in self.boxes]

    def write_items(self, fqn: str) -> list[WriteItem]:
        """One SHARD write item per box, indexed by (fqn, offsets): replicas of a box (HSDP, NO_SHARD) offer
        the same index, and DCP's save-plan deduplication keeps one of them."""
        properties = TensorProperties.create_from_tensor(self.run)
        return [WriteItem(index=MetadataIndex(fqn, chunk.offsets), type=WriteItemType.SHARD,
                          tensor_data=TensorWriteData(chunk=chunk, properties=properties, size=self.shape))
                for chunk in self.chunks()]

    def __repr__(self) -> str:
        return f"BoxedTensor(size={tuple(self.shape)}, dtype={self.dtype}, boxes={len(self.boxes)})"


def _split(state_dict: dict[str, Any]) -> tuple[dict[str, BoxedTensor], dict[str, Any]]:
    boxed = {k: v for k, v in state_dict.items() if isinstance(v, BoxedTensor)}
    return boxed, {k: v for k, v in state_dict.items() if k not in boxed}


class BoxesSavePlanner(DefaultSavePlanner):
    """DCP's default save planner, plus `BoxedTensor` values: every other value is planned as DCP plans it.

    Defaults to a flat dict (`flatten_state_dict=False`), the way `fsdp_mini.checkpoint.sharded_checkpoint` hands it over, so
    that `optim.param_groups` stays one pickled object. Without DCP's plan caching, which would cache the
    plan of the other values only."""

    def __init__(self, flatten_state_dict: bool = False, flatten_sharded_tensors: bool = False,
                 dedup_save_to_lowest_rank: bool = False):
        super().__init__(flatten_state_dict=flatten_state_dict, flatten_sharded_tensors=flatten_sharded_tensors,
                         dedup_save_to_lowest_rank=dedup_save_to_lowest_rank, enable_plan_caching=False)

    def create_local_plan(self) -> SavePlan:
        everything = self.state_dict
        boxed, self.state_dict = _split(everything)  # DCP's own plan would pickle a BoxedTensor as an object
        try:
            plan = super().create_local_plan()
        finally:
            self.state_dict = everything
        self.plan = dataclasses.replace(plan, items=[*plan.items, *(item for fqn, value in boxed.items()
                                                                   for item in value.write_items(fqn))])
        return self.plan

    def lookup_object(self, index: MetadataIndex) -> Any:
        value = self.state_dict.get(index.fqn)
        if isinstance(value, BoxedTensor):
            return value.view(value.box_at(index.offset))
        return super().lookup_object(index)


class BoxesLoadPlanner(InPlaceLoadPlanner):
    """DCP's default load planner (flat dicts, loaded in place: `InPlaceLoadPlanner`), plus `BoxedTensor`
    values, each box filled in place from the overlapping parts of the saved chunks, whatever boxes saved
    them."""

    def set_up_planner(self, state_dict, metadata=None, is_coordinator: bool = False) -> None:
        # DCP's own set-up walks the dict and puts None in place of any value it does not know (torch 2.13,
        # planner_helpers._iterate_state_dict has no final else): it sees everything but the boxes.
        self.boxed, rest = _split(state_dict)
        super().set_up_planner(rest, metadata, is_coordinator)
        state_dict.update(self.state_dict)  # what that set-up replaced (a tensor on the meta device)
        self.state_dict = self.original_state_dict = state_dict

    def create_local_plan(self) -> LoadPlan:
        boxed, rest = _split(self.state_dict)
        plan = create_default_local_load_plan(rest, self.metadata, not self.allow_partial_load)
        items = list(plan.items)
        for fqn, value in boxed.items():
            md = self.metadata.state_dict_metadata.get(fqn)
            if md is None:
                if self.allow_partial_load:
                    continue
                raise RuntimeError(f"Missing key in checkpoint state_dict: {fqn}.")
            if not isinstance(md, TensorStorageMetadata) or md.size != value.size():
                saved = md.size if isinstance(md, TensorStorageMetadata) else "an object"
                raise ValueError(f"Size mismatch between saved {saved} and current: {value.size()} for {fqn}")
            items += create_read_items_for_chunk_list(fqn, md, value.chunks())
        return dataclasses.replace(plan, items=items)

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        value = self.state_dict.get(index.fqn)
        if isinstance(value, BoxedTensor):
            return value.view(value.box_at(index.offset))
        return super().lookup_tensor(index)
