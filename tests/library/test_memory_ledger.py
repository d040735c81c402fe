"""The memory ledger: a step's bytes by kind and phase, on both designs, and a budget that fails loudly."""
import pytest
import torch
import torch.distributed as dist

from fsdp_mini import FSDP, fully_shard, launch
from fsdp_mini.memory import optimizer_state_bytes, tensor_bytes
from fsdp_mini.memory_ledger import KINDS, MemoryBudgetExceeded, MemoryLedger
from small_model import Block, TinyConfig, TinyLM, batch, rank_rows

CFG = TinyConfig(depth=3)


def _model(design):
    if design == "flat":
        return FSDP(TinyLM(CFG), "FULL_SHARD", wrap=(Block,))
    model = TinyLM(CFG)
    for block in model.blocks:
        fully_shard(block)
    return fully_shard(model)


def _steps(design, batches=(8, 16), budget=None):
    model = _model(design)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    out = []
    for step, rows in enumerate(batches):
        x, y = (rank_rows(t, dist.get_rank(), dist.get_world_size()) for t in batch(CFG, rows, step))
        with MemoryLedger(model, opt, budget=budget) as ledger:
            model(x, y).backward()
            after_backward = ledger.snapshot()
            opt.step()
            opt.zero_grad()
        out.append({"peak": ledger.peak, "peaks": ledger.peaks, "after_backward": after_backward,
                    "params": tensor_bytes(model.parameters()), "optimizer": optimizer_state_bytes(opt),
                    "table": ledger.table()})
    return out


@pytest.mark.parametrize("design", ["flat", "per-parameter"])
def test_the_ledger_accounts_a_step_by_kind_and_phase(design, no_orphans):
    first, second = launch(_steps, 2, args=(design,), timeout=120)[0]
    for run in (first, second):
        assert set(run["peaks"]) == {"forward", "backward", "optimizer step"}
        assert run["peak"].bytes["parameters"] == run["params"]
        assert run["peak"].total == sum(run["peak"].bytes[k] for k in KINDS)
        assert run["after_backward"].bytes["activations"] == 0  # backward released every saved tensor
        assert run["peaks"]["backward"].bytes["gathered"] > 0 and run["peaks"]["optimizer step"].bytes["activations"] == 0
    assert first["peaks"]["forward"].bytes["optimizer state"] == 0  # AdamW allocates its state at the first step
    assert second["peaks"]["forward"].bytes["optimizer state"] == second["optimizer"] > 0
    # activations grow with the batch (8 rows, then 16): about twice
    ratio = second["peaks"]["forward"].bytes["activations"] / first["peaks"]["forward"].bytes["activations"]
    assert 1.8 < ratio < 2.2
    assert second["peak"].largest()[0] == "activations" and "peak:" in second["table"]


def test_a_budget_below_the_peak_fails_naming_the_largest_part(no_orphans):
    def over():
        try:
            # 64 rows: ~0.5 MB of activations in forward, ~10 kB of parameters and gathered weights
            _steps("flat", batches=(64,), budget=100_000)
        except MemoryBudgetExceeded as e:
            return str(e), e.snapshot.largest()[0]
        return "fits", ""

    message, largest = launch(over, 2, timeout=120)[0]
    assert message.startswith("memory budget of 100.0 kB exceeded in forward: ") and largest == "activations"
    assert "the largest part activations" in message
    assert launch(_steps, 2, args=("flat", (8,), 10**9), timeout=120)  # a generous budget is silent


def test_only_sharded_models_have_a_ledger():
    with pytest.raises(ValueError, match="follows an FSDP or fully_shard model, got TinyLM"):
        MemoryLedger(TinyLM(CFG))


def _activations_twice():
    return [[_steps(design, batches=(8,))[0]["peaks"]["forward"].bytes["activations"] for _ in range(2)]
            for design in ("flat", "per-parameter")]


def test_activations_do_not_count_gathered_weights_and_are_the_same_in_both_designs(no_orphans):
    # a weight's transpose saved for backward lives in the gathered buffer, which the unit frees after
    # forward: counted as an activation it would also hide a later activation at the same address
    (flat1, flat2), (pp1, pp2) = launch(_activations_twice, 2, timeout=120)[0]
    assert flat1 == flat2 == pp1 == pp2 > 0
