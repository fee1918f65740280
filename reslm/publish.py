"""Publishing a run into the results registry (`reslm publish RUN results/NAME`), and
continuing a published, unfinished run on any machine (`reslm train --out results/NAME --resume`).

publish(run_dir, dest) writes the folder format of reslm.run.registry from the run's last checkpoint:
config.json, metrics.jsonl up to that checkpoint, summary.json (when it describes that checkpoint),
eval.json, the trainable weights as weights.safetensors, provenance.json and manifest.json (and, for a
reservoir a user's file registered, that file's record and copy: reslm.run.source, never run). Before
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
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

import reslm
from reslm.core.device import cpu_name
from reslm.core.errors import ReslmError, write_error
from reslm.core.files import (atomic_write, exchange, fsync_dir, fsync_tree, make_temp_dir, missing_parents, read_json,
                              remove_empty_dirs, sha256_file, write_json)
from reslm.reservoir import model_radii
from reslm.run.checkpoint import identity_difference
from reslm.run.registry import (EVAL, FORMAT, MANIFEST, PROVENANCE, WEIGHTS, eval_matches, fixed_fingerprints,
                                is_published, load_published, only_trainable, read_manifest, read_provenance,
                                same_tensor, split_state,
                                verify_published, weights_digest)
from reslm.models.identity import command as train_command
from reslm.run import (CHECKPOINT, CONFIG, LOCK, METRICS, SUMMARY, is_finished, load_checkpoint, lock_run, read_config, read_metrics,
                       run_identity, save_checkpoint)
from reslm.run.source import SOURCE, SOURCE_COPY, read_source
from reslm.models.load import load_run_model

TIMING = ("wall", "samples_per_s", "seconds", "tokens_per_s", "eval_seconds")   # metrics fields that differ run to run


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


STOPPED_AGE = 60.0   # seconds: a publish folder left this long by a process that is gone is a leftover
_PUBLISH_FILES = {CONFIG, METRICS, SUMMARY, EVAL, WEIGHTS, PROVENANCE, MANIFEST, CHECKPOINT, SOURCE, SOURCE_COPY}


def _remove_stopped_publishes(dest: Path) -> list[Path]:
    """Remove what a publish of `dest` that was stopped (killed, a power cut) left beside it: folders
    .NAME.publish-XXXXXXXX older than STOPPED_AGE that hold only the files a publish writes (and their
    atomic-write temp files). Anything else, and a publish under way, is left alone."""
    removed = []
    for p in dest.parent.glob(f".{glob.escape(dest.name[:40])}.publish-*"):
        try:
            if p.is_symlink() or not p.is_dir() or time.time() - p.stat().st_mtime < STOPPED_AGE:
                continue
            if any(q.is_symlink() or not q.is_file() or not (q.name in _PUBLISH_FILES or q.name.endswith(".tmp"))
                   for q in p.iterdir()):
                continue
            shutil.rmtree(p)
            removed.append(p)
        except OSError:
            continue
    return removed


def _consistent_summary(summary: dict | None, rows: list[dict]) -> bool:
    """True when summary.json was written for the log as it stands at the checkpoint."""
    evals = [r for r in rows if r.get("kind") == "eval" and r.get("step", 0) > 0]
    return bool(summary) and summary.get("steps") == (evals[-1]["step"] if evals else 0) \
        and summary.get("evaluations") == len(evals)


def _weights(run_dir: Path, cfg: dict, ck: dict):
    """(model on the CPU with the checkpoint's weights, fingerprints of its fixed tensors), after
    checking that the config's seed rebuilds those fixed tensors."""
    model = load_run_model(run_dir, cfg, "cpu")
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


def _trimmed(model, ck: dict) -> dict:
    """What an unfinished published folder keeps of its checkpoint: no "model" (the weights are
    weights.safetensors) and, of its other copies of the weights (an EMA run's raw weights, the best
    on validation), only the trainable tensors: training puts the rebuilt fixed ones back (with_fixed)."""
    out = {k: v for k, v in ck.items() if k != "model"}
    if isinstance(out.get("raw"), dict):
        out["raw"] = only_trainable(model, out["raw"])
    if isinstance(out.get("best"), dict) and isinstance(out["best"].get("model"), dict):
        out["best"] = {**out["best"], "model": only_trainable(model, out["best"]["model"])}
    return out


def _provenance(prior: dict | None, cfg: dict, ck: dict, rows: list[dict], finished: bool, command: str | None,
                date: str, evaluation: dict | None) -> dict:
    """provenance.json: `prior` (the same run's earlier provenance, or None for a first publish) gains
    this publish's entry; the command is the one given, the prior one, or one rebuilt from the config."""
    history = list(prior.get("publishes", [])) if prior else []
    # the processor that trained it (the checkpoint says, where it was written by a reslm that records it)
    trained_on = ck.get("device") if isinstance(ck.get("device"), str) else cpu_name()
    entry = dict(date=date, step=int(ck.get("step", 0)), finished=finished, train_seconds=ck.get("train_seconds"),
                 cpu=trained_on, torch=torch.__version__, threads=torch.get_num_threads(), commit=git_commit())
    if history and history[-1].get("step") == entry["step"]:
        history[-1] = entry          # the same point of the run published again: the latest word on it
    else:
        history.append(entry)
    ev = evaluation or {}
    cpus = list(dict.fromkeys(h["cpu"] for h in history))
    return dict(
        format=FORMAT, command=command or (prior or {}).get("command") or train_command(cfg),
        reslm=reslm.__version__, torch=torch.__version__, commit=entry["commit"], date=date,
        cpu=" then ".join(cpus), threads=cfg["train"].get("threads") or entry["threads"],
        wall=dict(train_seconds=ck.get("train_seconds"),
                  reservoir_seconds=round(sum(r.get("seconds", 0.0) for r in rows if r.get("kind") == "states"), 3),
                  eval_score_seconds=ev.get("score_seconds"), eval_generation_seconds=ev.get("generation_seconds")),
        publishes=history)


def published_config(cfg: dict) -> dict:
    """The config.json of a published folder: the run's, with the dataset named by its name only (the
    path of the machine that trained it means nothing elsewhere; reslm.data.datasets.open_dataset finds
    it by name under the data root)."""
    data = cfg["data"]
    return {**cfg, "data": {**data, "path": data.get("name") or Path(data["path"]).name}}


def _current_eval(folder: Path, digest: str, step: int) -> dict | None:
    """folder/eval.json when it scored the weights being published; None when there is none or it is
    stale (an evaluation from before --resume trained on), with a note on stderr for the stale one. An
    eval.json that records no weights (older reslm) counts as current unless it is older than the
    folder's checkpoint.pt."""
    evaluation = read_json(folder / EVAL)
    if evaluation is None:
        return None
    ok = eval_matches(evaluation, digest, step)
    if ok is None:
        ck = folder / CHECKPOINT
        ok = not (ck.exists() and (folder / EVAL).stat().st_mtime < ck.stat().st_mtime)
    if not ok:
        print(f"reslm: note: {folder / EVAL} scored earlier weights than the run's checkpoint: left out "
              f"(run `reslm eval` again to evaluate these)", file=sys.stderr)
        return None
    return evaluation


def _destination(run_dir: Path, dest: Path, cfg: dict, in_place: bool, replace: bool) -> tuple[bool, dict | None]:
    """(whether dest already holds a folder to swap out, the provenance of the same run to continue or
    None), after checking that dest is ours to write: missing, empty, or a published run of the same
    run (another configuration, seed or dataset only with replace)."""
    prior = read_provenance(run_dir) if is_published(run_dir) else None
    if in_place:
        return False, prior
    if not os.path.lexists(dest):
        return False, prior
    if dest.is_symlink() or not dest.is_dir():
        raise ReslmError(f"{dest} exists and is not a directory" if not dest.is_symlink() else
                         f"{dest} is a symbolic link; publish into a real folder")
    if not is_published(dest):
        if any(p.name != LOCK for p in dest.iterdir()):
            raise ReslmError(f"{dest} exists and is not a published run (no {MANIFEST}); pick a new folder")
        return True, prior
    read_manifest(dest)
    read_provenance(dest)                    # types checked even when it is replaced
    why = identity_difference(run_identity(read_config(dest)), run_identity(cfg))
    if why is not None:
        if not replace:
            raise ReslmError(f"{dest} holds another published run ({why}); pick a new folder, or add --replace "
                             f"to replace it (its provenance and history go with it)")
        return True, prior                   # the replaced run's history is not this one's
    verify_published(dest)                   # the same run: its history continues, so it must be true
    return True, read_provenance(dest)


def publish(run_dir: Path, dest: Path, *, command: str | None = None, date: str | None = None,
            replace: bool = False, check: dict | None = None) -> dict:
    """Publish the run in run_dir into dest (a new folder, an earlier publish of the same run, or
    run_dir itself); returns the manifest. `command`: the training command to record (default: one
    rebuilt from the config); `date`: ISO date of this publish (default: now, UTC); `replace`: dest
    may hold a published run of another configuration (refused otherwise); `check`: the published
    weights' CE on a fixed subset of the test text (reslm.scoring.evaluate.score_check), kept in the manifest for
    `reslm verify` (without it, the destination's earlier check stays when the weights are the same).

    A new or updated dest is written beside it and renamed into place (exchanged with the old folder):
    it appears whole or not at all, and a failed publish leaves nothing to clean up. Publishing a
    folder in place (`reslm train --resume` on results/NAME) rewrites its files one by one, the
    manifest last."""
    run_dir, dest = Path(run_dir), Path(dest)
    cfg = read_config(run_dir)
    ck = _checkpoint_to_publish(run_dir)
    in_place = os.path.lexists(dest) and dest.resolve() == run_dir.resolve()
    swap, prior = _destination(run_dir, dest, cfg, in_place, replace)
    files = _published_files(run_dir, dest, cfg, ck, prior, command=command, date=date, replace=replace, check=check)
    if in_place:
        with lock_run(dest):
            return _write(dest, ck, files, in_place=True)
    return _write_beside(dest, ck, files, swap)


def _checkpoint_to_publish(run_dir: Path) -> dict:
    """The run's last checkpoint, what is published; none is an error (a finished published folder has
    nothing left to publish). A published folder's own checkpoint (no weights in it) is published only
    when its files are as published (config.json aside: its identity is the checkpoint's)."""
    ck = load_checkpoint(run_dir)
    if ck is None:
        if is_published(run_dir) and read_manifest(run_dir).get("finished"):
            raise ReslmError(f"{run_dir} is a finished published run already: nothing to publish (publish a run "
                             "folder into it, or give another destination)")
        raise ReslmError(f"{run_dir} has no checkpoint yet: train it before publishing it")
    if is_published(run_dir) and "model" not in ck:   # a published folder as published: its files must be
        verify_published(run_dir, skip=(CONFIG,))      # (config.json: its identity is the checkpoint's)
    return ck


def _published_files(run_dir: Path, dest: Path, cfg: dict, ck: dict, prior: dict | None, *, command: str | None,
                     date: str | None, replace: bool, check: dict | None) -> dict:
    """What the published folder holds (_write's `f`): the config (the dataset by its name), the log up to
    the checkpoint, the summary when it describes the checkpoint, eval.json when it scored these weights,
    the model and its fixed tensors' fingerprints, whether the run is finished, the check kept, the
    provenance with this publish's entry, and, while unfinished, the checkpoint without its weights."""
    model, fixed = _weights(run_dir, cfg, ck)
    rows = read_metrics(run_dir)[:int(ck.get("metrics_rows", 10**12))]
    summary = read_json(run_dir / SUMMARY)
    summary = summary if _consistent_summary(summary, rows) else None
    finished = summary is not None and is_finished(run_dir) and summary.get("steps") == ck.get("step")
    date = date or datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    digest = weights_digest(model)
    evaluation = _current_eval(run_dir, digest, int(ck.get("step", 0)))
    if evaluation is not None:
        evaluation = {**evaluation, "run": dest.resolve().name}   # no path of this machine
    source = read_source(run_dir)   # a reservoir from a user's file: its record and copy go along (never run)
    return dict(cfg=published_config(cfg), rows=rows, summary=summary, evaluation=evaluation, model=model,
                fixed=fixed, finished=finished, check=_kept_check(dest, check, replace, digest),
                source=None if source is None else (source, (run_dir / SOURCE_COPY).read_bytes()),
                provenance=_provenance(prior, cfg, ck, rows, finished, command, date, evaluation),
                checkpoint=None if finished else _trimmed(model, ck))


def _kept_check(dest: Path, check: dict | None, replace: bool, digest: str) -> dict | None:
    """The check the manifest keeps: the one given, else the destination's earlier one (unless it is
    replaced); never one of other weights than these (`digest`)."""
    if check is None and is_published(dest) and not replace:
        check = read_manifest(dest).get("check")
    return check if check and check.get("weights_digest") == digest else None


def _write_beside(dest: Path, ck: dict, files: dict, swap: bool) -> dict:
    """Write the published folder beside `dest` (its parents made; the leftovers of stopped publishes
    removed) and rename it into place, or exchange it with the folder there (`swap`, under its lock);
    on any failure nothing is left behind, the parents this call made included. Returns the manifest."""
    made, _ = missing_parents(dest)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ReslmError(f"cannot create {dest.parent}: {e.strerror or e}") from None
    _remove_stopped_publishes(dest)
    tmp = make_temp_dir(dest.parent, f".{dest.name[:40]}.publish-")
    try:
        manifest = _write(tmp, ck, files, in_place=False)
        fsync_tree(tmp)
        if swap:
            with lock_run(dest):             # nobody trains or evaluates in it while it is swapped
                exchange(tmp, dest)
        else:
            try:
                os.rename(tmp, dest)
            except OSError as e:
                raise ReslmError(f"cannot publish into {dest}: {e.strerror or e}") from None
            tmp = None
        fsync_dir(dest.parent)
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if not os.path.lexists(dest):
            remove_empty_dirs(made)
        raise
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)   # the swapped-out folder
    return manifest


