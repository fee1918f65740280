"""Stage 4, the run directory: the interface between training, generation, evaluation and reports.

    RUN_DIR/config.json      resolved config: family, preset, model fields, train fields, data, versions
    RUN_DIR/metrics.jsonl    one JSON row per logged step ("kind": "step"), per shard-epoch ("epoch"),
                             per shard's reservoir precomputation ("states"), and a final "done" row
    RUN_DIR/checkpoint.pt    model + optimizer + grad scaler + schedule position (plain tensors and
                             numbers: torch.load(..., weights_only=True) reads it), the identity of the
                             run it belongs to and a sha256 checksum over all of it (save_checkpoint)
    RUN_DIR/summary.json     written by train at the end (write_json)
    RUN_DIR/.lock            who holds the run (lock_run flocks the run folder itself and this file); it may stay

Writers hold `lock_run(run_dir)` (train, resume, eval; reproduce/sweep lock their output folder the
same way); readers (generate, reports) need no lock. A second writer gets RunInUse, a ReslmError:
"RUN is in use by pid N (reslm train ... since 12:34:56); wait for it or stop it". The lock is on the
folder itself, so deleting RUN/.lock does not release it. The kernel drops the lock when its process
ends in any way, so a killed run leaves no stale lock.

Files are written atomically and durably (temp file, fsync, rename, fsync of the folder), so a kill
or a power cut leaves the last complete checkpoint, never a half-written one. A failed write (disk
full) raises ReslmError "could not write PATH: no space left on device", keeps the previous file and
leaves no temp file; temp files left by a kill are removed by clean_stale_temps (lock_run calls it),
which removes only the names reslm writes, and only in a folder reslm made: never a user's file.

A checkpoint names its run (run_identity: a hash of the model and training fields, seed and dataset
fingerprint of config.json) and carries a checksum over its tensors and values: load_checkpoint
refuses one copied from another run or one whose bytes changed on disk with a one-line ReslmError.
A checkpoint written before identities existed is read with a warning. Resuming needs the metrics
rows the checkpoint had seen (MetricsLog.truncate): a short or missing log is an error, not a
silently shorter history.
metrics.jsonl is appended and fsynced row by row; a last row cut off by a kill or a full disk is
dropped with a warning on stderr when the log is read again (a damaged row before it is an error).

JSON files are strict JSON: write_json and MetricsLog.write refuse NaN and +-Infinity with a
ReslmError naming the key, before anything is written. Callers pass None for a missing value and
check a loss is finite before logging it (a diverged run should stop with its own message).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import math
import os
import re
import shlex
import shutil
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from reslm.data.corpus import fsync_dir
from reslm.errors import ReslmError, RunInUse, describe

CONFIG, METRICS, CHECKPOINT, SUMMARY, LOCK = "config.json", "metrics.jsonl", "checkpoint.pt", "summary.json", ".lock"

NAME_MAX = 255  # bytes in one path component (Linux, macOS)
_TEMP_DIR = re.compile(r"^\..+\.tmp-[a-z0-9_]{8}$")  # create_run_dir's tempfile.mkdtemp folders
_TEMP_DIR_AGE = 60.0  # seconds: a younger temp folder may be another creator's, mid-rename
# atomic_write's temp files (tempfile.mkstemp: ".NAME." + 8 random characters + ".tmp") of the files
# reslm writes with it into a run or output folder; clean_stale_temps removes no other name
_WRITTEN = (r"config\.json|checkpoint\.pt|summary\.json|metrics\.jsonl|eval(-[^/]+)?\.json|eval-physical\.csv"
            r"|budget\.json|results\.json|report\.md|scaling_fit\.json|ngram\.json"
            r"|manifest\.json|weights\.safetensors|provenance\.json")   # the last three: published run folders
_TEMP_FILE = re.compile(rf"^\.({_WRITTEN})\.[a-z0-9_]{{8}}\.tmp$")
_MARKERS = ("budget.json",)  # besides config.json: what reproduce and lab write first into their folder


# ---------------------------------------------------------------------------------------------------
# writing files

def _reason(e: OSError) -> str:
    """'no space left on device' for OSError(ENOSPC); describe() for anything else."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror[:1].lower() + e.strerror[1:]
    return describe(e)


