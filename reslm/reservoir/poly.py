"""Tokens -> reservoir states: an ESN's state beside fixed quadratic monomials of it, the polynomial
features of next-generation RC (nvar.py) taken of a reservoir's state instead of delayed inputs.

    x_t     = ESN(x_{t-1}, u_t)                      (n,)  an ESN of n = size - products units
    q_t     = [x_t[i_p] x_t[j_p]  for p = 1..P]      (P,)  P = products fixed pairs, i_p <= j_p
    state_t = [x_t, q_t]                             (N = n + P,), what the readout sees

The ESN is esn.py's with the config's radius, leak, densities, bias, precision and kernel, seeded with
the seed itself: a poly reservoir of size n + P holds exactly the ESN of size n with that seed. The
pairs are drawn once, without replacement, uniformly from the n (n + 1) / 2 pairs i <= j (squares
included), from generator(seed, PAIRS_KEY), and kept in torch.triu_indices order; products = n (n + 1)
/ 2 takes every pair. products = 0 (the default) is half the size, rounded down.

The state carries the ESN's: forward(u, s0) continues from s0's first n values, and step(u_t, s) is
forward over one step. The monomials add no memory, only a fixed nonlinear read of the state (a
quadratic readout of the ESN, half of it computed by the substrate): with a fixed random projection
(the models' readout_dim) the head sees N features at the cost of its input width.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from reslm.core.errors import ReslmError
from reslm.reservoir.base import Reservoir
from reslm.reservoir.esn import ESN, ESNConfig
from reslm.reservoir.seeding import generator

PAIRS_KEY = 9   # the pairs' generator: a key no other matrix of a reservoir uses


@dataclass
class PolyESNConfig(ESNConfig):
    products: int = 0               # P quadratic monomials x_i x_j of the ESN's state; 0 = size // 2

    def validate(self):
        if not isinstance(self.products, int) or isinstance(self.products, bool) or self.products < 0:
            raise ReslmError(f"poly reservoir: products must be an integer >= 0, got {self.products!r}")
        n, P = self.units(), self.pair_count()
        if n < 1 or P < 1:
            raise ReslmError(f"poly reservoir: size {self.size} leaves {n} ESN units for {P} products; "
                             "both need at least 1")
        if P > n * (n + 1) // 2:
            raise ReslmError(f"poly reservoir: {n} units have {n * (n + 1) // 2} pairs, fewer than products={P}")
        self.esn_config().validate()

    def pair_count(self) -> int:
        """P, the number of monomials."""
        return self.products or self.size // 2

    def units(self) -> int:
        """n, the ESN's units."""
        return self.size - self.pair_count()

    def esn_config(self) -> ESNConfig:
        """The ESNConfig of the reservoir under the monomials."""
        base = ESNConfig(**{f.name: getattr(self, f.name) for f in fields(ESNConfig)})
        return replace(base, size=self.units())


def draw_pairs(n: int, P: int, seed: int) -> torch.Tensor:
    """(2, P) long: P pairs (i <= j) of n units, without replacement, in triu_indices order."""
    M = n * (n + 1) // 2
    picked = torch.arange(M) if P == M else torch.randperm(M, generator=generator(seed, PAIRS_KEY))[:P].sort().values
    return torch.triu_indices(n, n, device="cpu")[:, picked]


class PolyESN(Reservoir):
    """An ESN and fixed quadratic monomials of its state. forward(u (B,T,d), s0 (B,N)) -> (states, s_T)."""

    pure = True   # forward(u, s0) depends on its arguments only (window states share prefixes)

    def __init__(self, cfg: PolyESNConfig):
        super().__init__(cfg)
        self.units = cfg.units()
        self.esn = ESN(cfg.esn_config())
        with torch.device("cpu"):   # drawn on the CPU even under a `torch.device("meta")` context
            pairs = draw_pairs(self.units, cfg.pair_count(), cfg.seed)
        self.register_buffer("pairs", pairs, persistent=False)                      # (2, P), redrawn from the seed

    def init_state(self, batch: int, device=None, dtype=None) -> torch.Tensor:
        ref = self.esn.W_T
        return torch.zeros(batch, self.size, device=device or ref.device, dtype=dtype or ref.dtype)

    def forward(self, u: torch.Tensor, s0: torch.Tensor | None = None):
        x, x_T = self.esn(u, None if s0 is None else s0[:, :self.units])            # (B, T, n), (B, n)
        i, j = self.pairs.to(x.device)
        states = torch.cat([x, x[..., i] * x[..., j]], -1)
        last = states[:, -1] if states.shape[1] else torch.cat([x_T, x_T[:, i] * x_T[:, j]], -1)
        return states, last