def _save_weights(tensors: dict, path: Path) -> None:
    """safetensors' save_file, with its failed write (a full disk) as the one-line ReslmError "could not
    write PATH: no space left on device" instead of a SafetensorError traceback."""
    try:
        save_file(tensors, str(path), metadata={"format": str(FORMAT)})
    except SafetensorError as e:
        raise write_error(path, RuntimeError(f"write failed: {e}")) from None


def _write(folder: Path, ck: dict, f: dict, *, in_place: bool) -> dict:
    """Write the published files into `folder` (config, metrics, summary, eval, the reservoir file's record
    and copy, weights, checkpoint while unfinished, provenance, then the manifest over them); in place,
    remove what no longer belongs (a finished run's checkpoint, an inconsistent summary, a stale eval.json)."""
    text = "".join(json.dumps(r, allow_nan=False) + "\n" for r in f["rows"])
    if not in_place:   # in place, config.json is the folder's own (grow_cycles may have raised its cycles)
        write_json(folder / CONFIG, f["cfg"])
    atomic_write(folder / METRICS, lambda p: p.write_text(text))
    if f["summary"] is not None:
        write_json(folder / SUMMARY, f["summary"])
    if f["evaluation"] is not None:
        write_json(folder / EVAL, f["evaluation"])
    if f["source"] is not None and not in_place:   # in place, the folder's own record is the run's
        atomic_write(folder / SOURCE_COPY, lambda p: p.write_bytes(f["source"][1]))
        write_json(folder / SOURCE, f["source"][0])
    trainable, _ = split_state(f["model"])
    atomic_write(folder / WEIGHTS, lambda p: _save_weights({k: v.contiguous() for k, v in trainable.items()}, p))
    if f["checkpoint"] is not None:
        save_checkpoint(folder, f["checkpoint"])
    write_json(folder / PROVENANCE, f["provenance"])
    if in_place:
        for name, stale in ((CHECKPOINT, f["finished"]), (SUMMARY, f["summary"] is None),
                            (EVAL, f["evaluation"] is None)):
            if stale:
                (folder / name).unlink(missing_ok=True)
    names = [CONFIG, METRICS, WEIGHTS, PROVENANCE] + [n for n, keep in ((SUMMARY, f["summary"] is not None),
                                                                        (EVAL, f["evaluation"] is not None),
                                                                        (CHECKPOINT, not f["finished"]),
                                                                        (SOURCE, f["source"] is not None),
                                                                        (SOURCE_COPY, f["source"] is not None)) if keep]
    manifest = dict(format=FORMAT, run=f["cfg"].get("preset") or f["cfg"]["family"], step=int(ck.get("step", 0)),
                    finished=f["finished"], files={n: sha256_file(folder / n) for n in sorted(names)},
                    trainable={k: dict(shape=list(v.shape), dtype=str(v.dtype).removeprefix("torch."))
                               for k, v in sorted(trainable.items())},
                    fixed=dict(sorted(f["fixed"].items())), radii=model_radii(f["model"]),
                    **({"check": f["check"]} if f.get("check") else {}))
    write_json(folder / MANIFEST, manifest)
    return manifest


