"""The cheap screen before a plan's runs: Jaeger's linear memory capacity (reslm.reservoir.capacity) of
the fixed reservoir each configuration of a plan builds, untrained (`reslm frontier capacity PLAN`).

Each configuration's reservoir at a seed (the substrate, size, scalings and options of its model
config; the embedding and the head play no part) is driven by an i.i.d. unit-variance signal along a
fixed random direction of its input, and linear readouts per delay recover the signal k steps back.
`channels` > 1 drives that many independent signals at once with the same total input power (a
character's width) and reads the reach per signal."""
from __future__ import annotations

import time

from reslm.core.errors import ReslmError
from reslm.frontier.plan import Plan
from reslm.models.resolve import resolve
from reslm.reservoir import RESERVOIRS
from reslm.reservoir.capacity import capacity_reach, memory_capacity


def reservoir_of(config, seed: int):
    """The fixed reservoir of a plan configuration at `seed` (its model config's substrate)."""
    model_cfg = resolve(config.family, {**config.model, "seed": seed}).config
    return RESERVOIRS[model_cfg.reservoir][1](model_cfg.reservoir_config())


def plan_capacities(plan: Plan, *, only=(), seed: int = 0, max_delay: int = 400, channels: int = 1,
                    fit: int | None = None, say=print) -> list[dict]:
    """One row per configuration of `plan` (the base is "base" where it has no label; `only`: these
    labels): the capacity (sum of r^2 over delays 1..max_delay), the last delays with r^2 >= 0.5 and
    >= 0.1, every delay's r^2 and the seconds it took; a line per row through `say`."""
    unknown = sorted(set(only) - {c.label or "base" for c in plan.configs})
    if unknown:
        raise ReslmError(f"plan {plan.name} has no configuration {', '.join(unknown)} (its labels: "
                         f"{', '.join(c.label or 'base' for c in plan.configs)})")
    rows = []
    for c in plan.configs:
        label = c.label or "base"
        if only and label not in only:
            continue
        t0 = time.perf_counter()
        res = reservoir_of(c, seed)
        mc = memory_capacity(res, max_delay=max_delay, channels=channels, fit=fit)
        secs = time.perf_counter() - t0
        reach = capacity_reach(mc["r2"], 0.5, channels), capacity_reach(mc["r2"], 0.1, channels)
        say(f"{label:>14}  {c.model.get('reservoir', 'esn'):>9}  N={res.size:,}  MC {mc['capacity']:7.2f}  "
            f"r2>=0.5 to k={reach[0]:3d}  r2>=0.1 to k={reach[1]:3d}  ({secs:.0f} s)")
        mc["r2"] = [round(x, 6) for x in mc["r2"]]
        rows.append(dict(label=label, model=c.model, reach_05=reach[0], reach_01=reach[1], seconds=round(secs, 1), **mc))
    return rows
