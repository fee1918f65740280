"""The lab's and the frontier's plots, each written as a PNG plus the CSV it was drawn from (the
helpers and conventions of reslm.report.figures: without matplotlib the CSV is still written).

    plot_substrates   test CE per substrate and family at the paper's largest reservoir budgets
    plot_physical     test CE under readout noise and b-bit ADCs
    plot_frontier     test CE against trainable parameters, every published and legacy run
    plot_gap          the reservoir's routes beside the tuned trained ceiling (frontier plans)
"""
from __future__ import annotations

from pathlib import Path

from reslm.core.errors import ReslmError
from reslm.core.metrics import TEST_BPC, TEST_LOSS, VAL_LOSS
from reslm.report.figures import FAMILY_COLORS, _families, _finish, _label, _log_params_axis, _need, _pyplot, _write_csv


SUBSTRATE_FIELDS = ("family", "substrate", "size", "trainable_params", "fixed_params", TEST_LOSS, TEST_BPC,
                    "train_seconds", "reservoir_seconds")


def plot_substrates(rows, out_dir, stem: str = "substrates", paper: dict | None = None) -> dict:
    """The lab's substrate comparison: test CE (nats) per substrate, one bar group per substrate and
    one bar per family (rc, aerc), with the paper's full-protocol figure of each family as a dashed
    line. rows: [{"family", "substrate", "test_loss", "trainable_params", ...}]."""
    rows = _need(rows, "substrate runs")
    out_dir = Path(out_dir)
    csv_path = _write_csv(out_dir / f"{stem}.csv", SUBSTRATE_FIELDS, rows)
    plt = _pyplot()
    fig = None
    if plt is not None:
        subs = list(dict.fromkeys(r["substrate"] for r in rows))
        fams = _families(rows)
        width = 0.8 / len(fams)
        fig, ax = plt.subplots(figsize=(1.1 * len(subs) + 3, 4))
        for j, fam in enumerate(fams):
            xs, ys = [], []
            for i, sub in enumerate(subs):
                r = next((r for r in rows if r["family"] == fam and r["substrate"] == sub), None)
                if r:
                    xs.append(i + (j - (len(fams) - 1) / 2) * width)
                    ys.append(r[TEST_LOSS])
            ax.bar(xs, ys, width, color=FAMILY_COLORS.get(fam), label=_label(fam))
            for x, y in zip(xs, ys):
                ax.text(x, y, f"{y:.2f}", ha="center", va="bottom", fontsize=7)
            if paper and fam in paper:
                ax.axhline(paper[fam], ls="--", lw=1, color=FAMILY_COLORS.get(fam),
                           label=f"paper, {_label(fam)} (full protocol)")
        shown = [r[TEST_LOSS] for r in rows] + [v for f, v in (paper or {}).items() if f in fams]
        ax.set_ylim(max(0.0, min(shown) - 0.3), max(shown) + 0.15)   # the paper's lines in view too
        ax.set_xticks(range(len(subs)), subs)
        ax.set_ylabel("test CE (nats/char)")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7)
        ax.set_title("substrates at the rc-2600 / aerc-160-30 trainable budgets", fontsize=9)
    return _finish(plt, fig, out_dir, stem, csv_path)


def plot_physical(physical: dict, out_dir, stem: str = "physical") -> dict:
    """The lab's physical constraints: test CE against readout noise sigma (left, log x; sigma 0 drawn
    at the left edge) and against ADC bits (right; "off" = no ADC), one line per family.
    physical: {family: {"noise": [{"sigma", "test_loss"}], "adc": [{"bits", "test_loss"}]}}."""
    if not physical:
        raise ReslmError("no physical-constraint results to plot")
    out_dir = Path(out_dir)
    table = [dict(family=fam, constraint="noise", value=r["sigma"], **{TEST_LOSS: r[TEST_LOSS]})
             for fam, p in physical.items() for r in p["noise"]]
    table += [dict(family=fam, constraint="adc_bits", value=r["bits"], **{TEST_LOSS: r[TEST_LOSS]})
              for fam, p in physical.items() for r in p["adc"]]
    csv_path = _write_csv(out_dir / f"{stem}.csv", ("family", "constraint", "value", TEST_LOSS), table)
    plt = _pyplot()
    fig = None
    if plt is not None:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.8), sharey=True)
        for fam, p in physical.items():
            color = FAMILY_COLORS.get(fam)
            pos = [r for r in p["noise"] if r["sigma"] > 0]
            zero = [r for r in p["noise"] if r["sigma"] == 0]
            a1.plot([r["sigma"] for r in pos], [r[TEST_LOSS] for r in pos], "o-", color=color, label=_label(fam))
            for r in zero:
                a1.axhline(r[TEST_LOSS], ls=":", lw=1, color=color)
            bits_on = sorted((r for r in p["adc"] if r["bits"]), key=lambda r: r["bits"])
            a2.plot([r["bits"] for r in bits_on], [r[TEST_LOSS] for r in bits_on], "o-", color=color,
                    label=_label(fam))
            for r in p["adc"]:
                if not r["bits"]:
                    a2.axhline(r[TEST_LOSS], ls=":", lw=1, color=color)
        a1.set_xscale("log")
        a1.set_xlabel("readout noise sigma (state units; dotted: no noise)")
        a2.set_xlabel("ADC bits (dotted: no ADC)")
        a1.set_ylabel("test CE (nats/char)")
        for ax in (a1, a2):
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
        fig.suptitle("trained without constraints, scored under them", fontsize=9)
    return _finish(plt, fig, out_dir, stem, csv_path)


