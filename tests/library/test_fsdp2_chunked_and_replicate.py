"""fsdp_mini against PyTorch on FSDP2's last four scenarios (issue 39), on the same forked gloo ranks.

A chunked loss: the model's forward runs the body and the norm (`skip_head=True`), and the head runs
standalone on chunks of the detached output, each chunk with a backward of its own, before the body's
single backward. The norm and the head are one unit (`fully_shard([norm, head])`, with the embedding too
when the head's weight is tied to it), so the forward runs part of a unit and each chunk the other part.
Both implementations run in the same processes on the same model and batches, and each step must issue
the same collectives (per kind) and give the same gradients and parameters; the fourth scenario compares
`fsdp_mini.replicate` applied per block with PyTorch's FSDP2-based replicate. The scenarios of one group
share a launch (tests/launch_cases.py).
"""
from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import fsdp_mini
from fsdp2_calls import AllReduces, FSDP2Calls
from launch_cases import run_cases

IMPLS = ("fsdp_mini", "torch")
VOCAB, DIM, SEQ = 16, 8, 8


def _fully_shard(name):
    if name == "torch":
        from torch.distributed.fsdp import fully_shard
        return fully_shard
    return fsdp_mini.fully_shard


class ChunkedHeadModel(nn.Module):
    """FSDP2's chunked-loss model: `forward(tokens, skip_head=True)` stops after the norm; the head runs
    on chunks of that output afterwards. `tied`: the head's weight is the embedding's."""

    def __init__(self, tied: bool, depth: int = 2):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, DIM)
        self.body = nn.Sequential(*[nn.Linear(DIM, DIM) for _ in range(depth)])
        self.norm = nn.RMSNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)  # not all ones: its gradient must flow through it
        if tied:
            self.head.weight = self.embed.weight

    def forward(self, tokens, *, skip_head: bool = False):
        h = self.norm(self.body(self.embed(tokens)))
        return h if skip_head else self.head(h)


def _tokens(rank, step, micro=0):
    g = torch.Generator().manual_seed(1000 * step + 100 * rank + micro)
    return torch.randint(0, VOCAB, (2, SEQ), generator=g)


def _wrap(name, tied, reshard_after_forward, per_block):
    fully_shard = _fully_shard(name)
    model = ChunkedHeadModel(tied)
    kw = {"reshard_after_forward": reshard_after_forward}
    if not tied:
        fully_shard(model.embed, **kw)
    for block in (model.body if per_block else [model.body]):
        fully_shard(block, **kw)
    fully_shard([model.embed, model.norm, model.head] if tied else [model.norm, model.head], **kw)
    fully_shard(model, **kw)
    return model


def _chunked_micro_batch(model, tokens, chunks, keep_head=False):
    """One micro-batch: the partial forward, the head's backward per chunk, then the body's. keep_head:
    the head unit keeps its parameters between the chunks (set_reshard_after_forward/backward False),
    freed by `reshard()` once they are done. Returns the collectives issued inside the chunk loop."""
    h = model(tokens, skip_head=True)
    if keep_head:
        model.head.set_reshard_after_forward(False)
        model.head.set_reshard_after_backward(False)
    grads = []
    with FSDP2Calls(include_fsdp_mini=True) as loop:
        for chunk in torch.chunk(h.detach(), chunks, dim=1):
            chunk = chunk.contiguous().requires_grad_(True)
            model.head(chunk).sum().backward()
            grads.append(chunk.grad)
    if keep_head:
        model.head.set_reshard_after_forward(True)
        model.head.set_reshard_after_backward(True)
        model.head.reshard()
    h.backward(torch.cat(grads, dim=1))
    return _counts(loop)


def _counts(log):
    """Collectives per kind, and the whole sequence (kind, elements) in the order issued."""
    return {**{op: len(log.ops(op)) for op in ("all_gather", "reduce_scatter")},
            "issued": [(c.op, c.numel) for c in log.calls]}


