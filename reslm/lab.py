"""Stage 8, the reservoir lab report: every substrate at the paper's largest reservoir budgets, and what
reading a physical substrate out costs.

    reslm lab --budget quick --out lab

1. Substrates. Each substrate of SUBSTRATES is trained in the rc family at the rc-2600 budget and in
   the aerc family at the aerc-160-30 budget (both <= 155,459 trainable parameters; what the
   optimiser trains is counted, the fixed reservoir and embedding apart). Every run is an ordinary
   run directory (OUT/runs/<family>-<substrate>) trained with the budget's schedule (the budgets of
   `reslm reproduce`) in stream context mode (the state carried through the text: memory beyond 32
   characters is what the slow substrates are for). Test CE in nats and bits per character is the
   run's last evaluation, on the same test samples for every run of a budget.
2. Physical constraints. The rc and aerc runs of `--physical-substrate` (default esn), trained
   without constraints, are scored under readout-side noise (sigma over NOISE_GRID, ADC off) and
   under b-bit ADCs (BITS_GRID, no noise): `reslm.evaluate.physical_grid`, one reservoir pass each.
3. OUT/substrates.csv|png, OUT/physical.csv|png, OUT/results.json and OUT/report.md. Re-running skips
   finished runs and continues interrupted ones (the same run directories).

Substrate settings (SUBSTRATES): the sizes fill the budget (nvar's size is fixed by k and the
embedding size d: 1 + kd + kd(kd+1)/2, so d and k are chosen to come closest from below); every other
knob is the substrate's documented default or, where the character families' own defaults (spectral
radius 0.9, input scaling 2, tuned for the dense ESN) would be passed on, a value recorded here. They
are starting points, not tuned results: `reslm search` tunes a substrate's knobs.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from reslm.errors import ReslmError
from reslm.evaluate import physical_grid
from reslm.figures import plot_physical, plot_substrates
from reslm.models import PRESETS
from reslm.reproduce import BUDGETS, PAPER
from reslm.files import atomic_write, read_json, write_json
from reslm.run import SUMMARY, check_output_folder, lock_run
from reslm.run.load import find_dataset
from reslm.train import ensure_run, train

FAMILIES = ("rc", "aerc")
BUDGET_PRESET = {"rc": "rc-2600", "aerc": "aerc-160-30"}   # the trainable budget of each family
# model overrides per substrate and family, on top of the family's preset (size, hidden)
SUBSTRATES: dict[str, dict[str, dict]] = {
    "esn": {"rc": {}, "aerc": {}},
    "leaky": {"rc": dict(reservoir_options="a_min=0.02"), "aerc": dict(reservoir_options="a_min=0.02")},
    "deep": {"rc": dict(reservoir_options="layers=3"), "aerc": dict(reservoir_options="layers=2")},
    # 1 + kd + kd(kd+1)/2 <= N: d = 14, k = 5 -> 2,556 (rc); d = 8, k = 2 -> 153 (aerc)
    "nvar": {"rc": dict(size=2556, embed_dim=14, reservoir_options="k=5", input_scaling=1.0),
             "aerc": dict(size=153, embed_dim=8, reservoir_options="k=2", input_scaling=1.0)},
    "diagonal": {"rc": dict(spectral_radius=0.99, input_scaling=1.0, reservoir_options="nonlinear=true"),
                 "aerc": dict(spectral_radius=0.99, input_scaling=1.0, reservoir_options="nonlinear=true")},
    "delay": {"rc": dict(input_scaling=0.5), "aerc": dict(input_scaling=0.5)},
}
NOISE_GRID = (0.0, 0.01, 0.03, 0.1, 0.3, 1.0)
BITS_GRID = (0, 8, 6, 4, 3, 2, 1)   # 0: no ADC
LAB_BUDGETS = ("smoke", "quick", "paper")


def _log(msg: str) -> None:
    print(f"reslm lab: {msg}", file=sys.stderr, flush=True)


def _names(value, known, what: str) -> tuple[str, ...]:
    items = [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else list(value)
    bad = [v for v in items if v not in known]
    if bad or not items:
        raise ReslmError(f"unknown {what} {', '.join(bad) or '(none)'}: use a comma-separated subset of "
                         f"{','.join(known)}")
    return tuple(v for v in known if v in items)


def model_overrides(substrate: str, family: str) -> dict:
    """The rc / aerc config of `substrate` at its family's budget (stream context mode)."""
    _, preset_model, _ = PRESETS[BUDGET_PRESET[family]]
    return {**preset_model, "reservoir": substrate, "context_mode": "stream", **SUBSTRATES[substrate][family]}


