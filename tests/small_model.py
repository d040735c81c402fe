"""TinyLM: the small language model the library's engine tests (tests/library/) train, shard and checkpoint.

It belongs to the tests, not to the course: lessons may change their GPT (`fsdp_mini.course.models`)
as they like without touching what the engines are tested on, and the library's tests import nothing
from the course floor (tests/library/test_layout.py checks). It is a model of its own on purpose, and
each feature is here because an engine case needs it:

- **Sizes that never split evenly.** Every parameter's first dimension is a prime of at least 7 (vocab
  41, width 13, attention 7, MLP 19, context 11), so per-parameter sharding (`fully_shard`, dim 0)
  pads at 2, 3 and 4 ranks without leaving any rank an empty shard; each unit's flat size is odd and
  not a multiple of 3 (the root 689 elements, a block 943), so the flat design pads too.
- **One tensor under two names.** The output head is the token table (`head.weight is embed.weight`):
  the plan must keep both names in one flat parameter, state dicts list both, DCP saves it once.
- **A parameter of the root module itself** (`pos`, the position table), next to submodules' ones.
- **1-D parameters.** LayerNorm weights and biases (the final norm has no bias), Linear biases: the
  vectors that optimizer groups without weight decay hold.
- **A list of residual blocks** (`blocks`, of class `Block`): the unit of `wrap=(Block,)` and of
  `fully_shard` per block; labels read `blocks.0`, `blocks.1`, ... A subclass can override `run_blocks`
  to take another path through them (a rank that skips a block).
- **Attention through `F.scaled_dot_product_attention`** (one causal head), for the activation tests;
  the key projection has no bias, since softmax ignores one.
- **A method beside forward** (`generate`) that uses the embedding and head itself, as HuggingFace
  models do: `register_fsdp_forward_method` and `summon_full_params` cases.
- **Initialisation by parameter name** (`init_parameter(name, tensor)`): the values depend on the name
  and `seed` only, never on the global random stream, so a model built eagerly, on every rank, or on
  the meta device and materialised unit by unit (`param_init_fn=fsdp_mini.fsdp.fully_sharded_data_parallel.materialise_by_name(model, model.init_parameter)`) is the same one.
- **A deterministic global batch** (`batch`) that every rank builds and takes its rows of
  (`rank_rows`), so that the mean of the ranks' losses is the one-process loss: what parity means.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["TinyConfig", "TinyLM", "Block", "Attention", "batch", "rank_rows", "train", "seed_of"]


@dataclass(frozen=True)
class TinyConfig:
    vocab: int = 41     # rows of the tied token table and of the logits
    width: int = 13     # the residual stream
    head_dim: int = 7   # the one attention head's query/key/value width
    ffn: int = 19       # the MLP's inner width
    context: int = 11   # the longest sequence; rows of the position table
    depth: int = 2      # blocks

    def but(self, **changes) -> "TinyConfig":
        """This configuration with some fields changed: `CFG.but(depth=3)`."""
        return replace(self, **changes)

    def root_numel(self) -> int:
        """Elements outside the blocks, counted from the shapes (the tied head adds none)."""
        return self.vocab * self.width + self.context * self.width + self.width

    def block_numel(self) -> int:
        """Elements of one block: LayerNorm (2w), query and value (w*h + h each), key (w*h), out (h*w + w),
        up (w*f + f), down (f*w + w)."""
        w, h, f = self.width, self.head_dim, self.ffn
        return 2 * w + (2 * (w * h + h) + w * h) + (h * w + w) + (w * f + f) + (f * w + w)

    def numel(self) -> int:
        return self.root_numel() + self.depth * self.block_numel()


def seed_of(*parts) -> int:
    """A 63-bit seed from any values (a name, a seed, a step), the same in every process and run
    (Python's `hash` of a string is salted per process)."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class Attention(nn.Module):
    """One causal head: separate query, key and value projections (each 7 rows: prime, unlike a fused
    3 x head_dim one), then `F.scaled_dot_product_attention` on (batch, time, head_dim) tensors."""

    def __init__(self, cfg: TinyConfig):
        super().__init__()
        self.query = nn.Linear(cfg.width, cfg.head_dim)
        self.key = nn.Linear(cfg.width, cfg.head_dim, bias=False)
        self.value = nn.Linear(cfg.width, cfg.head_dim)
        self.out = nn.Linear(cfg.head_dim, cfg.width)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        mixed = F.scaled_dot_product_attention(self.query(h), self.key(h), self.value(h), is_causal=True)
        return self.out(mixed)


class Block(nn.Module):
    """A residual block with one LayerNorm feeding attention and the MLP side by side (the parallel form
    of GPT-J): x + attn(norm(x)) + down(gelu(up(norm(x)))). The unit the tests shard."""

    def __init__(self, cfg: TinyConfig):
        super().__init__()
        self.norm = nn.LayerNorm(cfg.width)
        self.attn = Attention(cfg)
        self.up = nn.Linear(cfg.width, cfg.ffn)
        self.down = nn.Linear(cfg.ffn, cfg.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return x + self.attn(h) + self.down(F.gelu(self.up(h)))


class TinyLM(nn.Module):
    """`TinyLM(cfg)(tokens)` gives logits (batch, time, vocab); `TinyLM(cfg)(tokens, targets)` the mean
    cross-entropy. Built on the meta device it stays uninitialised until `init_parameter` fills it."""

    def __init__(self, cfg: TinyConfig = TinyConfig(), seed: int = 0):
        super().__init__()
        self.cfg, self.seed = cfg, seed
        self.pos = nn.Parameter(torch.empty(cfg.context, cfg.width))
        self.embed = nn.Embedding(cfg.vocab, cfg.width)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.depth)])
        self.norm = nn.LayerNorm(cfg.width, bias=False)
        self.head = nn.Linear(cfg.width, cfg.vocab, bias=False)
        self.head.weight = self.embed.weight
        if not self.pos.is_meta:
            for name, tensor in self.named_parameters():
                self.init_parameter(name, tensor)

    def init_parameter(self, name: str, tensor: torch.Tensor) -> None:
        """Fill one parameter in place from its name and the model's seed: biases 0, LayerNorm weights 1,
        matrices N(0, 1 / (4 * fan_in)) from a generator seeded by (seed, name)."""
        with torch.no_grad():
            if name.endswith("bias"):
                tensor.zero_()
            elif name.endswith("norm.weight"):
                tensor.fill_(1.0)
            else:
                draw = torch.randn(tensor.shape, generator=torch.Generator().manual_seed(seed_of(self.seed, name)))
                tensor.copy_(draw * (0.5 * tensor.shape[-1] ** -0.5))

    def run_blocks(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x

    def features(self, tokens: torch.Tensor) -> torch.Tensor:
        """The final LayerNorm's output for each position: everything but the head."""
        if tokens.shape[1] > self.cfg.context:
            raise ValueError(f"{tokens.shape[1]} tokens exceed the context of {self.cfg.context}")
        return self.norm(self.run_blocks(self.embed(tokens) + self.pos[:tokens.shape[1]]))

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        logits = self.head(self.features(tokens))
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())

    @torch.no_grad()
    def generate(self, tokens: torch.Tensor, new_tokens: int) -> torch.Tensor:
        """Greedy decoding: append the likeliest next token `new_tokens` times, reading at most the last
        `context` tokens. It calls the embedding and the head itself, not `forward`."""
        for _ in range(new_tokens):
            last = self.features(tokens[:, -self.cfg.context:])[:, -1]
            tokens = torch.cat([tokens, self.head(last).argmax(-1, keepdim=True)], dim=1)
        return tokens


