"""The paper's figures, each drawn from plain rows and written as a PNG plus the CSV it was drawn from.

    plot_char_losses   Fig. 2  training (top) / testing (bottom) loss per shard-epoch, one column per family
    plot_overlap       Fig. 3  7-gram / 8-gram overlap over the number of trainable parameters
    plot_times         Fig. 4  training (solid) / inference (dashed) time over trainable parameters,
                               with the slope alpha of y = alpha log10(x) written next to each line
    plot_token_curves  Fig. 6  smoothed training loss over the optimisation step (LAERC vs GPT)

(Fig. 7, the scaling fit: reslm.report.scaling; the lab's and the frontier's plots: reslm.report.plots.)

Every function writes <out_dir>/<stem>.csv and <out_dir>/<stem>.png and returns
{"png": Path | None, "csv": Path, "note": str, ...}. Without matplotlib the CSV is still written,
"png" is None and "note" says why. Losses are in nats (natural log), times in seconds.

Families are the keys "tf", "rc", "aerc" (character-level runs) and "laerc", "gpt" (token runs).
Each family has a fixed colour (FAMILY_COLORS) for plots that compare families; plots that compare
the sizes of one family colour them from the smallest (turquoise) to the largest (grey), as the paper.
"""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from reslm.core.errors import ReslmError, writing
from reslm.core.metrics import TEST_LOSS, TRAIN_LOSS, VAL_LOSS

FAMILY_ORDER = ("tf", "rc", "aerc", "laerc", "gpt")
FAMILY_LABELS = {"tf": "Transformer", "rc": "Reservoir", "aerc": "AERC", "laerc": "LAERC",
                 "gpt": "Transformer (GPT)", "rnn": "Trained RNN"}
FAMILY_COLORS = {"tf": "tab:blue", "rc": "tab:green", "aerc": "tab:orange", "laerc": "tab:red",
                 "gpt": "tab:purple"}
SIZE_COLORS = ("#1fbfb0", "#555555")  # smallest (turquoise) -> largest (grey)
DPI = 120


# --------------------------------------------------------------------------- shared helpers

def _pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend, or None when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


NO_MATPLOTLIB = "matplotlib is not installed: figures written as CSV only, no PNG (pip install matplotlib)"


def missing_matplotlib(results) -> str:
    """NO_MATPLOTLIB when any of `results` (plot results, or a dict of them) has no PNG because matplotlib
    is missing, else "": the one line a report or a command prints for all of its figures."""
    items = results.values() if isinstance(results, dict) else results
    return NO_MATPLOTLIB if any(not r.get("png") and "matplotlib" in (r.get("note") or "") for r in items) else ""


def _write_csv(path: Path, fieldnames, rows) -> Path:
    """Write rows (dicts) as CSV with the given columns; None becomes an empty cell."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with writing(path), open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(fieldnames), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in fieldnames})
    return path


def _finish(plt, fig, out_dir: Path, stem: str, csv_path: Path, **extra) -> dict:
    """Save and close fig (when there is one) and build the result dict every plot function returns."""
    png, note = None, ""
    if fig is None:
        note = f"matplotlib is not installed: {stem}.png not written (pip install matplotlib)"
    else:
        png = Path(out_dir) / f"{stem}.png"
        fig.tight_layout()
        with writing(png):
            fig.savefig(png, dpi=DPI)
        plt.close(fig)
    return dict(png=png, csv=csv_path, note=note, **extra)


def _label(family: str) -> str:
    return FAMILY_LABELS.get(family, family)


def _families(items) -> list[str]:
    """Families present in items, in FAMILY_ORDER, then unknown ones in order of appearance."""
    seen = list(dict.fromkeys(it["family"] for it in items))
    return [f for f in FAMILY_ORDER if f in seen] + [f for f in seen if f not in FAMILY_ORDER]


def _size_colors(n: int) -> list:
    """n colours from SIZE_COLORS[0] (smallest model) to SIZE_COLORS[1] (largest)."""
    from matplotlib.colors import LinearSegmentedColormap
    cmap = LinearSegmentedColormap.from_list("sizes", SIZE_COLORS)
    return [cmap(t) for t in (np.linspace(0, 1, n) if n > 1 else [0.0])]


def _fmt_params(n) -> str:
    """A short parameter count: 950, 12.3k, 4.56M, 1.2B."""
    n = float(n)
    for div, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.3g}{suffix}"
    return f"{n:.0f}"


def _log_params_axis(ax) -> None:
    """Log-scale x axis of trainable parameters, labelled 20k, 50k, 100k (no crowded minor labels)."""
    from matplotlib.ticker import FuncFormatter, LogLocator
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _fmt_params(v)))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    ax.set_xlabel("trainable parameters")


def _by_size(items) -> list:
    return sorted(items, key=lambda it: (it["trainable_params"], it["name"]))


def _need(items, what: str) -> list:
    items = list(items)
    if not items:
        raise ReslmError(f"no {what} to plot")
    return items


def fit_alpha_log10(x, y) -> float:
    """Least-squares slope alpha of y = alpha * log10(x), a line through the origin (paper Fig. 4,
    x = trainable parameters, y = time): alpha = sum(y log10 x) / sum((log10 x)^2)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ReslmError(f"x and y must be two lists of the same length, got {x.shape} and {y.shape}")
    if len(x) < 1:
        raise ReslmError("a fit needs at least 1 point")
    if not (np.all(np.isfinite(x)) and np.all(x > 0) and np.all(np.isfinite(y))):
        raise ReslmError("x must be positive and y finite")
    lx = np.log10(x)
    denom = float(lx @ lx)
    if denom == 0:
        raise ReslmError("a fit through the origin needs some x != 1")
    return float(lx @ y) / denom


