"""`reslm demo`: the embedded default job, a few minutes on 2 CPU cores (the table: reslm.report.demo_text).

Fetches the Shakespeare corpus if it is not there, trains the three families at the paper's matched
~45k trainable-parameter budget (plans.DEMO_PRESETS: rc-750, aerc-100-20, tf-128-8-8) with a small
training budget, then samples each from a fixed prompt. Runs are resumable: a re-run skips finished
runs and continues interrupted ones.

The budget is far below the paper's (5 epochs on each full shard): one shard-epoch on the start of
each training shard, a random subset of DEMO_TRAIN["epoch_samples"] samples, evaluated on an evenly
spread subset of the test shard, with smaller batches and a higher learning rate to make the few
steps count. All three families get the same budget, as in the paper. The table says so.
"""
from __future__ import annotations

import sys
from pathlib import Path

from reslm.experiments.plans import DEMO_PRESETS, DEMO_PROMPT, demo_plan
from reslm.core.files import write_json
from reslm.experiments.runner import run_plan
from reslm.generate import sample
from reslm.data.datasets import find_dataset
from reslm.models.load import load_run
from reslm.run import check_runs_folder

DEMO_FOLDER = Path("runs/demo")   # where the demo's runs go unless told


def run_demo(out: Path, data_root: Path | None = None, progress: bool = True, dataset: str = "shakespeare",
             presets=DEMO_PRESETS, train_overrides=None, sample_length: int = 300) -> dict:
    """Train (or skip, or continue) the demo's runs into out/<preset> and sample each at temperature 0.8;
    returns {"train": the overrides, "summaries": [summary.json], "samples": {preset: text}}."""
    check_runs_folder(out, ("demo.json",), "the demo")   # its runs and demo.json only, never a user's folder
    ds = find_dataset(dataset, "chars", data_root, prepare=True)
    plan = demo_plan(presets, train_overrides)
    summaries = run_plan(Path(out), plan, ds, progress=progress,
                         say=lambda msg: print(f"reslm demo: {msg}", file=sys.stderr))
    samples = {}
    for r in plan:
        model, codec, _ = load_run(Path(out) / r.name)
        ids = sample(model, codec.encode(DEMO_PROMPT), sample_length, temperature=0.8, seed=0)
        samples[r.name] = DEMO_PROMPT + codec.decode(ids)
    write_json(Path(out) / "demo.json", summaries)   # atomic: never through a link
    return dict(train=plan[0].train if plan else {}, summaries=summaries, samples=samples)
