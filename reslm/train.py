"""Stage 5, training: one loop for every family; only the batch source differs.

    for step in 0..total-1:
        lr(step)                                   constant (chars) or warmup-hold-cosine (tokens)
        grad_accum micro-batches from the source   drawn from a generator seeded by step_seed(seed, .)
        Adam / AdamW step (clipping, fp16 loss scaling), non-finite loss or gradient -> stop
        at the source's evaluation points: evaluate, log, checkpoint (atomically)

The batch source is the family's sampler (reslm.batches: `CharShards`, the paper's shard-cyclic
character protocol; `TokenWindows`, random token windows, Appendix A.3 and TOKEN_TRAIN in reslm.models).
It gives the schedule, the micro-batches and their weights, and the held-out evaluation, so the loop
has no branch on the kind of data. TrainConfig fields that only one kind uses carry it in their field
metadata (`data_fields`), from which the CLI hides the other kind's flags.

The rc family's readout can instead be solved in closed form (`optimizer="ridge"`, reslm.ridge; or to
its cross-entropy optimum by full-batch L-BFGS, `optimizer="lbfgs"`, reslm.lbfgs): one
pass over the training shards' features, alpha and the softmax temperature chosen on held-out tails of
the training shards, then the same test evaluation, checkpoint and summary as an Adam run.

Dropout is seeded per step, so a run resumed from any checkpoint is the same computation as an
uninterrupted one (bitwise, on the same machine). Under `torchrun --nproc_per_node=K` (token families)
each step's windows are drawn as in one process and rank r trains on its 1/K of the rows; only rank 0
writes. The run directory (reslm.run) is the interface to everything after training.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import shutil
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch

import reslm
from reslm.core import distributed as dist_
from reslm.batches import SAMPLERS, SOLVERS as _SOLVER_NAMES, CharShards, step_seed
from reslm.core.device import (PRECISIONS, autocast, grad_scaler, pick_device, resolve_precision, setup_cuda, state_dtype,
                          synchronize)
from reslm.ema import EMA, checkpoint_weights
from reslm.features import estimate_loss, feature_batches
from reslm.core.errors import ReslmError
from reslm.models import complete_fields, family, make_config
from reslm.models.budget import check_frontier
from reslm.models.base import bits, config_dict, count_params, decay_groups
from reslm.models.laerc import AUTHORS_TRAIN, AUTHORS_VARIANT
from reslm.core.progress import bar as progress_bar
from reslm.core.progress import say
from reslm.lbfgs import fit_lbfgs
from reslm.ridge import fit_ridge
from reslm.core.files import read_json, write_json
from reslm.run import (CONFIG, SUMMARY, MetricsLog, check_same_run, create_run_dir, load_checkpoint, lock_run, read_config,
                       read_metrics, save_checkpoint)
from reslm.models.load import check_dataset, describe_dataset, load_model, open_dataset

OPTIMIZERS = ("adam", "adamw", "ridge", "lbfgs")
SOLVERS = {"ridge": fit_ridge, "lbfgs": fit_lbfgs}   # rc readouts fitted in one solve on the training shards
assert set(SOLVERS) == set(_SOLVER_NAMES)
SCHEDULES = ("constant", "cosine")
CHECKPOINT_SECONDS = 600.0   # a checkpoint between evaluations after this much training (train())
STATES = "states"            # RUN/states: train(cache_states=True)'s feature cache (StateCache)


_CHARS = {"data": "chars"}     # field metadata: a training field that only this kind of data uses
_TOKENS = {"data": "tokens"}


@dataclass
class TrainConfig:
    # optimiser and schedule (family defaults: reslm.models CHAR_TRAIN / TOKEN_TRAIN)
    optimizer: str = "adam"         # adam (paper, characters) | adamw (token level) | ridge (rc: closed-form readout, reslm.ridge) | lbfgs (rc: the linear readout's CE optimum, reslm.lbfgs)
    lr: float = 1e-4                # (peak) learning rate
    beta1: float = 0.9
    beta2: float = 0.999
    weight_decay: float = 0.0       # adamw: on linear weight matrices only
    grad_clip: float = 0.0          # max global gradient norm; 0 = no clipping
    schedule: str = "constant"      # constant | cosine (linear warmup, hold, cosine to lr * min_lr_frac)
    warmup_steps: int = 0           # cosine: linear warmup steps
    hold_steps: int = 0             # cosine: steps at the peak lr after warmup
    min_lr_frac: float = 0.1        # cosine: floor = lr * min_lr_frac
    # batches
    batch_size: int = 1024          # samples (characters) or windows (tokens) per optimizer step
    grad_accum: int = 1             # micro-batches the step is split into (tokens: each batch_size windows)
    # character protocol (rc, aerc, tf)
    epochs_per_shard: int = field(default=5, metadata=_CHARS)  # E: epochs on a shard before the next (paper)
    cycles: int = field(default=1, metadata=_CHARS)  # C: passes over the training shards
    epoch_samples: int = field(default=0, metadata=_CHARS)  # samples per shard-epoch, a fresh random subset each time; 0 = all
    shard_chars: int = field(default=0, metadata=_CHARS)  # use only the first K characters of each training shard; 0 = all
    eval_samples: int = field(default=0, metadata=_CHARS)  # test samples per evaluation (8 evenly spread blocks); 0 = whole test shard
    state_dtype: str = field(default="float32", metadata=_CHARS)  # reservoir states: float32 | bfloat16 | auto (float32 when it fits in memory)
    # closed-form readout (rc with optimizer ridge) and `reslm search`
    holdout: float = 0.1            # ridge, lbfgs and search: the last fraction of each training shard held out (chooses alpha and the temperature; the search objective); adam trains on all of it unless heldout_eval
    heldout_eval: bool = False      # characters, adam/adamw: train without the held-out tails (holdout) and evaluate on them, never reading the test shard (`reslm search`'s objective)
    ridge_alpha: float = 0.0        # ridge: penalty relative to the mean state power; 0 = the best of 1e-8..1 on the held-out slice
    ridge_refit: bool = True        # ridge: solve again on all training samples (held-out included) with the chosen alpha
    ridge_heldout_samples: int = 65536  # ridge and lbfgs: held-out samples (evenly spread) that score each alpha (lambda) and fit the temperature
    lbfgs_samples: int = 262144     # lbfgs: training samples (random, equal parts per shard) kept in memory and fitted full-batch
    lbfgs_iters: int = 100          # lbfgs: L-BFGS iterations per L2 penalty
    lbfgs_l2: float = 0.0           # lbfgs: L2 penalty on W; 0 = the best of 1e-3..1e-6 on the held-out slice
    # token level (laerc, gpt)
    max_steps: int = field(default=1000, metadata=_TOKENS)  # optimizer steps in all
    eval_every: int = field(default=100, metadata=_TOKENS)  # steps between evaluations (+ checkpoints)
    eval_batches: int = field(default=20, metadata=_TOKENS)  # val batches of batch_size windows per evaluation
    # bookkeeping
    log_every: int = 100            # steps between "step" rows in metrics.jsonl
    seed: int = 0                   # shuffling, batch draws and dropout
    device: str = "auto"            # auto | cpu | cuda | cuda:N
    precision: str = "auto"         # auto | fp32 | bf16 | fp16
    threads: int = 0                # torch CPU threads; 0 = torch's default
    ema: float = 0.0                # decay of an EMA of the weights (reslm.ema) used for evaluation and the saved model; 0 = off

    def validate(self) -> "TrainConfig":
        for f in fields(self):
            v = getattr(self, f.name)
            want = type(f.default)
            if want is float and isinstance(v, int) and not isinstance(v, bool):
                v = float(v)
                setattr(self, f.name, v)
            if type(v) is not want:
                raise ReslmError(f"{f.name} must be of type {want.__name__}, got {v!r}")
            if want is float and not math.isfinite(v):
                raise ReslmError(f"{f.name} must be a finite number, got {v!r}")
        for name in ("lr", "batch_size", "grad_accum", "epochs_per_shard", "cycles", "max_steps", "eval_every",
                     "eval_batches", "log_every"):
            if not getattr(self, name) > 0:
                raise ReslmError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.lr > 10:
            raise ReslmError(f"lr {self.lr:g} is not a usable learning rate (> 10)")
        for name in ("warmup_steps", "hold_steps", "epoch_samples", "shard_chars", "eval_samples", "threads",
                     "seed", "weight_decay", "grad_clip"):
            if getattr(self, name) < 0:
                raise ReslmError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ReslmError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if not 0 < self.holdout < 1:
            raise ReslmError(f"holdout must be in (0, 1), got {self.holdout}")
        if self.ridge_alpha < 0 or self.ridge_heldout_samples < 1:
            raise ReslmError(f"ridge_alpha must be >= 0 and ridge_heldout_samples >= 1, got {self.ridge_alpha} and "
                             f"{self.ridge_heldout_samples}")
        if not 0 <= self.ema < 1:
            raise ReslmError(f"ema must be in [0, 1) (a decay such as 0.999; 0 = off), got {self.ema}")
        if self.ema and self.optimizer in SOLVERS:
            raise ReslmError(f"ema averages gradient-trained weights; optimizer {self.optimizer} solves the readout "
                             "in one step")
        if self.lbfgs_samples < 1 or self.lbfgs_iters < 1 or self.lbfgs_l2 < 0:
            raise ReslmError(f"lbfgs_samples and lbfgs_iters must be >= 1 and lbfgs_l2 >= 0, got {self.lbfgs_samples}, "
                             f"{self.lbfgs_iters} and {self.lbfgs_l2}")
        if not 0 <= self.min_lr_frac <= 1:
            raise ReslmError(f"min_lr_frac must be in [0, 1], got {self.min_lr_frac}")
        for name, allowed in (("optimizer", OPTIMIZERS), ("schedule", SCHEDULES), ("precision", PRECISIONS)):
            if getattr(self, name) not in allowed:
                raise ReslmError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if self.state_dtype != "auto":
            state_dtype(self.state_dtype)
        return self


def data_fields(kind: str | None = None) -> tuple[str, ...]:
    """TrainConfig fields that only one kind of data uses (their metadata says which): those of
    `kind`, or with kind None all of them. The CLI hides another kind's fields from a family's flags."""
    return tuple(f.name for f in fields(TrainConfig) if f.metadata.get("data") and kind in (None, f.metadata["data"]))


def train_config(family_name: str, **overrides) -> TrainConfig:
    """TrainConfig with the family's defaults, then `overrides`, validated."""
    unknown = sorted(set(overrides) - {f.name for f in fields(TrainConfig)})
    if unknown:
        raise ReslmError(f"unknown training option(s): {', '.join(unknown)}")
    return TrainConfig(**{**family(family_name).train, **overrides}).validate()


