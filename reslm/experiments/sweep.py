"""The scaling sweep: LAERC vs. GPT at several sizes with one shared training budget (plans.SWEEPS).

The paper (section "Results: optimization behavior and scaling laws") trains transformers and LAERC
models of several sizes with the same hyperparameters, takes each run's best (minimum) training loss
and fits L_min(N) = a log10 N + b against the number of trainable parameters N (the fit and its figure:
reslm.report.scaling). `run_sweep` trains every run into out/<family>-d<D>-l<L> (an ordinary token run
directory), then the sweep's extra runs (ablations, out/<name>); it skips finished runs and continues
unfinished ones from their checkpoint, so an interrupted sweep is resumed by running it again.

`after(run_dir)` is called on each run as soon as it is trained: `reslm sweep --publish DIR` passes
reslm.experiments.runner.evaluate_and_publish (the whole val split scored, then published into DIR/<name>), so an
interrupted sweep keeps what it finished. `train_sweep` is `reslm sweep`: the dataset by name and --publish
checked first; `sweep_folder` is its folder when none is given.
"""
from __future__ import annotations

import sys
from pathlib import Path

from reslm.core.errors import ReslmError
from reslm.data.bpe import TokenDataset
from reslm.data.datasets import find_dataset
from reslm.experiments.plans import Sweep, extras_plan, sweep_plan, sweep_rows
from reslm.experiments.runner import evaluate_and_publish, run_plan
from reslm.run import check_runs_folder

SWEEP_OUTPUTS = ("scaling.csv", "scaling_fit.json", "scaling.png")   # reslm.report.scaling.write_scaling
SWEEP_DATA = "shakespeare-bpe4096"   # the BPE dataset a sweep trains on unless told


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def sweep_folder(sweep: str) -> Path:
    """The folder a sweep trains in when none is given: runs/sweep-SWEEP."""
    return Path(f"runs/sweep-{sweep}")


def run_sweep(out: Path, dataset: TokenDataset, sweep: str | Sweep = "cpu", families=("laerc", "gpt"),
              train_overrides: dict | None = None, progress: bool = True, after=None,
              extras: bool = True) -> list[dict]:
    """Train every (family, size) of the sweep into out/<family>-d<D>-l<L>, then (extras) its extra runs
    into out/<name>; returns one row per sized run (reslm.report.scaling.CSV_FIELDS; the extras are not
    in the fit). Finished runs are skipped, unfinished ones continued from their checkpoint; after(run_dir)
    is called on each run once it is trained (`reslm sweep --publish DIR`: reslm.experiments.runner.evaluate_and_publish)."""
    plan = sweep_plan(sweep, tuple(families), train_overrides)
    more = extras_plan(sweep, tuple(families), train_overrides) if extras else []
    check_runs_folder(out, SWEEP_OUTPUTS, "a sweep")   # never write scaling.* over a folder of the user's
    summaries = run_plan(Path(out), plan + more, dataset, progress=progress, say=_say if progress else None,
                         after=after, lock=True)
    return sweep_rows(plan, summaries[:len(plan)])


def train_sweep(out: Path, data: str | None, sweep: str, families, train_overrides: dict, *,
                data_root: Path | None = None, publish: Path | None = None, progress: bool = True,
                extras: bool = True) -> list[dict]:
    """`reslm sweep`: run_sweep on the dataset `data` (default SWEEP_DATA) under data_root, the folder and
    `publish` checked before the dataset is looked for. With `publish`, each run is scored on its whole val
    split and published into publish/<name> as soon as it is trained (evaluate_and_publish)."""
    check_runs_folder(out, SWEEP_OUTPUTS, "a sweep")
    if publish is not None and publish.exists() and not publish.is_dir():
        raise ReslmError(f"--publish {publish}: not a folder")
    dataset = find_dataset(data or SWEEP_DATA, "tokens", data_root)
    say = _say if progress else None
    after = (lambda run_dir: evaluate_and_publish(run_dir, publish, say)) if publish is not None else None
    return run_sweep(out, dataset, sweep, tuple(families), train_overrides, progress=progress, after=after,
                     extras=extras)
