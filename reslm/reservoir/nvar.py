"""Tokens -> reservoir states: the nonlinear vector autoregression (NVAR) of next-generation
reservoir computing (Gauthier et al. 2021, Nat. Commun. 12, 5564), no recurrence at all.

    lin_t  = [u_t, u_{t-1}, ..., u_{t-k+1}] * input_scaling          (k d,) the last k inputs
    quad_t = [lin_t[i] lin_t[j] for i <= j]                         (k d (k d + 1) / 2,) unique monomials
    state_t = [1, lin_t, quad_t]                                    N = 1 + k d + k d (k d + 1) / 2

Inputs before the first one (no s0) are zeros. The state carries its own history: its linear block
is the window of the last k inputs, so step(u_t, s) reads the window out of s, shifts it by one
input and recomputes the features, and forward(u, s0) continues from the window in s0. Both match
the reservoir contract (the state is what the readout sees). forward computes every step in parallel
(an unfold of the inputs over time). Quadratic monomials are ordered as torch.triu_indices(k d, k d).

NVAR draws no random numbers: `seed` is kept for the contract only. `size` must equal the feature
count (e.g. k = 2, d = 16: N = 561; k = 4: N = 2145); a different size is an error that names it.
Gauthier's stride s between delayed inputs is 1 here (a stride would need a longer history than the
state holds).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from reslm.core.errors import ReslmError
from reslm.reservoir.base import Reservoir, ReservoirConfig


def nvar_size(k: int, d: int) -> int:
    """Feature count 1 + k d + k d (k d + 1) / 2."""
    m = k * d
    return 1 + m + m * (m + 1) // 2


@dataclass
class NVARConfig(ReservoirConfig):
    size: int = 561                 # N: must equal 1 + k d + k d (k d + 1) / 2 (561 for k = 2, d = 16)
    input_dim: int = 16             # d, input vector size
    k: int = 2                      # number of delayed inputs u_t .. u_{t-k+1} in the linear part
    input_scaling: float = 1.0      # multiplies the inputs before the features (quadratics scale by its square)
    seed: int = 0                   # unused: NVAR draws nothing (kept for the reservoir contract)

    def validate(self):
        for name in ("size", "input_dim", "k"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ReslmError(f"nvar {name} must be an integer >= 1, got {v!r}")
        want = nvar_size(self.k, self.input_dim)
        if self.size != want:
            raise ReslmError(f"nvar with k={self.k} and input_dim={self.input_dim} has {want} features: "
                             f"set size to {want}, not {self.size}")
        if not self.input_scaling > 0:
            raise ReslmError(f"input_scaling must be > 0, got {self.input_scaling}")


class NVAR(Reservoir):
    """Polynomial features of the last k inputs. forward(u (B,T,d), s0 (B,N)) -> (states (B,T,N), s_T)."""

    pure = True   # forward(u, s0) depends on its arguments only (window states share prefixes)

    def __init__(self, cfg: NVARConfig):
        super().__init__(cfg)
        self.k = cfg.k
        m = cfg.k * cfg.input_dim
        # drawn on the CPU even under a `torch.device("meta")` context (meta's triu_indices takes seconds)
        self.register_buffer("pairs", torch.triu_indices(m, m, device="cpu"), persistent=False)  # (2, m (m+1) / 2)

    def init_state(self, batch: int, device=None, dtype=None) -> torch.Tensor:
        return torch.zeros(batch, self.size, device=device or self.pairs.device, dtype=dtype or torch.float32)

    def forward(self, u: torch.Tensor, s0: torch.Tensor | None = None):
        B, T, d = u.shape
        k, m = self.k, self.k * d
        grad = torch.is_grad_enabled() and (u.requires_grad or (s0 is not None and s0.requires_grad))
        with torch.set_grad_enabled(grad), torch.autocast(u.device.type, enabled=False):
            if T == 0:
                return u.new_zeros(B, 0, self.size), s0 if s0 is not None else self.init_state(B, u.device, u.dtype)
            x = u * self.config.input_scaling
            if s0 is None:
                past = x.new_zeros(B, k - 1, d)
            else:   # s0's linear block is [u_{-1}, ..., u_{-k}] (scaled); keep the newest k - 1, oldest first
                past = s0[:, 1:1 + m - d].to(x.dtype).reshape(B, k - 1, d).flip(1)
            seq = torch.cat([past, x], 1)                                  # (B, T + k - 1, d), oldest first
            lin = seq.unfold(1, k, 1).flip(-1).transpose(-1, -2).reshape(B, T, m)  # [u_t, ..., u_{t-k+1}]
            quad = lin[..., self.pairs[0]] * lin[..., self.pairs[1]]       # (B, T, m (m+1) / 2)
            states = torch.cat([lin.new_ones(B, T, 1), lin, quad], -1)     # (B, T, N)
        return states, states[:, -1]
