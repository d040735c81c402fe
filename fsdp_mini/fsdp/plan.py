"""Which modules become FSDP units, which parameters each unit owns, and what each flat parameter is called.

Pure: it reads the module tree and decides, no process group and no collective, so it runs on a model
on the meta device, before any rank has agreed on anything, and the course's pictures draw exactly what
the engine will build (`FSDP` and `fsdp_mini.course.viz.shards` both call `plan_units`).

    plan = plan_units(GPT(cfg), wrap_classes(Block, model))
    plan.units[1].name                    # "blocks.0"
    plan.units[1].flat_params[0].label    # "blocks.0"  (its trainable fp32 parameters)
    plan.units[1].flat_params[0].layout(4)   # its FlatLayout over shard groups of 4 ranks

The rules:
- every module whose class is in `wrap` becomes a unit named by its path; the parameters left over form
  the root unit "" (labelled "root"), which always exists, first;
- a parameter belongs to the innermost unit that contains the module owning it;
- a tied parameter (embedding = head) is planned once, with all its names; tied across two units is an
  error (each unit gathers and frees its own parameters, so one tensor cannot live in two);
- inside a unit, parameters are grouped by (requires_grad, dtype), trainable first: each group becomes
  one flat parameter, since one flat buffer has one dtype and one `requires_grad`. Its label is the
  unit's, plus " (frozen)" for the frozen group, plus " (<dtype>)" when the unit holds several dtypes.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from fsdp_mini.fsdp.flat_param import FlatLayout
from fsdp_mini.fsdp.units import ROOT_LABEL, unit_label  # shared with the per-parameter design

__all__ = ["PlannedParam", "FlatParamPlan", "UnitPlan", "Plan", "wrap_classes", "plan_units"]

FROZEN_SUFFIX = " (frozen)"


@dataclass(frozen=True)
class PlannedParam:
    """One parameter tensor to flatten: all its names (several when tied) and every (module, attribute)
    that holds it, so the engine can put a view of the gathered buffer in each place."""

    param: nn.Parameter
    names: tuple[str, ...]
    owners: tuple[tuple[nn.Module, str], ...]


@dataclass(frozen=True)
class FlatParamPlan:
    """The parameters of one unit that share `requires_grad` and `dtype`: one flat parameter."""

    label: str
    requires_grad: bool
    dtype: torch.dtype
    params: tuple[PlannedParam, ...]

    def layout(self, n: int) -> FlatLayout:
        """Its flat layout over shard groups of `n` ranks."""
        return FlatLayout([p.names for p in self.params], [p.param.shape for p in self.params], n)


@dataclass(frozen=True)
class UnitPlan:
    """One FSDP unit: its path (`""` for the root), its module and its flat parameters."""

    name: str
    module: nn.Module
    flat_params: tuple[FlatParamPlan, ...]

    @property
    def is_root(self) -> bool:
        return self.name == ""

    @property
    def label(self) -> str:
        return unit_label(self.name)


@dataclass(frozen=True)
class Plan:
    """Every unit, the root first, and the keys of the module's `state_dict()` (its order)."""

    units: tuple[UnitPlan, ...]
    state_dict_keys: tuple[str, ...]

    def signature(self) -> tuple:
        """What must agree across ranks for their shards to fit together (names, shapes, dtypes)."""
        return tuple((u.name, tuple((fp.label, fp.requires_grad, str(fp.dtype),
                                     tuple((p.names, tuple(p.param.shape)) for p in fp.params))
                                    for fp in u.flat_params)) for u in self.units)




def wrap_classes(wrap, module: nn.Module) -> tuple[type, ...]:
    """`wrap` (a class or classes) as a tuple, checked: nn.Module subclasses that match a submodule."""
    if isinstance(wrap, nn.Module):  # wrap=Block() for wrap=(Block,): a module is an instance, not a class
        raise ValueError(f"wrap takes module classes, got a {type(wrap).__name__} instance: pass "
                         f"wrap=({type(wrap).__name__},) to make every {type(wrap).__name__} a unit")
    wrap = (wrap,) if isinstance(wrap, type) else tuple(wrap or ())
    for cls in wrap:
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            raise ValueError(f"wrap must hold nn.Module classes, got {cls!r}")
        if not any(isinstance(m, cls) for name, m in module.named_modules() if name):
            raise ValueError(f"wrap class {cls.__name__} matches no submodule of {type(module).__name__}")
    return wrap


def plan_units(module: nn.Module, wrap) -> Plan:
    """The units and flat parameters `FSDP(module, wrap=wrap)` builds (see the module doc)."""
    wrap = wrap_classes(wrap, module)
    unit_names = [""] + [n for n, m in module.named_modules() if n and isinstance(m, wrap)]
    owner_unit: dict[int, str] = {}
    found: dict[str, dict[int, tuple[nn.Parameter, list[str], list[tuple[nn.Module, str]]]]] = {u: {} for u in unit_names}
    for fqn, p in module.named_parameters(remove_duplicate=False):
        mod_path, _, attr = fqn.rpartition(".")
        unit = max((u for u in unit_names if u == "" or mod_path == u or mod_path.startswith(u + ".")), key=len)
        if owner_unit.setdefault(id(p), unit) != unit:
            first = found[owner_unit[id(p)]][id(p)][1][0]
            raise ValueError(f"parameter {fqn} is tied to {first}, which is in another FSDP unit "
                             f"({unit_label(owner_unit[id(p)])} vs {unit_label(unit)}); tied parameters must "
                             f"live in one unit: wrap their common parent instead")
        _, names, owners = found[unit].setdefault(id(p), (p, [], []))
        names.append(fqn)
        owners.append((module.get_submodule(mod_path), attr))

    units = []
    for u in unit_names:
        groups: dict[tuple[bool, torch.dtype], list[PlannedParam]] = {}
        for p, names, owners in found[u].values():
            groups.setdefault((p.requires_grad, p.dtype), []).append(PlannedParam(p, tuple(names), tuple(owners)))
        if not groups and u != "":
            continue
        several_dtypes = len({dtype for _, dtype in groups}) > 1
        flat_params = []
        for (requires_grad, dtype), params in sorted(groups.items(), key=lambda kv: not kv[0][0]):  # trainable first
            label = unit_label(u) + ("" if requires_grad else FROZEN_SUFFIX)
            if several_dtypes:
                label += f" ({str(dtype).removeprefix('torch.')})"
            flat_params.append(FlatParamPlan(label, requires_grad, dtype, tuple(params)))
        units.append(UnitPlan(u, module.get_submodule(u), tuple(flat_params)))
    if not any(unit.flat_params for unit in units):
        raise ValueError(f"{type(module).__name__} has no parameters to shard")

    params = {fqn for fqn, _ in module.named_parameters(remove_duplicate=False)}
    buffers = {fqn for fqn, _ in module.named_buffers(remove_duplicate=False)}
    keys = tuple(module.state_dict().keys())
    extra = [k for k in keys if k not in params and k not in buffers]
    if extra:
        raise ValueError(f"state dict entries that are neither parameters nor buffers are not supported: {extra}")
    return Plan(tuple(units), keys)
