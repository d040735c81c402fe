"""One unit of the per-parameter design: its parameters' AllGather and ReduceScatter, one of each per unit.

Each parameter keeps its own dim-0 chunk (`fsdp_mini.fsdp._fully_shard.fsdp_param`), but a unit still communicates once,
through a flat buffer, because every collective pays a fixed latency:

    copy-in      each rank concatenates its padded chunks: [p0 chunk | p1 chunk | ...]   (per-rank row)
    AllGather    over the shard group: n such rows, one per rank                         (n, row)
    copy-out     parameter i is column block i of the n rows, read top to bottom: chunk 0, chunk 1, ...

The chunks of one parameter are consecutive rows of it, so reading its column block rank after rank
gives the parameter itself (its padding last). Gradients go the other way: each parameter's gradient
padded to n chunks, the chunks of all parameters interleaved rank by rank into one buffer, one
ReduceScatter (AVG), and rank r's output is its chunk of every parameter's gradient, in order.

Compared with the flat design the bytes are the same up to padding (each parameter pads to n chunks
here, the unit's flat buffer pads once there), and nothing is a view of a shared buffer: parameters keep
their names, their dtypes (a unit mixing dtypes gathers them as bytes) and `requires_grad` each, so a
unit with frozen and trainable parameters needs no split and spends gradient memory on the trainable
ones only.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from fsdp_mini import collectives as C
from fsdp_mini.collective_calls import scope
from fsdp_mini.fsdp._fully_shard.fsdp_param import FSDPParam
from fsdp_mini.fsdp.grad_reduction import GradReduction, ReductionQueue
from fsdp_mini.fsdp.groups import MeshInfo
from fsdp_mini.memory import MemoryTracker
from fsdp_mini.fsdp.states import ReduceStage, ShardedState, TrainingState
from fsdp_mini.fsdp.units import UnitLifecycle
from fsdp_mini.torch_internals import chunk_cat_into
from fsdp_mini.weak_hooks import weak_hook

__all__ = ["FSDPParamGroup", "PendingGather"]


@dataclass
class PendingGather:
    """A unit's AllGather in flight (FSDP2's `AllGatherResult`): its work (None when a copy sufficed), the
    gathered rows (n, row), and each parameter's length in a row, for the copy-out."""

    work: object
    output: torch.Tensor
    lengths: list[int]


@dataclass
class PostForwardShards:
    """`reshard_after_forward=k`: the group of k ranks that share the gathered parameters between forward
    and backward, this rank's index in it, and its 1/k share of each parameter (flat, padded)."""

    group: object | None
    size: int
    rank: int
    shards: list[torch.Tensor] = field(default_factory=list)
    kept_bytes: int = 0


