"""Echo state network reservoir: a fixed random recurrent network (paper eq. 1, with leak and bias).

    s_t = (1 - leak_rate) * s_{t-1} + leak_rate * tanh(W s_{t-1} + input_scaling * W_in u_t + b)

W (N x N) is a random matrix with a fraction `density` of non-zeros, rescaled so that its spectral
radius (largest |eigenvalue|) equals `spectral_radius` exactly; W_in (N x d) is uniform in [-1, 1]
with density `input_density`; b is uniform in [-bias_scaling, bias_scaling]. The paper's setting is
leak_rate = 1 and no bias. Every matrix comes from its own seeded generator (reservoirpy's habit),
so changing the input density does not change W, and the same seed always gives the same reservoir.

All weights are buffers: they are saved with the model but never seen by the optimiser.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from reslm.errors import ReslmError


@dataclass
class ESNConfig:
    size: int = 750                 # N, reservoir units
    input_dim: int = 16             # d, input vector size (the char embedding)
    spectral_radius: float = 0.9    # rho(W) after scaling
    input_scaling: float = 2.0      # multiplies W_in
    leak_rate: float = 1.0          # 1 = no leak (paper)
    density: float = 1.0            # fraction of non-zero entries in W
    input_density: float = 1.0      # fraction of non-zero entries in W_in
    bias_scaling: float = 0.0       # b ~ U(-bias_scaling, bias_scaling); 0 = no bias (paper)
    seed: int = 0

    def validate(self):
        if self.size < 1 or self.input_dim < 1:
            raise ReslmError(f"reservoir size and input_dim must be >= 1, got {self.size}, {self.input_dim}")
        if not self.spectral_radius > 0:
            raise ReslmError(f"spectral_radius must be > 0, got {self.spectral_radius}")
        if not 0 < self.leak_rate <= 1:
            raise ReslmError(f"leak_rate must be in (0, 1], got {self.leak_rate}")
        for name in ("density", "input_density"):
            if not 0 < getattr(self, name) <= 1:
                raise ReslmError(f"{name} must be in (0, 1], got {getattr(self, name)}")
        if self.input_scaling < 0 or self.bias_scaling < 0:
            raise ReslmError("input_scaling and bias_scaling must be >= 0")


def _generator(seed: int, stream: int) -> torch.Generator:
    """One independent generator per matrix, derived from the reservoir seed."""
    return torch.Generator().manual_seed(seed * 1_000_003 + stream)


def random_sparse(rows: int, cols: int, density: float, gen: torch.Generator) -> torch.Tensor:
    """Uniform(-1, 1) entries, each kept with probability `density` (float64 for exact scaling)."""
    w = torch.rand(rows, cols, generator=gen, dtype=torch.float64) * 2 - 1
    if density < 1:
        w *= torch.rand(rows, cols, generator=gen, dtype=torch.float64) < density
    return w


def spectral_radius(w: torch.Tensor) -> float:
    """Largest absolute eigenvalue of a square matrix (computed in float64)."""
    return torch.linalg.eigvals(w.double()).abs().max().item()


_RADII: dict = {}  # spectral radius per draw key: an eigendecomposition at N=2600 takes seconds


def scale_spectral_radius(w: torch.Tensor, radius: float, key: tuple | None = None) -> torch.Tensor:
    """Rescale w so that rho(w) == radius. `key` names the random draw that made w (e.g. its size,
    density, seed and stream): the same key is always the same matrix, so its radius is computed once
    per process (building a model to load a checkpoint into, as evaluation does, then costs no eig)."""
    rho = _RADII.get(key) if key is not None else None
    if rho is None:
        rho = spectral_radius(w)
        if key is not None:
            _RADII[key] = rho
    if rho == 0:
        raise ReslmError("the random recurrent matrix is nilpotent (spectral radius 0); raise density")
    return w * (radius / rho)


@torch.no_grad()
def tanh_recurrence(states: torch.Tensor, s: torch.Tensor | None, W_T: torch.Tensor,
                    leak_rate: float = 1.0) -> torch.Tensor | None:
    """The reservoir's hot loop, in place over a time-major buffer.

    states (T,B,N) holds the input term W_in u_t + b of every step on entry and the states on exit:
    s_t = (1-a) s_{t-1} + a tanh(s_{t-1} W_T + states[t]); s is s_{-1} (None = zero state). Each step is
    one addmm into a scratch buffer and its tanh written back into the step's own contiguous (B,N)
    slice (an in-place addmm_ into the slice measured ~18% slower). Returns the last state (a view).
    """
    scratch = torch.empty_like(states[0]) if len(states) else None
    for t in range(len(states)):
        x = states[t]                              # (B, N), holds W_in u_t + b
        if s is None:
            x.tanh_()
        else:
            torch.addmm(x, s, W_T, out=scratch)    # W s_{t-1} + W_in u_t + b
            torch.tanh(scratch, out=x)
        if leak_rate != 1.0:                       # leaky integration
            x.mul_(leak_rate)
            if s is not None:
                x.add_(s, alpha=1 - leak_rate)
        s = x
    return s


class ESN(nn.Module):
    """Fixed tanh reservoir. forward(u (B,T,d), s0 (B,N)) -> (states (B,T,N), s_T); step(u_t, s) -> s."""

    def __init__(self, cfg: ESNConfig):
        super().__init__()
        cfg.validate()
        self.config = cfg
        self.size, self.input_dim = cfg.size, cfg.input_dim
        if torch.empty(0).is_meta:  # shape-only construction (counting parameters): draw nothing
            W, W_in, b = (torch.empty(cfg.size, cfg.size), torch.empty(cfg.size, cfg.input_dim),
                          torch.empty(cfg.size))
        else:
            W = random_sparse(cfg.size, cfg.size, cfg.density, _generator(cfg.seed, 1))
            W = scale_spectral_radius(W, cfg.spectral_radius, key=("esn", cfg.size, cfg.density, cfg.seed))
            W_in = random_sparse(cfg.size, cfg.input_dim, cfg.input_density, _generator(cfg.seed, 2))
            b = (torch.rand(cfg.size, generator=_generator(cfg.seed, 3), dtype=torch.float64) * 2 - 1)
            b *= cfg.bias_scaling
        # Stored transposed, so that the per-step product is a row-major (B, N) @ (N, N) GEMM.
        self.register_buffer("W_T", W.T.contiguous().float())                             # (N, N)
        self.register_buffer("W_in_T", (W_in * cfg.input_scaling).T.contiguous().float())  # (d, N)
        self.register_buffer("bias", b.float())                                          # (N,)

    def init_state(self, batch: int, device=None, dtype=None) -> torch.Tensor:
        return torch.zeros(batch, self.size, device=device or self.W_T.device, dtype=dtype or self.W_T.dtype)

    def _weights(self, dtype: torch.dtype):
        """(W_T, W_in_T, bias) in the compute dtype; low-precision copies are made once and cached."""
        if dtype == self.W_T.dtype:
            return self.W_T, self.W_in_T, self.bias
        key = (dtype, self.W_T.device)
        if getattr(self, "_cast", (None,))[0] != key:
            self._cast = (key, tuple(t.to(dtype) for t in (self.W_T, self.W_in_T, self.bias)))
        return self._cast[1]

    @torch.no_grad()
    def forward(self, u: torch.Tensor, s0: torch.Tensor | None = None):
        """Run T steps for B sequences in u's dtype. u (B,T,d); s0 (B,N) or None (zero state).

        Returns (states (B,T,N), s_T (B,N)). Internally time-major: the input term W_in u + b of all
        steps is one GEMM into a (T,B,N) buffer, then `tanh_recurrence` runs the steps in place (one
        BLAS call and one tanh per step, no copies). The returned states are a (B,T,N) view.
        """
        W_T, W_in_T, bias = self._weights(u.dtype)
        B, T, d = u.shape
        states = torch.addmm(bias, u.transpose(0, 1).reshape(T * B, d), W_in_T).view(T, B, self.size)
        s = tanh_recurrence(states, s0.to(u.dtype) if s0 is not None else None, W_T, self.config.leak_rate)
        if s is None:  # T == 0
            s = s0 if s0 is not None else self.init_state(B, u.device, u.dtype)
        return states.transpose(0, 1), s

    @torch.no_grad()
    def step(self, u_t: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """One step: u_t (B,d), s (B,N) -> next state (B,N)."""
        return self.forward(u_t[:, None], s)[1]