# --------------------------------------------------------------------------- Fig. 2

CHAR_LOSS_FIELDS = ("family", "name", "context", "trainable_params", "index", "cycle", "shard", "epoch", "step",
                    TRAIN_LOSS, TEST_LOSS)


def _boundaries(epochs: list[dict]) -> tuple[list[float], list[float]]:
    """x positions (accumulated shard-epochs completed) where the shard changes and where a full pass
    (cycle) ends, from one run's epoch rows."""
    shard_x, cycle_x = [], []
    for prev, row in zip(epochs, epochs[1:]):
        x = row["index"]  # index + 1 of the previous row: the boundary lies right after it
        if row["cycle"] != prev["cycle"]:
            cycle_x.append(x)
        elif row["shard"] != prev["shard"]:
            shard_x.append(x)
    return shard_x, cycle_x


def plot_char_losses(runs, out_dir, stem: str = "fig2_losses") -> dict:
    """Paper Fig. 2: training (top row) and testing (bottom row) loss of character-level runs, one
    column per family (tf, rc, aerc), one line per run (model size) over the accumulated shard-epoch
    (index + 1). Thin light-grey dashed lines mark shard changes, thick dark-grey ones full passes.

    runs: [{"family", "name", "trainable_params", "epochs": [metrics.jsonl "epoch" rows],
    "context" and "shards_per_cycle" (optional)}]; a run's context, where given, is in its label."""
    runs = _need(runs, "runs")
    out_dir = Path(out_dir)
    rows = []
    for run in runs:
        for e in sorted(run["epochs"], key=lambda e: e["index"]):
            rows.append({**{k: e.get(k) for k in CHAR_LOSS_FIELDS[4:]}, "family": run["family"],
                         "name": run["name"], "context": run.get("context"),
                         "trainable_params": run["trainable_params"]})
    csv_path = _write_csv(out_dir / f"{stem}.csv", CHAR_LOSS_FIELDS, rows)

    plt = _pyplot()
    fig = None
    if plt is not None:
        fams = _families(runs)
        # one x axis for all columns: a run that stopped early reads as partial beside the others
        fig, axes = plt.subplots(2, len(fams), figsize=(4.2 * len(fams), 6.4), sharex=True,
                                 sharey="row", squeeze=False)
        for j, fam in enumerate(fams):
            members = _by_size(r for r in runs if r["family"] == fam)
            colors = _size_colors(len(members))
            longest = max(members, key=lambda r: len(r["epochs"]))
            shard_x, cycle_x = _boundaries(sorted(longest["epochs"], key=lambda e: e["index"]))
            for i, (key, what) in enumerate(((TRAIN_LOSS, "training"), (TEST_LOSS, "testing"))):
                ax = axes[i, j]
                for x in shard_x:
                    ax.axvline(x, color="0.8", lw=0.8, ls="--", zorder=0)
                for x in cycle_x:
                    ax.axvline(x, color="0.3", lw=2.0, ls="--", zorder=0)
                for run, c in zip(members, colors):
                    eps = [e for e in sorted(run["epochs"], key=lambda e: e["index"]) if e.get(key) is not None]
                    ax.plot([e["index"] + 1 for e in eps], [e[key] for e in eps], "-", color=c, lw=1.5,
                            label=f"{run['name']}{', ' + run['context'] if run.get('context') else ''} "
                                  f"({_fmt_params(run['trainable_params'])})")
                ax.grid(True, alpha=0.3)
                if i == 0:
                    spc = longest.get("shards_per_cycle")
                    ax.set_title(_label(fam) + (f"  ({spc} shards / pass)" if spc else ""))
                    ax.legend(fontsize=7, title="model (trainable params)", title_fontsize=7)
                else:
                    ax.set_xlabel("accumulated shard-epoch")
                if j == 0:
                    ax.set_ylabel(f"{what} loss (nats)")
    return _finish(plt, fig, out_dir, stem, csv_path)


