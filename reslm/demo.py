"""Stage 8, `reslm demo`: the embedded default job, a few minutes on 2 CPU cores.

Fetches the Shakespeare corpus if it is not there, trains the three families at the paper's matched
~45k trainable-parameter budget (rc-750, aerc-100-20, tf-128-8-8) with a small training budget, then
prints a comparison table and a generated sample of each. Runs are resumable: a re-run skips
finished runs and continues interrupted ones.

The budget is far below the paper's (5 epochs on each full shard): one shard-epoch on the start of
each training shard, a random subset of DEMO_TRAIN["epoch_samples"] samples, evaluated on an evenly
spread subset of the test shard, with smaller batches and a higher learning rate to make the few
steps count. All three families get the same budget, as in the paper. The table says so.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from reslm.files import read_json
from reslm.run import SUMMARY
from reslm.run.load import find_dataset, load_run
from reslm.generate import sample
from reslm.models import preset
from reslm.models.base import bits
from reslm.train import ensure_run, train

DEMO_PRESETS = ["rc-750", "aerc-100-20", "tf-128-8-8"]
DEMO_TRAIN = dict(epochs_per_shard=1, cycles=1, shard_chars=131072, epoch_samples=32768, eval_samples=16384,
                  batch_size=256, lr=3e-3, log_every=16)
DEMO_PROMPT = "to be, or not to be, that is the question:"


def run_demo(out: Path, data_root: Path | None = None, progress: bool = True, dataset: str = "shakespeare",
             presets=DEMO_PRESETS, train_overrides=None, sample_length: int = 300) -> list[dict]:
    ds = find_dataset(dataset, "chars", data_root, prepare=True)
    overrides = dict(DEMO_TRAIN, **(train_overrides or {}))
    summaries = []
    for name in presets:
        run = Path(out) / name
        family, model_over = preset(name)
        what = ensure_run(run, family, model_over, overrides, ds, preset=name)
        print(f"reslm demo: {name} -> {run}: {what}", file=sys.stderr)
        summaries.append(read_json(run / SUMMARY) if what == "done" else train(run, progress=progress))

    print()
    print(f"Demo budget (the paper: 5 epochs on each full shard, batch 1024, lr 1e-4): the first "
          f"{overrides['shard_chars']:,} characters of each training shard, {overrides['epoch_samples']:,} samples "
          f"per shard-epoch, {overrides['epochs_per_shard']} epoch per shard, {overrides['cycles']} cycle, batch "
          f"{overrides['batch_size']}, lr {overrides['lr']}; test cross-entropy on {overrides['eval_samples']:,} "
          f"samples spread over the test shard.")
    print(f"{'preset':<13}{'trainable':>10}{'test CE (nats)':>16}{'bits/char':>11}{'train s':>9}{'reservoir s':>13}")
    for s in summaries:
        print(f"{s['preset']:<13}{s['trainable_params']:>10,}{s['final_test_loss']:>16.4f}"
              f"{bits(s['final_test_loss']):>11.3f}{s['train_seconds']:>9.1f}{s['reservoir_seconds']:>13.1f}")
    print()
    for name in presets:
        model, codec, _ = load_run(Path(out) / name)
        ids = sample(model, codec.encode(DEMO_PROMPT), sample_length, temperature=0.8, seed=0)
        print(f"--- {name} (temperature 0.8) ---")
        print(DEMO_PROMPT + codec.decode(ids))
        print()
    (Path(out) / "demo.json").write_text(json.dumps(summaries, indent=2) + "\n")
    return summaries