def check_resumable(folder: Path) -> None:
    """ReslmError unless the published `folder` holds a checkpoint to continue from (a finished run's
    publish drops it): `reslm train --resume` asks before it changes anything in the folder."""
    folder = Path(folder)
    if (folder / CHECKPOINT).is_file():
        return
    if read_manifest(folder).get("finished"):
        raise ReslmError(f"{folder} is a finished published run (no {CHECKPOINT}, no optimizer state): nothing "
                         f"to resume; publish an unfinished run to continue it elsewhere")
    raise ReslmError(f"{folder} is an unfinished published run whose {CHECKPOINT} is missing (its manifest "
                     f"lists one): restore the folder (git checkout {folder}) to continue it")


def unpack(folder: Path) -> None:
    """Give a published folder's checkpoint its weights back (weights.safetensors on the rebuilt
    buffers), so that train() continues it; a checkpoint that already has them is left as it is."""
    folder = Path(folder)
    ck = load_checkpoint(folder)
    if ck is None:
        check_resumable(folder)
    if "model" in ck:
        return   # unpacked already: a run folder whose training was stopped before it was published again
    verify_published(folder, skip=(CONFIG,))   # never continue (and re-sign) an edited metrics.jsonl or summary
    model = load_published(folder, load_run_model(folder, read_config(folder), "cpu"), check_config=False)
    save_checkpoint(folder, {**ck, "model": model.state_dict()})


