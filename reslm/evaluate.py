"""Evaluation: small pure functions that return floats (nats; bits = nats / ln 2)."""
from __future__ import annotations

import math

import torch

from reslm.device import autocast

LN2 = math.log(2)


def bits(nats: float) -> float:
    """Nats per token -> bits per token (bits per character for a character model)."""
    return nats / LN2


@torch.no_grad()
def cross_entropy(model, features: list, *, batch_size: int, device: torch.device,
                  precision: str = "fp32") -> float:
    """Mean next-token cross-entropy (nats) over every sample of `features` (a list of Features)."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for feats in features:
        n = len(feats)
        for i0 in range(0, n, batch_size):
            index = torch.arange(i0, min(n, i0 + batch_size), device=device)
            y = feats.targets[index]
            with autocast(precision, device):
                logits, _ = model.forward_features(feats.batch(index), None)
            total += torch.nn.functional.cross_entropy(logits.float(), y, reduction="sum").item()
            count += y.numel()
    model.train(was_training)
    return total / max(count, 1)
