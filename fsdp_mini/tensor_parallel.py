"""Tensor parallelism from scratch: PyTorch's `parallelize_module` with `ColwiseParallel` and `RowwiseParallel`,
without DTensor. Each rank of the TP group keeps its slice of a Linear's weight as a plain `nn.Parameter`
and the layer's forward is wrapped in Megatron's `f` / `g` operators (`fsdp_mini.tp_operators`).

    plan = {"attn.qkv": ColwiseParallel(stacked=3), "attn.proj": RowwiseParallel(),
            "mlp.fc": ColwiseParallel(), "mlp.proj": RowwiseParallel()}
    mesh = ParallelDims(dp=2, tp=2, world_size=4).build_mesh("cpu")      # ("dp", "tp"), TP innermost
    for block in model.blocks:
        parallelize_module(block, mesh["tp"], plan)   # TP inside each block...
        fully_shard(block, mesh=mesh["dp"])           # ...then FSDP over the other dimension
    fully_shard(model, mesh=mesh["dp"])

Column parallel (`ColwiseParallel`, Megatron's ColumnParallelLinear): rank r keeps rows r of the weight
[out, in] and of the bias, i.e. output features r·out/tp .. (r+1)·out/tp. Input whole (replicated), output
sharded on its last dimension; forward is `F.linear(f(x), W_r, b_r)`. Row parallel (`RowwiseParallel`,
RowParallelLinear): rank r keeps columns r of the weight, its input is the matching slice of features (a
column-parallel layer's output), the products are partial sums, `g` adds them, and the bias, whole on every
rank, is added once, after the AllReduce (added before, it would count tp times). A column layer followed by
a row layer (attention's qkv then proj, the MLP's fc then proj) needs no communication in between.

The errors come before anything is changed or sent: a module that is not an nn.Linear, a TP degree that does
not divide the sharded dimension, a plan entry that matches nothing, a mesh that is not 1-D or a shape of
dp x tp that is not the world (`ParallelDims`).
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from fsdp_mini import collectives as C
from fsdp_mini.comm_log import scope
from fsdp_mini.data_parallel import broadcast_from_rank0
from fsdp_mini.tp_operators import (TP_LABEL, copy_to_tensor_model_parallel_region,
                                    reduce_from_tensor_model_parallel_region)

__all__ = ["ParallelStyle", "ColwiseParallel", "RowwiseParallel", "parallelize_module", "ParallelDims",
           "ColumnParallelLinear", "RowParallelLinear", "TPShard", "gather_tensor_parallel", "TP_LABEL"]


@dataclass(frozen=True)
class TPShard:
    """What a rank holds of one parallelized Linear: which dimension of its weight is cut (0: rows, column
    parallel; 1: columns, row parallel), into how many pieces, this rank's piece, and how many matrices are
    stacked along dim 0 (each cut on its own). How `gather_tensor_parallel` puts the full tensors back."""

    dim: int
    tp: int
    rank: int
    stacked: int
    group: object
    label: str

    def local(self, full: torch.Tensor, dim: int) -> torch.Tensor:
        """This rank's piece of `full` cut along `dim` (dim 0 of a stacked tensor: each matrix's own piece)."""
        if dim == 0:
            per = full.shape[0] // self.stacked // self.tp
            pieces = full.unflatten(0, (self.stacked, self.tp, per))[:, self.rank]
            return pieces.flatten(0, 1).clone()
        return full.chunk(self.tp, dim=dim)[self.rank].clone()

    def full(self, pieces: list[torch.Tensor], dim: int) -> torch.Tensor:
        """The inverse of `local`: every rank's piece, in TP rank order, back into one tensor."""
        if dim == 0:
            return torch.stack([p.unflatten(0, (self.stacked, -1)) for p in pieces], dim=1).flatten(0, 2)
        return torch.cat(pieces, dim=dim)


class ColumnParallelLinear(nn.Linear):
    """A Linear after `ColwiseParallel`: its weight and bias are this rank's rows (output features)."""

    tp_shard: TPShard

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(copy_to_tensor_model_parallel_region(x, self.tp_shard.group, self.tp_shard.label),
                        self.weight, self.bias)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", tp={self.tp_shard.tp} (rows of {self.tp_shard.stacked} stacked)"


class RowParallelLinear(nn.Linear):
    """A Linear after `RowwiseParallel`: its weight is this rank's columns (input features), its bias whole."""

    tp_shard: TPShard

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = reduce_from_tensor_model_parallel_region(F.linear(x, self.weight), self.tp_shard.group,
                                                       self.tp_shard.label)
        return out if self.bias is None else out + self.bias  # once, after the sum of the partial products

    def extra_repr(self) -> str:
        return super().extra_repr() + f", tp={self.tp_shard.tp} (columns)"


