"""The training settings of a run: `TrainConfig`, every field a `reslm train` flag, its default the
paper's character protocol (the token families override some: TOKEN_TRAIN, below), and the role of
each field in what identifies a run (ROLES: identity, seed, record, resource; `field_roles`). The names
the fields take (optimizers, schedules, validation splits) are declared here, beside the fields; what
they do is reslm.train's. Creating and training a run: reslm.train."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from reslm.core.device import PRECISIONS, state_dtype
from reslm.core.errors import ReslmError
from reslm.paper import PROTOCOL

SOLVERS = ("ridge", "lbfgs")               # rc readouts fitted in one solve (reslm.train.optim.SOLVERS)
OPTIMIZERS = ("adam", "adamw", *SOLVERS)
SCHEDULES = ("constant", "cosine")
COMPILES = ("auto", "on", "off")           # whether the training forward is compiled (reslm.train.compiled)
WINDOW_STEPS = ("auto", "fused", "plain")  # the window transformer's CPU step (reslm.models.window_kernel)
VAL_SPLITS = ("tails", "groups")           # how --val-fraction carves the validation split (val_split)
TEST_EVERY = ("evaluation", "shard", "final")   # which evaluations of a run with a validation split score the test shard
EVAL_AT = ("shard-epoch", "shard-after-cycle-1")  # when a character run evaluates (eval_at)
# the largest count accepted for fields whose work grows with the value, so that a typo (1e20) is refused with its
# limit instead of running for ever (the command line's flags and the frontier's plans alike)
COUNT_LIMITS = {"max_steps": 10**9, "cycles": 10**4, "epochs_per_shard": 10**4}


_CHARS = {"data": "chars"}     # field metadata: a training field that only this kind of data uses
_TOKENS = {"data": "tokens"}
# field metadata "role": what a field is to a run's identity (ROLES; a field without one is "identity")
ROLES = {
    "identity": "changes what is trained or how the kept weights are chosen: two runs that differ in it are "
                "two configurations",
    "seed": "the seed: runs that differ only in it are one configuration at several seeds",
    "record": "what the run logs, not what it trains (the log's density)",
    "resource": "where and on how many threads the run runs; never part of what it computes",
}
_RESOURCE, _RECORD, _SEED = {"role": "resource"}, {"role": "record"}, {"role": "seed"}


@dataclass
class TrainConfig:
    # optimiser and schedule. These defaults are the paper's character protocol; the token families
    # override some of them (TOKEN_TRAIN, below: their lr, schedule, batches)
    optimizer: str = PROTOCOL["optimizer"]  # adam (paper, characters) | adamw (token level) | ridge (rc: closed-form readout, reslm.train.ridge) | lbfgs (rc: the linear readout's CE optimum, reslm.train.lbfgs)
    lr: float = PROTOCOL["lr"]      # (peak) learning rate
    beta1: float = 0.9
    beta2: float = 0.999
    weight_decay: float = 0.0       # adamw: on linear weight matrices only
    grad_clip: float = 0.0          # max global gradient norm; 0 = no clipping
    schedule: str = PROTOCOL["schedule"]  # constant | cosine (linear warmup, hold, cosine to lr * min_lr_frac)
    warmup_steps: int = 0           # cosine: linear warmup steps
    hold_steps: int = 0             # cosine: steps at the peak lr after warmup
    min_lr_frac: float = 0.1        # cosine: floor = lr * min_lr_frac
    # batches
    batch_size: int = PROTOCOL["batch_size"]  # samples (characters) or windows (tokens) per optimizer step
    grad_accum: int = 1             # micro-batches the step is split into (tokens: each batch_size windows)
    # character protocol (rc, aerc, tf)
    epochs_per_shard: int = field(default=PROTOCOL["epochs_per_shard"], metadata=_CHARS)  # E: epochs on a shard before the next (paper)
    cycles: int = field(default=PROTOCOL["cycles"], metadata=_CHARS)  # C: passes over the training shards
    epoch_samples: int = field(default=PROTOCOL["epoch_samples"], metadata=_CHARS)  # samples per shard-epoch, a fresh random subset each time; 0 = all
    shard_chars: int = field(default=PROTOCOL["shard_chars"], metadata=_CHARS)  # use only the first K characters of each training shard (with val_split groups: of its training part; the held-out groups stay whole); 0 = all
    eval_samples: int = field(default=0, metadata=_CHARS)  # test samples per evaluation (8 evenly spread blocks), and the validation split's (evenly spaced, the same at every evaluation); 0 = all
    final_eval_samples: int = field(default=-1, metadata=_CHARS)  # test samples of the last evaluation and of the kept weights' score (0 = whole test shard); -1 = eval_samples
    state_dtype: str = field(default="float32", metadata=_CHARS)  # reservoir states: float32 | bfloat16 | auto (float32 when it fits in memory)
    # closed-form readout (rc with optimizer ridge) and `reslm search`
    holdout: float = 0.1            # ridge, lbfgs and search: the last fraction of each training shard held out (chooses alpha and the temperature; the search objective); adam trains on all of it unless heldout_eval
    heldout_eval: bool = False      # characters, adam/adamw: train without the held-out tails (holdout) and evaluate on them, never reading the test shard (`reslm search`'s objective)
    val_fraction: float = field(default=0.0, metadata=_CHARS)  # the validation split: the last fraction of each training shard, never trained on, its CE logged beside the test CE after every shard-epoch (select on it, not on test); 0 = off (the paper trains on whole shards)
    val_split: str = field(default="tails", metadata=_CHARS)  # what --val-fraction holds out: tails (the last fraction of each training shard) | groups (whole file groups at the end of the training text, about that fraction of it: no play has text both in training and in validation; both editions of a Shakespeare play are one group)
    eval_at: str = field(default="shard-epoch", metadata={**_CHARS, **_RECORD})  # when a character run evaluates: after every shard-epoch | after every shard-epoch of the first cycle, then after each shard's last epoch (a long run's later cycles: a fifth of the evaluations)
    test_every: str = field(default="evaluation", metadata={**_CHARS, **_RECORD})  # with a validation split: the test CE at every evaluation | at each shard's last evaluation and the final one | at the final one only (and the kept weights'); shard and final: selection reads only validation, the test shard's cost at each other evaluation is saved
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
    log_every: int = field(default=100, metadata=_RECORD)           # steps between "step" rows in metrics.jsonl
    seed: int = field(default=0, metadata=_SEED)  # shuffling, batch draws and dropout
    device: str = field(default="auto", metadata=_RESOURCE)  # auto | cpu | cuda | cuda:N
    precision: str = field(default="auto", metadata=_RESOURCE)  # auto | fp32 | bf16 | fp16
    threads: int = field(default=0, metadata=_RESOURCE)  # torch CPU threads, at most the machine's cores; 0 = torch's default
    compile: str = field(default="auto", metadata=_RESOURCE)  # auto | on | off: torch.compile the training forward (only "on" compiles; reslm.train.compiled)
    window_step: str = field(default="auto", metadata=_RESOURCE)  # auto | fused | plain: the window transformer's step on a CPU in fp32 (auto: the fused C kernel where it builds, else plain; reslm.models.window_kernel)
    ema: float = 0.0                # decay of an EMA of the weights (reslm.train.ema) used for evaluation and the saved model; 0 = off
    continue_from: str = field(default="", metadata=_CHARS)  # a published finished run (its folder) whose weights start this run where it ended: its configuration with more cycles, a fresh optimiser state (Adam's moments from zero; reslm.train.continuation); "{seed}" in it stands for the run's seed; "" = start from the seed's initialisation

    @classmethod
    def of_run(cls, cfg: dict) -> "TrainConfig":
        """The TrainConfig a run config (config.json) holds, validated (ReslmError on unknown or mistyped fields)."""
        unknown = sorted(set(cfg["train"]) - {f.name for f in fields(cls)})
        if unknown:
            raise ReslmError(f"the run config has unknown training field(s): {', '.join(unknown)}")
        return cls(**cfg["train"]).validate()

    @property
    def heldout(self) -> float:
        """The share of the training text a character run keeps out of training: its held-out tails
        (`holdout`) for a solver or with heldout_eval, else its validation split (`val_fraction`; 0: none)."""
        return self.holdout if self.optimizer in SOLVERS or self.heldout_eval else self.val_fraction

    def validate(self) -> "TrainConfig":
        """Check every field, in place; returns self. The first rule broken raises its ReslmError, in this
        order: the types, the numbers' ranges, the validation split and what reads it, then the solvers'
        and the schedule's numbers and the named choices."""
        self._check_types()
        self._check_ranges()
        self._check_validation()
        self._check_solvers_and_choices()
        return self

    def _check_types(self) -> None:
        """Each field of its default's type (an int given for a float field becomes that float); floats finite."""
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

    def _check_ranges(self) -> None:
        """The training's numbers in range: the counts and the learning rate positive (counts at most
        COUNT_LIMITS, the learning rate at most 10), sizes and penalties not negative, the betas, holdout,
        ridge settings and EMA decay in their intervals; an EMA only with a gradient optimizer."""
        for name in ("lr", "batch_size", "grad_accum", "epochs_per_shard", "cycles", "max_steps", "eval_every",
                     "eval_batches", "log_every"):
            if not getattr(self, name) > 0:
                raise ReslmError(f"{name} must be > 0, got {getattr(self, name)}")
        for name, most in COUNT_LIMITS.items():
            if getattr(self, name) > most:
                raise ReslmError(f"{name} must be at most {most:,}, got {getattr(self, name):,}")
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

    def _check_validation(self) -> None:
        """The validation split (val_fraction, val_split) and what reads it (test_every, keep_best_val):
        a split only for gradient training without heldout_eval, and the fields that need one given one."""
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
        if self.test_every not in TEST_EVERY:
            raise ReslmError(f"test_every must be one of {', '.join(TEST_EVERY)}, got {self.test_every!r}")
        if self.test_every != "evaluation" and not self.val_fraction:
            raise ReslmError(f"test_every {self.test_every} leaves the test CE out of evaluations that validation alone "
                             "reads: it needs a validation split (val_fraction > 0)")
        if self.eval_at not in EVAL_AT:
            raise ReslmError(f"eval_at must be one of {', '.join(EVAL_AT)}, got {self.eval_at!r}")
        if self.eval_at != "shard-epoch" and self.keep_best_val:
            raise ReslmError(f"eval_at {self.eval_at} leaves out evaluations that keep_best_val chooses among: "
                             "keep_best_val needs eval_at shard-epoch")
        if self.keep_best_val and not self.val_fraction:
            raise ReslmError("keep_best_val keeps the best-on-validation weights: it needs a validation split "
                             "(val_fraction > 0)")

    def _check_solvers_and_choices(self) -> None:
        """The final evaluation's size, the lbfgs solver's settings and the cosine schedule's floor in range;
        each named choice (optimizer, schedule, precision, compile, window_step, state_dtype) one reslm has."""
        if self.final_eval_samples < -1:
            raise ReslmError(f"final_eval_samples must be >= 0, or -1 (= eval_samples), got {self.final_eval_samples}")
        if self.lbfgs_samples < 1 or self.lbfgs_iters < 1 or self.lbfgs_l2 < 0:
            raise ReslmError(f"lbfgs_samples and lbfgs_iters must be >= 1 and lbfgs_l2 >= 0, got {self.lbfgs_samples}, "
                             f"{self.lbfgs_iters} and {self.lbfgs_l2}")
        if not 0 <= self.min_lr_frac <= 1:
            raise ReslmError(f"min_lr_frac must be in [0, 1], got {self.min_lr_frac}")
        for name, allowed in (("optimizer", OPTIMIZERS), ("schedule", SCHEDULES), ("precision", PRECISIONS),
                              ("compile", COMPILES), ("window_step", WINDOW_STEPS)):
            if getattr(self, name) not in allowed:
                raise ReslmError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if self.state_dtype != "auto":
            state_dtype(self.state_dtype)
        if self.continue_from and (self.schedule != "constant" or self.optimizer in SOLVERS or self.ema
                                   or self.keep_best_val):
            raise ReslmError("continue_from goes on from a run's last weights at a constant learning rate: it needs "
                             f"schedule constant, a gradient optimizer, no ema and no keep_best_val (got schedule "
                             f"{self.schedule}, optimizer {self.optimizer}, ema {self.ema:g}, keep_best_val "
                             f"{str(self.keep_best_val).lower()})")