class FSDPParamGroup(UnitLifecycle):
    """The parameters that one `fully_shard(module)` call manages, their collectives, and their life in a
    step, as in FSDP2's `_fsdp_param_group.py`: `pre_forward`, `post_forward`, `pre_backward` (the
    lifecycle both designs share, `fsdp_mini.fsdp.units.UnitLifecycle`), `post_backward` and
    `finalize_backward` make every state transition, gather, prefetch, wait and choose how to reshard; the
    module's `FSDPState` only calls them from its hooks. The group decides when backward is done with it
    (`maybe_post_backward`).

    When is a unit's backward over? When every trainable parameter has its gradient *and* the gradients
    with respect to the unit's inputs have been computed (frozen parameters are still needed until then,
    e.g. a LoRA layer's base weight for the input gradient). The first is counted by hooks on the gathered
    parameters, the second by the unit's state on the inputs that require grad (`hooked_calls`,
    `inputs_grad_ready`); a unit whose inputs need no gradient (the first one) ends on its parameters alone,
    and the end of backward mops up."""

    def __init__(self, params: list[FSDPParam], label: str, mesh_info: MeshInfo, impl: str,
                 gathered_memory: MemoryTracker, reshard_after_forward: bool,
                 post_forward_shards: PostForwardShards | None):
        self.params, self.label, self.mesh_info, self.impl = params, label, mesh_info, impl
        self.gathered_memory = gathered_memory  # the tracker of gathered bytes, shared by the root's units
        # after forward: free the gathered parameters (True), keep them (False), or keep a 1/k share
        # (`post_forward_shards`, with `reshard_after_forward` False)
        self.reshard_after_forward = reshard_after_forward
        self.post_forward_shards = post_forward_shards
        self.auto_reshard_after_forward = False  # `fully_shard(reshard_after_forward=None)`: the root keeps
        self.reshard_after_backward = True
        self.requires_gradient_sync = True
        self.is_root = False  # set by the root's lazy initialisation, with `reductions`
        self.reductions: ReductionQueue | None = None
        # this step's forward calls that hooked their inputs, and how many of those backward has finished
        self.hooked_calls = 0
        self.finished_calls = 0
        self.sharded_state = ShardedState.SHARDED
        self.training_state = TrainingState.IDLE
        self.gather: PendingGather | None = None  # the AllGather in flight (a flat handle's has its own fields)
        # the unit's own ReduceScatters in flight, one per reduce dtype (a flat handle's `grad_reduction`)
        self.grad_reductions: list[GradReduction] = []
        self.divide_factor: float | None = None  # set_gradient_divide_factor: sum, then divide by it
        self.force_sum_reduction_for_comms = False  # sum in the collectives, divide afterwards (FSDP2's name)
        self.all_reduce_hook = None  # set_all_reduce_hook: called with each reduced chunk before it is divided
        self.unshard_in_backward = True  # False: backward does not gather (set_unshard_in_backward)
        self.all_reduce_grads = True  # HSDP: False holds the chunks back from the replica all-reduce
        self.partial_outputs: dict[tuple[int, ...], torch.Tensor] = {}  # those chunks, per reduction
        self.grads_ready = 0
        self.expected_grads: int | None = None
        # ids of the parameters whose modules the root's forward did not run (a unit's forward completed by
        # the root, FSDPState._force_complete_incomplete_states): this backward brings them no gradient
        self.params_not_run: set[int] = set()
        self.post_forward_indices: list[int] = []  # where this unit's post-forwards are in the root's order

    @property
    def trainable(self) -> list[FSDPParam]:
        """The parameters that require grad now (read each time: freezing after `fully_shard` counts)."""
        return [p for p in self.params if p.requires_grad]

    @property
    def as_bytes(self) -> bool:
        """A unit mixing compute dtypes gathers its parameters as bytes, in one AllGather."""
        return len({p.compute_dtype for p in self.params}) > 1

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.params)

    def reset_sharded_params(self) -> None:
        """The module's parameters were converted (`module.to(dtype)`, `.to_empty()`: `FSDPModule._apply`):
        adopt them (`FSDPParam.reset_sharded_param`). Only when the unit is sharded: the caller reshards
        first, since after the conversion the module's attributes hold the new parameters."""
        assert self.sharded_state is ShardedState.SHARDED, "reshard() before converting the parameters"
        for p in self.params:
            p.reset_sharded_param()

    # --- the unit's life in a step (FSDP2's names) -----------------------------------------------------

    def lazy_init(self, label: str, is_root: bool, reductions: ReductionQueue) -> None:
        """At the root's first forward: the unit's label (its path from the root), whether it is the root's
        own, and the root's queue of reductions in flight. The root keeps its parameters after forward
        unless `reshard_after_forward` was given (FSDP2's default for the root)."""
        self.label, self.is_root, self.reductions = label, is_root, reductions
        if is_root and self.auto_reshard_after_forward:
            self.reshard_after_forward = False

    def keep_after_forward(self) -> None:
        """Kept after forward: every gathered parameter, or (`reshard_after_forward=k`) a 1/k share."""
        if self.post_forward_shards is not None:
            self.reshard_post_forward()

    # --- parameters ----------------------------------------------------------------------------------

    def unshard(self, async_op: bool = False) -> None:
        """Start gathering (from the full shard group, or from the post-forward group of k ranks)."""
        if self.sharded_state in (ShardedState.UNSHARDED, ShardedState.UNSHARDING):
            return
        if not self.unshard_in_backward and self.training_state is TrainingState.PRE_BACKWARD:
            return  # its backward needs no parameter values (an embedding's): its gradient comes without them
        from_post_forward = self.sharded_state is ShardedState.SHARDED_POST_FORWARD
        if from_post_forward:
            inputs, group, n = self.post_forward_shards.shards, self.post_forward_shards.group, self.post_forward_shards.size
        else:
            inputs = [p.copy_in(self.as_bytes) for p in self.params]
            group, n = self.mesh_info.shard_process_group, self.mesh_info.shard_mesh_size
        for p in self.params:
            p.alloc_all_gather_outputs()
        self.gathered_memory.alloc(self.nbytes, self.label)
        lengths = [t.numel() for t in inputs]
        row = inputs[0] if len(inputs) == 1 else torch.cat(inputs)
        output = torch.empty((n, row.numel()), dtype=row.dtype, device=row.device)
        work = None
        if group is None:
            output[0].copy_(row)
        else:
            with scope(self.label):
                work = C.all_gather_into_tensor(output.view(-1), row, group=group, async_op=True, impl=self.impl)
        self.gather = PendingGather(work, output, lengths)
        self.sharded_state = ShardedState.UNSHARDING
        if from_post_forward:  # the 1/k shares are the AllGather's input now (`row`), no longer kept
            self.gathered_memory.free(self.post_forward_shards.kept_bytes, self.label)
            self.post_forward_shards.shards, self.post_forward_shards.kept_bytes = [], 0
        if not async_op:
            self.wait_for_unshard()

    def prefetch_in_backward(self) -> None:
        """`UnitLifecycle.prefetch_in_backward`, as a unit in backward: one that does not gather in backward
        (`unshard_in_backward` False) is not prefetched."""
        if self.training_state is TrainingState.PRE_BACKWARD:
            return
        saved, self.training_state = self.training_state, TrainingState.PRE_BACKWARD
        try:
            self.unshard(async_op=True)
        finally:
            self.training_state = saved

    def wait_for_unshard(self) -> None:
        """Finish a pending gather: copy each parameter out of the gathered rows, swap it into the module."""
        if self.gather is None:
            return
        gather, self.gather = self.gather, None
        if gather.work is not None:
            gather.work.wait()
        output, lengths = gather.output, gather.lengths
        offset = 0
        for index, (p, length) in enumerate(zip(self.params, lengths)):
            p.copy_out(output, offset, length)
            offset += length
            p.to_unsharded()
            if p.requires_grad and not p.grad_hooked:
                p.unsharded.register_post_accumulate_grad_hook(weak_hook(self._on_grad, index))
                p.grad_hooked = True
        self.sharded_state = ShardedState.UNSHARDED

    def reshard(self) -> None:
        """Free the gathered parameters; the module sees the sharded ones again."""
        self.wait_for_unshard()
        if self.sharded_state is ShardedState.UNSHARDED:
            for p in self.params:
                p.free_unsharded_param()
            self.gathered_memory.free(self.nbytes, self.label)
        if self.sharded_state is ShardedState.SHARDED_POST_FORWARD:
            self.gathered_memory.free(self.post_forward_shards.kept_bytes, self.label)
            self.post_forward_shards.shards, self.post_forward_shards.kept_bytes = [], 0
        for p in self.params:
            p.to_sharded()
        self.sharded_state = ShardedState.SHARDED

    def reshard_post_forward(self) -> None:
        """After forward with `reshard_after_forward=k`: keep a 1/k share of each gathered parameter, so
        backward gathers from k ranks (a node, typically) instead of the whole shard group."""
        self.wait_for_unshard()
        pf = self.post_forward_shards
        pf.shards = [p.post_forward_chunk(pf.size, pf.rank, self.as_bytes) for p in self.params]
        pf.kept_bytes = sum(t.numel() * t.element_size() for t in pf.shards)
        for p in self.params:
            p.free_unsharded_param()
            p.to_sharded()
        self.gathered_memory.free(self.nbytes, self.label)
        self.gathered_memory.alloc(pf.kept_bytes, self.label)
        self.sharded_state = ShardedState.SHARDED_POST_FORWARD

    # --- gradients -----------------------------------------------------------------------------------

    def _on_grad(self, index: int, _tensor) -> None:
        """The post-accumulate-grad hook of parameter `index` (by index: `weak_hook`)."""
        p = self.params[index]
        if not p.grad_ready:
            p.grad_ready = True
            self.grads_ready += 1
            self.maybe_post_backward()

    def inputs_grad_ready(self, partial: bool = False) -> None:
        """Backward has computed the gradients of one forward call's inputs. `partial`: a call that ran only
        part of the unit (a chunked loss's head called alone after the root's forward ran the norm): no
        pre-backward reached it, and its backward is over now, whatever the rest of the unit's parameters
        do; as in FSDP2 (`is_partial_group_backward`, _fsdp_param_group.py:598), reduce what it produced and
        reshard, then forget the call, so that the unit's other calls (the root forward's) end as usual."""
        self.finished_calls += 1
        if partial:
            self.post_backward()
            self.hooked_calls -= 1
            self.finished_calls -= 1
            self._forget_grads()
            return
        self.maybe_post_backward()

    def maybe_post_backward(self) -> None:
        """The one place that decides backward is done with this unit: every trainable parameter has its
        gradient and every hooked forward call its input gradients."""
        if self.training_state in (TrainingState.IDLE, TrainingState.POST_BACKWARD):
            return
        if self.training_state is TrainingState.FORWARD:
            return  # a call that ran part of the unit: it ends on its inputs' gradients (inputs_grad_ready)
        if self.expected_grads is None:  # read once per backward: the parameters that require grad now
            self.expected_grads = len([p for p in self.trainable if id(p) not in self.params_not_run])
        if self.grads_ready == self.expected_grads and self.finished_calls == self.hooked_calls:
            self.post_backward()

    def post_backward(self) -> None:
        """Backward is done with this unit: start its reduction (or keep its gradients unreduced, without
        gradient sync), and free its parameters (the root's stay until the end of backward)."""
        self.training_state = TrainingState.POST_BACKWARD
        if self.requires_gradient_sync:
            self.start_grad_reduction()
            self.reductions.add(self)
        else:
            self.accumulate_unsharded_grad_if_needed()
        if not self.is_root and self.reshard_after_backward:
            self.reshard()

    def start_grad_reduction(self) -> None:
        """Start the ReduceScatter (AVG) of the unit's unsharded gradients into this rank's chunks: one per
        reduce dtype (one, unless the unit mixes dtypes without a policy). Only parameters that have a
        gradient take part: one the forward did not use keeps None (FSDP2 does the same, so every rank must
        leave the same parameters unused)."""
        by_dtype: dict[torch.dtype, list[tuple[FSDPParam, torch.Tensor]]] = {}
        for p in self.params:
            grad = p.take_unsharded_grad()
            if grad is not None:
                by_dtype.setdefault(p.reduce_dtype, []).append((p, grad))
        n, group = self.mesh_info.shard_mesh_size, self.mesh_info.shard_process_group
        for dtype, pairs in by_dtype.items():
            params, grads = [p for p, _ in pairs], [g for _, g in pairs]
            rows = torch.empty((n, sum(p.shard_numel for p in params)), dtype=dtype, device=grads[0].device)
            chunk_cat(grads, params, rows)  # row r: rank r's padded chunk of every gradient, in order
            full, output = rows.view(-1), torch.empty(rows.shape[1], dtype=dtype, device=rows.device)
            work = None
            if group is None:
                output.copy_(full)
            else:
                with scope(self.label):
                    work = C.reduce_scatter_tensor(output, full, self._reduce_op, group=group, async_op=True,
                                                   impl=self.impl)
            self.grad_reductions.append(GradReduction(ReduceStage.SCATTERING, work, output, full, params))

    def start_replica_reduce(self) -> None:
        """Once the ReduceScatters are done: free their inputs and, with replicas (HSDP), start averaging
        the gradient chunks across them (async), adding first what earlier backwards left unreduced across
        replicas (`all_reduce_grads` False: gradient accumulation that reduce-scatters in the node but
        crosses nodes once)."""
        for r in self.grad_reductions:
            if not r.finish_scatter() or self.mesh_info.replicate_process_group is None or not self.all_reduce_grads:
                continue
            held = self.partial_outputs.pop(_key(r.params), None)
            if held is not None:
                r.output += held
            r.start_replica_reduce(self.mesh_info.replicate_process_group, self._reduce_op, self.label, self.impl)

    def wait_for_grad_reduction(self) -> None:
        """Finish every reduction and give each sharded parameter its gradient (a DTensor); with replicas
        and `all_reduce_grads` False, keep the chunks for the next all-reduce instead."""
        self.start_replica_reduce()
        for r in self.grad_reductions:
            r.wait()
            if self.mesh_info.replicate_process_group is not None and not self.all_reduce_grads:
                key = _key(r.params)
                if key in self.partial_outputs:
                    self.partial_outputs[key] += r.output
                else:
                    self.partial_outputs[key] = r.output
                continue
            if self.all_reduce_hook is not None:  # FSDP2 calls it at the same point: reduced, not yet divided
                self.all_reduce_hook(r.output)
            if self._divide_after is not None:
                r.output.div_(self._divide_after)
            offset = 0
            for p in r.params:
                p.accumulate_sharded_grad(r.output[offset:offset + p.shard_numel])
                offset += p.shard_numel
        self.grad_reductions = []

    @property
    def _reduce_op(self):
        """AVG over the ranks, or SUM when a divide factor replaces the average or sums are forced."""
        return C.AVG if self._divide_after is None else C.SUM

    @property
    def _divide_after(self) -> float | None:
        """What the summed chunks are divided by once reduced: the divide factor, or (sums forced) the number
        of ranks the average would have spanned; None when the collectives average."""
        if self.divide_factor is not None:
            return self.divide_factor
        if self.force_sum_reduction_for_comms:
            return float(self.mesh_info.shard_mesh_size * self.mesh_info.replicate_mesh_size)
        return None

    def finalize_backward(self, wait: bool) -> None:
        """End of backward, for each unit the root's forward ran, after `reduce_at_end`: free the gathered
        parameters (unless `reshard_after_backward` is False), forget this backward's counts; `wait` (the
        last backward of the step) also forgets the step's post-forwards.

        A gather in flight for a unit whose backward is over was prefetched for a use that did not come (the
        unit that ran before in forward order ran in an earlier micro-batch, say). FSDP2's final callback
        finalizes only after the last backward (torch/distributed/fsdp/_fully_shard/_fsdp_state.py:418), so
        after any other the gather stays in flight and the next forward's `unshard` takes it without an
        AllGather (_fsdp_param_group.py:373); the last backward's `finalize_backward` waits for it and drops
        it (_fsdp_param_group.py:781). fsdp_mini does the same."""
        prefetched = (self.sharded_state is ShardedState.UNSHARDING
                      and self.training_state is TrainingState.POST_BACKWARD)
        if prefetched:
            if wait:
                self.reshard()
        elif self.reshard_after_backward:
            self.reshard()
        self.reset_backward()
        if wait:
            self.post_forward_indices.clear()

    def reduce_at_end(self) -> None:
        """End of backward: reduce what `post_backward` did not (unused parameters, gradients accumulated
        without sync), or keep accumulating without gradient sync."""
        if self.requires_gradient_sync and self not in self.reductions and self.has_unsharded_grads():
            self.start_grad_reduction()
            self.reductions.add_at_end(self)
        elif not self.requires_gradient_sync:
            self.accumulate_unsharded_grad_if_needed()

    def accumulate_unsharded_grad_if_needed(self) -> None:
        """A backward without gradient sync is done with this unit: keep its gradients for the next
        reduction, in the reduce dtype (`FSDPParam.accumulate_unsharded_grad_if_needed`)."""
        for p in self.params:
            p.accumulate_unsharded_grad_if_needed(p.reduce_dtype)

    def has_unsharded_grads(self) -> bool:
        return any(p.has_unsharded_grad() for p in self.params)

    def reset_iter_state(self) -> None:
        """After an exception aborted a forward or backward: finish what is in flight (every rank issued it),
        drop this step's gradients (reductions, unreduced and held-back ones) and its bookkeeping, reshard.
        FSDP2's `_reset_iter_state` does the same; the failed step's gradients are lost."""
        for r in self.grad_reductions:
            r.finish_scatter()
            r.wait()
        self.grad_reductions, self.partial_outputs = [], {}
        for p in self.params:
            p.drop_unsharded_grads()
        self.reshard()  # waits for a gather in flight first
        self.post_forward_indices.clear()
        self.reset_backward()

    def reset_backward(self) -> None:
        self.hooked_calls = self.finished_calls = 0
        self.params_not_run = set()
        self._forget_grads()
        self.training_state = TrainingState.IDLE

    def _forget_grads(self) -> None:
        """Forget which parameters have their gradient in this backward."""
        self.grads_ready = 0
        self.expected_grads = None
        for p in self.params:
            p.grad_ready = False

    def __repr__(self) -> str:
        return f"FSDPParamGroup({self.label}, {len(self.params)} params, {self.sharded_state.name})"


