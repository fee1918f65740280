"""checkpoint.pt: saving and loading a run's training state, checked against the run it belongs to.

A checkpoint holds model + optimizer + grad scaler + schedule position (plain tensors and numbers:
torch.load(..., weights_only=True) reads it), the identity of its run (run_identity: a hash of the
model and training fields, seed and dataset fingerprint of config.json) and a sha256 checksum over
all of it: load_checkpoint refuses one copied from another run or one whose bytes changed on disk
with a one-line ReslmError. A checkpoint written before identities existed is read with a warning.
It is written atomically (reslm.core.files.atomic_write): a kill leaves the last complete checkpoint.
"""
from __future__ import annotations

import hashlib
import io
import json
import sys
from pathlib import Path

import torch

from reslm.core.errors import ReslmError, describe
from reslm.core.files import atomic_write, read_plain
from reslm.run.folder import CHECKPOINT, CONFIG, read_config

def _torch_save(state: dict, path: Path) -> None:
    with open(path, "wb") as f:  # a file object: a full disk surfaces as OSError(ENOSPC), not "unexpected pos"
        torch.save(state, f)


# what a checkpoint holds besides the training state: the identity of its run and its checksum
RUN_KEY, CHECKSUM = "run", "checksum"
# training fields that do not make a run another run: where it runs (device, precision, threads), which
# window step computes the transformer (window_step: the same model either way), and its number of cycles,
# which grow_cycles raises in config.json under an existing checkpoint
_NOT_IDENTITY = ("device", "precision", "threads", "window_step", "cycles")


def run_identity(cfg: dict) -> dict:
    """What names the run a checkpoint belongs to: family, model fields, training fields (not where it
    runs: device, precision, threads, window_step; not cycles, which a run may grow), the seed and the dataset
    fingerprint of its config.json, and `key`, a sha256 over all of them. Labels (preset, versions)
    and the dataset's path are not part of it."""
    data = cfg.get("data") or {}
    data = data.get("fingerprint") or {k: data.get(k) for k in ("kind", "vocab", "vocab_size", "name")}
    train = {k: v for k, v in (cfg.get("train") or {}).items() if k not in _NOT_IDENTITY}
    body = dict(family=cfg.get("family"), model=cfg.get("model"), train=train,
                data=hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16])
    key = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
    return dict(key=key, seed=train.get("seed"), **body)


def _digest(state) -> str:
    """sha256 over a checkpoint's contents: every tensor's dtype, shape and bytes, every key and plain
    value, in order (torch.save keeps dict order), so a flipped bit anywhere changes it."""
    h = hashlib.sha256()

    def walk(obj):
        if isinstance(obj, torch.Tensor):
            t = obj.detach().cpu().contiguous()
            h.update(f"T{t.dtype}{tuple(t.shape)}:".encode())
            h.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
        elif isinstance(obj, dict):
            h.update(b"{")
            for k, v in obj.items():
                h.update(f"{type(k).__name__}:{k!r}=".encode())
                walk(v)
            h.update(b"}")
        elif isinstance(obj, (list, tuple)):
            h.update(b"[")
            for v in obj:
                walk(v)
            h.update(b"]")
        else:
            h.update(f"{type(obj).__name__}:{obj!r};".encode())

    walk({k: v for k, v in state.items() if k != CHECKSUM})
    return h.hexdigest()


def save_checkpoint(run_dir: Path, state: dict) -> None:
    """Write checkpoint.pt atomically (see atomic_write): a failed save keeps the previous checkpoint
    byte for byte and raises ReslmError "could not write RUN/checkpoint.pt: no space left on device".
    The run's identity (run_identity of RUN/config.json, when there is one) and a sha256 over
    everything (_digest) are saved with `state`; load_checkpoint checks both."""
    run_dir = Path(run_dir)
    state = dict(state)
    if (run_dir / CONFIG).is_file():
        state[RUN_KEY] = run_identity(read_config(run_dir))
    state[CHECKSUM] = _digest(state)
    atomic_write(run_dir / CHECKPOINT, lambda p: _torch_save(state, p))


