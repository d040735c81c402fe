"""README's table of fsdp_mini's names beside PyTorch's stays true: every name on both sides exists.

The table tells an engineer where each piece lives in PyTorch (file and class); a rename on either side
that the table misses fails here.
"""
import importlib
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
        resolve("fsdp_mini.fsdp_param_group.FSDPParamGroup.no_such_method")
