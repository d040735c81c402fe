"""`torch.compile` on sharded models: fsdp_mini's `fully_shard` against PyTorch's FSDP2, and the flat design.

Three ways a user compiles a `fully_shard` model, each trained a few steps with SGD (momentum) and with AdamW
(eps=1e-3, see tests/library/test_fsdp_parity.py) on 2 gloo ranks, fsdp_mini and PyTorch FSDP2 in the same
processes on the same model and batches; losses, every step's gradients and the final parameters must agree:

    compile_then_shard   block.compile() on each block, then fully_shard
    shard_then_compile   fully_shard, then block.compile() on each block
    compile_model        fully_shard every block and the root, then torch.compile(model)

and a fourth that calls the hooks from elsewhere: `torch.compile(model.generate)` after
`register_fsdp_forward_method(model, "generate")`, whose tokens must be FSDP2's.

`backend="aot_eager"` is enough to catch what breaks: Dynamo traces the module (and any hook it can trace),
AOTAutograd then functionalizes the graph and builds its backward, which is where fsdp_mini's hooks used
to fail (they were traced, and the gathered parameter's in-place refill became a graph input mutation
AOTAutograd refuses). The backend counts the compiled graphs it builds and how often they run, so a
silent fallback to eager (Dynamo's recompile limit, a skipped frame) cannot pass for a compiled run, and
fsdp_mini must compile as many graphs as FSDP2 and run them as often (a new `FSDP<Block>` class per block
used to cost a graph per block, and past the recompile limit, blocks left eager).

The flat design (`FSDP(model, wrap=(Block,))` compiled whole) must still train as one process does.
"""
from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.distributed as dist

import fsdp_mini
from launch_cases import run_cases
from small_model import Block, TinyConfig, TinyLM, batch, rank_rows

CFG = TinyConfig()
STEPS, BATCH = 3, 8
OPTIMIZERS = {
    "sgd": partial(torch.optim.SGD, lr=0.1, momentum=0.9),
    "adamw": partial(torch.optim.AdamW, lr=1e-2, weight_decay=0.1, eps=1e-3),
}
FORMS = ("compile_then_shard", "shard_then_compile", "compile_model")
CASES = [("fully_shard", form) for form in FORMS] + [("fully_shard", "generate"), ("flat", "compile_model")]
TOL = dict(rtol=1e-5, atol=1e-6)


class CountingBackend:
    """`aot_eager`, counting the graphs it compiles (`graphs`) and the calls of the compiled code (`calls`)."""

    def __init__(self):
        self.graphs = self.calls = 0

    def __call__(self, gm, example_inputs):
        from torch._dynamo.backends.registry import lookup_backend

        self.graphs += 1
        compiled = lookup_backend("aot_eager")(gm, example_inputs)

        def run(*args):
            self.calls += 1
            return compiled(*args)

        return run


def _whole(t):
    t = t.full_tensor() if hasattr(t, "full_tensor") else t
    return t.detach().clone()


def _named(model, tensor_of) -> dict[str, torch.Tensor]:
    """{name: tensor_of(parameter), whole}, named without torch.compile's `_orig_mod.` prefix."""
    return {n.removeprefix("_orig_mod."): _whole(tensor_of(p)) for n, p in model.named_parameters()}


def _train(model, optimizer, backend, *, whole_batch=False, final=None):
    """STEPS steps; per step (this process's loss, every gradient whole, calls of compiled code so far in this
    run); then the final parameters, whole (`final(model)`, when given, instead), and the graphs `backend`
    has compiled so far."""
    share = (0, 1) if whole_batch else (dist.get_rank(), dist.get_world_size())
    steps, calls_before = [], backend.calls
    for step in range(STEPS):
        loss = model(*(rank_rows(t, *share) for t in batch(CFG, BATCH, step)))
        loss.backward()
        grads = _named(model, lambda p: p.grad) if final is None else {}
        optimizer.step()
        optimizer.zero_grad()
        steps.append((loss.item(), grads, backend.calls - calls_before))
    params = _named(model, lambda p: p) if final is None else final(model)
    return steps, params, backend.graphs


def _fully_shard_runs(impl: str, form: str) -> dict:
    """{optimizer: _train(...)} for one implementation and form: one model per optimizer, compiled with one
    backend, so the second model reuses the first one's graphs where Dynamo's guards let it (as a second model
    of the same classes does in a user's process) and the case pays one compilation, not two."""
    if impl == "torch":
        from torch.distributed.fsdp import fully_shard
    else:
        fully_shard = fsdp_mini.fully_shard
    torch.compiler.reset()  # nothing compiled by another case is reused, nor counts towards the recompile limit
    backend, out = CountingBackend(), {}
    for opt in OPTIMIZERS:
        model = TinyLM(CFG)
        if form == "compile_then_shard":
            for block in model.blocks:
                block.compile(backend=backend)
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        if form == "shard_then_compile":
            for block in model.blocks:
                block.compile(backend=backend)
        if form == "compile_model":
            model = torch.compile(model, backend=backend)
        out[opt] = _train(model, OPTIMIZERS[opt](model.parameters()), backend)
    return out


