"""Tokens -> reservoir states: the deep ESN (Gallicchio et al. 2017), L stacked ESNs.

    s^1_t = ESN_1(s^1_{t-1}, u_t)                        layer 1 reads the input
    s^l_t = ESN_l(s^l_{t-1}, s^{l-1}_t)     l = 2..L    layer l reads layer l-1's new state
    state_t = [s^1_t, s^2_t, ..., s^L_t]                  (N,), what the readout sees

The total size N is one knob, split as evenly as possible (the first N mod L layers get one unit
more). Every layer is an ESN of esn.py with the config's radius, leak, densities, bias, precision and
kernel; layer 1 also takes input_scaling, input_init and input_scale_by_dim and the seed itself (so
L = 1 is exactly the ESN of size N with that seed); layers 2..L read a state of unit scale through
W_in entries times inter_scaling / sqrt(n_{l-1}) and are seeded with child_seed(seed, 3, l), a key
the ESN's own matrices (0, 1, 2) never use. Deeper layers see a slower, filtered signal: the stack
spreads the memory over timescales with no extra knob.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch
import torch.nn as nn

from reslm.core.errors import ReslmError
from reslm.reservoir.base import Reservoir
from reslm.reservoir.esn import ESN, ESNConfig
from reslm.reservoir.seeding import child_seed

LAYER_KEY = 3   # layer l >= 2 is seeded with child_seed(seed, LAYER_KEY, l)


@dataclass
class DeepESNConfig(ESNConfig):
    layers: int = 3                 # L stacked ESNs; the size N is split evenly between them
    inter_scaling: float = 1.0      # layers 2..L: W_in entries times inter_scaling / sqrt(previous layer's size)

    def validate(self):
        super().validate()
        if not isinstance(self.layers, int) or not 1 <= self.layers <= self.size:
            raise ReslmError(f"deep reservoir needs 1 <= layers <= size ({self.size}), got {self.layers!r}")
        if not self.inter_scaling >= 0:
            raise ReslmError(f"inter_scaling must be >= 0, got {self.inter_scaling}")

    def layer_sizes(self) -> list[int]:
        q, r = divmod(self.size, self.layers)
        return [q + (i < r) for i in range(self.layers)]

    def layer_config(self, layer: int) -> ESNConfig:
        """The ESNConfig of layer l = 1..L."""
        base = ESNConfig(**{f.name: getattr(self, f.name) for f in fields(ESNConfig)})
        sizes = self.layer_sizes()
        if layer == 1:
            return replace(base, size=sizes[0])
        return replace(base, size=sizes[layer - 1], input_dim=sizes[layer - 2], input_scaling=self.inter_scaling,
                       input_scale_by_dim=True, seed=child_seed(self.seed, LAYER_KEY, layer))


class DeepESN(Reservoir):
    """L stacked ESNs. forward(u (B,T,d), s0 (B,N)) -> (states (B,T,N) = layers concatenated, s_T)."""

    pure = True   # forward(u, s0) depends on its arguments only (window states share prefixes)

    def __init__(self, cfg: DeepESNConfig):
        super().__init__(cfg)
        self.sizes = cfg.layer_sizes()
        self.layers = nn.ModuleList(ESN(cfg.layer_config(l)) for l in range(1, cfg.layers + 1))

    def init_state(self, batch: int, device=None, dtype=None) -> torch.Tensor:
        ref = self.layers[0].W_T
        return torch.zeros(batch, self.size, device=device or ref.device, dtype=dtype or ref.dtype)

    def forward(self, u: torch.Tensor, s0: torch.Tensor | None = None):
        starts = [None] * len(self.layers) if s0 is None else s0.split(self.sizes, dim=-1)
        x, states, last = u, [], []
        for layer, s in zip(self.layers, starts):
            x, s_T = layer(x, s)                   # (B, T, n_l), (B, n_l): layer l's states feed layer l+1
            states.append(x)
            last.append(s_T)
        return torch.cat(states, -1), torch.cat(last, -1)
