"""A published run (results/NAME): the folder format, and loading a model back from it.

A published folder is a run directory without what can be rebuilt or is too big to keep in git:

    config.json          the run's config, as trained; its dataset named by name only (data.path: no
                         path of the machine that trained it; found under the data root)
    metrics.jsonl        its log, up to its checkpoint
    summary.json         when it is consistent with that log (the end of a train call)
    eval.json            when the run was evaluated (`reslm eval`)
    weights.safetensors  the TRAINABLE parameters only (requires_grad); buffers such as the reservoir
                         matrices and the fixed embedding are rebuilt from the config's seed
    checkpoint.pt        only while the run is unfinished: optimizer state, step, schedule position
                         (its "model" entry is left out: the weights are weights.safetensors)
    provenance.json      how it was made: command, commit, CPU of each publish, torch, threads, wall times
    manifest.json        format version, sha256 of every file above, the fingerprint of every fixed
                         tensor (shape, dtype, sha256 of its bytes, float64 sum and sum of squares), and
                         the radius of each reservoir draw (radii: loading skips the eigendecomposition)

Never reservoir states, never the dataset. `load_published(folder, model)` fills a freshly built model
(whose buffers the config's seed has just rebuilt) with the folder's weights after checking the
weight file against the manifest and the rebuilt buffers against their fingerprints. A buffer whose
bytes differ but whose sum and sum of squares agree to 1e-5 is the same matrix rounded differently
(an eigenvalue routine of another CPU or BLAS scales the reservoir): accepted with a warning. Anything
else (a missing or altered weight file, another reservoir, a format newer than FORMAT) is a one-line
ReslmError. Every file is read without following links (reslm.core.files.open_plain), and every
listed file is checked against its sha256 before a published folder is used (verify_published).
Publishing (reslm.publish) writes these files; this module only reads and checks them,
so that reslm.models.load can open a published folder like a run.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sys
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_bytes

from reslm.core.errors import ReslmError
from reslm.core.files import plain_name, read_json, read_plain, sha256_file, write_json
from reslm.core.metrics import TEST_LOSS, TEST_STREAM_LOSS, final_of, kept_of
from reslm.run.folder import CONFIG, read_config

FORMAT = 1                       # manifest.json "format"; a folder with a larger one is refused
MANIFEST, WEIGHTS, PROVENANCE = "manifest.json", "weights.safetensors", "provenance.json"
EVAL = "eval.json"
EVAL_WINDOW = "eval-window.json"   # a stream-trained reservoir scored on the paper's windows (reslm.scoring.evaluate)
ROUNDING = 1e-5                  # relative tolerance of a fixed tensor's sum / sum of squares


def is_published(folder: Path) -> bool:
    """True for a published folder (it has manifest.json, or something in its place, which reading it
    refuses), False for a plain run directory."""
    return os.path.lexists(Path(folder) / MANIFEST)


def published_folders(results: Path) -> list[Path]:
    """The published run folders under `results`, by name: real folders (not links) with a manifest,
    except hidden names (".NAME.publish-XXXXXXXX": a publish that was stopped before it renamed its
    folder into place; the next publish of NAME removes it)."""
    results = Path(results)
    if not results.is_dir():
        return []
    return sorted(p for p in results.iterdir() if not p.name.startswith(".") and not p.is_symlink() and p.is_dir()
                  and is_published(p))


def _bytes(t: torch.Tensor) -> bytes:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def fingerprint(t: torch.Tensor) -> dict:
    """shape, dtype, sha256 of the bytes, and (float tensors) the float64 sum and sum of squares."""
    fp = dict(shape=list(t.shape), dtype=str(t.dtype).removeprefix("torch."), sha256=hashlib.sha256(_bytes(t)).hexdigest())
    if t.is_floating_point() or t.is_complex():
        x = torch.view_as_real(t.detach().cpu()) if t.is_complex() else t.detach().cpu()
        x = x.double()
        fp.update(sum=float(x.sum()), sumsq=float((x * x).sum()))
    return fp


def split_state(model: torch.nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(trainable, fixed) tensors of a model's state dict. Trainable: parameters with requires_grad,
    each once (a tied parameter under its first name); fixed: every other state-dict entry."""
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    ids = {id(p) for p in trainable.values()}
    fixed = {k: v for k, v in model.state_dict(keep_vars=True).items() if id(v) not in ids}
    return ({k: v.detach() for k, v in trainable.items()}, {k: v.detach() for k, v in fixed.items()})


