"""What a scoring (`reslm eval`'s test CE) keeps besides the figure: the time its reservoir took
(`reservoir_clock`), and its progress between pieces (`Progress`).

`reslm eval` scores every sample of a character run's test text from its `context` preceding characters,
PIECE samples per reservoir pass (each piece with its own `context` lead-in; reslm.evaluate). In window
mode that is `context` reservoir steps per character: a whole test shard takes hours for a large
reservoir on a CPU. With a `Progress`, the sums of the pieces done are written after each piece
(atomically, next to the evaluation they will become: eval-window.json's are in
eval-window.partial.json), so a scoring stopped part-way (a deadline,
a kill, the end of a session) continues from its last whole piece, on any machine. The file names what
is scored (the weights' digest, the positions, the context mode, the piece size, the physical
constraints); a file that names anything else, or cannot be read, is started over. A continued score is
the uninterrupted one: the pieces, their order and their noise draws (by position) are fixed, and the
running sums are float64 in JSON, which reads back exactly. In a published folder the file is not in
the manifest (a kill between writing it and the manifest would leave the folder failing its check); it
is committed beside the published files, so an unfinished scoring is continued on another machine, and
`reslm train --resume` removes it with the folder's other evaluations (reslm.run.folder.drop_stale_evals).
"""
from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from reslm.core.errors import ReslmError
from reslm.core.files import read_json, write_json
from reslm.reservoir.base import Reservoir

PIECE = 65536   # samples scored per reservoir pass


@contextmanager
def reservoir_clock(model):
    """Accumulate the wall time spent in the model's reservoirs: yields {"seconds": float}."""
    mods = [m for name, m in model.named_modules() if name.rsplit(".", 1)[-1] == "reservoir"]
    clock = {"seconds": 0.0}
    cuda = any(b.is_cuda for m in mods for b in m.buffers())

    def timed(fn):
        def wrapper(*args, **kwargs):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            if cuda:
                torch.cuda.synchronize()
            clock["seconds"] += time.perf_counter() - t0
            return out
        return wrapper

    def names(m):   # replay: a recording's states read from its file (reservoir/recorded.py)
        return ("forward", "replay") if isinstance(m, Reservoir) and m.replays else ("forward",)

    for m in mods:
        for n in names(m):
            setattr(m, n, timed(getattr(m, n)))  # instance attributes: __call__ and step() find them first
    try:
        yield clock
    finally:
        for m in mods:
            for n in names(m):
                m.__dict__.pop(n, None)


def progress_name(evaluation: str) -> str:
    """The progress file of the evaluation file `evaluation`: eval-window.json -> eval-window.partial.json."""
    return evaluation.removesuffix(".json") + ".partial.json"


@dataclass
class Progress:
    """The running sums of a scoring: `pieces` done, their summed loss (`total`, nats times samples), the
    samples (`count`), and the wall and reservoir seconds they took, for the scoring described by `key`."""
    path: Path
    key: dict
    pieces: int = 0
    total: float = 0.0
    count: int = 0
    seconds: float = 0.0
    reservoir_seconds: float = 0.0

    @classmethod
    def open(cls, path: Path, key: dict) -> "Progress":
        """The progress kept at `path` for `key`; a fresh one where none is, or the file names another
        scoring or cannot be read (it is replaced at the first piece)."""
        path = Path(path)
        try:
            d = read_json(path)
            if d is None or d.get("key") != key:
                return cls(path, key)
            return cls(path, key, int(d["pieces"]), float(d["total"]), int(d["count"]), float(d["seconds"]),
                       float(d["reservoir_seconds"]))
        except (ReslmError, KeyError, TypeError, ValueError):   # a link, another kind of file, a damaged one
            return cls(path, key)

    def save(self) -> None:
        write_json(self.path, dict(key=self.key, pieces=self.pieces, total=self.total, count=self.count,
                                   seconds=self.seconds, reservoir_seconds=self.reservoir_seconds))

    def drop(self) -> None:
        """Remove the file: the scoring is done and written."""
        self.path.unlink(missing_ok=True)


def kept(folder: Path, evaluation: str) -> tuple[int, int] | None:
    """(pieces done, pieces in all) of an unfinished scoring of `evaluation` kept in `folder`, or None."""
    try:
        d = read_json(Path(folder) / progress_name(evaluation))
        return int(d["pieces"]), math.ceil(int(d["key"]["score_positions"]) / int(d["key"]["piece"]))
    except (ReslmError, KeyError, TypeError, ValueError, ZeroDivisionError):
        return None


__all__ = ["PIECE", "Progress", "kept", "progress_name", "reservoir_clock"]
