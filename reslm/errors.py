"""Support (every stage), the one exception users see: a one-line message, printed by the CLI without a traceback.

`describe(exc)` turns any exception into such a line; the CLI uses it as its single error boundary.
"""
from __future__ import annotations

import re


class ReslmError(Exception):
    """A user-facing error (bad input, impossible config). The CLI prints `reslm: <msg>` and exits 2."""


class RunInUse(ReslmError):
    """A run directory (or a folder of runs) is locked by another process (see reslm.run.lock_run)."""


MAX_LINE = 300  # characters; a longer first line is cut with "..."

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
