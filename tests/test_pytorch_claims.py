"""What the lessons say about PyTorch, checked by running PyTorch (torch 2.13, gloo, CPU ranks).

Each test names the lesson and quotes the sentence it backs, so that a claim and its evidence cannot
drift apart: change the sentence, and this file says which behaviour it must still describe. Claims
that cannot run on a CPU (NCCL, GPU kernels) are cited in the lessons themselves, with the pinned
torch's source file and line.
"""
from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from fsdp_mini import launch
from fsdp_mini.course.models import GPT, Block, GPTConfig, make_batch
from fsdp_mini.course.train import local_rows

CFG = GPTConfig()  # the course's GPT: 2 blocks, 61 tokens (prime: nothing divides evenly)


def _fsdp2(model, mesh=None, **kwargs):
    """PyTorch's FSDP2 as the lessons apply it: every block a unit, then the root."""
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block, mesh=mesh, **kwargs)
    return fully_shard(model, mesh=mesh, **kwargs)


def _local_batch(step=0, rows=8):
    rank, world = dist.get_rank(), dist.get_world_size()
    return [local_rows(t, rank, world) for t in make_batch(CFG, rows, step)]


class _Collectives:
    """Record the c10d collectives FSDP2 issues (it calls dist.all_gather_single / reduce_scatter_single
    by attribute at call time, torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:119 and :184)."""

    def __init__(self):
        self.calls: list[tuple[str, torch.dtype, int]] = []

    def __enter__(self):
        self._saved = dist.all_gather_single, dist.reduce_scatter_single

        def gather(output, input, *args, **kwargs):
            self.calls.append(("all_gather", input.dtype, input.numel()))
            return self._saved[0](output, input, *args, **kwargs)

        def scatter(output, input, *args, **kwargs):
            self.calls.append(("reduce_scatter", input.dtype, input.numel()))
            return self._saved[1](output, input, *args, **kwargs)

        dist.all_gather_single, dist.reduce_scatter_single = gather, scatter
        return self

    def __exit__(self, *exc):
        dist.all_gather_single, dist.reduce_scatter_single = self._saved

    def ops(self, op):
        return [c for c in self.calls if c[0] == op]


# --- lesson 01 ---------------------------------------------------------------------------------------

