"""The report of a reproduction (`reslm reproduce`): its figures and OUT/report.md, drawn from what the
reproduction wrote (OUT/results.json, and each run's metrics in OUT/runs/<preset> and OUT/tokens/<name>).

    OUT/figures/      fig2_losses, fig3_overlap, fig4_time, fig6_token_loss, scaling (Fig. 7): each a PNG
                      and the CSV it was drawn from
    OUT/results.json  completed with the figures' fits (scaling_fits, time_fits), their files and the
                      time drawing them took
    OUT/report.md     paper vs. this run, per-preset table, samples, environment, budget
"""
from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

from reslm.core.errors import ReslmError
from reslm.core.files import atomic_write, read_json, write_json
from reslm.core.metrics import MIN_TRAIN_LOSS, TEST_BPC, TEST_LOSS, VAL_LOSS, final_of
from reslm.models import families
from reslm.paper import LARGEST, PAPER
from reslm.report import figures
from reslm.report.scaling import write_scaling
from reslm.run import lock_run, read_metrics

CHAR_FAMILIES = ("tf", "rc", "aerc")          # the paper's order
ALL_FAMILIES = CHAR_FAMILIES + families("tokens")
FAMILY_NAMES = {"tf": "Transformer", "rc": "Reservoir (RC)", "aerc": "AERC", "laerc": "LAERC", "gpt": "GPT"}


def _log(msg: str) -> None:
    print(f"reslm reproduce: {msg}", file=sys.stderr, flush=True)


def write_reproduction(out: Path) -> Path:
    """Draw the figures of the reproduction in `out`, complete its results.json and write report.md;
    returns report.md's path."""
    out = Path(out)
    results = read_json(out / "results.json")
    if results is None:
        raise ReslmError(f"{out} holds no results.json: run `reslm reproduce --out {out}` first")
    with lock_run(out):
        t0 = time.perf_counter()
        figs = _figures(out, results)
        timings = {k: v for k, v in results["timings"].items() if k != "total"}
        timings["figures"] = time.perf_counter() - t0
        timings["total"] = results["timings"]["total"] + timings["figures"]
        results.update(
            scaling_fits=figs.get("fig7", {}).get("fits"), time_fits=figs.get("fig4", {}).get("fits"),
            figures={k: {kk: (str(vv) if isinstance(vv, Path) else vv) for kk, vv in v.items()
                         if kk in ("png", "csv", "note")} for k, v in figs.items()},
            timings=timings)
        write_json(out / "results.json", results)
        report = write_report(out, results)
    _log(f"wrote {report} ({timings['total']:.0f} s)")
    return report


def _figures(out: Path, results: dict) -> dict:
    """Fig. 2, 3, 4 from the character runs, Fig. 6 and 7 from the token runs (their curves read from
    each run's metrics.jsonl)."""
    char_rows, token_rows, kn = results["char_runs"], results["token_runs"], results.get("kneser_ney")
    fig_dir = out / "figures"
    made = {}
    if char_rows:
        made["fig2"] = figures.plot_char_losses(
            [dict(family=r["family"], name=r["preset"], trainable_params=r["trainable_params"],
                  epochs=read_metrics(out / "runs" / r["preset"], "eval"),
                  shards_per_cycle=r["shards_per_cycle"]) for r in char_rows], fig_dir)
        baselines = {f"Kneser-Ney order {kn['order']}": kn["overlap"]} if kn else None
        made["fig3"] = figures.plot_overlap(char_rows, fig_dir, baselines=baselines)
        made["fig4"] = figures.plot_times(
            [dict(family=r["family"], name=r["preset"], trainable_params=r["trainable_params"],
                  train_seconds=r["train_seconds"], infer_seconds=r["generation_trainable_seconds"],
                  reservoir_train_seconds=r["reservoir_train_seconds"],
                  reservoir_infer_seconds=r["generation_reservoir_seconds"]) for r in char_rows], fig_dir)
    if token_rows:
        curves = []
        for r in token_rows:
            metrics = read_metrics(out / "tokens" / r["name"])
            curves.append(dict(family=r["family"], name=r["name"], trainable_params=r["trainable_params"],
                               steps=[m for m in metrics if m["kind"] == "step"],
                               evals=[m for m in metrics if m["kind"] == "eval"]))
        made["fig6"] = figures.plot_token_curves(curves, fig_dir)
        made["fig7"] = write_scaling(fig_dir, token_rows)
    matplotlib_note(made)
    return made


def matplotlib_note(made: dict) -> str:
    """Say once on stderr when the figures are CSV only for lack of matplotlib (report.md says it too)."""
    note = figures.missing_matplotlib(made)
    if note:
        _log(note)
    return note