# --------------------------------------------------------------------------- Fig. 3

def _overlap_value(d, n):
    """d[n] where the key may be the int n or the string "n" (after a JSON round trip)."""
    if not d:
        return None
    v = d.get(n, d.get(str(n)))
    return None if v is None else float(v)


def plot_overlap(rows, out_dir, ns=(7, 8), stem: str = "fig3_overlap", baselines=None) -> dict:
    """Paper Fig. 3: n-gram overlap of generated text with the training text over the number of
    trainable parameters (log x), one panel per n, one line per family.

    rows: [{"family", "name", "trainable_params", "overlap": {n: float}}] (keys int or str).
    baselines: {label: {n: float}} drawn as dotted horizontal reference lines (e.g. an n-gram model,
    the test text itself)."""
    rows = _need(rows, "rows")
    ns = [int(n) for n in ns]
    if not ns:
        raise ReslmError("ns must name at least one n")
    out_dir = Path(out_dir)
    fields = ("family", "name", "trainable_params") + tuple(f"overlap_{n}" for n in ns)
    table = [{"family": r["family"], "name": r["name"], "trainable_params": r["trainable_params"],
              **{f"overlap_{n}": _overlap_value(r.get("overlap"), n) for n in ns}} for r in rows]
    csv_path = _write_csv(out_dir / f"{stem}.csv", fields, table)

    plt = _pyplot()
    fig = None
    if plt is not None:
        fig, axes = plt.subplots(1, len(ns), figsize=(4.8 * len(ns), 4.0), squeeze=False)
        for ax, n in zip(axes[0], ns):
            for fam in _families(table):
                pts = [(r["trainable_params"], r[f"overlap_{n}"]) for r in _by_size(t for t in table
                                                                                     if t["family"] == fam)
                       if r[f"overlap_{n}"] is not None]
                if pts:
                    ax.plot(*zip(*pts), "o-", color=FAMILY_COLORS.get(fam, "k"), label=_label(fam))
            for k, (label, vals) in enumerate((baselines or {}).items()):
                v = _overlap_value(vals, n)
                if v is not None:
                    ax.axhline(v, ls=":", lw=1.5, color=f"{0.2 + 0.25 * (k % 3):.2f}", label=label)
            _log_params_axis(ax)
            ax.set_ylabel(f"{n}-gram overlap (fraction)")
            ax.set_title(f"{n}-gram overlap")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
    return _finish(plt, fig, out_dir, stem, csv_path)


# --------------------------------------------------------------------------- Fig. 4

TIME_FIELDS = ("family", "name", "trainable_params", "train_seconds", "infer_seconds",
               "reservoir_train_seconds", "reservoir_infer_seconds", "train_total_seconds",
               "infer_total_seconds")
# (series, column, line style) per panel
_TIME_SERIES = ((("train", "train_seconds", "-"), ("infer", "infer_seconds", "--")),
                (("train_total", "train_total_seconds", "-"), ("infer_total", "infer_total_seconds", "--")))


