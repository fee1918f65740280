"""Tokens -> reservoir states: a frozen random GRU, the gated recurrence with fixed random weights.

    r_t = sigmoid(W_ir u_t + W_hr s_{t-1} + b_r)                     reset gate
    z_t = sigmoid(W_iz u_t + W_hz s_{t-1} + b_z + update_bias)       update gate
    n_t = tanh(W_in u_t + b_n + r_t * (W_hn s_{t-1}))                candidate (the ESN's tanh step)
    s_t = (1 - z_t) * n_t + z_t * s_{t-1}                            a leak that depends on the state

torch's GRU equations (torch.nn.GRU) with b_hh = 0. Nothing trains: every weight is a buffer, drawn once
from the seed. From a zero state every s_t lies in (-1, 1) (a convex mix of tanh values and the state
before). Where the ESN has one fixed leak rate, each unit here leaks at a rate the input and the state
set (z_t), and the reset gate decides how much of the state enters the candidate: richer fixed dynamics
at the ESN's state size, read by the same head.

* W_hn (N x N): the ESN's W for the same seed and size (U(-1, 1), seeding key 0), rescaled so that
  its spectral radius (radius_norm="spectral") or largest singular value ("singular") is
  `spectral_radius`; W_in (N x d): the ESN's W_in (key 1, `input_init`) times input_scaling; b_n: the
  ESN's bias (key 2, U(-bias_scaling, bias_scaling)).
* The gates (reset: keys 3, 4, 5; update: keys 6, 7, 8 for the recurrent matrix, the input matrix and
  the bias): recurrent matrices U(-1, 1) * gate_scaling * sqrt(3 / N) (entries of variance
  gate_scaling^2 / N, spectral radius about gate_scaling by the circular law; no eigendecomposition),
  input matrices U(-1, 1) * gate_scaling, biases U(-bias_scaling, bias_scaling); update_bias is added
  to the update gate's bias: negative values open the gate (fast units, z near 0: the ESN's step),
  positive ones close it (slow units, long memory).

Kernel: torch.gru, torch's fused GRU (the input GEMM of all steps at once, then one (B, N) x (N, 3N)
GEMM and the gate arithmetic per step; cuDNN on a GPU), batch first. Precision (`dtype`): as the ESN's
("input": u's dtype; "auto": float16 on CUDA, float32 on a CPU; or a fixed float32 | bfloat16 |
float16). Gradients: the weights never get one; when u (or s0) requires grad the recurrence is
recorded, so that u gets one (LAERC's reservoir_grad), otherwise it runs under no_grad.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from reslm.core.errors import ReslmError
from reslm.core.radii import radius_name
from reslm.reservoir.base import Reservoir, ReservoirConfig
from reslm.reservoir.esn import BIAS_KEY, DTYPES, ESN, W_IN_KEY, W_KEY
from reslm.reservoir.matrices import DISTRIBUTIONS, RADIUS_NORMS, random_sparse, scale_radius
from reslm.reservoir.seeding import generator

RESET_KEYS, UPDATE_KEYS = (3, 4, 5), (6, 7, 8)   # seeding keys of each gate's (W_h, W_i, b); the candidate: 0, 1, 2


@dataclass
class GRUConfig(ReservoirConfig):
    size: int = 750                 # N, reservoir units
    input_dim: int = 16             # d, input vector size (the char embedding)
    spectral_radius: float = 0.9    # radius of the candidate's recurrent matrix W_hn (see radius_norm)
    radius_norm: str = "spectral"   # "spectral": rho(W_hn) = spectral_radius; "singular": largest singular value
    input_scaling: float = 1.0      # multiplies the candidate's input matrix W_in
    input_init: str = "uniform"     # W_in entries: "uniform" U(-1, 1) or "normal" N(0, 1)
    bias_scaling: float = 0.0       # every bias ~ U(-bias_scaling, bias_scaling); 0 = no bias
    gate_scaling: float = 1.0       # the gates' input matrices U(-1, 1) x this; recurrent ones of radius ~ this
    update_bias: float = 0.0        # added to the update gate's bias: > 0 slower units, < 0 faster
    dtype: str = "input"            # compute precision: input (u's dtype) | auto (float16 on CUDA, float32 on CPU) | float32 | bfloat16 | float16
    seed: int = 0                   # one generator per matrix (seeding.py)

    def validate(self):
        for name in ("size", "input_dim"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ReslmError(f"gru {name} must be an integer >= 1, got {v!r}")
        if not self.spectral_radius > 0:
            raise ReslmError(f"spectral_radius must be > 0, got {self.spectral_radius}")
        for name in ("input_scaling", "bias_scaling", "gate_scaling"):
            if not getattr(self, name) >= 0:
                raise ReslmError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not math.isfinite(self.update_bias):
            raise ReslmError(f"update_bias must be a finite number, got {self.update_bias}")
        for name, allowed in (("radius_norm", RADIUS_NORMS), ("input_init", DISTRIBUTIONS), ("dtype", DTYPES)):
            if getattr(self, name) not in allowed:
                raise ReslmError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ReslmError(f"seed must be a non-negative integer, got {self.seed!r}")


def _bias(n: int, scale: float, seed: int, key: int) -> torch.Tensor:
    return (torch.rand(n, generator=generator(seed, key), dtype=torch.float64) * 2 - 1) * scale


def _gate(cfg: GRUConfig, keys: tuple[int, int, int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One gate's (W_h (N, N), W_i (N, d), b (N,)), float64 (module doc)."""
    N, d = cfg.size, cfg.input_dim
    W_h = random_sparse(N, N, 1.0, generator(cfg.seed, keys[0])) * (cfg.gate_scaling * math.sqrt(3 / N))
    W_i = random_sparse(N, d, 1.0, generator(cfg.seed, keys[1])) * cfg.gate_scaling
    return W_h, W_i, _bias(N, cfg.bias_scaling, cfg.seed, keys[2])


