"""Tokens -> reservoir states: the echo state network, the one reservoir engine of reslm.

    s_t = (1 - leak_rate) s_{t-1} + leak_rate tanh(W s_{t-1} + W_in u_t + b)        (paper eq. 1)

* W (N x N): U(-1, 1) entries, a fraction `density` non-zero, rescaled so that its spectral radius
  (radius_norm="spectral") or its largest singular value (radius_norm="singular") equals the
  `spectral_radius` field exactly.
* W_in (N x d): U(-1, 1) ("uniform") or N(0, 1) ("normal") entries (`input_init`), a fraction
  `input_density` non-zero, times input_scaling, and divided by sqrt(d) when input_scale_by_dim
  (then the pre-activation's scale does not grow with the input size d).
* b (N): U(-bias_scaling, bias_scaling); 0 = no bias.

The paper's character models use leak_rate = 1 and no bias; LAERC (models/laerc.py) builds one ESN
per block with its own radius, norm, input scaling and seed. Every matrix comes from its own
generator spawned from the seed (seeding.py), so changing the input density does not change W, and
the same seed always gives the same reservoir.

All weights are float32 buffers: they are saved with the model but never seen by the optimiser.

Precision (`dtype`): "input" computes in the dtype of u (what the character models and the bench
pass in); "auto" is float16 on CUDA and float32 on CPU; or a fixed "float32" | "bfloat16" |
"float16". Low-precision weight copies are cast once and cached (not saved; recast when the buffers
change). States come back in the compute dtype.

Kernels (`backend`): "loop" is `tanh_recurrence`, one GEMM + tanh per step in place, the reference;
"sigmoid" is the same loop with tanh(z) evaluated as 2 sigmoid(2z) - 1 in float32 on a CPU (the 2 is
the GEMM's alpha and beta, so one sigmoid pass and one affine pass replace torch.tanh, which costs
several sigmoids there; its error against torch.tanh: docs/design-figures.md); in other dtypes or on
a GPU it is loop. Where the step's float32 GEMM is large enough (ONEDNN_MIN_MACS), a CPU on which MKL
runs a generic path computes it through oneDNN instead (reslm.core.device.cpu_gemm). "blocked" is the
loop cut into blocks of BLOCK_ROWS sequences (GEMM then tanh per block, cache-resident); "rnn" is
`torch.rnn_tanh` (cuDNN's fused RNN on a GPU; it also runs on a CPU) and needs leak_rate = 1; "auto"
picks rnn on CUDA when leak_rate = 1, loop elsewhere on a GPU, and sigmoid on a CPU.

Gradients: the weights never get one, but when u (or s0) requires grad and grad mode is on, the
recurrence is recorded by autograd so that u gets a gradient through the reservoir (LAERC's
reservoir_grad, the authors' variant). Otherwise it runs under no_grad, in place.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields

import torch

from reslm.core.device import cpu_gemm
from reslm.core.errors import ReslmError
from reslm.core.progress import say
from reslm.reservoir.base import Reservoir, ReservoirConfig
from reslm.core.radii import radius_name
from reslm.reservoir.matrices import (DISTRIBUTIONS, RADIUS_NORMS, random_sparse, scale_radius,
                                      scale_spectral_radius, spectral_radius)
from reslm.reservoir.seeding import generator

DTYPES = ("input", "auto", "float32", "bfloat16", "float16")
BACKENDS = ("auto", "loop", "sigmoid", "blocked", "rnn")
BLOCK_ROWS = 256                      # the blocked backend's rows per GEMM + tanh
W_KEY, W_IN_KEY, BIAS_KEY = 0, 1, 2   # seeding keys: one generator per matrix

__all__ = ["ESN", "ESNConfig", "KNOBS", "ReservoirKnobs", "tanh_recurrence", "random_sparse", "spectral_radius", "scale_spectral_radius",
           "scale_radius"]


@dataclass
class ReservoirKnobs:
    """The reservoir knobs a character model sets (models/reservoir_lm.py inherits them): declared here
    once, with their defaults, and handed to whichever substrate's config has a field of the same name
    (ESNConfig has all of them). The defaults are tuned for short budgets (docs/design-figures.md)."""
    size: int = 750                 # N, reservoir units
    spectral_radius: float = 0.9    # radius of W after scaling: rho(W) or sigma_max(W), see radius_norm
    input_scaling: float = 2.0      # multiplies W_in (entries U(-1, 1))
    leak_rate: float = 1.0          # s <- (1-a) s + a tanh(...); 1 = no leak (paper)
    density: float = 1.0            # fraction of non-zero entries in W
    input_density: float = 1.0      # fraction of non-zero entries in W_in
    bias_scaling: float = 0.0       # b ~ U(-bias_scaling, bias_scaling); 0 = no bias (paper)
    seed: int = 0                   # the reservoir's seed: one generator per matrix (seeding.py)


KNOBS = tuple(f.name for f in fields(ReservoirKnobs))


@dataclass
class ESNConfig(ReservoirKnobs, ReservoirConfig):
    input_dim: int = 16             # d, input vector size (the char embedding)
    radius_norm: str = "spectral"   # "spectral": rho(W) = spectral_radius; "singular": largest singular value
    input_init: str = "uniform"     # W_in entries: "uniform" U(-1, 1) or "normal" N(0, 1)
    input_scale_by_dim: bool = False  # also divide W_in by sqrt(input_dim)
    dtype: str = "input"            # compute precision: input (u's dtype) | auto (float16 on CUDA, float32 on CPU) | float32 | bfloat16 | float16
    backend: str = "auto"           # loop (tanh_recurrence) | sigmoid (loop, tanh as 2 sigmoid(2z) - 1 on CPU fp32) | blocked (the loop in row blocks) | rnn (torch.rnn_tanh, cuDNN on CUDA) | auto (rnn on CUDA if no leak, sigmoid on CPU)

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
        for name, allowed in (("radius_norm", RADIUS_NORMS), ("input_init", DISTRIBUTIONS), ("dtype", DTYPES),
                              ("backend", BACKENDS)):
            if getattr(self, name) not in allowed:
                raise ReslmError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if not isinstance(self.input_scale_by_dim, bool):
            raise ReslmError(f"input_scale_by_dim must be true or false, got {self.input_scale_by_dim!r}")
        if self.backend == "rnn" and self.leak_rate != 1:
            raise ReslmError("the rnn backend (torch.rnn_tanh) has no leak; use backend loop or leak_rate 1")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ReslmError(f"seed must be a non-negative integer, got {self.seed!r}")


_MINUS_ONE = torch.tensor(-1.0)
ONEDNN_MIN_MACS = 2**20   # a step's multiply-adds (rows x N x N) from which its GEMM may go through oneDNN


def onednn_weight(t: torch.Tensor, W_T: torch.Tensor, rows: int) -> torch.Tensor | None:
    """W (W_T transposed, contiguous: the inner product's layout) where the step's GEMM of `rows` rows of
    `t` (a float32 CPU tensor) goes through oneDNN (reslm.core.device.cpu_gemm, said once), else None."""
    if t.device.type != "cpu" or t.dtype != torch.float32 or rows * W_T.shape[0] * W_T.shape[1] < ONEDNN_MIN_MACS:
        return None
    if cpu_gemm()[0] != "onednn":
        return None
    _say_gemm()
    return W_T.t().contiguous()


@functools.cache
def _say_gemm():
    say(f"reslm: the reservoir's float32 GEMM goes through oneDNN ({cpu_gemm()[1]})")


def _tanh_step(x: torch.Tensor, s: torch.Tensor | None, W_T: torch.Tensor, buf: torch.Tensor, via_sigmoid: bool,
               W: torch.Tensor | None = None):
    """x <- tanh(s W_T + x) (s None: tanh(x)), through the scratch `buf` of x's shape.

    via_sigmoid: tanh(z) = 2 sigmoid(2z) - 1, the 2z from the GEMM's alpha = beta = 2 (exact scaling).
    W (`onednn_weight`): the product s W^T comes from oneDNN's inner product, then the same tanh."""
    if W is not None and s is not None:
        z = torch.ops.mkldnn._linear_pointwise(s.contiguous(), W, None, "none", [], "").add_(x)
        if via_sigmoid:
            torch.add(_MINUS_ONE, z.mul_(2).sigmoid_(), alpha=2, out=x)
        else:
            torch.tanh(z, out=x)
        return
    if not via_sigmoid:
        if s is None:
            x.tanh_()
        else:
            torch.addmm(x, s, W_T, out=buf)
            torch.tanh(buf, out=x)
        return
    if s is None:
        torch.mul(x, 2, out=buf)
    else:
        torch.addmm(x, s, W_T, beta=2, alpha=2, out=buf)
    buf.sigmoid_()
    torch.add(_MINUS_ONE, buf, alpha=2, out=x)


def sigmoid_tanh_pays(t: torch.Tensor) -> bool:
    """Whether the "sigmoid" backend evaluates tanh as 2 sigmoid(2z) - 1 for `t` (float32 on a CPU)."""
    return t.dtype == torch.float32 and t.device.type == "cpu"


@torch.no_grad()
def tanh_recurrence(states: torch.Tensor, s: torch.Tensor | None, W_T: torch.Tensor,
                    leak_rate: float = 1.0, block_rows: int = 0,
                    scratch: torch.Tensor | None = None, via_sigmoid: bool = False) -> torch.Tensor | None:
    """The reservoir's hot loop, in place over a time-major buffer.

    states (T,B,N) holds the input term W_in u_t + b of every step on entry and the states on exit:
    s_t = (1-a) s_{t-1} + a tanh(s_{t-1} W_T + states[t]); s is s_{-1} (None = zero state). Each step is
    one addmm into a scratch buffer and its tanh written back into the step's own contiguous (B,N)
    slice (an in-place addmm_ into the slice was slower). Returns the last state (a view).

    block_rows > 0 cuts each step into row blocks of that many sequences: the GEMM of a block and the
    tanh of its (block_rows, N) result follow each other while the result is still in the cache
    (the "blocked" backend; the same arithmetic row by row, so the same states).
    `scratch`: a (>= rows, N) buffer to use instead of a new one.
    via_sigmoid: tanh as 2 sigmoid(2z) - 1 where `sigmoid_tanh_pays` (the "sigmoid" backend).
    The GEMM goes through oneDNN where `onednn_weight` says so (the same product, another library).
    """
    B = states.shape[1] if states.dim() == 3 else 0
    rows = block_rows if 0 < block_rows < B else B
    via_sigmoid = via_sigmoid and sigmoid_tanh_pays(states)
    if scratch is None:
        scratch = states.new_empty(rows, states.shape[-1]) if len(states) else None
    else:
        scratch = scratch[:rows]
    W = onednn_weight(states, W_T, rows) if len(states) else None
    for t in range(len(states)):
        x = states[t]                              # (B, N), holds W_in u_t + b
        for r0 in range(0, B, rows or 1):          # one block unless block_rows
            r1 = min(B, r0 + rows)
            _tanh_step(x[r0:r1], None if s is None else s[r0:r1], W_T, scratch[:r1 - r0], via_sigmoid, W)
        if leak_rate != 1.0:                       # leaky integration
            x.mul_(leak_rate)
            if s is not None:
                x.add_(s, alpha=1 - leak_rate)
        s = x
    return s


def _input_term(u2: torch.Tensor, W_in_T: torch.Tensor, bias: torch.Tensor,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """u2 W_in_T + bias for inputs u2 (rows, d), into `out` if given; through oneDNN where
    `onednn_weight` says so."""
    W_in = onednn_weight(u2, W_in_T, u2.shape[0]) if not u2.requires_grad else None
    if W_in is None:
        return torch.addmm(bias, u2, W_in_T, out=out)
    z = torch.ops.mkldnn._linear_pointwise(u2, W_in, bias, "none", [], "")
    return z if out is None else out.copy_(z)


def _recurrence_with_grad(inputs: torch.Tensor, s: torch.Tensor | None, W_T: torch.Tensor,
                          leak_rate: float) -> torch.Tensor:
    """tanh_recurrence out of place, so that autograd records it: inputs (T,B,N) -> states (T,B,N)."""
    out = []
    for x in inputs:                               # x (B, N) = W_in u_t + b
        h = torch.tanh(x if s is None else torch.addmm(x, s, W_T))
        if leak_rate != 1.0:
            h = leak_rate * h if s is None else leak_rate * h + (1 - leak_rate) * s
        out.append(h)
        s = h
    return torch.stack(out)


class ESN(Reservoir):
    """Fixed tanh reservoir. forward(u (B,T,d), s0 (B,N)) -> (states (B,T,N), s_T); step(u_t, s) -> s."""

    pure = True   # forward(u, s0) depends on its arguments only (window states share prefixes)

    def __init__(self, cfg: ESNConfig):
        super().__init__(cfg)
        N, d = cfg.size, cfg.input_dim
        if torch.empty(0).is_meta:  # shape-only construction (counting parameters): draw nothing
            W, W_in, b = torch.empty(N, N), torch.empty(N, d), torch.empty(N)
        else:
            W = random_sparse(N, N, cfg.density, generator(cfg.seed, W_KEY))
            W = scale_radius(W, cfg.spectral_radius, cfg.radius_norm, key=("esn", N, cfg.density, cfg.seed))
            W_in = random_sparse(N, d, cfg.input_density, generator(cfg.seed, W_IN_KEY), cfg.input_init)
            W_in *= cfg.input_scaling / (math.sqrt(d) if cfg.input_scale_by_dim else 1.0)
            b = torch.rand(N, generator=generator(cfg.seed, BIAS_KEY), dtype=torch.float64) * 2 - 1
            b *= cfg.bias_scaling
        # the name of W's radius in a run's records (reslm.reservoir.matrices.recorded_radii)
        self.radius_name = radius_name(cfg.radius_norm, ("esn", N, cfg.density, cfg.seed))
        # Stored transposed, so that the per-step product is a row-major (B, N) @ (N, N) GEMM.
        self.register_buffer("W_T", W.T.contiguous().float())        # (N, N)
        self.register_buffer("W_in_T", W_in.T.contiguous().float())  # (d, N)
        self.register_buffer("bias", b.float())                      # (N,)
        self._cast: tuple | None = None  # (key, low-precision weights); a plain attribute, never saved

    def init_state(self, batch: int, device=None, dtype=None) -> torch.Tensor:
        return torch.zeros(batch, self.size, device=device or self.W_T.device, dtype=dtype or self.W_T.dtype)

    def compute_dtype(self, device: torch.device, input_dtype: torch.dtype = torch.float32) -> torch.dtype:
        """The recurrence's precision for inputs of `input_dtype` on `device` (see ESNConfig.dtype)."""
        name = self.config.dtype
        if name == "input":
            return input_dtype
        if name == "auto":
            return torch.float16 if device.type == "cuda" else torch.float32
        return getattr(torch, name)

    def backend(self, device: torch.device) -> str:
        """The kernel on `device`: the config's, or for "auto" rnn on CUDA without leak, loop on other
        GPUs and sigmoid on a CPU (see ESNConfig.backend)."""
        if self.config.backend == "auto":
            if device.type == "cpu":
                return "sigmoid"
            return "rnn" if device.type == "cuda" and self.config.leak_rate == 1 else "loop"
        return self.config.backend

    def _weights(self, dtype: torch.dtype):
        """(W_T, W_in_T, bias) in `dtype`; low-precision copies are made once and cached, and made
        again when the buffers move or change (loading a checkpoint bumps their version)."""
        bufs = (self.W_T, self.W_in_T, self.bias)
        if dtype == self.W_T.dtype:
            return bufs
        key = (dtype, self.W_T.device, *((t.data_ptr(), t._version) for t in bufs))
        if self._cast is None or self._cast[0] != key:
            self._cast = (key, tuple(t.to(dtype) for t in bufs))
        return self._cast[1]

    def forward(self, u: torch.Tensor, s0: torch.Tensor | None = None, work: torch.Tensor | None = None):
        """Run T steps for B sequences. u (B,T,d); s0 (B,N) or None (zero state).

        Returns (states (B,T,N), s_T (B,N)) in the compute dtype. Loop backend, time-major: the input
        term W_in u + b of all steps is one GEMM into a (T,B,N) buffer, then `tanh_recurrence` runs
        the steps in place (one BLAS call and one tanh per step, no copies); the returned states are
        a (B,T,N) view. Autocast is off inside: the compute dtype is the config's, not autocast's.

        `work`: a contiguous tensor of at least (T+1)*B*N elements in the compute dtype to use as that
        buffer and the loop's (B,N) scratch (no gradient, loop backends). The states returned are then
        views of `work`, valid until
        it is reused: shard_states passes one buffer to every chunk, so that a chunk's buffer is not a
        fresh allocation (above glibc's mmap threshold every one was mapped and page-faulted anew).
        """
        B, T, d = u.shape
        dtype = self.compute_dtype(u.device, u.dtype)
        grad = torch.is_grad_enabled() and (u.requires_grad or (s0 is not None and s0.requires_grad))
        W_T, W_in_T, bias = self._weights(dtype)
        with torch.autocast(u.device.type, enabled=False):
            u = u.to(dtype)
            s0 = s0.to(dtype) if s0 is not None else None
            if T == 0:
                return u.new_zeros(B, 0, self.size), s0 if s0 is not None else self.init_state(B, u.device, dtype)
            if self.backend(u.device) == "rnn":
                h0 = (s0 if s0 is not None else u.new_zeros(B, self.size))[None]   # (1, B, N)
                params = [W_in_T.T, W_T.T, bias, torch.zeros_like(bias)]          # w_ih, w_hh, b_ih, b_hh
                with torch.set_grad_enabled(grad):
                    states, s = torch.rnn_tanh(u.transpose(0, 1), h0, params, True, 1, 0.0, grad, False, False)
                return states.transpose(0, 1), s[0]
            u2, N, scratch = u.transpose(0, 1).reshape(T * B, d), self.size, None
            if work is not None and not grad:
                if work.dtype != dtype or work.device != u.device or not work.is_contiguous() \
                        or work.numel() < (T + 1) * B * N:
                    raise ValueError(f"work buffer: need a contiguous {dtype} tensor of >= {(T + 1) * B * N} "
                                     f"elements on {u.device}")
                flat = work.view(-1)
                inputs = _input_term(u2, W_in_T, bias, out=flat[:T * B * N].view(T * B, N))
                scratch = flat[T * B * N:(T + 1) * B * N].view(B, N)
            else:
                inputs = _input_term(u2, W_in_T, bias)
            inputs = inputs.view(T, B, N)
            if grad:
                states = _recurrence_with_grad(inputs, s0, W_T, self.config.leak_rate)
            else:
                with torch.no_grad():
                    backend = self.backend(u.device)
                    tanh_recurrence(inputs, s0, W_T, self.config.leak_rate, BLOCK_ROWS if backend == "blocked" else 0,
                                    scratch, via_sigmoid=backend == "sigmoid")
                states = inputs
            return states.transpose(0, 1), states[-1]