def plot_times(rows, out_dir, stem: str = "fig4_time") -> dict:
    """Paper Fig. 4: training (solid) and inference (dashed) time over trainable parameters (log x),
    per family. Left panel: the trainable part only (reservoir excluded, as the paper plots);
    right panel: with the digital reservoir's time added. Each line is labelled with alpha from
    fit_alpha_log10 (y = alpha log10 x).

    rows: [{"family", "name", "trainable_params", "train_seconds", "infer_seconds",
    "reservoir_train_seconds", "reservoir_infer_seconds"}] (reservoir times may be missing: 0).
    Returns also "fits": {family: {"train", "infer", "train_total", "infer_total": alpha or None}}."""
    rows = _need(rows, "rows")
    out_dir = Path(out_dir)
    table = _time_table(rows)
    csv_path = _write_csv(out_dir / f"{stem}.csv", TIME_FIELDS, table)
    fams = _families(table)
    series, fits = _time_fits(table, fams)

    plt = _pyplot()
    fig = None
    if plt is not None:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), sharey=True)
        titles = ("reservoir excluded (paper)", "reservoir included (digital)")
        all_pos = all(s > 0 for fam in fams for pts in series[fam].values() for _, s in pts)
        for ax, panel, title in zip(axes, _TIME_SERIES, titles):
            _time_panel(ax, panel, title, fams, series, fits, all_pos)
        axes[0].set_ylabel("time (seconds)")
        axes[0].legend(fontsize=7, ncol=2, loc="upper left")   # "best" scans every point (slow)
        fig.suptitle(r"training (solid) / inference (dashed); numbers: $\alpha$ of $y = \alpha\,\log_{10} x$",
                     fontsize=9)
    return _finish(plt, fig, out_dir, stem, csv_path, fits=fits)


def _time_table(rows) -> list[dict]:
    """Fig. 4's CSV rows: each run's times (a missing reservoir time 0), and its totals with the reservoir's."""
    table = []
    for r in rows:
        t = {k: r.get(k) for k in TIME_FIELDS[:7]}
        for k in ("reservoir_train_seconds", "reservoir_infer_seconds"):
            t[k] = t[k] or 0.0
        for part in ("train", "infer"):
            base = t[f"{part}_seconds"]
            t[f"{part}_total_seconds"] = None if base is None else base + t[f"reservoir_{part}_seconds"]
        table.append(t)
    return table


def _time_fits(table: list[dict], fams: list[str]) -> tuple[dict, dict]:
    """Each family's series of Fig. 4, {fam: {series: [(params, seconds)] by size}}, and the alpha of each
    (fit_alpha_log10), {fam: {series: alpha or None}}."""
    series = {fam: {} for fam in fams}  # fam -> series -> [(params, seconds)] sorted by size
    fits = {}
    for fam in fams:
        members = _by_size(t for t in table if t["family"] == fam)
        fits[fam] = {}
        for name, col, _ in _TIME_SERIES[0] + _TIME_SERIES[1]:
            pts = [(t["trainable_params"], t[col]) for t in members if t[col] is not None]
            series[fam][name] = pts
            try:
                fits[fam][name] = fit_alpha_log10([p for p, _ in pts], [s for _, s in pts])
            except ReslmError:
                fits[fam][name] = None
    return series, fits


def _time_panel(ax, panel, title: str, fams: list[str], series: dict, fits: dict, log_y: bool) -> None:
    """One panel of Fig. 4: each family's training and inference line, labelled with its alpha (log y when
    `log_y`, every time being positive)."""
    for f_i, fam in enumerate(fams):
        c = FAMILY_COLORS.get(fam, "k")
        for name, _, ls in panel:
            pts = series[fam][name]
            if not pts:
                continue
            xs, ys = zip(*pts)
            kind = "training" if name.startswith("train") else "inference"
            ax.plot(xs, ys, ls, marker="o", ms=4, color=c, label=f"{_label(fam)} {kind}")
            alpha = fits[fam][name]
            if alpha is not None:  # stagger the labels of the families along the line
                k = (len(xs) - 1) * (f_i + 1) // (len(fams) + 1) if len(xs) > 2 else len(xs) - 1
                ax.annotate(f"{alpha:.3g}", (xs[k], ys[k]), textcoords="offset points",
                            xytext=(0, 6), ha="center", fontsize=8, color=c)
    _log_params_axis(ax)
    if log_y:
        from matplotlib.ticker import FuncFormatter
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)


