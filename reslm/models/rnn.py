"""Stage 3, a fully trainable recurrent character model: the reservoir frontier's ceiling (issue 26).

The same task as the reservoir families and the transformer, the next character after a window of
`context` (= 32) characters, read from a zero state exactly like window mode and like the transformer:

    x_t    = E[c_t]                                 trained embedding (V, e)
    h_t    = cell(x_t, h_{t-1}),  h_0 = 0           torch's nn.GRU or nn.LSTM, one layer of width H
    logits = W_out h_T + b_out                      from the last position only

Everything is trained, so it is not a reservoir-family model (reslm.models.budget says so): it is the
trained network of equal size the reservoirs are read against. Trainable parameters:

    gru:   V e + 3 H (e + H + 2) + V (H + 1)
    lstm:  V e + 4 H (e + H + 2) + V (H + 1)

(torch keeps two bias vectors per gate). The features are the windows themselves (WindowFeatures),
so it trains in the same loop, on the same shard-cyclic schedule and batches as the transformer.
Initial weights are torch's defaults drawn from `seed` alone.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from reslm.core.errors import ReslmError
from reslm.models.base import WindowFeatures, check_positive, next_token_loss

CELLS = {"gru": nn.GRU, "lstm": nn.LSTM}


@dataclass
class RNNConfig:
    vocab_size: int = 59
    cell: str = "gru"               # gru | lstm
    embed_dim: int = 32             # e: trained embedding width
    hidden: int = 200               # H: recurrent state width
    context: int = 32               # characters per window, read from a zero state
    seed: int = 0                   # initial weights are a function of this seed only

    def validate(self) -> "RNNConfig":
        if self.cell not in CELLS:
            raise ReslmError(f"cell must be one of {', '.join(CELLS)}, got {self.cell!r}")
        check_positive(vocab_size=self.vocab_size, embed_dim=self.embed_dim, hidden=self.hidden,
                       context=self.context)
        return self


def rnn_params(cell: str, vocab_size: int, embed_dim: int, hidden: int) -> int:
    """Trainable parameters of CharRNN, by formula (see the module doc)."""
    gates = 3 if cell == "gru" else 4
    return vocab_size * embed_dim + gates * hidden * (embed_dim + hidden + 2) + vocab_size * (hidden + 1)


class CharRNN(nn.Module):
    """Next-character GRU/LSTM over a window of `context` ids (see the module docstring)."""

    family = "rnn"
    stateful = False   # every prediction reads its window from a zero state, as in training

    def __init__(self, cfg: RNNConfig | None = None):
        super().__init__()
        cfg = (cfg or RNNConfig()).validate()
        self.config = cfg
        with torch.random.fork_rng(devices=[]):   # the weights depend on cfg.seed, not the global RNG
            torch.manual_seed(cfg.seed)
            self.embed = nn.Embedding(cfg.vocab_size, cfg.embed_dim)
            self.rnn = CELLS[cfg.cell](cfg.embed_dim, cfg.hidden, batch_first=True)
            self.head = nn.Linear(cfg.hidden, cfg.vocab_size)

    def features(self, tokens: torch.Tensor, *, position=None, dtype=None, progress: bool = False) -> WindowFeatures:
        """Windows over the stream (built per batch); position/dtype/progress are for reservoir models."""
        return WindowFeatures(tokens, self.config.context)

    def forward_features(self, x: torch.Tensor, targets: torch.Tensor | None = None):
        if x.shape[1] > self.config.context:
            raise ReslmError(f"window of {x.shape[1]} tokens is longer than the context ({self.config.context})")
        out, _ = self.rnn(self.embed(x))                 # (B, T, H), from h_0 = 0
        logits = self.head(out[:, -1:])                  # (B, 1, V): the next character only
        return logits, next_token_loss(logits, targets)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        return self.forward_features(idx, targets)
