"""Lesson 08's exercises: porting a training loop to PyTorch FSDP2, written by the learner.

1. `wrap_fsdp2(model, mesh, reshard_after_forward)`: `fully_shard` on every block, then on the root, over a
   given mesh. Run on real ranks with a 1-D mesh (2 ranks, ZeRO-3 and ZeRO-2) and a 2-D hybrid mesh (2 nodes
   of 2); judged by what FSDP2 built (the number of FSDP units, every parameter a DTensor on the mesh with
   the mesh's placements, what forward leaves on a block) and by parity of three SGD steps with one process.
2. `gather_full_state(model)`: the full state dict of an FSDP2 model on every rank. Judged on 3 ranks
   (FULL_SHARD: 61 rows split 21/20/20) and 4 (HYBRID_SHARD) after two training steps, by its keys, its
   values' types and shapes and its values against the same model trained by one process.
"""
from __future__ import annotations

import functools

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard

from fsdp_mini.course.exercise import CodeExercise, NotYet, Verdict
from fsdp_mini.course.language import tr
from fsdp_mini.course.models import GPT, Block, GPTConfig
from fsdp_mini.course.pytorch_equivalent import wrap_like_pytorch
from fsdp_mini.course.train import train
from fsdp_mini.run import launch

__all__ = ["WRAP_FSDP2", "GATHER_FULL_STATE", "wrap_fsdp2", "gather_full_state", "WRAP_TRIALS", "STATE_TRIALS"]

# (world, mesh shape, reshard_after_forward): ZeRO-3 and ZeRO-2 on a 1-D mesh, ZeRO-3 on 2 nodes of 2
WRAP_TRIALS = ((2, (2,), True), (2, (2,), False), (4, (2, 2), True))
STATE_TRIALS = ((3, "FULL_SHARD"), (4, "HYBRID_SHARD"))  # (world, strategy)
_STEPS, _BATCH = 3, 12
_TIMEOUT_S = 120
_CFG = GPTConfig()


# --- reference solutions (the lesson's folded solutions are these functions' source) ------------------

def wrap_fsdp2(model: nn.Module, mesh, reshard_after_forward: bool) -> nn.Module:
    for block in model.blocks:  # bottom-up: each block its own unit first...
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
    # ...then the root: the rest
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return model


def gather_full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    # every rank, whole
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


# --- plausible mistakes, which the judges must catch (tests/course/test_exercise.py) --------------------------

def _wrap_root_only(model, mesh, reshard_after_forward):
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)  # one unit: the whole model
    return model


def _wrap_top_down(model, mesh, reshard_after_forward):
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)  # the root first...
    for block in model.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return model


def _wrap_without_the_mesh(model, mesh, reshard_after_forward):
    for block in model.blocks:
        fully_shard(block, reshard_after_forward=reshard_after_forward)  # the default: a 1-D mesh of all ranks
    fully_shard(model, reshard_after_forward=reshard_after_forward)
    return model


def _wrap_default_reshard(model, mesh, reshard_after_forward):
    for block in model.blocks:
        fully_shard(block, mesh=mesh)  # reshard_after_forward left at its default
    fully_shard(model, mesh=mesh)
    return model


def _state_dict_of_shards(model):
    return model.state_dict()  # DTensors: each rank's shard, not the whole tensor


def _state_local_tensors(model):
    return {k: v.to_local() for k, v in model.state_dict().items()}  # plain tensors, but only this rank's rows


def _state_offloaded_to_rank0(model):
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))  # rank 0


# --- what the judges run ----------------------------------------------------------------------------

def _sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


