"""Training: the closed-form (ridge regression) readout of the rc family, `--optimizer ridge`.

The rc readout is linear, so instead of Adam on cross-entropy it can be solved in one pass
(reservoirpy's Ridge: accumulate, then solve):

    X = [norm(r_t), 1]   (M, N+1)     the model's features (CharShards, one training shard at a time)
    Y = onehot(c_t+1)    (M, V)       never built: C gets Y's rows by index_add
    G = X^T X, C = X^T Y              float64, summed over the shards: memory (N+1)^2, not M x N
    W(alpha) = (G + lambda D)^-1 C    Cholesky; D = diag(1, ..., 1, 0) leaves the bias unpenalised;
                                      lambda = alpha * mean(diag G[:N, :N]), so alpha is relative to
                                      the mean feature power (unit scale for the layer-normalised states)
    logits = beta * X W               W fits the one-hot targets in the least-squares sense; a softmax
                                      over its near-probability outputs is far too flat, so beta (the
                                      inverse temperature, 1 / T) is fitted to minimise held-out CE

Choosing alpha never reads the test shard: the last `holdout` fraction of each training shard's
characters is held out (CharShards(holdout=...)); W(alpha) is solved on the rest for every alpha of
ALPHAS (or the fixed `ridge_alpha`), beta is fitted on up to `ridge_heldout_samples` held-out samples
(evenly spread over the shards), and the alpha with the lowest held-out CE wins. With `ridge_refit`
(default) W is then solved again with that alpha on all the training samples (held-out included), and
the temperature fitted on the held-out slice is kept: it was fitted with a model that had not seen
those samples, which is what the test shard is to the final one. beta * W is written into the head,
so the run is an ordinary rc run (eval, generate, resume read it as any other).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from reslm.core.errors import ReslmError
from reslm.core.metrics import HELDOUT_LOSS
from reslm.core.progress import say

ALPHAS = tuple(10.0 ** k for k in range(-8, 1))   # the log grid alpha is chosen from (ridge_alpha = 0)
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
        sample (classes of disjoint ranges: L decoders solved together, reslm.recall)."""
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


def _spread(n: int, k: int, device) -> torch.Tensor:
    """min(n, k) indices evenly spread over range(n)."""
    if k >= n:
        return torch.arange(n, device=device)
    return torch.div(torch.arange(k, device=device) * n, k, rounding_mode="floor")


@torch.no_grad()
def fit_ridge(model, source, tc, *, log=None, progress: bool = False) -> dict:
    """Solve the rc model's readout in closed form over `source`'s training shards (see the module
    doc) and write beta * W into model.head. `source` is a CharShards built with holdout=tc.holdout;
    only its training shards are read. Returns alpha, temperature, held-out CE and sample counts;
    with `log`, one "ridge" row per alpha tried."""
    head = model.head
    if not isinstance(head, torch.nn.Linear):
        raise ReslmError("the ridge readout needs a linear head (the rc family)")
    N, V = head.in_features, head.out_features
    device = head.weight.device
    fit, held = RidgeAccumulator(N, V, device), RidgeAccumulator(N, V, device)
    shards = list(source.ds.train_shards)
    keep = max(1, math.ceil(tc.ridge_heldout_samples / len(shards)))
    kept_x, kept_y = [], []
    for shard in shards:
        feats = source.train_features(shard)                 # (M, N) normalised states, (M,) targets
        fit.add(feats.inputs, feats.targets)
        feats = source.heldout_features(shard)
        held.add(feats.inputs, feats.targets)
        idx = _spread(len(feats), keep, feats.targets.device)
        kept_x.append(feats.inputs[idx].float())
        kept_y.append(feats.targets[idx])
        del feats
    x_ho, y_ho = torch.cat(kept_x), torch.cat(kept_y)   # (H, N), (H,)
    if len(y_ho) == 0:
        raise ReslmError("ridge: the held-out slice has no samples (raise --holdout or --shard-chars)")
    tried = []
    for alpha in ((tc.ridge_alpha,) if tc.ridge_alpha > 0 else ALPHAS):
        beta, ce = fit_temperature(logits_of(fit.solve(alpha), x_ho), y_ho)
        tried.append(dict(alpha=alpha, temperature=1 / beta, **{HELDOUT_LOSS: ce}))
        if log is not None:
            log.write(dict(kind="ridge", **tried[-1]))
        say(f"ridge: alpha {alpha:.0e}  temperature {1 / beta:.4g}  held-out CE {ce:.4f} nats", enabled=progress)
    best = min(tried, key=lambda r: r[HELDOUT_LOSS])
    W = (fit + held if tc.ridge_refit else fit).solve(best["alpha"])
    beta = 1 / best["temperature"]
    head.weight.copy_((beta * W[:-1].T).to(head.weight.dtype))   # (V, N)
    head.bias.copy_((beta * W[-1]).to(head.bias.dtype))          # (V,)
    return dict(ridge_alpha=best["alpha"], temperature=best["temperature"], **{HELDOUT_LOSS: best[HELDOUT_LOSS]},
                fit_samples=fit.count + (held.count if tc.ridge_refit else 0), heldout_samples=held.count,
                heldout_scored=len(y_ho))


__all__ = ["ALPHAS", "RidgeAccumulator", "logits_of", "fit_temperature", "fit_ridge"]
