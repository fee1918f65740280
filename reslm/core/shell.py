"""Support: command lines printed for a shell (a cluster scheduler's job array, GNU parallel, a user's paste).

`shell_line(words)` quotes every word that is not plain with shlex.quote, so `$(...)`, backquotes, `;`, `|`,
`&`, `#`, globs and spaces in a path or a flag's value reach the command as text and are never run. A word
holding a newline or another control character is refused instead of quoted: inside single quotes bash would
keep it literal, but a line-based scheduler splits the line there, and a `# comment` printed after the command
would end at it, so the rest of the word would run as a command of its own.
"""
from __future__ import annotations

import shlex
import unicodedata

from reslm.core.errors import ReslmError

# Unicode categories no printed command may hold: control (newline, CR, tab, ESC ...), format (bidi overrides
# that make a line read as another), line and paragraph separators (str.splitlines splits on them)
_UNPRINTABLE = ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")


def unprintable(word: str) -> str | None:
    """The first character of `word` that a one-line command cannot hold, or None."""
    return next((c for c in word if unicodedata.category(c) in _UNPRINTABLE), None)


def shell_line(words) -> str:
    """`words` as one shell command line, each word quoted where it is not plain (shlex.quote). ReslmError,
    naming the word (and the flag it follows), when one holds a newline or other control character."""
    words = [str(w) for w in words]
    for i, w in enumerate(words):
        if unprintable(w) is not None:
            after = f" (the value of {words[i - 1]})" if i and words[i - 1].startswith("--") else ""
            raise ReslmError(f"{w!r}{after} holds a newline or another control character ({unprintable(w)!r}): a "
                             "command line for a shell or a scheduler is one line, so reslm does not print it; "
                             "give a name without one")
    return " ".join(shlex.quote(w) for w in words)


def path_word(path) -> str:
    """A path as a command's argument: one starting with "-" gets "./" in front, so that it is never read as a
    flag (`--results -x` is a missing value to argparse; `--results ./-x` is the folder)."""
    text = str(path)
    return f"./{text}" if text.startswith("-") else text


__all__ = ["path_word", "shell_line", "unprintable"]
