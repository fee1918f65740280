"""Fig. 7, the scaling law: L = a log10 N + b fitted per family to the sweep's runs against their
trainable parameters N, beside the paper's slopes (reslm.paper). The paper fits each run's minimum
training loss (L_min); reslm also fits the best and the final validation loss (the held-out figures).
Each slope comes with R^2, its OLS standard error and a two-sided 95% t interval (n - 2 degrees of
freedom; `t_quantile` computes Student's t quantile with numpy and math alone).

    out/scaling.csv        one row per run: family, name, dim, n_layers, trainable/fixed params, min
                           training loss, best and final val loss, steps, train seconds
    out/scaling_fit.json   {family: {a, b, r2, n, a_se, a_lo, a_hi, level}} of min training loss, the
                           paper's slopes, and held_out: {best_val_loss|final_val_loss: {family: ...}}
    out/scaling.png        both families' points and fit lines, min training loss and best val loss side
                           by side, log x axis (needs matplotlib)
"""
from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np

from reslm.core.errors import ReslmError, writing
from reslm.core.files import write_json
from reslm.core.metrics import MIN_TRAIN_LOSS, VAL_LOSS, best_of, final_of
from reslm.paper import SLOPES
from reslm.report.figures import _pyplot

CSV_FIELDS = ("family", "name", "dim", "n_layers", "trainable_params", "fixed_params", MIN_TRAIN_LOSS,
              best_of(VAL_LOSS), final_of(VAL_LOSS), "steps", "train_seconds")


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


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, c, qab, qap, qam = 1e-300, 1.0, a + b, a + 1.0, a - 1.0
    d = 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), 0 <= x <= 1."""
    if x <= 0.0 or x >= 1.0:
        return max(0.0, min(1.0, x))
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_quantile(p: float, df: int) -> float:
    """The p-quantile (0.5 <= p < 1) of Student's t distribution with df degrees of freedom, by bisection
    on its CDF F(t) = 1 - I_{df/(df+t^2)}(df/2, 1/2) / 2 (e.g. t_quantile(0.975, 3) = 3.1824)."""
    if not 0.5 <= p < 1.0 or df < 1:
        raise ReslmError(f"t_quantile needs 0.5 <= p < 1 and df >= 1, got p={p}, df={df}")
    cdf = lambda t: 1.0 - 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))  # noqa: E731
    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def fit_log10_ci(params, losses, level: float = 0.95) -> dict:
    """fit_log10 with the slope's ordinary-least-squares standard error and its two-sided t interval
    (n - 2 degrees of freedom): {a, b, r2, n, a_se, a_lo, a_hi, level}; with two points (no degree of
    freedom left) a_se, a_lo and a_hi are None."""
    a, b, r2 = fit_log10(params, losses)
    x = np.log10(np.asarray(params, dtype=np.float64))
    y = np.asarray(losses, dtype=np.float64)
    n = len(x)
    out = dict(a=a, b=b, r2=r2, n=n, a_se=None, a_lo=None, a_hi=None, level=level)
    if n > 2:
        resid = y - (a * x + b)
        se = math.sqrt(float(resid @ resid) / (n - 2) / float(((x - x.mean()) ** 2).sum()))
        half = t_quantile(0.5 + level / 2.0, n - 2) * se
        out.update(a_se=se, a_lo=a - half, a_hi=a + half)
    return out


FIT_KEYS = (MIN_TRAIN_LOSS, best_of(VAL_LOSS), final_of(VAL_LOSS))   # the paper's, then reslm's held-out figures


def fit_families(rows: list[dict], key: str = MIN_TRAIN_LOSS) -> dict:
    """{family: fit_log10_ci of `key` against trainable_params (a, b, r2 ... None with fewer than two sizes)}."""
    fits = {}
    for fam in dict.fromkeys(r["family"] for r in rows):
        pts = [(r["trainable_params"], r[key]) for r in rows if r["family"] == fam and r.get(key) is not None]
        entry = dict(a=None, b=None, r2=None, n=len(pts), a_se=None, a_lo=None, a_hi=None, level=0.95)
        if len({p for p, _ in pts}) >= 2:
            entry.update(fit_log10_ci([p for p, _ in pts], [v for _, v in pts]))
        fits[fam] = entry
    return fits


def fit_all(rows: list[dict]) -> dict:
    """{key: fit_families(rows, key)} for each of FIT_KEYS."""
    return {key: fit_families(rows, key) for key in FIT_KEYS}


def write_scaling(out: Path, rows: list[dict]) -> dict:
    """Write scaling.csv, scaling_fit.json and (with matplotlib) scaling.png under out.
    Returns {"csv", "json", "png" (None without matplotlib), "fits" (of min_train_loss), "held_out" (the fits of
    best_val_loss and final_val_loss), "note"}."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / "scaling.csv"
    with writing(csv_path), open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in CSV_FIELDS})
    every = fit_all(rows)
    fits, held_out = every[MIN_TRAIN_LOSS], {k: every[k] for k in FIT_KEYS[1:]}
    json_path = out / "scaling_fit.json"
    write_json(json_path, dict(fit="min_train_loss = a * log10(trainable_params) + b", **fits, paper=dict(SLOPES),
                               held_out=held_out))
    png, note = None, ""
    plt = _pyplot()
    if plt is None:
        note = "matplotlib is not installed: scaling.png not written (pip install matplotlib)"
    else:
        png = out / "scaling.png"
        plot_scaling(plt, rows, every, png)
    return dict(csv=csv_path, json=json_path, png=png, fits=fits, held_out=held_out, note=note)


