"""The engine tests' own model (tests/small_model.py) keeps the promises those tests rely on: sizes that never
split evenly, a tied head, values that depend on names and seeds only, deterministic batches that ranks
split into equal shares, and greedy generation equal to forward's argmax."""
import math

import pytest
import torch

from small_model import Block, TinyConfig, TinyLM, batch, rank_rows, seed_of

CFG = TinyConfig()


def _units(model):
    """(label, parameters) of the units the tests shard: the root (what is outside the blocks), each block."""
    root = [p for name, p in model.named_parameters() if not name.startswith("blocks.")]
    return [("root", root)] + [(f"blocks.{i}", list(b.parameters())) for i, b in enumerate(model.blocks)]


def test_no_parameter_and_no_unit_splits_evenly_over_2_3_or_4_ranks():
    model = TinyLM(CFG)
    for name, p in model.named_parameters():
        for n in (2, 3, 4):
            rows = p.shape[0]
            assert rows % n, f"{name}: {rows} rows split evenly over {n}"  # per-parameter sharding pads
            assert (n - 1) * math.ceil(rows / n) < rows, f"{name}: a rank of {n} would hold no rows"
    for label, params in _units(model):
        numel = sum(p.numel() for p in params)
        assert numel % 2 and numel % 3, f"{label}: {numel} elements"  # the flat design pads too


@pytest.mark.parametrize("depth", [1, 2, 3, 4])
def test_the_counts_derived_from_the_shapes_are_the_models(depth):
    cfg = CFG.but(depth=depth)
    model = TinyLM(cfg)
    units = _units(model)
    assert sum(p.numel() for p in units[0][1]) == cfg.root_numel()
    assert all(sum(p.numel() for p in params) == cfg.block_numel() for _, params in units[1:])
    assert sum(p.numel() for p in model.parameters()) == cfg.numel()
    assert [type(m) for m in model.blocks] == [Block] * depth


def test_the_head_is_the_token_table_under_a_second_name():
    model = TinyLM(CFG)
    assert model.head.weight is model.embed.weight
    names = [n for n, _ in model.named_parameters()]
    assert "embed.weight" in names and "head.weight" not in names  # named_parameters lists it once
    sd = model.state_dict()
    assert sd["head.weight"].data_ptr() == sd["embed.weight"].data_ptr()  # the state dict under both names


def test_values_depend_on_the_parameter_name_and_the_seed_only():
    torch.manual_seed(123)
    eager = TinyLM(CFG, seed=5)
    torch.manual_seed(321)
    again = TinyLM(CFG, seed=5)
    assert all(torch.equal(p, q) for p, q in zip(eager.parameters(), again.parameters())), "global stream used"
    with torch.device("meta"):
        meta = TinyLM(CFG, seed=5)
    assert all(p.is_meta for p in meta.parameters())
    meta.to_empty(device="cpu")
    for name, p in meta.named_parameters():
        meta.init_parameter(name, p)
    other = TinyLM(CFG, seed=6)
    for (name, p), q, r in zip(eager.named_parameters(), meta.parameters(), other.parameters()):
        assert torch.equal(p, q), name  # built on the meta device, filled by name: the same values
        assert torch.equal(p, r) == (p.ndim == 1), name  # another seed: other matrices; vectors are 0 or 1
    q, k = eager.blocks[0].attn.query.weight, eager.blocks[1].attn.query.weight
    assert not torch.equal(q, k)  # another name, other values
    assert seed_of(0, "a") == seed_of(0, "a") != seed_of(0, "b")


def test_batches_are_deterministic_and_ranks_take_equal_contiguous_shares():
    x, y = batch(CFG, 12, step=3)
    assert x.shape == y.shape == (12, CFG.context) and x.dtype == torch.int64
    assert torch.equal(x, batch(CFG, 12, step=3)[0]) and not torch.equal(x, batch(CFG, 12, step=4)[0])
    assert not torch.equal(x, batch(CFG, 12, step=3, seed=1)[0])
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the next tokens
    follows = {}  # one chain: a token is always followed by the same token
    for a, b in zip(x.flatten().tolist(), y.flatten().tolist()):
        assert follows.setdefault(a, b) == b
    for world in (1, 2, 3, 4):
        shares = [rank_rows(x, rank, world) for rank in range(world)]
        assert torch.equal(torch.cat(shares), x) and {len(s) for s in shares} == {12 // world}
    with pytest.raises(ValueError, match="12 rows do not split into 5 equal shares"):
        rank_rows(x, 0, 5)


def test_loss_and_generate_agree_with_the_logits():
    model = TinyLM(CFG)
    x, y = batch(CFG, 4)
    logits = model(x)
    assert logits.shape == (4, CFG.context, CFG.vocab)
    torch.testing.assert_close(model(x, y), torch.nn.functional.cross_entropy(logits.transpose(1, 2), y))
    prompt, steps = x[:, :3], CFG.context  # runs past the context: generate reads the last `context` tokens
    tokens = prompt
    for _ in range(steps):
        nxt = model(tokens[:, -CFG.context:])[:, -1].argmax(-1, keepdim=True)
        tokens = torch.cat([tokens, nxt], dim=1)
    assert torch.equal(model.generate(prompt, steps), tokens)
    with pytest.raises(ValueError, match=f"{CFG.context + 1} tokens exceed the context of {CFG.context}"):
        model(torch.zeros(1, CFG.context + 1, dtype=torch.long))
