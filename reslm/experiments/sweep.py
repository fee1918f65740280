"""The scaling sweep: LAERC vs. GPT at several sizes with one shared training budget (plans.SWEEPS).

The paper (section "Results: optimization behavior and scaling laws") trains transformers and LAERC
models of several sizes with the same hyperparameters, takes each run's best (minimum) training loss
and fits L_min(N) = a log10 N + b against the number of trainable parameters N (the fit and its figure:
reslm.report.scaling). `run_sweep` trains every run into out/<family>-d<D>-l<L> (an ordinary token run
directory); it skips finished runs and continues unfinished ones from their checkpoint, so an
interrupted sweep is resumed by running it again.
"""
from __future__ import annotations

import sys
from pathlib import Path

from reslm.data.bpe import TokenDataset
from reslm.experiments.plans import Sweep, sweep_plan, sweep_rows
from reslm.experiments.runner import run_plan
from reslm.run import check_runs_folder

SWEEP_OUTPUTS = ("scaling.csv", "scaling_fit.json", "scaling.png")   # reslm.report.scaling.write_scaling


def run_sweep(out: Path, dataset: TokenDataset, sweep: str | Sweep = "cpu", families=("laerc", "gpt"),
              train_overrides: dict | None = None, progress: bool = True) -> list[dict]:
    """Train every (family, size) of the sweep into out/<family>-d<D>-l<L>; returns one row per run
    (reslm.report.scaling.CSV_FIELDS). Finished runs are skipped, unfinished ones continued from their checkpoint."""
    plan = sweep_plan(sweep, tuple(families), train_overrides)
    check_runs_folder(out, SWEEP_OUTPUTS, "a sweep")   # never write scaling.* over a folder of the user's
    say = (lambda msg: print(msg, file=sys.stderr, flush=True)) if progress else None
    return sweep_rows(plan, run_plan(Path(out), plan, dataset, progress=progress, say=say, lock=True))
