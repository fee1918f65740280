"""Tokens -> reservoir states: the multi-timescale leaky ESN, one leak rate per unit.

    h_t = tanh(W s_{t-1} + W_in u_t + b)                the ESN of esn.py, unleaked
    s_t = (1 - a) * s_{t-1} + a * h_t                   a (N,), elementwise (torch.lerp)

The leak rates a_i are drawn log-uniform in [a_min, a_max] from generator(seed, 3), a key the ESN
does not use, so W, W_in and b are exactly the ESN's for the same seed (and the same size, radius,
...). A unit with leak a keeps a fraction (1 - a)^k of its state after k steps: its memory is about
1/a characters, so the defaults 0.01..1 span single characters, words and lines. With
a_min = a_max = 1 this is the ESN itself (torch.lerp returns h exactly at a = 1).

Built on ESN: each step is one ESN step at leak 1 (its weights, precision, kernels and gradient
rule) followed by the per-unit leak, so the ESN's `leak_rate` stays 1 here (a_min, a_max replace it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from reslm.core.errors import ReslmError
from reslm.reservoir.esn import ESN, ESNConfig
from reslm.reservoir.seeding import generator

LEAK_KEY = 3   # seeding key of the leak rates (the ESN uses 0, 1, 2)


@dataclass
class LeakyESNConfig(ESNConfig):
    a_min: float = 0.01             # smallest per-unit leak rate (memory ~ 1/a_min steps)
    a_max: float = 1.0              # largest per-unit leak rate; rates are log-uniform in [a_min, a_max]

    def validate(self):
        super().validate()
        if not 0 < self.a_min <= self.a_max <= 1:
            raise ReslmError(f"leaky reservoir needs 0 < a_min <= a_max <= 1, got a_min={self.a_min}, "
                             f"a_max={self.a_max}")
        if self.leak_rate != 1:
            raise ReslmError("the leaky reservoir draws one leak rate per unit: set a_min and a_max "
                             f"(reservoir options), not leak_rate ({self.leak_rate})")


class LeakyESN(ESN):
    """ESN with per-unit leak rates. forward(u (B,T,d), s0 (B,N)) -> (states (B,T,N), s_T); step(u_t, s)."""

    def __init__(self, cfg: LeakyESNConfig):
        super().__init__(cfg)                      # validates cfg, draws W, W_in, b as the ESN does
        N = cfg.size
        if torch.empty(0).is_meta:
            a = torch.empty(N)
        else:
            lo, hi = math.log(cfg.a_min), math.log(cfg.a_max)
            a = torch.exp(lo + (hi - lo) * torch.rand(N, generator=generator(cfg.seed, LEAK_KEY),
                                                      dtype=torch.float64))
        self.register_buffer("leak", a.float())    # (N,)

    def forward(self, u: torch.Tensor, s0: torch.Tensor | None = None):
        """T ESN steps at leak 1, each followed by the per-unit leak. Returns (states (B,T,N), s_T)."""
        B, T, _ = u.shape
        s = s0
        out = []
        for t in range(T):
            h = super().forward(u[:, t:t + 1], s)[1]                 # tanh(W s + W_in u_t + b), (B, N)
            a = self.leak.to(h.dtype)
            s = a * h if s is None else torch.lerp(s.to(h.dtype), h, a)
            out.append(s)
        if not out:
            return super().forward(u, s0)                            # T = 0: the ESN's empty answer
        return torch.stack(out, 1), s
