"""The model contract every family follows, and the small helpers they share.

Every model maps token ids to next-token logits, always as (B, T, V) (nanoGPT's habit):

    forward(idx (B,T), targets=None) -> (logits (B,T',V), loss)
        token models (laerc, gpt): T' = T, every position predicts the next token, targets (B,T);
        character models (rc, aerc, tf): T' = 1, the window predicts the token after it, targets (B,)
        or (B,1). loss is the mean cross-entropy in nats, or None without targets.

Training does not call `forward` on raw windows for every model. The paper precomputes reservoir
responses once per shard and reuses them across epochs, so a model turns a token stream into
*features* once, and training draws batches from those:

    features(tokens (S,), *, position, dtype, progress) -> Features   no grad: the fixed reservoir work
                                                        (position: where tokens[0] sits in the dataset)
    forward_features(x, targets) -> (logits, loss)                  the trainable part only

For a reservoir model the features are the states and `forward_features` is the readout; for a
window model (tf) they are the windows themselves; token models train on windows directly, so their
`forward_features` is `forward`. `forward(idx)` is always `forward_features(<features of idx>)`.

Stateful models (`stateful` True) also provide `init_state(batch, device)` and
`step(idx_t (B,), state) -> (logits (B,V), state)`, so generation carries the state instead of
re-reading the window (generate.py); `max_positions` (None = unlimited) says how many steps a state
can take from empty.

`estimate_loss` is the one cross-entropy estimator: training's evaluations and `reslm eval` both use it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Protocol

import torch
import torch.nn as nn
import torch.nn.functional as F

from reslm.features import TensorFeatures, estimate_loss, feature_batches  # noqa: F401 (re-exported)
from reslm.core.errors import ReslmError


class Features(Protocol):
    """A shard turned into model inputs: `len` samples, `targets[i]` is sample i's next token."""

    targets: torch.Tensor  # (M,) long

    def __len__(self) -> int: ...

    def batch(self, index: torch.Tensor) -> torch.Tensor:
        """Model inputs for the samples `index` (a 1-D long tensor)."""
        ...


@dataclass
class WindowFeatures:
    """Sliding windows over a token stream, built lazily per batch (no (M, T) copy of the shard).

    Sample i is the window tokens[i : i + context] and its target tokens[i + context].
    """

    tokens: torch.Tensor  # (S,) long
    context: int

    def __post_init__(self):
        self.targets = self.tokens[self.context:]

    def __len__(self) -> int:
        return self.targets.numel()

    def batch(self, index: torch.Tensor) -> torch.Tensor:
        offsets = torch.arange(self.context, device=index.device)
        return self.tokens[index[:, None] + offsets]  # (B, context)


def sample_count(n_tokens: int, context: int) -> int:
    """Samples in a stream of n_tokens: every position with `context` tokens before it."""
    return max(0, n_tokens - context)


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor | None) -> torch.Tensor | None:
    """Mean cross-entropy in nats of logits (B,T,V) against targets (B,T) (or (B,) when T = 1),
    in float32 even under autocast; None without targets."""
    if targets is None:
        return None
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def decay_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW parameter groups: decay on nn.Linear weight matrices; none on biases, LayerNorms,
    embeddings (also when tied to the output), positional tables and scalars."""
    decay_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear) and m.weight.requires_grad}
    decay, no_decay, seen = [], [], set()
    for p in model.parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if id(p) in decay_ids else no_decay).append(p)
    return [dict(params=decay, weight_decay=weight_decay), dict(params=no_decay, weight_decay=0.0)]


class TokenLM(nn.Module):
    """What the token-level models (laerc, gpt) share: they train on raw windows, every position
    predicting the next token, so their features are the ids and `forward_features` is `forward`."""

    stateful = True

    def forward_features(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        return self(idx, targets)


def count_params(module: nn.Module) -> tuple[int, int]:
    """(trainable, fixed): trainable = parameters with requires_grad (what the optimiser updates);
    fixed = frozen parameters plus buffers of floating dtype (fixed reservoir weights, embeddings)."""
    trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    fixed = sum(p.numel() for p in module.parameters() if not p.requires_grad)
    fixed += sum(b.numel() for b in module.buffers() if b.is_floating_point())
    return trainable, fixed


def config_dict(cfg) -> dict:
    """A dataclass config as a plain JSON-ready dict."""
    return {f.name: getattr(cfg, f.name) for f in fields(cfg)}


def check_positive(**values):
    """Raise ReslmError for the first non-positive value (used by config validation)."""

    for name, v in values.items():
        if not (isinstance(v, (int, float)) and v > 0 and math.isfinite(v)):
            raise ReslmError(f"{name} must be > 0, got {v!r}")