def authors_variant(model_overrides: dict, train_overrides: dict) -> tuple[dict, dict]:
    """Model and training overrides for the authors' released LAERC (laerc.AUTHORS_VARIANT and
    AUTHORS_TRAIN: lr 4e-4, warmup 1% and hold 10% of the steps), under the user's own overrides."""
    steps = train_config("laerc", **train_overrides).max_steps
    train = dict(lr=AUTHORS_TRAIN["lr"], warmup_steps=round(AUTHORS_TRAIN["warmup_frac"] * steps),
                 hold_steps=round(AUTHORS_TRAIN["hold_frac"] * steps))
    return {**AUTHORS_VARIANT, **model_overrides}, {**train, **train_overrides}


def run_train_config(cfg: dict) -> TrainConfig:
    """The TrainConfig a run config holds (ReslmError on unknown or mistyped fields)."""
    unknown = sorted(set(cfg["train"]) - {f.name for f in fields(TrainConfig)})
    if unknown:
        raise ReslmError(f"the run config has unknown training field(s): {', '.join(unknown)}")
    return TrainConfig(**cfg["train"]).validate()



def lr_at(tc: TrainConfig, step: int, total: int) -> float:
    """Learning rate of optimizer step `step` (0-based) of `total`."""
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


def sampler_for(family_name: str) -> type:
    """The batch sampler class of a family (reslm.batches.SAMPLERS, by the kind of data it reads)."""
    return SAMPLERS[family(family_name).data]