def _low_on_space(folder: Path) -> bool:
    try:
        st = os.statvfs(folder)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < 64 * 2**20


def _write_error(path: Path, e: BaseException) -> ReslmError | None:
    """The one-line error for a failed write of `path`, or None to re-raise `e` as it is."""
    if isinstance(e, OSError):
        return ReslmError(f"could not write {path}: {_reason(e)}")
    if isinstance(e, RuntimeError) and any(s in str(e) for s in ("unexpected pos", "write failed")):
        # torch.save given a path reports a full disk as "[enforce fail ...] unexpected pos 704 vs 598"
        why = "no space left on device" if _low_on_space(path.parent) else describe(e)
        return ReslmError(f"could not write {path}: {why}")
    return None


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write) -> None:
    """Call write(tmp_path) on a temp file next to `path`, fsync it, rename it onto `path`, fsync the
    folder. On any failure `path` keeps its previous content and the temp file is removed; an OSError
    (ENOSPC, EACCES, ...) or torch's failed-write RuntimeError becomes a one-line ReslmError
    "could not write PATH: no space left on device". A ReslmError from `write` passes through."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:200]}.", suffix=".tmp")
    except OSError as e:
        raise ReslmError(f"could not write {path}: {_reason(e)}") from None
    os.close(fd)
    tmp = Path(tmp)
    try:
        write(tmp)
        _fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException as e:
        err = _write_error(path, e)  # before the unlink, which frees the space _low_on_space looks at
        tmp.unlink(missing_ok=True)
        if err is not None:
            raise err from None
        raise
    fsync_dir(path.parent)


def _non_finite(obj, where: str = ""):
    """(key path, value) of the first NaN/Infinity in a JSON-like object, or None."""
    if isinstance(obj, float):
        return None if math.isfinite(obj) else (where or "the value", obj)
    if isinstance(obj, dict):
        items = ((f"{where}.{k}" if where else str(k), v) for k, v in obj.items())
    elif isinstance(obj, (list, tuple)):
        items = ((f"{where}[{i}]", v) for i, v in enumerate(obj))
    else:
        return None
    for w, v in items:
        bad = _non_finite(v, w)
        if bad is not None:
            return bad
    return None


def _strict_dumps(obj, path: Path, **kw) -> str:
    bad = _non_finite(obj)
    if bad is not None:
        raise ReslmError(f"cannot write {path}: {bad[0]} is {bad[1]}, not a finite number "
                         f"(JSON has no NaN or Infinity; use null for a missing value)")
    return json.dumps(obj, allow_nan=False, **kw)


def write_json(path: Path, obj) -> None:
    """Write `obj` as strict, indented JSON, atomically (see atomic_write). A NaN or Infinity anywhere
    in `obj` raises ReslmError naming its key ("cannot write PATH: fits.rc.r2 is nan, not a finite
    number ...") and nothing is written."""
    text = _strict_dumps(obj, Path(path), indent=2) + "\n"
    atomic_write(path, lambda p: p.write_text(text))


# ---------------------------------------------------------------------------------------------------
# the lock

_held: dict[tuple[int, str], list] = {}  # (pid, real path) -> [fd, depth]; pid: a forked child holds nothing
_held_guard = threading.Lock()


def _command_line() -> str:
    argv = list(sys.argv) or ["python"]
    name = os.path.basename(argv[0]) or "python"
    if name == "__main__.py":  # python -m reslm
        name = os.path.basename(os.path.dirname(argv[0])) or "python"
    elif name in ("-c", "-m"):
        name = f"python {name}"
    line = " ".join([name] + [shlex.quote(a) for a in argv[1:]])
    line = "".join(c if c.isprintable() else "?" for c in line)
    return line if len(line) <= 100 else line[:97] + "..."


def _holder(run_dir: Path) -> dict | None:
    """What the holder of run_dir's lock wrote into the lock file (it may be mid-write: retry briefly)."""
    for _ in range(5):
        try:
            info = json.loads((run_dir / LOCK).read_text())
            if isinstance(info, dict) and "pid" in info:
                return info
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    return None


def _in_use(run_dir: Path) -> str:
    info = _holder(run_dir)
    if info is None:
        return f"{run_dir} is in use by another process; wait for it or stop it"
    who = f"pid {info['pid']}"
    if info.get("host") and info["host"] != socket.gethostname():
        who += f" on {info['host']}"
    what = []
    if info.get("command"):
        what.append(str(info["command"]))
    if isinstance(info.get("started"), (int, float)):
        start = time.localtime(info["started"])
        same_day = time.strftime("%Y-%m-%d", start) == time.strftime("%Y-%m-%d")
        what.append("since " + time.strftime("%H:%M:%S" if same_day else "%Y-%m-%d %H:%M:%S", start))
    detail = f" ({' '.join(what)})" if what else ""
    return f"{run_dir} is in use by {who}{detail}; wait for it or stop it"


def _flock(fd: int, run_dir: Path) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise RunInUse(_in_use(run_dir)) from None
        raise ReslmError(f"cannot lock {run_dir}: {_reason(e)}") from None


def _acquire(run_dir: Path) -> tuple[int, int]:
    """flock the folder itself (no one can delete it from under a live holder, as they can RUN/.lock),
    then RUN/.lock (what reslm versions before the folder lock took) and write the holder into it."""
    cloexec = getattr(os, "O_CLOEXEC", 0)
    try:
        dfd = os.open(run_dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | cloexec)
    except OSError as e:
        raise ReslmError(f"cannot lock {run_dir}: {_reason(e)}") from None
    _flock(dfd, run_dir)
    path = run_dir / LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | cloexec, 0o644)
    except OSError as e:
        os.close(dfd)
        raise ReslmError(f"cannot lock {run_dir}: {_reason(e)}") from None
    try:
        _flock(fd, run_dir)
    except BaseException:
        os.close(dfd)
        raise
    info = dict(pid=os.getpid(), host=socket.gethostname(), command=_command_line(), started=time.time())
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
    except OSError:
        pass  # who holds it is a courtesy for the error message; the flock is the lock
    return dfd, fd


