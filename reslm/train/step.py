"""The one optimiser step of reslm (reslm.train.loop's training loop and reslm.bench both call it):
gradients of a forward's loss summed over micro-batches under autocast and the loss scaler, clipping,
the finite check, the optimiser step and the EMA of the weights."""
from __future__ import annotations

import contextlib

import torch

from reslm.core.device import autocast
from reslm.core.errors import ReslmError
from reslm.train.ema import EMA
from reslm.train.optim import put_lr


def _finite(loss: torch.Tensor, params) -> bool:
    """Whether the loss and every gradient element are finite, read back with one device sync (the
    max-abs norm of each gradient, a multi-tensor kernel: NaN and inf propagate, nothing overflows)."""
    grads = [p.grad for p in params if p.grad is not None]
    norms = torch._foreach_norm(grads, float("inf")) if grads else []
    return bool(torch.isfinite(torch.stack([loss.float().reshape(()), *[n.float() for n in norms]])).all())


def _by_samples(micro) -> tuple[list[float], int]:
    n = sum(y.numel() for _, y in micro)
    return [y.numel() / n for _, y in micro], n


def train_step(forward, micro: list, opt: torch.optim.Optimizer, scaler, *, lr: float | None = None,
               precision: str = "fp32", device: torch.device | None = None, grad_clip: float = 0.0, weights=None, ddp=None,
               ema: EMA | None = None, step: int = 0, params: list | None = None) -> tuple[torch.Tensor, int]:
    """One optimiser step, the only one in reslm (the training loop and the bench both call it):
    `lr` into every group (times its lr_mult; None: the groups' own, as optim.set_lr left them),
    gradients of forward(x, y)'s loss summed over the micro-batches `micro` [(x, y), ...] under
    autocast(precision) and the (fp16) loss scaler, global norm clipping at grad_clip (0: none), a
    non-finite loss or gradient -> ReslmError, opt.step, and the EMA of the weights updated to step + 1.
    `params`: the parameters to clip and check, in the order whose norm the run has always summed
    (default: the optimiser's).

    weights: micro -> (each micro-batch's share of the step's loss, the step's weight), a sampler's
    `weights` (reslm.train.batches); default: shares by sample count, weight = samples (characters). `ddp`: the DistributedDataParallel wrapper that
    `forward` is, so that only the last micro-batch all-reduces its gradients. Returns the step's
    loss (the weighted mean, a detached 0-dim tensor) and its weight."""
    device = device or torch.device("cpu")
    if lr is not None:
        put_lr(opt, lr)
    opt.zero_grad(set_to_none=True)
    shares, n_step = (weights or _by_samples)(micro)
    step_loss = torch.zeros((), device=device)
    for i, (x, y) in enumerate(micro):
        weight = shares[i]
        sync = contextlib.nullcontext() if ddp is None or i == len(micro) - 1 else ddp.no_sync()
        with sync:
            with autocast(precision, device):
                _, loss = forward(x, y)
            scaler.scale(loss * weight).backward()
        step_loss += loss.detach().float() * weight
    params = params if params is not None else [p for g in opt.param_groups for p in g["params"]]
    if grad_clip > 0:
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
    if not scaler.is_enabled() and not _finite(step_loss, params):
        g = opt.param_groups[0]
        raise ReslmError(f"non-finite loss or gradient at step {step + 1} (lr {g['lr'] / g['lr_mult']:.3g}); stopped, the last "
                         f"checkpoint is kept: lower --lr, add --grad-clip, or check the inputs")
    scaler.step(opt)
    scaler.update()
    if ema is not None:
        ema.update(step + 1)
    return step_loss, n_step
