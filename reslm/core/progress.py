"""Support (every stage), progress display: bars on a terminal, plain lines in a log.

tqdm draws carriage-return frames; written into a file (`make demo > log`) they bury the log. `bar`
shows a tqdm bar only when stderr is a terminal and `enabled`; otherwise it is the bare iterable (or a
no-op counter). `say` prints one line to stderr in either case (through tqdm when a bar is live, so
the line does not tear the bar).
"""
from __future__ import annotations

import os
import sys

from tqdm.auto import tqdm


def interactive() -> bool:
    """True when progress bars make sense: stderr is a terminal and RESLM_NO_BARS is not set."""
    return sys.stderr.isatty() and not os.environ.get("RESLM_NO_BARS")


def bar(iterable=None, *, enabled: bool = True, **kwargs):
    """tqdm(iterable, **kwargs) on a terminal when enabled, else a silent stand-in with the same
    methods used here (update, set_postfix, close, write, iteration)."""
    return tqdm(iterable, disable=not (enabled and interactive()), **kwargs)


def say(msg: str, *, enabled: bool = True) -> None:
    """One progress line on stderr (also when stderr is a file)."""
    if enabled:
        tqdm.write(msg, file=sys.stderr)
