"""The one exception users see: a one-line message, printed by the CLI without a traceback."""


class ReslmError(Exception):
    """A user-facing error (bad input, impossible config). The CLI prints `reslm: <msg>` and exits 2."""


def describe(exc: BaseException) -> str:
    """One short line for any exception: the first non-empty line of its message, with the file name
    for OSError; never raises (an empty message gives the exception's type)."""
    if isinstance(exc, ReslmError):
        return str(exc)
    if isinstance(exc, OSError) and exc.strerror:
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{exc.strerror}"
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