# --- creating a run --------------------------------------------------------------------------------
def make_run_config(family_name: str, model_overrides: dict, train_overrides: dict, dataset,
                    preset: str | None = None) -> dict:
    """Resolve and validate everything a run needs, before anything is written."""
    sampler = sampler_for(family_name)
    data = describe_dataset(dataset)
    if data["kind"] != sampler.kind:
        raise ReslmError(f"family {family_name} trains on {sampler.kind} datasets; {dataset.name} holds {data['kind']} "
                         f"(make one with `{sampler.make_data}`)")
    vocab = dataset.vocab_size
    if model_overrides.get("vocab_size", vocab) != vocab:
        raise ReslmError(f"vocab_size {model_overrides['vocab_size']} does not match the dataset's {vocab}")
    model_cfg = make_config(family_name, **{**model_overrides, "vocab_size": vocab})
    tc = train_config(family_name, **train_overrides)
    sampler.check_run(family_name, dataset, model_cfg, tc)
    return dict(family=family_name, preset=preset, model=asdict(model_cfg), train=asdict(tc),
                data=data,
                versions=dict(reslm=reslm.__version__, torch=torch.__version__))


def create_run(out: Path, family_name: str, model_overrides: dict, train_overrides: dict, dataset,
               preset: str | None = None) -> Path:
    """Validate, then create the run directory (config.json only). Under torchrun, rank 0 creates it and
    the other ranks wait for it (and fail with rank 0's error when it could not be made)."""
    _, world, _ = dist_.init(str(train_overrides.get("device", "auto")))
    if world == 1:
        return create_run_dir(Path(out), make_run_config(family_name, model_overrides, train_overrides, dataset, preset))
    err = None
    if dist_.is_main():
        try:
            create_run_dir(Path(out), make_run_config(family_name, model_overrides, train_overrides, dataset, preset))
        except Exception as e:  # tell the other ranks before raising
            err = e
    if not dist_.all_ok(err is None):
        if err is not None:
            raise err
        raise ReslmError(f"rank 0 could not create the run directory {out}")
    return Path(out)


