"""What a scoring (`reslm eval`'s test CE) keeps besides the figure: the time its reservoir took
(`reservoir_clock`, `timed`), and its progress between pieces (`Progress`).

`reslm eval` scores every sample of a character run's test text from its `context` preceding characters,
PIECE samples per reservoir pass (each piece with its own `context` lead-in; reslm.scoring.evaluate). In window
mode that is `context` reservoir steps per character: a whole test shard takes hours for a large
reservoir on a CPU. With a `Progress`, the sums of the pieces done are written after each piece
(atomically, next to the evaluation they will become: eval-window.json's are in
eval-window.partial.json), so a scoring stopped part-way (a deadline,
a kill, the end of a session) continues from its last whole piece, on any machine. The file names what
is scored (the weights' digest, the positions, the context mode, the piece size, the physical
constraints); a file that names anything else, or cannot be read, is started over. A continued score is
the uninterrupted one: the pieces, their order and their noise draws (by position) are fixed, and the
running sums are float64 in JSON, which reads back exactly. The file is not taken on trust: it holds each
piece's own sums and a sha256 digest of its fields; a file whose digest or sums do not hold is scored from the
start with a warning, and one that holds is continued only once a kept piece, drawn at random (the file cannot
know which), re-scores to what the file says of it (within SPOT_TOLERANCE), else it too is scored from the
start. In a published folder the file is not in
the manifest (a kill between writing it and the manifest would leave the folder failing its check); it
is committed beside the published files, so an unfinished scoring is continued on another machine, and
`reslm train --resume` removes it with the folder's other evaluations (reslm.run.folder.drop_stale_evals).
"""
from __future__ import annotations

import hashlib
import json
import math
import random
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from reslm.core.device import synchronize
from reslm.core.errors import ReslmError
from reslm.core.files import read_json, write_json
from reslm.core.progress import say
from reslm.reservoir.base import Reservoir

PIECE = 65536   # samples scored per reservoir pass
SPOT_TOLERANCE = 1e-6   # nats per sample: a kept piece scored again on another CPU moves by far less; an edit more


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


def timed(fn, model):
    """(result, total seconds, reservoir seconds) of fn(clock), `clock` the reservoir's (reservoir_clock)."""
    device = next(iter(model.buffers()), next(model.parameters())).device
    with reservoir_clock(model) as clock:
        synchronize(device)
        t0 = time.perf_counter()
        out = fn(clock)
        synchronize(device)
        return out, time.perf_counter() - t0, clock["seconds"]


def progress_name(evaluation: str) -> str:
    """The progress file of the evaluation file `evaluation`: eval-window.json -> eval-window.partial.json."""
    return evaluation.removesuffix(".json") + ".partial.json"


def _digest(d: dict) -> str:
    """sha256 of a progress file's fields (all but the digest), in canonical JSON."""
    body = {k: v for k, v in d.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _sums(pieces: list) -> tuple[float, int]:
    """(total, count) of per-piece [total, count] pairs, added in order as the scoring adds them."""
    total, count = 0.0, 0
    for t, n in pieces:
        total, count = total + t, count + n
    return total, count


@dataclass
class Progress:
    """The running sums of a scoring: `pieces` done, their summed loss (`total`, nats times samples), the
    samples (`count`), each piece's own [total, count] (`sums`), and the wall and reservoir seconds they took,
    for the scoring described by `key`. `spot`: the kept piece to score again before the others are trusted
    (drawn at random by `open`; None for a fresh scoring)."""
    path: Path
    key: dict
    pieces: int = 0
    total: float = 0.0
    count: int = 0
    seconds: float = 0.0
    reservoir_seconds: float = 0.0
    sums: list = field(default_factory=list)
    spot: int | None = None

    @classmethod
    def open(cls, path: Path, key: dict) -> "Progress":
        """The progress kept at `path` for `key`; a fresh one where none is, or the file names another
        scoring or cannot be read (it is replaced at the first piece). A file whose digest or sums do not
        hold (damaged, edited, or written by an older reslm) is not trusted: a warning says so and the scoring
        starts over. One that holds is continued once a kept piece, drawn at random, re-scores to what the
        file says of it (`spot`, `check_spot`)."""
        path = Path(path)
        try:
            d = read_json(path)
            if d is None or d.get("key") != key:
                return cls(path, key)
            if d.get("digest") != _digest(d):
                why = "has no digest (written by an older reslm)" if "digest" not in d else \
                    "does not match its digest (changed since it was written)"
                say(f"reslm: warning: the kept scoring {path} {why}: scoring from the start")
                return cls(path, key)
            sums = [[float(t), int(n)] for t, n in d["sums"]]
            p = cls(path, key, int(d["pieces"]), float(d["total"]), int(d["count"]), float(d["seconds"]),
                    float(d["reservoir_seconds"]), sums)
        except (ReslmError, AttributeError, KeyError, TypeError, ValueError):   # a link, a damaged or foreign file
            return cls(path, key)
        if not p.pieces and not sums:
            return cls(path, key)
        if len(sums) != p.pieces or _sums(sums) != (p.total, p.count):
            say(f"reslm: warning: the kept scoring {path}'s pieces do not add up to its sums: scoring from the start")
            return cls(path, key)
        p.spot = random.SystemRandom().randrange(p.pieces)   # a tamperer cannot know which piece is re-scored
        return p

    def check_spot(self, total: float, count: int) -> bool:
        """Whether the spot piece, scored again to (total, count), is what the file holds (within SPOT_TOLERANCE
        nats per sample: another CPU's float arithmetic); if not, a warning and the progress is started over."""
        have_total, have_count = self.sums[self.spot]
        ok = count == have_count and abs(total - have_total) <= SPOT_TOLERANCE * max(count, 1)
        if not ok:
            say(f"reslm: warning: the kept scoring {self.path}'s piece {self.spot + 1} re-scores to "
                f"{total / max(count, 1):.6f} nats, not the {have_total / max(have_count, 1):.6f} it holds "
                "(edited?): scoring from the start")
            self.pieces, self.total, self.count, self.seconds, self.reservoir_seconds, self.sums = 0, 0.0, 0, 0.0, 0.0, []
        self.spot = None
        return ok

    def add(self, total: float, count: int) -> None:
        """One more piece scored: (its summed loss, its samples)."""
        self.pieces, self.total, self.count = self.pieces + 1, self.total + total, self.count + count
        self.sums.append([total, count])

    def save(self) -> None:
        d = dict(key=self.key, pieces=self.pieces, total=self.total, count=self.count, sums=self.sums,
                 seconds=self.seconds, reservoir_seconds=self.reservoir_seconds)
        write_json(self.path, {**d, "digest": _digest(d)})

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
