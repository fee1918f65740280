"""The substrates by name: RESERVOIRS, key -> (config class, reservoir class).

reslm.reservoir fills it with the substrates reslm ships; a user's code adds its own
(`RESERVOIRS["mine"] = (MyConfig, MyReservoir)`), and the models, the composite substrate's parts
(composite.py) and the command line read it when a configuration names a substrate. It lives in a module
of its own so that a substrate built from others can read it without importing the package that fills it.

A reservoir registered by a user's file (`--import FILE.py`, reslm.frontier.imports) is also registered as
source_name(NAME, the file's sha256), the name its runs record, and SOURCES says, for each such name, which
file this process ran for it, that file's whole sha256 and its bytes: what a run trained on it records
(reslm.train.loop, reslm.run.source) and what reslm.models.load checks before it builds the model of a run
whose reservoir came from a file.
"""
from __future__ import annotations

RESERVOIRS: dict[str, tuple] = {}
SOURCES: dict[str, dict] = {}   # NAME@SHA12 -> {name, path, sha256, code: its bytes} of the file this process ran


def source_name(name: str, sha256: str) -> str:
    """The registry name a run of a reservoir registered from a file is recorded under: its own name and the
    file's sha256 (12 hex digits), so that its config, fingerprint and folder name cover what computed it."""
    return f"{name}@{sha256[:12]}"
