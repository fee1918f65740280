"""The lab's report (`reslm lab`): OUT/substrates.csv|png, OUT/physical.csv|png and OUT/report.md, drawn
from OUT/results.json (which `reslm.experiments.lab.run_lab` wrote; the figures' files are added to it).
"""
from __future__ import annotations

import sys
from pathlib import Path

from reslm.core.errors import ReslmError
from reslm.core.files import atomic_write, read_json, write_json
from reslm.core.metrics import TEST_BPC, TEST_LOSS
from reslm.paper import LARGEST, TEST_CE
from reslm.report.plots import plot_physical, plot_substrates
from reslm.run import lock_run

FAMILIES = ("rc", "aerc")


def write_lab(out: Path) -> Path:
    """Draw the lab's figures, add them to results.json and write report.md; returns report.md's path."""
    out = Path(out)
    results = read_json(out / "results.json")
    if results is None:
        raise ReslmError(f"{out} holds no results.json: run `reslm lab --out {out}` first")
    with lock_run(out):
        figs = dict(substrates=plot_substrates(results["substrates"], out, paper=TEST_CE),
                    physical=plot_physical(results["physical"], out))
        results["figures"] = {k: {kk: vv.name if isinstance(vv, Path) else vv for kk, vv in v.items()  # in OUT
                                  if kk in ("png", "csv", "note")} for k, v in figs.items()}
        write_json(out / "results.json", results)
        report = write_report(out, results)
    print(f"reslm lab: wrote {report}", file=sys.stderr, flush=True)
    return report


def best_row(rows: list[dict], family: str) -> dict | None:
    fam = [r for r in rows if r["family"] == family]
    return min(fam, key=lambda r: r[TEST_LOSS]) if fam else None


def write_report(out: Path, results: dict) -> Path:
    rows, b = results["substrates"], results["budget"]
    L = ["# reslm lab", "",
         f"Budget `{b['name']}` (the `reslm reproduce` budget of that name; stream context mode). "
         f"What it leaves out of the paper's protocol: {b['left_out']}", "",
         "## Substrates at the paper's largest reservoir budgets", "",
         "Trainable parameters are what the optimiser trains; the fixed reservoir and embedding are counted "
         "apart. Test CE is each run's last evaluation on the test shard (nats; bits per character beside it). "
         f"The paper's full-protocol figures: RC ({LARGEST['rc']}) {TEST_CE['rc']}, AERC ({LARGEST['aerc']}) "
         f"{TEST_CE['aerc']}.", "",
         "| family | substrate | N | trainable | fixed | test CE (nats) | bits/char | train s | reservoir s |",
         "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        L.append(f"| {r['family']} | {r['substrate']} | {r['size']:,} | {r['trainable_params']:,} | "
                 f"{r['fixed_params']:,} | {r[TEST_LOSS]:.4f} | {r[TEST_BPC]:.3f} | {r['train_seconds']:.0f} | "
                 f"{r['reservoir_seconds']:.0f} |")
    for fam in FAMILIES:
        best = best_row(rows, fam)
        if best:
            L.append(f"\nBest {fam}: `{best['substrate']}`, test CE {best[TEST_LOSS]:.4f} nats "
                     f"({best['trainable_params']:,} trainable).")
    L += ["", f"![substrates]({Path(results['figures']['substrates']['png']).name})"
          if results["figures"]["substrates"].get("png") else results["figures"]["substrates"]["note"], ""]
    L += ["## Physical constraints (readout side)", "",
          "The runs were trained without constraints and are scored under them (`reslm eval --state-noise "
          f"... --adc-bits ...`), on the first {results['physical_score'] or 'all'} test positions.", ""]
    for fam, p in results["physical"].items():
        L += [f"**{fam}** ({p['run']}): noise sigma -> test CE: " +
              ", ".join(f"{r['sigma']:g}: {r[TEST_LOSS]:.4f}" for r in p["noise"]) + "; ADC bits -> test CE: " +
              ", ".join(f"{r['bits'] or 'off'}: {r[TEST_LOSS]:.4f}" for r in p["adc"]), ""]
    fig = results["figures"]["physical"]
    L += [f"![physical constraints]({Path(fig['png']).name})" if fig.get("png") else fig["note"], "",
          f"Wall time of this call {results['seconds']:.0f} s (runs that earlier calls finished are not in it; "
          "each run's own times are in the table).", ""]
    path = out / "report.md"
    atomic_write(path, lambda tmp: tmp.write_text("\n".join(L), encoding="utf-8"))
    return path
