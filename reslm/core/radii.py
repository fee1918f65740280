"""Support (below the reservoir and the run folder): the spectral radii of reservoir draws, computed once
per process and recorded with a run, so that loading it never pays an eigendecomposition again.

reslm.reservoir.matrices.scale_radius asks here for the radius of each unscaled random draw (radius_of),
kept under its key (norm, (kind, size, density, seed)); a published manifest (reslm.publish) records them by name
(radius_name), and loading the folder puts them back (remember_radii) before its reservoir is rebuilt:
w * (radius / rho) with the recorded rho is bit for bit the matrix the run had. A run folder needs no
record: its checkpoint holds the scaled matrix itself, so its model is built under deferred() (the
radius left unscaled, no eigendecomposition) and the checkpoint's matrix replaces it. Plain Python, no
torch: the run folder's modules stand on it without importing the models.
"""
from __future__ import annotations

import contextlib
import json
import math
from typing import Callable

from reslm.core.errors import ReslmError

NORMS = ("spectral", "singular")
_RADII: dict = {}  # (norm, draw key) -> radius of the unscaled draw: an eig at N = 2600 takes seconds
_DEFERRED = [0]    # > 0 inside deferred(): scale_radius leaves the draw unscaled and computes nothing


@contextlib.contextmanager
def deferred():
    """Within the block, reservoir matrices are built without their radius scaling (no
    eigendecomposition, nothing cached): only for a model whose fixed buffers are then all replaced
    by a checkpoint's (load_state_dict, strict), as opening a run folder does."""
    _DEFERRED[0] += 1
    try:
        yield
    finally:
        _DEFERRED[0] -= 1


def is_deferred() -> bool:
    return _DEFERRED[0] > 0


def radius_of(norm: str, key: tuple | None, compute: Callable[[], float]) -> float:
    """The `norm` radius of the unscaled draw named `key`: the one this process computed or remembered
    (remember_radii), else compute() once and kept. key None: computed every time, never kept."""
    if key is None:
        return compute()
    rho = _RADII.get((norm, key))
    if rho is None:
        rho = _RADII[(norm, key)] = compute()
    return rho


def radius_name(norm: str, key: tuple) -> str:
    """A radius's name in a record (a manifest, a checkpoint): JSON of [norm, *key]."""
    return json.dumps([norm, *key])


def recorded_radii(names) -> dict[str, float]:
    """{name: radius} of the unscaled draws `names` (radius_name) computed or remembered in this process:
    what a run records so that loading it costs no eigendecomposition."""
    out = {}
    for name in names:
        norm, *key = json.loads(name)
        rho = _RADII.get((norm, tuple(key)))
        if rho is not None:
            out[name] = rho
    return out


def remember_radii(records, where: str = "the run") -> None:
    """Take the radii a run recorded ({radius_name: float}, see recorded_radii) as already computed, so
    that rebuilding its reservoir skips the eigendecomposition: w * (radius / rho) with the recorded rho
    is bit for bit the matrix the run had. A wrong value cannot pass unseen: the rebuilt matrix is
    checked against the run's fingerprint (published) or replaced by its checkpoint's (a run folder).
    Wrong types are a one-line ReslmError."""
    if records is None:
        return
    if not isinstance(records, dict):
        raise ReslmError(f"{where}: radii must be an object of radius values")
    for name, rho in records.items():
        try:
            norm, *key = json.loads(name) if isinstance(name, str) else (None,)
        except ValueError:
            norm, key = None, []
        if norm not in NORMS or not key or not all(isinstance(k, (str, int, float)) for k in key) \
                or isinstance(rho, bool) or not isinstance(rho, (int, float)) or not math.isfinite(rho) or rho <= 0:
            raise ReslmError(f"{where}: radii entry {name!r}: {rho!r} is not a recorded radius")
        _RADII.setdefault((norm, tuple(key)), float(rho))
