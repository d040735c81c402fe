"""A small GPT, the model that the tests, the lessons and the demo train.

The shape of nanoGPT (token + position embeddings, pre-LayerNorm blocks of causal self-attention and an
MLP, a final LayerNorm, a head tied to the token embedding), shrunk so that four CPU processes train it
in seconds. It is a realistic FSDP case on purpose: a `Block` is the natural unit to wrap, the tied
embedding/head must stay in one unit (the root), and the sizes are not multiples of the world size.
"""
from __future__ import annotations

import math
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
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


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
    """`GPT(cfg)(idx)` gives logits; `GPT(cfg)(idx, targets)` gives the mean cross-entropy loss."""

    def __init__(self, cfg: GPTConfig = GPTConfig()):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos_emb = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.tok_emb.weight  # tied: one tensor under two names
        self.register_buffer("pos", torch.arange(cfg.block_size), persistent=False)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2's scaled init of the residual projections
            if name.endswith("proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.cfg.block_size:
            raise ValueError(f"sequence length {t} exceeds block_size={self.cfg.block_size}")
        x = self.tok_emb(idx) + self.pos_emb(self.pos[:t])
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


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