def _both_names():
    rank = dist.get_rank()
    x = torch.arange(4.0) + 10 * rank
    old, new = torch.empty(8), torch.empty(8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist.all_gather_into_tensor(old, x)
        old_rs = torch.empty(2)
        dist.reduce_scatter_tensor(old_rs, x)
    dist.all_gather_single(new, x)
    new_rs = torch.empty(2)
    dist.reduce_scatter_single(new_rs, x)
    messages = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    return torch.equal(old, new) and torch.equal(old_rs, new_rs), messages


def test_01_the_pinned_torch_deprecates_all_gather_into_tensor_for_all_gather_single(no_orphans):
    # 01, "The two halves": "in the pinned torch 2.13 those two are deprecated (a `FutureWarning`) in favour
    # of `torch.distributed.reduce_scatter_single` and `all_gather_single`, with the same arguments"
    assert torch.__version__.startswith("2.13")
    for old, new in (("all_gather_into_tensor", "all_gather_single"),
                     ("reduce_scatter_tensor", "reduce_scatter_single")):
        assert inspect.signature(getattr(dist, old)).parameters.keys() == \
            inspect.signature(getattr(dist, new)).parameters.keys()
    for same, messages in launch(_both_names, 2, timeout=60):
        assert same
        assert any("all_gather_single" in m for m in messages)
        assert any("reduce_scatter_single" in m for m in messages)


# --- lesson 06 ---------------------------------------------------------------------------------------

def _what_forward_leaves(reshard_after_forward):
    from torch.distributed.tensor import DTensor

    model = _fsdp2(GPT(CFG), reshard_after_forward=reshard_after_forward)
    shards = [p for p in model.blocks[0].parameters()]  # what the optimizer holds: the DTensor shards
    x, y = _local_batch()
    loss = model(x, y)
    weight = model.blocks[0].mlp.fc.weight
    after_forward = (type(weight).__name__, tuple(weight.shape),
                     all(isinstance(s, DTensor) and s.to_local().numel() > 0 for s in shards))
    loss.backward()
    weight = model.blocks[0].mlp.fc.weight
    return after_forward, (type(weight).__name__, isinstance(weight, DTensor))


def test_06_shard_grad_op_holds_the_gathered_copy_and_the_shard_from_forward_to_backward(no_orphans):
    # 06, "Reshard after forward": "SHARD_GRAD_OP, here and in PyTorch, keeps only shards at rest (during
    # the optimizer step and in checkpoints) and holds the gathered copy *and* the shard from forward until
    # backward frees each unit"
    full = tuple(GPT(CFG).blocks[0].mlp.fc.weight.shape)
    for (kind, shape, shards_kept), (after_backward, is_shard) in launch(_what_forward_leaves, 2, args=(False,),
                                                                          timeout=90):
        assert kind != "DTensor" and shape == full and shards_kept  # gathered copy and shard, both held
        assert is_shard  # backward freed the gathered copy: a shard at rest
    for (kind, shape, _), _ in launch(_what_forward_leaves, 2, args=(True,), timeout=90):
        assert kind == "DTensor"  # FULL_SHARD: a block is a shard again right after its forward


def _mixed_precision_step():
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from torch.distributed.tensor import DTensor

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    model = _fsdp2(GPT(CFG), mp_policy=policy)
    seen = {}

    def compute_dtype(module, args):
        seen.setdefault("compute", module.weight.dtype)  # returns None: the inputs stay as they are

    model.blocks[0].mlp.fc.register_forward_pre_hook(compute_dtype)
    x, y = _local_batch()
    with _Collectives() as log:
        model(x, y).backward()
    grads = {type(p.grad).__name__ + ":" + str(p.grad.dtype) for p in model.parameters()}
    shards = {str(p.dtype) for p in model.parameters() if isinstance(p, DTensor)}
    return ({str(d) for _, d, _ in log.ops("all_gather")}, {str(d) for _, d, _ in log.ops("reduce_scatter")},
            str(seen["compute"]), grads, shards)


def test_06_mixed_precision_gathers_in_bf16_and_reduces_in_fp32_onto_fp32_shards(no_orphans):
    # 06, "Mixed precision": "each rank casts its fp32 shard to bf16 *before* the AllGather (half the bytes on
    # the wire and in the buffer), computes forward and backward in bf16, casts the gradients to fp32 for the
    # ReduceScatter ... and lands them on the fp32 shard, which the optimizer updates as the master copy"
    # (fsdp_mini's MixedPrecision and PyTorch's MixedPrecisionPolicy behave alike; this is PyTorch's FSDP2)
    for gathered, reduced, compute, grads, shards in launch(_mixed_precision_step, 2, timeout=90):
        assert gathered == {"torch.bfloat16"} and reduced == {"torch.float32"}
        assert compute == "torch.bfloat16"
        assert grads == {"DTensor:torch.float32"} and shards == {"torch.float32"}


# --- lesson 08 ---------------------------------------------------------------------------------------

def _placements():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    one_d = _fsdp2(GPT(CFG))
    flat = all(p.placements == (Shard(0),) for p in one_d.parameters())
    all_dtensors = all(isinstance(p, DTensor) for p in one_d.parameters())
    rows = one_d.tok_emb.weight.to_local().shape[0]
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    two_d = _fsdp2(GPT(CFG), mesh=mesh)
    hybrid = all(p.placements == (Replicate(), Shard(0)) for p in two_d.parameters())
    return all_dtensors, flat, hybrid, rows


def test_08_fsdp2_parameters_are_dim0_dtensor_shards_cut_like_torch_chunk(no_orphans):
    # 08, "The map": "it keeps every parameter as a `DTensor` sharded on dim 0"; "How FSDP2 holds a shard":
    # "`Replicate()` on the `replicate` dimension, `Shard(dim=0)` on the `shard` dimension"; "The embedding
    # has 61 rows, so FSDP2 gives rank 0 one row more than rank 1 (`torch.chunk`)"
    results = launch(_placements, 4, timeout=90)
    for rank, (all_dtensors, flat, hybrid, rows) in enumerate(results):
        assert all_dtensors and flat and hybrid
        assert rows == torch.chunk(torch.empty(61), 4)[rank].shape[0]  # 16, 15, 15, 15


def _backward_order():
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    model = _fsdp2(GPT(GPTConfig(n_layer=3)))
    events, originals = [], (FSDPParamGroup.unshard, FSDPParamGroup.post_backward)

    def unshard(self, *args, **kwargs):
        events.append(("unshard", self._module_fqn))
        return originals[0](self, *args, **kwargs)

    def post_backward(self, *args, **kwargs):
        events.append(("post_backward", self._module_fqn))
        return originals[1](self, *args, **kwargs)

    x, y = _local_batch()
    loss = model(x, y)
    FSDPParamGroup.unshard, FSDPParamGroup.post_backward = unshard, post_backward
    try:
        loss.backward()
    finally:
        FSDPParamGroup.unshard, FSDPParamGroup.post_backward = originals
    first = {}
    for i, event in enumerate(events):
        first.setdefault(event, i)
    # backward runs blocks.2, blocks.1, blocks.0: is each block gathered before the one after it is done?
    return [first[("unshard", f"blocks.{k}")] < first[("post_backward", f"blocks.{k + 1}")] for k in (0, 1)]


def test_08_fsdp2_prefetches_in_backward_by_default(no_orphans):
    # 08, "The map", prefetch row: FSDP2 "on by default; `set_modules_to_forward_prefetch`,
    # `set_modules_to_backward_prefetch` to tune": by default blocks.0 is gathered before blocks.1's backward
    # is done (_fsdp_param_group.py:576, pre_backward -> _backward_prefetch), and blocks.1 before blocks.2's.
    # (FSDP2 has no switch to turn it off: an empty `set_modules_to_backward_prefetch([])` means the default,
    # _fsdp_state.py:384.)
    assert launch(_backward_order, 2, timeout=90) == [[True, True], [True, True]]


def _meta_init():
    from torch.distributed.tensor import DTensor

    with torch.device("meta"):
        model = GPT(CFG)
    _fsdp2(model)
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    for module in model.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
    sharded = all(isinstance(p, DTensor) and p.device.type == "cpu" for p in model.parameters())
    x, y = _local_batch()
    return sharded, model(x, y).isfinite().item()


def test_08_meta_device_init_is_fully_shard_then_to_empty(no_orphans):
    # 08, "The map", meta-device init row: "`fully_shard` the meta model, then `model.to_empty(device=...)` and
    # initialise"
    assert launch(_meta_init, 2, timeout=90) == [(True, True), (True, True)]


def _accumulate(sync_first):
    model = _fsdp2(GPT(CFG))
    reduces = []
    for step in range(2):
        model.set_requires_gradient_sync(sync_first or step == 1)
        x, y = _local_batch(step)
        with _Collectives() as log:
            model(x, y).backward()
        reduces.append(len(log.ops("reduce_scatter")))
    return reduces, {n: p.grad.full_tensor() for n, p in model.named_parameters()}


def test_08_set_requires_gradient_sync_false_accumulates_without_reducing(no_orphans):
    # 08, "The map", gradient accumulation row: FSDP2's `model.set_requires_gradient_sync(False)` is FSDP1's and
    # fsdp_mini's `no_sync()`: no ReduceScatter in that micro-batch, and the same gradients in the end
    (reduces, grads), _ = launch(_accumulate, 2, args=(False,), timeout=90)
    (always, synced), _ = launch(_accumulate, 2, args=(True,), timeout=90)
    assert reduces[0] == 0 and reduces[1] > 0 and always[0] == always[1] == reduces[1]
    for name, grad in grads.items():
        torch.testing.assert_close(grad, synced[name], rtol=1e-5, atol=1e-7)


def _clip():
    model = _fsdp2(GPT(CFG))
    x, y = _local_batch()
    model(x, y).backward()
    return torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).full_tensor().item()