def _key(params: list[FSDPParam]) -> tuple[int, ...]:
    """Which parameters a reduction covers (the same ones each step, for a held-back all-reduce)."""
    return tuple(id(p) for p in params)


def chunk_cat(grads: list[torch.Tensor], params: list[FSDPParam], out: torch.Tensor) -> None:
    """Write each gradient padded to n chunks of its rows into `out` (n, sum of chunk lengths): row r is
    rank r's chunk of every gradient, in order. One kernel for the whole unit (`torch._chunk_cat`, what
    FSDP2 uses; it zero-fills the padding and casts to `out`'s dtype) instead of a padded copy and a
    concatenation per parameter. It wants one input dtype and no empty tensors (which hold no bytes here)."""
    kept = [p.as_shard_rows(g) for g, p in zip(grads, params) if p.shard_numel]  # Shard(d>0): chunks of d first
    if not kept:
        return
    if len({g.dtype for g in kept}) > 1:
        kept = [g.to(out.dtype) for g in kept]
    chunk_cat_into(kept, out.shape[0], out)


def post_forward_shards(mesh_info: MeshInfo, k: int) -> PostForwardShards:
    """The groups of k consecutive ranks of each shard group (a collective: every rank creates all)."""
    mesh = mesh_info.mesh.mesh
    rows = mesh.reshape(-1, mesh_info.shard_mesh_size).tolist()
    mine = None
    for row in rows:
        for start in range(0, len(row), k):
            ranks = row[start:start + k]
            pg = dist.new_group(ranks) if k > 1 else None
            if dist.get_rank() in ranks:
                mine = (pg, ranks.index(dist.get_rank()))
    return PostForwardShards(mine[0], k, mine[1])
