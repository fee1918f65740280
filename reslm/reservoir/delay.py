"""Tokens -> reservoir states: a delay-based reservoir, one nonlinear node with delayed feedback
(Appeltant et al. 2011, Nat. Commun. 2, 468), N virtual nodes along the delay line.

Each input u_t is held for one delay period and multiplied by the mask M (N x d): virtual node i sees
J_i(t) = (M u_t)_i. With the usual discretisation (node separation theta, inertia a = 1 - e^-theta):

    x_i(t) = (1 - a) x_{i-1}(t) + a eta f(x_i(t-1) + gamma J_i(t))      i = 0..N-1
    x_{-1}(t) = x_{N-1}(t-1)                                           the line is one ring in time

    f(z) = z / (1 + |z|^p)               nonlinearity = "mackey-glass" (|z|: any real p)
    f(z) = sin^2(z + phi)                nonlinearity = "ikeda"

eta is the feedback strength, gamma = input_scaling, M has entries +-1 (mask = "binary") or U(-1, 1)
(mask = "uniform"), drawn from generator(seed, 0) (and divided by sqrt(d) if input_scale_by_dim).
The state is the N virtual nodes x(t).

Computation: time runs sequentially (f depends on the previous delay period), but within one period
the nodes form a linear first-order recurrence x_i = c x_{i-1} + z_i (c = 1 - a) once all
z_i = a eta f(...) are known, computed in parallel by two levels of small triangular matmuls: blocks
of 64 nodes scan internally against c^(i-j), then the block ends are carried by c^64 powers. No
Python loop over nodes. Precision: float32 (float64 for float64 inputs).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from reslm.core.errors import ReslmError
from reslm.reservoir.base import Reservoir, ReservoirConfig
from reslm.reservoir.seeding import generator

MASK_KEY = 0
NONLINEARITIES = ("mackey-glass", "ikeda")
MASKS = ("binary", "uniform")
BLOCK = 64   # virtual nodes per block of the node scan


@dataclass
class DelayConfig(ReservoirConfig):
    size: int = 750                 # N virtual nodes along the delay line
    input_dim: int = 16             # d, input vector size
    input_scaling: float = 0.5      # gamma: input gain inside the nonlinearity
    input_scale_by_dim: bool = False  # also divide the mask by sqrt(input_dim)
    eta: float = 0.8                # feedback strength of the delay loop
    node_coupling: float = 0.5      # a = 1 - exp(-theta): a node's response within one node separation theta
    nonlinearity: str = "mackey-glass"  # "mackey-glass": z / (1 + |z|^p) | "ikeda": sin^2(z + phi)
    p: float = 1.0                  # Mackey-Glass exponent
    phi: float = 0.2                # Ikeda phase offset
    mask: str = "binary"            # input mask entries: "binary" +-1 | "uniform" U(-1, 1)
    seed: int = 0

    def validate(self):
        for name in ("size", "input_dim"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ReslmError(f"delay {name} must be an integer >= 1, got {v!r}")
        if not 0 < self.node_coupling <= 1:
            raise ReslmError(f"node_coupling must be in (0, 1], got {self.node_coupling}")
        if self.input_scaling < 0 or self.eta < 0 or self.p <= 0:
            raise ReslmError("delay input_scaling and eta must be >= 0 and p > 0")
        for name, allowed in (("nonlinearity", NONLINEARITIES), ("mask", MASKS)):
            if getattr(self, name) not in allowed:
                raise ReslmError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if not isinstance(self.input_scale_by_dim, bool):
            raise ReslmError(f"input_scale_by_dim must be true or false, got {self.input_scale_by_dim!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ReslmError(f"seed must be a non-negative integer, got {self.seed!r}")


def _node_scan_matrices(c: float, N: int, block: int):
    """Float64 matrices of the node scan x_i = c x_{i-1} + z_i (see DelayReservoir.node_scan)."""
    nb = -(-N // block)
    i = torch.arange(block, dtype=torch.float64)
    diff = i[:, None] - i[None, :]
    within = torch.where(diff >= 0, c ** diff.clamp(min=0), 0.0)          # (C, C): c^(i-j), j <= i
    b = torch.arange(nb, dtype=torch.float64)
    bdiff = b[:, None] - b[None, :] - 1
    across = torch.where(bdiff >= 0, (c ** block) ** bdiff.clamp(min=0), 0.0)  # (nb, nb): c^(C(b-1-b'))
    start = (c ** block) ** b                                              # (nb,): c^(C b)
    ramp = c ** (i + 1)                                                    # (C,): c^(i+1)
    return within.T.contiguous(), across.T.contiguous(), start, ramp


class DelayReservoir(Reservoir):
    """Single nonlinear node with delayed feedback. forward(u (B,T,d), s0 (B,N)) -> (states (B,T,N), s_T)."""

    pure = True   # forward(u, s0) depends on its arguments only (window states share prefixes)

    def __init__(self, cfg: DelayConfig):
        super().__init__(cfg)
        N, d = cfg.size, cfg.input_dim
        if torch.empty(0).is_meta:
            M = torch.empty(N, d)
        else:
            M = torch.rand(N, d, generator=generator(cfg.seed, MASK_KEY), dtype=torch.float64)
            M = torch.where(M < 0.5, -1.0, 1.0) if cfg.mask == "binary" else M * 2 - 1
            M *= cfg.input_scaling / (math.sqrt(d) if cfg.input_scale_by_dim else 1.0)   # gamma M
        self.register_buffer("M_T", M.T.contiguous().float())                  # (d, N), gamma included
        self._scan: tuple | None = None   # ((device, dtype), node-scan constants): derived, never saved

    def scan_constants(self, device: torch.device, dtype: torch.dtype) -> tuple:
        """(within_T (C,C), across_T (nb,nb), start (nb,), ramp (C,)) of the node scan, cached per device and dtype."""
        if self._scan is None or self._scan[0] != (device, dtype):
            mats = _node_scan_matrices(1 - self.config.node_coupling, self.size, min(BLOCK, self.size))
            self._scan = ((device, dtype), tuple(t.to(device, dtype) for t in mats))
        return self._scan[1]

    def init_state(self, batch: int, device=None, dtype=None) -> torch.Tensor:
        return torch.zeros(batch, self.size, device=device or self.M_T.device, dtype=dtype or self.M_T.dtype)

    def f(self, z: torch.Tensor) -> torch.Tensor:
        c = self.config
        if c.nonlinearity == "ikeda":
            return torch.sin(z + c.phi) ** 2
        return z / (1 + z.abs() ** c.p)

    def node_scan(self, z: torch.Tensor, x_last: torch.Tensor) -> torch.Tensor:
        """x_i = c x_{i-1} + z_i for i = 0..N-1 with x_{-1} = x_last: z (B, N), x_last (B,) -> x (B, N).

        Blocks of C nodes scan from a zero start (one (C, C) matmul for all blocks); block b's start
        value X_b (the node before it) is c^(C b) x_last + sum_{b' < b} c^(C (b-1-b')) e_b', e the block
        ends; node i of block b adds c^(i+1) X_b."""
        Bsz, N = z.shape
        within_T, across_T, start, ramp = self.scan_constants(z.device, z.dtype)
        nb, C = len(start), len(ramp)
        if nb * C != N:
            z = torch.cat([z, z.new_zeros(Bsz, nb * C - N)], 1)          # padding after the last node
        y = (z.view(Bsz * nb, C) @ within_T).view(Bsz, nb, C)           # zero-start scan per block
        X = x_last[:, None] * start + y[:, :, -1] @ across_T             # (B, nb): the node before each block
        return (y + X[:, :, None] * ramp).view(Bsz, nb * C)[:, :N]

    def forward(self, u: torch.Tensor, s0: torch.Tensor | None = None):
        B, T, d = u.shape
        dtype = torch.float64 if u.dtype == torch.float64 else torch.float32
        grad = torch.is_grad_enabled() and (u.requires_grad or (s0 is not None and s0.requires_grad))
        a_eta = self.config.node_coupling * self.config.eta
        with torch.set_grad_enabled(grad), torch.autocast(u.device.type, enabled=False):
            x = s0.to(dtype) if s0 is not None else self.init_state(B, u.device, dtype)
            if T == 0:
                return u.new_zeros(B, 0, self.size, dtype=dtype), x
            J = (u.to(dtype).reshape(B * T, d) @ self.M_T.to(dtype)).view(B, T, self.size)   # gamma M u_t
            out = [] if grad else torch.empty(B, T, self.size, dtype=dtype, device=u.device)
            for t in range(T):
                x = self.node_scan(a_eta * self.f(x + J[:, t]), x[:, -1])
                if grad:
                    out.append(x)
                else:
                    out[:, t] = x
            states = torch.stack(out, 1) if grad else out
        return states, x
