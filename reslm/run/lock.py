"""Who may write a run folder: the lock, the clean-up of a killed writer's temp files, and the undoing
of a run folder a failed command made.

Writers hold `lock_run(run_dir)` (train, resume, eval; reproduce/sweep/lab lock their output folder
the same way); readers (generate, reports) need no lock. A second writer gets RunInUse, a ReslmError:
"RUN is in use by pid N (reslm train ... since 12:34:56); wait for it or stop it". The lock is on the
folder itself, so deleting RUN/.lock does not release it. The kernel drops the lock when its process
ends in any way, so a killed run leaves no stale lock.

Temp files left by a kill are removed by clean_stale_temps (lock_run calls it), which removes only
the names reslm writes, and only in a folder reslm made: never a user's file.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shlex
import shutil
import socket
import stat
import sys
import threading
import time
from pathlib import Path

from reslm.core.errors import ReslmError, RunInUse
from reslm.core.files import missing_parents, open_plain, read_plain, reason, remove_empty_dirs
from reslm.run.folder import CHECKPOINT, CONFIG, LOCK, shown

_TEMP_DIR = re.compile(r"^\..+\.tmp-[a-z0-9_]{8}$")  # create_run_dir's tempfile.mkdtemp folders
_TEMP_DIR_AGE = 60.0  # seconds: a younger temp folder may be another creator's, mid-rename
# atomic_write's temp files (tempfile.mkstemp: ".NAME." + 8 random characters + ".tmp") of the files
# reslm writes with it into a run or output folder; clean_stale_temps removes no other name
_WRITTEN = (r"config\.json|checkpoint\.pt|summary\.json|metrics\.jsonl|eval(-[^/]+)?\.json|eval-physical\.csv"
            r"|budget\.json|results\.json|report\.md|scaling_fit\.json|ngram\.json"
            r"|manifest\.json|weights\.safetensors|provenance\.json")   # the last three: published run folders
_TEMP_FILE = re.compile(rf"^\.({_WRITTEN})\.[a-z0-9_]{{8}}\.tmp$")
_MARKERS = ("budget.json",)  # besides config.json: what reproduce and lab write first into their folder

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
            info = json.loads(read_plain(run_dir / LOCK) or b"")
            if isinstance(info, dict) and isinstance(info.get("pid"), int):
                return info
        except (OSError, ValueError, ReslmError):
            pass
        time.sleep(0.05)
    return None


def _in_use(run_dir: Path) -> str:
    return f"{run_dir} is in use by {_who(run_dir)}; wait for it or stop it"


def _who(run_dir: Path) -> str:
    """The holder of run_dir's lock in words: "pid N (reslm train ... since 12:34:56)"."""
    info = _holder(run_dir)
    if info is None:
        return "another process"
    who = f"pid {info['pid']}"
    if isinstance(info.get("host"), str) and info["host"] != socket.gethostname():
        who += f" on {info['host']}"
    what = []
    if isinstance(info.get("command"), str):
        what.append(str(info["command"]))
    if isinstance(info.get("started"), (int, float)):
        start = time.localtime(info["started"])
        same_day = time.strftime("%Y-%m-%d", start) == time.strftime("%Y-%m-%d")
        what.append("since " + time.strftime("%H:%M:%S" if same_day else "%Y-%m-%d %H:%M:%S", start))
    return f"{who} ({' '.join(what)})" if what else who


def writer_of(run_dir: Path) -> str | None:
    """Who holds run_dir's lock ("pid N (reslm train ... since 12:34:56)"), or None when no live
    process does. A probe for readers that found a folder changing under them (a published run
    trained in place): it takes a shared lock on the folder for an instant and never waits."""
    try:
        fd = os.open(run_dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        return _who(Path(run_dir)) if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES) else None
    finally:
        os.close(fd)   # releases the probe's lock
    return None


def _flock(fd: int, run_dir: Path) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise RunInUse(_in_use(run_dir)) from None
        raise ReslmError(f"cannot lock {run_dir}: {reason(e)}") from None


