"""Tensor parallelism from scratch, the library alone (`fsdp_mini.tensor.parallel.parallelize`, `fsdp_mini.tensor.parallel.tp_operators`), on
a small two-layer MLP of its own: Megatron's f and g, the stacked cut, parity with one process for TP alone
(world 2) and TP x fully_shard on a 2 x 2 (dp, tp) mesh (world 4), and the errors raised before any
collective. The course GPT's plan, PyTorch's parallelize_module beside ours and the bytes per step are in
tests/course/test_gpt_tensor_parallel.py."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from expect import error_text
from launch_cases import run_cases
from fsdp_mini import CommLog, launch
from fsdp_mini.fsdp._fully_shard.fully_shard import full_state_dict, fully_shard
from fsdp_mini.tensor.parallel.parallelize import (ColumnParallelLinear, ColwiseParallel, ParallelDims, RowwiseParallel, TPShard,
                                                   gather_tensor_parallel, parallelize_module)

TOL = dict(rtol=1e-5, atol=1e-6)
PLAN = {"up": ColwiseParallel(), "down": RowwiseParallel()}
STEPS, ROWS = 3, 8


class MLP(nn.Module):
    """LayerNorm, then up (column parallel: 12 -> 24, cut into output features) and down (row parallel:
    24 -> 12, cut into input features, its bias added once): Megatron's MLP, with a replicated LayerNorm in
    front whose gradient f's AllReduce makes whole on every rank."""

    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.norm, self.up, self.down = nn.LayerNorm(12), nn.Linear(12, 24), nn.Linear(24, 12)

    def forward(self, x):
        return self.down(F.gelu(self.up(self.norm(x))))


def batch(step: int):
    g = torch.Generator().manual_seed(step)
    return torch.randn(ROWS, 12, generator=g), torch.randn(ROWS, 12, generator=g)


