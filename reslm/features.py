"""Features and their loss: what a model's fixed part computes once and its trained part reads.

A model turns a token stream into *features* once (reservoir states, or windows; reslm.models.base
describes the contract), and training, evaluation and the closed-form readouts draw batches from
them. These helpers stand below the models and the batch samplers (reslm.train.batches) alike, so neither
imports the other for them; reslm.models.base re-exports them.

`estimate_loss` is the one cross-entropy estimator: training's evaluations and `reslm eval` both use it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from reslm.core.device import autocast


@dataclass
class TensorFeatures:
    """Precomputed per-sample inputs (e.g. reservoir states (M, N)) and their targets (M,).

    With `chars` (M,) and `table` (V, k), a batch is each sample's input beside the table row of its
    character, [inputs[i], table[chars[i]]] (M, N + k): a reservoir head that also reads the current
    character's one-hot (table = I) or fixed embedding, without storing (M, N + k)."""

    inputs: torch.Tensor
    targets: torch.Tensor
    chars: torch.Tensor | None = None
    table: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.targets.numel()

    def batch(self, index: torch.Tensor) -> torch.Tensor:
        x = self.inputs.index_select(0, index)
        if self.chars is None:
            return x
        return torch.cat([x, self.table.to(x.dtype).index_select(0, self.chars.index_select(0, index))], dim=1)



@dataclass
class ChunkFeatures:
    """All-position training samples over a token stream (S,): sample i is a chunk of `context` tokens
    and its targets are the same chunk shifted by one, (M, context) each, so every position of the
    chunk is a target (the tokens after each of its prefixes). Views of the stream, no copies.

    streams = 0: chunks starting at `phase` (0 <= phase < stride), every `stride` tokens (default: the
    context, so they do not overlap), tokens[phase + i stride : phase + i stride + T]; the sampler
    shuffles them (a causal transformer: each chunk is read alone).
    streams = K: the stream cut into K equal pieces read side by side, chunk j of piece s being sample
    j K + s, in order (`sequential`): consecutive batches of K samples continue each other, so a
    recurrent model can carry its state from one chunk of a piece to the next (truncated BPTT)."""

    tokens: torch.Tensor  # (S,) long
    context: int
    streams: int = 0
    phase: int = 0
    stride: int = 0      # streams = 0: tokens from one chunk's start to the next (0: the context)

    def __post_init__(self):
        T, K = self.context, self.streams
        if K:
            L = (self.tokens.numel() - 1) // K // T * T            # tokens per piece, whole chunks
            n = K * L
            piece = lambda t: t[:n].view(K, L // T, T).transpose(0, 1).reshape(-1, T)  # noqa: E731
            self.inputs, self.targets = piece(self.tokens), piece(self.tokens[1:])
        else:
            step = self.stride or T
            M, a = self.count(self.tokens.numel(), T, stride=step), self.phase
            self.inputs = self.tokens[a:].unfold(0, T, step)[:M]
            self.targets = self.tokens[a + 1:].unfold(0, T, step)[:M]
        self.sequential = bool(K)

    @staticmethod
    def count(n_tokens: int, context: int, streams: int = 0, stride: int = 0) -> int:
        """Samples (chunks) in a stream of n_tokens, for every phase (< stride) of the chunk layout."""
        if streams:
            return streams * ((n_tokens - 1) // streams // context)
        return max(0, (n_tokens - context) // (stride or context))

    def __len__(self) -> int:
        return self.targets.shape[0]

    def batch(self, index: torch.Tensor) -> torch.Tensor:
        return self.inputs.index_select(0, index)  # (B, context)


def eval_batch_size(model, batch_size: int, device, precision: str = "fp32") -> int:
    """Samples per evaluation forward at `precision`: `batch_size`, capped on CPU at the model's
    `eval_batch_cap(precision)` where it has one (a model that runs every window through all its layers:
    smaller pieces keep its activations in cache). The loss is the same up to float rounding."""
    if torch.device(device).type != "cpu" or not hasattr(model, "eval_batch_cap"):
        return batch_size
    cap = model.eval_batch_cap(precision)
    return min(batch_size, cap) if cap else batch_size


@torch.no_grad()
def estimate_loss(model, batches, *, precision: str = "fp32") -> tuple[float, int]:
    """(mean cross-entropy in nats, number of predictions) of `model.forward_features` over an
    iterable of (x, targets) batches, in eval mode (the mode is restored afterwards)."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        for x, y in batches:
            with autocast(precision, y.device):
                logits, _ = model.forward_features(x, None)
            total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1),
                                     reduction="sum").item()
            count += y.numel()
    finally:
        model.train(was_training)
    return total / max(count, 1), count


def feature_batches(feats, batch_size: int):
    """(x, targets) batches over every sample of a Features, in order."""
    n = len(feats)
    device = feats.targets.device
    for i0 in range(0, n, batch_size):
        index = torch.arange(i0, min(n, i0 + batch_size), device=device)
        yield feats.batch(index), feats.targets[index]