def test_08_clip_grad_norm_on_fsdp2_gives_the_whole_models_norm(no_orphans):
    # 08, "The map", clipping row: FSDP2 uses the plain `torch.nn.utils.clip_grad_norm_(model.parameters(),
    # 1.0)`, and the norm it computes over the DTensor gradients is the whole model's
    one = GPT(CFG)
    x, y = make_batch(CFG, 8)
    one(x, y).backward()
    want = torch.nn.utils.clip_grad_norm_(one.parameters(), 1.0).item()
    for norm in launch(_clip, 2, timeout=90):
        assert norm == pytest.approx(want, rel=1e-5)


def _unshard_reshard():
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    def gathered(model):
        return {n for n, p in model.named_parameters() if not isinstance(p, DTensor)}

    model = _fsdp2(GPT(CFG))
    model.unshard()
    root_only = gathered(model)
    model.reshard()
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for unit in units:
        unit.unshard()
    everything = {n: tuple(p.shape) for n, p in model.named_parameters() if not isinstance(p, DTensor)}
    for unit in units:
        unit.reshard()
    return root_only, everything, gathered(model)


def test_08_unshard_gathers_one_unit_so_whole_parameters_need_it_on_every_unit(no_orphans):
    # 08, "The map", whole parameters row: FSDP2's "`unshard()` on every FSDP module (each gathers its own
    # unit: the root's leaves the blocks sharded), later `reshard()`"
    shapes = {n: tuple(p.shape) for n, p in GPT(CFG).named_parameters()}
    for root_only, everything, after in launch(_unshard_reshard, 2, timeout=90):
        assert root_only == {n for n in shapes if not n.startswith("blocks.")}
        assert everything == shapes and after == set()


