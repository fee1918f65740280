"""The contract every language model in reslm follows, and the small helpers they share.

Every model maps a window of token ids to next-token logits:

    forward(idx, targets=None) -> (logits, loss)      idx (B, T) long -> logits (B, V); loss is a scalar or None

Training does not call `forward` directly. The paper precomputes reservoir responses once per shard
and reuses them across epochs, so a model first turns a whole shard into *features*, and training
draws batches from those:

    features(tokens, *, dtype=torch.float32, progress=False) -> Features
                                          once per shard (no grad: fixed reservoir work happens here;
                                          dtype is the reservoir's compute/storage dtype)
    forward_features(x, targets) -> (logits, loss)     the trainable part only

For a transformer the features are the raw windows; for a reservoir model they are reservoir
states, so `forward_features` is just the readout. `forward(idx)` is always
`forward_features(<features of idx>)`, which is what the tests check.

Recurrent models also provide `init_state(batch)` and `step(idx_t, state) -> (logits_t, state)`
so that generation carries the state instead of re-running the window (see generate.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Protocol

import torch
import torch.nn as nn
import torch.nn.functional as F

from reslm.errors import ReslmError


class Features(Protocol):
    """A shard turned into model inputs: `len` samples, `targets[i]` is sample i's next token."""

    targets: torch.Tensor  # (M,) long

    def __len__(self) -> int: ...

    def batch(self, index: torch.Tensor) -> torch.Tensor:
        """Model inputs for the samples `index` (a 1-D long tensor)."""
        ...


@dataclass
class TensorFeatures:
    """Precomputed per-sample inputs (e.g. reservoir states (M, N)) and their targets (M,)."""

    inputs: torch.Tensor
    targets: torch.Tensor

    def __len__(self) -> int:
        return self.targets.numel()

    def batch(self, index: torch.Tensor) -> torch.Tensor:
        return self.inputs.index_select(0, index)


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
    """Mean cross-entropy in nats (float32 even under autocast), or None without targets."""
    if targets is None:
        return None
    return F.cross_entropy(logits.float(), targets)


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


def build_config(cfg_cls, overrides: dict, family: str):
    """cfg_cls(**overrides), validated; ReslmError naming any field the family does not have."""
    unknown = sorted(set(overrides) - {f.name for f in fields(cfg_cls)})
    if unknown:
        raise ReslmError(f"unknown {family} option(s): {', '.join(unknown)}")
    cfg = cfg_cls(**overrides)
    cfg.validate()
    return cfg


def check_positive(**values):
    """Raise ReslmError for the first non-positive value (used by config validation)."""

    for name, v in values.items():
        if not (isinstance(v, (int, float)) and v > 0 and math.isfinite(v)):
            raise ReslmError(f"{name} must be > 0, got {v!r}")
