"""Training: an exponential moving average (EMA) of the trainable weights, `--ema DECAY`.

After optimizer step t (1-based) every trainable parameter's shadow moves towards it:

    shadow <- d_t shadow + (1 - d_t) p,     d_t = min(decay, (1 + t) / (10 + t))

The warm-up of d_t (timm's ModelEmaV2 and many others) keeps the shadow from clinging to the random
initial weights for the first ~1/(1 - decay) steps. The shadow starts as the initial weights; buffers
(fixed reservoirs, embeddings) are never averaged, they do not change.

Training evaluates with the shadow weights swapped in (`applied`), and a checkpoint's "model" holds
the shadow weights (what eval, generate and the summary read) while "raw" holds the weights the
optimizer is training, so a resumed run continues both exactly.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn as nn

from reslm.core.errors import ReslmError


class EMA:
    """The shadow of `model`'s trainable parameters (see the module doc)."""

    def __init__(self, model: nn.Module, decay: float):
        if not 0.0 < decay < 1.0:
            raise ReslmError(f"ema decay must be in (0, 1), got {decay}")
        self.decay = decay
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.shadow = [p.detach().clone() for p in self.params]

    def update(self, step: int) -> None:
        """Move the shadow after optimizer step `step` (1-based)."""
        d = min(self.decay, (1 + step) / (10 + step))
        with torch.no_grad():
            torch._foreach_lerp_(self.shadow, [p.detach() for p in self.params], 1.0 - d)

    @contextlib.contextmanager
    def applied(self):
        """Inside: the model's trainable parameters hold the shadow; restored (bitwise) on exit."""
        saved = [p.detach().clone() for p in self.params]
        with torch.no_grad():
            torch._foreach_copy_([p.data for p in self.params], self.shadow)
        try:
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_([p.data for p in self.params], saved)

    def weights(self, model: nn.Module) -> dict:
        """model.state_dict() with the shadow in place of the trainable parameters."""
        sd = model.state_dict()
        return {**sd, **{n: s.clone() for n, s in zip(self.names, self.shadow)}}

    def load(self, weights: dict) -> None:
        """Take the shadow from a state dict written by `weights`."""
        with torch.no_grad():
            for n, s in zip(self.names, self.shadow):
                s.copy_(weights[n])


def checkpoint_weights(model: nn.Module, ema: EMA | None) -> dict:
    """The weights part of a checkpoint: {"model": ...} or, with an EMA, the shadow as "model" and the
    trained weights as "raw"."""
    if ema is None:
        return dict(model=model.state_dict())
    return dict(model=ema.weights(model), raw=model.state_dict())


__all__ = ["EMA", "checkpoint_weights"]