def ensure_run(out: Path, family_name: str, model_overrides: dict, train_overrides: dict, dataset,
               preset: str | None = None) -> str:
    """Create the run, or check that the one in `out` is the same model and budget (a character run
    asked for more cycles grows: grow_cycles). Returns what is to be done: "starting", "resuming",
    "resuming to K cycles" or "done" (demo, reproduce and sweep skip finished runs with it)."""
    cfg = make_run_config(family_name, model_overrides, train_overrides, dataset, preset)
    if (Path(out) / CONFIG).is_file():
        have = read_config(out)["train"].get("cycles", 1)   # more cycles than the run has: it grows
        cycles = min(have, cfg["train"]["cycles"])
        check_same_run(out, {**cfg, "train": {**cfg["train"], "cycles": cycles}}, defaults=asdict(TrainConfig()),
                       model_defaults=config_dict(family(family_name).config()), current=lambda m: complete_fields(family_name, m))
        grown = grow_cycles(out, cfg["train"]["cycles"])
        return "done" if is_finished(out) else f"resuming{f' to {grown} cycles' if grown else ''}"
    create_run_dir(Path(out), cfg)
    return "starting"


def grow_cycles(run_dir: Path, cycles: int) -> int:
    """Let a character run go on for more passes over the training shards: when `cycles` is more than
    the run's config has, the config says `cycles` from now on and the next train() continues where
    the run stopped (a finished run included). Returns the new count, or 0 when nothing grew. Only
    where the longer run is exactly what a fresh run of `cycles` would be: a constant learning rate
    (the shuffle of shard-epoch k and each step's seed depend on k and the step alone), Adam, not the
    closed-form ridge readout; anything else raises ReslmError. Fewer cycles than the run has is left
    to check_same_run (a different budget)."""
    with lock_run(run_dir):
        cfg = read_config(run_dir)
        tc = cfg["train"]
        have = tc.get("cycles", 1)
        if not isinstance(cycles, int) or cycles <= have:
            return 0
        if not sampler_for(cfg["family"]).has_cycles:
            raise ReslmError(f"{run_dir} is a token-level run: cycles do not apply (it trains for max_steps)")
        if tc.get("schedule", "constant") != "constant" or tc.get("optimizer", "adam") in SOLVERS:
            raise ReslmError(f"{run_dir} cannot be extended to {cycles} cycles: only a constant-lr, gradient-trained "
                             f"run goes on exactly as a fresh {cycles}-cycle run would (start a new run instead)")
        write_json(Path(run_dir) / CONFIG, {**cfg, "train": {**tc, "cycles": cycles}})
    return cycles


def _schedule_key(cfg: dict) -> str:
    """A hash of what fixes a run's schedule (its training config), kept in summary.json."""
    return hashlib.sha256(json.dumps(cfg["train"], sort_keys=True).encode()).hexdigest()[:16]