class FrozenGRU(Reservoir):
    """Fixed random GRU. forward(u (B,T,d), s0 (B,N)) -> (states (B,T,N), s_T); step(u_t, s) -> s."""

    pure = True   # forward(u, s0) depends on its arguments only (window states share prefixes)

    def __init__(self, cfg: GRUConfig):
        super().__init__(cfg)
        N, d = cfg.size, cfg.input_dim
        key = ("gru", N, cfg.seed)
        if torch.empty(0).is_meta:  # shape-only construction (counting parameters): draw nothing
            w_ih, w_hh, b_ih = torch.empty(3 * N, d), torch.empty(3 * N, N), torch.empty(3 * N)
        else:
            W = scale_radius(random_sparse(N, N, 1.0, generator(cfg.seed, W_KEY)), cfg.spectral_radius,
                             cfg.radius_norm, key=key)
            W_in = random_sparse(N, d, 1.0, generator(cfg.seed, W_IN_KEY), cfg.input_init) * cfg.input_scaling
            b = _bias(N, cfg.bias_scaling, cfg.seed, BIAS_KEY)
            (Wr, Wr_in, br), (Wz, Wz_in, bz) = _gate(cfg, RESET_KEYS), _gate(cfg, UPDATE_KEYS)
            w_ih = torch.cat([Wr_in, Wz_in, W_in])                       # torch's gate order: r, z, n
            w_hh = torch.cat([Wr, Wz, W])
            b_ih = torch.cat([br, bz + cfg.update_bias, b])
        # the name of W_hn's radius in a run's records (reslm.reservoir.matrices.recorded_radii)
        self.radius_name = radius_name(cfg.radius_norm, key)
        self.register_buffer("w_ih", w_ih.float())                       # (3N, d)
        self.register_buffer("w_hh", w_hh.float())                       # (3N, N)
        self.register_buffer("b_ih", b_ih.float())                       # (3N,)
        self.register_buffer("b_hh", torch.zeros(3 * N), persistent=False)   # torch's b_hh: always 0

    def init_state(self, batch: int, device=None, dtype=None) -> torch.Tensor:
        return torch.zeros(batch, self.size, device=device or self.w_hh.device, dtype=dtype or self.w_hh.dtype)

    compute_dtype = ESN.compute_dtype   # the recurrence's precision: the ESN's rule on GRUConfig.dtype

    def forward(self, u: torch.Tensor, s0: torch.Tensor | None = None):
        """Run T steps for B sequences. u (B,T,d); s0 (B,N) or None (zero state).
        Returns (states (B,T,N), s_T (B,N)) in the compute dtype."""
        B, T, _ = u.shape
        dtype = self.compute_dtype(u.device, u.dtype)
        grad = torch.is_grad_enabled() and (u.requires_grad or (s0 is not None and s0.requires_grad))
        with torch.set_grad_enabled(grad), torch.autocast(u.device.type, enabled=False):
            u = u.to(dtype)
            h0 = s0.to(dtype) if s0 is not None else u.new_zeros(B, self.size)
            if T == 0:
                return u.new_zeros(B, 0, self.size), h0
            params = [p.to(device=u.device, dtype=dtype) for p in (self.w_ih, self.w_hh, self.b_ih, self.b_hh)]
            # (input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
            states, h = torch.gru(u, h0[None].contiguous(), params, True, 1, 0.0, False, False, True)
        return states, h[0]
