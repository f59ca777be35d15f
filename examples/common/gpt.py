"""A tiny GPT and the synthetic token streams it learns, both exact functions of their seeds."""
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Config:
    vocab: int = 64
    width: int = 32
    heads: int = 2
    layers: int = 2
    context: int = 16
    rows: int = 8  # sequences per data-parallel replica per step


class Attention(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.head_dim = config.width // config.heads
        self.q, self.k, self.v, self.o = (nn.Linear(config.width, config.width) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows, length, _ = x.shape
        # -1 heads: under tensor parallelism q, k and v yield only this rank's heads.
        q, k, v = (proj(x).view(rows, length, -1, self.head_dim).transpose(1, 2) for proj in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(rows, length, -1))


class MLP(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.up = nn.Linear(config.width, 4 * config.width)
        self.down = nn.Linear(4 * config.width, config.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(config.width), nn.LayerNorm(config.width)
        self.attn, self.mlp = Attention(config), MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    """Token ids in, next-token logits out.

    A pipeline stage is this model with the parts other stages own set to None (and blocks
    deleted from the dict), so every parameter keeps the name it has in the whole model.
    """

    def __init__(self, config: Config, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)  # the same initial parameters in every process, replacements included
        self.embed = nn.Embedding(config.vocab, config.width)
        self.position = nn.Embedding(config.context, config.width)
        self.blocks = nn.ModuleDict({str(i): Block(config) for i in range(config.layers)})
        self.norm = nn.LayerNorm(config.width)
        self.head = nn.Linear(config.width, config.vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x) + self.position(torch.arange(x.shape[1]))
        for block in self.blocks.values():
            x = block(x)
        if self.head is not None:
            x = self.head(self.norm(x))
        return x


def batch(config: Config, seed: int, step: int, replica: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets of data-parallel replica ``replica`` at ``step``: arithmetic
    progressions modulo the vocabulary, a function of (seed, step, replica) alone, so a moved or
    re-formed process draws exactly what it would have."""
    generator = torch.Generator().manual_seed((seed * 1_000_003 + step) * 1_009 + replica)
    start = torch.randint(config.vocab, (config.rows, 1), generator=generator)
    stride = torch.randint(1, 8, (config.rows, 1), generator=generator)
    tokens = (start + stride * torch.arange(config.context + 1)) % config.vocab
    # Contiguous, not views of ``tokens``: torch 2.11's pipeline stages refuse an input whose
    # strides differ from the shapes they were given.
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