def test_08_torchrun_sets_the_environment_fsdp_mini_init_reads(tmp_path):
    # 08, "Real GPUs, several nodes: torchrun": "reads the environment that torchrun sets (`RANK`, `WORLD_SIZE`,
    # `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`)"; "torchrun numbers ranks node by node and sets
    # `LOCAL_WORLD_SIZE` to the GPUs per node"
    script = tmp_path / "env.py"
    script.write_text(textwrap.dedent(f"""
        import json, os
        keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
        with open(os.path.join({str(tmp_path)!r}, "rank" + os.environ["RANK"]), "w") as f:
            json.dump({{k: os.environ.get(k) for k in keys}}, f)
    """))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                    str(script)], env=env, check=True, capture_output=True, timeout=120)
    import json

    seen = [json.loads((tmp_path / f"rank{r}").read_text()) for r in range(2)]
    for rank, values in enumerate(seen):
        assert (values["RANK"], values["LOCAL_RANK"], values["WORLD_SIZE"]) == (str(rank), str(rank), "2")
        assert values["LOCAL_WORLD_SIZE"] == "2" and values["GROUP_RANK"] == "0"
        assert values["MASTER_ADDR"] and values["MASTER_PORT"]


def _full_state_dict():
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    torch.manual_seed(0)
    model = _fsdp2(GPT(CFG))
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return {k: (type(v).__name__, tuple(v.shape), v.clone()) for k, v in state.items()}


def test_08_get_model_state_dict_full_gathers_plain_tensors_under_the_original_names(no_orphans):
    # 08, "The same training in both": "`get_model_state_dict` with `StateDictOptions(full_state_dict=True)`,
    # which gathers each DTensor into a plain tensor under its original name"
    torch.manual_seed(0)
    want = GPT(CFG).state_dict()
    for got in launch(_full_state_dict, 2, timeout=90):
        assert set(got) == set(want)
        for key, (kind, shape, value) in got.items():
            assert kind == "Tensor" and shape == tuple(want[key].shape)
            assert torch.equal(value, want[key])