def _f(x, fmt=".4f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _order(values: dict) -> str:
    return " < ".join(FAMILY_NAMES[f] for f in sorted(values, key=values.get))


def write_report(out: Path, results: dict) -> Path:
    """OUT/report.md: the paper against this run, the runs' tables, the figures, samples, environment and budget;
    returns its path."""
    b = results["budget"]
    L = _paper_table(results)
    L += ["", f"What this budget leaves out compared with the paper's protocol: {b['left_out']}", ""]
    if results.get("presets"):
        L += [f"Only these Table-1 presets were run (`--presets`): {', '.join(results['presets'])}.", ""]
    if results["char_runs"]:
        L += _char_section(results)
    if results["token_runs"]:
        L += _token_section(results)
    L += _figures_section(results) + _samples_section(results) + _environment_section(results)
    path = out / "report.md"
    atomic_write(path, lambda tmp: tmp.write_text("\n".join(L), encoding="utf-8"))
    return path


def _paper_table(results: dict) -> list[str]:
    """The report's title and opening, and the table of the paper's figures beside this run's."""
    b = results["budget"]
    chars, kn = results["char_runs"], results.get("kneser_ney")
    L = [f"# reslm reproduction: budget `{b['name']}`", "",
         f"Reproduces Köster & Uchida, *Reservoir Computing as a Language Model*, on this machine with "
         f"`{results['command']}`. Every number below was measured by this run; the paper's are quoted "
         f"for comparison. Losses are cross-entropies in nats (bits = nats / ln 2).", "",
         "## Paper vs. this run", "",
         "| quantity | paper | this run |", "|---|---|---|"]
    largest = {}
    for fam in CHAR_FAMILIES:
        row = next((r for r in chars if r["preset"] == LARGEST[fam]), None)
        if row:
            largest[fam] = row[TEST_LOSS]
            L.append(f"| test CE, largest {FAMILY_NAMES[fam]} ({LARGEST[fam]}) | {PAPER['test_ce'][fam]:.2f} | "
                     f"{row[TEST_LOSS]:.4f} ({row[TEST_BPC]:.3f} bits/char) |")
    if len(largest) == 3:
        L.append(f"| ordering of the largest models (lowest CE first) | {_order(PAPER['test_ce'])} | "
                 f"{_order(largest)} |")
    for fam in CHAR_FAMILIES:
        row = next((r for r in chars if r["preset"] == LARGEST[fam]), None)
        if row:
            L.append(f"| Overlap-7 / Overlap-8, {LARGEST[fam]} | Fig. 3 (values not given in the text) | "
                     f"{_f(row['overlap']['7'], '.3f')} / {_f(row['overlap']['8'], '.3f')} |")
    fits = results.get("scaling_fits") or {}
    for fam, key in (("gpt", "a_TF"), ("laerc", "a_Res")):
        if fam in fits:
            f = fits[fam]
            L.append(f"| scaling slope a in L_min = a log10 N + b, {FAMILY_NAMES[fam]} | {PAPER[key]} | "
                     f"{f['a']:.3f} (b = {f['b']:.2f}, R² = {f['r2']:.3f}, {f['n']} sizes) |")
    if kn:
        L.append(f"| character Kneser-Ney baseline (order {kn['order']}, chosen on held-out training text), "
                 f"test CE on the whole test shard | not in the paper | {kn[TEST_LOSS]:.4f} "
                 f"({kn[TEST_BPC]:.3f} bits/char); Overlap-7/8 {_f(kn['overlap']['7'], '.3f')} / "
                 f"{_f(kn['overlap']['8'], '.3f')} |")
    return L


def _char_section(results: dict) -> list[str]:
    """The section of the character-level runs: one row per Table-1 preset, then the fits of time (Fig. 4)."""
    L = ["## Character-level runs (Table 1 presets)", "",
         "Test CE is the run's last evaluation (the training protocol's test set); Overlap-n compares the "
         "unique n-grams of a closed-loop sample with the test shard's. Times in seconds: `train` is the "
         "trainable part (the paper's figure), `reservoir` the digital reservoir's extra cost (states for "
         "training; reservoir steps while generating), `infer` the trainable part of generating "
         f"{results['eval_settings']['length']:,} characters at temperature "
         f"{results['eval_settings']['temperature']}.", "",
         "| preset | trainable | test CE | bits/char | Overlap-7 | Overlap-8 | distinct-8 | train s | "
         "reservoir train s | infer s | reservoir infer s |",
         "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results["char_runs"]:
        L.append(f"| {r['preset']} | {r['trainable_params']:,} | {r[TEST_LOSS]:.4f} | {r[TEST_BPC]:.3f} | "
                 f"{_f(r['overlap']['7'], '.3f')} | {_f(r['overlap']['8'], '.3f')} | "
                 f"{_f(r['distinct']['8'], '.3f')} | {r['train_seconds']:.1f} | "
                 f"{r['reservoir_train_seconds']:.1f} | {r['generation_trainable_seconds']:.2f} | "
                 f"{r['generation_reservoir_seconds']:.2f} |")
    tf = results.get("time_fits") or {}
    if tf:
        L += ["", "Fits y = α log10(x) of time against trainable parameters (paper Fig. 4):", "",
              "| family | α train | α infer | α train + reservoir | α infer + reservoir |", "|---|---|---|---|---|"]
        for fam, f in tf.items():
            L.append(f"| {FAMILY_NAMES.get(fam, fam)} | {_f(f.get('train'), '.3f')} | {_f(f.get('infer'), '.3f')} | "
                     f"{_f(f.get('train_total'), '.3f')} | {_f(f.get('infer_total'), '.3f')} |")
    return L + [""]


def _token_section(results: dict) -> list[str]:
    """The section of the token-level runs (LAERC vs. GPT): one row per size of the sweep."""
    L = ["## LAERC vs. GPT (token level)", "",
         f"Sweep `{results['budget']['token_sweep']}` on `{results['token_data']}`; every size trained with the "
         "same budget. Min train loss is the paper's L_min (the lowest logged training loss).", "",
         "| run | trainable | min train loss | final val loss | val CE (eval) | bits/char (eval) | train s |",
         "|---|---|---|---|---|---|---|"]
    for r in results["token_runs"]:
        L.append(f"| {r['name']} | {r['trainable_params']:,} | {_f(r[MIN_TRAIN_LOSS])} | "
                 f"{_f(r[final_of(VAL_LOSS)])} | {_f(r.get(TEST_LOSS))} | {_f(r.get(TEST_BPC), '.3f')} | "
                 f"{_f(r['train_seconds'], '.1f')} |")
    return L + [""]


def _figures_section(results: dict) -> list[str]:
    """The section of the figures: each one's PNG (where drawn) and the CSV it was drawn from."""
    L = ["## Figures", ""]
    if figures.missing_matplotlib(results["figures"]):
        L += [f"Note: {figures.NO_MATPLOTLIB}.", ""]
    titles = {"fig2": "Fig. 2: train and test loss over shard-epochs", "fig3": "Fig. 3: 7-gram and 8-gram overlap",
              "fig4": "Fig. 4: training and inference time", "fig6": "Fig. 6: LAERC and GPT training loss",
              "fig7": "Fig. 7: scaling of L_min with trainable parameters"}
    for key, fig in results["figures"].items():
        png, csv = fig.get("png"), fig.get("csv")
        if png:
            L += [f"![{titles[key]}](figures/{Path(png).name})", ""]
        L += [f"{titles[key]}: data in [figures/{Path(csv).name}](figures/{Path(csv).name})"
              + (f" ({fig['note']})" if fig.get("note") else ""), ""]
    return L


def _samples_section(results: dict) -> list[str]:
    """The section of the samples: the closed-loop text of each family's largest size, and of the Kneser-Ney
    baseline."""
    chars, tokens, kn = results["char_runs"], results["token_runs"], results.get("kneser_ney")
    L = ["## Samples", "", f"Closed-loop, temperature {results['eval_settings']['temperature']}, after the test "
         "text's first window (shown before the `|`); the largest size of each family.", ""]
    for fam in ALL_FAMILIES:
        pool = [r for r in chars + tokens if r["family"] == fam]
        if pool:
            r = max(pool, key=lambda r: r["trainable_params"])
            L += [f"**{FAMILY_NAMES[fam]}** ({r.get('preset') or r.get('name')}):", "", "```",
                  (r["prompt"] + "|" + r["sample"][:600]).strip("\n"), "```", ""]
    if kn:
        L += [f"**Kneser-Ney, order {kn['order']}**:", "", "```", (kn["prompt"] + "|" + kn["sample"][:600]).strip("\n"),
              "```", ""]
    return L


def _environment_section(results: dict) -> list[str]:
    """The section of the environment: the machine, the versions, the seeds, the budget and the wall times."""
    env, b = results["environment"], results["budget"]
    return ["## Environment", "",
            f"- device: {env['device']}" + (f" ({env['cpu']})" if env.get("cpu") else "") + f"; precision: "
            f"{env['precision']}; torch {env['torch']}, python {env['python']}, "
            f"{env['threads']} CPU threads; {env['platform']}",
            f"- reslm {env['reslm']}, git commit {env['git']}",
            f"- seeds: every run uses training seed {env['seed']} (shuffling, dropout, reservoir and weight draws); "
            f"sampling seed {results['eval_settings']['seed']}",
            f"- budget `{b['name']}`: character training {json.dumps(b['char_train'])}; token sweep "
            f"`{b['token_sweep']}` with overrides {json.dumps(b['token_train'])}; rc/aerc model "
            f"{json.dumps(b.get('reservoir_model', {}))}, training {json.dumps(b.get('reservoir_train', {}))}",
            "- wall time of this invocation: " + ", ".join(f"{k} {v:.0f} s" for k, v in results["timings"].items()),
            "", "Finished runs are reused when the command is re-run, so a re-run's wall times cover only what it "
            "redid.", ""]