# Each family's training defaults over TrainConfig's (a family's `train` in reslm.models.MODELS).
# The paper's character protocol is TrainConfig's own: the character families change none of it.
CHAR_TRAIN: dict = {}
# Token level (Appendix A.3 and the authors' code): AdamW, warmup-hold-cosine, accumulation, clipping.
TOKEN_TRAIN = dict(optimizer="adamw", lr=6e-4, batch_size=32, grad_accum=4, schedule="cosine",
                   warmup_steps=100, max_steps=1000, weight_decay=0.1, grad_clip=1.0, eval_every=100,
                   log_every=10)
# The authors' released LAERC trains with these (its model overrides: reslm.models.laerc.AUTHORS_VARIANT):
# peak lr, warm-up and hold as fractions of the steps; the appendix text gives neither.
AUTHORS_TRAIN = dict(lr=4e-4, warmup_frac=0.01, hold_frac=0.10)


def authors_train(steps: int) -> dict:
    """AUTHORS_TRAIN as the training overrides of a run of `steps` optimizer steps."""
    return dict(lr=AUTHORS_TRAIN["lr"], warmup_steps=round(AUTHORS_TRAIN["warmup_frac"] * steps),
                hold_steps=round(AUTHORS_TRAIN["hold_frac"] * steps))