def is_finished(run_dir: Path) -> bool:
    """True when the run's summary says it reached the end of the schedule its config now asks for."""
    summary = read_json(Path(run_dir) / SUMMARY)
    return (bool(summary) and summary.get("finished") is True
            and summary.get("schedule") == _schedule_key(read_config(run_dir)))


# --- the loop ----------------------------------------------------------------------------------------
def make_optimizer(model, tc: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """Adam over the trainable parameters, or AdamW with decay on linear weights only. A model may
    give its own groups (`param_groups(weight_decay)`, e.g. a lower embedding lr as `lr_mult`)."""
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


def _finite(loss: torch.Tensor, params) -> bool:
    if not torch.isfinite(loss).all():
        return False
    return all(p.grad is None or torch.isfinite(p.grad).all() for p in params)


class HeldoutLoss:
    """The evaluation of a heldout_eval run (TrainConfig.heldout_eval): the CE on the held-out tails of
    a CharShards source's training shards, never the test shard. The tails' features are computed at
    the first evaluation and kept (the reservoir is fixed)."""

    eval_kind = "heldout"

    def __init__(self, source: CharShards):
        self.source, self.feats = source, None

    def __call__(self, model, precision: str) -> dict:
        if self.feats is None:
            self.feats = [self.source.heldout_features(s) for s in self.source.ds.train_shards]
        total, count = 0.0, 0
        for feats in self.feats:
            loss, n = estimate_loss(model, feature_batches(feats, self.source.tc.batch_size), precision=precision)
            total, count = total + loss * n, count + n
        loss = total / max(count, 1)
        return dict(heldout_loss=loss, heldout_bpc=bits(loss))


def _by_samples(micro) -> tuple[list[float], int]:
    n = sum(y.numel() for _, y in micro)
    return [y.numel() / n for _, y in micro], n


def train_step(forward, micro: list, opt: torch.optim.Optimizer, scaler, *, lr: float, precision: str = "fp32",
               device: torch.device | None = None, grad_clip: float = 0.0, weights=None, ddp=None,
               ema: EMA | None = None, step: int = 0, params: list | None = None) -> tuple[torch.Tensor, int]:
    """One optimiser step, the only one in reslm (the training loop and the bench both call it):
    lr into every group (times its lr_mult), gradients of forward(x, y)'s loss summed over the
    micro-batches `micro` [(x, y), ...] under autocast(precision) and the (fp16) loss scaler, global
    norm clipping at grad_clip (0: none), a non-finite loss or gradient -> ReslmError, opt.step, and
    the EMA of the weights updated to step + 1. `params`: the parameters to clip and check, in the
    order whose norm the run has always summed (default: the optimiser's).

    weights: micro -> (each micro-batch's share of the step's loss, the step's weight), a sampler's
    `weights` (reslm.batches); default: shares by sample count, weight = samples (characters). `ddp`: the DistributedDataParallel wrapper that
    `forward` is, so that only the last micro-batch all-reduces its gradients. Returns the step's
    loss (the weighted mean, a detached 0-dim tensor) and its weight."""
    device = device or torch.device("cpu")
    for g in opt.param_groups:
        g["lr"] = lr * g["lr_mult"]
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
        raise ReslmError(f"non-finite loss or gradient at step {step + 1} (lr {lr:.3g}); stopped, the last "
                         f"checkpoint is kept: lower --lr, add --grad-clip, or check the inputs")
    scaler.step(opt)
    scaler.update()
    if ema is not None:
        ema.update(step + 1)
    return step_loss, n_step


def train(run_dir: Path, *, progress: bool = True, stop_at: int | None = None,
          checkpoint_seconds: float = CHECKPOINT_SECONDS, cache_states: bool = False) -> dict:
    """Train (or continue training) the run in run_dir; returns the summary (also summary.json).

    `stop_at`: stop (after an evaluation and a checkpoint) once this many steps are done; a later call
    resumes. Between evaluations a checkpoint is also written every `checkpoint_seconds` of training,
    so a kill loses at most that much work even when an evaluation is hours away (a transformer's
    paper-protocol shard-epoch on a CPU); it holds the running window of the segment's train loss, and
    the resumed run logs what an uninterrupted one does. The run directory is locked while this runs (a
    second trainer of the same run gets ReslmError). Under torchrun every rank calls this and rank 0
    holds the lock (see the module doc).

    `cache_states` (character reservoir runs): keep the computed features in RUN/states (StateCache),
    so that a resumed run does not compute the current shard's and the test states again; the folder
    is removed once the run is finished."""
    run_dir = Path(run_dir)
    with lock_run(run_dir) if dist_.env_world()[0] == 0 else contextlib.nullcontext():
        summary = _train(run_dir, progress, stop_at, checkpoint_seconds, cache_states)
        if is_finished(run_dir):
            shutil.rmtree(run_dir / STATES, ignore_errors=True)
        return summary


def _train(run_dir: Path, progress: bool, stop_at: int | None, checkpoint_seconds: float,
           cache_states: bool) -> dict:
    cfg = read_config(run_dir)
    tc = run_train_config(cfg)
    rank, world, local_rank = dist_.init(tc.device)
    main = rank == 0
    dataset = open_dataset(cfg["data"])
    check_dataset(cfg, dataset)
    if tc.threads:
        torch.set_num_threads(tc.threads)
    device = pick_device(tc.device)
    if world > 1 and device.type == "cuda":
        device = torch.device("cuda", local_rank)
    precision = resolve_precision(tc.precision, device)
    setup_cuda()
    model = load_model(cfg, device)
    sampler = sampler_for(cfg["family"])
    if cache_states and not sampler.caches(model):
        raise ReslmError(f"--cache-states keeps a character reservoir run's states; a {cfg['family']} run has none")
    log = MetricsLog(run_dir) if main else None
    source = sampler(model, dataset, tc, device, log, progress and main, world=world, rank=rank,
                     cache=run_dir / STATES if cache_states else None,
                     holdout=tc.holdout if tc.optimizer in SOLVERS or tc.heldout_eval else 0.0)
    if tc.optimizer in SOLVERS:
        return _train_ridge(run_dir, cfg, model, source, log, precision, progress)
    evaluate = HeldoutLoss(source) if tc.heldout_eval else source.evaluate
    opt = make_optimizer(model, tc, device)
    scaler = grad_scaler(precision, device)
    params = [p for p in model.parameters() if p.requires_grad]
    ema = EMA(model, tc.ema) if tc.ema else None

    step, train_seconds = 0, 0.0
    # the segment since the last evaluation: summed train loss, its sample count, first step, seconds
    segment = dict(loss=0.0, n=0, start=0, seconds=0.0, win_loss=0.0, win_steps=0)
    ck = load_checkpoint(run_dir, map_location=device)
    if ck is not None:
        try:
            model.load_state_dict(ck["raw"] if ema is not None else ck["model"])
            if ema is not None:
                ema.load(ck["model"])
            opt.load_state_dict(ck["optimizer"])
            scaler.load_state_dict(ck["scaler"])
            step, train_seconds = int(ck["step"]), float(ck["train_seconds"])
            segment = {**segment, "start": step, **ck.get("segment", {})}
        except (RuntimeError, KeyError, ValueError, TypeError) as e:
            raise ReslmError(f"the checkpoint in {run_dir} does not fit its config: "
                             f"{(str(e).strip().splitlines() or [type(e).__name__])[0]}") from None
        if main:   # the rows the checkpoint had seen (fewer on disk: an error), and which states they logged
            source.logged_states = {(r.get("cycle"), r.get("shard"), r.get("part"))
                                    for r in log.truncate(int(ck["metrics_rows"])) if r.get("kind") == "states"}
    elif main and log.rows:  # metrics without a checkpoint: an interrupted start, begin afresh
        log.truncate(0)
    # DDP wraps the model for the training forward/backward; evaluation and checkpoints use `model`.
    # A model with parameters that never get a gradient (LAERC's LN_res, which only feeds the no-grad
    # reservoir) says so, and DDP then looks for them each step instead of waiting for them forever.
    ddp = None
    if world > 1:
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None,
            find_unused_parameters=bool(getattr(model, "has_unused_parameters", False)))
    forward = ddp if ddp is not None else model.forward_features
    end = source.total if stop_at is None else max(0, min(source.total, stop_at))
    evals = set(source.eval_points) | {end}

    if ck is None and source.eval_at_start:  # the untrained model's val loss, for reference (step 0)
        row = source.evaluate(model, precision)
        if main:
            log.write(dict(kind="eval", step=0, **row))
    bar = progress_bar(total=source.total, initial=step, enabled=progress and main and step < end,
                       desc=f"{cfg.get('preset') or cfg['family']}", unit="step")
    model.train()
    seg_loss, seg_n, seg_start = segment["loss"], segment["n"], segment["start"]
    win_loss, win_steps = segment["win_loss"], segment["win_steps"]
    t_log = t_saved = time.perf_counter()     # wall clock at the last step row / checkpoint
    t_seg = t_log - segment["seconds"]        # wall clock at the segment's start (last evaluation)
    samples_per_step = source.samples_per_step
    while step < end:
        lr = lr_at(tc, step, source.total)
        micro = source.batches(step)
        torch.manual_seed(step_seed(tc.seed, step))  # dropout
        step_loss, n_step = train_step(forward, micro, opt, scaler, lr=lr, precision=precision, device=device,
                                       grad_clip=tc.grad_clip, weights=source.weights, ddp=ddp, ema=ema,
                                       step=step, params=params)
        step += 1
        lv = dist_.all_reduce_mean(step_loss).item()
        seg_loss, seg_n = seg_loss + lv * n_step, seg_n + n_step
        win_loss, win_steps = win_loss + lv, win_steps + 1
        bar.update(1)
        if step % tc.log_every == 0:
            synchronize(device)
            now = time.perf_counter()
            rate = win_steps * samples_per_step / max(now - t_log, 1e-9)
            if main:
                log.write(dict(kind="step", step=step, **source.segment(step - 1), lr=lr,
                               train_loss=win_loss / win_steps, samples_per_s=round(rate, 1),
                               **source.rate_fields(rate),
                               wall=round(train_seconds + now - t_seg, 3)))
            bar.set_postfix(loss=f"{win_loss / win_steps:.3f}", lr=f"{lr:.2e}")
            win_loss, win_steps, t_log = 0.0, 0, now
        if step in evals:
            synchronize(device)
            seconds = time.perf_counter() - t_seg
            train_seconds += seconds
            with ema.applied() if ema is not None else contextlib.nullcontext():
                row = evaluate(model, precision)  # every rank evaluates the same model; rank 0 logs
            if main:
                seg = source.segment(step - 1)
                log.write(dict(kind="eval", step=step, **seg, train_loss=seg_loss / max(seg_n, 1), **row,
                               samples_per_s=round((step - seg_start) * samples_per_step / max(seconds, 1e-9), 1),
                               seconds=round(seconds, 3), wall=round(train_seconds, 3)))
                first = next(iter(row))
                say(f"step {step}/{source.total}" + "".join(f" {k} {v}" for k, v in seg.items())
                    + f": train {seg_loss / max(seg_n, 1):.4f}  {first} {row[first]:.4f} nats "
                    f"({bits(row[first]):.3f} bits)", enabled=progress)
                save_checkpoint(run_dir, dict(**checkpoint_weights(model, ema), optimizer=opt.state_dict(),
                                              scaler=scaler.state_dict(), step=step, train_seconds=train_seconds,
                                              metrics_rows=log.rows))
            dist_.barrier()
            # windows restart at every checkpoint, so a resumed run logs exactly what an uninterrupted one does
            seg_loss, seg_n, seg_start, win_loss, win_steps = 0.0, 0, step, 0.0, 0
            t_seg = t_log = t_saved = time.perf_counter()
        elif main and time.perf_counter() - t_saved >= checkpoint_seconds:
            now = time.perf_counter()
            save_checkpoint(run_dir, dict(**checkpoint_weights(model, ema), optimizer=opt.state_dict(),
                                          scaler=scaler.state_dict(), step=step, train_seconds=train_seconds,
                                          metrics_rows=log.rows,
                                          segment=dict(loss=seg_loss, n=seg_n, start=seg_start, seconds=now - t_seg,
                                                       win_loss=win_loss, win_steps=win_steps)))
            t_saved = time.perf_counter()
    bar.close()
    summary = summarize(run_dir, model, cfg, source, eval_kind=getattr(evaluate, "eval_kind", None)) if main else None
    if world > 1:
        dist_.barrier()  # summary.json is written
    return summary if main else read_json(run_dir / SUMMARY)


