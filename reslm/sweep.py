"""Stage 7, the scaling sweep: LAERC vs GPT at several sizes, one shared training budget, L_min = a log10 N + b.

The paper (section "Results: optimization behavior and scaling laws") trains transformers and LAERC
models of several sizes with the same hyperparameters, takes each run's best (minimum) training loss
and fits L_min(N) = a log10 N + b against the number of trainable parameters N; it reports
a_TF ~ -1.72 for the transformers and a_Res ~ -0.81 for LAERC.

    out/<family>-d<D>-l<L>/   one ordinary token run directory per (family, size) (reslm.run layout)
    out/scaling.csv           one row per run: family, name, dim, n_layers, trainable/fixed params,
                              min training loss (over the "step" rows), final val loss, ...
    out/scaling_fit.json      {family: {a, b, r2, n}} plus the paper's slopes, for reference
    out/scaling.png           both families' points and fit lines, log x axis (needs matplotlib)

Sweeps (SWEEPS) are named size families plus one training budget shared by every run:

* "cpu": sized for `bpe:4096` on Shakespeare on 2 CPU cores (context 128, micro-batch 16, no
  accumulation, 300 steps = 614k tokens, ~0.2 epoch: all 8 runs fit a short session on a laptop CPU
  (timings: docs/design-figures.md). LAERC (D, L) = (32,2), (48,3), (64,4), (96,4) with r_mult 4 (R = 4D).
  GPT has the same number of layers as its LAERC partner and the width (multiple of 8, 4 heads)
  whose trainable-parameter count is closest to LAERC's at V = 4096, T = 128 (closed forms
  `laerc_param_count` / `gpt_param_count`):

      LAERC d32 l2     198,404     GPT d40 l2      208,480  (1.051x)
      LAERC d48 l3     414,102     GPT d64 l3      420,416  (1.015x)
      LAERC d64 l4     768,904     GPT d88 l4      748,176  (0.973x)
      LAERC d96 l4   1,521,992     GPT d136 l4   1,469,616  (0.966x)

  At V = 4096 the tied embedding (V D) is a large share of every count, so N spans less than a
  decade; the fitted slopes are therefore noisy and not comparable in size to the paper's.
* "paper": larger models for a GPT-2 vocabulary (V = 50257) at context 512, micro-batch 32,
  grad accumulation 4 (Appendix A.3), 5000 steps. It needs a GPU (hours on a CPU). LAERC (D, L) =
  (128,4), (192,4), (256,6), (384,6); GPT widths matched the same way at V = 50257, T = 512, 8 heads:

      LAERC d128 l4   8,478,600    GPT d144 l4    8,311,344  (0.980x)
      LAERC d192 l4  14,192,456    GPT d224 l4   13,792,800  (0.972x)
      LAERC d256 l6  24,835,340    GPT d320 l6   23,644,480  (0.952x)
      LAERC d384 l6  46,100,364    GPT d512 l6   44,909,056  (0.974x)

  The paper does not list its sizes; these only span the same kind of range.
* "smoke": two tiny sizes per family, LAERC (D, L) = (16, 1), (24, 2) and GPT (16, 1), (24, 2) at
  context 128; the smoke reproduction's sweep (every stage and the scaling fit run; numbers
  meaningless).

`run_sweep` skips runs that are finished (summary.json with steps == max_steps) and continues
unfinished ones from their checkpoint (what `reslm train --resume` does), so an interrupted sweep
is resumed by running it again.
"""
from __future__ import annotations

import csv
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from reslm.data.bpe import TokenDataset
from reslm.errors import ReslmError, writing
from reslm.files import read_json, write_json
from reslm.run import SUMMARY, lock_run
from reslm.models import families
from reslm.models.gpt import GPTConfig, gpt_param_count
from reslm.models.laerc import LAERCConfig, laerc_param_count
from reslm.train import ensure_run, make_run_config, train

PAPER_SLOPES = {"a_TF": -1.72, "a_Res": -0.81}
CSV_FIELDS = ("family", "name", "dim", "n_layers", "trainable_params", "fixed_params", "min_train_loss",
              "final_val_loss", "steps", "train_seconds")


@dataclass
class Sweep:
    """Model sizes per family (LAERCConfig / GPTConfig overrides; vocab_size comes from the dataset)
    and the training budget (TrainConfig overrides) that every run shares."""
    name: str
    sizes: dict[str, list[dict]]
    train: dict
    note: str = ""


def _sizes(shapes, context: int, **common) -> list[dict]:
    return [dict(dim=d, n_layers=n, context=context, **common) for d, n in shapes]


