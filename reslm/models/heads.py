"""Readout heads a reservoir LM can put on its normalised state (rc: `--head`, `--head-hidden`).

    linear   logits = W u + b                                     V (D + 1)              (the paper's RC)
    mlp      logits = W_2 gelu(W_1 u + b_1) + b_2                 H (D + 1) + V (H + 1)
    glu      logits = W_2 (silu(W_g u + b_g) * (W_u u + b_u)) + b_2   2 H (D + 1) + V (H + 1)   (SwiGLU)

u (width D) is what the head reads, `head_input` of the reservoir LM config: the normalised state r
(D = N), or r beside the current character's one-hot (D = N + V) or its fixed random embedding
(D = N + d). Every head here reads u alone, so a model using one obeys the reservoir frontier's rules
(reslm.models.budget); `head_params` gives the exact trainable count and `widest_hidden` the largest H
that fits a budget. Initialisation is torch's default for nn.Linear, drawn from the model's head seed.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from reslm.core.errors import ReslmError

HEADS = ("linear", "mlp", "glu")


class MLPHead(nn.Module):
    """u (B, D) -> logits (B, V) through one GELU hidden layer of width H."""

    def __init__(self, in_features: int, hidden: int, vocab_size: int):
        super().__init__()
        self.fc = nn.Linear(in_features, hidden)
        self.out = nn.Linear(hidden, vocab_size)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.fc(u)))


class GLUHead(nn.Module):
    """u (B, D) -> logits (B, V) through a SwiGLU hidden layer of width H (gate and value in one matmul)."""

    def __init__(self, in_features: int, hidden: int, vocab_size: int):
        super().__init__()
        self.hidden = hidden
        self.fc = nn.Linear(in_features, 2 * hidden)   # rows: [gate; value]
        self.out = nn.Linear(hidden, vocab_size)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        gate, value = self.fc(u).split(self.hidden, dim=-1)
        return self.out(F.silu(gate) * value)


def make_readout(kind: str, in_features: int, hidden: int, vocab_size: int) -> nn.Module:
    """The head `kind` (HEADS) from D = in_features inputs to V logits, hidden width H (mlp, glu)."""
    if kind == "linear":
        return nn.Linear(in_features, vocab_size)
    if kind not in HEADS:
        raise ReslmError(f"head must be one of {', '.join(HEADS)}, got {kind!r}")
    return (MLPHead if kind == "mlp" else GLUHead)(in_features, hidden, vocab_size)


def head_params(kind: str, in_features: int, hidden: int, vocab_size: int) -> int:
    """Trainable parameters of make_readout(kind, in_features, hidden, vocab_size), by formula."""
    D, H, V = in_features, hidden, vocab_size
    if kind == "linear":
        return V * (D + 1)
    return (1 if kind == "mlp" else 2) * H * (D + 1) + V * (H + 1)


def widest_hidden(kind: str, in_features: int, vocab_size: int, budget: int) -> int:
    """The largest H whose head fits `budget` trainable parameters (0 when none does)."""
    per = (1 if kind == "mlp" else 2) * (in_features + 1) + vocab_size
    return max(0, (budget - vocab_size) // per)


__all__ = ["HEADS", "MLPHead", "GLUHead", "make_readout", "head_params", "widest_hidden"]