def _train_ridge(run_dir: Path, cfg: dict, model, source, log: MetricsLog, precision: str, progress: bool) -> dict:
    """A ridge or lbfgs run: one pass and solve (SOLVERS), one test evaluation, one checkpoint (step 1).
    A finished run is only summarised again; an interrupted one (no checkpoint) starts afresh."""
    ck = load_checkpoint(run_dir, map_location=source.device)
    if ck is not None:
        try:
            model.load_state_dict(ck["model"])
        except (RuntimeError, KeyError) as e:
            raise ReslmError(f"the checkpoint in {run_dir} does not fit its config: "
                             f"{(str(e).strip().splitlines() or [type(e).__name__])[0]}") from None
        log.truncate(int(ck["metrics_rows"]))
        return summarize(run_dir, model, cfg, source, extra=ck.get("ridge", {}))   # lbfgs's info too
    log.truncate(0)
    t0 = time.perf_counter()
    info = SOLVERS[source.tc.optimizer](model, source, source.tc, log=log, progress=progress)
    synchronize(source.device)
    seconds = time.perf_counter() - t0      # states of the training shards included, as in the Adam loop
    row = source.evaluate(model, precision)
    log.write(dict(kind="eval", step=1, **info, **row, seconds=round(seconds, 3), wall=round(seconds, 3)))
    chosen = (f"alpha {info['ridge_alpha']:.0e}, temperature {info['temperature']:.4g}" if "ridge_alpha" in info
              else f"l2 {info['lbfgs_l2']:.0e}, train {info['lbfgs_train_loss']:.4f}")
    say(f"{source.tc.optimizer}: {chosen}, held-out {info['heldout_loss']:.4f}, test {row['test_loss']:.4f} nats "
        f"({row['test_bpc']:.3f} bits) in {seconds:.1f} s", enabled=progress)
    save_checkpoint(run_dir, dict(model=model.state_dict(), step=1, train_seconds=seconds, metrics_rows=log.rows,
                                  ridge=info))
    return summarize(run_dir, model, cfg, source, extra=info)


