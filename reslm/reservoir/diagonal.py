"""Tokens -> reservoir states: a diagonal linear reservoir with complex eigenvalues, scanned in
parallel over time (the linear recurrent units of S4D / LRU, left untrained).

    h_t = lambda * h_{t-1} + B u_t              h, lambda, B u complex, K units, elementwise
    lambda_j = r_j e^{i theta_j},  r_j ~ U(r_min, spectral_radius),  theta_j ~ U(0, angle_max)
    or, with timescales (tau_min, tau_max > 0, in steps, i.e. characters):
             r_j = exp(-1 / tau_j),  log tau_j ~ U(log tau_min, log tau_max)   (spectral_radius, r_min unused)
    x_t = (Re h_1, Im h_1, ..., Re h_K, Im h_K)                          (2K,) real
    state_t = x_t                                   nonlinear = False: N = 2K
    state_t = [x_t, tanh(M x_t)]                    nonlinear = True: K = N // 4, M (N - 2K, 2K) fixed

A real linear system with eigenvalues lambda_j and their conjugates has exactly these states up to
a fixed change of basis, so the conjugates are implied. B has U(-1, 1) real and imaginary parts times
input_scaling (/ sqrt(d) if input_scale_by_dim); M has N(0, 1) entries times mix_scaling / sqrt(2K).
normalize multiplies unit j's row of B by sqrt(1 - r_j^2) (the LRU's normalisation), so that every unit's
stationary variance for a white input is that of its input term, whatever its timescale (a unit with
tau = 512 would otherwise be 16 times louder than one with tau = 1). The defaults (no timescales, no
normalisation, angles up to pi) are the substrate as it always was.
Seeding keys: 0 the eigenvalues (radii or timescales, then angles), 1 B, 2 M.

Scan: the sequence is cut into chunks of `chunk` steps; the carried state enters a chunk through its
first input (v_0 += lambda h_prev), then a log-depth (Hillis-Steele) scan runs over the chunk:
pass j adds lambda^(2^j) * v_{t - 2^j} to every v_t with t >= 2^j, so after ceil(log2 chunk) passes
v_t = sum_{s <= t} lambda^(t-s) v_s. The multipliers lambda^(2^j) are computed in float64 from
r^(2^j) and 2^j theta: every power has modulus <= 1 (r <= 1) and nothing is ever divided by a power
of lambda, so long sequences stay as accurate as the sequential loop. chunk = 1 is that loop.
chunk = 0 (auto) takes the loop on a CPU, where its single pass over memory beats the scan's log2(chunk)
passes (and their large temporaries), and chunks of 64 on an accelerator, where the loop's cost is
one kernel launch per step.

Precision: float32 (complex64), or float64 for float64 inputs; states come back in that dtype.
Gradients: the scan runs in place under no_grad unless u (or s0) requires grad.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from reslm.core.errors import ReslmError
from reslm.reservoir.base import Reservoir, ReservoirConfig, linear_call
from reslm.reservoir.seeding import generator

EIG_KEY, B_KEY, MIX_KEY = 0, 1, 2


@dataclass
class DiagonalConfig(ReservoirConfig):
    size: int = 750                 # N: 2K real state values (nonlinear: 2K linear + N - 2K tanh features)
    input_dim: int = 16             # d, input vector size
    spectral_radius: float = 0.99   # largest eigenvalue modulus: r_j ~ U(r_min, spectral_radius), <= 1
    r_min: float = 0.5              # smallest eigenvalue modulus (memory ~ 1 / (1 - r) steps)
    input_scaling: float = 1.0      # B's real and imaginary parts are U(-1, 1) * input_scaling
    input_scale_by_dim: bool = False  # also divide B by sqrt(input_dim)
    nonlinear: bool = False         # append tanh(M x) features of a fixed random M (then K = N // 4)
    mix_scaling: float = 1.0        # nonlinear: M ~ N(0, 1) * mix_scaling / sqrt(2K)
    chunk: int = 0                  # scan chunk length in steps: 1 = the sequential loop; 0 = auto (1 on CPU, 64 elsewhere)
    tau_min: float = 0.0            # timescales: |lambda| = exp(-1/tau), tau log-uniform in [tau_min, tau_max] steps;
    tau_max: float = 0.0            #   0, 0 = radii U(r_min, spectral_radius) instead
    angle_max: float = math.pi      # arg lambda ~ U(0, angle_max)
    normalize: bool = False         # B's row j times sqrt(1 - |lambda_j|^2) (unit stationary gain, the LRU's)
    seed: int = 0

    def validate(self):
        for name, least in (("size", 1), ("input_dim", 1), ("chunk", 0)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < least:
                raise ReslmError(f"diagonal {name} must be an integer >= {least}, got {v!r}")
        if not all(isinstance(getattr(self, f), bool) for f in ("nonlinear", "input_scale_by_dim", "normalize")):
            raise ReslmError("diagonal nonlinear, input_scale_by_dim and normalize must be true or false")
        if self.nonlinear and self.size < 4:
            raise ReslmError(f"the nonlinear diagonal reservoir needs size >= 4, got {self.size}")
        if not self.nonlinear and self.size % 2:
            raise ReslmError(f"the diagonal reservoir's size is 2 x its complex units: it must be even, got {self.size}")
        if self.timescales:
            if not 0 < self.tau_min <= self.tau_max < math.inf:
                raise ReslmError(f"diagonal timescales need 0 < tau_min <= tau_max (steps), got tau_min={self.tau_min}, "
                                 f"tau_max={self.tau_max}")
        elif self.tau_min or self.tau_max:
            raise ReslmError(f"diagonal timescales need both tau_min and tau_max > 0, got tau_min={self.tau_min}, "
                             f"tau_max={self.tau_max}")
        elif not 0 <= self.r_min <= self.spectral_radius <= 1:
            raise ReslmError(f"diagonal needs 0 <= r_min <= spectral_radius <= 1, got r_min={self.r_min}, "
                             f"spectral_radius={self.spectral_radius}")
        if self.input_scaling < 0 or self.mix_scaling < 0:
            raise ReslmError("input_scaling and mix_scaling must be >= 0")
        if not 0 <= self.angle_max <= 2 * math.pi:
            raise ReslmError(f"diagonal angle_max must be in [0, 2 pi], got {self.angle_max}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ReslmError(f"seed must be a non-negative integer, got {self.seed!r}")

    @property
    def timescales(self) -> bool:
        """Whether the radii come from timescales (tau_min, tau_max) rather than U(r_min, spectral_radius)."""
        return self.tau_min > 0 and self.tau_max > 0

    @property
    def units(self) -> int:
        """K, the complex units."""
        return self.size // 4 if self.nonlinear else self.size // 2


def _as_complex(x: torch.Tensor) -> torch.Tensor:
    """(..., 2K) real, (Re, Im) interleaved -> (..., K) complex (a view when x is contiguous)."""
    return torch.view_as_complex(x.contiguous().view(*x.shape[:-1], -1, 2))


def diagonal_scan(v: torch.Tensor, h: torch.Tensor | None, radius: torch.Tensor, angle: torch.Tensor,
                  chunk: int) -> torch.Tensor:
    """h_t = lambda h_{t-1} + v_t over dim 1 of v (B, T, K) complex; h (B, K) is h_{-1} (None = 0).

    Returns all h_t (B, T, K). In place over v under no_grad, out of place (recorded) otherwise.
    lambda = radius * exp(i angle) (K,); see the module docstring for the chunked log-depth scan."""
    grad = torch.is_grad_enabled() and (v.requires_grad or (h is not None and h.requires_grad))
    T = v.shape[1]
    r, a = radius.double(), angle.double()
    n_pass = max(0, math.ceil(math.log2(min(chunk, T)))) if T else 0
    powers = [torch.polar(r ** (2 ** j), a * 2 ** j).to(v.dtype) for j in range(n_pass)]  # lambda^(2^j)
    lam = powers[0] if powers else torch.polar(r, a).to(v.dtype)
    out = []
    for t0 in range(0, T, chunk):
        x = v[:, t0:t0 + chunk]                                       # (B, C, K)
        if grad:
            if h is not None:
                x = torch.cat([x[:, :1] + lam * h[:, None], x[:, 1:]], 1)
            for j, p in enumerate(powers):
                s = 2 ** j
                if s < x.shape[1]:
                    x = torch.cat([x[:, :s], x[:, s:] + p * x[:, :-s]], 1)
            out.append(x)
        else:
            if h is not None:
                x[:, 0].addcmul_(lam, h)                                  # fused: no (B, K) temporary
            for j, p in enumerate(powers):
                s = 2 ** j
                if s < x.shape[1]:
                    x[:, s:] += p * x[:, :-s]                         # rhs is a new tensor: reads old values
        h = x[:, -1]
    return torch.cat(out, 1) if grad else v


class DiagonalReservoir(Reservoir):
    """Diagonal complex linear reservoir. forward(u (B,T,d), s0 (B,N)) -> (states (B,T,N), s_T)."""

    pure = True   # forward(u, s0) depends on its arguments only (window states share prefixes)

    def __init__(self, cfg: DiagonalConfig):
        super().__init__(cfg)
        K, d = cfg.units, cfg.input_dim
        n_mix = cfg.size - 2 * K
        if torch.empty(0).is_meta:
            radius, angle, B, M = torch.empty(K), torch.empty(K), torch.empty(d, 2 * K), torch.empty(2 * K, n_mix)
        else:
            g = generator(cfg.seed, EIG_KEY)
            if cfg.timescales:
                lo, hi = math.log(cfg.tau_min), math.log(cfg.tau_max)
                tau = torch.exp(lo + (hi - lo) * torch.rand(K, generator=g, dtype=torch.float64))
                radius = torch.exp(-1 / tau)
            else:
                radius = cfg.r_min + (cfg.spectral_radius - cfg.r_min) * torch.rand(K, generator=g, dtype=torch.float64)
            angle = cfg.angle_max * torch.rand(K, generator=g, dtype=torch.float64)
            B = torch.rand(d, 2 * K, generator=generator(cfg.seed, B_KEY), dtype=torch.float64) * 2 - 1
            B *= cfg.input_scaling / (math.sqrt(d) if cfg.input_scale_by_dim else 1.0)
            if cfg.normalize:   # unit j's (Re, Im) columns times sqrt(1 - r_j^2)
                B *= torch.sqrt(1 - radius ** 2).repeat_interleave(2)
            M = torch.randn(2 * K, n_mix, generator=generator(cfg.seed, MIX_KEY), dtype=torch.float64)
            M *= cfg.mix_scaling / math.sqrt(2 * K)
        self.register_buffer("radius", radius.float())    # (K,) |lambda|
        self.register_buffer("angle", angle.float())      # (K,) arg lambda in [0, angle_max]
        self.register_buffer("B_T", B.float())            # (d, 2K): columns (Re, Im) interleaved per unit
        self.register_buffer("M_T", M.float())            # (2K, N - 2K): the fixed nonlinear mix

    def init_state(self, batch: int, device=None, dtype=None) -> torch.Tensor:
        return torch.zeros(batch, self.size, device=device or self.B_T.device, dtype=dtype or self.B_T.dtype)

    def forward(self, u: torch.Tensor, s0: torch.Tensor | None = None):
        B, T, d = u.shape
        K2 = 2 * self.config.units
        dtype, grad, empty = linear_call(self, u, s0)
        if empty is not None:
            return empty
        with torch.set_grad_enabled(grad), torch.autocast(u.device.type, enabled=False):
            v = (u.to(dtype).reshape(B * T, d) @ self.B_T.to(dtype)).view(B, T, K2)   # B u_t, (Re, Im) pairs
            h0 = _as_complex(s0[:, :K2].to(dtype)) if s0 is not None else None
            chunk = self.config.chunk or (1 if u.device.type == "cpu" else 64)
            h = diagonal_scan(_as_complex(v), h0, self.radius, self.angle, chunk)              # (B, T, K)
            x = torch.view_as_real(h).view(B, T, K2)
            if self.M_T.shape[1]:
                x = torch.cat([x, torch.tanh(x @ self.M_T.to(dtype))], -1)                   # (B, T, N)
        return x, x[:, -1]
