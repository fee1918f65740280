"""What updates the weights: the optimizers a run may name (`TrainConfig.optimizer`), the optimiser a
gradient run steps (`make_optimizer`) and its learning-rate schedule (`lr_at`).

    adam, adamw     gradient steps: make_optimizer, the lr of step k from lr_at
    ridge, lbfgs    SOLVERS: the rc readout fitted in one solve on the training shards (reslm.train.ridge,
                    reslm.train.lbfgs); the run's schedule is one step
"""
from __future__ import annotations

import math

import torch

from reslm import settings
from reslm.models.base import decay_groups
from reslm.train.lbfgs import fit_lbfgs
from reslm.train.ridge import fit_ridge

SOLVERS = {"ridge": fit_ridge, "lbfgs": fit_lbfgs}   # rc readouts fitted in one solve on the training shards
assert tuple(SOLVERS) == settings.SOLVERS   # the names a config may give (reslm.settings), each with its solver


def make_optimizer(model, tc, device: torch.device) -> torch.optim.Optimizer:
    """Adam over the trainable parameters, or AdamW with decay on linear weights only (`tc`: the run's
    TrainConfig). A model may give its own groups (`param_groups(weight_decay)`, e.g. a lower embedding
    lr as `lr_mult`)."""
    if tc.optimizer == "adam":
        groups = [dict(params=[p for p in model.parameters() if p.requires_grad])]
    else:
        groups = (model.param_groups(tc.weight_decay) if hasattr(model, "param_groups")
                  else decay_groups(model, tc.weight_decay))
    cls = torch.optim.Adam if tc.optimizer == "adam" else torch.optim.AdamW
    extra = {"fused": True} if device.type == "cuda" and tc.optimizer == "adamw" else {}
    opt = cls(groups, lr=tc.lr, betas=(tc.beta1, tc.beta2), **extra)
    for g in opt.param_groups:
        g.setdefault("lr_mult", 1.0)
    return opt


def lr_at(tc, step: int, total: int) -> float:
    """Learning rate of optimizer step `step` (0-based) of `total` under the TrainConfig `tc`'s schedule."""
    if tc.schedule == "constant":
        return tc.lr
    if step < tc.warmup_steps:
        return tc.lr * (step + 1) / tc.warmup_steps
    start = tc.warmup_steps + tc.hold_steps
    if step < start:
        return tc.lr
    progress = min(1.0, (step - start) / max(1, total - start))
    floor = tc.lr * tc.min_lr_frac
    return floor + (tc.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def put_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    """The learning rate `lr` into every group of `opt`, times the group's lr_mult."""
    for g in opt.param_groups:
        g["lr"] = lr * g["lr_mult"]


def set_lr(opt: torch.optim.Optimizer, tc, step: int, total: int) -> float:
    """Step `step`'s learning rate (lr_at) into `opt`'s groups (put_lr); returns it, for the step's log row."""
    lr = lr_at(tc, step, total)
    put_lr(opt, lr)
    return lr
