"""Benchmarks, reference models: the authors' approach re-implemented, for timing comparisons and
equivalence checks only (training code uses reslm's own models; only reslm.bench and its tests
import this module).

- `ReferenceTransformer` reproduces the authors' transformer in plain PyTorch: nn.Embedding + fixed
  sinusoidal encoding, `nn.TransformerEncoder(nn.TransformerEncoderLayer(d_model=16, nhead=h,
  dim_feedforward=d_h, batch_first=True), L)` (post-LN, ReLU, dropout 0.1) and a Linear head on the
  last position. It has exactly the parameters of `CharTransformer` (same names under `encoder.`), so
  `copy_weights(fast, ref)` makes both compute the same function; the tests use that to show that
  the fast model is the same architecture.
- `authors_window_states` / `authors_logits`: the authors' RC/AERC training step, which re-runs the
  reservoir over every sample's window in every batch and materialises AERC's attention matrix,
  applied to the fixed weights of a reslm reservoir model (same numbers as the model, see tests).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from reslm.models.aerc import AttentionReadout
from reslm.models.base import WindowFeatures, next_token_loss
from reslm.models.transformer import CharTransformer, TransformerConfig, sinusoidal_encoding


class ReferenceTransformer(nn.Module):
    """nn.TransformerEncoder baseline (authors' approach); initialised by torch's defaults (global RNG).
    forward(idx (B,T), targets (B,)) -> (logits (B,1,V): the last position only, loss)."""

    family = "tf-ref"

    def __init__(self, cfg: TransformerConfig | None = None):
        super().__init__()
        self.config = cfg = (cfg or TransformerConfig()).validate()
        d = cfg.embed_dim
        self.embed = nn.Embedding(cfg.vocab_size, d)
        self.register_buffer("pe", sinusoidal_encoding(cfg.context, d), persistent=False)
        layer = nn.TransformerEncoderLayer(d_model=d, nhead=cfg.n_heads, dim_feedforward=cfg.ff_dim,
                                           dropout=cfg.dropout, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, cfg.n_layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, cfg.vocab_size)

    def features(self, tokens: torch.Tensor) -> WindowFeatures:
        return WindowFeatures(tokens, self.config.context)

    def forward_features(self, x: torch.Tensor, targets: torch.Tensor | None = None):
        h = self.encoder(self.embed(x) + self.pe[: x.shape[1]])
        logits = self.head(h[:, -1:])                                   # (B, 1, V)
        flat = logits.reshape(-1, logits.shape[-1])
        return logits, next_token_loss(flat, None if targets is None else targets.reshape(-1))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        return self.forward_features(idx, targets)


def copy_weights(src: nn.Module, dst: nn.Module) -> nn.Module:
    """Load `src`'s weights into `dst`, between CharTransformer (`layers.i.*`) and
    ReferenceTransformer (`encoder.layers.i.*`) in either direction; returns dst."""
    def to_ref(k):
        return "encoder." + k if k.startswith("layers.") else k

    def to_fast(k):
        return k[len("encoder."):] if k.startswith("encoder.") else k

    rename = to_ref if isinstance(dst, ReferenceTransformer) else to_fast
    dst.load_state_dict({rename(k): v for k, v in src.state_dict().items()})
    return dst


@torch.no_grad()
def authors_window_states(model, windows: torch.Tensor) -> torch.Tensor:
    """The authors' per-batch reservoir: every sample's state recomputed from a zero state over its
    own window, one plain step at a time,
        s_t = (1 - a) s_{t-1} + a tanh(W_in x_t + W s_{t-1} + b),
    i.e. `context` products (B,N) x (N,N) per training batch. windows (B, T) -> s_T (B, N)."""
    esn = model.reservoir
    a = esn.config.leak_rate
    u = model.embed(windows)                                              # (B, T, d)
    s = torch.zeros(windows.shape[0], esn.size, device=u.device, dtype=u.dtype)
    for t in range(windows.shape[1]):
        pre = u[:, t] @ esn.W_in_T + s @ esn.W_T + esn.bias
        s = torch.tanh(pre) if a == 1 else (1 - a) * s + a * torch.tanh(pre)
    return s


def authors_logits(model, states: torch.Tensor) -> torch.Tensor:
    """The readout as the paper writes it: LayerNorm of the state (every step: the authors' model
    normalises inside its forward), then RC: W_out r + b; AERC: W_att = reshape(W_2 ReLU(W_1 r + b_1)
    + b_2, H x N) materialised per sample, r_o = W_att r, logits = W_out r_o + b_out.
    states (B, N) -> logits (B, V): the numbers of model.forward_features(model.normalize(states))."""
    x = F.layer_norm(states, (states.shape[-1],)) if model.config.state_norm else states
    head = model.head
    if isinstance(head, AttentionReadout):
        z = torch.relu(head.net1(x))
        W_att = head.net2(z).view(-1, head.hidden, head.size)                     # (B, H, N)
        r_o = (W_att @ x.unsqueeze(-1)).squeeze(-1)                               # (B, H)
        return head.out(r_o)
    return head(x)


__all__ = ["ReferenceTransformer", "copy_weights", "authors_window_states", "authors_logits", "CharTransformer"]
