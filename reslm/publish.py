"""Stage 5, publishing a run into the results registry (`reslm publish RUN results/NAME`), and
continuing a published, unfinished run on any machine (`reslm train --out results/NAME --resume`).

publish(run_dir, dest) writes the folder format of reslm.run.registry from the run's last checkpoint:
config.json, metrics.jsonl up to that checkpoint, summary.json (when it describes that checkpoint),
eval.json, the trainable weights as weights.safetensors, provenance.json and manifest.json. Before
anything is written it checks that the run's fixed tensors (reservoir, embedding) are what its config
rebuilds from the seed, so that the folder can leave them out. An unfinished run also gets its
checkpoint (optimizer state and schedule position; the weights are weights.safetensors), so it can be
continued; once the run is finished, publishing drops it. Publishing again into the same folder
updates it in place, each file atomically; provenance.json then gains one entry per publish that
advanced the run, so a run continued on another machine names both CPUs.

unpacked(folder) is what `reslm train --resume` does around train() on a published folder: the
checkpoint gets its weights back (weights.safetensors on the rebuilt buffers), train() continues it as
it would any run (bitwise the uninterrupted run's result on the same machine), and the folder is
published again in place when train() returns or stops.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import shlex
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import save_file

import reslm
from reslm.core.device import cpu_name
from reslm.core.errors import ReslmError
from reslm.core.files import atomic_write, read_json, sha256_file, write_json
from reslm.models import make_config, preset
from reslm.run.registry import (EVAL, FORMAT, MANIFEST, PROVENANCE, WEIGHTS, fixed_fingerprints, is_published,
                            load_published, read_manifest, same_tensor, split_state)
from reslm.run import (CHECKPOINT, CONFIG, METRICS, SUMMARY, load_checkpoint, lock_run, read_config, read_metrics,
                       save_checkpoint)
from reslm.models.load import load_model
from reslm.train import is_finished, train_config

TIMING = ("wall", "samples_per_s", "seconds", "tokens_per_s")   # metrics fields that differ run to run


def git_commit() -> str:
    """The reslm checkout's commit (short hash, "+dirty" with uncommitted changes), or "unknown"."""
    here = Path(__file__).resolve().parent
    try:
        r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
        d = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here, capture_output=True,
                           text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return r.stdout.strip() + ("+dirty" if d.stdout.strip() else "") if r.returncode == 0 else "unknown"


def _flag(name: str, value) -> list[str]:
    flag = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        return [flag if value else "--no-" + name.replace("_", "-")]
    return [flag, json.dumps(value) if isinstance(value, (dict, list)) else str(value)]


def train_command(cfg: dict) -> str:
    """A `reslm train` command that makes this run: its preset (or family), the model and training
    fields that differ from the preset's and the family's defaults, its dataset and seed."""
    name, over = preset(cfg["preset"]) if cfg.get("preset") else (cfg["family"], {})
    args = ["reslm", "train"] + (["--preset", cfg["preset"]] if cfg.get("preset") else ["--family", name])
    model = asdict(make_config(name, **{**over, "vocab_size": cfg["model"].get("vocab_size")}))
    for k, v in cfg["model"].items():
        if k not in ("seed", "vocab_size") and model.get(k) != v:
            args += _flag(k, v)
    defaults = asdict(train_config(name))
    for k, v in cfg["train"].items():
        if k not in ("seed", "device") and defaults.get(k) != v:
            args += _flag(k, v)
    seed = cfg["train"].get("seed", 0)
    args += ["--data", cfg["data"].get("name", cfg["data"]["path"])] + (["--seed", str(seed)] if seed else [])
    return " ".join(shlex.quote(a) for a in args)


def _consistent_summary(summary: dict | None, rows: list[dict]) -> bool:
    """True when summary.json was written for the log as it stands at the checkpoint."""
    evals = [r for r in rows if r.get("kind") == "eval" and r.get("step", 0) > 0]
    return bool(summary) and summary.get("steps") == (evals[-1]["step"] if evals else 0) \
        and summary.get("evaluations") == len(evals)