def _full(t):
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def _chunked(name, tied=False, reshard_after_forward=True, per_block=True, micro_batches=1, chunks=4,
             keep_head=False, steps=2):
    """Per step: collectives per kind (the whole step, and inside each chunk loop), the gradients; at the
    end the parameters after an SGD step per step."""
    model = _wrap(name, tied, reshard_after_forward, per_block)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = []
    for step in range(steps):
        loops = []
        with FSDP2Calls(include_fsdp_mini=True) as log:
            for micro in range(micro_batches):
                last = micro == micro_batches - 1
                if micro_batches > 1:
                    model.set_requires_gradient_sync(last)
                    model.set_is_last_backward(last)
                loops.append(_chunked_micro_batch(model, _tokens(dist.get_rank(), step, micro), chunks, keep_head))
        grads = {n: None if p.grad is None else _full(p.grad) for n, p in model.named_parameters()}
        out.append((_counts(log), loops, grads))
        opt.step()
        opt.zero_grad()
    return out, {n: _full(p) for n, p in model.named_parameters()}


def _both(case):
    scenario, kwargs = case
    return {name: scenario(name, **dict(kwargs)) for name in IMPLS}


def _results(scenario, cases):
    """{case: per-rank {impl: result}}, every case of the group in one launch of 2 ranks."""
    keyed = [(scenario, tuple(sorted(c.items()))) for c in cases]
    got = run_cases(_both, keyed, 2, timeout=120)
    return {k[1]: got[k] for k in keyed}


def _same(a, b, rtol=1e-6, atol=1e-7):
    assert a.keys() == b.keys()
    for k in a:
        if a[k] is None or b[k] is None:
            assert a[k] is None and b[k] is None, k
        else:
            torch.testing.assert_close(a[k], b[k], rtol=rtol, atol=atol, msg=k)


def _assert_same_steps(per_rank):
    for ranks in per_rank:
        (mini_steps, mini_params), (torch_steps, torch_params) = ranks["fsdp_mini"], ranks["torch"]
        for step, (m, t) in enumerate(zip(mini_steps, torch_steps)):
            counts = [(c["all_gather"], c["reduce_scatter"]) for c in (m[0], *m[1], t[0], *t[1])]
            assert (m[0], m[1]) == (t[0], t[1]), f"step {step}: (AllGathers, ReduceScatters) for the step, then " \
                f"per chunk loop: fsdp_mini {counts[:len(counts) // 2]} != torch {counts[len(counts) // 2:]}"
            _same(m[2], t[2])
        _same(mini_params, torch_params)


# --- 1. partial-group forward, the head standalone per chunk -------------------------------------------

CHUNKED = [dict(reshard_after_forward=True), dict(reshard_after_forward=False), dict(tied=True),
           dict(per_block=False)]


def _key(case):
    return tuple(sorted(case.items()))


