"""A small GPT, the model that the lessons, the course's tests and the demo train.

The shape of nanoGPT (token + position embeddings, pre-LayerNorm blocks of causal self-attention and an
MLP, a final LayerNorm, a head tied to the token embedding), shrunk so that four CPU processes train it
in seconds. It is a realistic FSDP case on purpose: a `Block` is the natural unit to wrap, the tied
embedding/head must stay in one unit (the root), and the sizes are not multiples of the world size.
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["GPTConfig", "GPT", "Block", "make_batch"]


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 61      # prime on purpose: no parameter divides evenly across 2, 3 or 4 ranks
    block_size: int = 16
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 30


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        if cfg.n_embd % cfg.n_head:
            raise ValueError(f"n_embd={cfg.n_embd} must be a multiple of n_head={cfg.n_head}")
        self.n_head = cfg.n_head
        self.head_dim = cfg.n_embd // cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(x)
        # the positions and heads this rank computes: all of them, or under tensor parallelism (lesson 12) its
        # share of the heads, for the whole sequence even when x held only its share (sequence parallelism)
        b, t, _ = qkv.shape
        q, k, v = qkv.chunk(3, dim=2)
        heads = q.shape[-1] // self.head_dim
        q, k, v = (z.view(b, t, heads, self.head_dim).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    """One transformer block: the unit FSDP wraps (`wrap=(Block,)`)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """`GPT(cfg)(idx)` gives logits; `GPT(cfg)(idx, targets)` gives the mean cross-entropy loss.

    Initialisation is a function of each parameter's *name* and `seed` (`init_parameter`), not of the
    global random stream, so the same weights come out however the model is built: here, on every
    rank, or on the meta device and materialised unit by unit by FSDP (`param_init_fn=materialise_by_name(model, model.init_parameter)`, fsdp_mini.fsdp.fully_sharded_data_parallel).
    """

    def __init__(self, cfg: GPTConfig = GPTConfig(), seed: int = 0):
        super().__init__()
        self.cfg, self.seed = cfg, seed
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos_emb = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.tok_emb.weight  # tied: one tensor under two names
        if not self.tok_emb.weight.is_meta:
            with torch.no_grad():
                for name, p in self.named_parameters():
                    self.init_parameter(name, p)

    def init_parameter(self, name: str, tensor: torch.Tensor) -> None:
        """GPT-2's init, in place: N(0, 0.02) weights, residual projections scaled by 1/sqrt(2 n_layer),
        zero biases, LayerNorm weight 1; the random draws come from a generator seeded by the name."""
        with torch.no_grad():
            if name.endswith("bias"):
                tensor.zero_()
            elif ".ln_" in name or name.startswith("ln_"):
                tensor.fill_(1.0)
            else:
                std = 0.02 / math.sqrt(2 * self.cfg.n_layer) if name.endswith("proj.weight") else 0.02
                g = torch.Generator().manual_seed(self.seed * 1_000_003 + zlib.crc32(name.encode()))
                tensor.copy_(torch.randn(tensor.shape, generator=g) * std)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        logits = self.lm_head(self.ln_f(self.hidden(idx)))
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))

    def hidden(self, idx: torch.Tensor) -> torch.Tensor:
        """The last block's output for each position: `forward` without the final LayerNorm and head."""
        t = idx.shape[1]
        if t > self.cfg.block_size:
            raise ValueError(f"sequence length {t} exceeds block_size={self.cfg.block_size}")
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return x

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        """Greedy decoding, nanoGPT's loop: append the likeliest next token `max_new_tokens` times (the
        context cropped to `block_size`), the head applied to the last position only. Like a HuggingFace
        model's `generate`, it is a method beside `forward` that uses the model's own parameters (the
        embeddings, the head), so on a sharded model it must gather them itself (lesson 09:
        `register_fsdp_forward_method(model, "generate")`)."""
        for _ in range(max_new_tokens):
            x = self.hidden(idx[:, -self.cfg.block_size:])[:, -1]
            idx = torch.cat([idx, self.lm_head(self.ln_f(x)).argmax(dim=-1, keepdim=True)], dim=1)
        return idx


def make_batch(cfg: GPTConfig, batch_size: int, step: int = 0, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A deterministic batch of token sequences (inputs, next-token targets) for training step `step`.

    Every rank can build the same *global* batch and take its own rows, which is how the parity tests
    compare sharded training with single-process training on exactly the same data. The sequences
    follow a simple learnable rule (each token is the previous one plus a per-sequence stride), so the
    loss visibly falls within a few steps.
    """
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    start = torch.randint(0, cfg.vocab_size, (batch_size, 1), generator=g)
    stride = torch.randint(1, 4, (batch_size, 1), generator=g)
    seq = (start + stride * torch.arange(cfg.block_size + 1)) % cfg.vocab_size
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