class ParallelStyle:
    """How one module is parallelized (PyTorch's base class of the same name). `check` raises before any
    change; `apply` cuts the module's parameters and wraps its forward."""

    linear_class: type[nn.Linear]
    dim: int  # the weight's dimension that is cut

    def check(self, module: nn.Module, path: str, tp: int) -> None:
        name = type(self).__name__
        if not isinstance(module, nn.Linear):
            raise ValueError(f"{name} applies to nn.Linear, but {_named(path)} is a {type(module).__name__}")
        if isinstance(module, (ColumnParallelLinear, RowParallelLinear)):
            raise ValueError(f"{_named(path)} is already tensor-parallel ({type(module).__name__})")

    def apply(self, module: nn.Linear, path: str, tp: int, rank: int, group) -> None:
        shard = TPShard(self.dim, tp, rank, getattr(self, "stacked", 1), group, f"{TP_LABEL} {path}".rstrip())
        with torch.no_grad():
            module.weight = nn.Parameter(shard.local(module.weight, self.dim), module.weight.requires_grad)
            if module.bias is not None and self.dim == 0:  # a row-parallel layer keeps its bias whole
                module.bias = nn.Parameter(shard.local(module.bias, 0), module.bias.requires_grad)
        module.out_features, module.in_features = module.weight.shape
        cls = type(module)
        module.__class__ = self.linear_class if cls is nn.Linear else type(
            f"{self.linear_class.__name__}{cls.__name__}", (self.linear_class, cls), {})
        module.tp_shard = shard


@dataclass(frozen=True)
class ColwiseParallel(ParallelStyle):
    """Shard an nn.Linear by output features (rows of its weight, and its bias): input replicated, output
    sharded on the last dimension (PyTorch's defaults, `Replicate()` in, `Shard(-1)` out, local tensors).

    `stacked`: the weight is this many matrices stacked along dim 0, each cut on its own. Attention often
    fuses q, k and v into one Linear whose weight is [q; k; v], 3C x C. Cut into tp plain row blocks, rank 0
    of 2 would get all of q and half of k: the wrong heads. `ColwiseParallel(stacked=3)` cuts q, k and v
    each into tp blocks and stacks rank r's three blocks again, so its output is [q_r | k_r | v_r]: the same
    heads of q, k and v (heads r·h/tp .. (r+1)·h/tp), and `.chunk(3, dim=-1)` splits it as before.
    (Megatron instead stores its fused weight interleaved head by head, so that a plain cut works.)"""

    stacked: int = 1
    linear_class = ColumnParallelLinear
    dim = 0

    def __post_init__(self):
        if not isinstance(self.stacked, int) or isinstance(self.stacked, bool) or self.stacked < 1:
            raise ValueError(f"stacked must be a positive number of matrices, got {self.stacked!r}")

    def check(self, module: nn.Module, path: str, tp: int) -> None:
        super().check(module, path, tp)
        out = module.out_features
        if out % self.stacked:
            raise ValueError(f"{_named(path)}: {out} output features are not {self.stacked} stacked matrices of "
                             f"equal size")
        per = out // self.stacked
        if per % tp:
            what = f"{out} output features" if self.stacked == 1 else \
                f"{per} output features of each of its {self.stacked} stacked matrices"
            raise ValueError(f"the tensor-parallel degree {tp} does not divide {_named(path)}'s {what} "
                             f"(ColwiseParallel cuts them into {tp} equal pieces)")


@dataclass(frozen=True)
class RowwiseParallel(ParallelStyle):
    """Shard an nn.Linear by input features (columns of its weight; the bias stays whole and is added once
    after the AllReduce): input sharded on its last dimension, output replicated (PyTorch's defaults)."""

    linear_class = RowParallelLinear
    dim = 1

    def check(self, module: nn.Module, path: str, tp: int) -> None:
        super().check(module, path, tp)
        if module.in_features % tp:
            raise ValueError(f"the tensor-parallel degree {tp} does not divide {_named(path)}'s "
                             f"{module.in_features} input features (RowwiseParallel cuts them into {tp} equal pieces)")


def _named(path: str) -> str:
    return path or "the module"


def _resolve(module: nn.Module, pattern: str) -> list[tuple[str, nn.Module]]:
    """The submodules whose path matches `pattern`, atom by atom with fnmatch ("blocks.*.mlp.fc"), as
    PyTorch's parallelize_module matches its plan's keys."""
    found = [("", module)]
    for atom in pattern.split("."):
        found = [(f"{path}.{name}".lstrip("."), child) for path, m in found for name, child in m.named_children()
                 if fnmatch.fnmatch(name, atom)]
    return found


