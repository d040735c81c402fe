"""The models the planner knows: decoder shapes, and every parameter counted from them.

A `ModelSpec` is a decoder-only transformer described by its shapes alone; the parameter count follows
from them, so a preset is right exactly when its count equals the published one to the parameter
(tests/course/test_planner.py checks each). Two families:

* Llama (`llama2-*`, `llama3-*`): RMSNorm before attention and MLP, rotary positions (no position
  table), grouped-query attention when `kv_heads < heads`, a SwiGLU MLP (gate, up, down: three matrices
  of `hidden x ffn`), no biases, an untied input embedding and output head, a final RMSNorm. Shapes from
  Meta's `params.json` of each release (dim, n_layers, n_heads, n_kv_heads, vocab_size, and the MLP width
  that `ffn_dim_multiplier` / `multiple_of` give: 11008, 13824, 28672, 14336, 53248).
* GPT-2 (`gpt2`, `gpt2-medium`, `gpt2-large`, `gpt2-xl`): LayerNorm with bias, learned positions
  (1,024), one fused qkv matrix, a GELU MLP of 4 x hidden, biases everywhere, the output head tied to
  the input embedding (Radford et al. 2019; Hugging Face's `gpt2*` configs).

`custom_model` builds any other shape with the same checks; `hf_config.load_model_config` builds one from a
Hugging Face `config.json` (Llama, Mistral, Qwen2, GPT-2, MPT), which needs the two switches presets leave off:
`qkv_bias` (Qwen2's q, k and v alone have biases) and `norm_bias` (llm-foundry's `no_bias` removes LayerNorm's).
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ModelSpec", "MODELS", "get_model", "custom_model"]

_MLPS = ("swiglu", "gelu")
_NORMS = ("rmsnorm", "layernorm")


@dataclass(frozen=True)
class ModelSpec:
    """A decoder's shapes. `mlp` is "swiglu" (three matrices) or "gelu" (two); `norm` "rmsnorm" (a weight)
    or "layernorm" (weight and bias); `bias`: linear layers have biases; `tied`: the output head is the
    input embedding; `positions`: rows of a learned position table (0: rotary, no parameters); `qkv_bias`: q, k
    and v have biases though the other linear layers do not (Qwen2); `norm_bias`: LayerNorm has its bias
    (False: MPT with `no_bias`)."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    mlp: str = "swiglu"
    norm: str = "rmsnorm"
    bias: bool = False
    tied: bool = False
    positions: int = 0
    qkv_bias: bool = False
    norm_bias: bool = True

    def __post_init__(self) -> None:
        for field in ("hidden", "layers", "heads", "kv_heads", "ffn", "vocab"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{field}={value!r} must be an integer >= 1")
        if self.hidden % self.heads:
            raise ValueError(f"heads={self.heads} does not divide hidden={self.hidden}")
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads={self.kv_heads} does not divide heads={self.heads}")
        if self.mlp not in _MLPS:
            raise ValueError(f"mlp={self.mlp!r} is not one of {', '.join(_MLPS)}")
        if self.norm not in _NORMS:
            raise ValueError(f"norm={self.norm!r} is not one of {', '.join(_NORMS)}")
        if self.positions < 0:
            raise ValueError(f"positions={self.positions!r} must be >= 0")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        """Width of k (and of v): kv_heads x head_dim; smaller than hidden under grouped-query attention."""
        return self.kv_heads * self.head_dim

    @property
    def block_matmuls(self) -> tuple[tuple[str, int], ...]:
        """Each weight matrix of a block as (name, parameters), in the order the forward multiplies by them:
        the order torchtitan's op-level selective checkpointing counts matrix products in."""
        h, kv, f = self.hidden, self.kv_dim, self.ffn
        if self.mlp == "swiglu":
            return (("wq", h * h), ("wk", h * kv), ("wv", h * kv), ("wo", h * h),
                    ("w1", h * f), ("w3", h * f), ("w2", f * h))
        return (("qkv", h * (h + 2 * kv)), ("proj", h * h), ("fc", h * f), ("fc_proj", f * h))

    @property
    def matmul_params(self) -> int:
        """A block's weight-matrix parameters: what its matrix products multiply by."""
        return sum(n for _, n in self.block_matmuls)

    @property
    def bias_params(self) -> int:
        """A block's linear biases (0 for Llama)."""
        if not self.bias:
            return self.hidden + 2 * self.kv_dim if self.qkv_bias else 0
        if self.mlp == "swiglu":
            return 2 * self.hidden + 2 * self.kv_dim + 2 * self.ffn + self.hidden
        return (self.hidden + 2 * self.kv_dim) + self.hidden + self.ffn + self.hidden

    @property
    def norm_params(self) -> int:
        """One norm: a weight (RMSNorm), or a weight and a bias (LayerNorm, unless `norm_bias` is off)."""
        return self.hidden * (2 if self.norm == "layernorm" and self.norm_bias else 1)

    @property
    def block_params(self) -> int:
        """One transformer block: the FSDP unit."""
        return self.matmul_params + self.bias_params + 2 * self.norm_params

    @property
    def root_params(self) -> int:
        """What is not in a block: the embedding (and position table), the final norm, an untied head."""
        return (self.vocab * self.hidden * (1 if self.tied else 2) + self.positions * self.hidden
                + self.norm_params)

    @property
    def params(self) -> int:
        """All parameters, embeddings included (the N of torchtitan's MFU)."""
        return self.layers * self.block_params + self.root_params

    def check_seq(self, seq: int) -> None:
        """A learned position table has a row per position: a longer sequence has no embedding to look up."""
        if self.positions and seq > self.positions:
            raise ValueError(f"--seq {seq} is longer than {self.name}'s learned position table of {self.positions} "
                             f"rows")

    def check_tp(self, tp: int) -> None:
        """TP must give each rank whole query heads, whole key/value heads and an equal share of the MLP."""
        for what, value in (("heads", self.heads), ("kv_heads", self.kv_heads), ("ffn", self.ffn)):
            if value % tp:
                raise ValueError(f"--tp {tp} does not divide {self.name}'s {what}={value}")


def _llama(name, hidden, layers, heads, kv_heads, ffn, vocab) -> ModelSpec:
    return ModelSpec(name, hidden, layers, heads, kv_heads, ffn, vocab)


def _gpt2(name, hidden, layers, heads) -> ModelSpec:
    return ModelSpec(name, hidden, layers, heads, heads, 4 * hidden, 50257, mlp="gelu", norm="layernorm",
                     bias=True, tied=True, positions=1024)


MODELS: dict[str, ModelSpec] = {m.name: m for m in (
    # Llama 2 (Touvron et al. 2023): 32k vocabulary; the 70B uses 8 key/value heads
    _llama("llama2-7b", 4096, 32, 32, 32, 11008, 32000),      # 6,738,415,616
    _llama("llama2-13b", 5120, 40, 40, 40, 13824, 32000),     # 13,015,864,320
    _llama("llama2-70b", 8192, 80, 64, 8, 28672, 32000),      # 68,976,648,192
    # Llama 3 / 3.1 (Dubey et al. 2024, table 3): 128,256 tokens, 8 key/value heads at every size
    _llama("llama3-8b", 4096, 32, 32, 8, 14336, 128256),      # 8,030,261,248
    _llama("llama3-70b", 8192, 80, 64, 8, 28672, 128256),     # 70,553,706,496
    _llama("llama3-405b", 16384, 126, 128, 8, 53248, 128256),  # 405,853,388,800
    _gpt2("gpt2", 768, 12, 12),           # 124,439,808
    _gpt2("gpt2-medium", 1024, 24, 16),   # 354,823,168
    _gpt2("gpt2-large", 1280, 36, 20),    # 774,030,080
    _gpt2("gpt2-xl", 1600, 48, 25),       # 1,557,611,200
)}


def get_model(name: str) -> ModelSpec:
    """The preset called `name`; an unknown name is an error that names it and lists the presets."""
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; presets: {', '.join(MODELS)}") from None


def custom_model(name: str, hidden: int, layers: int, heads: int, ffn: int, vocab: int,
                 kv_heads: int | None = None, **kwargs) -> ModelSpec:
    """A model of any other shape (Llama-style by default; pass mlp="gelu", norm="layernorm", ... for others)."""
    return ModelSpec(name, hidden, layers, heads, heads if kv_heads is None else kv_heads, ffn, vocab, **kwargs)