@functools.cache
def single_process(steps: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    """One process training the course's GPT on the whole batch: the losses and the trained weights."""
    model = GPT(_CFG)
    losses = train(model, _sgd(model.parameters()), _CFG, steps=steps, batch_size=_BATCH, shard_batch=False)
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def _error(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"


def _wrap_on_rank(fn, mesh_shape, reshard):
    """Build the mesh, run the learner's wrap, then describe what FSDP2 built and train with it."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor, Replicate, Shard

    names = ("replicate", "shard") if len(mesh_shape) == 2 else ("shard",)
    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
    model = GPT(_CFG)
    try:
        out = fn(model, mesh, reshard)
    except NotImplementedError:
        return {"not_yet": True}
    except Exception as e:  # noqa: BLE001 (the learner's error, as a report)
        return {"raised": _error(e), "root_sharded_first": isinstance(model, FSDPModule)
                and not any(isinstance(b, FSDPModule) for b in model.blocks)}
    if out is not model:
        return {"returned": type(out).__name__}
    want = (Replicate(), Shard(0)) if len(mesh_shape) == 2 else (Shard(0),)
    report = {"units": [name or "<root>" for name, m in model.named_modules() if isinstance(m, FSDPModule)]}
    report["bad_params"] = [(name, type(p).__name__, str(getattr(p, "placements", "")),
                             tuple(p.device_mesh.mesh.shape) if isinstance(p, DTensor) else ())
                            for name, p in model.named_parameters()
                            if not (isinstance(p, DTensor) and tuple(p.placements) == want
                                    and tuple(p.device_mesh.mesh.shape) == tuple(mesh_shape))]
    if report["bad_params"] or len(report["units"]) != 1 + len(model.blocks):
        return report
    from fsdp_mini.course.models import make_batch
    from fsdp_mini.course.train import local_rows
    x, y = (local_rows(t, dist.get_rank(), dist.get_world_size()) for t in make_batch(_CFG, _BATCH))
    loss = model(x, y)
    report["sharded_after_forward"] = isinstance(model.blocks[0].mlp.fc.weight, DTensor)
    loss.backward()
    model.zero_grad()
    report["losses"] = train(model, _sgd(model.parameters()), _CFG, steps=_STEPS, batch_size=_BATCH)
    report["state"] = {k: v.full_tensor().detach().clone() for k, v in model.state_dict().items()}
    return report


def _judge_wrap(fn) -> Verdict:
    blocks = _CFG.n_layer
    for world, mesh_shape, reshard in WRAP_TRIALS:
        where = tr(f"{world} ranks, mesh {mesh_shape}, reshard_after_forward={reshard}: ",
                   f"{world} ранга, сетка {mesh_shape}, reshard_after_forward={reshard}: ")
        reports = launch(_wrap_on_rank, world, args=(fn, mesh_shape, reshard), timeout=_TIMEOUT_S,
                         local_world_size=mesh_shape[-1])
        if any(r.get("not_yet") for r in reports):
            raise NotYet
        r = reports[0]
        if "raised" in r:
            hint = tr(" (the root was sharded before its blocks)",
                      " (корневой модуль шардирован раньше своих блоков)") \
                if r["root_sharded_first"] else ""
            return Verdict.wrong(where + tr(f"rank 0 raised {r['raised']}{hint}",
                                            f"ранг 0 выбросил {r['raised']}{hint}"))
        if "returned" in r:
            return Verdict.wrong(where + tr(f"return the model you sharded (got {r['returned']})",
                                            f"верните шардированную модель (получено: {r['returned']})"))
        if len(r["units"]) != 1 + blocks:
            return Verdict.wrong(where + tr(
                f"FSDP2 built {len(r['units'])} unit(s) ({', '.join(r['units']) or 'none'}); with {blocks} blocks "
                f"that means {'the whole model is gathered at once' if len(r['units']) < 1 + blocks else 'too many'}"
                f" (each block should be its own unit, and the root one more)",
                f"FSDP2 построил юнитов: {len(r['units'])} ({', '.join(r['units']) or 'ни одного'}); при {blocks} "
                f"блоках {'это значит, что вся модель собирается сразу' if len(r['units']) < 1 + blocks else 'это много'}"
                f" (каждый блок должен быть своим юнитом, и корневой модуль — ещё одним)"))
        if r["bad_params"]:
            name, kind, placements, shape = r["bad_params"][0]
            return Verdict.wrong(where + tr(
                f"parameter {name} is a {kind} with placements {placements or 'none'} on a mesh of shape "
                f"{shape or 'none'}: it should live on the mesh you were given",
                f"параметр {name} — {kind} с размещением {placements or 'никаким'} на сетке формы "
                f"{shape or 'никакой'}: он должен жить на переданной вам сетке"))
        if r["sharded_after_forward"] != reshard:
            state = tr("still sharded", "всё ещё шардирован") if r["sharded_after_forward"] else \
                tr("still gathered", "всё ещё собран")
            return Verdict.wrong(where + tr(
                f"after forward, blocks[0]'s weight is {state}: your units ignore reshard_after_forward",
                f"после forward вес blocks[0] {state}: ваши юниты не учитывают reshard_after_forward"))
        ref_losses, ref_state = single_process(_STEPS)
        losses = torch.tensor([rep["losses"] for rep in reports]).mean(0)
        loss_diff = (losses - torch.tensor(ref_losses)).abs().max().item()
        weight_diff = max((r["state"][k] - v).abs().max().item() for k, v in ref_state.items())
        if loss_diff > 1e-5 or weight_diff > 1e-5:
            return Verdict.wrong(where + tr(
                f"{_STEPS} SGD steps differ from one process (max |loss diff| {loss_diff:.2e}, max |weight diff| "
                f"{weight_diff:.2e})",
                f"{_STEPS} шага SGD расходятся с одним процессом (max |разница лоссов| {loss_diff:.2e}, "
                f"max |разница весов| {weight_diff:.2e})"))
    return Verdict.right(tr(
        f"{1 + blocks} FSDP2 units, DTensors on the given mesh, and the same training as one process "
        f"(1-D ZeRO-3 and ZeRO-2, 2-D hybrid).",
        f"{1 + blocks} юнита FSDP2, DTensor на переданной сетке и то же обучение, что в одном процессе "
        f"(1-D ZeRO-3 и ZeRO-2, 2-D гибрид)."))


# --- exercise 2: gather_full_state ------------------------------------------------------------------

def _state_on_rank(fn, strategy):
    model = wrap_like_pytorch(GPT(_CFG), strategy, wrap=(Block,))
    train(model, _sgd(model.parameters()), _CFG, steps=2, batch_size=_BATCH)
    try:
        out = fn(model)
    except NotImplementedError:
        return None
    if not isinstance(out, dict):
        return type(out).__name__
    return {k: (type(v).__name__, tuple(v.shape) if isinstance(v, torch.Tensor) else None,
                v.detach().clone() if type(v) is torch.Tensor else None) for k, v in out.items()}


def _judge_gather_full_state(fn) -> Verdict:
    _, ref = single_process(2)
    for world, strategy in STATE_TRIALS:
        outcomes = launch(_state_on_rank, world, args=(fn, strategy), local_world_size=2 if world == 4 else None,
                          timeout=_TIMEOUT_S)
        if any(o is None for o in outcomes):
            raise NotYet
        for rank, got in enumerate(outcomes):
            where = tr(f"{world} ranks, {strategy}, rank {rank}: ", f"{world} ранга, {strategy}, ранг {rank}: ")
            if isinstance(got, str):
                return Verdict.wrong(where + tr(f"return a dict of tensors (got {got})",
                                                f"верните словарь тензоров (получено: {got})"))
            missing = [k for k in ref if k not in got]
            if missing:
                return Verdict.wrong(where + tr(
                    f"{len(missing)} of the model's {len(ref)} entries are missing, e.g. {missing[0]}",
                    f"нет {len(missing)} из {len(ref)} записей модели, например {missing[0]}"))
            extra = [k for k in got if k not in ref]
            if extra:
                return Verdict.wrong(where + tr(f"keys the unwrapped model does not have, e.g. {extra[0]}",
                                                f"ключи, которых нет у исходной модели, например {extra[0]}"))
            for key, want in ref.items():
                kind, shape, value = got[key]
                if kind != "Tensor":
                    return Verdict.wrong(where + tr(
                        f"{key} is a {kind}; a full state dict holds plain tensors, as the unwrapped model's does",
                        f"{key} — это {kind}; полный state dict хранит обычные тензоры, как у исходной модели"))
                if shape != tuple(want.shape):
                    return Verdict.wrong(where + tr(
                        f"{key} has shape {shape}, the whole parameter has {tuple(want.shape)}",
                        f"{key} формы {shape}, а весь параметр — {tuple(want.shape)}"))
                if not torch.allclose(value, want, rtol=1e-5, atol=1e-5):
                    return Verdict.wrong(where + tr(
                        f"{key} differs from the same model trained by one process",
                        f"{key} отличается от той же модели, обученной одним процессом"))
    return Verdict.right(tr(
        "Every rank holds every entry whole, equal to one process's model (3 ranks FULL_SHARD, 4 HYBRID_SHARD).",
        "Каждый ранг хранит каждую запись целиком, как у модели одного процесса (3 ранга FULL_SHARD, 4 "
        "HYBRID_SHARD)."))


WRAP_FSDP2 = CodeExercise("08.wrap_fsdp2", _judge_wrap, wrap_fsdp2,
                          (_wrap_root_only, _wrap_top_down, _wrap_without_the_mesh, _wrap_default_reshard))
GATHER_FULL_STATE = CodeExercise("08.gather_full_state", _judge_gather_full_state, gather_full_state,
                                 (_state_dict_of_shards, _state_local_tensors, _state_offloaded_to_rank0))
