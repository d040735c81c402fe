"""Tensor parallelism from scratch: PyTorch's `parallelize_module` with `ColwiseParallel` and `RowwiseParallel`,
without DTensor. Each rank of the TP group keeps its slice of a Linear's weight as a plain `nn.Parameter`
and the layer's forward is wrapped in Megatron's `f` / `g` operators (`fsdp_mini.tensor.parallel.tp_operators`).

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

Sequence parallelism (Korthikanti et al., 2022; torchtitan's plan) keeps the activations between the TP
regions cut along the sequence, PyTorch's layouts and names:

    plan = {"ln_1": SequenceParallel(),                             # LayerNorm on this rank's positions
            "attn.qkv": ColwiseParallel(stacked=3, input_layouts=Shard(1)),   # g: AllGather in, RS back
            "attn.proj": RowwiseParallel(output_layouts=Shard(1)),            # ḡ: ReduceScatter out, AG back
            "ln_2": SequenceParallel(), "mlp.fc": ColwiseParallel(input_layouts=Shard(1)),
            "mlp.proj": RowwiseParallel(output_layouts=Shard(1))}

Each of TP's AllReduces becomes a ReduceScatter and an AllGather of the same tensor (the same bytes on the
wire); a norm's weights stay whole on every rank and its gradients, each rank's sum over its own positions,
are added over the TP group in backward (`SequenceParallel`). `PrepareModuleInput` moves a module's input
between replicated and sequence-sharded where a plan enters or leaves the sharded stream (after a
replicated embedding, before a replicated head). Without DTensor the layouts are not carried by the
tensors: a tensor is either replicated or this rank's sequence shard, and the plan says which.

The errors come before anything is changed or sent: a module that is not an nn.Linear (a norm, for
`SequenceParallel`), a TP degree that does not divide the sharded dimension, a layout a style cannot take,
a plan entry that matches nothing, a mesh that is not 1-D or a shape of dp x tp that is not the world
(`ParallelDims`); a sequence that the TP ranks cannot share evenly, at the first forward, on every rank.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.placement_types import Placement

from fsdp_mini import collectives as C
from fsdp_mini.collective_calls import scope
from fsdp_mini.parallel.data_parallel import broadcast_from_rank0
from fsdp_mini.tensor.parallel.tp_operators import (TP_LABEL, all_gather_linear, copy_to_tensor_model_parallel_region,
                                                    gather_from_sequence_parallel_region, reduce_from_tensor_model_parallel_region,
                                                    reduce_scatter_to_sequence_parallel_region, scatter_to_sequence_parallel_region)

__all__ = ["ParallelStyle", "ColwiseParallel", "RowwiseParallel", "SequenceParallel", "PrepareModuleInput",
           "parallelize_module", "ParallelDims", "ColumnParallelLinear", "RowParallelLinear",
           "SequenceParallelColumnLinear", "SequenceParallelRowLinear", "SequenceParallelLayerNorm",
           "SequenceParallelRMSNorm", "TPShard", "gather_tensor_parallel", "TP_LABEL", "Replicate", "Shard"]


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
    sequence_dim: int | None = None  # sequence parallelism: the activations' dim cut at the input (column
    # parallel) or output (row parallel); None: replicated activations, Megatron's f and g
    save_gathered_input: bool = True  # column parallel under SP: keep the gathered input for backward
    # (PyTorch), or only its shard and all-gather it again in backward (Megatron-LM, `all_gather_linear`)

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


def _check_not_the_features(x: torch.Tensor, shard: TPShard, what: str) -> None:
    """Shard(d) names the sequence: on a tensor of d + 1 dims that would be the features (a clear error, the
    same on every rank, before anything is sent)."""
    if shard.sequence_dim >= x.dim() - 1:
        raise ValueError(f"{shard.label[len(TP_LABEL):].strip() or 'the module'}: {what}=Shard({shard.sequence_dim}) "
                         f"names the sequence dim, but an input of shape {tuple(x.shape)} has no dim "
                         f"{shard.sequence_dim} before its features")


class SequenceParallelColumnLinear(ColumnParallelLinear):
    """A ColumnParallelLinear whose input is this rank's sequence shard (`ColwiseParallel(input_layouts=Shard(d))`):
    `g` (AllGather in forward, ReduceScatter of the input's gradient in backward) instead of `f`. Autograd keeps
    the gathered input (PyTorch), or with `save_gathered_input=False` only its shard, gathered again in backward
    (Megatron-LM: `all_gather_linear`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shard = self.tp_shard
        _check_not_the_features(x, shard, "input_layouts")
        if not shard.save_gathered_input:
            return all_gather_linear(x, self.weight, self.bias, shard.group, shard.label, shard.sequence_dim)
        return F.linear(gather_from_sequence_parallel_region(x, shard.group, shard.label, shard.sequence_dim),
                        self.weight, self.bias)


class SequenceParallelRowLinear(RowParallelLinear):
    """A RowParallelLinear whose output is this rank's sequence shard (`RowwiseParallel(output_layouts=Shard(d))`):
    `ḡ` (ReduceScatter in forward, AllGather of the gradient in backward) instead of `g`. The bias, whole, is
    added once to the summed shard, through `f`: each rank's gradient of it covers its own positions only,
    and backward adds them over the group (Megatron all-reduces such a bias's gradient with the norms')."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shard = self.tp_shard
        _check_not_the_features(x, shard, "output_layouts")
        out = reduce_scatter_to_sequence_parallel_region(F.linear(x, self.weight), shard.group, shard.label,
                                                         shard.sequence_dim)
        if self.bias is None:
            return out
        return out + copy_to_tensor_model_parallel_region(self.bias, shard.group, shard.label)


@dataclass(frozen=True)
class SequenceParallelNorm:
    """What a norm under `SequenceParallel` knows: the TP group over which its weights' gradients are added."""

    group: object
    label: str

    def whole(self, param: torch.Tensor | None) -> torch.Tensor | None:
        """`param` as the norm uses it: `f` (identity now; in backward the AllReduce of the ranks' gradients,
        each a sum over this rank's positions only)."""
        return None if param is None else copy_to_tensor_model_parallel_region(param, self.group, self.label)


class SequenceParallelLayerNorm(nn.LayerNorm):
    """A LayerNorm after `SequenceParallel`: computes on this rank's positions, its weights whole."""

    sequence_parallel: SequenceParallelNorm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sp = self.sequence_parallel
        return F.layer_norm(x, self.normalized_shape, sp.whole(self.weight), sp.whole(self.bias), self.eps)


class SequenceParallelRMSNorm(nn.RMSNorm):
    """An RMSNorm after `SequenceParallel`: computes on this rank's positions, its weight whole."""

    sequence_parallel: SequenceParallelNorm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.normalized_shape, self.sequence_parallel.whole(self.weight), self.eps)


_TP_CLASSES = (ColumnParallelLinear, RowParallelLinear, SequenceParallelLayerNorm, SequenceParallelRMSNorm)


def _sequence_dim_of(style: str, what: str, layout, allowed: tuple[str, ...]) -> int | None:
    """A layout given to a style as the sequence dim it names: None for Replicate(), d for Shard(d), d >= 0
    (Shard(-1), the features, is the cut the style makes itself); a clear error for the others."""
    if layout is None or isinstance(layout, Replicate) and "Replicate()" in allowed:
        return None
    if isinstance(layout, Shard) and layout.dim >= 0 and "Shard(d)" in allowed:
        return layout.dim
    named = {"Replicate()": "Replicate()", "Shard(d)": "Shard(d) with d >= 0 (the sequence dim, e.g. Shard(1))"}
    raise ValueError(f"{style}: {what}={layout!r} is not supported; use " + " or ".join(named[a] for a in allowed))


class ParallelStyle:
    """How one module is parallelized (PyTorch's base class of the same name). `check` raises before any
    change; `apply` changes the module. The base's pair is the Linear cut that ColwiseParallel and
    RowwiseParallel share (its parameters cut, its forward wrapped); SequenceParallel and PrepareModuleInput
    have their own."""

    linear_class: type[nn.Linear]
    dim: int  # the weight's dimension that is cut
    sequence_dim: int | None = None  # the activations' sequence dim at the cut side, None: replicated
    broadcasts_parameters = True  # parallelize_module first copies TP rank 0's values of the module's parameters

    def check(self, module: nn.Module, path: str, tp: int) -> None:
        name = type(self).__name__
        if not isinstance(module, nn.Linear):
            raise ValueError(f"{name} applies to nn.Linear, but {_named(path)} is a {type(module).__name__}")
        _not_parallel_yet(module, path)

    def apply(self, module: nn.Linear, path: str, tp: int, rank: int, group) -> None:
        shard = TPShard(self.dim, tp, rank, getattr(self, "stacked", 1), group, f"{TP_LABEL} {path}".rstrip(),
                        self.sequence_dim, getattr(self, "save_gathered_input", True))
        with torch.no_grad():
            module.weight = nn.Parameter(shard.local(module.weight, self.dim), module.weight.requires_grad)
            if module.bias is not None and self.dim == 0:  # a row-parallel layer keeps its bias whole
                module.bias = nn.Parameter(shard.local(module.bias, 0), module.bias.requires_grad)
        module.out_features, module.in_features = module.weight.shape
        _become(module, self.sp_linear_class if self.sequence_dim is not None else self.linear_class)
        module.tp_shard = shard


def _not_parallel_yet(module: nn.Module, path: str) -> None:
    if isinstance(module, _TP_CLASSES):
        raise ValueError(f"{_named(path)} is already tensor-parallel ({type(module).__name__})")


def _become(module: nn.Module, cls: type) -> None:
    """Give `module` the parallel class `cls` (for a subclass of the plain one, a class derived from both)."""
    own = type(module)
    module.__class__ = cls if own in cls.__mro__ else type(f"{cls.__name__}{own.__name__}", (cls, own), {})


@dataclass(frozen=True)
class ColwiseParallel(ParallelStyle):
    """Shard an nn.Linear by output features (rows of its weight, and its bias): input replicated, output
    sharded on the last dimension (PyTorch's defaults, `Replicate()` in, `Shard(-1)` out, local tensors).

    `stacked`: the weight is this many matrices stacked along dim 0, each cut on its own. Attention often
    fuses q, k and v into one Linear whose weight is [q; k; v], 3C x C. Cut into tp plain row blocks, rank 0
    of 2 would get all of q and half of k: the wrong heads. `ColwiseParallel(stacked=3)` cuts q, k and v
    each into tp blocks and stacks rank r's three blocks again, so its output is [q_r | k_r | v_r]: the same
    heads of q, k and v (heads r·h/tp .. (r+1)·h/tp), and `.chunk(3, dim=-1)` splits it as before.
    (Megatron instead stores its fused weight interleaved head by head, so that a plain cut works.)

    `save_gathered_input` (fsdp_mini's, not PyTorch's): with `input_layouts=Shard(d)`, False keeps only the
    input's shard for backward and all-gathers it again there, as Megatron-LM does (one more AllGather per
    step, 1/tp of the input kept); True, PyTorch's behaviour, keeps the gathered input."""

    stacked: int = 1
    input_layouts: Placement | None = field(default=None, kw_only=True)
    output_layouts: Placement | None = field(default=None, kw_only=True)
    save_gathered_input: bool = field(default=True, kw_only=True)
    linear_class = ColumnParallelLinear
    sp_linear_class = SequenceParallelColumnLinear
    dim = 0

    def __post_init__(self):
        if not isinstance(self.stacked, int) or isinstance(self.stacked, bool) or self.stacked < 1:
            raise ValueError(f"stacked must be a positive number of matrices, got {self.stacked!r}")
        sequence_dim = _sequence_dim_of("ColwiseParallel", "input_layouts", self.input_layouts,
                                        ("Replicate()", "Shard(d)"))
        if self.output_layouts is not None and self.output_layouts != Shard(-1):
            raise ValueError(f"ColwiseParallel: output_layouts={self.output_layouts!r} is not supported; its "
                             f"output is sharded on the features, Shard(-1)")
        if not isinstance(self.save_gathered_input, bool):
            raise ValueError(f"ColwiseParallel: save_gathered_input must be True or False, got "
                             f"{self.save_gathered_input!r}")
        if not self.save_gathered_input and sequence_dim is None:
            raise ValueError("ColwiseParallel: save_gathered_input=False keeps a sequence shard of the input, so it "
                             "needs a sequence-sharded input: input_layouts=Shard(d) (e.g. Shard(1))")
        object.__setattr__(self, "sequence_dim", sequence_dim)

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
    after the AllReduce): input sharded on its last dimension, output replicated (PyTorch's defaults).
    `output_layouts=Shard(1)`: the output is this rank's sequence shard, a ReduceScatter instead of the
    AllReduce (sequence parallelism)."""

    input_layouts: Placement | None = field(default=None, kw_only=True)
    output_layouts: Placement | None = field(default=None, kw_only=True)
    linear_class = RowParallelLinear
    sp_linear_class = SequenceParallelRowLinear
    dim = 1

    def __post_init__(self):
        if self.input_layouts is not None and self.input_layouts != Shard(-1):
            raise ValueError(f"RowwiseParallel: input_layouts={self.input_layouts!r} is not supported; its input "
                             f"is sharded on the features, Shard(-1) (a column-parallel layer's output)")
        object.__setattr__(self, "sequence_dim", _sequence_dim_of("RowwiseParallel", "output_layouts",
                                                                  self.output_layouts, ("Replicate()", "Shard(d)")))

    def check(self, module: nn.Module, path: str, tp: int) -> None:
        super().check(module, path, tp)
        if module.in_features % tp:
            raise ValueError(f"the tensor-parallel degree {tp} does not divide {_named(path)}'s "
                             f"{module.in_features} input features (RowwiseParallel cuts them into {tp} equal pieces)")


@dataclass(frozen=True)
class SequenceParallel(ParallelStyle):
    """Run a norm on this rank's sequence shard (PyTorch's style of the same name, for nn.LayerNorm and
    nn.RMSNorm): its input is the shard, its output too; its weights stay whole on every rank, and their
    gradients, which each rank sums over its own positions only, are added over the TP group in backward
    (Megatron all-reduces the LayerNorms' gradients too; PyTorch leaves them `Partial(sum)` DTensors after
    backward and sums them where they are next used: the same bytes). The activations it computes and keeps
    are 1/tp.
    PyTorch's `sequence_dim` and `use_local_output` describe DTensors; here the input is a plain local
    tensor, and a norm over the last dim needs no more."""

    classes = {nn.LayerNorm: SequenceParallelLayerNorm, nn.RMSNorm: SequenceParallelRMSNorm}
    broadcasts_parameters = True

    def check(self, module: nn.Module, path: str, tp: int) -> None:
        _not_parallel_yet(module, path)
        if not isinstance(module, tuple(self.classes)):
            raise ValueError(f"SequenceParallel applies to nn.LayerNorm and nn.RMSNorm, but {_named(path)} is a "
                             f"{type(module).__name__}")

    def apply(self, module: nn.Module, path: str, tp: int, rank: int, group) -> None:
        base = next(b for b in self.classes if isinstance(module, b))
        _become(module, self.classes[base])
        module.sequence_parallel = SequenceParallelNorm(group, f"{TP_LABEL} {path}".rstrip())


def _layouts(value) -> tuple:
    return (value,) if value is None or isinstance(value, Placement) else tuple(value)


@dataclass(frozen=True)
class PrepareModuleInput(ParallelStyle):
    """Move a module's positional inputs from `input_layouts` to `desired_input_layouts` before its forward
    (PyTorch's style of the same name; a single layout or a tuple, one per input, None: leave it alone).
    Two moves, where a plan enters or leaves the sequence-sharded stream:

      Replicate() -> Shard(d)   keep this rank's chunk of dim d; backward: AllGather of the gradient
      Shard(d) -> Replicate()   AllGather along d; backward: keep this rank's chunk of the gradient

    The second one is right when every rank computes the same gradient for the gathered tensor, which is
    so for replicated work and also before a column-parallel layer with its own `f` (the gradient is added
    there); `ColwiseParallel(input_layouts=Shard(d))` does the same with half the bytes in backward."""

    input_layouts: Placement | tuple | None = field(default=None, kw_only=True)
    desired_input_layouts: Placement | tuple | None = field(default=None, kw_only=True)
    broadcasts_parameters = False  # it cuts no parameter

    def __post_init__(self):
        have, want = _layouts(self.input_layouts), _layouts(self.desired_input_layouts)
        if len(have) != len(want):
            raise ValueError(f"PrepareModuleInput: input_layouts {have} and desired_input_layouts {want} should "
                             f"have the same length")
        moves = []
        for a, b in zip(have, want):
            if a == b:
                moves.append(None)
            elif isinstance(a, Replicate) and isinstance(b, Shard) and b.dim >= 0:
                moves.append(("scatter", b.dim))
            elif isinstance(a, Shard) and a.dim >= 0 and isinstance(b, Replicate):
                moves.append(("gather", a.dim))
            else:
                raise ValueError(f"PrepareModuleInput: from {a!r} to {b!r} is not supported; it moves Replicate() "
                                 f"to Shard(d) or Shard(d) to Replicate(), d >= 0")
        object.__setattr__(self, "moves", tuple(moves))

    def check(self, module: nn.Module, path: str, tp: int) -> None:
        pass

    def apply(self, module: nn.Module, path: str, tp: int, rank: int, group) -> None:
        label, moves = f"{TP_LABEL} {path} input".replace("  ", " "), self.moves

        def prepare(_module, args):
            out = list(args)
            for i, move in enumerate(moves[:len(out)]):
                if move is None or not isinstance(out[i], torch.Tensor):
                    continue
                kind, dim = move
                out[i] = (scatter_to_sequence_parallel_region(out[i], group, label, dim) if kind == "scatter" else
                          gather_from_sequence_parallel_region(out[i], group, label, dim,
                                                               tensor_parallel_output_grad=False))
            return tuple(out)

        module.register_forward_pre_hook(prepare)


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
            raise ValueError(f"plan entry {pattern!r}: expected a ParallelStyle (ColwiseParallel, RowwiseParallel, "
                             f"SequenceParallel, PrepareModuleInput), "
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
        broadcast_from_rank0([p.data for _, sub, style in todo if style.broadcasts_parameters
                              for p in sub.parameters(recurse=False) if not p.is_meta], group=group)
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