LABELS = {MIN_TRAIN_LOSS: "min training loss (the paper's fit)", best_of(VAL_LOSS): "best validation loss",
          final_of(VAL_LOSS): "final validation loss"}


def _slope(fit: dict) -> str:
    if fit["a"] is None:
        return ""
    ci = f" [{fit['a_lo']:.2f}, {fit['a_hi']:.2f}]" if fit.get("a_lo") is not None else ""
    return f"a = {fit['a']:.2f}{ci}, R$^2$ = {fit['r2']:.2f}"


def plot_scaling(plt, rows: list[dict], fits: dict, path: Path, keys=(MIN_TRAIN_LOSS, best_of(VAL_LOSS))) -> None:
    """One panel per key of `keys`: each family's points (loss against trainable parameters, log x) and
    its fit line from `fits` ({key: {family: fit}}), the slope with its interval in the legend."""
    fig, axes = plt.subplots(1, len(keys), figsize=(5.2 * len(keys), 4.2), squeeze=False)
    colors = {"gpt": "tab:blue", "laerc": "tab:orange"}
    labels = {"gpt": "GPT", "laerc": "LAERC"}
    for ax, key in zip(axes[0], keys):
        for fam, fit in fits.get(key, {}).items():
            pts = sorted((r["trainable_params"], r[key]) for r in rows if r["family"] == fam and r.get(key) is not None)
            if not pts:
                continue
            c = colors.get(fam)
            xs, ys = np.array([p for p, _ in pts], float), np.array([v for _, v in pts], float)
            label = labels.get(fam, fam)
            if fit["a"] is not None:
                grid = np.geomspace(xs.min(), xs.max(), 50)
                ax.plot(grid, fit["a"] * np.log10(grid) + fit["b"], "-", color=c, label=f"{label}: {_slope(fit)}")
            ax.plot(xs, ys, "o", color=c, label=None if fit["a"] is not None else f"{label} runs")
        ax.set_xscale("log")
        ax.set_xlabel("trainable parameters N")
        ax.set_ylabel("loss (nats/token)")
        ax.set_title(f"{LABELS.get(key, key)}: L = a log10 N + b", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"paper (min training loss): a_TF = {SLOPES['a_TF']}, a_Res = {SLOPES['a_Res']}; "
                 f"brackets: 95% t interval of a", fontsize=9)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    with writing(path):
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