def batch(cfg: TinyConfig, rows: int, step: int = 0, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of training step `step`: (tokens, next tokens), each (rows, context) int64.

    Each row starts at a random token and then follows one fixed random permutation of the vocabulary
    (a bigram chain the model learns within a few steps, so losses visibly fall). The same on every
    rank and in every run; another `seed` or `step` gives other rows."""
    chain = torch.randperm(cfg.vocab, generator=torch.Generator().manual_seed(seed_of("chain", cfg.vocab)))
    token = torch.randint(cfg.vocab, (rows,), generator=torch.Generator().manual_seed(seed_of("batch", seed, step)))
    sequence = [token]
    for _ in range(cfg.context):
        sequence.append(chain[sequence[-1]])
    sequence = torch.stack(sequence, dim=1)
    return sequence[:, :-1].contiguous(), sequence[:, 1:].contiguous()


def rank_rows(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Rank `rank`'s contiguous share of a global batch of `world` equal shares."""
    if t.shape[0] % world:
        raise ValueError(f"{t.shape[0]} rows do not split into {world} equal shares")
    return t.unflatten(0, (world, -1))[rank]


def train(model: nn.Module, optimizer: torch.optim.Optimizer, cfg: TinyConfig, steps: int, rows: int, *,
          max_norm: float | None = None, seed: int = 0, whole_batch: bool = False) -> list[float]:
    """`steps` optimizer steps on `batch(cfg, rows, step, seed)`; returns this process's losses.

    Inside torch.distributed each rank trains on its `rank_rows` (unless `whole_batch`: a one-rank
    reference); outside it on the whole batch. With `max_norm`, gradients are clipped by the model's own
    `clip_grad_norm_` (sharded models have one) or else by torch's."""
    share = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() and not whole_batch else (0, 1)
    clip = getattr(model, "clip_grad_norm_", None) or (lambda norm: nn.utils.clip_grad_norm_(model.parameters(), norm))

    def step(index: int) -> float:
        loss = model(*(rank_rows(t, *share) for t in batch(cfg, rows, index, seed)))
        loss.backward()
        if max_norm is not None:
            clip(max_norm)
        optimizer.step()
        optimizer.zero_grad()
        return loss.item()

    return [step(index) for index in range(steps)]
