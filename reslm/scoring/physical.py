"""A trained reservoir run under the readout-side constraints of a physical substrate (reservoir/physical.py):
`reslm eval --state-noise ... --adc-bits ...` with several values per constraint scores the run under every
combination (`physical_grid`, CE only) from one pass of the reservoir over the chunk `evaluate_run` scores, each
setting re-measuring those raw states with the same test noise draws: eval-physical.json and .csv.

    physical_grid(run_dir, grid)   test CE under each combination of `grid` ({field: [values]})
    check_grid(grid)               a grid over GRID_MAX combinations refused before any work
    run_physical(model, cfg, overrides)   the run's trained constraints and those to measure through
    grid_text(result)              the result as `reslm eval` prints it
"""
from __future__ import annotations

import csv
import itertools
import math
from contextlib import nullcontext
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch

from reslm.core.device import pick_device
from reslm.core.errors import ReslmError
from reslm.core.files import atomic_write, write_json
from reslm.core.metrics import TEST_BITS, TEST_LOSS, bits
from reslm.data.datasets import check_dataset, open_dataset
from reslm.models.base import estimate_loss, feature_batches
from reslm.models.load import load_run
from reslm.models.reservoir_lm import ReservoirLM
from reslm.reservoir.physical import FIELDS as PHYSICAL_FIELDS
from reslm.reservoir.physical import TEST_KEY
from reslm.run import lock_run
from reslm.scoring.pieces import PIECE, timed

GRID_MAX = 1_000   # combinations of physical settings one `reslm eval` grid may score
GRID_FILE = "eval-physical"   # .json and .csv


def run_physical(model, cfg: dict, overrides: dict | None):
    """(the run's trained PhysicalConfig, the one to measure through), after checking the overrides."""
    if not isinstance(model, ReservoirLM):   # the readout-side constraints are ReservoirLM's
        if overrides:
            raise ReslmError(f"physical constraints (--state-noise, --adc-bits, --gain-mismatch, --adc-range) "
                             f"apply to reservoir runs (rc, aerc), not to {cfg['family']}")
        return None, None
    unknown = sorted(set(overrides or {}) - set(PHYSICAL_FIELDS))
    if unknown:
        raise ReslmError(f"unknown physical constraint(s): {', '.join(unknown)}")
    trained = model.config.physical_config()
    return trained, replace(trained, **(overrides or {})).validate()


def _score_physical(model, tokens: torch.Tensor, context: int, configs, position: int = 0,
                    batch_size: int = 1024) -> list[float]:
    """_score_chars under each PhysicalConfig in `configs`: one reservoir pass per piece, then each
    measurement of those raw states (the same test noise draws, scaled by each sigma)."""
    totals, count = [0.0] * len(configs), 0
    for a in range(0, tokens.numel() - context, PIECE):
        piece = tokens[a:a + PIECE + context]
        raw = model.states(piece, position=position + a)
        for i, pc in enumerate(configs):
            model.set_physical(pc)
            feats = model.measured(raw.clone(), piece, noise_key=TEST_KEY, offset=a)
            loss, n = estimate_loss(model, feature_batches(feats, batch_size))
            totals[i] += loss * n
        count += n
    return [t / max(count, 1) for t in totals]


def check_grid(grid: dict) -> None:
    """ReslmError when a physical grid has more than GRID_MAX combinations (before any work)."""
    combinations = math.prod(len(v) for v in grid.values()) if grid else 0
    if combinations > GRID_MAX:
        raise ReslmError(f"the physical grid has {combinations:,} combinations, over the cap of {GRID_MAX:,} (each "
                         "is a pass over the scored text): give fewer values per constraint")


def physical_grid(run_dir: Path, grid: dict, *, write: bool = True, **kw) -> dict:
    """Test CE of one rc / aerc run under every combination of the physical settings in `grid`
    ({field: [values]}, fields of PhysicalConfig; the others stay as trained), on the chunk
    `evaluate_run` scores. The reservoir runs once; each setting re-measures its states. Writes
    run_dir/eval-physical.json and .csv (replacing a previous grid's). A grid of more than GRID_MAX
    combinations is refused before anything is done."""
    check_grid(grid)
    with lock_run(run_dir) if write else nullcontext():   # the whole command, as evaluate_run
        return _physical_grid(Path(run_dir), grid, write=write, **kw)


def _physical_grid(run_dir: Path, grid: dict, *, score: int = 65536, device: str = "cpu",
                   write: bool = True, root: Path | None = None) -> dict:
    if not isinstance(score, int) or score < 0:
        raise ReslmError(f"score must be a non-negative integer, got {score!r}")
    run_dir = Path(run_dir)
    dev = pick_device(device)
    model, _, cfg = load_run(run_dir, dev)
    names = list(grid)
    settings = [dict(zip(names, values)) for values in itertools.product(*(grid[n] for n in names))]
    if not settings or any(not grid[n] for n in names):
        raise ReslmError("the physical grid is empty: give at least one value per constraint")
    trained, _ = run_physical(model, cfg, settings[0])
    configs = [run_physical(model, cfg, s)[1] for s in settings]
    ds = open_dataset(cfg["data"], root)
    check_dataset(cfg, ds)
    a, b = ds.shards[ds.test_shard]
    tokens = torch.from_numpy(np.asarray(ds.tokens[a:b], dtype=np.int64)).to(dev)
    context = model.config.context
    chunk = tokens if score == 0 else tokens[:score + context]
    if chunk.numel() <= context:
        raise ReslmError(f"the test text of {run_dir} is too short ({tokens.numel()} characters)")
    losses, seconds, res_seconds = timed(lambda _: _score_physical(model, chunk, context, configs, position=a), model)
    rows = [dict(**asdict(pc), **{TEST_LOSS: loss, TEST_BITS: bits(loss)}) for pc, loss in zip(configs, losses)]
    result = dict(run=str(run_dir), family=cfg["family"], preset=cfg.get("preset"),
                  physical_trained=asdict(trained), grid={n: list(grid[n]) for n in names},
                  score_positions=chunk.numel() - context, seconds=seconds, reservoir_seconds=res_seconds,
                  rows=rows, environment=dict(device=str(dev), torch=torch.__version__,
                                              threads=torch.get_num_threads()))
    if write:
        write_json(run_dir / f"{GRID_FILE}.json", result)
        atomic_write(run_dir / f"{GRID_FILE}.csv", lambda p: _write_csv(p, rows))
    return result


def grid_text(r: dict) -> str:
    """A physical_grid result as a table: one row per setting, its test CE in nats and bits."""
    names = list(r["grid"])
    lines = [f"{r['run']}: {r['family']} {r.get('preset') or ''}, test CE over {r['score_positions']:,} positions "
             f"(trained with: {', '.join(f'{k} {v}' for k, v in r['physical_trained'].items())})",
             "".join(f"{n:>15}" for n in names) + f"{'CE (nats)':>12}{'bits/char':>11}"]
    for row in r["rows"]:
        lines.append("".join(f"{row[n]:>15g}" for n in names) + f"{row[TEST_LOSS]:>12.4f}{row[TEST_BITS]:>11.3f}")
    return "\n".join(lines)


def _write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