# --------------------------------------------------------------------------- the frontier

FRONTIER_FIELDS = ("family", "name", "trainable_params", TEST_LOSS, "strict", "published", "source")


def plot_frontier(points, out_dir, stem: str = "frontier", references=None, budget: int | None = None) -> dict:
    """Test CE against trainable parameters (log x) for every run, one colour per family: filled
    markers for published runs (weights in results/), hollow ones for runs measured before the
    registry; a diamond for a run that obeys the strict reservoir rules beyond the paper's protocol.

    points: [{"family", "name", "trainable_params", "test_loss", "strict", "published", "source"}].
    references: {label: (trainable_params or None, test_loss)}: a point each (the paper's figures),
    or a dotted horizontal line where trainable_params is None (e.g. an n-gram baseline).
    budget: a vertical line at this trainable count."""
    points = _need(points, "points")
    out_dir = Path(out_dir)
    csv_path = _write_csv(out_dir / f"{stem}.csv", FRONTIER_FIELDS, points)
    plt = _pyplot()
    fig = None
    if plt is not None:
        fig, ax = plt.subplots(figsize=(7.5, 5.0))
        for fam in _families(points):
            color = FAMILY_COLORS.get(fam, "0.3")
            for published, lab in ((True, "published"), (False, "weights not published")):
                pts = [p for p in points if p["family"] == fam and bool(p["published"]) == published]
                if not pts:
                    continue
                ax.scatter([p["trainable_params"] for p in pts], [p[TEST_LOSS] for p in pts],
                           marker="o", s=36, facecolors=color if published else "none", edgecolors=color,
                           label=f"{_label(fam)} ({lab})", zorder=3)
            lab_pts = [p for p in points if p["family"] == fam and p.get("source") == "lab"]
            if lab_pts:
                ax.scatter([p["trainable_params"] for p in lab_pts], [p[TEST_LOSS] for p in lab_pts],
                           marker="D", s=60, facecolors="none", edgecolors="k", zorder=4,
                           label=f"{_label(fam)}: lab routes (beyond the paper's protocol)")
        for label, (n, ce) in sorted((references or {}).items()):
            if n is None:
                ax.axhline(ce, color="0.35", ls=":", lw=1.2, label=label, zorder=1)
            else:
                ax.scatter([n], [ce], marker="*", s=140, color="0.15", zorder=5)
                ax.annotate(label, (n, ce), textcoords="offset points", xytext=(6, -3), fontsize=7)
        if budget:
            ax.axvline(budget, color="0.6", lw=1.0, ls="--", zorder=0)
        _log_params_axis(ax)
        ax.set_xlabel("trainable parameters")
        ax.set_ylabel("test CE on the whole test shard (nats/char)")
        ax.grid(True, alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        keep = dict(zip(labels, handles))
        ax.legend(keep.values(), keep.keys(), fontsize=7, loc="upper right")
    return _finish(plt, fig, out_dir, stem, csv_path)


# --------------------------------------------------------------------------- the gap to the ceiling

GAP_FIELDS = ("side", "plan", "configuration", "seeds", "test_window", "test_window_sd", "test_stream",
              "test_stream_sd", "val_screen")
GAP_CURVE_FIELDS = ("side", "plan", "configuration", "seed", "step", "samples", VAL_LOSS, f"base_{VAL_LOSS}",
                    "difference", "finished")
SIDE_COLORS = {"reservoir": "tab:green", "trained ceiling": "0.25"}


def plot_gap(rows, curves, out_dir, stem: str = "frontier-gap", references=None) -> dict:
    """A fixed reservoir's routes beside the tuned trained ceiling, from the frontier plans' runs.

    Left: test CE per configuration with a finished run, filled on the paper's metric (each test
    character from its 32 preceding characters), hollow with the state carried through the test text;
    mean ± sd over the seeds done. references: {label: test CE}, dotted vertical lines.
    Then one panel per side: each screen run's validation CE minus its plan base's at the same number
    of training samples (the base's curve interpolated), against the samples seen; finished runs solid,
    unfinished ones dashed, so a route shows how far it got before it finished.

    rows: [{side, plan, configuration, seeds, test_window, test_window_sd, test_stream, test_stream_sd,
    val_screen}]; curves: [{side, plan, configuration, seed, step, samples, VAL_LOSS, base_VAL_LOSS,
    difference, finished}]. Writes {stem}.csv (rows) and {stem}-curves.csv (curves)."""
    rows = _need(rows, "configurations with a finished run")
    out_dir = Path(out_dir)
    csv_path = _write_csv(out_dir / f"{stem}.csv", GAP_FIELDS, rows)
    curves_csv = _write_csv(out_dir / f"{stem}-curves.csv", GAP_CURVE_FIELDS, curves)
    plt = _pyplot()
    fig = None
    if plt is not None:
        sides = list(dict.fromkeys(c["side"] for c in curves))
        fig = plt.figure(figsize=(12, max(4.0, 0.3 * len(rows) + 2) + (4.5 if sides else 0)))
        grid = fig.add_gridspec(2 if sides else 1, max(1, len(sides)), height_ratios=(max(4.0, 0.3 * len(rows) + 2), 4.5)
                                if sides else None)
        _gap_tests(fig.add_subplot(grid[0, :]), rows, references)
        grouped = _grouped(curves)
        for i, side in enumerate(sides):
            _gap_curves(fig.add_subplot(grid[1, i]), side, {k: v for k, v in grouped.items() if k[0] == side})
    return _finish(plt, fig, out_dir, stem, csv_path, curves_csv=curves_csv)


def _gap_tests(ax, rows, references) -> None:
    order = sorted(rows, key=lambda r: (r["side"] != "trained ceiling", -(r["test_window"] or r["test_stream"])))
    for y, r in enumerate(order):
        color = SIDE_COLORS.get(r["side"], "tab:blue")
        for key, face in (("test_window", color), ("test_stream", "none")):
            if r.get(key) is not None:
                ax.errorbar(r[key], y, xerr=r.get(f"{key}_sd") or 0.0, fmt="o", ms=6, color=color, mfc=face,
                            mec=color, capsize=2, zorder=3)
    ax.set_yticks(range(len(order)), [f"{r['plan']}: {r['configuration']} ({r['seeds']} seed{'s' if r['seeds'] > 1 else ''})"
                                      for r in order], fontsize=7)
    ax.set_ylim(-0.7, len(order) - 0.3)
    for label, ce in sorted((references or {}).items()):
        ax.axvline(ce, color="0.35", ls=":", lw=1.2, zorder=1, label=f"{label}: {ce:.4f}")
    ax.scatter([], [], color="0.5", label="32-char windows (the paper's metric)")
    ax.scatter([], [], facecolors="none", edgecolors="0.5", label="state carried through the test text")
    ax.set_xlabel("test CE (nats/char), mean ± sd over seeds")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    ax.set_title("every finished configuration (green: fixed reservoir; grey: trained ceiling)", fontsize=9)


def _gap_curves(ax, side: str, grouped: dict, limit: float = 0.15) -> None:
    """One side's screen curves; the y range fits the curves past their first fifth (the first
    evaluations swing widely), at most ±limit: a curve beyond it says so in the legend."""
    colors = _pyplot().get_cmap("tab20").colors
    shown = []
    for i, ((_, plan, conf, seed), pts) in enumerate(sorted(grouped.items())):
        last = max(p["samples"] for p in pts)
        late = [p["difference"] for p in pts if p["samples"] >= 0.2 * last]
        off = f" (off the scale: {pts[-1]['difference']:+.2f} at the end)" if abs(pts[-1]["difference"]) > limit else ""
        ax.plot([p["samples"] / 1e6 for p in pts], [p["difference"] for p in pts], color=colors[i % len(colors)],
                lw=1.2, ls="-" if pts[-1]["finished"] else "--", label=f"{plan}: {conf}{off}")
        shown += [d for d in late if abs(d) <= limit]
    if shown:
        lo, hi = min(min(shown), 0.0), max(max(shown), 0.0)
        pad = 0.15 * (hi - lo) + 0.005
        ax.set_ylim(lo - pad, hi + pad)
    ax.axhline(0.0, color="k", lw=0.8)
    ax.set_xlabel("training samples seen (millions)")
    ax.set_ylabel("val CE minus its base's (nats)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6, loc="best")
    ax.set_title(f"{side}: each screen run against its plan's base\nat the same samples (dashed: unfinished)", fontsize=9)


def _grouped(curves) -> dict:
    out: dict = {}
    for p in curves:
        out.setdefault((p["side"], p["plan"], p["configuration"], p["seed"]), []).append(p)
    return {k: sorted(v, key=lambda p: p["samples"]) for k, v in out.items()}