def _flat_run(opt: str):
    """(the flat design compiled, one process on the whole batch, eager)."""
    torch.compiler.reset()
    backend = CountingBackend()
    model = torch.compile(fsdp_mini.FSDP(TinyLM(CFG), wrap=(Block,)), backend=backend)
    ours = _train(model, OPTIMIZERS[opt](model.parameters()), backend, final=lambda m: m.full_state_dict())
    reference = TinyLM(CFG)
    return ours, _train(reference, OPTIMIZERS[opt](reference.parameters()), CountingBackend(), whole_batch=True,
                        final=lambda m: {k: v.detach().clone() for k, v in m.state_dict().items()})


def _generate_run(impl: str):
    """`register_fsdp_forward_method(model, "generate")`, then `torch.compile(model.generate)`: the hooks are
    then called from the method's wrapper, inside the compiled frame, not from `nn.Module.__call__`. Returns
    (the tokens, graphs compiled, compiled calls)."""
    if impl == "torch":
        from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method
    else:
        fully_shard, register_fsdp_forward_method = fsdp_mini.fully_shard, fsdp_mini.register_fsdp_forward_method
    torch.compiler.reset()
    model = TinyLM(CFG)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    register_fsdp_forward_method(model, "generate")
    backend = CountingBackend()
    tokens = torch.compile(model.generate, backend=backend)(batch(CFG, 2)[0][:, :3], 1)
    return tokens, backend.graphs, backend.calls


def _case(design: str, form: str):
    if design == "flat":
        return _flat_run("sgd")
    if form == "generate":
        return {impl: _generate_run(impl) for impl in ("fsdp_mini", "torch")}
    return {impl: _fully_shard_runs(impl, form) for impl in ("fsdp_mini", "torch")}


def _results():
    return run_cases(_case, CASES, 2, star=True, timeout=170)


def _same(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys(), what
    for k in a:
        torch.testing.assert_close(a[k], b[k], **TOL, msg=lambda m: f"{what} {k}: {m}")


def _assert_compiled(steps, graphs, what):
    """Compiled graphs were built and ran in every step (none fell back to eager for good)."""
    calls = [0] + [c for _, _, c in steps]
    assert graphs > 0, f"{what}: nothing was compiled"
    assert all(b > a for a, b in zip(calls, calls[1:])), f"{what}: compiled calls per step {calls}"


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("opt", list(OPTIMIZERS))
def test_fully_shard_trains_under_compile_as_fsdp2_does(form, opt, no_orphans):
    per_rank = _results()[("fully_shard", form)]
    for rank, result in enumerate(per_rank):
        (ours, our_params, our_graphs), (theirs, their_params, their_graphs) = (result["fsdp_mini"][opt],
                                                                                 result["torch"][opt])
        _assert_compiled(ours, our_graphs, f"rank {rank} fsdp_mini")
        _assert_compiled(theirs, their_graphs, f"rank {rank} torch")
        # as many graphs, run as often, as FSDP2's: one graph for all blocks (not one per block, which
        # past Dynamo's recompile limit leaves blocks eager), the same graph breaks at the hooks
        assert (our_graphs, [c for *_, c in ours]) == (their_graphs, [c for *_, c in theirs]), f"rank {rank}"
        for step, ((our_loss, our_grads, _), (their_loss, their_grads, _)) in enumerate(zip(ours, theirs)):
            assert our_loss == pytest.approx(their_loss, rel=1e-6), f"rank {rank} step {step}"
            _same(our_grads, their_grads, f"rank {rank} step {step} gradient")
        _same(our_params, their_params, f"rank {rank} parameter")


def test_a_compiled_registered_forward_method_generates_as_fsdp2_does(no_orphans):
    for rank, result in enumerate(_results()[("fully_shard", "generate")]):
        (ours, our_graphs, our_calls), (theirs, their_graphs, their_calls) = result["fsdp_mini"], result["torch"]
        assert torch.equal(ours, theirs), f"rank {rank}"
        assert our_graphs > 0 and (our_graphs, our_calls) == (their_graphs, their_calls), f"rank {rank}"


def test_flat_fsdp_trains_under_compile_as_one_process(no_orphans):
    per_rank = _results()[("flat", "compile_model")]
    _, (reference, ref_params, _) = per_rank[0]
    for rank, ((steps, params, graphs), _) in enumerate(per_rank):
        _assert_compiled(steps, graphs, f"rank {rank} flat FSDP")
        _same(params, ref_params, f"rank {rank} parameter")
    mean_losses = torch.tensor([[loss for loss, _, _ in r[0][0]] for r in per_rank]).mean(0)
    torch.testing.assert_close(mean_losses, torch.tensor([loss for loss, _, _ in reference], dtype=mean_losses.dtype),
                               **TOL)
