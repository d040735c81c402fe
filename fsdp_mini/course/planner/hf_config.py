"""A model the planner has no preset for, read from the `config.json` Hugging Face stores beside its weights.

The planner needs shapes only, and a `config.json` holds them; each supported architecture maps its fields onto a
`models.ModelSpec` so that the parameter count equals the one the architecture's own module has, to the parameter
(tests/course/test_hf_config.py builds each with `transformers` and compares):

* `LlamaForCausalLM`, `MistralForCausalLM`, `Qwen2ForCausalLM`: RMSNorm, rotary positions, a gated MLP of three
  `hidden_size x intermediate_size` matrices, grouped-query attention of `num_key_value_heads`, an output head tied to
  the embedding when `tie_word_embeddings`. Biases: Llama's `attention_bias` (q, k, v, o) and `mlp_bias` (the
  MLP's; the planner takes both or neither), none in Mistral, q, k and v's in Qwen2 (always: transformers'
  models/qwen2/modeling_qwen2.py builds q_proj, k_proj and v_proj with `bias=True`, o_proj and the MLP without).
* `GPT2LMHeadModel`: LayerNorm, a learned position table of `n_positions` rows, one fused qkv matrix, a GELU MLP of
  `n_inner` (4 x `n_embd` when null), biases everywhere, the head tied to the embedding.
* `MPTForCausalLM` (llm-foundry's `MPTConfig`; Hugging Face's `MptForCausalLM` reads the same file): LayerNorm,
  a fused qkv matrix, a GELU MLP of `expansion_ratio x d_model`, biases on linear layers and norms unless
  `no_bias`, the head tied to the embedding; a learned position table of `max_seq_len` rows when `learned_pos_emb`
  and not `attn_config.alibi` (llm-foundry's `MPTModel` builds `wpe` only then; its benchmark table's NumParams
  counts it: mosaicml/llm-foundry, scripts/train/benchmarking/README.md, where MPT-7B has 6,658,859,008 parameters
  at sequence 2,048 and 6,667,247,616 at 4,096). Hugging Face's own `MptForCausalLM` (transformers'
  models/mpt/modeling_mpt.py) builds only ALiBi without biases (norms' `bias = None`, linear layers `bias=False`)
  and an MLP of 4 x `d_model`: for such a config it counts what llm-foundry counts.

Fields the planner's shapes need are required: a missing one is an error that names it. Switches keep the default
of the architecture's configuration class (transformers 5.25, checked by the tests), except MPT's, whose defaults
differ between llm-foundry (`no_bias` false, `learned_pos_emb` true, `alibi` false) and Hugging Face (`no_bias`
true, `alibi` true): those three must be written in the file.

What the planner then prices as it prices a preset: rotary's memory-bound passes whenever the model has no learned
position table (MPT with ALiBi adds a bias inside the attention kernel instead: a small overestimate), full causal
attention over the whole sequence (Mistral's `sliding_window`, where set, attends to fewer keys: an overestimate
of attention's FLOPs beyond the window). A `head_dim` other than `hidden / heads` has no place in `ModelSpec`'s
shapes and is an error.
"""
from __future__ import annotations

from pathlib import Path

from fsdp_mini.course.planner.json_file import read_json
from fsdp_mini.course.planner.models import ModelSpec

__all__ = ["ARCHITECTURES", "model_from_config", "load_model_config"]

_MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                "gpt2": "GPT2LMHeadModel", "mpt": "MPTForCausalLM"}
"""`model_type` of each supported configuration: what names the architecture when `architectures` is absent."""


def _required(config: dict, field: str, architecture: str):
    """The value of `field` (a dotted path into nested dicts), or an error that names it."""
    value = config
    for part in field.split("."):
        if not isinstance(value, dict) or part not in value or value[part] is None:
            raise ValueError(f"{architecture} config has no {field!r}: the planner needs it")
        value = value[part]
    return value


def _switch(config: dict, field: str, default: bool) -> bool:
    value = config.get(field)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValueError(f"{field}={value!r} must be true or false")
    return value


def _check_head_dim(config: dict, hidden: int, heads: int, field: str = "head_dim") -> None:
    head_dim = config.get(field)
    if head_dim is not None and head_dim * heads != hidden:
        raise ValueError(f"{field}={head_dim} differs from hidden size / heads = {hidden} / {heads}: the planner's "
                         f"shapes take q, k and v of hidden size / heads per head")


