"""`reslm lab`: every substrate at the paper's largest reservoir budgets, and what reading a physical
substrate out costs (the report and its figures: reslm.report.write_lab).

1. Substrates. Each substrate of plans.SUBSTRATES is trained in the rc family at the rc-2600 budget and
   in the aerc family at the aerc-160-30 budget (both <= 155,459 trainable parameters; what the
   optimiser trains is counted, the fixed reservoir and embedding apart). Every run is an ordinary
   run directory (OUT/runs/<family>-<substrate>) trained with the budget's schedule (the budgets of
   `reslm reproduce`) in stream context mode (the state carried through the text: memory beyond 32
   characters is what the slow substrates are for). Test CE in nats and bits per character is the
   run's last evaluation, on the same test samples for every run of a budget.
2. Physical constraints. The rc and aerc runs of `--physical-substrate` (default esn), trained
   without constraints, are scored under readout-side noise (sigma over NOISE_GRID, ADC off) and
   under b-bit ADCs (BITS_GRID, no noise): `reslm.scoring.physical.physical_grid`, one reservoir pass each.
3. OUT/results.json. Re-running skips finished runs and continues interrupted ones (the same run
   directories).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from reslm.core.device import pick_device
from reslm.core.errors import ReslmError
from reslm.scoring.physical import physical_grid
from reslm.experiments.plans import (BITS_GRID, BUDGETS, LAB_BUDGETS, LAB_FAMILIES, NOISE_GRID, SUBSTRATES,
                                     lab_plan, parse_names)
from reslm.experiments.runner import run_plan, stamped_folder, validate
from reslm.core.files import write_json
from reslm.core.metrics import TEST_BPC, TEST_LOSS, best_of, final_of
from reslm.data.datasets import find_dataset


def _log(msg: str) -> None:
    print(f"reslm lab: {msg}", file=sys.stderr, flush=True)


def lab_folder(budget: str) -> Path:
    """The folder a lab writes to when none is given: lab-BUDGET."""
    return Path(f"lab-{budget}")


def run_lab(out: Path, *, data: str = "shakespeare", budget: str = "quick", substrates=tuple(SUBSTRATES),
            families=LAB_FAMILIES, physical_substrate: str = "esn", data_root: Path | None = None,
            device: str = "auto", progress: bool = True, score: int | None = None) -> dict:
    """Train and score every (family, substrate), then the physical grids; returns results.json's content."""
    if budget not in LAB_BUDGETS:
        raise ReslmError(f"unknown budget {budget!r} (use {', '.join(LAB_BUDGETS)})")
    substrates = parse_names(substrates, tuple(SUBSTRATES), "substrate")
    families = parse_names(families, LAB_FAMILIES, "family", "families")
    if physical_substrate not in substrates:
        raise ReslmError(f"--physical-substrate {physical_substrate} is not among --substrates {','.join(substrates)}")
    bud = BUDGETS[budget]
    score = bud.score if score is None else score
    if isinstance(score, bool) or not isinstance(score, int) or score < 0:   # before the first of its runs
        raise ReslmError(f"--score must be an integer >= 0 (0: the whole test text), got {score!r}")
    pick_device(device)                                                     # a bad --device: now, not after training
    dataset = find_dataset(data, "chars", data_root, prepare=True)
    out = Path(out)
    plan = lab_plan(bud, substrates, families, device)
    validate(plan, dataset)
    t0 = time.perf_counter()
    with stamped_folder(out, budget, "lab"):
        summaries = run_plan(out / "runs", plan, dataset, progress=progress, say=_log)
        rows = [dict(family=r.family, substrate=r.model["reservoir"], run=f"runs/{r.name}", size=r.model["size"],
                     trainable_params=s["trainable_params"], fixed_params=s["fixed_params"],
                     **{TEST_LOSS: s[final_of(TEST_LOSS)], TEST_BPC: s[final_of(TEST_BPC)]},
                     **{best_of(TEST_LOSS): s[best_of(TEST_LOSS)]}, train_seconds=s["train_seconds"],
                     reservoir_seconds=s["reservoir_seconds"], options=r.model) for r, s in zip(plan, summaries)]
        physical = {}
        for fam in families:
            run = out / "runs" / f"{fam}-{physical_substrate}"
            _log(f"physical constraints on {run.name}")
            noise = physical_grid(run, {"state_noise": list(NOISE_GRID), "adc_bits": [0]}, score=score,
                                  device=device, write=False)
            adc = physical_grid(run, {"state_noise": [0.0], "adc_bits": list(BITS_GRID)}, score=score,
                                device=device, write=False)
            physical[fam] = dict(run=run.name, noise=[dict(sigma=r["state_noise"], **{TEST_LOSS: r[TEST_LOSS]})
                                                      for r in noise["rows"]],
                                 adc=[dict(bits=r["adc_bits"], **{TEST_LOSS: r[TEST_LOSS]}) for r in adc["rows"]],
                                 score_positions=noise["score_positions"])
        results = dict(budget=dict(name=budget, char_train=bud.char_train, left_out=bud.left_out),
                       data=str(dataset.path), substrates=rows, physical=physical,
                       physical_score=score, seconds=round(time.perf_counter() - t0, 1),
                       figures={})   # the report's (reslm.report.write_lab)
        write_json(out / "results.json", results)
    return results
