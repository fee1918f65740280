"""Reservoir -> Jaeger's linear short-term memory capacity (Jaeger 2001), measured on its states.

    MC = sum over delays k = 1..K of MC_k,   MC_k = r^2(z_{t-k}, y_k(t))

z_t is an i.i.d. scalar signal of unit variance (U(-sqrt 3, sqrt 3)) and y_k a linear readout of the
state x_t (x_t has read z_t) trained to give z_{t-k}; r^2 is the squared correlation on held-out
samples. A linear reservoir of N units has MC <= N, and a nonlinear one usually far less.

The reservoirs here read d-dimensional inputs (a character's fixed embedding, of norm about 1), so the
signal enters along a fixed random unit direction v of R^d: u_t = z_t v, a unit-variance input at the
scale of an embedded character. `channels` > 1 drives c independent signals along c orthonormal
directions at once, u_t = sum_c z_{t,c} v_c / sqrt(c) (the same input power), and sums MC over them (a
vector memory capacity, at most N as well; a delay's r^2 is then summed over the c signals, at most c);
channels = 1 is Jaeger's.

Protocol: `streams` independent sequences, each run from a zero state; the first `washout` steps of each
(at least K, so every delay's target exists) are dropped. Half the streams fit the readouts (ridge
regression in float64 on [x_t, 1], penalty alpha times the mean feature power), a quarter choose each
delay's penalty among ALPHAS (largest r^2), and the last quarter is scored. The estimate of a delay the
state does not hold is about 1 / (scored samples), so the sum over K delays is biased up by about
K / (scored samples). The input direction and signals come from generator(seed, CAPACITY_KEY).
"""
from __future__ import annotations

import math

import torch

from reslm.core.errors import ReslmError
from reslm.reservoir.seeding import generator

CAPACITY_KEY = 400                          # seeding key of the signals (apart from any matrix's)
ALPHAS = (1e-10, 1e-8, 1e-6, 1e-4, 1e-2)    # ridge penalties tried, relative to the mean feature power
TIME_CHUNK = 256                            # steps per forward call (the state is carried between calls)


@torch.no_grad()
def reservoir_states(reservoir, u: torch.Tensor, chunk: int = TIME_CHUNK) -> torch.Tensor:
    """(B, T, N) states of `reservoir` over u (B, T, d) from a zero state, computed `chunk` steps at a time."""
    out, s = [], None
    for t0 in range(0, u.shape[1], chunk):
        states, s = reservoir(u[:, t0:t0 + chunk], s)
        out.append(states.float().clone())
    return torch.cat(out, 1)


@torch.no_grad()
def memory_capacity(reservoir, *, max_delay: int = 200, fit: int | None = None, streams: int = 16,
                    washout: int | None = None, channels: int = 1, seed: int = 0,
                    dtype: torch.dtype = torch.float32, alphas=ALPHAS) -> dict:
    """Jaeger's linear memory capacity of `reservoir` (module doc) over delays 1..max_delay.

    fit: samples to fit the readouts (default max(20,000, 8 N)); the choosing and scoring quarters get
    half as many each. dtype: the precision the reservoir computes in (its inputs' dtype).
    Returns {capacity, delay0 (r^2 of the current input), r2 (per delay 1..K), alpha (per delay), fit,
    scored, channels, size, max_delay}."""
    N, d = reservoir.size, reservoir.input_dim
    if isinstance(max_delay, bool) or not isinstance(max_delay, int) or max_delay < 1:
        raise ReslmError(f"max_delay must be an integer >= 1, got {max_delay!r}")
    if streams < 4 or streams % 4:
        raise ReslmError(f"streams must be a multiple of 4 (half fit, a quarter chooses, a quarter scores), got {streams}")
    if not 1 <= channels <= d:
        raise ReslmError(f"channels must be in 1..{d} (the input's dimensions), got {channels}")
    fit = fit or max(20_000, 8 * N)
    washout = max(washout or 0, max_delay)
    per = math.ceil(fit / (streams // 2))                          # scored steps per stream
    g = generator(seed, CAPACITY_KEY)
    v, _ = torch.linalg.qr(torch.randn(d, channels, generator=g, dtype=torch.float64))   # (d, c) orthonormal
    z = (torch.rand(streams, washout + per, channels, generator=g, dtype=torch.float64) * 2 - 1) * math.sqrt(3)
    device = next((b.device for b in reservoir.buffers()), torch.device("cpu"))
    u = (z @ v.T) / math.sqrt(channels)                                    # E|u_t|^2 = 1 for any channels
    X = reservoir_states(reservoir, u.to(dtype).to(device))[:, washout:].double().cpu()   # (S, per, N)
    delays = range(0, max_delay + 1)
    idx = torch.arange(washout, washout + per)
    Y = torch.stack([z[:, idx - k] for k in delays], 2).reshape(streams, per, -1)   # (S, per, (K+1) c)
    X = torch.cat([X, X.new_ones(*X.shape[:2], 1)], 2)
    q = streams // 4
    parts = [(X[a:b].reshape(-1, N + 1), Y[a:b].reshape(-1, Y.shape[-1])) for a, b in
             ((0, 2 * q), (2 * q, 3 * q), (3 * q, streams))]
    (Xf, Yf), (Xv, Yv), (Xs, Ys) = parts
    G, XY = Xf.T @ Xf, Xf.T @ Yf
    power = torch.diagonal(G)[:N].mean().clamp_min(1e-300)
    best_val = torch.full((Y.shape[-1],), -1.0, dtype=torch.float64)
    best_score = torch.zeros(Y.shape[-1], dtype=torch.float64)
    best_alpha = torch.zeros(Y.shape[-1], dtype=torch.float64)
    eye = torch.eye(N + 1, dtype=torch.float64)
    for alpha in alphas:
        W = torch.linalg.solve(G + alpha * power * eye, XY)
        rv, rs = _r2(Xv @ W, Yv), _r2(Xs @ W, Ys)
        better = rv > best_val
        best_val = torch.where(better, rv, best_val)
        best_score = torch.where(better, rs, best_score)
        best_alpha = torch.where(better, torch.tensor(alpha, dtype=torch.float64), best_alpha)
    r2 = best_score.view(len(delays), channels).sum(1)          # per delay, summed over the channels
    alpha = best_alpha.view(len(delays), channels)[:, 0]
    return dict(capacity=float(r2[1:].sum()), delay0=float(r2[0]), r2=[float(x) for x in r2[1:]],
                alpha=[float(a) for a in alpha[1:]], fit=int(Xf.shape[0]), scored=int(Xs.shape[0]),
                channels=channels, size=N, max_delay=max_delay)


def _r2(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Squared correlation of each column of pred with the same column of target."""
    p, t = pred - pred.mean(0), target - target.mean(0)
    cov = (p * t).sum(0)
    return cov ** 2 / ((p * p).sum(0) * (t * t).sum(0)).clamp_min(1e-300)


def capacity_reach(r2: list[float], level: float = 0.5, channels: int = 1) -> int:
    """The last delay (1-based) whose MC_k, per signal (r2 / channels), is at least `level` (0: none): how far
    back the state holds the signal."""
    return max((k for k, x in enumerate(r2, 1) if x / channels >= level), default=0)
