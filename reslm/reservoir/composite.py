"""Tokens -> reservoir states: two or more registered substrates side by side in one state.

    state_t = [state of part 1, ..., state of part K]        every part reads the same input u_t

The parts are named by one reservoir option, `parts`, that fits the "key=value,key=value" string of
options.py (so a comma never appears inside it):

    parts=esn:1482(input_init=normal)+legendre:768(theta=64;order=48)

    part     NAME[:SIZE][(KEY=VALUE;KEY=VALUE...)]    NAME a key of RESERVOIRS (a user's registered
                                                      substrate too), its options separated by ';'
    parts    part+part+...                           at least one

Sizes: the parts that give a SIZE get it; the units of `size` left over are split evenly among those
that do not (the remainder to the first of them); the sizes must add up to `size`. Each part's config is
its substrate's own, filled like a model fills a single substrate's (models/reservoir_lm.py): the
composite's reservoir knobs (spectral_radius, input_scaling, leak_rate, density, input_density,
bias_scaling: reservoir.ReservoirKnobs) where the part's config has a field of that name, then the part's
own options over them (its options are read by options.parse_options, with the same one-line errors).
Part k (1..K) is seeded with child_seed(seed, PART_KEY, k): its own stream, whatever the other parts are.

A part must compute its states (a recording, which replays them, cannot be one) and a composite cannot
be a part. The composite is pure and drivable when every part is.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, fields

import torch
from torch import nn

from reslm.core.errors import ReslmError
from reslm.reservoir.base import Reservoir, ReservoirConfig
from reslm.reservoir.esn import KNOBS, ReservoirKnobs
from reslm.reservoir.options import parse_options
from reslm.reservoir.registry import RESERVOIRS
from reslm.reservoir.seeding import child_seed

PART_KEY = 7   # part k is seeded with child_seed(seed, PART_KEY, k)
_PART = re.compile(r"\s*([A-Za-z0-9_.\-]+)\s*(?::\s*(\d+)\s*)?(?:\((.*)\))?\s*")
_OWN = ("size", "input_dim", "seed")   # what the composite sets for every part itself


def split_parts(text: str) -> list[tuple[str, int | None, str]]:
    """[(name, size or None, "key=value;...")] of a `parts` string (module doc); ReslmError if malformed."""
    pieces, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth < 0:
            break
        if ch == "+" and depth == 0:
            pieces.append(text[start:i])
            start = i + 1
    pieces.append(text[start:])
    out = []
    for piece in pieces:
        m = _PART.fullmatch(piece) if depth == 0 else None
        if m is None:
            raise ReslmError(f"composite parts: {piece.strip() or text!r} is not NAME[:SIZE][(key=value;...)] "
                             f"(e.g. parts=esn:1500(input_init=normal)+legendre:752(theta=64))")
        out.append((m[1], int(m[2]) if m[2] else None, m[3] or ""))
    return out


@dataclass
class CompositeConfig(ReservoirKnobs, ReservoirConfig):
    input_dim: int = 16             # d, input vector size (every part reads it)
    parts: str = "esn"              # NAME[:SIZE][(key=value;...)] joined by '+' (module doc)

    def validate(self):
        if not isinstance(self.size, int) or isinstance(self.size, bool) or self.size < 1 or self.input_dim < 1:
            raise ReslmError(f"composite size and input_dim must be >= 1, got {self.size}, {self.input_dim}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ReslmError(f"seed must be a non-negative integer, got {self.seed!r}")
        for k, cfg in enumerate(self.part_configs(), 1):
            try:
                cfg.validate()
            except ReslmError as e:
                raise ReslmError(f"composite part {k}: {e}") from None

    def part_sizes(self) -> list[int]:
        """Each part's size: its own, or an even share of what the sized parts leave (module doc)."""
        parsed = split_parts(self.parts)
        given = sum(s for _, s, _ in parsed if s is not None)
        free = [i for i, (_, s, _) in enumerate(parsed) if s is None]
        left = self.size - given
        if (free and left < len(free)) or (not free and left != 0):
            sizes = "+".join(f"{n}:{s if s is not None else '?'}" for n, s, _ in parsed)
            raise ReslmError(f"composite parts {sizes} do not add up to size {self.size} (every part needs >= 1 unit)")
        sizes = [s for _, s, _ in parsed]
        for j, i in enumerate(free):
            sizes[i] = left // len(free) + (1 if j < left % len(free) else 0)
        if min(sizes) < 1:
            raise ReslmError(f"composite parts: every part needs a size >= 1, got {sizes}")
        return sizes

    def part_configs(self) -> list:
        """The config of every part, in order (module doc)."""
        registry, out = RESERVOIRS, []
        for k, ((name, _, text), size) in enumerate(zip(split_parts(self.parts), self.part_sizes()), 1):
            if name not in registry or registry[name] is None:
                raise ReslmError(f"composite part {k}: unknown reservoir {name!r} (known: "
                                 f"{', '.join(n for n, e in registry.items() if e is not None)})")
            cfg_cls, cls = registry[name]
            if cls is Composite or cls.replays:
                raise ReslmError(f"composite part {k}: {name!r} cannot be a part (a part computes its states and "
                                 "is not itself a composite)")
            try:
                options = parse_options(name, cfg_cls, text.replace(";", ","), reserved=_OWN)
            except ReslmError as e:
                raise ReslmError(f"composite part {k}: {e}") from None
            names = {f.name for f in fields(cfg_cls)}
            knobs = {f: getattr(self, f) for f in KNOBS if f in names and f not in _OWN}
            out.append(cfg_cls(**{**knobs, **options}, size=size, input_dim=self.input_dim,
                               seed=child_seed(self.seed, PART_KEY, k)))
        return out