@contextlib.contextmanager
def lock_run(run_dir: Path, *, create: bool = False):
    """Hold an exclusive lock on a run directory or a folder of runs (any directory) for the `with` block.

    Non-blocking: if another process holds it, raises RunInUse (a ReslmError) at once:
    "RUN is in use by pid N (reslm train ... since HH:MM:SS); wait for it or stop it".
    Re-entrant within one process (train holding it may call eval, which takes it again); threads of
    one process share it. The lock is flock(2) on the directory itself (deleting RUN/.lock while a run
    trains does not let a second writer in) and on RUN/.lock, which records the holder; the kernel
    releases it when the process exits or is killed, so there is no stale lock to remove. Only the
    process that took it holds it (a forked child that calls lock_run is refused), so under torchrun
    only rank 0 should take it. On first acquiring, temp files left by a killed writer are removed
    (clean_stale_temps: only reslm's own names, only in a folder reslm made). A missing directory is
    a ReslmError unless create=True (then it is made). Yields the directory as a Path.
    """
    run_dir = Path(run_dir)
    if create:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ReslmError(f"cannot create {run_dir}: {_reason(e)}") from None
    if not run_dir.is_dir():
        raise ReslmError(f"{run_dir} is not a directory" if run_dir.exists() else f"{run_dir} does not exist")
    key = (os.getpid(), os.path.realpath(run_dir))
    with _held_guard:
        entry = _held.get(key)
        first = entry is None
        if first:
            had_lock = (run_dir / LOCK).is_file()    # a reslm process locked this folder before
            entry = _held[key] = [_acquire(run_dir), 0]
        entry[1] += 1
    if first:
        clean_stale_temps(run_dir, ours=had_lock)
    try:
        yield run_dir
    finally:
        with _held_guard:
            entry[1] -= 1
            if entry[1] == 0:
                del _held[key]
                for fd in entry[0]:
                    os.close(fd)  # releases the flocks


