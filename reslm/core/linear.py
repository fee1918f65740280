"""Least squares in closed form, shared by the rc readout (reslm.train.ridge, `--optimizer ridge`) and
`reslm recall`'s linear decoders (reslm.scoring.recall).

    X = [x, 1]  (M, N+1)     features with a bias column; Y one-hot (never built: C gets Y's rows by index_add)
    G = X^T X, C = X^T Y     float64, summed over `add` calls (memory (N+1)^2, not M x N)
    W(alpha) = (G + lambda D)^-1 C   Cholesky; D = diag(1, ..., 1, 0) leaves the bias unpenalised;
                             lambda = alpha * mean(diag G[:N, :N]): alpha is relative to the mean feature power
    softmax(beta X W)        beta, the inverse temperature, fitted to minimise CE (fit_temperature): W fits
                             one-hot targets in the least-squares sense, and a softmax over them is far too flat
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from reslm.core.errors import ReslmError

CHUNK_ELEMS = 2 ** 24                             # rows x (N+1) of a float64 chunk (128 MiB)


class RidgeAccumulator:
    """G = X^T X and C = X^T Y of X = [features, 1] and one-hot Y, summed over `add` calls (float64)."""

    def __init__(self, n_features: int, n_classes: int, device=None):
        self.n_features, self.n_classes = n_features, n_classes
        self.G = torch.zeros(n_features + 1, n_features + 1, dtype=torch.float64, device=device)  # (N+1, N+1)
        self.Ct = torch.zeros(n_classes, n_features + 1, dtype=torch.float64, device=device)     # C^T (V, N+1)
        self.count = 0

    def add(self, x: torch.Tensor, y: torch.Tensor) -> "RidgeAccumulator":
        """Add samples x (M, N) (any float dtype) with targets y (M,) long, or (M, L): L targets per
        sample (classes of disjoint ranges: L decoders solved together, reslm.scoring.recall)."""
        if x.shape[0] != y.shape[0] or x.shape[1] != self.n_features:
            raise ReslmError(f"ridge: features {tuple(x.shape)} and targets {tuple(y.shape)} do not fit "
                             f"N = {self.n_features}")
        rows = max(1, CHUNK_ELEMS // (self.n_features + 1))
        for i0 in range(0, x.shape[0], rows):
            xc = x[i0:i0 + rows].to(device=self.G.device, dtype=torch.float64)
            xa = torch.cat([xc, xc.new_ones(xc.shape[0], 1)], dim=1)                 # (m, N+1)
            self.G.addmm_(xa.T, xa)
            for col in y[i0:i0 + rows].to(self.G.device).reshape(xa.shape[0], -1).T:
                self.Ct.index_add_(0, col, xa)                                   # row v += sum of x with target v
        self.count += x.shape[0]
        return self

    def __add__(self, other: "RidgeAccumulator") -> "RidgeAccumulator":
        out = RidgeAccumulator(self.n_features, self.n_classes, device=self.G.device)
        out.G, out.Ct, out.count = self.G + other.G, self.Ct + other.Ct, self.count + other.count
        return out

    def penalty(self, alpha: float) -> float:
        """lambda = alpha x the mean diagonal of G over the features (not the bias)."""
        return alpha * self.G.diagonal()[:-1].mean().item()

    def solve(self, alpha: float) -> torch.Tensor:
        """W (N+1, V) float64 minimising |X W - Y|^2 + lambda |W[:N]|^2 (the last row is the bias)."""
        if self.count == 0:
            raise ReslmError("ridge: no training samples to fit the readout on")
        A = self.G.clone()
        A.diagonal()[:-1] += self.penalty(alpha)
        L, info = torch.linalg.cholesky_ex(A)
        if info.item() != 0:
            raise ReslmError(f"ridge: X^T X + lambda I is not positive definite at alpha {alpha:g} "
                             f"(use a larger --ridge-alpha)")
        return torch.cholesky_solve(self.Ct.T.contiguous(), L)


def logits_of(W: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Readout outputs x (M, N) @ W[:N] + W[N] (M, V), in float32."""
    W = W.to(device=x.device, dtype=torch.float32)
    return torch.addmm(W[-1], x.float(), W[:-1])


def cross_entropy(z: torch.Tensor, y: torch.Tensor, beta: float) -> float:
    """Mean CE in nats of softmax(beta z) against y."""
    return F.cross_entropy(z * beta, y).item()


def fit_temperature(z: torch.Tensor, y: torch.Tensor, lo: float = 1e-3, hi: float = 1e4,
                    iters: int = 48) -> tuple[float, float]:
    """(beta, CE) minimising CE(softmax(beta z), y) by golden-section search over log beta in [lo, hi].
    CE is convex in beta (log-sum-exp of functions linear in beta, minus one), so it is unimodal in
    log beta too; 48 steps shrink the bracket to ~1e-9 of its log width."""
    g = (math.sqrt(5) - 1) / 2
    a, b = math.log(lo), math.log(hi)
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = cross_entropy(z, y, math.exp(c)), cross_entropy(z, y, math.exp(d))
    for _ in range(iters):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = cross_entropy(z, y, math.exp(c))
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = cross_entropy(z, y, math.exp(d))
    beta = math.exp((a + b) / 2)
    return beta, cross_entropy(z, y, beta)


__all__ = ["CHUNK_ELEMS", "RidgeAccumulator", "cross_entropy", "fit_temperature", "logits_of"]
