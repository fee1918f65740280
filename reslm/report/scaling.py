"""Fig. 7, the scaling law: L_min = a log10 N + b fitted per family to the sweep's runs (each run's
minimum training loss against its trainable parameters N), beside the paper's slopes (reslm.paper).

    out/scaling.csv        one row per run: family, name, dim, n_layers, trainable/fixed params, min
                           training loss, final val loss, steps, train seconds
    out/scaling_fit.json   {family: {a, b, r2, n}} plus the paper's slopes, for reference
    out/scaling.png        both families' points and fit lines, log x axis (needs matplotlib)
"""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from reslm.core.errors import ReslmError, writing
from reslm.core.files import write_json
from reslm.paper import SLOPES
from reslm.report.figures import _pyplot

CSV_FIELDS = ("family", "name", "dim", "n_layers", "trainable_params", "fixed_params", "min_train_loss",
              "final_val_loss", "steps", "train_seconds")


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
    write_json(json_path, dict(fit="min_train_loss = a * log10(trainable_params) + b", **fits, paper=dict(SLOPES)))
    png, note = None, ""
    plt = _pyplot()
    if plt is None:
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
    ax.set_title(f"L_min = a log10 N + b  (paper: a_TF = {SLOPES['a_TF']}, a_Res = {SLOPES['a_Res']})", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    with writing(path):
        fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)
