"""The one exception users see: a one-line message, printed by the CLI without a traceback."""


class ReslmError(Exception):
    """A user-facing error (bad input, impossible config). The CLI prints `reslm: <msg>` and exits 2."""
