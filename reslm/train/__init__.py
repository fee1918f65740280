"""Training (the loop: reslm.train.loop; the config and the run it starts: reslm.train.config;
the optimizers and the lr schedule: reslm.train.optim; the batch samplers: reslm.train.batches; what
`reslm train` decides around the loop, its folder, start or resume and owner: reslm.train.config too).

    train(run_dir)             train or continue the run in run_dir -> summary.json
    train_step(...)            the one optimiser step (the loop and the bench call it)
    TrainConfig, train_config  the training fields and a family's defaults
    create_run, ensure_run     a run folder from a family, its overrides and a dataset
    resume_run                 what a resume may change: more cycles, the resource fields (threads, device, ...)
"""
from reslm.run import is_finished
from reslm.settings import TrainConfig, data_fields
from reslm.train.config import (CHECKPOINT_SECONDS, STATES, authors_variant, create_run, ensure_run, grow_cycles,
                                make_run_config, resume_run, sampler_for, train_config)
from reslm.train.evaluation import HeldoutLoss
from reslm.train.loop import summarize, train, train_step
from reslm.train.optim import SOLVERS, lr_at, make_optimizer

__all__ = ["CHECKPOINT_SECONDS", "SOLVERS", "STATES", "TrainConfig", "authors_variant", "create_run", "data_fields",
           "ensure_run", "grow_cycles", "is_finished", "lr_at", "make_run_config", "resume_run", "sampler_for",
           "train_config", "HeldoutLoss", "make_optimizer", "summarize", "train", "train_step"]
