"""Tensor parallelism on the course GPT (`fsdp_mini.course.tensor_parallel_plan`): parity with one
process, TP alone (world 2) and TP x fully_shard on a 2 x 2 (dp, tp) mesh (world 4); parity with PyTorch's own
parallelize_module + fully_shard on the same mesh; bytes per step derived from the shapes; clear errors
before any collective."""
from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
import torch.distributed as dist

from expect import error_text
from launch_cases import run_cases
from fsdp_mini import CommLog, launch
from fsdp_mini.course.models import GPT, GPTConfig, make_batch
from fsdp_mini.course.train import local_rows, train
from fsdp_mini.course.tensor_parallel_plan import (gpt_tp_plan, parallelize_gpt, parallelize_gpt_with_pytorch,
                                                   pytorch_gpt_full_state_dict)
from fsdp_mini.fsdp._fully_shard.fully_shard import full_state_dict
from fsdp_mini.tensor.parallel.parallelize import (ColwiseParallel, ParallelDims, RowwiseParallel,
                                                   gather_tensor_parallel, parallelize_module)
from fsdp_mini.tensor.parallel.tp_operators import GATHERED_AGAIN, TP_LABEL

CFG = GPTConfig()  # 2 heads of 15, hidden 30, vocab 61, 2 blocks
STEPS, BATCH = 3, 12
TOL = dict(rtol=1e-5, atol=1e-6)


def make_optimizer(name, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    return torch.optim.AdamW(params, lr=1e-2, eps=1e-3, weight_decay=0.1, foreach=True)  # eps: see NOTES


def reference(opt_name):
    """One process, the whole batch: losses per step, the last step's gradients, the final weights."""
    model = GPT(CFG)
    opt = make_optimizer(opt_name, model.parameters())
    losses = []
    for step in range(STEPS):
        x, y = make_batch(CFG, BATCH, step)
        opt.zero_grad()
        loss = model(x, y)
        loss.backward()
        losses.append(loss.item())
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
    return losses, grads, model.state_dict()


def tp_mesh(tp):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (tp,), mesh_dim_names=("tp",))


# --- TP alone, world 2: one process's losses, gradients and weights -------------------------------------

# Each parity test runs for SGD and AdamW, and both optimizers' runs share one launch (tests/launch_cases.py);
# on the 2 x 2 mesh, the run against PyTorch also trains ours (`_tp_fsdp`), so the test of ours alone reads
# that launch's results instead of training it again. Launches of world 4 that train both optimizers get more
# than pytest's default 180 s on a busy 2-core machine.
OPTIMIZERS = ["sgd", "adamw"]


def _tp_alone(opt_name):
    model = GPT(CFG)
    parallelize_module(model, tp_mesh(2), gpt_tp_plan(CFG, 2))
    opt = make_optimizer(opt_name, model.parameters())
    losses = []
    for step in range(STEPS):
        x, y = make_batch(CFG, BATCH, step)  # TP: every rank of the group sees the same batch
        opt.zero_grad()
        loss = model(x, y)
        loss.backward()
        losses.append(loss.item())
        grads = gather_tensor_parallel(model, {n: p.grad for n, p in model.named_parameters()})
        opt.step()
    kinds = {n: type(m).__name__ for n, m in model.named_modules() if "attn." in n or "mlp." in n}
    shapes = {n: tuple(p.shape) for n, p in model.blocks[0].named_parameters()}
    return losses, grads, gather_tensor_parallel(model, model.state_dict()), kinds, shapes


