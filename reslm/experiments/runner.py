"""The one executor of plans: `run_plan` trains every run of a plan with `reslm.train.train` and
`evaluate_once` scores a run with `reslm.scoring.evaluate.evaluate_run`.

A plan is a list of `plans.Run` rows (run name, family, model overrides, training overrides); the folder it
runs in and the dataset come with the call. Every config is validated before the first run starts
(one clear error, not a failure hours in); then each run is created, or checked to be the same model
and budget as the one in its folder (`reslm.train.ensure_run`): a finished run is skipped (its summary
read back), an interrupted one resumed from its checkpoint, a missing one started.
"""
from __future__ import annotations

import contextlib
import time
from pathlib import Path

from reslm.core.errors import ReslmError
from reslm.scoring.evaluate import EVAL_FILE, evaluate_run
from reslm.experiments.plans import Run
from reslm.core.files import read_json, write_json
from reslm.publish import publish
from reslm.run import CHECKPOINT, SUMMARY, check_output_folder, lock_run
from reslm.train import ensure_run, make_run_config, train


def validate(runs: list[Run], dataset) -> None:
    """Resolve every run's config before any folder is made."""
    for r in runs:
        make_run_config(r.family, r.model, r.train, dataset, preset=r.preset)


def run_plan(root: Path, runs: list[Run], dataset, *, progress: bool = True, say=None, after=None,
             clock=None, lock: bool = False) -> list[dict]:
    """Train (or skip, or continue) each run of `runs` into root/<name>; returns their summaries.

    say(text): where "[i/n] name: starting|resuming|done" goes (None: nowhere); after(run_dir): called
    as soon as a run is trained (an evaluation, so that an interruption later keeps it); clock(stage):
    a context manager timing "training" (and what `after` does under its own clock); lock: hold root's
    lock for the whole plan (one process per folder of runs), made after the configs are validated."""
    validate(runs, dataset)
    with lock_run(Path(root), create=True) if lock else contextlib.nullcontext():
        return _train_each(Path(root), runs, dataset, progress, say, after,
                           clock or (lambda stage: contextlib.nullcontext()))


def _train_each(root: Path, runs: list[Run], dataset, progress: bool, say, after, clock) -> list[dict]:
    summaries = []
    for i, r in enumerate(runs, 1):
        run_dir = root / r.name
        what = ensure_run(run_dir, r.family, r.model, r.train, dataset, preset=r.preset)
        if say:
            say(f"[{i}/{len(runs)}] {r.name}: {what}")
        if what == "done":
            summaries.append(read_json(run_dir / SUMMARY))
        else:
            with clock("training"):
                summaries.append(train(run_dir, progress=progress, cache_states=r.cache_states))
        if after is not None:
            after(run_dir)
    return summaries


def evaluate_once(run: Path, settings: dict, reference, device: str, say=None) -> dict:
    """The run's eval.json when it is newer than the checkpoint and made with `settings`, else a new
    evaluation (`evaluate_run`: test CE, a closed-loop sample, Overlap-7/8, timings)."""
    have = read_json(run / EVAL_FILE)
    fresh = have is not None and (run / EVAL_FILE).stat().st_mtime >= (run / CHECKPOINT).stat().st_mtime
    if fresh and all(have.get("settings", {}).get(k) == v for k, v in settings.items()):
        return have
    if say:
        say(f"evaluating {run.name}")
    return evaluate_run(run, reference=reference, device=device, length=settings["length"], score=settings["score"],
                        temperature=settings["temperature"], seed=settings["seed"], ns=(7, 8))


@contextlib.contextmanager
def stamped_folder(out: Path, budget: str, what: str):
    """Hold the lock of a reproduction or lab folder for the block, refusing a folder of the user's and
    one that holds another budget's runs (budget.json records the budget, written first)."""
    check_output_folder(out, "budget.json", f"a {what} folder")   # never write into a user's folder
    with lock_run(out, create=True):
        have = read_json(out / "budget.json")
        if have is not None and have.get("budget") != budget:
            raise ReslmError(f"{out} holds a `{have.get('budget')}` {what}; use another --out for `{budget}`")
        write_json(out / "budget.json", dict(budget=budget))
        yield


class Clock:
    """Wall time per stage: `with clock("name"):` adds to clock.timings["name"]."""

    def __init__(self):
        self.timings, self.t0 = {}, time.perf_counter()

    @contextlib.contextmanager
    def __call__(self, name: str):
        t = time.perf_counter()
        yield
        self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - t


EVAL_TOKENS = 500       # tokens a token run generates in evaluate_and_publish's evaluation (after its val-split score)


def _evaluated(run_dir: Path) -> bool:
    """Whether run_dir/eval.json scored the whole val (or test) text after the last checkpoint was written."""
    ev, path = read_json(run_dir / EVAL_FILE), run_dir / EVAL_FILE
    return (ev is not None and ev.get("settings", {}).get("score") == 0
            and path.stat().st_mtime >= (run_dir / CHECKPOINT).stat().st_mtime)


def evaluate_and_publish(run_dir: Path, dest_root: Path, say=None) -> dict:
    """Score a trained run on the whole of its held-out text (eval.json, unless it has one already:
    `evaluate_run` with score=0) and publish it into dest_root/<run folder name>; returns the manifest.
    `reslm sweep --publish DIR` calls it on each run once trained."""
    run_dir = Path(run_dir)
    if not _evaluated(run_dir):
        evaluate_run(run_dir, length=EVAL_TOKENS, score=0, seed=0)
    manifest = publish(run_dir, Path(dest_root) / run_dir.name)
    if say:
        say(f"published {run_dir.name} into {Path(dest_root) / run_dir.name} (step {manifest['step']:,})")
    return manifest
