"""Tokens -> reservoir states: the edge-of-stability echo state network (ES2N; Ceni and Gallicchio).

    x_t = beta tanh(W x_{t-1} + W_in u_t + b) + (1 - beta) O x_{t-1}

The state is a convex combination of the ESN's update (esn.py: W, W_in and b drawn and scaled exactly as
the ESN draws them, from the same seeding keys 0, 1, 2) and a fixed orthogonal map O of the previous
state. O has every singular value 1, so the (1 - beta) part of the state is carried on without losing
norm: small beta keeps the linearised dynamics near the edge of stability, where the short-term memory
is longest, while the tanh part keeps the ESN's nonlinearity. beta = 1 is the ESN.

O (`orthogonal`):
    random     Q of the QR decomposition of an (N, N) N(0, 1) matrix drawn from seeding key 5, with the
               signs of R's diagonal moved into Q (Haar-distributed); one extra (N, N) GEMM per step
               (computed together with W's: one (N, 2N) product)
    cycle      the cyclic shift (O x)_i = x_{i-1}: no product, a ring of delays
    identity   O = I: then ES2N is the leaky ESN with leak_rate beta

The ESN's `leak_rate` must stay 1 (beta is the mixing), and the ESN's kernels (backend) are not used:
one loop, in the config's precision (ESN.compute_dtype). The loop runs in place under no_grad and out
of place (recorded by autograd) when u (or s0) requires grad.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from reslm.core.errors import ReslmError
from reslm.reservoir.esn import ESN, ESNConfig
from reslm.reservoir.seeding import generator

ORTHOGONAL = ("random", "cycle", "identity")
ORTH_KEY = 5   # seeding key of the random orthogonal map (the ESN's matrices use 0, 1, 2)


@dataclass
class ES2NConfig(ESNConfig):
    beta: float = 0.1               # weight of the ESN update; 1 - beta carries O x_{t-1}
    orthogonal: str = "random"      # O: random (Haar orthogonal, seeded) | cycle (cyclic shift) | identity

    def validate(self):
        super().validate()
        if not 0 < self.beta <= 1:
            raise ReslmError(f"es2n beta must be in (0, 1], got {self.beta}")
        if self.orthogonal not in ORTHOGONAL:
            raise ReslmError(f"es2n orthogonal must be one of {', '.join(ORTHOGONAL)}, got {self.orthogonal!r}")
        if self.leak_rate != 1:
            raise ReslmError(f"es2n mixes by beta, not by a leak: leave leak_rate at 1 (got {self.leak_rate})")


def random_orthogonal(n: int, gen: torch.Generator) -> torch.Tensor:
    """(n, n) float64 Haar-distributed orthogonal matrix: Q of QR(G), G ~ N(0, 1), columns signed by R's diagonal."""
    q, r = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    return q * torch.where(torch.diagonal(r) < 0, -1.0, 1.0)


class ES2N(ESN):
    """Edge-of-stability ESN. forward(u (B,T,d), s0 (B,N)) -> (states (B,T,N), s_T); step(u_t, s) -> s."""

    def __init__(self, cfg: ES2NConfig):
        super().__init__(cfg)
        N = cfg.size
        if cfg.orthogonal == "random":
            O = torch.empty(N, N) if torch.empty(0).is_meta else random_orthogonal(N, generator(cfg.seed, ORTH_KEY))
            # [W^T | O^T]: one (B, N) x (N, 2N) product gives W x and O x of every row
            self.register_buffer("WO_T", torch.cat([self.W_T, O.T.float()], 1).contiguous())
        else:
            self.register_buffer("WO_T", torch.empty(0))

    def orthogonal_matrix(self) -> torch.Tensor:
        """O (N, N) as a dense float32 matrix, whichever its kind."""
        N, kind = self.size, self.config.orthogonal
        if kind == "random":
            return self.WO_T[:, N:].T.contiguous()
        eye = torch.eye(N, device=self.W_T.device)
        return torch.roll(eye, 1, dims=0) if kind == "cycle" else eye

    def forward(self, u: torch.Tensor, s0: torch.Tensor | None = None):
        """x_t for T steps of B sequences (module doc). u (B,T,d); s0 (B,N) or None (zero state)."""
        B, T, d = u.shape
        N, beta, kind = self.size, self.config.beta, self.config.orthogonal
        dtype = self.compute_dtype(u.device, u.dtype)
        grad = torch.is_grad_enabled() and (u.requires_grad or (s0 is not None and s0.requires_grad))
        W_T, W_in_T, bias = self._weights(dtype)
        WO_T = self.WO_T.to(dtype) if kind == "random" else W_T
        with torch.autocast(u.device.type, enabled=False), torch.set_grad_enabled(grad):
            u = u.to(dtype)
            s = s0.to(dtype) if s0 is not None else None
            if T == 0:
                return u.new_zeros(B, 0, N), s if s is not None else self.init_state(B, u.device, dtype)
            pre = torch.addmm(bias, u.transpose(0, 1).reshape(T * B, d), W_in_T).view(T, B, N)
            out = []
            for t in range(T):
                if s is None:                                  # O 0 = 0: only the ESN update
                    x = beta * torch.tanh(pre[t])
                else:
                    y = s @ WO_T                               # (B, N) or (B, 2N): W s | O s
                    z = torch.tanh(y[:, :N] + pre[t])
                    carried = y[:, N:] if kind == "random" else torch.roll(s, 1, -1) if kind == "cycle" else s
                    x = beta * z + (1 - beta) * carried
                if grad:
                    out.append(x)
                else:
                    pre[t].copy_(x)                            # the input slot becomes the state
                s = x if grad else pre[t]
            states = torch.stack(out) if grad else pre
        return states.transpose(0, 1), states[-1]