@pytest.mark.parametrize("case", CHUNKED, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_the_head_runs_standalone_per_chunk_after_a_partial_forward(case, no_orphans):
    _assert_same_steps(_results(_chunked, CHUNKED)[_key(case)])


# --- 2. the same with gradient accumulation ---------------------------------------------------------------

ACCUMULATED = [dict(micro_batches=3, chunks=2, reshard_after_forward=True),
               dict(micro_batches=3, chunks=2, reshard_after_forward=False),
               dict(micro_batches=3, chunks=2, tied=True)]


@pytest.mark.parametrize("case", ACCUMULATED, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_the_chunked_head_with_gradient_accumulation(case, no_orphans):
    _assert_same_steps(_results(_chunked, ACCUMULATED)[_key(case)])


# --- 3. the head keeps its parameters through the chunks -------------------------------------------------

KEPT = [dict(keep_head=True), dict(keep_head=True, tied=True), dict(keep_head=True, reshard_after_forward=False),
        dict(keep_head=True, micro_batches=3, chunks=2)]


@pytest.mark.parametrize("case", KEPT, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_the_head_keeps_its_parameters_through_the_chunks(case, no_orphans):
    _assert_same_steps(_results(_chunked, KEPT)[_key(case)])


# --- 4. replicate per block and on the root, FSDP2's replicate -------------------------------------------

class _Blocks(nn.Module):
    """Three blocks (each replicated on its own) and a head of the root's own."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(6, 6), nn.Tanh()) for _ in range(3))
        self.head = nn.Linear(6, 6)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _replicate_fn(name):
    if name == "torch":
        from torch.distributed._composable.replicate_with_fsdp import replicate
        return replicate
    from fsdp_mini._composable.replicate_with_fsdp import replicate
    return replicate


def _replicated(name, micro_batches=1, steps=2):
    """Per step: (AllGathers, ReduceScatters, AllReduces), the gradients; the placements of the parameters;
    at the end the parameters after an SGD step per step."""
    replicate = _replicate_fn(name)
    model = _Blocks()
    for layer in model.layers:
        replicate(layer)
    replicate(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = []
    for step in range(steps):
        with FSDP2Calls(include_fsdp_mini=True) as log, AllReduces() as reduces:
            for micro in range(micro_batches):
                if micro_batches > 1:
                    model.set_requires_gradient_sync(micro == micro_batches - 1)
                g = torch.Generator().manual_seed(1000 * step + 100 * dist.get_rank() + micro)
                model(torch.randn(4, 6, generator=g)).sum().backward()
        grads = {n: None if p.grad is None else _full(p.grad) for n, p in model.named_parameters()}
        out.append(((len(log.ops("all_gather")), len(log.ops("reduce_scatter")), reduces.count), grads))
        opt.step()
        opt.zero_grad()
    placements = {n: (type(p).__name__, str(getattr(p, "placements", None))) for n, p in model.named_parameters()}
    return out, placements, {n: _full(p) for n, p in model.named_parameters()}


REPLICATED = [dict(), dict(micro_batches=2)]


@pytest.mark.parametrize("case", REPLICATED, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "plain")
def test_replicate_per_block_as_fsdp2s_replicate(case, no_orphans):
    for ranks in _results(_replicated, REPLICATED)[_key(case)]:
        (mini_steps, mini_placements, mini_params), (torch_steps, torch_placements, torch_params) = \
            ranks["fsdp_mini"], ranks["torch"]
        for (m_counts, m_grads), (t_counts, t_grads) in zip(mini_steps, torch_steps):
            assert m_counts == t_counts == (0, 0, 4)  # one AllReduce per unit (3 blocks, the root's head)
            _same(m_grads, t_grads)
        assert mini_placements == torch_placements  # every parameter a DTensor placed Replicate()
        _same(mini_params, torch_params)


def _replicate_errors(_case):
    from torch.distributed.device_mesh import init_device_mesh

    from fsdp_mini._composable.replicate_with_fsdp import replicate

    def text(fn):
        try:
            fn()
        except ValueError as e:
            return str(e)
        return "no error"

    out = {"twice": text(lambda: replicate(replicate(nn.Linear(4, 4)))),
           "2-D mesh": text(lambda: replicate(nn.Linear(4, 4), mesh=init_device_mesh("cpu", (1, 2))))}
    model = _Blocks()
    for layer in model.layers:
        fsdp_mini.replicate(layer)  # the DDP-style replicate, applied as FSDP2's replicate is
    out["DDP-style per block"] = text(lambda: fsdp_mini.replicate(model))
    return out


def test_replicate_names_the_mistake_and_the_fix(no_orphans):
    out = run_cases(_replicate_errors, ["errors"], 2, timeout=60)["errors"][0]
    assert "replicate was already applied to this ReplicateLinear" in out["twice"]
    assert "replicate takes a 1-D DeviceMesh (the ranks to replicate over), got 2 dimensions" in out["2-D mesh"]
    assert out["DDP-style per block"].endswith("use fsdp_mini._composable.replicate_with_fsdp.replicate"), out
