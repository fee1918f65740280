"""The GPT baseline: a causal pre-LN transformer decoder, token-level (every position predicts the next).

    x_0   = E[idx] + P[t]                        E (V, D) tied with the output projection, P (context, D) learned
    x'    = x + drop(Attn(LN_1(x)))              causal multi-head self-attention (F.scaled_dot_product_attention)
    x''   = x' + drop(W_2 GELU(W_1 LN_2(x') + b_1) + b_2)      MLP width 4D
    logit = E^T LN_f(x_L)

Initialisation: embedding, positions and linear weights ~ N(0, 0.02), biases 0, LayerNorms (1, 0),
drawn on the CPU from a generator seeded by `seed`.

Trainable parameters: V D + T D + L (12 D^2 + 13 D) + 2 D.

Generation: `init_state(batch)` allocates a key/value cache (B, h, context, D/h) per layer and a position
counter; `step(idx_t, state)` runs one token against the cache (attention over the t cached positions).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from reslm.core.errors import ReslmError
from reslm.models.base import TokenLM, check_positive, next_token_loss


@dataclass
class GPTConfig:
    vocab_size: int = 50257
    dim: int = 256
    n_layers: int = 6
    n_heads: int = 8
    context: int = 512
    dropout: float = 0.0
    seed: int = 0

    def validate(self) -> "GPTConfig":
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "context", "seed"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool):
                raise ReslmError(f"{name} must be an integer, got {v!r}")
        check_positive(vocab_size=self.vocab_size, dim=self.dim, n_layers=self.n_layers,
                       n_heads=self.n_heads, context=self.context)
        if self.dim % self.n_heads:
            raise ReslmError(f"dim ({self.dim}) must be divisible by n_heads ({self.n_heads})")
        if not (isinstance(self.dropout, (int, float)) and 0.0 <= self.dropout < 1.0):
            raise ReslmError(f"dropout must be in [0, 1), got {self.dropout!r}")
        return self


def gpt_param_count(cfg: GPTConfig) -> int:
    V, D, L, T = cfg.vocab_size, cfg.dim, cfg.n_layers, cfg.context
    return V * D + T * D + L * (12 * D * D + 13 * D) + 2 * D


class GPTBlock(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        D = cfg.dim
        self.n_heads, self.dropout = cfg.n_heads, cfg.dropout
        self.ln_1 = nn.LayerNorm(D)
        self.qkv = nn.utils.skip_init(nn.Linear, D, 3 * D)
        self.proj = nn.utils.skip_init(nn.Linear, D, D)
        self.ln_2 = nn.LayerNorm(D)
        self.fc = nn.utils.skip_init(nn.Linear, D, 4 * D)
        self.fc_out = nn.utils.skip_init(nn.Linear, 4 * D, D)

    def _heads(self, x: torch.Tensor):
        B, T, D = x.shape
        h = self.n_heads
        q, k, v = self.qkv(self.ln_1(x)).view(B, T, 3, h, D // h).permute(2, 0, 3, 1, 4)
        return q, k, v                                                # (B, h, T, hd) each

    def _finish(self, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        B, h, T, hd = a.shape
        p = self.dropout if self.training else 0.0
        x = x + F.dropout(self.proj(a.transpose(1, 2).reshape(B, T, h * hd)), p, self.training)
        return x + F.dropout(self.fc_out(F.gelu(self.fc(self.ln_2(x)))), p, self.training)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._heads(x)
        p = self.dropout if self.training else 0.0
        return self._finish(x, F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True))

    def step(self, x: torch.Tensor, cache: tuple, pos: int) -> torch.Tensor:
        """x (B,1,D) at position `pos`; cache (K, V), each (B,h,context,hd), written in place."""
        q, k, v = self._heads(x)
        K, V = cache
        K[:, :, pos:pos + 1] = k
        V[:, :, pos:pos + 1] = v
        a = F.scaled_dot_product_attention(q, K[:, :, :pos + 1], V[:, :, :pos + 1])
        return self._finish(x, a)


class GPT(TokenLM):
    """Causal decoder. forward(idx (B,T), targets (B,T) | None) -> (logits (B,T,V), loss)."""

    family = "gpt"
    stateful = True  # generation uses the KV cache

    @property
    def max_positions(self) -> int:
        """Steps `step` can take from an empty cache (the learned position table's length)."""
        return self.config.context

    def __init__(self, cfg: GPTConfig | None = None):
        super().__init__()
        cfg = (cfg or GPTConfig()).validate()
        self.config = cfg
        self.embed = nn.utils.skip_init(nn.Embedding, cfg.vocab_size, cfg.dim)
        self.pos = nn.Parameter(torch.empty(cfg.context, cfg.dim))
        self.blocks = nn.ModuleList(GPTBlock(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.dim)
        if not torch.empty(0).is_meta:
            self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self):
        g = torch.Generator().manual_seed(self.config.seed)

        def normal_(p: torch.Tensor):
            p.copy_(torch.empty(p.shape).normal_(0.0, 0.02, generator=g))

        normal_(self.embed.weight)
        normal_(self.pos)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                normal_(m.weight)
                m.bias.zero_()
            elif isinstance(m, nn.LayerNorm):
                m.reset_parameters()

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.ln_f(x), self.embed.weight)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        B, T = idx.shape
        if T > self.config.context:
            raise ReslmError(f"window of {T} tokens is longer than the context ({self.config.context})")
        x = F.dropout(self.embed(idx) + self.pos[:T], self.config.dropout, self.training)
        for block in self.blocks:
            x = block(x)
        logits = self._logits(x)
        return logits, next_token_loss(logits, targets)

    def init_state(self, batch: int, device=None) -> dict:
        """{"cache": [(K, V) per layer, each (B, h, context, D/h) zeros], "pos": 0}."""
        cfg = self.config
        w = self.embed.weight
        shape = (batch, cfg.n_heads, cfg.context, cfg.dim // cfg.n_heads)
        cache = [(torch.zeros(shape, device=device or w.device, dtype=w.dtype),
                  torch.zeros(shape, device=device or w.device, dtype=w.dtype)) for _ in self.blocks]
        return {"cache": cache, "pos": 0}

    @torch.no_grad()
    def step(self, idx_t: torch.Tensor, state: dict):
        """idx_t (B,) -> (logits (B,V), state); the cache is updated in place."""
        pos = state["pos"]
        if pos >= self.config.context:
            raise ReslmError(f"position {pos} is past the context ({self.config.context})")
        x = self.embed(idx_t[:, None]) + self.pos[pos]
        for block, cache in zip(self.blocks, state["cache"]):
            x = block.step(x, cache, pos)
        return self._logits(x)[:, 0], {"cache": state["cache"], "pos": pos + 1}