def identity_difference(have: dict, want: dict) -> str | None:
    """What first tells two run identities (run_identity) apart, in a few words ("seed 0, not 1",
    "lr 0.003, not 0.001", "made on another dataset"), or None when they name the same run."""
    if have.get("key") == want.get("key"):
        return None
    return _why(have, want) or "another config"


def _why(have: dict, want: dict) -> str | None:
    why = None
    if have.get("seed") != want.get("seed"):
        why = f"seed {have.get('seed')}, not {want.get('seed')}"
    elif have.get("family") != want.get("family"):
        why = f"family {have.get('family')}, not {want.get('family')}"
    elif have.get("data") != want.get("data"):
        why = "made on another dataset"
    else:
        for part in ("model", "train"):
            a, b = have.get(part) or {}, want.get(part) or {}
            diff = sorted(k for k in set(a) | set(b) if json.dumps(a.get(k)) != json.dumps(b.get(k)))
            if diff:
                k = diff[0]
                why = f"{k} {a.get(k, 'unset')}, not {b.get(k, 'unset')}"
                break
    return why


def _other_run(path: Path, have: dict, want: dict) -> str:
    """The one-line refusal of a checkpoint whose run identity `have` is not the folder's `want`."""
    why = _why(have, want)
    return (f"{path} belongs to another run ({why or 'another config'}); put back this run's own checkpoint, "
            f"or remove it to train this run from the start")


def _check_checkpoint(run_dir: Path, path: Path, state: dict) -> str | None:
    """Why `state` (read from `path`) must not be used for run_dir, or None. Warns on stderr for a
    checkpoint from before identities and checksums (it cannot be checked)."""
    if CHECKSUM in state:
        if state[CHECKSUM] != _digest(state):
            return ("its contents do not match the checksum saved with them (damaged on disk?); restore it "
                    "from a copy, or remove it to train the run from the start")
    if RUN_KEY in state:
        if (run_dir / CONFIG).is_file():
            have, want = state[RUN_KEY], run_identity(read_config(run_dir))
            if not isinstance(have, dict) or have.get("key") != want["key"]:
                raise ReslmError(_other_run(path, have if isinstance(have, dict) else {}, want))
    elif (run_dir / CONFIG).is_file():
        print(f"reslm: warning: {path} was written by an older reslm: it names no run and has no checksum, "
              f"so it is used unchecked", file=sys.stderr)
    return None


def load_checkpoint(run_dir: Path, map_location="cpu") -> dict | None:
    """The checkpoint dict, or None when the run has none yet. An empty, foreign, truncated or unsafe
    (objects other than tensors and plain values) file raises a one-line ReslmError, and so does one
    whose checksum does not match its contents (a flipped bit on disk) or that belongs to another run
    (its identity is not run_identity of RUN/config.json: "RUN/checkpoint.pt belongs to another run
    (seed 0, not 1); ..."). One written before identities is used with a warning on stderr."""
    path = Path(run_dir) / CHECKPOINT
    if not (path.exists() or path.is_symlink()):
        return None
    problem, state = None, None
    try:   # a link or a special file (a FIFO would hang the read) is refused, not followed
        data = read_plain(path) or b""
        if not data:
            problem = "the file is empty"
        elif data[:4] != b"PK\x03\x04":  # torch.save writes a zip archive
            problem = "not a PyTorch checkpoint (a foreign file?)"
        else:
            state = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except ReslmError:
        raise
    except Exception as e:
        msg = str(e)
        if "Weights only load failed" in msg:
            problem = "it holds objects other than tensors and plain values (weights_only refuses them)"
        elif any(s in msg for s in ("zip archive", "central directory", "PytorchStreamReader", "seek")) or \
                isinstance(e, (EOFError, OSError, ValueError)):   # a zip cut short: whatever the reader says
            problem = "the file is truncated or damaged"
        else:
            problem = describe(e)
    if problem is None and not isinstance(state, dict):
        problem = f"not a reslm checkpoint (it holds a {type(state).__name__}, not a dict)"
    if problem is None:
        problem = _check_checkpoint(Path(run_dir), path, state)
    if problem is not None:
        raise ReslmError(f"cannot read checkpoint {path}: {problem}")
    return state
