"""The training configuration and the run it starts: `TrainConfig` (every field a `reslm train` flag;
fields one kind of data uses carry it in their metadata, `data_fields`), the family's defaults
(`train_config`), and the run folder created from a family, its overrides and a dataset
(`make_run_config`, `create_run`, `ensure_run`, `resume_run`, `grow_cycles`, `is_finished`). The optimizers and the
learning-rate schedule are reslm.train.optim's."""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch

from reslm.core import distributed as dist_
from reslm.core.device import PRECISIONS, state_dtype
from reslm.core.errors import ReslmError
from reslm.core.files import read_json, write_json
from reslm.models import complete_fields, family, make_config
from reslm.models.base import config_dict
from reslm.models.laerc import AUTHORS_TRAIN, AUTHORS_VARIANT
from reslm.data.datasets import describe_dataset
from reslm.run import CONFIG, SUMMARY, check_same_run, create_run_dir, lock_run, read_config
from reslm.train.batches import SAMPLERS, VAL_SPLITS
from reslm.train.optim import OPTIMIZERS, SCHEDULES, SOLVERS
import reslm


CHECKPOINT_SECONDS = 600.0   # a checkpoint between evaluations after this much training (train())
STATES = "states"            # RUN/states: train(cache_states=True)'s feature cache (StateCache)


_CHARS = {"data": "chars"}     # field metadata: a training field that only this kind of data uses
_TOKENS = {"data": "tokens"}


@dataclass
class TrainConfig:
    # optimiser and schedule. These defaults are the paper's character protocol; the token families
    # override some of them (reslm.models TOKEN_TRAIN: their lr, schedule, batches)
    optimizer: str = "adam"         # adam (paper, characters) | adamw (token level) | ridge (rc: closed-form readout, reslm.train.ridge) | lbfgs (rc: the linear readout's CE optimum, reslm.train.lbfgs)
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
    final_eval_samples: int = field(default=-1, metadata=_CHARS)  # test samples of the last evaluation (0 = whole test shard); -1 = eval_samples
    state_dtype: str = field(default="float32", metadata=_CHARS)  # reservoir states: float32 | bfloat16 | auto (float32 when it fits in memory)
    # closed-form readout (rc with optimizer ridge) and `reslm search`
    holdout: float = 0.1            # ridge, lbfgs and search: the last fraction of each training shard held out (chooses alpha and the temperature; the search objective); adam trains on all of it unless heldout_eval
    heldout_eval: bool = False      # characters, adam/adamw: train without the held-out tails (holdout) and evaluate on them, never reading the test shard (`reslm search`'s objective)
    val_fraction: float = field(default=0.0, metadata=_CHARS)  # the validation split: the last fraction of each training shard, never trained on, its CE logged beside the test CE after every shard-epoch (select on it, not on test); 0 = off (the paper trains on whole shards)
    val_split: str = field(default="tails", metadata=_CHARS)  # what --val-fraction holds out: tails (the last fraction of each training shard) | groups (whole file groups at the end of the training text, about that fraction of it: no play has text both in training and in validation; both editions of a Shakespeare play are one group)
    keep_best_val: bool = field(default=False, metadata=_CHARS)  # with a validation split: the finished run's model is its best-on-validation evaluation's weights (the summary says which; the last weights stay in the checkpoint for --resume)
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
    threads: int = 0                # torch CPU threads, at most the machine's cores; 0 = torch's default
    ema: float = 0.0                # decay of an EMA of the weights (reslm.train.ema) used for evaluation and the saved model; 0 = off

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
        if not 0 <= self.val_fraction < 1:
            raise ReslmError(f"val_fraction must be in [0, 1) (0 = no validation split), got {self.val_fraction}")
        if self.val_fraction and (self.heldout_eval or self.optimizer in SOLVERS):
            raise ReslmError("val_fraction is a validation split for gradient training without heldout_eval "
                             f"(optimizer {self.optimizer}, heldout_eval {self.heldout_eval}): the held-out tails "
                             "(holdout) already play that part there")
        if self.val_split not in VAL_SPLITS:
            raise ReslmError(f"val_split must be one of {', '.join(VAL_SPLITS)}, got {self.val_split!r}")
        if self.val_split == "groups" and not self.val_fraction:
            raise ReslmError("val_split groups says how the validation split is carved: it needs val_fraction > 0")
        if self.val_split == "groups" and self.shard_chars:
            raise ReslmError("val_split groups holds out whole file groups of whole shards: leave shard_chars at 0")
        if self.keep_best_val and not self.val_fraction:
            raise ReslmError("keep_best_val keeps the best-on-validation weights: it needs a validation split "
                             "(val_fraction > 0)")
        if self.final_eval_samples < -1:
            raise ReslmError(f"final_eval_samples must be >= 0, or -1 (= eval_samples), got {self.final_eval_samples}")
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


def sampler_for(family_name: str) -> type:
    """The batch sampler class of a family (reslm.train.batches.SAMPLERS, by the kind of data it reads)."""
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


def resume_run(run_dir: Path, train_overrides: dict) -> tuple[int, dict]:
    """What a resume (`reslm train --resume`) may change in the run's saved config before it goes on:
    more `cycles` grow the run (grow_cycles), and `threads` replaces the saved count (where the run
    runs, not what it computes). Returns (the cycles it grew to, or 0; the overrides it did not take:
    for everything else the saved config wins)."""
    rest = dict(train_overrides)
    grown = grow_cycles(run_dir, rest["cycles"]) if "cycles" in rest else 0
    if grown:
        del rest["cycles"]
    if "threads" in rest:
        with lock_run(run_dir):
            cfg = read_config(run_dir)
            write_json(Path(run_dir) / CONFIG, {**cfg, "train": {**cfg["train"], "threads": rest.pop("threads")}})
    return grown, rest


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


def schedule_key(cfg: dict) -> str:
    """A hash of what fixes a run's schedule (its training config), kept in summary.json."""
    return hashlib.sha256(json.dumps(cfg["train"], sort_keys=True).encode()).hexdigest()[:16]


def is_finished(run_dir: Path) -> bool:
    """True when the run's summary says it reached the end of the schedule its config now asks for."""
    summary = read_json(Path(run_dir) / SUMMARY)
    return (bool(summary) and summary.get("finished") is True
            and summary.get("schedule") == schedule_key(read_config(run_dir)))


# --- the loop ----------------------------------------------------------------------------------------