def trainable_keys(model: torch.nn.Module) -> list[str]:
    """The state-dict keys that hold trainable parameters, a tied parameter under each of its names."""
    ids = {id(p) for p in model.parameters() if p.requires_grad}
    return [k for k, v in model.state_dict(keep_vars=True).items() if id(v) in ids]


def only_trainable(model: torch.nn.Module, state: dict) -> dict:
    """The entries of a state dict of `model` that hold trainable parameters (what a checkpoint keeps of
    a second copy of the weights: the fixed tensors are the model's own, rebuilt from its seed)."""
    return {k: state[k] for k in trainable_keys(model) if k in state}


def with_fixed(model: torch.nn.Module, state: dict) -> dict:
    """`state` (all of a state dict, or only_trainable of one) completed with the model's own fixed tensors."""
    return {**model.state_dict(), **state}


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 over a model's trainable tensors (names, dtypes, shapes, bytes): the weights an evaluation
    scored, the same whether they were read from a run's checkpoint or a published folder. eval.json
    records it (weights_sha256), so that an evaluation of older weights is never published as the
    run's (see eval_matches)."""
    h = hashlib.sha256()
    for name, t in sorted(split_state(model)[0].items()):
        h.update(f"{name}:{str(t.dtype)}:{tuple(t.shape)}:".encode())
        h.update(_bytes(t))
    return h.hexdigest()


def eval_matches(evaluation: dict, digest: str, step: int | None = None) -> bool | None:
    """Whether eval.json's content scored the weights with `digest` (True / False), or None when it
    records neither the weights nor the step (written before eval.json recorded them)."""
    if isinstance(evaluation.get("weights_sha256"), str):
        return evaluation["weights_sha256"] == digest
    if step is not None and _is_int(evaluation.get("checkpoint_step")):
        return evaluation["checkpoint_step"] == step
    return None


def fixed_fingerprints(model: torch.nn.Module) -> dict[str, dict]:
    return {k: fingerprint(v) for k, v in sorted(split_state(model)[1].items())}


def same_tensor(saved: dict, now: dict) -> str | None:
    """None when two fingerprints are the same tensor, "rounding" when only the bytes differ within
    ROUNDING (see the module doc), else a short reason."""
    if saved.get("shape") != now["shape"] or saved.get("dtype") != now["dtype"]:
        return f"shape/dtype {saved.get('shape')} {saved.get('dtype')} != {now['shape']} {now['dtype']}"
    if saved.get("sha256") == now["sha256"]:
        return None
    if "sumsq" in now and isinstance(saved.get("sumsq"), (int, float)) and isinstance(saved.get("sum"), (int, float)):
        scale = max(now["sumsq"], 1e-30)
        n = max(1, math.prod(now["shape"]))
        if abs(saved["sumsq"] - now["sumsq"]) <= ROUNDING * scale and \
                abs(saved["sum"] - now["sum"]) <= ROUNDING * (n * scale) ** 0.5:
            return "rounding"
    return "different values"


def read_manifest(folder: Path) -> dict:
    """manifest.json of a published folder, checked: a JSON object of a format this reslm reads."""
    folder = Path(folder)
    path = folder / MANIFEST
    data = read_plain(path)   # a link or a special file in its place: ReslmError, not followed
    if data is None:
        raise ReslmError(f"{folder} is not a published run (no {MANIFEST})")
    try:
        m = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ReslmError(f"cannot read {path}: {e.__class__.__name__}: {e}".split("\n")[0]) from None
    if not isinstance(m, dict) or not _is_int(m.get("format")) or not isinstance(m.get("files"), dict) \
            or not isinstance(m.get("fixed"), dict):
        raise ReslmError(f"{path} is not a reslm manifest (it needs format, files and fixed)")
    if m["format"] > FORMAT:
        raise ReslmError(f"{folder} was published in registry format {m['format']}, newer than this reslm reads "
                         f"({FORMAT}): update reslm")
    problem = _manifest_problem(m, path)
    if problem:
        raise ReslmError(f"{path} is not a valid reslm manifest: {problem}")
    return m