_CPU_TRAIN = dict(batch_size=16, grad_accum=1, max_steps=300, warmup_steps=30,
                  eval_every=100, eval_batches=10, log_every=10, lr=1e-3)
_PAPER_TRAIN = dict(batch_size=32, grad_accum=4, max_steps=5000, warmup_steps=100,
                    eval_every=250, eval_batches=20, log_every=10, lr=6e-4)

SWEEPS: dict[str, Sweep] = {
    "cpu": Sweep(
        name="cpu",
        sizes={"laerc": _sizes([(32, 2), (48, 3), (64, 4), (96, 4)], 128, r_mult=4),
               "gpt": _sizes([(40, 2), (64, 3), (88, 4), (136, 4)], 128, n_heads=4)},
        train=_CPU_TRAIN,
        note="bpe:4096 Shakespeare, sized for 2 CPU cores"),
    "smoke": Sweep(
        name="smoke",
        sizes={"laerc": _sizes([(16, 1), (24, 2)], 128, r_mult=4),
               "gpt": _sizes([(16, 1), (24, 2)], 128, n_heads=4)},
        train=_CPU_TRAIN,
        note="two tiny sizes per family: checks that the sweep, the scaling fit and its figure run"),
    "paper": Sweep(
        name="paper",
        sizes={"laerc": _sizes([(128, 4), (192, 4), (256, 6), (384, 6)], 512, r_mult=4),
               "gpt": _sizes([(144, 4), (224, 4), (320, 6), (512, 6)], 512, n_heads=8)},
        train=_PAPER_TRAIN,
        note="GPT-2 vocabulary, Appendix A.3 batch (512 x 32 x 4); needs a GPU"),
}


def get_sweep(sweep: str | Sweep) -> Sweep:
    if isinstance(sweep, Sweep):
        return sweep
    if sweep not in SWEEPS:
        raise ReslmError(f"unknown sweep {sweep!r} (use {', '.join(SWEEPS)})")
    return SWEEPS[sweep]


def run_name(family: str, model: dict) -> str:
    return f"{family}-d{model['dim']}-l{model['n_layers']}"


def _plan(sweep: Sweep, fams, train_overrides: dict | None, dataset: TokenDataset) -> list[tuple]:
    """[(family, name, model, train)], every config validated before any directory is made."""
    fams = tuple(fams)
    for fam in fams:
        if fam not in families("tokens"):
            raise ReslmError(f"unknown family {fam!r} (use {' or '.join(families('tokens'))})")
        if fam not in sweep.sizes:
            raise ReslmError(f"sweep {sweep.name!r} has no sizes for family {fam!r}")
    train_over = {**sweep.train, **(train_overrides or {})}
    context = train_over.pop("context", None)  # a shorter window for every size (a model field)
    plan = []
    for fam in fams:
        for model in sweep.sizes[fam]:
            model = dict(model, **({"context": context} if context else {}))
            make_run_config(fam, model, train_over, dataset)
            plan.append((fam, run_name(fam, model), model, train_over))
    return plan


def _row(family: str, name: str, model: dict, run_dir: Path, summary: dict) -> dict:
    return dict(family=family, name=name, dim=model["dim"], n_layers=model["n_layers"],
                trainable_params=summary["trainable_params"], fixed_params=summary.get("fixed_params", 0),
                min_train_loss=summary.get("min_train_loss"), final_val_loss=summary.get("final_val_loss"),
                steps=summary.get("steps"), train_seconds=summary.get("train_seconds"))


def run_sweep(out: Path, dataset: TokenDataset, sweep: str | Sweep = "cpu", families=("laerc", "gpt"),
              train_overrides: dict | None = None, progress: bool = True) -> list[dict]:
    """Train every (family, size) of the sweep into out/<family>-d<D>-l<L>; returns one row per run
    (see CSV_FIELDS). Finished runs are skipped, unfinished ones continued from their checkpoint."""
    sw = get_sweep(sweep)
    out = Path(out)
    plan = _plan(sw, families, train_overrides, dataset)
    with lock_run(out, create=True):  # one sweep per folder at a time
        return _run_plan(out, plan, dataset, progress)


def _run_plan(out: Path, plan: list, dataset, progress: bool) -> list[dict]:
    rows = []
    for i, (fam, name, model, train_over) in enumerate(plan, 1):
        run_dir = out / name
        what = ensure_run(run_dir, fam, model, train_over, dataset)
        if progress:
            print(f"[{i}/{len(plan)}] {name}: {what}", file=sys.stderr, flush=True)
        summary = read_json(run_dir / SUMMARY) if what == "done" else train(run_dir, progress=progress)
        rows.append(_row(fam, name, model, run_dir, summary))
    return rows