def _acquire(run_dir: Path) -> tuple[int, int]:
    """flock the folder itself (no one can delete it from under a live holder, as they can RUN/.lock),
    then RUN/.lock (what reslm versions before the folder lock took) and write the holder into it."""
    cloexec = getattr(os, "O_CLOEXEC", 0)
    try:
        dfd = os.open(run_dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | cloexec)
    except OSError as e:
        raise ReslmError(f"cannot lock {run_dir}: {reason(e)}") from None
    _flock(dfd, run_dir)
    path = run_dir / LOCK
    try:   # never through a link: a planted RUN/.lock -> ../file must not be truncated and overwritten
        fd = open_plain(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        os.close(dfd)
        raise ReslmError(f"cannot lock {run_dir}: {reason(e)}") from None
    except ReslmError as e:
        os.close(dfd)
        raise ReslmError(f"cannot lock {run_dir}: {e}") from None
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
            raise ReslmError(f"cannot create {run_dir}: {reason(e)}") from None
    if not run_dir.is_dir():
        raise ReslmError(f"{run_dir} is not a directory" if run_dir.exists() else f"{run_dir} does not exist")
    key = (os.getpid(), os.path.realpath(run_dir))
    with _held_guard:
        entry = _held.get(key)
        first = entry is None
        if first:
            had_lock = _is_plain(run_dir / LOCK)    # a reslm process locked this folder before
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


def _is_plain(path: Path) -> bool:
    """A regular file at path (a link to one is not)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def is_reslm_folder(folder: Path) -> bool:
    """True for a folder reslm made: a run (config.json, a JSON object with a family) or a reproduce/lab
    output folder (budget.json)."""
    folder = Path(folder)
    if any(_is_plain(folder / m) for m in _MARKERS):
        return True
    try:
        cfg = json.loads(read_plain(folder / CONFIG) or b"")
    except (OSError, ValueError, ReslmError):
        return False
    return isinstance(cfg, dict) and "family" in cfg


def check_output_folder(out: Path, stamp: str, what: str) -> None:
    """ReslmError unless `out` is missing, empty (a .lock aside) or holds `stamp` (the file a
    reproduction or lab writes first into its folder): such a command never writes into, or sweeps,
    a folder of the user's."""
    out = Path(out)
    if not out.is_dir() or _is_plain(out / stamp):
        return
    try:
        foreign = any(p.name != LOCK for p in out.iterdir())
    except OSError as e:
        raise ReslmError(f"cannot use {shown(out)}: {reason(e)}") from None
    if foreign:
        raise ReslmError(f"{shown(out)} already exists and is not {what} (no {stamp}); pick another --out")


def check_runs_folder(out: Path, outputs: tuple[str, ...], what: str) -> None:
    """ReslmError unless every entry of `out` (when it exists) is a run folder reslm made or one of the
    files `outputs` that the command itself writes there (a sweep's scaling.csv, the demo's
    demo.json): such a command never writes over a folder of the user's."""
    out = Path(out)
    if not os.path.lexists(out):
        return
    if out.is_symlink() or not out.is_dir():
        raise ReslmError(f"{shown(out)} exists and is not a directory; pick another --out")
    try:
        entries = sorted(out.iterdir())
    except OSError as e:
        raise ReslmError(f"cannot use {shown(out)}: {reason(e)}") from None
    for p in entries:
        if p.name == LOCK or _TEMP_FILE.match(p.name) or (p.name in outputs and _is_plain(p)):
            continue
        if p.is_dir() and not p.is_symlink() and is_reslm_folder(p):
            continue
        raise ReslmError(f"{shown(out)} already holds {p.name}, which is not {what}'s; pick another --out")


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


@contextlib.contextmanager
def lock_new_run(out: Path):
    """lock_run(out, create=True) for a command that makes or continues a run in `out` (`reslm train`),
    undoing what it made when the block fails: a run folder it created is removed unless it got a
    first checkpoint (that is a run to resume), the .lock it left in an existing folder that holds no
    run is removed (the folder is left as it was), and parent folders created for `out` are removed
    again. A second caller on the same folder gets RunInUse at once. Yields `out` as a Path."""
    out = Path(out)
    existed, had_lock = out.exists() or out.is_symlink(), (out / LOCK).exists()
    made, _ = missing_parents(out)          # the folders lock_run(create=True) will make, innermost first
    try:
        with lock_run(out, create=True):
            try:
                yield out
            except BaseException:
                if not existed and not (out / CHECKPOINT).exists():   # failed before its first checkpoint
                    shutil.rmtree(out, ignore_errors=True)
                elif existed and not had_lock and not (out / CONFIG).exists():  # not a run: leave it as it was
                    (out / LOCK).unlink(missing_ok=True)
                raise
    except BaseException:
        if not (out.exists() or out.is_symlink()):
            remove_empty_dirs(made)
        raise
