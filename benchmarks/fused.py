"""The transformer's compiled-path experiment (docs/transformer-speed.md), beside the benchmark that times
it (tf_speed.py imports it from this folder): CharTransformer's
forward written for torch.compile, with dropout masks from a hash of the element index instead of
torch's generator, and optionally the pointwise attention. Training does not use it (compiled, it
trained slower than the eager path on the CPUs measured); tf_speed.py times it and tests/benchmarks/test_fused.py
keeps it equal to the plain path, for the next attempt."""
from __future__ import annotations

import math

import torch

from reslm.core.errors import ReslmError
from reslm.models.transformer import CharTransformer

DROPOUT_SITES = 4   # dropout calls per layer (attention weights, attention out, ff hidden, ff out)


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash of int32 values (xorshift-multiply rounds; products wrap modulo 2^32,
    the right shifts are made logical by masking); elementwise, so that inductor fuses it into the
    kernel that uses it, 16 lanes per AVX-512 vector (an int64 version stored its masks far slower)."""
    x = x ^ ((x >> 16) & 0xFFFF)
    x = x * 0x7FEB352D
    x = x ^ ((x >> 15) & 0x1FFFF)
    x = x * 0x2C1B3C6D
    return x ^ ((x >> 16) & 0xFFFF)


def hashed_drop_mask(shape: torch.Size, p: float, seed: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Bool tensor, True where an element is DROPPED (probability round(p * 2^32) / 2^32): a hash of
    the element's index under the two 32-bit values of `seed` (int32 tensor of shape (2,)), instead
    of a draw from torch's generator. Compiled, it costs a few integer vector ops inside the kernel
    that uses the mask (no random-number pass); eagerly it is slower than `dropout_mask`, so only the
    compiled path uses it. The seed picks an odd multiplier and an xor of the index, so masks under
    different seeds are not shifted copies of each other."""
    n = math.prod(shape)
    if n >= 2**31:
        raise ReslmError(f"hashed dropout numbers elements in int32; a tensor of {n} elements is too large")
    i = torch.arange(n, dtype=torch.int32, device=device).view(shape)
    h = mix32((i ^ seed[1]) * (seed[0] | 1))
    return h < -2**31 + round(p * 2**32)


class HashedDropout:
    """dropout(x, p, training) with masks from `hashed_drop_mask`, each call taking the next seed
    pair of `seeds` ((n, 2) int32, drawn from torch's generator by the caller, so that the same
    torch seed gives the same masks); like `dropout`, no 1/(1-p) rescaling."""

    def __init__(self, seeds: torch.Tensor | None):
        self.seeds, self.used = seeds, 0

    def __call__(self, x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
        if not training or p == 0.0:
            return x
        seed = self.seeds[self.used]
        self.used += 1
        return torch.where(hashed_drop_mask(x.shape, p, seed, x.device), 0.0, x)


def fused_forward(model: CharTransformer, x: torch.Tensor, targets: torch.Tensor | None = None,
                  seeds: torch.Tensor | None = None, pointwise: bool = True):
    """model.forward_features written for torch.compile: dropout masks from `HashedDropout(seeds)`
    (seeds: (n_layers * DROPOUT_SITES, 2) int32, from `draw_seeds`; None in eval mode or without
    dropout) and, by default, the pointwise attention. In eval mode it computes the logits of
    `forward_features` (up to float rounding); in train mode its dropout masks differ from
    forward_features' (another generator)."""
    if model.training and model.config.dropout > 0 and seeds is None:
        raise ReslmError("fused_forward in train mode needs dropout seeds (draw_seeds)")
    return model._forward(x, targets, HashedDropout(seeds), pointwise)


def draw_seeds(model: CharTransformer, device: torch.device | str = "cpu") -> torch.Tensor:
    """The dropout seeds of one fused_forward call, from torch's global generator (so that
    torch.manual_seed decides the masks, as it does for forward_features)."""
    n = len(model.layers) * DROPOUT_SITES
    return torch.randint(-2**31, 2**31, (n, 2), dtype=torch.int64).to(device, torch.int32)


__all__ = ["DROPOUT_SITES", "mix32", "hashed_drop_mask", "HashedDropout", "fused_forward", "draw_seeds"]