def run_lab(out: Path, *, data: str = "shakespeare", budget: str = "quick", substrates=tuple(SUBSTRATES),
            families=FAMILIES, physical_substrate: str = "esn", data_root: Path | None = None,
            device: str = "auto", progress: bool = True, score: int | None = None) -> dict:
    """Train and score every (family, substrate), then the physical grids; returns results.json's content."""
    if budget not in LAB_BUDGETS:
        raise ReslmError(f"unknown budget {budget!r} (use {', '.join(LAB_BUDGETS)})")
    substrates = _names(substrates, tuple(SUBSTRATES), "substrate")
    families = _names(families, FAMILIES, "family")
    if physical_substrate not in substrates:
        raise ReslmError(f"--physical-substrate {physical_substrate} is not among --substrates {','.join(substrates)}")
    bud = BUDGETS[budget]
    score = bud.score if score is None else score
    train_over = dict(bud.char_train, device=device)
    dataset = find_dataset(data, "chars", data_root, prepare=True)
    out = Path(out)
    plan = [(fam, sub, model_overrides(sub, fam)) for sub in substrates for fam in families]
    t0 = time.perf_counter()
    check_output_folder(out, "budget.json", "a lab folder")   # never write into a user's folder
    with lock_run(out, create=True):
        stamp = read_json(out / "budget.json")
        if stamp is not None and stamp.get("budget") != budget:
            raise ReslmError(f"{out} holds a `{stamp.get('budget')}` lab; use another --out for `{budget}`")
        write_json(out / "budget.json", dict(budget=budget))
        rows = []
        for i, (fam, sub, model) in enumerate(plan, 1):
            run = out / "runs" / f"{fam}-{sub}"
            what = ensure_run(run, fam, model, train_over, dataset, preset=None)
            _log(f"[{i}/{len(plan)}] {run.name}: {what}")
            if what != "done":
                train(run, progress=progress)
            s = read_json(run / SUMMARY)
            rows.append(dict(family=fam, substrate=sub, run=str(run.relative_to(out)), size=model["size"],
                             trainable_params=s["trainable_params"], fixed_params=s["fixed_params"],
                             test_loss=s["final_test_loss"], test_bpc=s["final_test_bpc"],
                             best_test_loss=s["best_test_loss"], train_seconds=s["train_seconds"],
                             reservoir_seconds=s["reservoir_seconds"], options=model))
        physical = {}
        for fam in families:
            run = out / "runs" / f"{fam}-{physical_substrate}"
            _log(f"physical constraints on {run.name}")
            noise = physical_grid(run, {"state_noise": list(NOISE_GRID), "adc_bits": [0]}, score=score,
                                  device=device, write=False)
            adc = physical_grid(run, {"state_noise": [0.0], "adc_bits": list(BITS_GRID)}, score=score,
                                device=device, write=False)
            physical[fam] = dict(run=run.name, noise=[dict(sigma=r["state_noise"], test_loss=r["test_loss"])
                                                      for r in noise["rows"]],
                                 adc=[dict(bits=r["adc_bits"], test_loss=r["test_loss"]) for r in adc["rows"]],
                                 score_positions=noise["score_positions"])
        figs = dict(substrates=plot_substrates(rows, out, paper=PAPER["test_ce"]),
                    physical=plot_physical(physical, out))
        results = dict(budget=dict(name=budget, char_train=bud.char_train, left_out=bud.left_out),
                       data=str(dataset.path), substrates=rows, physical=physical,
                       physical_score=score, seconds=round(time.perf_counter() - t0, 1),
                       figures={k: {kk: vv.name if isinstance(vv, Path) else vv for kk, vv in v.items()  # in OUT
                                    if kk in ("png", "csv", "note")} for k, v in figs.items()})
        write_json(out / "results.json", results)
        report = write_report(out, results)
    _log(f"wrote {report}")
    return results


def best_row(rows: list[dict], family: str) -> dict | None:
    fam = [r for r in rows if r["family"] == family]
    return min(fam, key=lambda r: r["test_loss"]) if fam else None


def write_report(out: Path, results: dict) -> Path:
    rows, b = results["substrates"], results["budget"]
    L = ["# reslm lab", "",
         f"Budget `{b['name']}` (the `reslm reproduce` budget of that name; stream context mode). "
         f"What it leaves out of the paper's protocol: {b['left_out']}", "",
         "## Substrates at the paper's largest reservoir budgets", "",
         "Trainable parameters are what the optimiser trains; the fixed reservoir and embedding are counted "
         "apart. Test CE is each run's last evaluation on the test shard (nats; bits per character beside it). "
         f"The paper's full-protocol figures: RC (rc-2600) {PAPER['test_ce']['rc']}, AERC (aerc-160-30) "
         f"{PAPER['test_ce']['aerc']}.", "",
         "| family | substrate | N | trainable | fixed | test CE (nats) | bits/char | train s | reservoir s |",
         "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        L.append(f"| {r['family']} | {r['substrate']} | {r['size']:,} | {r['trainable_params']:,} | "
                 f"{r['fixed_params']:,} | {r['test_loss']:.4f} | {r['test_bpc']:.3f} | {r['train_seconds']:.0f} | "
                 f"{r['reservoir_seconds']:.0f} |")
    for fam in FAMILIES:
        best = best_row(rows, fam)
        if best:
            L.append(f"\nBest {fam}: `{best['substrate']}`, test CE {best['test_loss']:.4f} nats "
                     f"({best['trainable_params']:,} trainable).")
    L += ["", f"![substrates]({Path(results['figures']['substrates']['png']).name})"
          if results["figures"]["substrates"].get("png") else results["figures"]["substrates"]["note"], ""]
    L += ["## Physical constraints (readout side)", "",
          "The runs were trained without constraints and are scored under them (`reslm eval --state-noise "
          f"... --adc-bits ...`), on the first {results['physical_score'] or 'all'} test positions.", ""]
    for fam, p in results["physical"].items():
        L += [f"**{fam}** ({p['run']}): noise sigma -> test CE: " +
              ", ".join(f"{r['sigma']:g}: {r['test_loss']:.4f}" for r in p["noise"]) + "; ADC bits -> test CE: " +
              ", ".join(f"{r['bits'] or 'off'}: {r['test_loss']:.4f}" for r in p["adc"]), ""]
    fig = results["figures"]["physical"]
    L += [f"![physical constraints]({Path(fig['png']).name})" if fig.get("png") else fig["note"], "",
          f"Wall time of this call {results['seconds']:.0f} s (runs that earlier calls finished are not in it; "
          "each run's own times are in the table).", ""]
    path = out / "report.md"
    atomic_write(path, lambda tmp: tmp.write_text("\n".join(L), encoding="utf-8"))
    return path
