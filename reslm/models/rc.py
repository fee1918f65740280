"""The classic reservoir computer (echo state network) language model, paper section "Traditional
Reservoir Computing":

    r_t = tanh(W_res r_{t-1} + W_in x_t)        fixed (reservoir/esn.py)
    y_t = W_out r_t + b_out                     the trainable linear readout, V x (N + 1) parameters

or a nonlinear head on the same state (`head` mlp | mlp2 | mlp3 | glu, width `head_hidden`, `head_dropout`,
`head_input_dropout`, `head_rank`: reslm/models/heads.py),
optionally reading the current character beside it (`head_input`, reservoir_lm.py).

Trained by cross-entropy with Adam, like the paper, or in closed form (`--optimizer ridge`,
reslm/train/ridge.py: ridge regression with a fitted softmax temperature, written into the same head). Table 1: N = 250, 500, 750,
1750, 2600 -> 14809, 29559, 44309, 103309, 153459 trainable parameters (V = 59).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.nn as nn

from reslm.core.errors import ReslmError
from reslm.models.heads import HEADS, make_readout
from reslm.models.reservoir_lm import ReservoirLM, ReservoirLMConfig


@dataclass
class RCConfig(ReservoirLMConfig):
    head: str = "linear"            # readout: linear (paper) | mlp (one GELU layer) | mlp2 (two) | mlp3 (three) | glu (SwiGLU), see reslm.models.heads
    head_hidden: int = 0            # H: hidden width of an mlp, mlp2, mlp3 or glu head (0 for linear)
    head_dropout: float = 0.0       # dropout on the head's hidden units while training (mlp, mlp2, mlp3, glu)
    head_input_dropout: float = 0.0  # dropout on the head's inputs (the state's channels) while training (mlp, mlp2, mlp3, glu)
    head_rank: int = 0              # r: read the state through a trainable Linear(D, r) before the mlp/glu head; 0 = off

    def validate(self):
        super().validate()
        if self.head not in HEADS:
            raise ReslmError(f"head must be one of {', '.join(HEADS)}, got {self.head!r}")
        if self.head == "linear" and self.head_hidden:
            raise ReslmError(f"head_hidden is the width of an mlp or glu head; the linear head has none "
                             f"(got {self.head_hidden})")
        if self.head != "linear" and self.head_hidden < 1:
            raise ReslmError(f"a {self.head} head needs head_hidden >= 1, got {self.head_hidden}")
        for name in ("head_dropout", "head_input_dropout"):
            p = getattr(self, name)
            if not (isinstance(p, (int, float)) and 0.0 <= p < 1.0):
                raise ReslmError(f"{name} must be in [0, 1), got {p!r}")
        if self.head == "linear" and self.head_dropout:
            raise ReslmError("head_dropout drops a hidden layer's units; the linear head has none")
        if not isinstance(self.head_rank, int) or self.head_rank < 0:
            raise ReslmError(f"head_rank must be an integer >= 0 (0: off), got {self.head_rank!r}")
        if self.head == "linear" and self.head_rank:
            raise ReslmError("head_rank puts a low-rank layer before an mlp, mlp2, mlp3 or glu head; the linear head "
                             "keeps its paper form")
        if self.head == "linear" and self.head_input_dropout:
            raise ReslmError("head_input_dropout is for the mlp, mlp2, mlp3 and glu heads; the linear head keeps its "
                             "paper form")


class RC(ReservoirLM):
    family = "rc"

    def make_head(self) -> nn.Module:
        c = self.config                   # linear: W_out (V, D) + bias, D = N for head_input "state"
        return make_readout(c.head, self.head_width, c.head_hidden, c.vocab_size, c.head_dropout,
                            c.head_input_dropout, c.head_rank)
