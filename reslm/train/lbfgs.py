"""Training: the rc family's linear readout solved to its cross-entropy optimum, `--optimizer lbfgs`.

The readout of a fixed reservoir is multinomial logistic regression on the (normalised) states, a
convex problem; Adam at the paper's 1e-4 only approaches its optimum. Here it is solved directly:

    X (M, D)   features of `lbfgs_samples` training samples, drawn at random (seeded) in equal parts
               from each training shard's training part and kept in memory (D = N, or N + V / N + d
               with head_input: reslm.models.reservoir_lm)
    minimise   mean CE(X W^T + b, y) + lambda / 2 |W|^2       full batch, torch.optim.LBFGS with a
                                                                strong-Wolfe line search, at most
                                                                `lbfgs_iters` iterations per lambda
    lambda     `lbfgs_l2`, or each of L2_GRID from the largest down, every solve warm-started from the
               previous one; the lambda with the lowest CE on the held-out tails of the training shards
               (CharShards(holdout=...), up to `ridge_heldout_samples` of them, evenly spread) wins

The test shard is never read while fitting. W and b are written into the model's linear head, so the
run is an ordinary rc run (eval, generate and resume read it as any other), as with reslm.train.ridge.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from reslm.core.errors import ReslmError
from reslm.core.metrics import HELDOUT_LOSS, LBFGS_TRAIN_LOSS, TRAIN_LOSS
from reslm.core.progress import say
from reslm.reservoir.seeding import child_seed
from reslm.train.ridge import _spread

L2_GRID = (1e-3, 1e-4, 1e-5, 1e-6)   # lambdas tried, largest first, when lbfgs_l2 = 0
LBFGS_KEY = 101                       # seeding key of the training-sample draw (train.TRAIN_KEY is 100)


def solve(X: torch.Tensor, y: torch.Tensor, W: torch.Tensor, b: torch.Tensor, l2: float, iters: int) -> int:
    """Minimise mean CE(X W^T + b, y) + l2 / 2 |W|^2 over W (V, D) and b (V,), in place, with full-batch
    L-BFGS for at most `iters` iterations; returns the number of objective evaluations."""
    W.requires_grad_(True)
    b.requires_grad_(True)
    opt = torch.optim.LBFGS([W, b], lr=1.0, max_iter=iters, max_eval=2 * iters, history_size=20,
                            tolerance_grad=1e-9, tolerance_change=1e-12, line_search_fn="strong_wolfe")
    evals = 0

    def closure():
        nonlocal evals
        evals += 1
        opt.zero_grad()
        loss = F.cross_entropy(torch.addmm(b, X, W.T), y) + 0.5 * l2 * W.pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    W.requires_grad_(False)
    b.requires_grad_(False)
    return evals


def ce(X: torch.Tensor, y: torch.Tensor, W: torch.Tensor, b: torch.Tensor) -> float:
    """Mean CE in nats of the readout (W, b) on (X, y)."""
    with torch.no_grad():
        return F.cross_entropy(torch.addmm(b, X, W.T), y).item()


def gather(source, tc) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(X, y) of the training samples and (Xh, yh) of the held-out ones (see the module doc), float32,
    and the number of held-out samples there were in all."""
    shards = list(source.ds.train_shards)
    per = max(1, math.ceil(tc.lbfgs_samples / len(shards)))
    keep = max(1, math.ceil(tc.ridge_heldout_samples / len(shards)))
    xs, ys, xh, yh, held = [], [], [], [], 0
    for shard in shards:
        feats = source.train_features(shard)
        gen = torch.Generator().manual_seed(child_seed(tc.seed, LBFGS_KEY, shard))
        idx = torch.randperm(len(feats), generator=gen)[:per].sort().values.to(feats.targets.device)
        xs.append(feats.batch(idx).float())
        ys.append(feats.targets[idx])
        feats = source.heldout_features(shard)
        idx = _spread(len(feats), keep, feats.targets.device)
        xh.append(feats.batch(idx).float())
        yh.append(feats.targets[idx])
        held += len(feats)
        del feats
    return torch.cat(xs), torch.cat(ys), torch.cat(xh), torch.cat(yh), held


def fit_lbfgs(model, source, tc, *, log=None, progress: bool = False) -> dict:
    """Solve the rc model's linear readout for minimum cross-entropy on cached training features (see
    the module doc) and write it into model.head. `source` is a CharShards built with holdout; only
    its training shards are read. Returns lambda, held-out and training CE and sample counts; with
    `log`, one "lbfgs" row per lambda tried."""
    head = model.head
    if not isinstance(head, torch.nn.Linear):
        raise ReslmError("the lbfgs readout needs a linear head (the rc family with --head linear)")
    X, y, Xh, yh, held = gather(source, tc)
    if len(yh) == 0:
        raise ReslmError("lbfgs: the held-out slice has no samples (raise --holdout or --shard-chars)")
    W = torch.zeros(head.out_features, head.in_features, device=X.device)
    b = torch.zeros(head.out_features, device=X.device)
    tried, best = [], None
    for l2 in ((tc.lbfgs_l2,) if tc.lbfgs_l2 > 0 else L2_GRID):
        evals = solve(X, y, W, b, l2, tc.lbfgs_iters)
        row = dict(l2=l2, **{TRAIN_LOSS: ce(X, y, W, b), HELDOUT_LOSS: ce(Xh, yh, W, b)}, evaluations=evals)
        tried.append(row)
        if log is not None:
            log.write(dict(kind="lbfgs", **row))
        say(f"lbfgs: l2 {l2:.0e}  train CE {row[TRAIN_LOSS]:.4f}  held-out CE {row[HELDOUT_LOSS]:.4f} nats "
            f"({evals} evaluations)", enabled=progress)
        if best is None or row[HELDOUT_LOSS] < best[0][HELDOUT_LOSS]:
            best = (row, W.clone(), b.clone())
    row, W, b = best
    with torch.no_grad():
        head.weight.copy_(W.to(head.weight.dtype))
        head.bias.copy_(b.to(head.bias.dtype))
    return dict(lbfgs_l2=row["l2"], **{HELDOUT_LOSS: row[HELDOUT_LOSS], LBFGS_TRAIN_LOSS: row[TRAIN_LOSS]},
                fit_samples=len(y), heldout_samples=held, heldout_scored=len(yh))


__all__ = ["L2_GRID", "solve", "fit_lbfgs"]
