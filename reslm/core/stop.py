"""Support (every stage), a stop asked from outside: SIGTERM (`kill`, a batch scheduler's stop, the end of a
session) while a training runs asks it to stop at the end of its current step, as its deadline does (a
checkpoint, its summary; a published run is published again with its check; a later call resumes). A
second SIGTERM, or one while nothing takes it, interrupts at once (KeyboardInterrupt), as Ctrl-C does.

    with graceful():        a loop that looks at requested() after each step takes the stop
    request()               the SIGTERM handler's call: True when a loop takes the stop
    requested()             whether a stop was asked (and taken)
"""
from __future__ import annotations

import contextlib

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


__all__ = ["clear", "graceful", "request", "requested"]
