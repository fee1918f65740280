"""A run that goes on where a published finished run ended, with a fresh optimiser state
(TrainConfig.continue_from).

A published run keeps its trainable weights, not its optimiser state, so `reslm train --resume --cycles K`
cannot grow it exactly. A continued run is a new run folder whose configuration is the source's with more
cycles: at its first start it checks the source (published, finished, the same configuration but for the
cycles and what is logged and where it runs: reslm.models.identity.same_run_problem), loads its weights
(checked against the manifest), copies its metrics rows, logs a "continued" row (the source's name, its step,
its weights' sha256, `optimizer: fresh`), and trains on from the source's step: the same shard-epoch
shuffles and dropout seeds as the uninterrupted run of that many cycles (each depends on its step alone),
with Adam's moments starting from zero. That is the one difference from the uninterrupted run, and its
record says so; whether it matters is measured (plan continue-check), not assumed.

    continued_config(source, train_over)   the config `reslm train --continue-from SRC --cycles K` creates
    begin(run_dir, cfg, model, sampler, log)   the first start: checks, weights, rows; returns its position
"""
from __future__ import annotations

from pathlib import Path

from reslm.core.errors import ReslmError
from reslm.core.files import read_json
from reslm.models.identity import same_run_problem
from reslm.run import SUMMARY, read_config, read_metrics
from reslm.run.registry import WEIGHTS, is_published, load_published, read_manifest
from reslm.settings import field_roles

CONTINUED = "continued"   # the metrics row a continued run logs where it took the source's weights


def source_path(train: dict) -> str:
    """The source folder a run's training fields name (continue_from, its "{seed}" replaced by the run's seed:
    one configuration of a plan continues each seed's own run)."""
    return str(train.get("continue_from", "")).replace("{seed}", str(train.get("seed", 0)))


def _source(path: str | Path) -> tuple[Path, dict, dict]:
    """(folder, config, manifest) of a continue_from source: a published, finished run."""
    folder = Path(path)
    if not is_published(folder):
        raise ReslmError(f"continue_from {path}: not a published run folder (a run still in runs/ with its "
                         f"checkpoint goes on exactly with `reslm train --out RUN --resume --cycles K`)")
    manifest = read_manifest(folder)
    if not manifest.get("finished"):
        raise ReslmError(f"continue_from {path}: the run is not finished (step {manifest.get('step')}); "
                         f"`reslm train --out {path} --resume` finishes it first")
    return folder, read_config(folder), manifest


def _problem(source_cfg: dict, cfg: dict) -> str | None:
    """Why `cfg` is not `source_cfg` with more cycles (None when it is)."""
    have, want = source_cfg["train"].get("cycles", 1), cfg["train"].get("cycles", 1)
    if want <= have:
        return f"{want} cycle(s), not more than the {have} it has"
    same = {**cfg, "train": {**cfg["train"], "cycles": have,
                             "continue_from": source_cfg["train"].get("continue_from", "")}}
    problem = same_run_problem(source_cfg, same)
    if problem is None and (source_cfg.get("data") or {}).get("fingerprint") != (cfg.get("data") or {}).get("fingerprint"):
        problem = "another dataset (its fingerprint differs)"
    return problem


def continued_config(source: str | Path, train_over: dict) -> tuple[str, str | None, dict, dict, str]:
    """What `reslm train --continue-from SRC --cycles K` (no --preset or --family) trains: (family, preset,
    model overrides, training overrides, dataset name): the source's configuration with `cycles` K and
    continue_from SRC; the training flags it accepts beside them are those that do not change what is
    trained (what is logged, where it runs)."""
    folder, cfg, _ = _source(source_path({**train_over, "continue_from": source}))
    roles = field_roles()
    other = sorted(k for k in train_over if k not in ("cycles", "continue_from") and roles.get(k) == "identity")
    if other:
        raise ReslmError(f"a continued run is {folder}'s configuration with more cycles: "
                         f"{', '.join('--' + k.replace('_', '-') for k in other)} would make it another "
                         "(give --preset or --family to describe a run in full)")
    have = cfg["train"].get("cycles", 1)
    if train_over.get("cycles", 0) <= have:
        raise ReslmError(f"--continue-from {source}: give --cycles K, more than the {have} it has")
    model = {k: v for k, v in cfg["model"].items() if k != "vocab_size"}
    train = {**cfg["train"], **train_over, "continue_from": str(source)}
    return cfg["family"], cfg.get("preset"), model, train, (cfg.get("data") or {}).get("name")


def begin(run_dir: Path, cfg: dict, model, sampler, log) -> tuple[int, float]:
    """The first start of a continued run (no checkpoint yet): the source checked against `cfg`, its weights
    into `model`, its metrics rows into `log` followed by the "continued" row. Returns (the step it goes on
    from, the seconds the source trained)."""
    path = source_path(cfg["train"])
    folder, source_cfg, manifest = _source(path)
    problem = _problem(source_cfg, cfg)
    if problem:
        raise ReslmError(f"{run_dir} cannot continue {path}: it asks for {problem}")
    cycles = source_cfg["train"].get("cycles", 1)
    done = cycles * len(sampler.ds.train_shards) * source_cfg["train"].get("epochs_per_shard", 1)
    step = int(manifest["step"])
    if done > len(sampler.ends) or int(sampler.ends[done - 1]) != step:
        raise ReslmError(f"{run_dir} cannot continue {path}: its {step:,} steps do not end cycle {cycles} of "
                         "this run's schedule")
    load_published(folder, model)
    rows = read_metrics(folder)
    for row in rows:
        log.write(row)
    log.write(dict(kind=CONTINUED, step=step, run=folder.name, cycles=cycles,
                   weights_sha256=manifest["files"][WEIGHTS], optimizer="fresh"))
    summary = read_json(folder / SUMMARY) or {}
    seconds = summary.get("train_seconds") or max((r.get("wall", 0.0) for r in rows), default=0.0)
    return step, float(seconds)


def continued_row(rows: list[dict]) -> dict | None:
    """The "continued" row of a run's metrics (None: a run trained from its initialisation)."""
    return next((r for r in rows if r.get("kind") == CONTINUED), None)

