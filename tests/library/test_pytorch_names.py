"""README's table of fsdp_mini's names beside PyTorch's stays true: every name on both sides exists; and
the two FSDP designs speak one vocabulary.

The table tells an engineer where each piece lives in PyTorch (file and class); a rename on either side
that the table misses fails here. The flat design (`FSDP`, `FSDPUnit`, `FlatParamHandle`) and the
per-parameter one (`FSDPState`, `FSDPParamGroup`, `FSDPParam`) name each concept they share the same way
(FSDP2's name where PyTorch has one), checked on objects built and trained for a step.
"""
import importlib
import inspect
import re
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEADINGS = {"README.md": "## fsdp_mini's names and PyTorch's", "README.ru.md": "## Имена fsdp_mini и имена PyTorch"}


def table(readme: str) -> list[tuple[str, str]]:
    text = (ROOT / readme).read_text(encoding="utf-8")
    section = text[text.index(HEADINGS[readme]):].split("\n## ", 1)[0]
    return re.findall(r"^\| `([\w.]+)` \| `([\w.]+)` \|$", section, re.M)


def resolve(dotted: str):
    """The object a dotted name names: the longest importable module prefix, then attributes; where that
    ends at a module that its package shadows with a function of the same name (`fsdp_mini.fully_shard`,
    `torch.multiprocessing.spawn`), the package's attribute."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        if isinstance(obj, types.ModuleType) and i == len(parts) > 1:
            shadow = getattr(importlib.import_module(".".join(parts[:-1])), parts[-1])
            obj = shadow if callable(shadow) else obj
        return obj
    raise ImportError(dotted)


def test_both_readmes_have_the_same_table():
    assert len(table("README.md")) > 20
    assert table("README.md") == table("README.ru.md")


@pytest.mark.parametrize("ours, theirs", table("README.md"))
def test_every_name_in_the_table_exists_on_both_sides(ours, theirs):
    assert ours.startswith("fsdp_mini.") and theirs.startswith("torch.")
    assert callable(resolve(ours)), ours
    assert callable(resolve(theirs)), theirs
    # the same concept is spelled the same, except where the table maps one name to another on purpose
    renamed = {"FSDP": "FullyShardedDataParallel", "MeshInfo": "HSDPMeshInfo", "full_state_dict": "get_model_state_dict",
               "init": "init_process_group", "launch": "spawn"}
    last_ours, last_theirs = ours.rsplit(".", 1)[1], theirs.rsplit(".", 1)[1]
    assert renamed.get(last_ours, last_ours) == last_theirs, (ours, theirs)


def test_resolve_fails_on_a_missing_name():
    with pytest.raises(AttributeError):
        resolve("fsdp_mini.fsdp._fully_shard.fsdp_param_group.FSDPParamGroup.no_such_method")


# --- one vocabulary between the two FSDP designs -----------------------------------------------------

# a concept both designs have: its one name, the names it had in one design or the other, who has it
SHARED_NAMES = {
    "this rank's shard, an nn.Parameter": ("sharded_param", ("shard", "sharded"), ("FlatParamHandle", "FSDPParam")),
    "a unit's identity (its path, 'root')": ("label", ("name",), ("FSDPUnit", "FSDPParamGroup")),
    "the tracker of gathered bytes": ("gathered_memory", ("memory", "tracker"),
                                      ("FSDP", "FlatParamHandle", "FSDPParamGroup")),
    "the queue of reductions in flight": ("reductions", ("in_flight", "_reductions"),
                                          ("FSDP", "FSDPState", "FSDPParamGroup")),
    "add a reduced sharded gradient": ("accumulate_sharded_grad", ("accumulate_grad",), ("FlatParamHandle", "FSDPParam")),
    "the end of backward is queued": ("backward_queued", ("_backward_queued",), ("FSDP", "FSDPState")),
    "the AllGather in flight": ("gather", ("_gather",), ("FlatParamHandle", "FSDPParamGroup")),
}


def _vocabulary():
    import torch

    from fsdp_mini import FSDP
    from fsdp_mini.fsdp._fully_shard.fully_shard import fully_shard, gathered_memory, state_of
    from small_model import Block, TinyConfig, TinyLM, train

    cfg = TinyConfig()
    flat = FSDP(TinyLM(cfg), wrap=(Block,))
    train(flat, torch.optim.SGD(flat.parameters(), lr=0.1), cfg, 2, 4)
    per_param = TinyLM(cfg)
    for block in per_param.blocks:
        fully_shard(block)
    fully_shard(per_param)
    train(per_param, torch.optim.SGD(per_param.parameters(), lr=0.1), cfg, 2, 4)
    root, block = state_of(per_param), state_of(per_param.blocks[0])
    handle, unit, group, param = flat.units[1].handles[0], flat.units[1], block.group, block.group.params[0]
    objects = {"FSDP": flat, "FSDPUnit": unit, "FlatParamHandle": handle,
               "FSDPState": root, "FSDPParamGroup": group, "FSDPParam": param}
    attrs = {kind: sorted(vars(obj)) + sorted(n for n in dir(type(obj)) if not n.startswith("__"))
             for kind, obj in objects.items()}

    def kind_of(obj):
        return type(obj).__name__

    return dict(
        attrs=attrs,
        sharded_param=[isinstance(getattr(o, "sharded_param", None), torch.nn.Parameter) for o in (handle, param)],
        labels=[[u.label for u in flat.units[:2]] if hasattr(unit, "label") else None,
                [state_of(m).group.label for m in (per_param, per_param.blocks[0])]],
        one_tracker=[getattr(handle, "gathered_memory", 1) is getattr(flat, "gathered_memory", 2),
                     getattr(group, "gathered_memory", 1) is gathered_memory(per_param)],
        one_queue=[kind_of(getattr(flat, "reductions", None)),
                   getattr(group, "reductions", 1) is getattr(root, "reductions", 2)],
        orders=[kind_of(flat.forward_order), kind_of(root.forward_order),
                [[per_param, *per_param.blocks].index(s.module) for s in root.forward_order]],
        post_forward_arguments=[n for n in inspect.signature(type(group)).parameters if n == "post_forward"],
        post_forward_methods=[callable(getattr(type(o), "post_forward", None)) and "post_forward" not in vars(o)
                              for o in (root, group)],
        depth=cfg.depth,
    )


def test_both_designs_name_each_shared_concept_the_same(no_orphans):
    from fsdp_mini import launch

    got = launch(_vocabulary, 2, timeout=120)[0]
    problems = []
    for concept, (name, old_names, kinds) in SHARED_NAMES.items():
        for kind in kinds:
            if name not in got["attrs"][kind]:
                problems.append(f"{kind} has no {name} ({concept})")
            problems += [f"{kind} still has {old}" for old in old_names if old in got["attrs"][kind]]
    assert problems == []
    assert got["sharded_param"] == [True, True]
    # the same value convention: the path from the root, "root" for the root (what CommLog shows)
    assert got["labels"] == [["root", "blocks.0"], ["root", "blocks.0"]]
    assert got["one_tracker"] == [True, True] and got["one_queue"] == ["ReductionQueue", True]
    # forward_order is one type in both designs; the per-parameter one lists the units as they first ran
    assert got["orders"] == ["ExecutionOrder", "ExecutionOrder", list(range(1 + got["depth"]))]
    # `post_forward` is a method of the state and of the group, never a field or an argument beside it
    assert got["post_forward_arguments"] == [] and got["post_forward_methods"] == [True, True]