def _weights(run_dir: Path, cfg: dict, ck: dict):
    """(model on the CPU with the checkpoint's weights, fingerprints of its fixed tensors), after
    checking that the config's seed rebuilds those fixed tensors."""
    model = load_model(cfg, "cpu")
    rebuilt = fixed_fingerprints(model)
    if "model" not in ck:   # a published folder's own checkpoint: its weights are weights.safetensors
        if not is_published(run_dir):
            raise ReslmError(f"the checkpoint of {run_dir} holds no model weights")
        load_published(run_dir, model, check_config=False)
        return model, read_manifest(run_dir)["fixed"]
    try:
        model.load_state_dict(ck["model"])
    except (RuntimeError, KeyError, TypeError) as e:
        raise ReslmError(f"the checkpoint of {run_dir} does not match its config: "
                         f"{(str(e).strip().splitlines() or [type(e).__name__])[0]}") from None
    trained = fixed_fingerprints(model)
    for name, fp in trained.items():
        if same_tensor(fp, rebuilt[name]) not in (None, "rounding"):
            raise ReslmError(f"{run_dir}: its {name} is not what its config's seed rebuilds, so it cannot be "
                             f"published without it")
    return model, trained


def _provenance(dest: Path, cfg: dict, ck: dict, rows: list[dict], finished: bool, command: str | None,
                date: str) -> dict:
    old = read_json(dest / PROVENANCE) if is_published(dest) else None
    history = list(old.get("publishes", [])) if old else []
    # the processor that trained it (the checkpoint says, where it was written by a reslm that records it)
    trained_on = ck.get("device") if isinstance(ck.get("device"), str) else cpu_name()
    entry = dict(date=date, step=int(ck.get("step", 0)), finished=finished, train_seconds=ck.get("train_seconds"),
                 cpu=trained_on, torch=torch.__version__, threads=torch.get_num_threads(), commit=git_commit())
    if history and history[-1].get("step") == entry["step"]:
        history[-1] = entry          # the same point of the run published again: the latest word on it
    else:
        history.append(entry)
    ev = read_json(dest / EVAL) or {}
    cpus = list(dict.fromkeys(h["cpu"] for h in history))
    return dict(
        format=FORMAT, command=command or (old or {}).get("command") or train_command(cfg),
        reslm=reslm.__version__, torch=torch.__version__, commit=entry["commit"], date=date,
        cpu=" then ".join(cpus), threads=cfg["train"].get("threads") or entry["threads"],
        wall=dict(train_seconds=ck.get("train_seconds"),
                  reservoir_seconds=round(sum(r.get("seconds", 0.0) for r in rows if r.get("kind") == "states"), 3),
                  eval_score_seconds=ev.get("score_seconds"), eval_generation_seconds=ev.get("generation_seconds")),
        publishes=history)