@pytest.mark.parametrize("opt_name", OPTIMIZERS)
@pytest.mark.timeout(360)
def test_tensor_parallel_alone_matches_one_process(opt_name, no_orphans):
    losses, grads, weights = reference(opt_name)
    for got_losses, got_grads, got_weights, kinds, shapes in run_cases(_tp_alone, OPTIMIZERS, 2, timeout=300)[opt_name]:
        assert got_losses == pytest.approx(losses, rel=1e-5)
        for name in grads:
            torch.testing.assert_close(got_grads[name], grads[name], **TOL)
        for name in weights:
            torch.testing.assert_close(got_weights[name], weights[name], **TOL)
        assert kinds["blocks.0.attn.qkv"] == "ColumnParallelLinear"
        assert kinds["blocks.1.mlp.proj"] == "RowParallelLinear"
        c = CFG.n_embd
        assert shapes["attn.qkv.weight"] == (3 * c // 2, c) and shapes["attn.proj.weight"] == (c, c // 2)
        assert shapes["attn.proj.bias"] == (c,) and shapes["mlp.fc.bias"] == (2 * c,)


# --- TP x fully_shard on a 2 x 2 mesh, world 4 -----------------------------------------------------------

def _train_2d(model, mesh, opt_name):
    rows_of = (mesh["dp"].get_local_rank(), mesh["dp"].size())  # a TP group shares its rows of the batch
    return train(model, make_optimizer(opt_name, model.parameters()), CFG, STEPS, BATCH, rows_of=rows_of)


def _tp_fsdp(opt_name):
    mesh = ParallelDims(dp=2, tp=2, world_size=4).build_mesh("cpu")
    model = parallelize_gpt(GPT(CFG), mesh)
    losses = _train_2d(model, mesh, opt_name)
    return losses, gather_tensor_parallel(model, full_state_dict(model))


@pytest.mark.parametrize("opt_name", OPTIMIZERS)
@pytest.mark.timeout(360)
def test_tensor_parallel_with_fully_shard_on_a_2x2_mesh_matches_one_process(opt_name, no_orphans):
    losses, _, weights = reference(opt_name)
    results = [ours for _, ours in run_cases(_pytorch_2d, OPTIMIZERS, 4, timeout=300)[opt_name]]  # _tp_fsdp's
    for rank, (got_losses, got_weights) in enumerate(results):
        partner = results[rank ^ 2][0]  # the other dp rank of the same TP position: the other half of the batch
        assert [(a + b) / 2 for a, b in zip(got_losses, partner)] == pytest.approx(losses, rel=1e-5)
        assert got_losses == results[rank ^ 1][0]  # the two ranks of a TP group compute one loss
        for name in weights:
            torch.testing.assert_close(got_weights[name], weights[name], **TOL)


# --- against PyTorch's parallelize_module + fully_shard on the same mesh ---------------------------------

def _pytorch_2d(opt_name):
    mesh = ParallelDims(dp=2, tp=2, world_size=4).build_mesh("cpu")
    model = parallelize_gpt_with_pytorch(GPT(CFG), mesh)
    losses = _train_2d(model, mesh, opt_name)
    return (losses, pytorch_gpt_full_state_dict(model, mesh)), _tp_fsdp(opt_name)


@pytest.mark.parametrize("opt_name", OPTIMIZERS)
@pytest.mark.timeout(360)
def test_matches_pytorch_parallelize_module_with_fully_shard_on_the_same_2x2_mesh(opt_name, no_orphans):
    """PyTorch's ColwiseParallel cuts a weight's rows into contiguous blocks and has no notion of q, k and v
    stacked in one Linear; on its side the fused qkv's rows are reordered [q_0; k_0; v_0; q_1; k_1; v_1]
    (`qkv_rows_for_pytorch`) before `parallelize_module`, an equivalent layout (Megatron's interleaved one)
    in which a contiguous cut gives each rank the same heads that `ColwiseParallel(stacked=3)` gives ours,
    and its final weights are put back in the course's [q; k; v] order to compare."""
    for (torch_losses, torch_weights), (losses, weights) in run_cases(_pytorch_2d, OPTIMIZERS, 4, timeout=300)[opt_name]:
        assert losses == pytest.approx(torch_losses, rel=1e-5)
        assert set(weights) == set(torch_weights)
        for name in torch_weights:
            torch.testing.assert_close(weights[name], torch_weights[name], **TOL)


# --- bytes per step, from the shapes --------------------------------------------------------------------

def _bytes():
    mesh = ParallelDims(dp=2, tp=2, world_size=4).build_mesh("cpu")
    model = parallelize_gpt(GPT(CFG), mesh)
    opt = make_optimizer("sgd", model.parameters())
    x, y = (local_rows(t, mesh["dp"].get_local_rank(), mesh["dp"].size()) for t in make_batch(CFG, BATCH))
    for _ in range(2):  # the second step is the steady one (the first records the prefetch order)
        with CommLog() as log:
            opt.zero_grad()
            model(x, y).backward()
            opt.step()
    return [(r.op, r.label, r.nbytes, r.group_size, r.sent) for r in log.records]


def expected_bytes(cfg: GPTConfig, batch: int, dp: int, tp: int) -> Counter:
    """TP: per block, `g` AllReduces the attention's and the MLP's output in forward and `f` the gradients of
    their inputs in backward: 4 AllReduces of (batch / dp) x seq x C fp32 over the tp ranks.
    fully_shard over the dp ranks: each unit's TP-local parameters, each padded to ceil(rows / dp) x dp rows;
    AllGather in forward and (blocks) again in backward, one ReduceScatter."""
    c, t, v = cfg.n_embd, cfg.block_size, cfg.vocab_size
    activation = 4 * (batch // dp) * t * c
    block_shapes = [(3 * c // tp, c), (3 * c // tp,), (c, c // tp), (c,), (4 * c // tp, c), (4 * c // tp,),
                    (c, 4 * c // tp), (c,), (c,), (c,), (c,), (c,)]  # qkv, attn.proj, fc, mlp.proj, ln_1, ln_2
    root_shapes = [(v, c), (t, c), (c,), (c,)]  # tok_emb (= lm_head), pos_emb, ln_f
    unit = lambda shapes: 4 * dp * sum(math.ceil(s[0] / dp) * math.prod(s[1:]) for s in shapes)  # noqa: E731
    out = Counter()
    for i in range(cfg.n_layer):
        for layer in ("attn.proj", "mlp.proj", "attn.qkv", "mlp.fc"):  # g (forward), f (backward)
            out[("all_reduce", f"{TP_LABEL} blocks.{i}.{layer}", activation, tp)] += 1
        out[("all_gather", f"blocks.{i}", unit(block_shapes), dp)] += 2
        out[("reduce_scatter", f"blocks.{i}", unit(block_shapes), dp)] += 1
    out[("all_gather", "root", unit(root_shapes), dp)] += 1
    out[("reduce_scatter", "root", unit(root_shapes), dp)] += 1
    return out


def test_bytes_per_step_follow_from_the_shapes(no_orphans):
    want = expected_bytes(CFG, BATCH, 2, 2)
    for records in launch(_bytes, 4, timeout=90):
        assert Counter(r[:4] for r in records) == want
        tp_bytes = sum(r[2] for r in records if r[1].startswith(TP_LABEL))
        assert tp_bytes == 2 * 2 * CFG.n_layer * 4 * (BATCH // 2) * CFG.block_size * CFG.n_embd == 92_160
        assert sum(r[2] for r in records) == 92_160 + 3 * 2 * 22_864 + 2 * 9_600  # 248,544 B of S per step
        # on the wire (ring model): an AllReduce sends 2(n-1)/n of it, an AllGather / ReduceScatter (n-1)/n
        assert sum(r[4] for r in records) == 92_160 + (3 * 2 * 22_864 + 2 * 9_600) // 2


# --- errors before any collective -----------------------------------------------------------------------

def test_the_heads_are_checked_without_any_process_group():
    assert "the tensor-parallel degree 2 does not divide the 3 attention heads" in error_text(
        lambda: gpt_tp_plan(GPTConfig(n_head=3, n_embd=30), 2))
    assert "the tensor-parallel degree 4 does not divide the 2 attention heads" in error_text(lambda: gpt_tp_plan(CFG, 4))
    assert not dist.is_initialized()


def _errors():
    """The course plan's mistakes (the library's own are in tests/library/test_tensor_parallel.py). Rank 0 alone
    makes each while the others wait at the end: a check that sent anything first would hang rank 0."""
    mesh = ParallelDims(dp=1, tp=4, world_size=4).build_mesh("cpu")
    tp = mesh["tp"]
    out = {}
    if dist.get_rank() == 0:
        model = GPT(CFG)
        before = {n: p for n, p in model.named_parameters()}
        out["stacked"] = error_text(lambda: parallelize_module(model, tp, gpt_tp_plan(CFG, 2)))
        out["untouched"] = all(p is before[n] for n, p in model.named_parameters())
        out["not_linear"] = error_text(lambda: parallelize_module(model, tp, {"blocks.0.ln_1": ColwiseParallel()}))
        out["no_match"] = error_text(lambda: parallelize_module(model, tp, {"blocks.*.mlp.gate": RowwiseParallel()}))
        out["gpt_mesh"] = error_text(lambda: parallelize_gpt(GPT(CFG), tp))
        out["gpt_heads"] = error_text(lambda: parallelize_gpt(GPT(CFG), mesh))
    dist.barrier()
    return out


def test_bad_input_gets_a_clear_error_before_any_collective(no_orphans):
    out = launch(_errors, 4, timeout=60)[0]
    assert ("the tensor-parallel degree 4 does not divide blocks.0.attn.qkv's 30 output features of each of its 3 "
            "stacked matrices") in out["stacked"]
    assert out["untouched"] is True
    assert "ColwiseParallel applies to nn.Linear, but blocks.0.ln_1 is a LayerNorm" in out["not_linear"]
    assert "plan entry 'blocks.*.mlp.gate' matches no submodule of GPT" in out["no_match"]
    assert "parallelize_gpt needs a 2-D mesh with dimensions ('dp', 'tp'), got ('tp',)" in out["gpt_mesh"]
    assert "the tensor-parallel degree 4 does not divide the 2 attention heads" in out["gpt_heads"]



# --- sequence parallelism: the same four runs with gpt_sp_plan ---------------------------------------------

def _sp_alone(opt_name, save_gathered_input=True):
    from fsdp_mini.course.tensor_parallel_plan import gpt_sp_plan

    model = GPT(CFG)
    parallelize_module(model, tp_mesh(2), gpt_sp_plan(CFG, 2, save_gathered_input))
    opt = make_optimizer(opt_name, model.parameters())
    losses = []
    for step in range(STEPS):
        x, y = make_batch(CFG, BATCH, step)
        opt.zero_grad()
        loss = model(x, y)
        loss.backward()
        losses.append(loss.item())
        grads = gather_tensor_parallel(model, {n: p.grad for n, p in model.named_parameters()})
        opt.step()
    return losses, grads, gather_tensor_parallel(model, model.state_dict())


def _sp_alone_shards_kept(opt_name):
    return _sp_alone(opt_name, save_gathered_input=False)


@pytest.mark.parametrize("opt_name", OPTIMIZERS)
@pytest.mark.parametrize("variant", [_sp_alone, _sp_alone_shards_kept], ids=["pytorch", "megatron"])
@pytest.mark.timeout(360)
def test_sequence_parallel_alone_matches_one_process(opt_name, variant, no_orphans):
    """Both variants: the column-parallel layers keep the gathered input (PyTorch) or its shard, gathered
    again in backward (Megatron-LM, `all_gather_linear`): the same losses, gradients and weights."""
    losses, grads, weights = reference(opt_name)
    for got_losses, got_grads, got_weights in run_cases(variant, OPTIMIZERS, 2, timeout=300)[opt_name]:
        assert got_losses == pytest.approx(losses, rel=1e-5)
        for name in grads:
            torch.testing.assert_close(got_grads[name], grads[name], **TOL)
        for name in weights:
            torch.testing.assert_close(got_weights[name], weights[name], **TOL)


def _sp_fsdp(opt_name, save_gathered_input=True):
    from fsdp_mini.course.tensor_parallel_plan import parallelize_gpt_sp

    mesh = ParallelDims(dp=2, tp=2, world_size=4).build_mesh("cpu")
    model = parallelize_gpt_sp(GPT(CFG), mesh, save_gathered_input=save_gathered_input)
    return _train_2d(model, mesh, opt_name), gather_tensor_parallel(model, full_state_dict(model))


def _sp_fsdp_shards_kept(opt_name):
    return _sp_fsdp(opt_name, save_gathered_input=False)


@pytest.mark.parametrize("opt_name", OPTIMIZERS)
@pytest.mark.timeout(360)
def test_megatron_sequence_parallel_with_fully_shard_matches_one_process(opt_name, no_orphans):
    """Megatron-LM's variant under fully_shard on a 2 x 2 mesh: the shard autograd keeps and the weight it
    multiplies again in backward (FSDP regathers it) give one process's training."""
    losses, _, weights = reference(opt_name)
    results = run_cases(_sp_fsdp_shards_kept, OPTIMIZERS, 4, timeout=300)[opt_name]
    for rank, (got_losses, got_weights) in enumerate(results):
        partner = results[rank ^ 2][0]
        assert [(a + b) / 2 for a, b in zip(got_losses, partner)] == pytest.approx(losses, rel=1e-5)
        for name in weights:
            torch.testing.assert_close(got_weights[name], weights[name], **TOL)


def _pytorch_sp_2d(opt_name):
    from fsdp_mini.course.tensor_parallel_plan import parallelize_gpt_sp_with_pytorch

    mesh = ParallelDims(dp=2, tp=2, world_size=4).build_mesh("cpu")
    model = parallelize_gpt_sp_with_pytorch(GPT(CFG), mesh)
    losses = _train_2d(model, mesh, opt_name)
    return (losses, pytorch_gpt_full_state_dict(model, mesh)), _sp_fsdp(opt_name)


@pytest.mark.parametrize("opt_name", OPTIMIZERS)
@pytest.mark.timeout(360)
def test_sequence_parallel_with_fully_shard_matches_one_process_and_pytorch_on_a_2x2_mesh(opt_name, no_orphans):
    """Ours (gpt_sp_plan, fully_shard) and PyTorch's (parallelize_module with SequenceParallel, ColwiseParallel
    (input_layouts=Shard(1)), RowwiseParallel(output_layouts=Shard(1)), PrepareModuleInput, then its fully_shard)
    on the same 2 x 2 mesh: both equal one process, and each other."""
    losses, _, weights = reference(opt_name)
    results = run_cases(_pytorch_sp_2d, OPTIMIZERS, 4, timeout=300)[opt_name]
    for rank, ((torch_losses, torch_weights), (got_losses, got_weights)) in enumerate(results):
        partner = results[rank ^ 2][1][0]  # the other dp rank: the other half of the batch
        assert [(a + b) / 2 for a, b in zip(got_losses, partner)] == pytest.approx(losses, rel=1e-5)
        assert got_losses == pytest.approx(torch_losses, rel=1e-5)
        assert set(got_weights) == set(torch_weights) == set(weights)
        for name in weights:
            torch.testing.assert_close(got_weights[name], weights[name], **TOL)
            torch.testing.assert_close(got_weights[name], torch_weights[name], **TOL)


# --- SP: the same bytes on the wire as TP's AllReduces; the norms' activations 1/tp ---------------------------

def _bytes_with(sequence_parallel: bool):
    from fsdp_mini.course.tensor_parallel_plan import parallelize_gpt_sp

    mesh = ParallelDims(dp=2, tp=2, world_size=4).build_mesh("cpu")
    model = (parallelize_gpt_sp if sequence_parallel else parallelize_gpt)(GPT(CFG), mesh)
    opt = make_optimizer("sgd", model.parameters())
    x, y = (local_rows(t, mesh["dp"].get_local_rank(), mesh["dp"].size()) for t in make_batch(CFG, BATCH))
    for _ in range(2):  # the second step is the steady one
        with CommLog() as log:
            opt.zero_grad()
            model(x, y).backward()
            opt.step()
    return [(r.op, r.label, r.nbytes, r.group_size, r.sent) for r in log.records]


def _both_bytes():
    return _bytes_with(False), _bytes_with(True)


def test_sequence_parallel_sends_what_tensor_parallel_sends_in_the_blocks(no_orphans):
    """Each of TP's AllReduces of a (batch/dp) x seq x C activation (ring: 2(n-1)/n S sent) becomes a
    ReduceScatter and an AllGather of it ((n-1)/n S each): per block the same bytes on the wire. Beyond the
    blocks, from the shapes: the replicated head's input is gathered in forward and the replicated
    embedding's gradient in backward (one AllGather of the activation each), and the weights used on 1/tp
    of the positions (the LayerNorms, the row-parallel biases) have their gradients all-reduced (C each).
    fully_shard's bytes do not change."""
    c, tp = CFG.n_embd, 2
    s = 4 * (BATCH // 2) * CFG.block_size * c  # one activation, fp32
    for tp_records, sp_records in launch(_both_bytes, 4, timeout=150):
        tp_only = [r for r in tp_records if r[1].startswith(TP_LABEL)]
        sp_only = [r for r in sp_records if r[1].startswith(TP_LABEL)]
        assert [r for r in tp_records if r not in tp_only] == [r for r in sp_records if r not in sp_only]  # FSDP
        in_blocks = [r for r in sp_only if r[1].split(".")[-1] in ("qkv", "proj", "fc") and r[2] == s]
        assert Counter(r[0] for r in in_blocks) == {"all_gather": 4 * CFG.n_layer, "reduce_scatter": 4 * CFG.n_layer}
        assert sum(r[4] for r in in_blocks) == sum(r[4] for r in tp_only) == CFG.n_layer * 4 * 2 * (tp - 1) * s // tp
        ends = Counter((r[0], r[1], r[2]) for r in sp_only if r[1].endswith(" input"))
        assert ends == {("all_gather", f"{TP_LABEL} lm_head input", s): 1,
                        ("all_gather", f"{TP_LABEL} blocks.0 input", s): 1}
        grads = Counter((r[0], r[2]) for r in sp_only if r not in in_blocks and not r[1].endswith(" input"))
        replicated_weights = CFG.n_layer * (2 * 2 + 2) + 2  # ln_1, ln_2 weight and bias, two row biases; ln_f
        assert grads == {("all_reduce", 4 * c): replicated_weights}
        assert sum(r[4] for r in sp_only) == sum(r[4] for r in tp_only) + 2 * (tp - 1) * s // tp + \
            replicated_weights * 2 * (tp - 1) * 4 * c // tp


def _saved_by_norms(sequence_parallel: bool):
    """What autograd keeps inside each LayerNorm's forward, per rank (fsdp_mini.saved_activations.SavedActivations), and
    what the rest of the forward keeps, on one batch, TP or TP + SP over 2 ranks."""
    from fsdp_mini.course.tensor_parallel_plan import gpt_sp_plan
    from fsdp_mini.saved_activations import SavedActivations

    model = GPT(CFG)
    parallelize_module(model, tp_mesh(2), (gpt_sp_plan if sequence_parallel else gpt_tp_plan)(CFG, 2))
    norms = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.LayerNorm)}
    saved = {}
    for name, module in norms.items():
        tracker = SavedActivations(exclude=model.parameters())

        def enter(_m, _args, tracker=tracker):
            tracker.__enter__()

        def leave(_m, _args, _out, tracker=tracker, name=name):
            tracker.__exit__()
            saved[name] = tracker.nbytes

        module.register_forward_pre_hook(enter)
        module.register_forward_hook(leave)
    with SavedActivations(exclude=model.parameters()) as the_rest:
        loss = model(*make_batch(CFG, BATCH))
    loss.backward()
    return saved, the_rest.nbytes


def _both_saved():
    return _saved_by_norms(False), _saved_by_norms(True)


def test_the_norm_and_residual_path_keeps_one_tp_th_of_its_activations_per_rank(no_orphans):
    """A LayerNorm keeps its input (the residual stream) and a mean and a 1/std per position, fp32:
    4 (C + 2) bytes a position. TP keeps them for all batch x seq positions on every rank, TP + SP for
    batch x seq / tp. Everything else the forward keeps is the same in both (the outer tracker sees all but
    the norms: autograd packs with the innermost saved-tensors hooks only): the linear layers keep their
    gathered inputs as TP keeps its replicated ones."""
    tp, positions = 2, BATCH * CFG.block_size
    norms = 2 * CFG.n_layer + 1
    for (tp_norms, tp_rest), (sp_norms, sp_rest) in launch(_both_saved, 2, timeout=90):
        assert len(tp_norms) == len(sp_norms) == norms
        assert set(tp_norms.values()) == {4 * positions * (CFG.n_embd + 2)}
        assert set(sp_norms.values()) == {4 * positions // tp * (CFG.n_embd + 2)}
        assert tp_rest == sp_rest


def _both_sp_variants():
    from fsdp_mini.course.tensor_parallel_probes import tp_or_sp_step

    return [tp_or_sp_step(CFG, BATCH, True, save_gathered_input=keep) for keep in (True, False)]


def test_megatron_sp_sends_one_allgather_more_per_column_parallel_layer_and_keeps_its_input_shard(no_orphans):
    """Per block, attention's qkv and the MLP's fc gather their input again in backward ((tp - 1)/tp of one
    activation sent each), and autograd keeps 1/tp of each input instead of the gathered whole: the bytes
    sent grow by what the bytes kept shrink, 2 L (tp - 1)/tp activations."""
    tp, L = 2, CFG.n_layer
    activation = 4 * BATCH * CFG.block_size * CFG.n_embd
    for pytorch, megatron in launch(_both_sp_variants, 2, timeout=90):
        again = [r for r in megatron.sent if r.label.endswith(GATHERED_AGAIN)]
        assert sorted(r.label.split()[-3] for r in again) == sorted(
            f"blocks.{i}.{layer}" for i in range(L) for layer in ("attn.qkv", "mlp.fc"))
        assert {(r.op, r.nbytes) for r in again} == {("all_gather", activation)}
        key = lambda records: [(r.op, r.label, r.nbytes, r.sent) for r in records]  # noqa: E731
        assert key(r for r in megatron.sent if r not in again) == key(pytorch.sent)
        extra = 2 * L * (tp - 1) * activation // tp
        assert sum(r.sent for r in again) == extra
        assert megatron.kept_by_norms == pytorch.kept_by_norms
        assert pytorch.kept_by_rest - megatron.kept_by_rest == extra
    assert "save_gathered_input=False keeps a sequence shard" in error_text(
        lambda: ColwiseParallel(save_gathered_input=False))


def test_the_sequence_length_is_checked_without_any_process_group():
    from fsdp_mini.course.tensor_parallel_plan import gpt_sp_plan

    assert "the tensor-parallel degree 3 does not divide the sequence length block_size=16" in error_text(
        lambda: gpt_sp_plan(GPTConfig(n_head=3, n_embd=30), 3))
    assert "the tensor-parallel degree 4 does not divide the 2 attention heads" in error_text(
        lambda: gpt_sp_plan(CFG, 4))
    assert not dist.is_initialized()
