"""reslm.core.stop: a SIGTERM is a stop request only while a loop takes it, and only the first one."""
import signal

import pytest

from reslm.cli import _interrupt
from reslm.core import stop


def test_sigterm_is_a_request_inside_a_graceful_block_and_an_interrupt_outside_or_twice():
    try:
        with pytest.raises(KeyboardInterrupt):
            _interrupt(signal.SIGTERM, None)          # nothing takes it: at once, as Ctrl-C
        assert not stop.requested()
        with stop.graceful():
            assert _interrupt(signal.SIGTERM, None) is None and stop.requested()
            with pytest.raises(KeyboardInterrupt):
                _interrupt(signal.SIGTERM, None)      # the second one: at once
        assert stop.requested() and not stop.request()   # still asked after the block; not taken again
    finally:
        stop.clear()
    assert not stop.requested()