def _gated(config: dict, name: str, architecture: str) -> ModelSpec:
    """Llama, Mistral and Qwen2: the same decoder, different biases."""
    need = lambda field: _required(config, field, architecture)  # noqa: E731
    hidden, heads = need("hidden_size"), need("num_attention_heads")
    # an explicit null means one key/value head per query head in all three; an absent field means that only in
    # LlamaConfig (MistralConfig's default is 8, Qwen2Config's 32, whatever the head count): required there
    if "num_key_value_heads" not in config and architecture != "LlamaForCausalLM":
        need("num_key_value_heads")
    kv_heads = config.get("num_key_value_heads") or heads
    _check_head_dim(config, hidden, heads)
    bias = qkv_bias = False
    if architecture == "LlamaForCausalLM":
        attention, mlp = _switch(config, "attention_bias", False), _switch(config, "mlp_bias", False)
        if attention != mlp:
            raise ValueError(f"attention_bias={attention} with mlp_bias={mlp}: the planner supports biases on every "
                             f"linear layer of a block or on none")
        bias = attention
    elif architecture == "Qwen2ForCausalLM":
        qkv_bias = True
    return ModelSpec(name, hidden, need("num_hidden_layers"), heads, kv_heads, need("intermediate_size"),
                     need("vocab_size"), tied=_switch(config, "tie_word_embeddings", False), bias=bias,
                     qkv_bias=qkv_bias)


def _gpt2(config: dict, name: str, architecture: str) -> ModelSpec:
    need = lambda field: _required(config, field, architecture)  # noqa: E731
    hidden, heads = need("n_embd"), need("n_head")
    return ModelSpec(name, hidden, need("n_layer"), heads, heads, config.get("n_inner") or 4 * hidden,
                     need("vocab_size"), mlp="gelu", norm="layernorm", bias=True,
                     tied=_switch(config, "tie_word_embeddings", True), positions=need("n_positions"))


_MPT_ATTENTION = ("multihead_attention", "multiquery_attention", "grouped_query_attention")


def _mpt(config: dict, name: str, architecture: str) -> ModelSpec:
    need = lambda field: _required(config, field, architecture)  # noqa: E731
    hidden, heads = need("d_model"), need("n_heads")
    no_bias, learned, alibi = need("no_bias"), need("learned_pos_emb"), need("attn_config.alibi")
    attention = config["attn_config"].get("attn_type") or "multihead_attention"
    if attention not in _MPT_ATTENTION:
        raise ValueError(f"attn_config.attn_type={attention!r} is not supported; supported: "
                         f"{', '.join(_MPT_ATTENTION)}")
    kv_heads = {"multihead_attention": heads, "multiquery_attention": 1}.get(attention) or need(
        "attn_config.kv_n_heads")
    if config["attn_config"].get("qk_ln"):
        raise ValueError("attn_config.qk_ln=true (norms on q and k) is not supported")
    ffn_config = config.get("ffn_config") or {}
    if ffn_config.get("ffn_type", "mptmlp") != "mptmlp":
        raise ValueError(f"ffn_config.ffn_type={ffn_config['ffn_type']!r} is not supported; supported: mptmlp")
    _check_head_dim(config, hidden, heads)
    ffn = ffn_config.get("ffn_hidden_size") or int(hidden * need("expansion_ratio"))  # llm-foundry's rounding
    return ModelSpec(name, hidden, need("n_layers"), heads, kv_heads, ffn, need("vocab_size"), mlp="gelu",
                     norm="layernorm", bias=not no_bias, norm_bias=not no_bias,
                     tied=_switch(config, "tie_word_embeddings", True),
                     positions=need("max_seq_len") if learned and not alibi else 0)


ARCHITECTURES = {"LlamaForCausalLM": _gated, "MistralForCausalLM": _gated, "Qwen2ForCausalLM": _gated,
                 "GPT2LMHeadModel": _gpt2, "MPTForCausalLM": _mpt, "MptForCausalLM": _mpt}
"""Each supported `architectures` entry and the function that reads its fields."""


def model_from_config(config: dict, name: str = "config") -> ModelSpec:
    """The `ModelSpec` of a parsed `config.json`; an unknown architecture or a missing field is a ValueError that
    names it (and lists the supported architectures)."""
    if not isinstance(config, dict):
        raise ValueError(f"a model config must be a JSON object, not {type(config).__name__}")
    architectures = config.get("architectures") or []
    architecture = architectures[0] if architectures else _MODEL_TYPES.get(config.get("model_type"))
    if architecture not in ARCHITECTURES:
        named = architecture or f"model_type {config.get('model_type')!r} with no 'architectures'"
        raise ValueError(f"unsupported architecture {named!r}; supported: {', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[architecture](config, name, architecture)


def load_model_config(path: str | Path) -> ModelSpec:
    """The `ModelSpec` of the `config.json` at `path`, named after the file's folder (or the file)."""
    path = Path(path)
    config = read_json(path, "model config")
    name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    return model_from_config(config, name)