def evaluated(train: dict, cycle: int, epoch: int) -> bool:
    """Whether a character run whose training fields are `train` (a config.json's) evaluates after the
    shard-epoch at `cycle`, `epoch` (0-based): every one under eval_at shard-epoch; under
    shard-after-cycle-1 those of the first cycle and each shard's last."""
    return (train.get("eval_at", "shard-epoch") == "shard-epoch" or cycle == 0
            or epoch == train.get("epochs_per_shard", PROTOCOL["epochs_per_shard"]) - 1)


def evaluations(train: dict, shards: int) -> int:
    """How many evaluations a character run whose training fields are `train` makes over `shards`
    training shards (the last shard-epoch's included)."""
    return sum(evaluated(train, c, e) for c in range(train.get("cycles", 1)) for _ in range(shards)
               for e in range(train.get("epochs_per_shard", PROTOCOL["epochs_per_shard"])))


def data_fields(kind: str | None = None) -> tuple[str, ...]:
    """TrainConfig fields that only one kind of data uses (their metadata says which): those of
    `kind`, or with kind None all of them. The CLI hides another kind's fields from a family's flags."""
    return tuple(f.name for f in fields(TrainConfig) if f.metadata.get("data") and kind in (None, f.metadata["data"]))


def field_roles() -> dict[str, str]:
    """Each TrainConfig field's role in a run's identity (ROLES), by name."""
    return {f.name: f.metadata.get("role", "identity") for f in fields(TrainConfig)}
