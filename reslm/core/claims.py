"""Memory claims between reslm processes on one machine, so that two trainings started together do not both
count the same free memory as theirs.

A training that has checked its reservoir states fit (reslm.core.device.state_dtypes) claims the bytes it
will hold: a file named by its pid in CLAIMS holds the number. Another process's check counts as taken,
besides what the machine reports in use, each live claimant's claim less what it holds already (its
anonymous resident memory): the part it has yet to allocate. A claim ends with its training
(reslm.train.train, a `reslm search` ridge trial: `release`) or its process (at exit); one left by a
process that died is ignored, and removed, by the next reader.

    claiming()      a lock around one check and its claim (two checks never read the claims at once)
    unclaimed()     bytes other live processes have claimed and not yet allocated
    claim(nbytes)   this process's claim, replaced by a later one
    release()       this process's claim dropped (its training ended)
"""
from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import tempfile
from pathlib import Path

# the claims' folder: one per user on a machine ($RESLM_CLAIMS sets another: a test's own)
CLAIMS = Path(os.environ.get("RESLM_CLAIMS") or Path(tempfile.gettempdir()) / f"reslm-memory-{os.getuid()}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # alive, another user's
        return True
    return True


def _resident(pid: int) -> int:
    """The anonymous resident memory of `pid` in bytes (0 where it cannot be read)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


@contextlib.contextmanager
def claiming():
    """Hold the claims' lock for one check and its claim (no lock where the folder cannot be made)."""
    try:
        CLAIMS.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(CLAIMS / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)   # releases the lock


def unclaimed() -> int:
    """Bytes that other live reslm processes on this machine have claimed and not yet allocated."""
    total = 0
    try:
        files = [f for f in CLAIMS.iterdir() if f.name.isdigit()]
    except OSError:
        return 0
    for f in files:
        pid = int(f.name)
        if pid == os.getpid():
            continue
        try:
            nbytes = int(f.read_text())
        except (OSError, ValueError):
            continue
        if not _alive(pid):
            with contextlib.suppress(OSError):
                f.unlink()
            continue
        total += max(0, nbytes - _resident(pid))
    return total


def claim(nbytes: int) -> None:
    """Claim `nbytes` for this process until it exits (best effort: a folder that cannot be written is
    no claim)."""
    path = CLAIMS / str(os.getpid())
    try:
        CLAIMS.mkdir(mode=0o700, exist_ok=True)
        path.write_text(str(int(nbytes)))
    except OSError:
        return
    if path not in _claimed:
        _claimed.add(path)
        atexit.register(_drop, path)


_claimed: set[Path] = set()   # this process's claim files, removed at exit


def release() -> None:
    """Drop this process's claim (a training that ended frees its states)."""
    _drop(CLAIMS / str(os.getpid()))


def _drop(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()
