"""Each private PyTorch name in fsdp_mini.torch_internals still exists and does what fsdp_mini relies on.

A torch upgrade that drops or changes one fails here, by name, not in the middle of a training step."""
from __future__ import annotations

import ast
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DeviceMesh, DTensor, Shard

from fsdp_mini import torch_internals as TI

ROOT = Path(__file__).resolve().parents[2]


def test_restore_version_lets_autograd_use_a_tensor_refilled_in_place():
    w = torch.randn(4, requires_grad=True)
    buffer = torch.randn(4)
    y = (w * buffer).sum()  # autograd saves `buffer`
    version = buffer._version
    buffer.copy_(buffer.clone())  # a refill with the same values bumps the counter...
    assert buffer._version == version + 1
    TI.restore_version(buffer, version)  # ...and restoring it makes the saved tensor valid again
    y.backward()
    assert torch.equal(w.grad, buffer)


def test_chunk_cat_into_pads_each_tensor_to_equal_chunks_row_by_row():
    a, b = torch.arange(5.0), torch.arange(4.0).view(2, 2) + 10
    out = torch.full((2, 5), -1.0)
    TI.chunk_cat_into([a, b], 2, out)  # a: 3 + 3 (one zero pad), b: 1 row of 2 + 1 row of 2
    assert out.tolist() == [[0, 1, 2, 10, 11], [3, 4, 0, 12, 13]]


def test_queue_after_backward_runs_once_the_backward_is_done():
    order = []
    x = torch.ones(2, requires_grad=True)
    y = x * 2

    def hook(grad):
        TI.queue_after_backward(lambda: order.append("after"))
        order.append("hook")

    y.register_hook(hook)
    (y * 3).sum().backward()
    assert order == ["hook", "after"]


def test_version_of_counts_in_place_writes():
    t = torch.zeros(2)
    before = TI.version_of(t)
    t.add_(1)
    assert TI.version_of(t) == before + 1


def test_in_backward_is_true_only_while_autograd_runs_a_backward():
    seen = []
    x = torch.ones(2, requires_grad=True)
    y = x * 2
    y.register_hook(lambda g: seen.append(TI.in_backward()))
    assert not TI.in_backward()
    y.sum().backward()
    assert seen == [True] and not TI.in_backward()


def test_dtensor_spec_rebuilds_a_dtensor_of_the_same_layout(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        mesh = DeviceMesh("cpu", [0])
        d = DTensor.from_local(torch.arange(4.0), mesh, [Shard(0)], run_check=False)
        again = DTensor(torch.ones(4), TI.dtensor_spec(d), requires_grad=False)
        assert again.placements == d.placements and again.shape == d.shape
    finally:
        dist.destroy_process_group()


def _private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


# private attributes of torch objects that the library touches (an AST cannot tell a module's `_parameters`
# from one of fsdp_mini's own objects' by type, so these are named); everything reached from a torch
# module by name (`torch._C`, `dist._x`, `torch.utils._pytree`) is caught without a list
_PRIVATE_FIELDS = {"_parameters", "_buffers", "_modules", "_spec", "_local_tensor", "_version",
                   "relative_path", "_execution_engine"}


def private_torch_names(source: str) -> list[str]:
    """Where `source` names a private PyTorch module or attribute: an import of a torch module path with a
    `_private` part (or of a `_private` name from one), an attribute with a `_private` part reached from a
    name bound to torch (`torch._C`, `dist._world`), a private field of a torch object, or DTensor's
    constructor called directly."""
    tree, torch_names, found = ast.parse(source), set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torch":
                    torch_names.add(alias.asname or "torch")
                    if any(map(_private, alias.name.split("."))):
                        found.append(f"{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "torch":
            if any(map(_private, node.module.split("."))):
                found.append(f"{node.lineno}: from {node.module} import ...")
            for alias in node.names:
                torch_names.add(alias.asname or alias.name)
                if _private(alias.name):
                    found.append(f"{node.lineno}: from {node.module} import {alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if (isinstance(root, ast.Name) and root.id in torch_names and _private(node.attr)) \
                    or node.attr in _PRIVATE_FIELDS:
                found.append(f"{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "DTensor":
            found.append(f"{node.lineno}: DTensor(...) (its private constructor)")
    return found


def test_the_check_catches_each_kind_of_private_name():
    assert private_torch_names("import torch._dynamo") == ["1: import torch._dynamo"]
    assert private_torch_names("from torch.utils import _pytree") == ["1: from torch.utils import _pytree"]
    assert private_torch_names("from torch.distributed._shard import x") == ["1: from torch.distributed._shard import ..."]
    assert private_torch_names("import torch.distributed as dist\ndist.distributed_c10d._world") == ["2: ._world"]
    assert private_torch_names("import torch\ntorch._C._foo()") == ["2: ._foo", "2: ._C"]
    assert private_torch_names("m._parameters['w'] = t") == ["1: ._parameters"]
    assert private_torch_names("from torch.distributed.tensor import DTensor\nDTensor(a, b)")[-1].endswith("constructor)")
    assert private_torch_names("import torch\ntorch.zeros(1)._is_view()") == []  # a method of a result: unseen
    assert private_torch_names("import torch\nx = torch.zeros(1).__class__") == []


def test_no_library_module_but_torch_internals_names_a_private_torch_name():
    """The library floor only (fsdp_mini/*.py): torch_internals promises to hold every private PyTorch name
    the library trains with. The course floor (fsdp_mini/course) is left out on purpose: its tools look
    into PyTorch to teach and to measure it (FSDP2's own param group in `activations`, PyTorch's flight
    recorder dump in `flight_records`, aten's private attention ops in `exercises.planning`, the dispatch
    mode of `bench`), which no training run depends on."""
    found = []
    for path in sorted((ROOT / "fsdp_mini").glob("*.py")):
        if path.name != "torch_internals.py":
            found += [f"{path.name}:{where}" for where in private_torch_names(path.read_text())]
    assert found == []