def publish(run_dir: Path, dest: Path, *, command: str | None = None, date: str | None = None) -> dict:
    """Publish the run in run_dir into dest (a new folder, an earlier publish of the same run, or
    run_dir itself); returns the manifest. `command`: the training command to record (default: one
    rebuilt from the config); `date`: ISO date of this publish (default: now, UTC)."""
    run_dir, dest = Path(run_dir), Path(dest)
    cfg = read_config(run_dir)
    ck = load_checkpoint(run_dir)
    if ck is None:
        raise ReslmError(f"{run_dir} has no checkpoint yet: train it before publishing it")
    in_place = dest.resolve() == run_dir.resolve()
    if not in_place and (dest.exists() or dest.is_symlink()):
        if not dest.is_dir():
            raise ReslmError(f"{dest} exists and is not a directory")
        if any(p.name != ".lock" for p in dest.iterdir()) and not is_published(dest):
            raise ReslmError(f"{dest} exists and is not a published run (no {MANIFEST}); pick a new folder")
        if is_published(dest):
            have = read_config(dest)
            if (have["family"], have["model"]) != (cfg["family"], cfg["model"]):
                raise ReslmError(f"{dest} holds another run (a different model); pick a new folder")
    model, fixed = _weights(run_dir, cfg, ck)
    rows = read_metrics(run_dir)[:int(ck.get("metrics_rows", 10**12))]
    summary = read_json(run_dir / SUMMARY)
    summary = summary if _consistent_summary(summary, rows) else None
    finished = summary is not None and is_finished(run_dir) and summary.get("steps") == ck.get("step")
    date = date or datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    evaluation = read_json(run_dir / EVAL)

    dest.mkdir(parents=True, exist_ok=True)
    with lock_run(dest):
        text = "".join(json.dumps(r, allow_nan=False) + "\n" for r in rows)
        if not in_place:
            write_json(dest / CONFIG, cfg)
        atomic_write(dest / METRICS, lambda p: p.write_text(text))
        if summary is not None:
            write_json(dest / SUMMARY, summary)
        if evaluation is not None and not in_place:
            write_json(dest / EVAL, evaluation)
        trainable, _ = split_state(model)
        atomic_write(dest / WEIGHTS, lambda p: save_file({k: v.contiguous() for k, v in trainable.items()}, str(p),
                                                         metadata={"format": str(FORMAT)}))
        if not finished:
            save_checkpoint(dest, {k: v for k, v in ck.items() if k != "model"})
        write_json(dest / PROVENANCE, _provenance(dest, cfg, ck, rows, finished, command, date))
        names = [CONFIG, METRICS, WEIGHTS, PROVENANCE] + [n for n, keep in ((SUMMARY, summary is not None),
                                                                            (EVAL, (dest / EVAL).is_file()),
                                                                            (CHECKPOINT, not finished)) if keep]
        manifest = dict(format=FORMAT, run=cfg.get("preset") or cfg["family"], step=int(ck.get("step", 0)),
                        finished=finished, files={n: sha256_file(dest / n) for n in sorted(names)},
                        trainable={k: dict(shape=list(v.shape), dtype=str(v.dtype).removeprefix("torch."))
                                   for k, v in sorted(trainable.items())},
                        fixed=dict(sorted(fixed.items())))
        write_json(dest / MANIFEST, manifest)
        for name, stale in ((CHECKPOINT, finished), (SUMMARY, summary is None)):
            if stale:
                (dest / name).unlink(missing_ok=True)
    return manifest


def unpack(folder: Path) -> None:
    """Give a published folder's checkpoint its weights back (weights.safetensors on the rebuilt
    buffers), so that train() continues it; a checkpoint that already has them is left as it is."""
    folder = Path(folder)
    ck = load_checkpoint(folder)
    if ck is None:
        raise ReslmError(f"{folder} is a finished published run (no {CHECKPOINT}, no optimizer state): nothing "
                         f"to resume; publish an unfinished run to continue it elsewhere")
    if "model" in ck:
        return
    model = load_published(folder, load_model(read_config(folder), "cpu"), check_config=False)
    save_checkpoint(folder, {**ck, "model": model.state_dict()})


@contextlib.contextmanager
def unpacked(folder: Path):
    """unpack(folder), run the block (train()), then publish the folder in place: after a normal end,
    and also after an error or an interrupt (then a failure to publish is only a warning)."""
    unpack(folder)
    try:
        yield folder
    except BaseException:
        try:
            publish(folder, folder)
        except ReslmError as e:
            print(f"reslm: warning: {folder} was not published again ({e}); run `reslm publish {folder} "
                  f"{folder}`", file=sys.stderr)
        raise
    publish(folder, folder)


__all__ = ["publish", "unpack", "unpacked", "train_command", "git_commit", "TIMING"]