@contextlib.contextmanager
def unpacked(folder: Path):
    """unpack(folder), run the block (train()), then publish the folder in place: after a normal end,
    and also after an error or an interrupt (then a failure to publish is only a warning). A block that
    trained no step (a missing dataset, an interrupt before the first step) leaves the published files as they were."""
    folder = Path(folder)
    saved = Path(tempfile.mkdtemp(prefix="reslm-published-"))   # a copy of the published files (a few MB)
    try:
        for f in folder.iterdir():
            if f.is_file() and not f.is_symlink():
                shutil.copy2(f, saved / f.name)
        step = _checkpoint_step(folder)
        unpack(folder)
        try:
            yield folder
        except BaseException:
            if _checkpoint_step(folder) == step:
                _restore(saved, folder)
                raise
            try:
                publish(folder, folder)
            except ReslmError as e:
                print(f"reslm: warning: {folder} was not published again ({e}); run `reslm publish {folder} "
                      f"{folder}`", file=sys.stderr)
            raise
        if _checkpoint_step(folder) == step:
            _restore(saved, folder)
        else:
            publish(folder, folder)
    finally:
        shutil.rmtree(saved, ignore_errors=True)


def _checkpoint_step(folder: Path) -> int | None:
    try:
        ck = load_checkpoint(folder)
    except ReslmError:
        return None
    return None if ck is None else int(ck.get("step", -1))


def _restore(saved: Path, folder: Path) -> None:
    """Put the published files copied to `saved` back into `folder`, each by an atomic rename."""
    for f in saved.iterdir():
        shutil.copy2(f, folder / f".{f.name}.restore")
        os.replace(folder / f".{f.name}.restore", folder / f.name)


__all__ = ["publish", "published_config", "unpack", "unpacked", "train_command", "git_commit", "TIMING"]
