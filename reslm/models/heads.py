"""Readout heads a reservoir LM can put on its normalised state (rc: `--head`, `--head-hidden`).

    linear   logits = W u + b                                     V (D + 1)              (the paper's RC)
    mlp      logits = W_2 gelu(W_1 u + b_1) + b_2                 H (D + 1) + V (H + 1)
    mlp2     logits = W_3 gelu(W_2 gelu(W_1 u + b_1) + b_2) + b_3  H (D + 1) + H (H + 1) + V (H + 1)
    mlp3     three GELU layers of width H                         H (D + 1) + 2 H (H + 1) + V (H + 1)
    glu      logits = W_2 (silu(W_g u + b_g) * (W_u u + b_u)) + b_2   2 H (D + 1) + V (H + 1)   (SwiGLU)

u (width D) is what the head reads, `head_input` of the reservoir LM config: the normalised state r
(D = N), or r beside the current character's one-hot (D = N + V) or its fixed random embedding
(D = N + d). Every head here reads u alone, so a model using one obeys the reservoir frontier's rules
(reslm.models.budget); `head_params` gives the exact trainable count and `widest_hidden` the largest H
that fits a budget. `rank` r > 0 (rc: `--head-rank`) puts a bias-free trainable Linear(D, r) before an
mlp, mlp2, mlp3 or glu head, which then reads r inputs instead of D: r D more parameters, and each of
the head's H (D + 1) first-layer terms becomes H (r + 1), so a large reservoir fits a wider hidden layer
(LowRankHead; r = 0 is the plain head). Initialisation is torch's default for nn.Linear, drawn from the model's head seed.
`dropout` (p) drops hidden units while training (after each hidden activation; none for linear), and
`input_dropout` drops the head's inputs u (the state's channels) while training: regularisers of the
head, parameter-free, off at evaluation.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from reslm.core.errors import ReslmError

HEADS = ("linear", "mlp", "mlp2", "mlp3", "glu")
DEPTH = {"mlp": 1, "mlp2": 2, "mlp3": 3}   # GELU layers of each MLP head


class MLPHead(nn.Module):
    """u (B, D) -> logits (B, V) through `depth` (1-3) GELU hidden layers of width H: fc, fc2, fc3."""

    def __init__(self, in_features: int, hidden: int, vocab_size: int, dropout: float = 0.0, depth: int = 1,
                 input_dropout: float = 0.0):
        super().__init__()
        self.dropout, self.input_dropout = dropout, input_dropout
        self.fc = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, hidden) if depth >= 2 else None
        self.fc3 = nn.Linear(hidden, hidden) if depth >= 3 else None
        self.out = nn.Linear(hidden, vocab_size)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        h = F.dropout(u, self.input_dropout, self.training) if self.input_dropout else u
        for fc in (self.fc, self.fc2, self.fc3):
            if fc is not None:
                h = F.dropout(F.gelu(fc(h)), self.dropout, self.training)
        return self.out(h)


class GLUHead(nn.Module):
    """u (B, D) -> logits (B, V) through a SwiGLU hidden layer of width H (gate and value in one matmul)."""

    def __init__(self, in_features: int, hidden: int, vocab_size: int, dropout: float = 0.0,
                 input_dropout: float = 0.0):
        super().__init__()
        self.hidden, self.dropout, self.input_dropout = hidden, dropout, input_dropout
        self.fc = nn.Linear(in_features, 2 * hidden)   # rows: [gate; value]
        self.out = nn.Linear(hidden, vocab_size)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        u = F.dropout(u, self.input_dropout, self.training) if self.input_dropout else u
        gate, value = self.fc(u).split(self.hidden, dim=-1)
        return self.out(F.dropout(F.silu(gate) * value, self.dropout, self.training))


class LowRankHead(nn.Module):
    """u (B, D) -> logits (B, V): a bias-free Linear(D, r) (`down`), then the head `inner` on the r channels."""

    def __init__(self, in_features: int, rank: int, inner_fn, input_dropout: float = 0.0):
        super().__init__()
        self.input_dropout = input_dropout
        self.down = nn.Linear(in_features, rank, bias=False)
        self.inner = inner_fn(rank)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        u = F.dropout(u, self.input_dropout, self.training) if self.input_dropout else u
        return self.inner(self.down(u))


def make_readout(kind: str, in_features: int, hidden: int, vocab_size: int, dropout: float = 0.0,
                 input_dropout: float = 0.0, rank: int = 0) -> nn.Module:
    """The head `kind` (HEADS) from D = in_features inputs to V logits, hidden width H (mlp, mlp2, mlp3,
    glu), dropout p on its hidden units and input_dropout on its inputs while training; rank r > 0
    reads the D inputs through a trainable Linear(D, r) first (LowRankHead, not for linear)."""
    if kind == "linear" and not rank:
        return nn.Linear(in_features, vocab_size)
    if kind not in HEADS:
        raise ReslmError(f"head must be one of {', '.join(HEADS)}, got {kind!r}")
    if rank:
        if kind == "linear" or not 0 < rank < in_features:
            raise ReslmError(f"head rank must be in [1, {in_features}) (the head's input width) and the head not "
                             f"linear, got rank {rank} for a {kind} head")
        return LowRankHead(in_features, rank, lambda r: make_readout(kind, r, hidden, vocab_size, dropout),
                           input_dropout)
    if kind == "glu":
        return GLUHead(in_features, hidden, vocab_size, dropout, input_dropout)
    return MLPHead(in_features, hidden, vocab_size, dropout, depth=DEPTH[kind], input_dropout=input_dropout)


def head_params(kind: str, in_features: int, hidden: int, vocab_size: int, rank: int = 0) -> int:
    """Trainable parameters of make_readout(kind, in_features, hidden, vocab_size, rank=rank), by formula."""
    if rank:
        return rank * in_features + head_params(kind, rank, hidden, vocab_size)
    D, H, V = in_features, hidden, vocab_size
    if kind == "linear":
        return V * (D + 1)
    return (2 if kind == "glu" else 1) * H * (D + 1) + (DEPTH.get(kind, 1) - 1) * H * (H + 1) + V * (H + 1)


def widest_hidden(kind: str, in_features: int, vocab_size: int, budget: int, rank: int = 0) -> int:
    """The largest H whose head (of rank `rank`, 0 = full) fits `budget` trainable parameters (0 when none does)."""
    if rank:
        return widest_hidden(kind, rank, vocab_size, budget - rank * in_features) if budget > rank * in_features else 0
    per = (2 if kind == "glu" else 1) * (in_features + 1) + vocab_size
    h = max(0, (budget - vocab_size) // per)           # exact for mlp and glu; an upper bound for mlp2, mlp3
    while h and head_params(kind, in_features, h, vocab_size) > budget:
        h -= 1
    return h


__all__ = ["HEADS", "MLPHead", "GLUHead", "LowRankHead", "make_readout", "head_params", "widest_hidden"]
