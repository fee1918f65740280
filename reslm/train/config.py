"""The run a training config starts: the family's defaults over `TrainConfig` (reslm.settings:
every field, its role in a run's identity) (`train_config`), and the run folder created from a family,
its overrides and a dataset (`make_run_config`, `create_run`, `ensure_run`, `resume_run`, `grow_cycles`), and
what `reslm train` decides before and around the loop: the folder it trains in (`run_folder`), who owns it
under torchrun (`own_run`), whether it starts a run or resumes one and from which preset or family
(`start_run`), and the evaluations a resumed run drops (`current_evals`). The optimizers and the
learning-rate schedule are reslm.train.optim's."""
from __future__ import annotations

import contextlib
from dataclasses import asdict, fields
from pathlib import Path

import torch

from reslm.core import distributed as dist_
from reslm.core.errors import ReslmError
from reslm.core.files import write_json
from reslm.models import MODELS, family
from reslm.models.load import check_fits
from reslm.models.resolve import resolve
from reslm.models import preset as preset_of
from reslm.models.identity import same_run_problem
from reslm.models.laerc import AUTHORS_VARIANT
from reslm.data.datasets import describe_dataset, find_dataset
from reslm.run import CONFIG, create_run_dir, drop_stale_evals, is_finished, lock_new_run, lock_run, read_config
from reslm.settings import SOLVERS, TrainConfig, authors_train, field_roles
from reslm.train.batches import SAMPLERS
from reslm.train.continuation import continued_config
import reslm


CHECKPOINT_SECONDS = 600.0   # a checkpoint between evaluations after this much training (train())
STATES = "states"            # RUN/states: train(cache_states=True)'s feature cache (StateCache)


def train_config(family_name: str, **overrides) -> TrainConfig:
    """TrainConfig with the family's defaults, then `overrides`, validated."""
    unknown = sorted(set(overrides) - {f.name for f in fields(TrainConfig)})
    if unknown:
        raise ReslmError(f"unknown training option(s): {', '.join(unknown)}")
    return TrainConfig(**{**family(family_name).train, **overrides}).validate()


def authors_variant(model_overrides: dict, train_overrides: dict) -> tuple[dict, dict]:
    """Model and training overrides for the authors' released LAERC (laerc.AUTHORS_VARIANT and
    reslm.settings.AUTHORS_TRAIN: lr 4e-4, warmup 1% and hold 10% of the steps), under the user's own
    overrides."""
    steps = train_config("laerc", **train_overrides).max_steps
    return {**AUTHORS_VARIANT, **model_overrides}, {**authors_train(steps), **train_overrides}


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
    spec = resolve(family_name, model_overrides, vocab_size=vocab)
    check_fits(spec)   # a reservoir too large for memory: refused before any folder
    model_cfg = spec.config
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
        problem = same_run_problem(read_config(out), {**cfg, "train": {**cfg["train"], "cycles": cycles}})
        if problem:
            raise ReslmError(f"{out} holds {problem}; remove it or use another output folder")
        grown = grow_cycles(out, cfg["train"]["cycles"])
        return "done" if is_finished(out) else f"resuming{f' to {grown} cycles' if grown else ''}"
    create_run_dir(Path(out), cfg)
    return "starting"


def resume_run(run_dir: Path, train_overrides: dict) -> tuple[int, dict]:
    """What a resume (`reslm train --resume`) may change in the run's saved config before it goes on:
    more `cycles` grow the run (grow_cycles), and the resource fields (threads, device, precision,
    compile: where and how the run runs, reslm.settings.field_roles) replace the saved ones. Returns (the cycles it grew to, or 0; the overrides it did not take:
    for everything else the saved config wins)."""
    rest = dict(train_overrides)
    grown = grow_cycles(run_dir, rest["cycles"]) if "cycles" in rest else 0
    if grown:
        del rest["cycles"]
    roles = field_roles()
    resources = {k: rest.pop(k) for k in list(rest) if roles.get(k) == "resource"}
    if resources:
        with lock_run(run_dir):
            cfg = read_config(run_dir)
            write_json(Path(run_dir) / CONFIG, {**cfg, "train": {**cfg["train"], **resources}})
    return grown, rest


def grow_cycles(run_dir: Path, cycles: int) -> int:
    """Let a character run go on for more passes over the training shards: when `cycles` is more than
    the run's config has, the config says `cycles` from now on and the next train() continues where
    the run stopped (a finished run included). Returns the new count, or 0 when nothing grew. Only
    where the longer run is exactly what a fresh run of `cycles` would be: a constant learning rate
    (the shuffle of shard-epoch k and each step's seed depend on k and the step alone), Adam, not the
    closed-form ridge readout; anything else raises ReslmError. Fewer cycles than the run has is left
    to ensure_run (a different budget)."""
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


# --- what `reslm train` decides around the loop: its folder, its owner, start or resume ------------------
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
    if train_over.get("continue_from") and not (preset or family):   # the source's configuration, more cycles
        if model_over:
            raise ReslmError("a continued run is its source's model: model options would make it another "
                             "(give --preset or --family to describe a run in full)")
        name, preset, over, train_over, source_data = continued_config(train_over["continue_from"], train_over)
        data = data or source_data
    else:
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
