"""The attention-enhanced reservoir computer (AERC), paper section "Attention-Enhanced Reservoir Computing".

Per step a small network F turns the reservoir state r (N) into a readout matrix:

    z       = ReLU(W_1 r + b_1)                 (H)        W_1: H x N
    W_att   = reshape(W_2 z + b_2, H x N)       (H, N)     W_2: (H N) x H  -- the attention weights
    r_o     = W_att r                           (H)
    logits  = W_out r_o + b_out                 (V)        W_out: V x H   (H_o = H, paper)

Trainable: (N H + H) + (H H N + H N) + (V H + V). Table 1: (N, H) = (75,13), (75,19), (100,20),
(150,25), (160,30) -> 15464, 31124, 45259, 102809, 155459.

Computation: materialising W_att costs a (B, H, N) tensor per batch; instead we use
r_o[i] = sum_k z[k] (sum_n W_2[(i,n),k] r[n]) + sum_n b_2[(i,n)] r[n], i.e. one (B,N) x (N, H H)
product, a contraction with z, and one (B,N) x (N,H) product. Same numbers, less memory traffic.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from reslm.core.errors import ReslmError
from reslm.models.reservoir_lm import ReservoirLM, ReservoirLMConfig


@dataclass
class AERCConfig(ReservoirLMConfig):
    size: int = 100
    hidden: int = 20                # H: hidden width of F and of r_o

    def validate(self):
        super().validate()
        if self.hidden < 1:
            raise ReslmError(f"hidden must be >= 1, got {self.hidden}")
        width = self.readout_dim or self.size
        if self.hidden > width:
            raise ReslmError(f"AERC hidden ({self.hidden}) must not exceed the state it reads ({width}): "
                             "r_o = W_att r would be larger than r")


class AttentionReadout(nn.Module):
    """state r (B, N) -> logits (B, V) through a state-dependent readout matrix W_att(r)."""

    def __init__(self, size: int, hidden: int, vocab_size: int):
        super().__init__()
        self.size, self.hidden = size, hidden
        self.net1 = nn.Linear(size, hidden)                # W_1, b_1
        self.net2 = nn.Linear(hidden, hidden * size)       # W_2, b_2: rows ordered (i, n)
        self.out = nn.Linear(hidden, vocab_size)           # W_out, b_out
        # The paper does not give an initialisation. With torch's default, r_o = W_att r sums N terms
        # and starts ~sqrt(N) too large (loss at init 5.8 nats for N=160 instead of ln 59 = 4.1);
        # scaling W_2 and b_2 by 1/sqrt(N) starts r_o at unit scale.
        with torch.no_grad():
            self.net2.weight.mul_(size ** -0.5)
            self.net2.bias.mul_(size ** -0.5)

    def forward(self, r: torch.Tensor) -> torch.Tensor:
        N, H = self.size, self.hidden
        z = torch.relu(self.net1(r))                                            # (B, H)
        W2 = self.net2.weight.view(H, N, H).permute(1, 0, 2).reshape(N, H * H)  # [n, (i, k)]
        q = (r @ W2).view(-1, H, H)                                             # (B, i, k)
        r_o = (q @ z.unsqueeze(-1)).squeeze(-1) + r @ self.net2.bias.view(H, N).T   # (B, H)
        return self.out(r_o)


class AERC(ReservoirLM):
    family = "aerc"

    def make_head(self) -> nn.Module:
        c = self.config
        return AttentionReadout(self.head_width, c.hidden, c.vocab_size)   # r: the state (+ current char)