class Composite(Reservoir):
    """Registered substrates side by side. forward(u (B,T,d), s0 (B,N)) -> (states (B,T,N) = parts concatenated, s_T)."""

    pure = True   # when every part is (set per instance below)

    def __init__(self, cfg: CompositeConfig):
        super().__init__(cfg)
        registry = RESERVOIRS
        names = [name for name, _, _ in split_parts(cfg.parts)]
        self.parts = nn.ModuleList(registry[name][1](pc) for name, pc in zip(names, cfg.part_configs()))
        self.sizes = [p.size for p in self.parts]
        if sum(self.sizes) != self.size:
            raise ReslmError(f"composite parts have {sum(self.sizes)} units in all, not its size {self.size}")
        self.pure = all(getattr(p, "pure", False) for p in self.parts)
        self.drivable = all(getattr(p, "drivable", True) for p in self.parts)

    def init_state(self, batch: int, device=None, dtype=None) -> torch.Tensor:
        starts = [p.init_state(batch, device, dtype) for p in self.parts]
        dt = dtype or _common(starts)
        return torch.cat([s.to(dt) for s in starts], -1)

    def _starts(self, s):
        return [None] * len(self.parts) if s is None else s.split(self.sizes, dim=-1)

    def forward(self, u: torch.Tensor, s0: torch.Tensor | None = None):
        runs = [part(u, s) for part, s in zip(self.parts, self._starts(s0))]
        dt = _common([r[0] for r in runs])
        return torch.cat([r[0].to(dt) for r in runs], -1), torch.cat([r[1].to(dt) for r in runs], -1)

    def step(self, u_t: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        nxt = [part.step(u_t, p) for part, p in zip(self.parts, self._starts(s))]
        dt = _common(nxt)
        return torch.cat([x.to(dt) for x in nxt], -1)


def _common(tensors) -> torch.dtype:
    """The dtype every part's states are returned in: the promotion of theirs."""
    dt = tensors[0].dtype
    for t in tensors[1:]:
        dt = torch.promote_types(dt, t.dtype)
    return dt