def parallelize_module(module: nn.Module, device_mesh=None, parallelize_plan=None, *,
                       src_data_rank: int | None = 0) -> nn.Module:
    """Apply a tensor-parallel plan to `module` over `device_mesh`, PyTorch's signature: a 1-D DeviceMesh
    (the TP dimension, e.g. `mesh["tp"]`); `parallelize_plan`: {module path pattern: ParallelStyle}, or one
    style for `module` itself. `src_data_rank=0`: first copy the TP group's rank 0's full weights of the
    parallelized layers to the others (PyTorch scatters from that rank too); None: each rank cuts its own
    copy (every rank must have built the same weights). Returns `module`, changed in place.

    Every entry is checked before anything is changed or sent."""
    from torch.distributed.device_mesh import DeviceMesh

    if not isinstance(device_mesh, DeviceMesh):
        raise ValueError(f"device_mesh must be a 1-D DeviceMesh (the tensor-parallel dimension, e.g. mesh['tp']), "
                         f"got {type(device_mesh).__name__}")
    if device_mesh.ndim != 1:
        raise ValueError(f"device_mesh must be 1-D (the tensor-parallel dimension), got a mesh of shape "
                         f"{tuple(device_mesh.mesh.shape)}: pass mesh['tp']")
    if src_data_rank not in (0, None):
        raise ValueError(f"src_data_rank must be 0 or None, got {src_data_rank!r}")
    plan = {"": parallelize_plan} if isinstance(parallelize_plan, ParallelStyle) else parallelize_plan
    if not isinstance(plan, dict) or not plan:
        raise ValueError("parallelize_plan must be a ParallelStyle or a non-empty dict {module path: ParallelStyle}")
    tp = device_mesh.size()
    todo: list[tuple[str, nn.Module, ParallelStyle]] = []
    for pattern, style in plan.items():
        if not isinstance(style, ParallelStyle):
            raise ValueError(f"plan entry {pattern!r}: expected a ParallelStyle (ColwiseParallel, RowwiseParallel), "
                             f"got {type(style).__name__}")
        matched = _resolve(module, pattern) if pattern else [("", module)]
        if not matched:
            raise ValueError(f"plan entry {pattern!r} matches no submodule of {type(module).__name__}")
        for path, sub in matched:
            style.check(sub, path, tp)
            todo.append((path, sub, style))
    if dist.get_rank() not in device_mesh.mesh.flatten().tolist():
        raise ValueError(f"rank {dist.get_rank()} is not in the tensor-parallel mesh {device_mesh.mesh.tolist()}")
    group, rank = device_mesh.get_group(), device_mesh.get_local_rank()
    if src_data_rank == 0 and tp > 1:
        broadcast_from_rank0([p.data for _, sub, _ in todo for p in sub.parameters(recurse=False)
                              if not p.is_meta], group=group)
    for path, sub, style in todo:
        style.apply(sub, path, tp, rank, group)
    return module


@dataclass(frozen=True)
class ParallelDims:
    """The degrees of a 2-D job, checked against the world (torchtitan's class of the same name):
    `dp` x `tp` must be `world_size`. `build_mesh` lays TP out innermost (rank = i_dp * tp + i_tp): with ranks
    numbered node by node, a TP group is `tp` consecutive ranks, inside one node when tp divides the GPUs
    per node, so its AllReduces (two per block, forward and backward) stay on the fast links."""

    dp: int
    tp: int
    world_size: int

    def __post_init__(self):
        for name in ("dp", "tp", "world_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.dp * self.tp != self.world_size:
            raise ValueError(f"a mesh of dp x tp = {self.dp} x {self.tp} = {self.dp * self.tp} ranks does not match "
                             f"the world of {self.world_size} ranks")

    def build_mesh(self, device_type: str = "cpu"):
        """`init_device_mesh(device_type, (dp, tp), mesh_dim_names=("dp", "tp"))`, after checking the world."""
        from torch.distributed.device_mesh import init_device_mesh

        if dist.is_initialized() and dist.get_world_size() != self.world_size:
            raise ValueError(f"ParallelDims was made for {self.world_size} ranks, but the world has "
                             f"{dist.get_world_size()}")
        return init_device_mesh(device_type, (self.dp, self.tp), mesh_dim_names=("dp", "tp"))


def gather_tensor_parallel(module: nn.Module, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The full tensors from this rank's pieces: `tensors` is keyed by `module`'s parameter names (its
    state dict, `fully_shard`'s `full_state_dict`, or the parameters' gradients); each piece of a
    tensor-parallel Linear is gathered over its TP group (one logged AllGather) and put back together,
    everything else is returned as it is. Collective over the TP groups (every rank, same keys)."""
    owners = {}
    for path, m in module.named_modules():
        if isinstance(m, (ColumnParallelLinear, RowParallelLinear)):
            owners[f"{path}.weight".lstrip(".")] = (m.tp_shard, m.tp_shard.dim)
            if m.tp_shard.dim == 0:
                owners[f"{path}.bias".lstrip(".")] = (m.tp_shard, 0)
    out = {}
    for name, t in tensors.items():
        if name not in owners or t is None:
            out[name] = t
            continue
        shard, dim = owners[name]
        local = t.detach().contiguous()
        gathered = torch.empty(shard.tp * local.numel(), dtype=local.dtype, device=local.device)
        with scope(f"{shard.label} gather"):
            C.all_gather_into_tensor(gathered, local.view(-1), group=shard.group)
        out[name] = shard.full([piece.view_as(local) for piece in gathered.chunk(shard.tp)], dim)
    return out
