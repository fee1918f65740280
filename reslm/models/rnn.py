"""A fully trainable recurrent character model: the reservoir frontier's ceiling (docs/frontier.md).

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

Context modes (`context_mode`): "window" (above: one target per window, read from a zero state) and
"stream", truncated backpropagation through time as char-rnn and AWD-LSTM train: each training shard
is cut into K = batch_size / context pieces read side by side, a step reads the next `context`
characters of every piece with a loss at every position (targets (K, T), logits (K, T, V)), and the
state is carried (detached) from one step to the next (`carry`), from zero at each piece's start. A
stream-mode run is scored both ways: the window CE (each test character from its 32 preceding
characters and a zero state, the paper's metric) and `stream_loss`, the state carried through the
test text.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from reslm.core.errors import ReslmError
from reslm.models.base import WindowFeatures, check_positive, next_token_loss

CELLS = {"gru": nn.GRU, "lstm": nn.LSTM}
CONTEXT_MODES = ("window", "stream")
STREAM_PIECES = 64      # stream_loss: the text is scored in this many pieces side by side ...
STREAM_WARMUP = 1024    # ... each after the state has read the characters before it (at most this many)


@dataclass
class RNNConfig:
    vocab_size: int = 59
    cell: str = "gru"               # gru | lstm
    embed_dim: int = 32             # e: trained embedding width
    hidden: int = 200               # H: recurrent state width
    context: int = 32               # characters per window, read from a zero state (stream mode: per BPTT chunk)
    context_mode: str = "window"    # window (one target per window) | stream (truncated BPTT, state carried)
    seed: int = 0                   # initial weights are a function of this seed only

    @property
    def all_positions(self) -> str | None:
        """How training reads the text (reslm.train.batches): "streams" (stream mode: pieces side by side,
        every position a target), or None (window: one target per window)."""
        return "streams" if self.context_mode == "stream" else None

    def validate(self) -> "RNNConfig":
        if self.cell not in CELLS:
            raise ReslmError(f"cell must be one of {', '.join(CELLS)}, got {self.cell!r}")
        if self.context_mode not in CONTEXT_MODES:
            raise ReslmError(f"context_mode must be one of {', '.join(CONTEXT_MODES)}, got {self.context_mode!r}")
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

    def __init__(self, cfg: RNNConfig | None = None):
        super().__init__()
        cfg = (cfg or RNNConfig()).validate()
        self.config = cfg
        self.all_positions = cfg.all_positions   # how training reads the text (reslm.train.batches)
        self.stateful = cfg.context_mode == "stream"   # generation carries the state (window: re-reads it)
        self.carry = None                        # stream-mode training: the state after the last chunk
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
        if self.all_positions and targets is not None and targets.dim() == 2:   # a stream-mode training chunk
            out, state = self.rnn(self.embed(x), self.carry)    # (K, T, H), from the carried state
            self.carry = _detach(state)
            logits = self.head(out)                              # (K, T, V): every position
            return logits, next_token_loss(logits, targets)
        out, _ = self.rnn(self.embed(x))                 # (B, T, H), from h_0 = 0
        logits = self.head(out[:, -1:])                  # (B, 1, V): the next character only
        return logits, next_token_loss(logits, targets)

    def reset_carry(self) -> None:
        """Forget the carried state: the next training chunk starts from zero (a piece's start)."""
        self.carry = None

    @torch.no_grad()
    def stream_loss(self, tokens: torch.Tensor) -> tuple[float, int]:
        """(mean CE in nats, predictions) of every token of `tokens` after the first, with the state
        carried through the text: it is cut into STREAM_PIECES pieces read side by side, each after
        the state has read (no loss) up to STREAM_WARMUP characters before it, so piece 0 starts from
        the zero state at the text's start, as one pass through it would."""
        n = tokens.numel() - 1
        P = max(1, min(STREAM_PIECES, n // max(1, STREAM_WARMUP)))
        bounds = [n * i // P for i in range(P + 1)]
        was = self.training
        self.eval()
        try:
            state = None
            W = min(STREAM_WARMUP, bounds[1]) if P > 1 else 0
            if W:   # warm-up rows: the W characters before each piece (piece 0: none, zeros masked out)
                starts = torch.tensor([max(0, b - W) for b in bounds[:-1]], device=tokens.device)
                warm = tokens[starts[:, None] + torch.arange(W, device=tokens.device)]
                _, state = self.rnn(self.embed(warm))
                state = _zero_row0(state)   # piece 0 starts from zero
            L = max(b - a for a, b in zip(bounds, bounds[1:]))
            total, count = 0.0, 0
            for t0 in range(0, L, 4096):   # time blocks, every piece advancing together
                rows = [(a + t0, min(b, a + t0 + 4096)) for a, b in zip(bounds, bounds[1:])]
                width = max(e - s for s, e in rows)
                if width <= 0:
                    break
                x = torch.stack([_pad(tokens[s:e], width) for s, e in rows])
                y = torch.stack([_pad(tokens[s + 1:e + 1], width, -100) for s, e in rows])
                out, state = self.rnn(self.embed(x), state)
                logits = self.head(out).float()
                total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                         ignore_index=-100, reduction="sum").item()
                count += int((y != -100).sum())
        finally:
            self.train(was)
        return total / max(count, 1), count

    # generation (stream mode): the state carried from token to token (reslm.generate)
    max_positions = None

    def init_state(self, batch: int, device=None):
        return None

    def step(self, idx_t: torch.Tensor, state):
        out, state = self.rnn(self.embed(idx_t[:, None]), state)
        return self.head(out[:, 0]), state

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        return self.forward_features(idx, targets)


def _detach(state):
    return tuple(t.detach() for t in state) if isinstance(state, tuple) else state.detach()


def _zero_row0(state):
    """The warm-up state with row 0 (piece 0, which starts at the text's start) set to zero."""
    def zero0(t):
        t = t.clone()
        t[:, 0] = 0
        return t
    return tuple(zero0(t) for t in state) if isinstance(state, tuple) else zero0(state)


def _pad(t: torch.Tensor, width: int, value: int = 0) -> torch.Tensor:
    """t (n,) padded with `value` to (width,); padded positions are never scored (ignore_index)."""
    return F.pad(t, (0, width - t.numel()), value=value)
