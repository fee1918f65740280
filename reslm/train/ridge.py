"""Training: the closed-form (ridge regression) readout of the rc family, `--optimizer ridge`.

The rc readout is linear, so instead of Adam on cross-entropy it can be solved in one pass
(reservoirpy's Ridge: accumulate, then solve; the sums and the solve are reslm.core.linear's):

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

from reslm.core.errors import ReslmError
from reslm.core.linear import RidgeAccumulator, fit_temperature, logits_of
from reslm.core.metrics import HELDOUT_LOSS
from reslm.core.progress import say

ALPHAS = tuple(10.0 ** k for k in range(-8, 1))   # the log grid alpha is chosen from (ridge_alpha = 0)


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


__all__ = ["ALPHAS", "fit_ridge"]
