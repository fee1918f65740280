"""Jaeger's linear memory capacity (reslm.reservoir.capacity) of the reservoirs a frontier plan's
configurations build, untrained: the cheap screen before a plan's runs.

    python benchmarks/memory_capacity.py PLAN [--only LABEL ...] [--seed 0] [--max-delay 400] [--channels 1]
                                         [--fit 20000] [--threads 1] [--out OUT.json]

PLAN is a bundled plan's name (reslm/frontier/plans/NAME.toml) or a plan file. For each configuration
(the base is "base" where it has no label) the reservoir its model config describes at `--seed` (the
substrate, size, scalings and options of a run; the embedding and head play no part) is driven by an
i.i.d. unit-variance scalar signal along a fixed random direction of its d-dimensional input, and linear
readouts per delay recover the signal k steps back. Prints one line per configuration: the capacity
(sum of r^2 over delays 1..max_delay), the last delays whose r^2 is >= 0.5 and >= 0.1, and the seconds it
took; OUT.json holds every delay's r^2. --channels C drives C independent signals at once (the same input
power) and sums their r^2; the reach is then read per signal.
"""
from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import torch

from reslm.core.files import write_json
from reslm.frontier import load_plan
from reslm.models import make_config
from reslm.reservoir import RESERVOIRS
from reslm.reservoir.capacity import capacity_reach, memory_capacity


def reservoir_of(config, seed: int):
    """The fixed reservoir of a plan configuration at `seed` (its model config's substrate)."""
    model_cfg = make_config(config.family, **{**config.model, "seed": seed})   # the plan's model has its preset's fields
    return RESERVOIRS[model_cfg.reservoir][1](model_cfg.reservoir_config())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("plan")
    p.add_argument("--only", action="append", default=[], help="a configuration's label (repeatable; default all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-delay", type=int, default=400)
    p.add_argument("--channels", type=int, default=1)
    p.add_argument("--fit", type=int, default=None)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    plan = load_plan(a.plan)
    rows = []
    for c in plan.configs:
        label = c.label or "base"
        if a.only and label not in a.only:
            continue
        t0 = time.perf_counter()
        res = reservoir_of(c, a.seed)
        mc = memory_capacity(res, max_delay=a.max_delay, channels=a.channels, fit=a.fit)
        secs = time.perf_counter() - t0
        reach = capacity_reach(mc["r2"], 0.5, a.channels), capacity_reach(mc["r2"], 0.1, a.channels)
        print(f"{label:>14}  {c.model.get('reservoir', 'esn'):>9}  N={res.size:,}  MC {mc['capacity']:7.2f}  "
              f"r2>=0.5 to k={reach[0]:3d}  r2>=0.1 to k={reach[1]:3d}  ({secs:.0f} s)", flush=True)
        mc["r2"] = [round(x, 6) for x in mc["r2"]]
        rows.append(dict(label=label, model=c.model, reach_05=reach[0], reach_01=reach[1], seconds=round(secs, 1), **mc))
    if a.out:
        write_json(a.out, dict(plan=plan.name, seed=a.seed, threads=a.threads, cpu=platform.processor() or platform.machine(),
                               torch=torch.__version__, rows=rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
