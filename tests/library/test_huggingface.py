"""Foreign models: HuggingFace GPT-2 (tied head) and Llama (untied, rotary buffers, grouped-query attention)
built from small configs, no download. Both designs train them exactly as one process does, and
`generate()` runs on the sharded model (per-parameter: `register_fsdp_forward_method`; flat: under
`summon_full_params`) with the unwrapped model's result."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from fsdp_mini import FSDP, full_state_dict, fully_shard, launch, register_fsdp_forward_method

transformers = pytest.importorskip("transformers")

STEPS, BATCH, SEQ, VOCAB = 3, 12, 16, 64
TOL = dict(rtol=1e-5, atol=1e-6)


def build(kind: str):
    torch.manual_seed(0)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = transformers.GPT2LMHeadModel(cfg)
        return model, transformers.models.gpt2.modeling_gpt2.GPT2Block, model.transformer.h
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                   tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(cfg)
    return model, transformers.models.llama.modeling_llama.LlamaDecoderLayer, model.model.layers


def batch(step: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(step))


def make_optimizer(name, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    return torch.optim.AdamW(params, lr=1e-2, eps=1e-3, weight_decay=0.1)


def run(model, opt, rows=slice(None)) -> list[float]:
    losses = []
    for s in range(STEPS):
        x = batch(s)[rows]
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def reference(kind, opt_name):
    model, _, _ = build(kind)
    losses = run(model, make_optimizer(opt_name, model.parameters()))
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def wrap(kind, design):
    from torch.distributed.device_mesh import init_device_mesh

    model, block_cls, blocks = build(kind)
    if design.startswith("flat:"):
        strategy = design.removeprefix("flat:")
        shard_size = 2 if strategy == "HYBRID_SHARD" else None
        return FSDP(model, strategy, wrap=(block_cls,), shard_size=shard_size)
    option = design.removeprefix("per_param:")
    mesh = init_device_mesh("cpu", (2, dist.get_world_size() // 2)) if option == "2d" else None
    reshard = {"True": True, "False": False, "2": 2, "2d": True}[option]
    for block in blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
    return fully_shard(model, mesh=mesh, reshard_after_forward=reshard)


def _train(kind, cases):
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
    out = {}
    for design, opt_name in cases:
        model = wrap(kind, design)
        losses = run(model, make_optimizer(opt_name, model.parameters()), rows)
        out[design, opt_name] = (losses, full_state_dict(model))
    return out


CASES = {
    2: [("flat:FULL_SHARD", "sgd"), ("flat:NO_SHARD", "adamw"), ("per_param:True", "adamw"), ("per_param:False", "sgd")],
    3: [("flat:SHARD_GRAD_OP", "adamw"), ("per_param:True", "sgd")],
    4: [("flat:HYBRID_SHARD", "sgd"), ("per_param:2d", "adamw"), ("per_param:2", "sgd")],
}


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_both_designs_train_huggingface_models_like_one_process(kind, world, no_orphans):
    refs = {opt: reference(kind, opt) for opt in ("sgd", "adamw")}
    results = launch(_train, world, args=(kind, CASES[world]), timeout=150)
    for design, opt_name in CASES[world]:
        ref_losses, ref_sd = refs[opt_name]
        losses = torch.tensor([r[design, opt_name][0] for r in results]).mean(0)
        torch.testing.assert_close(losses, torch.tensor(ref_losses), **TOL, msg=f"{design} {opt_name}")
        sd = results[0][design, opt_name][1]
        assert list(sd) == list(ref_sd)
        for k, v in ref_sd.items():
            torch.testing.assert_close(sd[k], v, **TOL, msg=f"{design} {opt_name} {k}")


def _generate(kind):
    prompt = torch.tensor([[1, 2, 3]])
    kwargs = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    per_param = wrap(kind, "per_param:True")
    register_fsdp_forward_method(per_param, "generate")
    a = per_param.generate(prompt, **kwargs)
    flat = wrap(kind, "flat:FULL_SHARD")
    with flat.summon_full_params():
        b = flat.module.generate(prompt, **kwargs)
    return a, b


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_generate_on_sharded_models_equals_the_unwrapped_model(kind, no_orphans):
    model, _, _ = build(kind)
    want = model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=6, do_sample=False, pad_token_id=0)
    for per_param, flat in launch(_generate, 2, args=(kind,), timeout=120):
        assert torch.equal(per_param, want) and torch.equal(flat, want)
