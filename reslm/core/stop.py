"""Support (every stage), a stop asked from outside: SIGTERM (`kill`, a batch scheduler's stop, the end of a
session) while a training runs asks it to stop at the end of its current step, as its deadline does (a
checkpoint, its summary; a published run is published again with its check; a later call resumes). A
second SIGTERM, or one while nothing takes it, interrupts at once (KeyboardInterrupt), as Ctrl-C does.

    with graceful():        a loop that looks at requested() after each step takes the stop
    request()               the SIGTERM handler's call: True when a loop takes the stop
    requested()             whether a stop was asked (and taken)
    on_sigterm              that handler, for a process reslm's CLI does not start (a bench's seed)
    status(interrupted)     the exit status of a command a stop ended before its end (reslm.core.errors.Stopped):
                            128 + the signal's number, as a shell reports a process that signal ended: 143
                            after a SIGTERM taken as a stop, 130 after an interrupt (Ctrl-C, the CLI's own
                            status for KeyboardInterrupt, or a second SIGTERM)
"""
from __future__ import annotations

import contextlib
import signal

_state = {"takers": 0, "requested": False}


@contextlib.contextmanager
def graceful():
    """Within this block a first SIGTERM is taken as a stop request (the block's loop checks requested())."""
    _state["takers"] += 1
    try:
        yield
    finally:
        _state["takers"] -= 1


def request() -> bool:
    """Ask the running loop to stop; False (the caller interrupts at once) when none takes it or a stop was
    asked already."""
    if _state["takers"] and not _state["requested"]:
        _state["requested"] = True
        return True
    return False


def requested() -> bool:
    return _state["requested"]


def clear() -> None:
    """Forget a stop that was asked (a process that goes on after it: tests, a notebook)."""
    _state["requested"] = False


def on_sigterm(signum, frame) -> None:
    """A SIGTERM handler (signal.signal(signal.SIGTERM, on_sigterm)): a stop request where a loop takes it,
    else an interrupt at once, as the CLI's (without its line: a process of its own, such as a bench's seed)."""
    if not request():
        raise KeyboardInterrupt


def status(interrupted: bool = False) -> int:
    """The exit status of a command that a stop ended before its end: 128 + SIGINT (130) after an interrupt,
    128 + SIGTERM (143) after a stop request."""
    return 128 + (signal.SIGINT if interrupted else signal.SIGTERM)


__all__ = ["clear", "graceful", "on_sigterm", "request", "requested", "status"]
