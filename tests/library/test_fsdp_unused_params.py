"""Issue 31 §1: parameters without a gradient, in the flat design, train as in one process.

A plain model leaves a parameter that got no gradient alone: `grad` stays None and SGD's weight decay and
momentum, AdamW's decay and moments, skip it. The flat design's optimizer sees one flat shard per unit,
one tensor, so what it promises is per flat parameter:

- a flat parameter none of whose parameters got a gradient (a branch unused this step, wrapped as its own
  unit) keeps `shard.grad` None: the optimizer skips it, as one process skips each of its parameters;
- a flat parameter some of whose parameters got no gradient on a rank is reduced with zeros in their
  place. That is the right average when another rank used them (a data-dependent route: one process sees
  every rank's rows); when no rank did, the optimizer still decays them, so FSDP warns, naming them.
  PyTorch's FSDP1 zero-fills such parameters too (`_flat_param.py`, `_reset_is_grad_none`: "As long as the
  parameter requires gradient, it should receive a meaningful gradient (even if the gradient happens to
  be zeros)").
- a rank on which some parameter of a unit got no gradient completes that unit only at the end of
  backward; reductions start in one fixed order on every rank, so two same-sized units are never paired
  with each other's gradients (on the code before this fix they were, silently).

`fully_shard` keeps None per parameter; it asks every rank to leave the same parameters unused (as FSDP2
does), so its comparison here routes the same way on every rank.
"""
from __future__ import annotations

import warnings
from functools import partial

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from fsdp_mini import FSDP, fully_shard, launch

ROWS, STEPS = 12, 4  # 12 rows split evenly over 2 and 3 ranks
OPTIMIZERS = {
    "sgd": partial(torch.optim.SGD, lr=0.1, momentum=0.9, weight_decay=0.1),
    "adamw": partial(torch.optim.AdamW, lr=1e-2, weight_decay=0.1, eps=1e-3),
}
TOL = dict(rtol=1e-10, atol=1e-12)  # in float64: in float32, SGD's momentum amplifies the rounding
                                    # differences of a split batch to 2.6e-5 after 4 steps (per-parameter too)


class Expert(nn.Module):
    """`lin` on every row, plus `gate` on the rows `route` selects (all rows when route is None)."""

    def __init__(self):
        super().__init__()
        self.lin, self.gate = nn.Linear(5, 5), nn.Linear(5, 5)

    def forward(self, h, route=None):
        out = h + torch.tanh(self.lin(h))
        if route is None:
            return out + self.gate(h)
        rows = route.nonzero()[:, 0]
        return out.index_add(0, rows, self.gate(h[rows])) if len(rows) else out


class Branchy(nn.Module):
    """Two same-sized experts that route rows by the input's columns 0 and 1, an expert never called, one
    called on even steps only, and a head. The batch (`batch`) routes every rank's rows in `blocks.0`, and
    in `blocks.1` only rows 0 and 1, which are rank 0's at world 2 and 3, unless `same_routes`."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList([Expert(), Expert()])
        self.never, self.sometimes = Expert(), Expert()
        self.head = nn.Linear(5, 1)
        self.double()

    def forward(self, x, step, same_routes=False):
        h = self.blocks[0](x, route=x[:, 0] > 0)
        h = self.blocks[1](h, route=x[:, 0] > 0 if same_routes else x[:, 1] > 1)
        if step % 2 == 0:
            h = self.sometimes(h)
        return self.head(h).pow(2).mean()


def batch() -> torch.Tensor:
    x = torch.randn(ROWS, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    x[:, 0] = torch.arange(ROWS) % 2 * 2 - 1.0  # odd rows route in blocks.0, on every rank
    x[:, 1] = (torch.arange(ROWS) < 2) * 4 - 2.0  # rows 0 and 1 only route in blocks.1
    return x


def _train(model, opt, rows, same_routes=False) -> None:
    for step in range(STEPS):
        opt.zero_grad()
        model(batch()[rows], step, same_routes).backward()
        opt.step()


def _rows() -> slice:
    n = ROWS // dist.get_world_size()
    return slice(dist.get_rank() * n, (dist.get_rank() + 1) * n)


STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD")


def _flat_worker(opt_name):
    out = {}
    for strategy in STRATEGIES:
        model = FSDP(Branchy(), strategy, wrap=(Expert,))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _train(model, OPTIMIZERS[opt_name](model.parameters()), _rows())
        out[strategy] = model.full_state_dict(), [str(w.message) for w in caught if "got no gradient" in str(w.message)]
    return out


def _per_param_worker(opt_name):
    model = Branchy()
    for expert in (*model.blocks, model.never, model.sometimes):
        fully_shard(expert)
    fully_shard(model)
    _train(model, OPTIMIZERS[opt_name](model.parameters()), _rows(), same_routes=True)
    return {k: v.full_tensor() for k, v in model.state_dict().items()}


def _one_process(opt_name, same_routes=False):
    model = Branchy()
    _train(model, OPTIMIZERS[opt_name](model.parameters()), slice(0, ROWS), same_routes)
    return model.state_dict()


def _assert_same(ours, reference, what):
    assert list(ours) == list(reference)
    for k in reference:
        torch.testing.assert_close(ours[k], reference[k], **TOL, msg=lambda m: f"{what}, {k}: {m}")


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
def test_unused_and_routed_parameters_train_as_in_one_process(world, opt_name, no_orphans):
    reference = _one_process(opt_name)
    assert torch.equal(reference["never.lin.weight"], Branchy().never.lin.weight)  # one process leaves it alone
    results = launch(_flat_worker, world, args=(opt_name,), timeout=60)
    for strategy in STRATEGIES:
        for state, _ in (r[strategy] for r in results):
            _assert_same(state, reference, f"FSDP {strategy}, world {world}, {opt_name}")
        # rank 0 routes rows through blocks.1's gate, the others do not: they warn (their zeros are their share)
        messages = [r[strategy][1] for r in results]
        assert [bool(m) for m in messages] == [False] + [True] * (world - 1)
        assert all(m[0].startswith("FSDP: blocks.1.gate.weight, blocks.1.gate.bias got no gradient") for m in messages[1:])


@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
def test_fully_shard_matches_one_process_with_the_same_unused_parameters(opt_name, no_orphans):
    reference = _one_process(opt_name, same_routes=True)
    for state in launch(_per_param_worker, 2, args=(opt_name,), timeout=60):
        _assert_same(state, reference, f"fully_shard, {opt_name}")


def _mixed_worker():
    model = FSDP(Branchy(), wrap=())  # one flat parameter: `never` shares it with the used parameters
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, eps=1e-3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _train(model, opt, _rows(), same_routes=True)
    return [str(w.message) for w in caught if "got no gradient" in str(w.message)]


def test_a_flat_parameter_that_mixes_used_and_unused_parameters_warns_naming_them(no_orphans):
    never = "never.lin.weight, never.lin.bias, never.gate.weight, never.gate.bias"
    sometimes = "sometimes.lin.weight, sometimes.lin.bias, sometimes.gate.weight, sometimes.gate.bias"
    for rank, messages in enumerate(launch(_mixed_worker, 2, timeout=60)):
        # once per set of names, not once per step: `sometimes` is unused on steps 1 and 3
        assert [m.split(" got no gradient")[0] for m in messages] == [f"FSDP: {never}", f"FSDP: {never}, {sometimes}"]
        assert all(f"on rank {rank} but share the flat parameter 'root'" in m and "wrap=" in m for m in messages)