_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _manifest_problem(m: dict, path: Path) -> str | None:
    """Why a manifest's fields have the wrong types (files: plain names -> sha256 hex; fixed and
    trainable: tensor fingerprints; step an integer, finished true/false), or None."""
    for name, digest in m["files"].items():
        plain_name(name, str(path))   # a listed file stays inside the folder
        if not isinstance(digest, str) or not _HEX64.match(digest):
            return f"files.{name} must be a sha256 (64 hex digits)"
    for part in ("fixed", "trainable"):
        for name, fp in (m.get(part) or {}).items():
            if not isinstance(fp, dict) or not isinstance(fp.get("shape"), list) \
                    or not all(_is_int(d) and d >= 0 for d in fp["shape"]) or not isinstance(fp.get("dtype"), str):
                return f"{part}.{name} must be an object with a shape (a list of sizes) and a dtype"
            if part == "fixed" and not isinstance(fp.get("sha256"), str):
                return f"fixed.{name}.sha256 must be a string"
            for k in ("sum", "sumsq"):
                if k in fp and (not isinstance(fp[k], (int, float)) or isinstance(fp[k], bool)):
                    return f"{part}.{name}.{k} must be a number"
    if not isinstance(m.get("trainable", {}), dict):
        return "trainable must be an object"
    if "step" in m and not _is_int(m["step"]):
        return "step must be an integer"
    if "finished" in m and not isinstance(m["finished"], bool):
        return "finished must be true or false"
    if "run" in m and not isinstance(m["run"], str):
        return "run must be a string"
    return None


def both_metrics(folder: Path, summary: dict) -> tuple[float | None, float | None]:
    """A run's whole-test-shard CE on the two metrics, (windows, state carried), None where it was not
    measured: each character from a zero state over its 32 preceding ones (the paper's metric), and with
    the state carried through the test text. The run's own metric (summary's test_metric) gives one, of the
    weights it keeps; a stream-mode rnn's summary has the other; a stream-trained reservoir's window
    figure is its eval-window.json scored on every position (`reslm eval RUN --context-mode window
    --score 0 --write`), counted only in a published folder whose manifest records it."""
    metric = run_metric(folder, summary)
    test = summary.get(kept_of(TEST_LOSS), summary.get(final_of(TEST_LOSS)))
    stream = summary.get(kept_of(TEST_STREAM_LOSS), summary.get(final_of(TEST_STREAM_LOSS)))
    window = None
    if metric == "window-32":
        window = test
    elif is_published(folder) and EVAL_WINDOW in read_manifest(folder).get("files", {}):
        ev = read_json(Path(folder) / EVAL_WINDOW) or {}
        window = ev.get(TEST_LOSS) if ev.get("settings", {}).get("score") == 0 else None
    return window, test if metric == "stream" else stream


def run_metric(folder: Path, summary: dict) -> str | None:
    """The metric of a run's test CE: its summary's test_metric ("stream" or "window-<context>"); for a
    character run whose summary does not name it (older, or not yet written), the one training's
    summary_fields gives (reslm.train.batches): a reservoir in stream context carries its state, every
    other reads windows. None for a token run."""
    if summary.get("test_metric"):
        return summary["test_metric"]
    cfg = read_config(folder)
    if cfg.get("data", {}).get("kind", "chars") != "chars":
        return None
    model = cfg.get("model", {})
    return "stream" if "reservoir" in model and model.get("context_mode") == "stream" else \
        f"window-{model.get('context', 32)}"


def read_provenance(folder: Path) -> dict | None:
    """provenance.json of a published folder with its fields type-checked (None when there is none):
    command, cpu, commit, date strings; threads an integer or null; wall an object of numbers or
    nulls; publishes a list of objects with a date, an integer step and a cpu. Anything else is a
    one-line ReslmError naming the field."""
    path = Path(folder) / PROVENANCE
    data = read_plain(path)
    if data is None:
        return None
    try:
        p = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ReslmError(f"cannot read {path}: not JSON ({str(e).splitlines()[0]})") from None
    problem = None
    if not isinstance(p, dict):
        problem = "it must be a JSON object"
    else:
        for k in ("command", "cpu", "commit", "date", "reslm", "torch"):
            if k in p and not isinstance(p[k], str):
                problem = problem or f"{k} must be a string"
        if p.get("threads") is not None and not _is_int(p["threads"]):
            problem = problem or "threads must be an integer or null"
        wall = p.get("wall", {})
        if not isinstance(wall, dict) or any(v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool))
                                             for v in wall.values()):
            problem = problem or "wall must be an object of numbers"
        pubs = p.get("publishes", [])
        if not isinstance(pubs, list) or not all(isinstance(h, dict) and _is_int(h.get("step"))
                                                 and isinstance(h.get("cpu"), str) for h in pubs):
            problem = problem or "publishes must be a list of objects with an integer step and a cpu"
    if problem:
        raise ReslmError(f"{path} is not a valid provenance file: {problem}")
    return p


