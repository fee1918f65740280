"""Stage 3, the classic reservoir computer (echo state network) language model, paper section "Traditional
Reservoir Computing":

    r_t = tanh(W_res r_{t-1} + W_in x_t)        fixed (reservoir/esn.py)
    y_t = W_out r_t + b_out                     the trainable linear readout, V x (N + 1) parameters

Trained by cross-entropy with Adam, like the paper, or in closed form (`--optimizer ridge`,
reslm/ridge.py: ridge regression with a fitted softmax temperature, written into the same head). Table 1: N = 250, 500, 750,
1750, 2600 -> 14809, 29559, 44309, 103309, 153459 trainable parameters (V = 59).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.nn as nn

from reslm.models.reservoir_lm import ReservoirLM, ReservoirLMConfig


@dataclass
class RCConfig(ReservoirLMConfig):
    pass


class RC(ReservoirLM):
    family = "rc"

    def make_head(self) -> nn.Module:
        return nn.Linear(self.config.size, self.config.vocab_size)          # W_out: (V, N) + bias
