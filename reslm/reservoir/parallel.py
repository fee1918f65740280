"""Tokens -> reservoir states: K ESNs side by side, each with its own time constant.

    s^k_t = (1 - a_k) s^k_{t-1} + a_k tanh(W_k s^k_{t-1} + W_in,k u_t + b_k)     k = 1..K, all read u_t
    state_t = [s^1_t, ..., s^K_t]                                              (N,), what the readout sees

`leaks` lists a_1/.../a_K (slash-separated, e.g. "1/0.2": a reservoir at the paper's leak beside one
whose units keep a fraction 0.8^k of their state after k characters), `shares` their relative sizes
(default equal; "2/1" gives the first block two thirds of N), `radii` and `scalings` their spectral radii
and input scalings (e.g. "0.5/0.9"; empty = every block takes the config's spectral_radius and
input_scaling). The blocks are not connected: each keeps
its own timescale, unlike the leaky substrate (leaky.py), whose units with different leak rates all
share one W. Every block is an ESN of esn.py with the config's (or its own) radius and input scaling, densities, bias,
precision and kernel. Block 1 is seeded with the seed itself (so K = 1 is exactly the ESN of size N at
leak a_1); block k >= 2 with child_seed(seed, BLOCK_KEY, k), a key no other matrix uses.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

import torch
import torch.nn as nn

from reslm.core.errors import ReslmError
from reslm.reservoir.base import Reservoir
from reslm.reservoir.esn import ESN, ESNConfig
from reslm.reservoir.seeding import child_seed

BLOCK_KEY = 4   # block k >= 2 is seeded with child_seed(seed, BLOCK_KEY, k)


def _numbers(name: str, text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split("/")]
    except ValueError:
        values = []
    if not values or not all(math.isfinite(v) for v in values):
        raise ReslmError(f"parallel reservoir: {name} takes finite numbers separated by '/', e.g. 1/0.2, "
                         f"got {text!r}")
    return values


@dataclass
class ParallelESNConfig(ESNConfig):
    leaks: str = "1/0.2"            # a_1/.../a_K: one leak rate per block, in (0, 1]; K = how many
    shares: str = ""                # relative block sizes, e.g. 2/1; empty = equal
    radii: str = ""                 # spectral radius per block, e.g. 0.5/0.9; empty = spectral_radius for all
    scalings: str = ""              # input scaling per block, e.g. 2/1; empty = input_scaling for all

    def validate(self):
        super().validate()
        leaks = self.block_leaks()
        if not all(0 < a <= 1 for a in leaks):
            raise ReslmError(f"parallel reservoir: each leak rate must be in (0, 1], got leaks={self.leaks}")
        if self.leak_rate != 1:
            raise ReslmError("the parallel reservoir takes one leak rate per block: set leaks (reservoir option), "
                             f"not leak_rate ({self.leak_rate})")
        shares = self.block_shares()
        if len(shares) != len(leaks) or not all(s > 0 for s in shares):
            raise ReslmError(f"parallel reservoir: shares needs one positive number per block ({len(leaks)}), "
                             f"got shares={self.shares}")
        for name in ("radii", "scalings"):
            values = self._per_block(name, None)
            if values is not None and (len(values) != len(leaks) or not all(v > 0 for v in values)):
                raise ReslmError(f"parallel reservoir: {name} needs one positive number per block ({len(leaks)}), "
                                 f"got {name}={getattr(self, name)}")
        if min(self.block_sizes()) < 1:
            raise ReslmError(f"parallel reservoir: size {self.size} leaves a block of {self.leaks} empty")

    def block_leaks(self) -> list[float]:
        return _numbers("leaks", self.leaks)

    def block_shares(self) -> list[float]:
        return _numbers("shares", self.shares) if self.shares else [1.0] * len(self.block_leaks())

    def _per_block(self, name: str, shared):
        """The numbers of per-block field `name`, or `shared` (one value per block) when it is empty."""
        text = getattr(self, name)
        return _numbers(name, text) if text else shared

    def block_radii(self) -> list[float]:
        return self._per_block("radii", [self.spectral_radius] * len(self.block_leaks()))

    def block_scalings(self) -> list[float]:
        return self._per_block("scalings", [self.input_scaling] * len(self.block_leaks()))

    def block_sizes(self) -> list[int]:
        """N split by the shares: each block gets floor(N share / total), the remainder goes to the first ones."""
        shares = self.block_shares()
        sizes = [int(self.size * s / sum(shares)) for s in shares]
        for i in range(self.size - sum(sizes)):
            sizes[i % len(sizes)] += 1
        return sizes

    def block_config(self, k: int) -> ESNConfig:
        """The ESNConfig of block k = 1..K."""
        base = ESNConfig(**{f.name: getattr(self, f.name) for f in fields(ESNConfig)})
        seed = self.seed if k == 1 else child_seed(self.seed, BLOCK_KEY, k)
        return replace(base, size=self.block_sizes()[k - 1], leak_rate=self.block_leaks()[k - 1], seed=seed,
                       spectral_radius=self.block_radii()[k - 1], input_scaling=self.block_scalings()[k - 1])


class ParallelESN(Reservoir):
    """K ESNs reading the same input. forward(u (B,T,d), s0 (B,N)) -> (states (B,T,N) = blocks concatenated, s_T)."""

    pure = True   # forward(u, s0) depends on its arguments only (window states share prefixes)

    def __init__(self, cfg: ParallelESNConfig):
        super().__init__(cfg)
        self.sizes = cfg.block_sizes()
        self.blocks = nn.ModuleList(ESN(cfg.block_config(k)) for k in range(1, len(self.sizes) + 1))

    def init_state(self, batch: int, device=None, dtype=None) -> torch.Tensor:
        ref = self.blocks[0].W_T
        return torch.zeros(batch, self.size, device=device or ref.device, dtype=dtype or ref.dtype)

    def forward(self, u: torch.Tensor, s0: torch.Tensor | None = None):
        starts = [None] * len(self.blocks) if s0 is None else s0.split(self.sizes, dim=-1)
        runs = [block(u, s) for block, s in zip(self.blocks, starts)]
        return torch.cat([r[0] for r in runs], -1), torch.cat([r[1] for r in runs], -1)
