"""Tokens -> reservoir states: the Legendre delay memory of the Legendre Memory Unit (Voelker, Kajic and
Eliasmith, 2019), a fixed linear system whose state is a compression of the last `theta` steps of its
input onto the first `order` shifted Legendre polynomials. Nothing is drawn: the system is fixed by
theta and the order (`seed` is kept for the reservoir contract only).

    theta dm/dt = A m + B u,   A_ij = (2i + 1) (-1 if i < j else (-1)^(i - j + 1)),   B_i = (2i + 1) (-1)^i

for i, j = 0..q-1, discretised for one step per character by zero-order hold (the exponential of the
augmented matrix [[A, B], [0, 0]] / theta, in float64):

    m_t = Abar m_{t-1} + Bbar u_t            one such q-state memory per input dimension
    state_t = [m_t of input dimension 1, ..., m_t of input dimension d]      N = d q, dimension-major

The input is the character's fixed embedding times input_scaling, and each of its d dimensions has its
own memory (the same Abar, Bbar). normalize (default) expresses m in the basis in which each coefficient
has unit stationary variance for a unit-variance white input, D m with D = diag(P)^(-1/2) and
P = Abar P Abar^T + Bbar Bbar^T (summed by doubling), i.e. Abar <- D Abar D^-1, Bbar <- D Bbar: the same
system, its coefficients on one scale beside other substrates' states.

Fast path: the system is linear and time-invariant, so the states of a chunk of C steps are one GEMM of
the chunk's inputs with the lower-triangular Toeplitz matrix of the impulse response Abar^k Bbar
(k < C), for every chunk at once, plus the state carried into each chunk times Abar^(j+1) (one more
GEMM); only the carries (one (q, q) product per chunk) are sequential. A call of T < chunk steps (stream
mode's training often steps one character at a time) uses chunks of T. chunk = 1 is the step-by-step
recurrence. Powers are computed and kept in float64; states come back in float32 (float64 for float64
inputs).
Gradients flow to u when it requires grad (every operation is out of place).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from reslm.core.errors import ReslmError
from reslm.reservoir.base import Reservoir, ReservoirConfig, linear_call


@dataclass
class LegendreConfig(ReservoirConfig):
    size: int = 768                 # N = input_dim x order
    input_dim: int = 16             # d, input vector size (each dimension gets its own memory)
    theta: float = 64.0             # the window the memory compresses, in steps (characters)
    order: int = 0                  # q, Legendre coefficients per input dimension; 0 = size // input_dim
    input_scaling: float = 1.0      # multiplies the input
    normalize: bool = True          # coefficients in the basis of unit stationary variance (module doc)
    chunk: int = 64                 # steps per chunk of the Toeplitz scan; 1 = the step-by-step recurrence
    seed: int = 0                   # unused: the memory draws nothing (kept for the reservoir contract)

    def validate(self):
        for name, least in (("size", 1), ("input_dim", 1), ("order", 0), ("chunk", 1), ("seed", 0)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < least:
                raise ReslmError(f"legendre {name} must be an integer >= {least}, got {v!r}")
        if not isinstance(self.normalize, bool):
            raise ReslmError(f"legendre normalize must be true or false, got {self.normalize!r}")
        if not (math.isfinite(self.theta) and self.theta > 0):
            raise ReslmError(f"legendre theta must be > 0 (steps), got {self.theta}")
        if not self.input_scaling >= 0:
            raise ReslmError(f"legendre input_scaling must be >= 0, got {self.input_scaling}")
        if self.order and self.size != self.order * self.input_dim:
            raise ReslmError(f"legendre's size is input_dim x order: set size to {self.order * self.input_dim} "
                             f"(input_dim {self.input_dim}, order {self.order}), got {self.size}")
        if not self.order and self.size % self.input_dim:
            raise ReslmError(f"legendre's size must be a multiple of input_dim {self.input_dim} (size = input_dim x "
                             f"order), got {self.size}")

    @property
    def q(self) -> int:
        """The order: Legendre coefficients per input dimension."""
        return self.order or self.size // self.input_dim


def legendre_system(order: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(A (q, q), B (q,)) float64 of the continuous Legendre delay system, theta dm/dt = A m + B u."""
    i = torch.arange(order, dtype=torch.float64)[:, None]
    j = torch.arange(order, dtype=torch.float64)[None, :]
    sign = torch.where(i < j, -1.0, (-1.0) ** (i - j + 1))
    A = (2 * i + 1) * sign
    B = (2 * torch.arange(order, dtype=torch.float64) + 1) * (-1.0) ** torch.arange(order, dtype=torch.float64)
    return A, B