# --------------------------------------------------------------------------- Fig. 6

TOKEN_LOSS_FIELDS = ("family", "name", "trainable_params", "step", TRAIN_LOSS, "train_loss_smoothed",
                     VAL_LOSS)


def ema(values, smooth: float) -> list[float]:
    """Debiased exponential moving average (as TensorBoard's smoothing): s_t = smooth s_{t-1} +
    (1 - smooth) v_t, divided by 1 - smooth^t so the first values are not pulled towards 0.
    smooth = 0 returns the values unchanged."""
    if not 0.0 <= smooth < 1.0:
        raise ReslmError(f"smooth must be in [0, 1), got {smooth}")
    out, s = [], 0.0
    for t, v in enumerate(values, 1):
        s = smooth * s + (1.0 - smooth) * float(v)
        out.append(s / (1.0 - smooth ** t))
    return out


def plot_token_curves(runs, out_dir, stem: str = "fig6_token_loss", smooth: float = 0.9) -> dict:
    """Paper Fig. 6: training loss over the optimisation step for token runs, one panel per family
    (LAERC, GPT; shared y axis), one line per model size. The line is the debiased EMA (`ema`, weight
    `smooth` per logged "step" row) of the logged training loss, the raw loss is drawn faintly
    behind it, and validation losses ("eval" rows) are markers in the same colour.

    runs: [{"family", "name", "trainable_params", "steps": [step rows], "evals": [eval rows]}].
    CSV: one row per logged step of each run (the union of step and eval rows' steps); cells a row
    lacks (train loss at an eval-only step, val loss between evals) are empty."""
    runs = _need(runs, "runs")
    out_dir = Path(out_dir)
    curves = []  # (run, steps, losses, smoothed)
    table = []
    for run in runs:
        steps = sorted((r for r in run.get("steps", []) if r.get(TRAIN_LOSS) is not None),
                       key=lambda r: r["step"])
        xs, ys = [r["step"] for r in steps], [r[TRAIN_LOSS] for r in steps]
        sm = ema(ys, smooth)
        curves.append((run, xs, ys, sm))
        by_step = {x: dict(**{TRAIN_LOSS: y}, train_loss_smoothed=s) for x, y, s in zip(xs, ys, sm)}
        for e in run.get("evals", []):
            if e.get(VAL_LOSS) is not None:
                by_step.setdefault(e["step"], {})[VAL_LOSS] = e[VAL_LOSS]
        for step in sorted(by_step):
            table.append(dict(family=run["family"], name=run["name"], trainable_params=run["trainable_params"],
                              step=step, **by_step[step]))
    csv_path = _write_csv(out_dir / f"{stem}.csv", TOKEN_LOSS_FIELDS, table)

    plt = _pyplot()
    fig = None
    if plt is not None:
        fams = _families(runs)
        fig, axes = plt.subplots(1, len(fams), figsize=(5.2 * len(fams), 4.2), sharey=True, squeeze=False)
        for ax, fam in zip(axes[0], fams):
            members = _by_size(c[0] for c in curves if c[0]["family"] == fam)
            for run, c in zip(members, _size_colors(len(members))):
                _, xs, ys, sm = next(cv for cv in curves if cv[0] is run)
                label = f"{run['name']} ({_fmt_params(run['trainable_params'])})"
                if xs:
                    ax.plot(xs, ys, "-", color=c, lw=0.6, alpha=0.25)
                    ax.plot(xs, sm, "-", color=c, lw=1.6, label=label)
                ev = sorted((e for e in run.get("evals", []) if e.get(VAL_LOSS) is not None),
                            key=lambda e: e["step"])
                if ev:
                    ax.plot([e["step"] for e in ev], [e[VAL_LOSS] for e in ev], "o", color=c, ms=4,
                            mec="k", mew=0.5, label=None if xs else label)
            ax.set_title(_label(fam))
            ax.set_xlabel("optimisation step")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7, loc="upper right", title="lines: smoothed train, dots: val", title_fontsize=7)
        axes[0, 0].set_ylabel("loss (nats/token)")
        fig.suptitle(f"training loss (EMA, smooth = {smooth:g}) and validation loss", fontsize=9)
    return _finish(plt, fig, out_dir, stem, csv_path)