def summarize(run_dir: Path, model, cfg: dict, source, extra: dict | None = None, eval_kind: str | None = None) -> dict:
    """Final figures of a run from its metrics (also written to summary.json), plus `extra`; the
    evaluations are the source's (`test`, `val`) unless eval_kind says otherwise (`heldout`)."""
    kind = eval_kind or source.eval_kind
    rows = read_metrics(run_dir)
    steps = [r for r in rows if r["kind"] == "step"]
    evals = [r for r in rows if r["kind"] == "eval" and r["step"] > 0]
    trainable, fixed = count_params(model)
    last = evals[-1] if evals else {}
    key = f"{kind}_loss"
    summary = dict(family=cfg["family"], preset=cfg.get("preset"), trainable_params=trainable, fixed_params=fixed,
                   steps=last.get("step", 0), finished=last.get("step", 0) >= source.total,
                   schedule=_schedule_key(cfg),
                   frontier=check_frontier(model).ok,   # the strict reservoir-family rules (models.budget)
                   evaluations=len(evals), final_train_loss=last.get("train_loss"),
                   # over every logged train loss: the step rows' windows and the evaluations' segment means
                   # (whose last is final_train_loss), so it is never above final_train_loss
                   min_train_loss=min((r["train_loss"] for r in steps + evals
                                       if isinstance(r.get("train_loss"), (int, float))), default=None))
    for k, v in last.items():
        if k.startswith(kind):
            summary[f"final_{k}"] = v
    summary[f"best_{key}"] = min((r[key] for r in evals), default=None)
    # wall times are per attempt (a resumed run's differ from an uninterrupted one's); every other figure
    # of the log and summary is the same. reservoir_seconds: the time of each shard's first computation
    summary["train_seconds"] = last.get("wall")
    summary["reservoir_seconds"] = round(sum(r["seconds"] for r in rows if r["kind"] == "states"), 3)
    summary.update(source.summary_fields(cfg, summary["steps"]))
    summary.update(extra or {})
    write_json(Path(run_dir) / SUMMARY, summary)
    return summary


__all__ = ["TrainConfig", "train_config", "step_seed", "lr_at", "sampler_for", "data_fields", "make_run_config",
           "create_run", "ensure_run", "grow_cycles", "is_finished", "make_optimizer", "train_step", "train",
           "summarize", "bits"]