def optimizer(name, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    return torch.optim.AdamW(params, lr=1e-2, eps=1e-3, weight_decay=0.1)  # eps: see NOTES (AdamW noise)


def train(model, opt, rows=slice(None), make_batch=None):
    """STEPS steps of MSE training on `make_batch(step)` (the MLP's `batch` by default), rows `rows`."""
    losses = []
    for step in range(STEPS):
        x, y = (t[rows] for t in (make_batch or batch)(step))
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def one_process(opt_name):
    model = MLP()
    return train(model, optimizer(opt_name, model.parameters())), model.state_dict()


# --- the pieces: a stacked cut and its inverse, the operators' backward --------------------------------

def test_a_stacked_cut_gives_each_rank_the_same_rows_of_every_matrix_and_gathering_undoes_it():
    full = torch.arange(3 * 4 * 2.0).view(12, 2)  # q, k, v of 4 rows each
    pieces = [TPShard(0, 2, r, 3, None, "").local(full, 0) for r in range(2)]
    assert pieces[0][:, 0].tolist() == [0, 2, 8, 10, 16, 18]  # rows 0-1 of q, of k, of v
    assert torch.equal(TPShard(0, 2, 0, 3, None, "").full(pieces, 0), full)
    cols = [TPShard(1, 2, r, 1, None, "").local(full, 1) for r in range(2)]
    assert torch.equal(TPShard(1, 2, 0, 1, None, "").full(cols, 1), full)


def _operators():
    from fsdp_mini.tensor.parallel.tp_operators import copy_to_tensor_model_parallel_region as f
    from fsdp_mini.tensor.parallel.tp_operators import reduce_from_tensor_model_parallel_region as g

    rank = dist.get_rank()
    x = torch.full((2,), float(rank + 1), requires_grad=True)
    with CommLog() as log:
        y = f(x, None, "f")
        fwd_f = len(log.records)
        (y * (rank + 1)).sum().backward()
    z = torch.full((2,), float(rank + 1), requires_grad=True)
    with CommLog() as log2:
        out = g(z, None, "g")
        fwd_g = len(log2.records)
        (out * (rank + 1)).sum().backward()
    return fwd_f, [r.label for r in log.records], x.grad.tolist(), fwd_g, out.tolist(), z.grad.tolist()


def test_f_sums_gradients_in_backward_and_g_sums_outputs_in_forward(no_orphans):
    for rank, (fwd_f, labels_f, grad_x, fwd_g, out, grad_z) in enumerate(launch(_operators, 2, timeout=60)):
        assert (fwd_f, labels_f, grad_x) == (0, ["f"], [3.0, 3.0])  # nothing forward; 1 + 2 backward
        assert (fwd_g, out, grad_z) == (1, [3.0, 3.0], [rank + 1.0] * 2)  # 1 + 2 forward; its own backward


# --- parity with one process -----------------------------------------------------------------------------
# Each test below runs for SGD and AdamW; both optimizers' runs share one launch (tests/launch_cases.py).
OPTIMIZERS = ["sgd", "adamw"]


def _tp_alone(opt_name):
    from torch.distributed.device_mesh import init_device_mesh

    model = parallelize_module(MLP(), init_device_mesh("cpu", (2,)), PLAN)
    kinds = (type(model.up).__name__, type(model.down).__name__)
    shapes = (tuple(model.up.weight.shape), tuple(model.down.weight.shape), tuple(model.down.bias.shape))
    losses = train(model, optimizer(opt_name, model.parameters()))  # every TP rank sees the same rows
    return losses, gather_tensor_parallel(model, model.state_dict()), kinds, shapes


@pytest.mark.parametrize("opt_name", OPTIMIZERS)
def test_tensor_parallel_alone_matches_one_process(opt_name, no_orphans):
    losses, weights = one_process(opt_name)
    for got_losses, got_weights, kinds, shapes in run_cases(_tp_alone, OPTIMIZERS, 2, timeout=120)[opt_name]:
        assert got_losses == pytest.approx(losses, rel=1e-5)
        for name in weights:
            torch.testing.assert_close(got_weights[name], weights[name], **TOL)
        assert kinds == ("ColumnParallelLinear", "RowParallelLinear")
        assert shapes == ((12, 12), (12, 12), (12,))  # up: half its rows; down: half its columns, bias whole


def _tp_fsdp(opt_name):
    mesh = ParallelDims(dp=2, tp=2, world_size=4).build_mesh("cpu")
    model = parallelize_module(MLP(), mesh["tp"], PLAN)
    fully_shard(model, mesh=mesh["dp"])
    half = ROWS // 2
    dp_rank = mesh["dp"].get_local_rank()
    losses = train(model, optimizer(opt_name, model.parameters()), slice(dp_rank * half, (dp_rank + 1) * half))
    return losses, gather_tensor_parallel(model, full_state_dict(model))


@pytest.mark.parametrize("opt_name", OPTIMIZERS)
def test_tensor_parallel_with_fully_shard_on_a_2x2_mesh_matches_one_process(opt_name, no_orphans):
    losses, weights = one_process(opt_name)
    results = run_cases(_tp_fsdp, OPTIMIZERS, 4, timeout=150)[opt_name]
    for rank, (got_losses, got_weights) in enumerate(results):
        partner = results[rank ^ 2][0]  # the other dp rank: the other half of the batch
        assert [(a + b) / 2 for a, b in zip(got_losses, partner)] == pytest.approx(losses, rel=1e-5)
        for name in weights:
            torch.testing.assert_close(got_weights[name], weights[name], **TOL)


# --- errors before any collective ---------------------------------------------------------------------------

def test_the_mesh_shape_is_checked_without_any_process_group():
    assert "a mesh of dp x tp = 3 x 2 = 6 ranks does not match the world of 4 ranks" in error_text(
        lambda: ParallelDims(dp=3, tp=2, world_size=4))
    assert "tp must be a positive integer, got 0" in error_text(lambda: ParallelDims(dp=4, tp=0, world_size=4))
    assert "stacked must be a positive number of matrices, got 0" in error_text(lambda: ColwiseParallel(stacked=0))
    assert not dist.is_initialized()


def _errors():
    """Rank 0 alone makes each mistake while the others wait at the barrier: a check that sent anything
    first would hang rank 0 (and the launch would time out)."""
    mesh = ParallelDims(dp=1, tp=4, world_size=4).build_mesh("cpu")
    tp = mesh["tp"]
    out = {}
    if dist.get_rank() == 0:
        model = MLP()
        before = dict(model.named_parameters())
        out["hidden"] = error_text(lambda: parallelize_module(nn.Linear(30, 30), tp, ColwiseParallel()))
        out["rows"] = error_text(lambda: parallelize_module(nn.Linear(30, 30), tp, RowwiseParallel()))
        out["stacked"] = error_text(lambda: parallelize_module(nn.Linear(4, 6), tp, ColwiseParallel(stacked=3)))
        out["partly"] = error_text(lambda: parallelize_module(model, tp, {"up": ColwiseParallel(),
                                                                        "down": RowwiseParallel(), "norm": PLAN["up"]}))
        out["untouched"] = all(p is before[n] for n, p in model.named_parameters())
        out["no_match"] = error_text(lambda: parallelize_module(model, tp, {"gate": RowwiseParallel()}))
        out["mesh_2d"] = error_text(lambda: parallelize_module(model, mesh, PLAN))
        out["world"] = error_text(lambda: ParallelDims(dp=1, tp=2, world_size=2).build_mesh("cpu"))
        done = nn.Sequential(nn.Linear(4, 4))
        done[0].__class__ = ColumnParallelLinear  # what ColwiseParallel leaves behind
        out["twice"] = error_text(lambda: parallelize_module(done, tp, {"0": RowwiseParallel()}))
        with CommLog() as log:
            error_text(lambda: parallelize_module(MLP(), tp, {"up": ColwiseParallel(stacked=5)}))
        out["sent"] = len(log.records)
    dist.barrier()
    return out


def test_bad_input_gets_a_clear_error_before_any_collective(no_orphans):
    out = launch(_errors, 4, timeout=60)[0]
    assert "the tensor-parallel degree 4 does not divide the module's 30 output features" in out["hidden"]
    assert "the tensor-parallel degree 4 does not divide the module's 30 input features" in out["rows"]
    assert "the tensor-parallel degree 4 does not divide the module's 2 output features of each of its 3 stacked " \
        "matrices" in out["stacked"]
    assert "ColwiseParallel applies to nn.Linear, but norm is a LayerNorm" in out["partly"]
    assert out["untouched"] is True  # the plan's good entries were not applied either
    assert "plan entry 'gate' matches no submodule of MLP" in out["no_match"]
    assert "device_mesh must be 1-D (the tensor-parallel dimension), got a mesh of shape (1, 4): pass mesh['tp']" \
        in out["mesh_2d"]
    assert "ParallelDims was made for 2 ranks, but the world has 4" in out["world"]
    assert "0 is already tensor-parallel (ColumnParallelLinear)" in out["twice"]
    assert out["sent"] == 0


def _different_slice_on_rank_3():
    mesh = ParallelDims(dp=2, tp=2, world_size=4).build_mesh("cpu")
    model = parallelize_module(MLP(), mesh["tp"], PLAN)
    if dist.get_rank() == 3:
        with torch.no_grad():
            model.up.weight.add_(1.0)  # rank 3 holds other values than rank 1, its data-parallel peer
    try:
        fully_shard(model, mesh=mesh["dp"])
    except ValueError as e:
        return str(e)
    return "no error"


def test_a_mismatch_on_a_data_parallel_subgroup_names_global_ranks():
    """fully_shard over mesh["dp"] checks values among the ranks of its own dp group (ranks 1 and 3 here):
    the message names them as the user numbers them, global ranks, not their indices inside the group."""
    out = launch(_different_slice_on_rank_3, 4, timeout=60)
    assert out[0] == out[2] == "no error"  # their dp group, [0, 2], agrees
    assert out[1] == out[3]
    assert out[3].startswith("ranks [3] start from different values than rank 1 (first differing: up.weight")


def _trackers_of_units_on_a_sub_mesh():
    from fsdp_mini.fsdp._fully_shard.fully_shard import gathered_memory

    mesh = ParallelDims(dp=2, tp=1, world_size=2).build_mesh("cpu")
    model = nn.Sequential(MLP(), MLP())
    for child in model:
        fully_shard(child, mesh=mesh["dp"])  # mesh["dp"] is a new DeviceMesh object at every call
    fully_shard(model, mesh=mesh["dp"])
    model(batch(0)[0]).sum().backward()
    one_unit = 4 * sum(p.numel() for p in MLP().parameters())
    return gathered_memory(model[0]) is gathered_memory(model[1]), gathered_memory(model[0]).peak >= one_unit


def test_units_on_the_same_sub_mesh_share_one_gathered_memory_tracker(no_orphans):
    """The peak of gathered bytes covers every unit on the same ranks, however the mesh object was obtained
    (keyed by ranks, not by object identity): otherwise the demo's TP x fully_shard row saw only the root."""
    for shared, covers_a_block in launch(_trackers_of_units_on_a_sub_mesh, 2, timeout=60):
        assert shared and covers_a_block


# --- sequence parallelism (Korthikanti et al., 2022) -----------------------------------------------------

SEQ = 4  # positions: 2 per rank at tp 2


def _sp_operators():
    """g, ḡ and the scatter on (1, SEQ, 2) tensors whose values name the rank and the position."""
    from fsdp_mini.tensor.parallel.tp_operators import (gather_from_sequence_parallel_region,
                                                        reduce_scatter_to_sequence_parallel_region, scatter_to_sequence_parallel_region)

    rank = dist.get_rank()
    out = {}
    for name, fn, make in (
            ("g", gather_from_sequence_parallel_region, lambda: torch.full((1, SEQ // 2, 2), rank + 1.0)),
            ("g_bar", reduce_scatter_to_sequence_parallel_region,
             lambda: torch.arange(SEQ, dtype=torch.float).view(1, SEQ, 1).expand(1, SEQ, 2) * (rank + 1)),
            ("scatter", scatter_to_sequence_parallel_region,
             lambda: torch.arange(SEQ, dtype=torch.float).view(1, SEQ, 1).expand(1, SEQ, 2).contiguous())):
        x = make().requires_grad_(True)
        with CommLog() as fwd:
            y = fn(x, None, name)
        probe = torch.arange(y.numel(), dtype=torch.float).view_as(y) + 10 * rank  # a different gradient per rank
        with CommLog() as bwd:
            y.backward(probe)
        out[name] = (y[0, :, 0].tolist(), x.grad[0, :, 0].tolist(), [r.op for r in fwd.records],
                     [(r.op, r.label) for r in bwd.records])
    from fsdp_mini.flight_recorder import RECORDER

    out["flight"] = [(e.op, e.label, e.phase, e.shapes) for e in RECORDER.entries()]
    return out


def test_g_gathers_the_sequence_and_g_bar_reduce_scatters_it_each_backward_the_other(no_orphans):
    results = launch(_sp_operators, 2, timeout=60)
    for rank, out in enumerate(results):
        y, grad, fwd, bwd = out["g"]  # g: AllGather forward, ReduceScatter backward
        assert y == [1.0, 1.0, 2.0, 2.0] and fwd == ["all_gather"] and bwd == [("reduce_scatter", "g")]
        # the probe at this rank's positions (feature 0 of position p holds 2p, plus 10 on rank 1), summed over ranks
        assert grad == [2 * (2 * p) + 10 for p in (2 * rank, 2 * rank + 1)]
        y, grad, fwd, bwd = out["g_bar"]  # ḡ: ReduceScatter forward (1x + 2x summed), AllGather backward
        assert y == [3.0 * p for p in (2 * rank, 2 * rank + 1)] and fwd == ["reduce_scatter"]
        assert bwd == [("all_gather", "g_bar")] and grad == [0.0, 2.0, 10.0, 12.0]  # both ranks' probes, in order
        y, grad, fwd, bwd = out["scatter"]  # the chunk, nothing sent; AllGather backward
        assert y == [2.0 * rank, 2.0 * rank + 1] and fwd == [] and bwd == [("all_gather", "scatter")]
        assert grad == [0.0, 2.0, 10.0, 12.0]
        # the flight recorder has each one, labelled, with its phase and the local (input) shape it was issued on
        shard, whole = (SEQ // 2, 1, 2), (SEQ, 1, 2)  # the sequence moved to dim 0 for fsdp_mini's collectives
        assert out["flight"] == [("all_gather", "g", "", (shard,)), ("reduce_scatter", "g", "backward", (whole,)),
                                 ("reduce_scatter", "g_bar", "", (whole,)),
                                 ("all_gather", "g_bar", "backward", (shard,)),
                                 ("all_gather", "scatter", "backward", (shard,))]


def _all_gather_linear_against_gather_then_linear():
    """Megatron's column-parallel product (`all_gather_linear`) against PyTorch's way (`g`, then F.linear), on
    the same shard, weight and output gradient: with a bias, without one, and with a frozen weight."""
    from fsdp_mini.saved_activations import SavedActivations
    from fsdp_mini.tensor.parallel.tp_operators import (GATHERED_AGAIN, all_gather_linear,
                                                        gather_from_sequence_parallel_region)

    rank = dist.get_rank()
    torch.manual_seed(rank)
    x = torch.randn(2, SEQ // 2, 6)  # this rank's positions
    torch.manual_seed(7)
    weight, bias = torch.randn(4, 6), torch.randn(4)
    out = {}
    for case, with_bias, frozen in (("bias", True, False), ("no_bias", False, False), ("frozen", True, True)):
        results = []
        for fn in ("megatron", "pytorch"):
            xs, w, b = (t.clone().requires_grad_(not (frozen and t is weight)) for t in (x, weight, bias))
            with CommLog() as log, SavedActivations(exclude=[w, b]) as kept:
                y = (all_gather_linear(xs, w, b if with_bias else None, None, "l") if fn == "megatron" else
                     F.linear(gather_from_sequence_parallel_region(xs, None, "l"), w, b if with_bias else None))
                y.backward(torch.arange(y.numel(), dtype=torch.float).view_as(y) / 100 + rank)
            results.append((y.detach(), xs.grad, w.grad, b.grad if with_bias else None,
                            [(r.op, r.label) for r in log.records], kept.nbytes))
        out[case] = results
    out["again"] = GATHERED_AGAIN
    return out


def test_all_gather_linear_keeps_the_shard_and_gathers_it_again_in_backward(no_orphans):
    for out in launch(_all_gather_linear_against_gather_then_linear, 2, timeout=60):
        for case in ("bias", "no_bias", "frozen"):
            (y, gx, gw, gb, ops, kept), (y0, gx0, gw0, gb0, ops0, kept0) = out[case]
            torch.testing.assert_close(y, y0)
            torch.testing.assert_close(gx, gx0)
            for got, want in ((gw, gw0), (gb, gb0)):
                assert (got is None) == (want is None) and (got is None or torch.allclose(got, want, atol=1e-6))
            assert kept * 2 == kept0  # the shard, not the gathered whole
            again = [("all_gather", f"l {out['again']}")] if case != "frozen" else []
            assert ops == [("all_gather", "l")] + again + [("reduce_scatter", "l")]
            assert ops0 == [("all_gather", "l"), ("reduce_scatter", "l")]


class SeqModel(nn.Module):
    """A residual MLP block on (rows, SEQ, 12) and a head: norm -> up (column parallel) -> down (row parallel)
    -> + the residual, then a final norm and the head. Under sequence parallelism both norms and the residual
    add run on this rank's positions; the block's input is cut from the replicated input, the head's gathered."""

    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.block = nn.ModuleDict(dict(norm=nn.LayerNorm(12), up=nn.Linear(12, 24), down=nn.Linear(24, 12)))
        self.block.forward = self._block
        self.norm_f, self.head = nn.RMSNorm(12), nn.Linear(12, 5)

    def _block(self, x):
        b = self.block
        return x + b.down(F.gelu(b.up(b.norm(x))))

    def forward(self, x):
        return self.head(self.norm_f(self.block(x)))


def sp_plan():
    from fsdp_mini.tensor.parallel.parallelize import PrepareModuleInput, Replicate, SequenceParallel, Shard

    return {"block": PrepareModuleInput(input_layouts=Replicate(), desired_input_layouts=Shard(1)),
            "block.norm": SequenceParallel(), "block.up": ColwiseParallel(input_layouts=Shard(1)),
            "block.down": RowwiseParallel(output_layouts=Shard(1)), "norm_f": SequenceParallel(),
            "head": PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate())}


def seq_batch(step: int):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(ROWS, SEQ, 12, generator=g), torch.randn(ROWS, SEQ, 5, generator=g)


def seq_train(model, opt, rows=slice(None)):
    return train(model, opt, rows, make_batch=seq_batch)


def seq_one_process(opt_name):
    model = SeqModel()
    return seq_train(model, optimizer(opt_name, model.parameters())), model.state_dict()


def _sp_alone(opt_name):
    from torch.distributed.device_mesh import init_device_mesh

    model = parallelize_module(SeqModel(), init_device_mesh("cpu", (2,)), sp_plan())
    kinds = [type(m).__name__ for m in (model.block.norm, model.block.up, model.block.down, model.norm_f)]
    return seq_train(model, optimizer(opt_name, model.parameters())), gather_tensor_parallel(
        model, model.state_dict()), kinds


@pytest.mark.parametrize("opt_name", OPTIMIZERS)
def test_tensor_and_sequence_parallel_alone_matches_one_process(opt_name, no_orphans):
    losses, weights = seq_one_process(opt_name)
    for got_losses, got_weights, kinds in run_cases(_sp_alone, OPTIMIZERS, 2, timeout=120)[opt_name]:
        assert got_losses == pytest.approx(losses, rel=1e-5)
        for name in weights:
            torch.testing.assert_close(got_weights[name], weights[name], **TOL)
        assert kinds == ["SequenceParallelLayerNorm", "SequenceParallelColumnLinear", "SequenceParallelRowLinear",
                         "SequenceParallelRMSNorm"]


def _sp_fsdp(opt_name):
    mesh = ParallelDims(dp=2, tp=2, world_size=4).build_mesh("cpu")
    model = parallelize_module(SeqModel(), mesh["tp"], sp_plan())
    fully_shard(model, mesh=mesh["dp"])
    half, dp_rank = ROWS // 2, mesh["dp"].get_local_rank()
    losses = seq_train(model, optimizer(opt_name, model.parameters()), slice(dp_rank * half, (dp_rank + 1) * half))
    return losses, gather_tensor_parallel(model, full_state_dict(model))


@pytest.mark.parametrize("opt_name", OPTIMIZERS)
def test_tensor_and_sequence_parallel_with_fully_shard_on_a_2x2_mesh_matches_one_process(opt_name, no_orphans):
    losses, weights = seq_one_process(opt_name)
    results = run_cases(_sp_fsdp, OPTIMIZERS, 4, timeout=150)[opt_name]
    for rank, (got_losses, got_weights) in enumerate(results):
        partner = results[rank ^ 2][0]  # the other dp rank: the other half of the batch
        assert [(a + b) / 2 for a, b in zip(got_losses, partner)] == pytest.approx(losses, rel=1e-5)
        for name in weights:
            torch.testing.assert_close(got_weights[name], weights[name], **TOL)


def _norm_saved(model, x):
    """Bytes autograd keeps for backward inside each norm's forward (fsdp_mini.saved_activations.SavedActivations)."""
    from fsdp_mini.saved_activations import SavedActivations

    saved, handles = {}, []
    for name in ("block.norm", "norm_f"):
        module = model.get_submodule(name)
        tracker = SavedActivations(exclude=model.parameters())

        def enter(_m, _args, tracker=tracker):
            tracker.__enter__()

        def leave(_m, _args, _out, tracker=tracker, name=name):
            tracker.__exit__()
            saved[name] = tracker.nbytes

        handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    model(x).sum().backward()
    for h in handles:
        h.remove()
    return saved


def _sp_norm_memory():
    from torch.distributed.device_mesh import init_device_mesh

    model = parallelize_module(SeqModel(), init_device_mesh("cpu", (2,)), sp_plan())
    return _norm_saved(model, seq_batch(0)[0])


def test_the_norms_keep_one_tp_th_of_their_activations_per_rank(no_orphans):
    """LayerNorm keeps its input and one mean and one 1/std per position (fp32): 4 (C + 2) bytes a position;
    RMSNorm (composite on CPU) a fixed number of values per position too. Under sequence parallelism a rank
    holds SEQ / tp of the positions, so 1/tp of both."""
    whole = _norm_saved(SeqModel(), seq_batch(0)[0])
    assert whole["block.norm"] == 4 * ROWS * SEQ * (12 + 2) and whole["norm_f"] % (4 * ROWS * SEQ) == 0
    for per_rank in launch(_sp_norm_memory, 2, timeout=60):
        assert per_rank["block.norm"] == 4 * ROWS * (SEQ // 2) * (12 + 2)
        assert per_rank == {name: nbytes // 2 for name, nbytes in whole.items()}


def test_sequence_parallel_layouts_are_checked_without_any_process_group():
    from torch.distributed.tensor import Partial

    from fsdp_mini.tensor.parallel.parallelize import PrepareModuleInput, Replicate, Shard

    assert "ColwiseParallel: input_layouts=Shard(dim=-1) is not supported; use Replicate() or Shard(d) with d >= 0" \
        in error_text(lambda: ColwiseParallel(input_layouts=Shard(-1)))
    assert "ColwiseParallel: output_layouts=Replicate() is not supported; its output is sharded on the features" \
        in error_text(lambda: ColwiseParallel(output_layouts=Replicate()))
    assert "RowwiseParallel: output_layouts=Partial(sum) is not supported" in error_text(
        lambda: RowwiseParallel(output_layouts=Partial()))
    assert "RowwiseParallel: input_layouts=Replicate() is not supported" in error_text(
        lambda: RowwiseParallel(input_layouts=Replicate()))
    assert "PrepareModuleInput: from Shard(dim=1) to Shard(dim=0) is not supported" in error_text(
        lambda: PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Shard(0)))
    assert "should have the same length" in error_text(
        lambda: PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=Replicate()))
    assert not dist.is_initialized()


def _sp_errors():
    """Rank 0 alone makes the plan's mistakes while the others wait; then every rank runs a sequence that the
    two TP ranks cannot share: each must raise before sending anything (no rank waits on another)."""
    from torch.distributed.device_mesh import init_device_mesh

    from fsdp_mini.tensor.parallel.parallelize import SequenceParallel

    mesh = init_device_mesh("cpu", (2,))
    out = {}
    if dist.get_rank() == 0:
        out["linear"] = error_text(lambda: parallelize_module(SeqModel(), mesh, {"block.up": SequenceParallel()}))
    dist.barrier()
    model = parallelize_module(SeqModel(), mesh, sp_plan())
    with CommLog() as log:
        out["odd"] = error_text(lambda: model(torch.randn(2, 3, 12)))
        out["flat"] = error_text(lambda: model.block.up(torch.randn(2, 12)))
    out["sent"] = len(log.records)
    out["twice"] = error_text(lambda: parallelize_module(model, mesh, {"norm_f": SequenceParallel()}))
    return out


def test_sequence_parallel_mistakes_get_a_clear_error_before_any_collective(no_orphans):
    for rank, out in enumerate(launch(_sp_errors, 2, timeout=60)):
        if rank == 0:
            assert "SequenceParallel applies to nn.LayerNorm and nn.RMSNorm, but block.up is a Linear" in out["linear"]
        assert ("sequence parallelism: dim 1 of a tensor of shape (2, 3, 12) has 3 positions, not a multiple of the 2 "
                "ranks of the tensor-parallel group") in out["odd"]
        assert "block.up: input_layouts=Shard(1) names the sequence dim, but an input of shape (2, 12) has no dim 1 " \
            "before its features" in out["flat"]
        assert out["sent"] == 0
        assert "norm_f is already tensor-parallel (SequenceParallelRMSNorm)" in out["twice"]