def verify_published(folder: Path, skip=()) -> dict:
    """The manifest of a published folder after checking every file it lists against its sha256 and
    the types of config.json, provenance.json and the manifest itself: what `reslm report` and
    `reslm publish` read is what was published (an edited metrics.jsonl or eval.json is a one-line
    ReslmError naming the file, not a silently different table). Names in `skip` are not hashed
    (config.json of a resumed run that grew its cycles)."""
    folder = Path(folder)
    m = read_manifest(folder)
    for name in sorted(m["files"]):
        if name not in skip:
            check_file(folder, name, m)
    read_config(folder)
    read_provenance(folder)
    return m


def check_file(folder: Path, name: str, manifest: dict) -> Path:
    """folder/name after checking it against the manifest's sha256 (ReslmError when missing or altered)."""
    path = Path(folder) / name
    want = manifest["files"].get(name)
    if want is None:
        raise ReslmError(f"{folder}/{MANIFEST} does not list {name}")
    if not os.path.lexists(path):
        raise ReslmError(f"{path} is missing (the published run is incomplete)")
    if sha256_file(path) != want:   # a link or special file in its place: ReslmError (open_plain)
        raise ReslmError(f"{path} does not match its sha256 in {MANIFEST} (altered or damaged file)")
    return path


def read_weights(folder: Path, manifest: dict | None = None) -> dict[str, torch.Tensor]:
    """The trainable tensors of a published folder, after checking the file against the manifest."""
    manifest = manifest or read_manifest(folder)
    path = check_file(folder, WEIGHTS, manifest)
    try:
        return load_bytes(read_plain(path) or b"")   # the bytes just checked, read without following links
    except (SafetensorError, OSError, ValueError) as e:
        raise ReslmError(f"cannot read {path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def check_fixed(folder: Path, model: torch.nn.Module, manifest: dict) -> None:
    """ReslmError unless the model's fixed tensors (rebuilt from the config's seed) are the ones the
    folder was published with; a rounding-only difference is a warning on stderr."""
    now = fixed_fingerprints(model)
    saved = manifest["fixed"]
    if set(saved) != set(now):
        extra, missing = sorted(set(now) - set(saved)), sorted(set(saved) - set(now))
        raise ReslmError(f"the fixed tensors rebuilt for {folder} are not the published ones "
                         f"(not in the manifest: {', '.join(extra) or '-'}; missing: {', '.join(missing) or '-'})")
    for name in sorted(now):
        why = same_tensor(saved[name], now[name])
        if why == "rounding":
            print(f"reslm: warning: the rebuilt {name} differs from the published one only by rounding (another "
                  f"CPU or BLAS); losses may differ from the published ones in the last digits", file=sys.stderr)
        elif why is not None:
            raise ReslmError(f"the rebuilt {name} does not match its fingerprint in {folder}/{MANIFEST} ({why}): "
                             f"this reslm does not rebuild the published reservoir from its seed")


def load_published(folder: Path, model: torch.nn.Module, check_config: bool = True) -> torch.nn.Module:
    """Fill `model` (just built from the folder's config.json) with the published trainable weights,
    after checking every listed file (config.json unless check_config is False: a resumed run may have
    grown its cycles) against the manifest (verify_published) and the rebuilt fixed tensors against their
    fingerprints. Returns the model."""
    folder = Path(folder)
    manifest = verify_published(folder, skip=() if check_config else (CONFIG,))   # every file, as published
    check_fixed(folder, model, manifest)
    weights = read_weights(folder, manifest)
    trainable, _ = split_state(model)
    if set(weights) != set(trainable):
        diff = sorted(set(weights) ^ set(trainable))
        raise ReslmError(f"{folder}/{WEIGHTS} does not hold this model's trainable parameters "
                         f"(differs in: {', '.join(diff[:5])}{' ...' if len(diff) > 5 else ''})")
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in weights.items():
            p = params[name]
            if tuple(value.shape) != tuple(p.shape):
                raise ReslmError(f"{folder}/{WEIGHTS}: {name} has shape {tuple(value.shape)}, the model "
                                 f"{tuple(p.shape)}")
            p.copy_(value.to(p.device, p.dtype))
    return model


def record_file(folder: Path, name: str) -> None:
    """Put the current sha256 of folder/name into the folder's manifest (after `reslm eval` rewrote
    eval.json in a published folder)."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    manifest["files"] = dict(sorted({**manifest["files"], name: sha256_file(folder / name)}.items()))
    write_json(folder / MANIFEST, manifest)


__all__ = ["FORMAT", "MANIFEST", "WEIGHTS", "PROVENANCE", "is_published", "fingerprint",
           "split_state", "trainable_keys", "only_trainable", "with_fixed", "fixed_fingerprints", "same_tensor", "read_manifest", "check_file", "read_weights",
           "check_fixed", "load_published", "record_file", "read_provenance", "verify_published", "weights_digest",
           "eval_matches"]