def discretise(A: torch.Tensor, B: torch.Tensor, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero-order hold over one step of theta dm/dt = A m + B u: (Abar, Bbar), float64."""
    q = A.shape[0]
    M = torch.zeros(q + 1, q + 1, dtype=torch.float64)
    M[:q, :q], M[:q, q] = A / theta, B / theta
    E = torch.linalg.matrix_exp(M)
    return E[:q, :q].clone(), E[:q, q].clone()


def stationary_variance(Abar: torch.Tensor, Bbar: torch.Tensor, doublings: int = 40) -> torch.Tensor:
    """diag(P), P = sum_k Abar^k Bbar Bbar^T Abar^k^T (a unit white input's stationary covariance), by
    doubling: P_2K = P_K + Abar^K P_K Abar^K^T, until Abar^K is below 1e-100 (every later term then
    underflows against P: the same float64 result, without products of denormal numbers)."""
    P, Ak = torch.outer(Bbar, Bbar), Abar.clone()
    for _ in range(doublings):
        P = P + Ak @ P @ Ak.T
        Ak = Ak @ Ak
        if Ak.abs().max() < 1e-100:
            break
    return torch.diagonal(P).clone()


class LegendreMemory(Reservoir):
    """Legendre delay memory per input dimension. forward(u (B,T,d), s0 (B,N)) -> (states (B,T,N), s_T)."""

    pure = True   # forward(u, s0) depends on its arguments only (window states share prefixes)

    def __init__(self, cfg: LegendreConfig):
        super().__init__(cfg)
        q, C = cfg.q, cfg.chunk
        if torch.empty(0).is_meta:   # shape-only construction (counting parameters): compute nothing
            Abar, Bbar, toeplitz, carry = (torch.empty(s, dtype=torch.float64) for s in ((q, q), (q,), (C * q, C),
                                                                                       (C * q, q)))
            self._keep(Abar, Bbar, toeplitz, carry, q)
            return
        with torch.device("cpu"):   # float64 on the CPU whatever the default device
            Abar, Bbar = discretise(*legendre_system(q, cfg.theta), cfg.theta)
            if cfg.normalize:
                D = stationary_variance(Abar, Bbar).clamp_min(1e-300).rsqrt()
                Abar, Bbar = D[:, None] * Abar / D[None, :], D * Bbar
            Bbar = Bbar * cfg.input_scaling
            powers = [torch.eye(q, dtype=torch.float64)]            # Abar^0 .. Abar^C
            for _ in range(C):
                powers.append(Abar @ powers[-1])
            H = torch.stack([p @ Bbar for p in powers[:C]])            # (C, q): impulse response Abar^k Bbar
            lag = torch.arange(C)[:, None] - torch.arange(C)[None, :]  # j - i
            toeplitz = torch.where((lag >= 0)[..., None], H[lag.clamp_min(0)], 0.0)   # (C, C, q): [j, i, p]
        self._keep(Abar, Bbar, toeplitz.permute(0, 2, 1).reshape(C * q, C),   # rows (j, p)
                   torch.stack(powers[1:]).reshape(C * q, q), q)             # Abar^(j+1), rows (j, p)

    def _keep(self, Abar, Bbar, toeplitz, carry, q: int) -> None:
        # float64 buffers (cast to the compute dtype when used), so that the float64 path is exact
        for name, t in (("Abar", Abar), ("Bbar", Bbar), ("toeplitz", toeplitz), ("carry", carry)):
            self.register_buffer(name, t)
        self.q = q

    def init_state(self, batch: int, device=None, dtype=None) -> torch.Tensor:
        return torch.zeros(batch, self.size, device=device or self.Abar.device, dtype=dtype or torch.float32)

    def step(self, u_t: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """m <- Abar m + Bbar u_t for every input dimension: u_t (B,d), s (B,N) -> (B,N)."""
        B, d = u_t.shape
        dtype = torch.float64 if u_t.dtype == torch.float64 else torch.float32
        m = s.to(dtype).reshape(B, d, self.q)
        return (m @ self.Abar.to(dtype).T + u_t.to(dtype)[..., None] * self.Bbar.to(dtype)).reshape(B, self.size)

    def forward(self, u: torch.Tensor, s0: torch.Tensor | None = None):
        B, T, d = u.shape
        q, C = self.q, min(self.config.chunk, max(T, 1))   # a short call (stream mode: often 1 step) pads nothing
        dtype, grad, empty = linear_call(self, u, s0)
        if empty is not None:
            return empty
        with torch.set_grad_enabled(grad), torch.autocast(u.device.type, enabled=False):
            n, Bd = -(-T // C), B * d
            x = u.to(dtype).transpose(0, 1).reshape(T, Bd)                      # time-major (T, B d)
            if n * C > T:                                                        # zeros after the end: causal
                x = torch.cat([x, x.new_zeros(n * C - T, Bd)])
            x = x.view(n, C, Bd).transpose(0, 1).reshape(C, n * Bd)             # (C, chunks x B d)
            C0 = self.config.chunk                                               # the buffers' chunk; C <= C0
            toeplitz = self.toeplitz.view(C0, q, C0)[:C, :, :C].reshape(C * q, C)  # the first C steps' response
            within = (toeplitz.to(dtype) @ x).view(C, q, n, Bd)                  # each chunk from a zero state
            m = s0.to(dtype).reshape(B * d, q).T if s0 is not None else x.new_zeros(q, Bd)
            powers = self.carry[:C * q]                                          # Abar^(j+1), j < C
            A_C, starts = powers[(C - 1) * q:].to(dtype), []
            for k in range(n):                                                   # the state entering chunk k
                starts.append(m)
                m = A_C @ m + within[C - 1, :, k]
            carried = (powers.to(dtype) @ torch.stack(starts, 1).view(q, n * Bd)).view(C, q, n, Bd)
            m_all = within + carried                                            # (C, q, n, B d)
            states = m_all.permute(2, 0, 3, 1).reshape(n * C, B, d * q)[:T].transpose(0, 1)
        return states, states[:, -1]
