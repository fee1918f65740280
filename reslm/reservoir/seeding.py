"""Seed -> random streams: one independent generator per (seed, key) for the fixed matrices.

reservoirpy's habit (`Reservoir.initialize` spawns one RNG per matrix): a numpy SeedSequence with a
spawn key, so child (seed, k) is `SeedSequence(seed).spawn(k + 1)[k]`. Adding a matrix, a layer or
a stream draws from a new child and never shifts the others; no hand-made offsets such as
`seed * 1_000_003 + stream` or `1000 * layer`.

    child_seed(seed, *key) -> int               a 64-bit seed for the child named by key
    generator(seed, *key)  -> torch.Generator   a CPU generator seeded with child_seed(seed, *key)

Keys in use: an ESN draws W from key (0,), W_in from (1,), b from (2,); the other substrates use keys 3-9 (each module's
docstring names its own); LAERC's layer l (1..L) gets
the reservoir seed child_seed(model seed, l - 1).
"""
from __future__ import annotations

import numpy as np
import torch

from reslm.core.errors import ReslmError


def child_seed(seed: int, *key: int) -> int:
    """The seed of child `key` of `seed` (non-negative ints), as a 64-bit integer."""
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ReslmError(f"a seed must be a non-negative integer, got {seed!r}")
    ss = np.random.SeedSequence(entropy=seed, spawn_key=tuple(int(k) for k in key))
    return int(ss.generate_state(1, np.uint64)[0])


def generator(seed: int, *key: int) -> torch.Generator:
    """A CPU torch.Generator for child `key` of `seed` (draw on the CPU, then move: same on any device)."""
    return torch.Generator().manual_seed(child_seed(seed, *key))
