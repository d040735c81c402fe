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


def test_the_sharded_tensor_classes_checkpoint_builds_are_importable():
    for name in ("Shard", "ShardedTensor", "ShardedTensorMetadata", "ShardMetadata", "TensorProperties"):
        assert isinstance(getattr(TI, name), type), name


def test_no_other_library_module_names_a_private_torch_attribute():
    # torch._C..., torch._chunk_cat, x._spec, torch.distributed._shard: only torch_internals names them
    found = []
    for path in sorted((ROOT / "fsdp_mini").glob("*.py")):
        if path.name == "torch_internals.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and ".".join(node.module.split(".")[:3]) in (
                    "torch.distributed._shard",):
                found.append(f"{path.name}:{node.lineno} imports {node.module}")
            if isinstance(node, ast.Attribute) and node.attr in ("_C", "_chunk_cat", "_spec", "_version", "_execution_engine"):
                found.append(f"{path.name}:{node.lineno} .{node.attr}")
    assert found == []
