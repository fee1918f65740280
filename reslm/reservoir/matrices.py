"""Tokens -> reservoir states: the fixed random matrices and their radius scaling.

reservoirpy's `mat_gen.py` vocabulary in a few functions: `random_sparse` draws W or W_in (uniform
U(-1, 1) or normal N(0, 1) entries, a fraction `density` kept), `scale_radius` rescales a square W
so that its spectral radius rho(W) (largest |eigenvalue|) or its largest singular value sigma_max(W)
equals a requested value. Everything is computed in float64, so the requested value holds exactly.
"""
from __future__ import annotations

import torch

from reslm.core.errors import ReslmError
from reslm.core.radii import is_deferred, radius_of

DISTRIBUTIONS = ("uniform", "normal")


def random_sparse(rows: int, cols: int, density: float, gen: torch.Generator,
                  dist: str = "uniform") -> torch.Tensor:
    """(rows, cols) float64 entries U(-1, 1) ("uniform") or N(0, 1) ("normal"), each kept with
    probability `density` (the mask is a second draw from the same generator)."""
    if dist == "uniform":
        w = torch.rand(rows, cols, generator=gen, dtype=torch.float64) * 2 - 1
    elif dist == "normal":
        w = torch.randn(rows, cols, generator=gen, dtype=torch.float64)
    else:
        raise ReslmError(f"unknown distribution {dist!r} (choose from {', '.join(DISTRIBUTIONS)})")
    if density < 1:
        w *= torch.rand(rows, cols, generator=gen, dtype=torch.float64) < density
    return w


def spectral_radius(w: torch.Tensor) -> float:
    """Largest absolute eigenvalue of a square matrix (computed in float64)."""
    return torch.linalg.eigvals(w.double()).abs().max().item()


def largest_singular_value(w: torch.Tensor) -> float:
    """sigma_max(w), the operator 2-norm (computed in float64); always >= the spectral radius."""
    return torch.linalg.matrix_norm(w.double(), ord=2).item()


RADIUS_NORMS = {"spectral": spectral_radius, "singular": largest_singular_value}



def scale_radius(w: torch.Tensor, radius: float, norm: str = "spectral", key: tuple | None = None) -> torch.Tensor:
    """Rescale w so that its `norm` ("spectral": rho, "singular": sigma_max) equals `radius`.

    `key` names the random draw that made w (e.g. its kind, size, density and seed): the same key is
    always the same matrix, so its radius is computed once per process (building a model to load a
    checkpoint into, as evaluation does, then costs no eigendecomposition)."""
    if norm not in RADIUS_NORMS:
        raise ReslmError(f"unknown radius norm {norm!r} (choose from {', '.join(RADIUS_NORMS)})")
    if is_deferred():   # a checkpoint's matrix replaces this one (reslm.core.radii.deferred)
        return w * radius
    rho = radius_of(norm, key, lambda: RADIUS_NORMS[norm](w))
    if rho == 0:
        raise ReslmError(f"the random recurrent matrix has {norm} radius 0 (nilpotent or empty); raise density")
    return w * (radius / rho)


def scale_spectral_radius(w: torch.Tensor, radius: float, key: tuple | None = None) -> torch.Tensor:
    """Rescale w so that rho(w) == radius (see scale_radius)."""
    return scale_radius(w, radius, "spectral", key)