def fit_log10(params, losses) -> tuple[float, float, float]:
    """Least squares L = a log10 N + b; returns (a, b, R^2)."""
    n = np.asarray(params, dtype=np.float64)
    y = np.asarray(losses, dtype=np.float64)
    if n.shape != y.shape or n.ndim != 1:
        raise ReslmError(f"params and losses must be two lists of the same length, got {n.shape} and {y.shape}")
    if len(n) < 2:
        raise ReslmError(f"a fit needs at least 2 points, got {len(n)}")
    if not (np.all(np.isfinite(n)) and np.all(n > 0) and np.all(np.isfinite(y))):
        raise ReslmError("params must be positive and losses finite")
    x = np.log10(n)
    if np.ptp(x) == 0:
        raise ReslmError("a fit needs at least two different parameter counts")
    A = np.stack([x, np.ones_like(x)], axis=1)
    (a, b), *_ = np.linalg.lstsq(A, y, rcond=None)
    resid = y - (a * x + b)
    ss_res, ss_tot = float(resid @ resid), float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res <= 1e-24 else float("nan"))
    return float(a), float(b), float(r2)


def fit_families(rows: list[dict], key: str = "min_train_loss") -> dict:
    fits = {}
    for fam in dict.fromkeys(r["family"] for r in rows):
        pts = [(r["trainable_params"], r[key]) for r in rows if r["family"] == fam and r[key] is not None]
        entry = dict(a=None, b=None, r2=None, n=len(pts))
        if len({p for p, _ in pts}) >= 2:
            a, b, r2 = fit_log10([p for p, _ in pts], [v for _, v in pts])
            entry.update(a=a, b=b, r2=r2)
        fits[fam] = entry
    return fits


def write_scaling(out: Path, rows: list[dict]) -> dict:
    """Write scaling.csv, scaling_fit.json and (with matplotlib) scaling.png under out.
    Returns {"csv", "json", "png" (None without matplotlib), "fits", "note"}."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / "scaling.csv"
    with writing(csv_path), open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in CSV_FIELDS})
    fits = fit_families(rows)
    json_path = out / "scaling_fit.json"
    write_json(json_path, dict(fit="min_train_loss = a * log10(trainable_params) + b", **fits,
                               paper=dict(PAPER_SLOPES)))
    png, note = None, ""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        note = "matplotlib is not installed: scaling.png not written (pip install matplotlib)"
    else:
        png = out / "scaling.png"
        _plot(plt, rows, fits, png)
    return dict(csv=csv_path, json=json_path, png=png, fits=fits, note=note)


def _plot(plt, rows: list[dict], fits: dict, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4.2))
    colors = {"gpt": "tab:blue", "laerc": "tab:orange"}
    labels = {"gpt": "GPT", "laerc": "LAERC"}
    for fam, fit in fits.items():
        pts = sorted((r["trainable_params"], r["min_train_loss"]) for r in rows
                     if r["family"] == fam and r["min_train_loss"] is not None)
        if not pts:
            continue
        c = colors.get(fam)
        xs, ys = np.array([p for p, _ in pts], float), np.array([v for _, v in pts], float)
        label = labels.get(fam, fam)
        if fit["a"] is not None:
            grid = np.geomspace(xs.min(), xs.max(), 50)
            ax.plot(grid, fit["a"] * np.log10(grid) + fit["b"], "-", color=c,
                    label=f"{label} fit: a = {fit['a']:.2f} (R$^2$ = {fit['r2']:.2f})")
        ax.plot(xs, ys, "o", color=c, label=f"{label} runs")
    ax.set_xscale("log")
    ax.set_xlabel("trainable parameters N")
    ax.set_ylabel("min training loss (nats/token)")
    ax.set_title(f"L_min = a log10 N + b  (paper: a_TF = {PAPER_SLOPES['a_TF']}, "
                 f"a_Res = {PAPER_SLOPES['a_Res']})", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    with writing(path):
        fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)


def param_table(sweep: str | Sweep, vocab_size: int, families=("laerc", "gpt")) -> list[dict]:
    """Trainable/fixed parameter counts of a sweep's models at a vocabulary size (closed forms)."""
    sw = get_sweep(sweep)
    table = []
    for fam in families:
        for model in sw.sizes.get(fam, []):
            m = {**model, "vocab_size": vocab_size}
            if fam == "laerc":
                trainable, fixed = laerc_param_count(LAERCConfig(**m))
            else:
                trainable, fixed = gpt_param_count(GPTConfig(**m)), 0
            table.append(dict(family=fam, name=run_name(fam, model), trainable_params=trainable,
                              fixed_params=fixed))
    return table
