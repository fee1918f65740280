"""What `reslm train` decides before and around the loop: the run folder it trains in (`run_folder`), who
owns it under torchrun (`own_run`), whether it starts a run or resumes one and from which preset or family
(`start_run`), and the evaluations a resumed run drops (`current_evals`)."""
from __future__ import annotations

import contextlib
from pathlib import Path

from reslm.core import distributed as dist_
from reslm.core.errors import ReslmError
from reslm.data.datasets import find_dataset
from reslm.models import MODELS, preset as preset_of
from reslm.run import CONFIG, drop_stale_evals, lock_new_run
from reslm.train.config import authors_variant, create_run, resume_run, sampler_for


def run_folder(preset: str | None, family: str | None) -> Path:
    """The folder a run trains in when none is given: runs/<preset, or family>."""
    return Path("runs") / (preset or family or "run")


def own_run(out: Path):
    """Hold `out`'s lock for the whole command (lock_new_run: a second `reslm train` of the same run fails
    at once, and a failed start's folder is undone); under torchrun only rank 0 owns the run folder."""
    return lock_new_run(out) if dist_.launched_main() else contextlib.nullcontext()


def family_and_preset(preset: str | None, family: str | None) -> tuple[str, dict]:
    """The family to train and the preset's model overrides ({} for a bare --family)."""
    if preset:
        name, over = preset_of(preset)
        if family and family != name:
            raise ReslmError(f"preset {preset} is family {name}, not {family}")
        return name, over
    if family:
        return family, {}
    raise ReslmError("give --preset NAME (see `reslm presets`) or --family {%s}" % ",".join(MODELS))


def start_run(out: Path, *, resume: bool, preset: str | None, family: str | None, model_over: dict,
              train_over: dict, data: str | None, data_root: Path | None, authors: bool = False
              ) -> tuple[bool, list[str]]:
    """Create the run in `out` (from the preset or family, the overrides and the dataset: `data`, else the
    family's default), or, with `resume`, take the one there on with its saved config (resume_run: only more
    cycles and the thread count change). Returns (whether the run is fresh, notes for the user)."""
    if (out / CONFIG).exists():
        if not resume:
            raise ReslmError(f"{out} already holds a run (add --resume to continue it, or pick another --out)")
        grown, rest = resume_run(out, train_over)
        notes = [f"{out} goes on to {grown} cycles"] if grown else []
        if model_over or rest or preset or family:
            notes.append(f"resuming {out} with its saved config (other flags ignored)")
        return False, notes
    if resume:
        raise ReslmError(f"{out} holds no run to resume (no {CONFIG})")
    name, over = family_and_preset(preset, family)
    if authors:
        model_over, train_over = authors_variant(model_over, train_over)
    sampler = sampler_for(name)
    dataset = find_dataset(data or sampler.default_data, sampler.kind, data_root)
    create_run(out, name, {**over, **model_over}, train_over, dataset, preset=preset)
    return True, []


@contextlib.contextmanager
def current_evals(out: Path, fresh: bool):
    """Around the training of a resumed run: drop its evaluations of older weights before (a killed resume
    may have trained on) and after (the weights changed); a fresh run has none."""
    if not fresh:
        drop_stale_evals(out)
    yield
    if not fresh:
        drop_stale_evals(out)