def is_reslm_folder(folder: Path) -> bool:
    """True for a folder reslm made: a run (config.json, a JSON object with a family) or a reproduce/lab
    output folder (budget.json)."""
    folder = Path(folder)
    if any((folder / m).is_file() for m in _MARKERS):
        return True
    try:
        cfg = json.loads((folder / CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and "family" in cfg


def check_output_folder(out: Path, stamp: str, what: str) -> None:
    """ReslmError unless `out` is missing, empty (a .lock aside) or holds `stamp` (the file a
    reproduction or lab writes first into its folder): such a command never writes into, or sweeps,
    a folder of the user's."""
    out = Path(out)
    if not out.is_dir() or (out / stamp).is_file():
        return
    try:
        foreign = any(p.name != LOCK for p in out.iterdir())
    except OSError as e:
        raise ReslmError(f"cannot use {_shown(out)}: {_reason(e)}") from None
    if foreign:
        raise ReslmError(f"{_shown(out)} already exists and is not {what} (no {stamp}); pick another --out")


def clean_stale_temps(run_dir: Path, *, ours: bool = False) -> list[Path]:
    """Remove the temp files a killed writer left in `run_dir`: atomic_write's ".NAME.XXXXXXXX.tmp" of
    the files reslm writes (config.json, checkpoint.pt, metrics.jsonl, summary.json, eval*.json, ...;
    no other name) and create_run_dir's ".NAME.tmp-XXXXXXXX" folders older than a minute that hold
    nothing but their config.json. Only in a folder reslm made (is_reslm_folder, or `ours`: lock_run
    found its .lock from an earlier reslm process): a user's folder is never touched, whatever its
    files are called. Call it only while holding lock_run(run_dir) (lock_run does), when no other
    writer can be mid-write. Returns what was removed; never raises."""
    removed: list[Path] = []
    if not (ours or is_reslm_folder(run_dir)):
        return removed
    try:
        entries = list(Path(run_dir).iterdir())
    except OSError:
        return removed
    now = time.time()
    for p in entries:
        name = p.name
        try:
            if p.is_symlink():
                continue
            if _TEMP_FILE.match(name) and p.is_file():
                p.unlink()
            elif _TEMP_DIR.match(name) and p.is_dir() and now - p.stat().st_mtime > _TEMP_DIR_AGE:
                if any(q.name != CONFIG or not q.is_file() or q.is_symlink() for q in p.iterdir()):
                    continue  # not only what create_run_dir puts there: not ours to remove
                (p / CONFIG).unlink(missing_ok=True)
                p.rmdir()
            else:
                continue
            removed.append(p)
        except OSError:
            pass
    return removed


# ---------------------------------------------------------------------------------------------------
# config.json

def _shown(path) -> str:
    s = str(path)
    if any(not c.isprintable() for c in s):
        s = repr(s)
    return s if len(s) <= 160 else s[:80] + "..." + s[-40:]


def _check_out_name(out: Path) -> None:
    s = str(out)
    if not s:
        raise ReslmError("the run directory name is empty")
    if any(ord(c) < 32 or ord(c) == 127 for c in s):
        raise ReslmError(f"cannot create run directory {_shown(out)}: the name has control characters")
    for part in out.parts:
        try:
            n = len(os.fsencode(part))
        except UnicodeError:
            raise ReslmError(f"cannot create run directory {_shown(out)}: the name is not valid text") from None
        if n > NAME_MAX:
            raise ReslmError(f"cannot create run directory {_shown(out)}: a name is {n} bytes long "
                             f"(at most {NAME_MAX})")


def _make_parents(out: Path) -> list[Path]:
    """Create out's missing parent folders; return them (outermost first) so a failure can remove them."""
    missing, p = [], out.parent
    while not (p.exists() or p.is_symlink()) and p.parent != p:
        missing.append(p)
        p = p.parent
    if not p.is_dir():
        raise ReslmError(f"cannot create run directory {_shown(out)}: {_shown(p)} is not a directory")
    created = []
    for q in reversed(missing):
        try:
            q.mkdir()
        except OSError as e:
            _remove_dirs(created)
            raise ReslmError(f"cannot create run directory {_shown(out)}: {_reason(e)}") from None
        created.append(q)
    return created


def _remove_dirs(created: list[Path]) -> None:
    for q in reversed(created):
        with contextlib.suppress(OSError):
            q.rmdir()


def create_run_dir(out: Path, config: dict) -> Path:
    """Make a new run directory holding config.json. It appears only once config.json is complete (a
    temp folder renamed into place); an existing empty folder (or one holding only .lock: a caller
    may lock it first) gets config.json written into it. A path that cannot work (under a file, in
    /proc, unwritable, a name over 255 bytes or with control characters, an existing non-empty
    folder, a file) raises a one-line ReslmError and creates nothing."""
    out = Path(out)
    _check_out_name(out)
    text = _strict_dumps(config, out / CONFIG, indent=2) + "\n"  # a bad config fails before anything is made
    if out.exists() or out.is_symlink():
        if not out.is_dir():
            raise ReslmError(f"{_shown(out)} exists and is not a directory")
        try:
            leftovers = [p for p in out.iterdir() if p.name != LOCK]
        except OSError as e:
            raise ReslmError(f"cannot use {_shown(out)} as a run directory: {_reason(e)}") from None
        if leftovers:
            raise ReslmError(f"{_shown(out)} already exists and is not empty "
                             f"(use --resume to continue a run there)")
        atomic_write(out / CONFIG, lambda p: p.write_text(text))
        return out
    created = _make_parents(out)
    tmp = None
    try:
        try:
            tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name[:40]}.tmp-"))
            (tmp / CONFIG).write_text(text)
            _fsync_file(tmp / CONFIG)
        except OSError as e:
            raise ReslmError(f"cannot create run directory {_shown(out)}: {_reason(e)}") from None
        try:
            os.replace(tmp, out)
        except OSError as e:
            if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                raise ReslmError(f"{_shown(out)} already exists (another process made it just now)") from None
            raise ReslmError(f"cannot create run directory {_shown(out)}: {_reason(e)}") from None
        tmp = None
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        _remove_dirs(created)
        raise
    fsync_dir(out.parent)
    return out


def _config_problem(cfg) -> str | None:
    if not isinstance(cfg, dict):
        return "it must be a JSON object"
    if "family" not in cfg:
        return "'family' is missing"
    if not isinstance(cfg["family"], str) or not cfg["family"]:
        return "'family' must be a non-empty string"
    if cfg.get("preset") is not None and not isinstance(cfg["preset"], str):
        return "'preset' must be a string or null"
    for key in ("model", "train", "data"):
        if key not in cfg:
            return f"{key!r} is missing"
        if not isinstance(cfg[key], dict):
            return f"{key!r} must be an object"
    if not isinstance(cfg["data"].get("path"), str):
        return "'data.path' must be a string"
    return None


def read_config(run_dir: Path) -> dict:
    """config.json of a run, checked: family a string, model/train/data objects, data.path a string.
    Anything else raises ReslmError "RUN/config.json is not a valid run config: 'model' must be an object"."""
    run_dir = Path(run_dir)
    path = run_dir / CONFIG
    if not path.is_file():
        raise ReslmError(f"{run_dir} is not a reslm run directory (no {CONFIG})")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ReslmError(f"cannot read {path}: {_reason(e)}") from None
    except UnicodeDecodeError:
        raise ReslmError(f"cannot read {path}: it is not UTF-8 text") from None
    if not text.strip():
        raise ReslmError(f"{path} is not a valid run config: the file is empty")
    try:
        cfg = json.loads(text)
    except ValueError as e:
        raise ReslmError(f"{path} is not a valid run config: not JSON ({describe(e)})") from None
    problem = _config_problem(cfg)
    if problem:
        raise ReslmError(f"{path} is not a valid run config: {problem}")
    return cfg


# ---------------------------------------------------------------------------------------------------
# checkpoint.pt

def _torch_save(state: dict, path: Path) -> None:
    with open(path, "wb") as f:  # a file object: a full disk surfaces as OSError(ENOSPC), not "unexpected pos"
        torch.save(state, f)


# what a checkpoint holds besides the training state: the identity of its run and its checksum
RUN_KEY, CHECKSUM = "run", "checksum"
# training fields that do not make a run another run: where it runs (RUNTIME_FIELDS) and its number
# of cycles, which grow_cycles raises in config.json under an existing checkpoint
_NOT_IDENTITY = ("device", "precision", "threads", "cycles")


def run_identity(cfg: dict) -> dict:
    """What names the run a checkpoint belongs to: family, model fields, training fields (not where it
    runs: device, precision, threads; not cycles, which a run may grow), the seed and the dataset
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


def _other_run(path: Path, have: dict, want: dict) -> str:
    """The one-line refusal of a checkpoint whose run identity `have` is not the folder's `want`."""
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
    try:
        with open(path, "rb") as f:
            head = f.read(4)
        if not head:
            problem = "the file is empty"
        elif head != b"PK\x03\x04":  # torch.save writes a zip archive
            problem = "not a PyTorch checkpoint (a foreign file?)"
        else:
            state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:
        msg = str(e)
        if "Weights only load failed" in msg:
            problem = "it holds objects other than tensors and plain values (weights_only refuses them)"
        elif any(s in msg for s in ("zip archive", "central directory", "PytorchStreamReader")) or \
                isinstance(e, EOFError):
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


# ---------------------------------------------------------------------------------------------------
# metrics.jsonl

def _scan_metrics(path: Path) -> tuple[list[dict], int | None, bool]:
    """(rows, byte offset of a cut-off last line or None, whether the file lacks its final newline).

    A row is a JSON object on one line; blank lines are skipped. A bad last line is reported, not
    read (a kill or a full disk mid-append); a bad line before it raises ReslmError with its number."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], None, False
    except OSError as e:
        raise ReslmError(f"cannot read {path}: {_reason(e)}") from None
    lines = data.split(b"\n")
    last = max((i for i, raw in enumerate(lines) if raw.strip()), default=-1)
    rows, pos = [], 0
    for i, raw in enumerate(lines):
        start, pos = pos, pos + len(raw) + 1
        if not raw.strip():
            continue
        try:
            row = json.loads(raw.decode("utf-8"))
        except ValueError:  # UnicodeDecodeError is a ValueError
            row = None
        if isinstance(row, dict):
            rows.append(row)
        elif i == last:
            return rows, start, False
        else:
            raise ReslmError(f"{path} line {i + 1} is not a JSON row (the file is damaged; "
                             f"remove that line or the run)")
    return rows, None, bool(data) and not data.endswith(b"\n")


def _warn_torn(path: Path) -> None:
    print(f"reslm: warning: dropped a cut-off last line of {path}", file=sys.stderr)


def _finite_or_none(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite_or_none(v) for v in obj]
    return obj


def read_metrics(run_dir: Path) -> list[dict]:
    """The rows of metrics.jsonl ([] if there is none). A cut-off last line is dropped with a warning on
    stderr; a damaged line before it raises ReslmError naming the file and line number."""
    path = Path(run_dir) / METRICS
    rows, torn_at, _ = _scan_metrics(path)
    if torn_at is not None:
        _warn_torn(path)
    return rows


class MetricsLog:
    """Append-only JSONL log; `truncate(n)` drops rows written after the checkpoint we resume from (and
    refuses a log shorter than that checkpoint had seen).

    Opening it repairs the file: a cut-off last line is cut away (with read_metrics's warning) so the
    next row starts on a line of its own; `rows` counts the good rows. `write(row)` appends one row,
    flushes and fsyncs it; it raises ReslmError, writing nothing, for a NaN/Infinity value (naming the
    key, and the row's step: "non-finite val_loss=nan at step 3: ...") or a failed write (disk full: the
    partial line is cut away again). Use it under lock_run."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / METRICS
        rows, torn_at, no_newline = _scan_metrics(self.path)
        if torn_at is not None or no_newline:
            if torn_at is not None:
                _warn_torn(self.path)
            try:
                with open(self.path, "r+b") as f:
                    if torn_at is not None:
                        f.truncate(torn_at)  # the line before it, if any, ends with its newline
                    else:
                        f.seek(0, os.SEEK_END)
                        f.write(b"\n")
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as e:
                raise ReslmError(f"could not repair {self.path}: {_reason(e)}") from None
        self.rows = len(rows)

    def truncate(self, n: int) -> list[dict]:
        """Keep the first `n` rows (those the checkpoint a run resumes from had seen) and return them. A
        log with fewer than `n` rows (cut short or removed since) is a ReslmError, changing nothing:
        resuming from it would leave a run whose history misses evaluations it made."""
        have = read_metrics(self.path.parent)
        if len(have) < n:
            what = f"has {len(have)} rows" if self.path.exists() else "is missing"
            raise ReslmError(f"{self.path} {what} but the run's {CHECKPOINT} was saved after {n} rows: "
                             f"the log was cut short or removed (restore it from a copy, or start the run again)")
        rows = [_finite_or_none(r) for r in have[:n]]  # NaN from older versions -> null
        text = "".join(json.dumps(r, allow_nan=False) + "\n" for r in rows)
        atomic_write(self.path, lambda p: p.write_text(text))
        self.rows = len(rows)
        return rows

    def write(self, row: dict) -> None:
        bad = _non_finite(row)
        if bad is not None:
            step = row.get("step")
            if isinstance(step, int) and not isinstance(step, bool):  # a diverged run: say where
                raise ReslmError(f"non-finite {bad[0]}={bad[1]} at step {step}: not logged to {self.path} "
                                 f"(metrics must be finite numbers; a diverged run stops here)")
            raise ReslmError(f"cannot log {bad[0]}={bad[1]} to {self.path}: metrics must be finite numbers "
                             f"(JSON has no NaN or Infinity; check a loss before logging it)")
        line = memoryview((json.dumps(row, allow_nan=False) + "\n").encode())
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        except OSError as e:
            raise ReslmError(f"could not write {self.path}: {_reason(e)}") from None
        start = None
        try:
            start = os.lseek(fd, 0, os.SEEK_END)
            while line:
                line = line[os.write(fd, line):]
            os.fsync(fd)
        except OSError as e:
            if start is not None:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, start)  # no half row left behind
            raise ReslmError(f"could not write {self.path}: {_reason(e)}") from None
        finally:
            os.close(fd)
        self.rows += 1


# training fields that may differ between the run that was started and the one that resumes it
RUNTIME_FIELDS = ("device", "precision", "threads")


def check_same_run(run_dir: Path, want: dict, defaults: dict | None = None,
                   model_defaults: dict | None = None) -> None:
    """Raise unless run_dir holds the model and training budget of the run config `want` (sweeps and
    reproductions continue existing runs; they must not silently mix budgets). Fields that a run made
    by an older reslm lacks count as their defaults (they did not exist then): training fields from
    `defaults`, model fields from `model_defaults` (the family's config defaults, as when it is loaded)."""
    have = read_config(run_dir)
    have = {**have, "train": {**{k: v for k, v in (defaults or {}).items() if k in want["train"]}, **have["train"]}}
    have_model = {**(model_defaults or {}), **have["model"]} if isinstance(have["model"], dict) else have["model"]
    if have["family"] != want["family"] or have_model != want["model"]:
        raise ReslmError(f"{run_dir} holds a different model than asked for (remove it or use another output folder)")
    a = {k: v for k, v in have["train"].items() if k not in RUNTIME_FIELDS}
    b = {k: v for k, v in want["train"].items() if k not in RUNTIME_FIELDS}
    if a != b:
        diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        raise ReslmError(f"{run_dir} was trained with a different budget ({', '.join(diff)}); "
                         f"remove it or use another output folder")
