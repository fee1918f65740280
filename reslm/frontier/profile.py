"""The bench's memory: how far back the benchmarked substrate's runs read, beside the ESN frontier's and the
trained GRU ceiling's, and how much of its input the fixed substrate itself keeps.

    profile    `reslm memory` (reslm.scoring.memory) of the bench's first seed's run: the test CE of 16,384
               positions, each read from exactly its k preceding characters from a zero state, k = 1, 2, 4,
               ..., 256 (one seed: the profile's and the capacities' seconds are recorded beside them)
    references the ESN frontier's and the GRU ceiling's curves on the same positions, from the published
               profile REFERENCE (results/memory/...); a reference whose positions, lengths or text differ
               from the bench's is left out with a note, never drawn beside it as if comparable
    capacity   Jaeger's linear memory capacity (reslm.reservoir.capacity) of the substrate at seed 0 and of
               the recipe's ESN: the sum over delays 1..MAX_DELAY of the r^2 with which a linear readout
               recovers an i.i.d. input that many steps back (a recorded substrate cannot be driven: none)
"""
from __future__ import annotations

import time
from pathlib import Path

from reslm.core.errors import ReslmError
from reslm.core.files import read_json
from reslm.core.metrics import MEMORY_LOSS
from reslm.frontier.capacity import reservoir_of
from reslm.frontier.plan import Config
from reslm.reservoir.capacity import memory_capacity
from reslm.scoring.memory import LENGTHS, POSITIONS, line_plot, memory_profile

REFERENCE = Path("memory") / "esn-vs-gru-ceiling-test.json"   # under the results folder
MAX_DELAY = 256
PLOT = "memory.png"


def bench_memory(runs: dict[int, Path], cfg: Config, base: Config, results: Path, references: dict[str, str], *,
                 positions: int = POSITIONS, progress: bool = True) -> dict:
    """The profile of the bench's first seed's run (its curve and its standard errors), the references' curves
    where the published profile matches (`references`: {label: published folder name}), and the two
    capacities."""
    seed = next(iter(runs))
    t0 = time.perf_counter()
    prof = memory_profile([runs[seed]], LENGTHS, positions, progress=progress)
    t1 = time.perf_counter()
    capacity, capacity_esn = _capacity(cfg), _capacity(base)
    refs, notes = _references(prof, Path(results) / REFERENCE, references)
    return dict(positions=prof["positions"], text=prof["text"], lengths=prof["lengths"], seed=seed,
                curve=prof["runs"][0][MEMORY_LOSS], se=prof["runs"][0]["se"], references=refs, notes=notes,
                capacity=capacity, capacity_esn=capacity_esn, max_delay=MAX_DELAY,
                profile_seconds=round(t1 - t0, 1), capacity_seconds=round(time.perf_counter() - t1, 1))


def _references(prof: dict, path: Path, wanted: dict[str, str]) -> tuple[dict, list[str]]:
    """{label: curve} of the wanted published runs in the profile at `path`, and notes on what is left out."""
    ref = read_json(path)
    if ref is None:
        return {}, [f"no published profile at {path}: the references' curves are left out"]
    same = all(ref.get(k) == prof.get(k) for k in ("positions", "lengths", "split", "text_symbols", "data"))
    if not same:
        return {}, [f"{path} was measured on other positions, lengths or text: the references' curves are left out"]
    by_run = {r["run"]: r[MEMORY_LOSS] for r in ref["runs"]}
    out = {label: by_run[name] for label, name in wanted.items() if name in by_run}
    notes = [f"{label}: {name} is not in {path}" for label, name in wanted.items() if name not in by_run]
    return out, notes


def _capacity(cfg: Config) -> float | None:
    """Jaeger's memory capacity of the configuration's substrate at seed 0, over delays 1..MAX_DELAY (None for
    a substrate that cannot be driven with an i.i.d. input: a recording)."""
    try:
        res = reservoir_of(cfg, 0)
    except ReslmError:
        return None
    if not getattr(res, "drivable", True):
        return None
    return memory_capacity(res, max_delay=MAX_DELAY)["capacity"]


def memory_lines(mem: dict, name: str) -> list[str]:
    """The card's memory section: one row per curve (this bench's seed, the references), CE at each k, and the
    capacities."""
    ks = [str(k) for k in mem["lengths"]]
    rows = [(f"**{name}** (seed {mem['seed']})", mem["curve"])] + list(mem["references"].items())
    L = [f"Test CE (nats) of {mem['positions']:,} positions of {mem['text']}, each read from exactly its k preceding "
         "characters from a zero state (`reslm memory`): where a curve stops falling, the model stops using older "
         "text.", "", "| model | " + " | ".join(f"k={k}" for k in ks) + " |", "|---|" + "---|" * len(ks)]
    L += [f"| {label} | " + " | ".join("-" if c.get(k) is None else f"{c[k]:.3f}" for k in ks) + " |"
          for label, c in rows]
    mc = ", ".join(f"{label} {v:.1f}" for label, v in ((name, mem["capacity"]), ("the recipe's ESN", mem["capacity_esn"]))
                   if v is not None)
    L += ["", f"Memory capacity (Jaeger's linear MC over delays 1..{mem['max_delay']}, the fixed substrate alone at "
          f"seed 0, i.i.d. input; in characters at most {mem['max_delay']}): {mc or 'not measurable here'}."]
    L += [f"Note: {n}" for n in mem["notes"]]
    return L


def plot_bench_memory(mem: dict, name: str, path: Path) -> None:
    """The card's figure: test CE against k (log scale), this bench's seed beside the references."""
    def draw(ax):
        ks = [int(k) for k in mem["lengths"]]
        for label, curve, style in [(f"{name} (seed {mem['seed']})", mem["curve"], "o-")] + \
                [(label, c, "s--") for label, c in mem["references"].items()]:
            at = [k for k in ks if curve.get(str(k)) is not None]
            ax.plot(at, [curve[str(k)] for k in at], style, label=label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("characters read before the target (k)")
        ax.set_ylabel("test CE (nats per character)")
        ax.set_title(f"{mem['positions']:,} positions of {mem['text']}")
    line_plot(path, draw)


__all__ = ["MAX_DELAY", "PLOT", "REFERENCE", "bench_memory", "memory_lines", "plot_bench_memory"]
