"""Support (every stage), the one exception users see: a one-line message, printed by the CLI without a traceback.

`describe(exc)` turns any exception into such a line; the CLI uses it as its single error boundary.
"""
from __future__ import annotations

import errno
import os
import re
from contextlib import contextmanager
from pathlib import Path


class ReslmError(Exception):
    """A user-facing error (bad input, impossible config). The CLI prints `reslm: <msg>` and exits 2."""


class OutOfMemory(ReslmError):
    """The memory a run needs is not available now (other processes may hold it). The CLI exits 75
    (EX_TEMPFAIL of sysexits.h: a temporary failure, worth trying again later), which tells a scheduler
    (reslm.frontier.schedule) to try the run again when the machine is free."""

    exit_status = 75


class Stopped(ReslmError):
    """A command stopped before its end by a stop asked from outside (reslm.core.stop: SIGTERM, Ctrl-C): one
    line saying what finished and what did not, and the stop's exit status (reslm.core.stop.status: 128 + the
    signal's number, as a shell reports a process a signal ended: 143 after SIGTERM, 130 after Ctrl-C)."""

    def __init__(self, message: str, exit_status: int):
        super().__init__(message)
        self.exit_status = exit_status


class RunInUse(ReslmError):
    """A run directory (or a folder of runs) is locked by another process (see reslm.run.lock_run)."""


MAX_LINE = 300  # characters; a longer first line is cut with "..."
MAX_WORD = 100  # characters; in a longer line, a longer word (a path) keeps its two ends around "..."

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_TORCH_PREFIX = re.compile(r"^\[enforce fail at [^\]]*\]\s*\.?\s*")
# exception types whose message stands on its own; for any other type the line starts with its name
_PLAIN = (ReslmError, OSError, RuntimeError, ValueError, KeyError, EOFError, MemoryError)


def _first_line(text: str) -> str:
    text = _ANSI.sub("", text)
    for line in text.splitlines():
        line = " ".join(line.split())  # tabs, repeated blanks
        if line:
            return line
    return ""


def _short(line: str) -> str:
    """`line` cut to MAX_LINE characters: first every word (a path) longer than MAX_WORD keeps only its two
    ends, so that the reason after a long path ("...: file name too long") is not what gets cut."""
    if len(line) <= MAX_LINE:
        return line
    half = (MAX_WORD - 3) // 2
    line = " ".join(w if len(w) <= MAX_WORD else f"{w[:half]}...{w[-half:]}" for w in line.split(" "))
    return line if len(line) <= MAX_LINE else line[:MAX_LINE - 3].rstrip() + "..."


def _os_error(e: OSError) -> str:
    reason = e.strerror or _first_line(_safe_str(e)) or type(e).__name__
    if e.strerror:
        reason = reason[:1].lower() + reason[1:]  # "No such file" -> "no such file"
    names = [str(n) for n in (e.filename, getattr(e, "filename2", None)) if n is not None]
    return f"{' -> '.join(names)}: {reason}" if names else reason


def _safe_str(e: BaseException) -> str:
    try:
        return str(e)
    except Exception:  # a broken __str__ must not break the error boundary
        return ""


def describe(exc: BaseException) -> str:
    """One short line for `exc` (never raises, never empty): the first non-empty line of its message.

    OSError       "PATH: no space left on device" (filename and strerror; both names for a rename)
    KeyError      "missing key 'model'"
    RuntimeError  torch's "[enforce fail at file.cc:12] ." prefix and ANSI colours are dropped
    ReslmError, ValueError, EOFError, MemoryError: the message alone
    anything else "TypeName: message"
    An empty message gives the exception's type name ("EOFError"); lines longer than MAX_LINE are cut.
    """
    try:
        name = type(exc).__name__
        if isinstance(exc, OSError):
            return _short(_os_error(exc))
        if isinstance(exc, KeyError):
            key = exc.args[0] if len(exc.args) == 1 else None
            return _short(f"missing key {key!r}") if key is not None else name
        line = _first_line(_safe_str(exc))
        if isinstance(exc, RuntimeError):
            line = _TORCH_PREFIX.sub("", line)
        if not line:
            return name
        return _short(line if isinstance(exc, _PLAIN) else f"{name}: {line}")
    except Exception:
        return "unexpected error"


# --- failed writes -----------------------------------------------------------------------------------
_SHORT_WRITE = re.compile(r"(\d+) requested and (\d+) written")   # numpy's tofile / np.save on a full disk


def _low_on_space(folder: Path) -> bool:
    try:
        st = os.statvfs(folder)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < 64 * 2**20


def write_error(path: Path | str, exc: BaseException) -> ReslmError | None:
    """ReslmError "could not write PATH: REASON" for an exception raised while writing `path`, or None when
    `exc` is not a failed write. A full disk reads "no space left on device" also where numpy ("294556
    requested and 12288 written") or torch ("unexpected pos 273792 vs 273720") report only a short write:
    that is what it is when the file system is (nearly) full, else the short write is described as such."""
    path = Path(path)
    text = _safe_str(exc)
    if isinstance(exc, OSError) and exc.errno is None and _SHORT_WRITE.search(text):
        wanted, done = _SHORT_WRITE.search(text).groups()
        short = f"only {done} of {wanted} items written"
    elif isinstance(exc, RuntimeError) and ("unexpected pos" in text or "write failed" in text):
        short = _TORCH_PREFIX.sub("", _first_line(text))
    elif isinstance(exc, OSError):
        reason = os.strerror(exc.errno) if exc.errno else describe(exc)
        if exc.errno:
            reason = reason[:1].lower() + reason[1:]
        return ReslmError(f"could not write {path}: {reason}")
    else:
        return None
    full = exc.errno == errno.ENOSPC if isinstance(exc, OSError) and exc.errno else _low_on_space(path.parent)
    return ReslmError(f"could not write {path}: " + ("no space left on device" if full else short))


@contextmanager
def writing(path: Path | str):
    """Within the block, a failed write (OSError, numpy's or torch's short write) becomes `write_error(path, e)`:
    one line naming the file and the reason. A ReslmError passes through."""
    try:
        yield
    except ReslmError:
        raise
    except (OSError, RuntimeError) as e:
        err = write_error(path, e)
        if err is None:
            raise
        raise err from None
