"""docs/token-scaling.md: the token-level LAERC and GPT runs published in results/, their scaling fits and
the ablations, from the published folders alone (`reslm report`).

A published token run (its config's data kind is "tokens") is a *sized* run when its model differs from
its family's defaults only in size fields (SIZE_FIELDS); sized runs that share a dataset and a training
budget form one group, and each group gets the fits of reslm.report.scaling (min training loss, the
paper's; best and final validation loss, reslm's) per family, with R^2 and a 95% t interval of the slope,
beside the paper's slopes. Every other token run is a variant (an ablation): its row names the fields
it changes and the sized run of the same family and shape it is compared with.

Per run: trainable parameters (the manifest's tensors: a tied embedding counts once), tokens seen and
the passes over the train split they make, the minimum training loss, the validation loss at its best
evaluation and at the last, how much the validation loss moved over the last 20% of the steps (the
evaluation nearest 80% of the run against the last: negative while it still falls), the CE of the
whole val split from eval.json (what `reslm eval results/NAME` prints), training wall time, CPU and
threads.

Writes (text outputs; the PNG only when not checking):
    docs/token-scaling.md    the tables
    docs/token-scaling.csv   one row per run (the figure's points)
    results/token-scaling.json  the fits of every group (the figure's lines): data, so under results/
    docs/token-scaling.png   min training loss and best val loss against N, both families, fit lines
    README.md                the part between TOKENS_BEGIN and TOKENS_END: one line per family
"""
from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

from reslm.core.files import read_json
from reslm.core.metrics import MIN_TRAIN_LOSS, TEST_BPC, TEST_LOSS, VAL_LOSS, best_of, final_of
from reslm.models import families
from reslm.models.identity import delta, identity, recipe, seed_of
from reslm.models.laerc import AUTHORS_VARIANT
from reslm.paper import SLOPES
from reslm.run import CONFIG, SUMMARY, read_metrics
from reslm.run.registry import EVAL, PROVENANCE, published_folders, read_manifest
from reslm.report.rows import replace_between
from reslm.report.scaling import FIT_KEYS, fit_all, plot_scaling

TOKENS_BEGIN, TOKENS_END = "<!-- tokens:begin -->", "<!-- tokens:end -->"
PAGE, STEM = "docs/token-scaling.md", "token-scaling"
FITS = f"results/{STEM}.json"   # the fits are data: results/, beside kneser-ney.json; docs/ holds pages
SIZE_FIELDS = ("vocab_size", "dim", "n_layers", "n_heads", "context", "r_mult", "seed")
FIELDS = ("name", "family", "group", "variant", "dim", "n_layers", "trainable_params", "fixed_params", "steps",
          "tokens_seen", "epochs", MIN_TRAIN_LOSS, best_of(VAL_LOSS), "best_val_step", final_of(VAL_LOSS),
          "val_change_last_20pct", "val_split_loss", "val_split_bpc", "train_seconds", "cpu", "threads")
PAPER_A = {"laerc": SLOPES["a_Res"], "gpt": SLOPES["a_TF"]}
NAMES = {"laerc": "LAERC", "gpt": "GPT"}


def _variant(cfg: dict) -> str:
    """How a token run's model differs from its family's defaults beyond its size ("" for none): its delta
    (reslm.models.identity) from the family at the run's size; the authors' released LAERC (AUTHORS_VARIANT)
    is named as such."""
    fam = cfg["family"]
    model = identity(cfg)["model"]
    diff = delta(cfg, recipe(fam, model={k: model[k] for k in SIZE_FIELDS if k in model}))["model"]
    if fam == "laerc" and diff and all(model.get(k) == v for k, v in AUTHORS_VARIANT.items() if k not in SIZE_FIELDS):
        return "authors' variant"
    return ", ".join(f"{k}={v}" for k, v in sorted(diff.items()))


def _group(cfg: dict) -> str:
    t, m = cfg["train"], cfg["model"]
    return (f"{cfg['data'].get('name') or cfg['data']['path']}, {t['max_steps']:,} steps of "
            f"{t['batch_size'] * t.get('grad_accum', 1)} x {m['context']} tokens")


def _change(evals: list[dict], steps: int):
    """val loss at the last evaluation minus at the evaluation nearest 80% of the steps (None: too few)."""
    if len(evals) < 2 or not steps:
        return None
    ref = min(evals[:-1], key=lambda r: abs(r["step"] - 0.8 * steps))
    return evals[-1][VAL_LOSS] - ref[VAL_LOSS]


def _train_variants(rows: list[dict]) -> None:
    """Within each group, a run trained otherwise than most of the group's runs (another lr, say) is a
    variant: its differing training fields join its `variant` text (the authors' variant keeps its name)."""
    for g in dict.fromkeys(r["group"] for r in rows):
        mine = [r for r in rows if r["group"] == g]
        keys = [json.dumps(r["train"], sort_keys=True) for r in mine]
        common = json.loads(max(dict.fromkeys(keys), key=keys.count))
        for r in mine:
            diff = [f"{k}={v}" for k, v in sorted(r["train"].items()) if common.get(k) != v]
            if diff and r["variant"] != "authors' variant":
                r["variant"] = ", ".join(x for x in (r["variant"], *diff) if x)


def token_rows(repo: Path) -> list[dict]:
    """One row (FIELDS) per published token run under repo/results: by group, family (LAERC first), sized
runs before variants, trainable parameters."""
    base = Path(repo) / "results"
    rows = []
    for folder in published_folders(base):
        cfg = read_json(folder / CONFIG) or {}
        if cfg.get("family") not in families("tokens"):
            continue
        m, summary = read_manifest(folder), read_json(folder / SUMMARY) or {}
        prov, ev = read_json(folder / PROVENANCE) or {}, read_json(folder / EVAL) or {}
        evals = [r for r in read_metrics(folder, "eval") if r.get("step", 0) > 0
                 and isinstance(r.get(VAL_LOSS), (int, float))]
        steps = m.get("step") or 0
        train_tokens = cfg["data"].get("fingerprint", {}).get("files", {}).get("train.bin", {}).get("bytes", 0) // 2
        tokens = steps * cfg["train"]["batch_size"] * cfg["train"].get("grad_accum", 1) * cfg["model"]["context"]
        best = min(evals, key=lambda r: r[VAL_LOSS]) if evals else {}
        whole = ev.get("settings", {}).get("score") == 0
        rows.append(dict(
            name=folder.name, family=cfg["family"], group=_group(cfg), variant=_variant(cfg),
            dim=cfg["model"]["dim"], n_layers=cfg["model"]["n_layers"],
            trainable_params=sum(math.prod(t["shape"]) for t in m.get("trainable", {}).values()),
            fixed_params=summary.get("fixed_params"), steps=steps, tokens_seen=tokens,
            epochs=round(tokens / train_tokens, 3) if train_tokens else None,
            **{MIN_TRAIN_LOSS: summary.get(MIN_TRAIN_LOSS), best_of(VAL_LOSS): best.get(VAL_LOSS)},
            best_val_step=best.get("step"), **{final_of(VAL_LOSS): evals[-1][VAL_LOSS] if evals else None},
            val_change_last_20pct=_change(evals, steps), val_split_loss=ev.get(TEST_LOSS) if whole else None,
            val_split_bpc=ev.get(TEST_BPC) if whole else None,
            train_seconds=(prov.get("wall") or {}).get("train_seconds"), cpu=prov.get("cpu", "?"),
            threads=prov.get("threads"), finished=bool(m.get("finished")),
            train={**identity(cfg)["train"], "seed": seed_of(cfg)}))
    _train_variants(rows)
    order = {fam: i for i, fam in enumerate(("laerc", "gpt"))}
    return sorted(rows, key=lambda r: (r["group"], order.get(r["family"], 9), bool(r["variant"]), r["trainable_params"],
                                       r["name"]))


def fits_by_group(rows: list[dict]) -> dict:
    """{group: {key: {family: fit}}} over the finished sized runs (reslm.report.scaling.fit_all)."""
    out = {}
    for g in dict.fromkeys(r["group"] for r in rows):
        sized = [r for r in rows if r["group"] == g and not r["variant"] and r["finished"]]
        if sized:
            out[g] = fit_all(sized)
    return out


# --- text ----------------------------------------------------------------------------------------------
def _f(v, spec=".4f") -> str:
    return "..." if v is None else format(v, spec)


def _slope(fit: dict | None) -> str:
    if not fit or fit.get("a") is None:
        return "..."
    ci = f" [{fit['a_lo']:.2f}, {fit['a_hi']:.2f}]" if fit.get("a_lo") is not None else ""
    return f"{fit['a']:.2f}{ci}, R² {fit['r2']:.2f}"


def fits_table(group_fits: dict, rows: list[dict]) -> str:
    L = ["| family | sizes | trainable N | a of min train loss (paper's fit) [95% CI], R² | a of best val loss | "
         "a of final val loss | paper's a |", "|---|---|---|---|---|---|---|"]
    for fam, fit in group_fits[MIN_TRAIN_LOSS].items():
        ns = [r["trainable_params"] for r in rows if r["family"] == fam]
        L.append(f"| {NAMES.get(fam, fam)} | {fit['n']} | {min(ns):,} - {max(ns):,} "
                 f"({math.log10(max(ns) / min(ns)):.2f} decades) | {_slope(fit)} | "
                 f"{_slope(group_fits[best_of(VAL_LOSS)].get(fam))} | {_slope(group_fits[final_of(VAL_LOSS)].get(fam))} "
                 f"| {PAPER_A.get(fam, '-')} |")
    return "\n".join(L)


def runs_table(rows: list[dict]) -> str:
    L = ["| run | trainable | tokens (epochs) | min train | best val (step) | final val | val change, last 20% "
         "| whole val split (bits/char) | train time | CPU, threads |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        state = "" if r["finished"] else " (in progress)"
        L.append(f"| [{r['name']}](../results/{r['name']}){state} | {r['trainable_params']:,} | "
                 f"{r['tokens_seen'] / 1e6:.2f} M ({_f(r['epochs'], '.2f')}) | {_f(r[MIN_TRAIN_LOSS])} | "
                 f"{_f(r[best_of(VAL_LOSS)])} ({r['best_val_step'] or '-'}) | {_f(r[final_of(VAL_LOSS)])} | "
                 f"{_f(r['val_change_last_20pct'], '+.4f')} | {_f(r['val_split_loss'])} ({_f(r['val_split_bpc'], '.3f')}) "
                 f"| {_f(r['train_seconds'], ',.0f')} s | {r['cpu']}, {r['threads'] or '?'} |")
    return "\n".join(L)


def ablation_table(rows: list[dict], sized: list[dict]) -> str:
    L = ["| run | variant | trainable | best val | whole val split | compared with | its best val | "
         "its whole val split | difference (whole val split) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ref = next((s for s in sized if s["family"] == r["family"] and s["dim"] == r["dim"]
                    and s["n_layers"] == r["n_layers"]), None)
        diff = (f"{r['val_split_loss'] - ref['val_split_loss']:+.4f}" if ref and r["val_split_loss"] is not None
                and ref["val_split_loss"] is not None else "...")
        L.append(f"| [{r['name']}](../results/{r['name']}) | {r['variant']} | {r['trainable_params']:,} | "
                 f"{_f(r[best_of(VAL_LOSS)])} | {_f(r['val_split_loss'])} | "
                 + (f"[{ref['name']}](../results/{ref['name']}) | {_f(ref[best_of(VAL_LOSS)])} | "
                    f"{_f(ref['val_split_loss'])} | {diff} |" if ref else "- | - | - | - |"))
    return "\n".join(L)


def token_md(rows: list[dict], fits: dict, fig: bool) -> str:
    L = ["# Token-level scaling: LAERC against GPT", "",
         "Generated by `reslm report` from the token-level runs published in `results/` (weights included: "
         "`reslm eval results/NAME` scores one again, `reslm generate results/NAME` samples from it). Losses in "
         "nats per token of the dataset's BPE vocabulary. *min train*: the lowest logged training loss, what the "
         "paper fits; *best val* / *final val*: the validation loss (fixed-seed random windows of the val split) "
         "at the best and at the last evaluation during training, reslm's held-out fits; *val change, last "
         "20%*: the last evaluation's val loss minus the one nearest 80% of the steps (negative: still "
         "falling); *whole val split*: every token of the val split in non-overlapping windows, from "
         "eval.json. Nothing here is chosen on a test split: the token datasets have train and val only. "
         "The fits: L = a log10 N + b per family over N = trainable parameters (a tied embedding counted "
         "once, as the paper counts), OLS, 95% t interval of a with n - 2 degrees of freedom "
         f"([data]({STEM}.csv), [fits](../{FITS}); `reslm.report.scaling`). How the sweep was sized: "
         "[laerc.md](laerc.md#the-published-sweep).", ""]
    for g in dict.fromkeys(r["group"] for r in rows):
        sized = [r for r in rows if r["group"] == g and not r["variant"]]
        variants = [r for r in rows if r["group"] == g and r["variant"]]
        L += [f"## {g}", ""]
        if g in fits:
            L += ["### Scaling fits", "", fits_table(fits[g], [r for r in sized if r["finished"]]), ""]
        if sized:
            L += ["### Runs", "", runs_table(sized), ""]
        if variants:
            L += ["### Ablations", "", ablation_table(variants, sized), ""]
    if fig:
        L += [f"![Token-level scaling]({STEM}.png)", "",
              f"*Min training loss (left, the paper's fit) and best validation loss (right) against trainable "
              f"parameters, with the fit lines and their slopes ([data]({STEM}.csv), [fits](../{FITS}); "
              f"`reslm.report.scaling.plot_scaling`).*", ""]
    return "\n".join(L)


def _short(n: int) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.0f}k"


def main_group(rows: list[dict], fits: dict) -> str:
    """The group the README and the figure show: the one with the most finished sized runs, then the
    longest training (a longer budget replaces a shorter one once it covers as many sizes)."""
    def key(g):
        sized = [r for r in rows if r["group"] == g and not r["variant"] and r["finished"]]
        return len(sized), max((r["steps"] for r in sized), default=0)
    return max(fits, key=key)


def readme_block(rows: list[dict], fits: dict) -> str:
    """The README's token-level lines: the budget of the main group (main_group), then per family its sizes
    and slopes."""
    if not fits:
        return "No token-level run is published yet."
    g = main_group(rows, fits)
    sized = [r for r in rows if r["group"] == g and not r["variant"] and r["finished"]]
    epochs = [r["epochs"] for r in sized if r["epochs"]]
    ep = f" ({max(epochs):.1f} epochs)" if epochs else ""
    L = [f"Every size: {g.split(', ', 1)[-1]}{ep}; slope a of L = a log10 N + b:", "",
         "| family | trainable N | a, min train loss [95% CI] | a, best val loss | paper |", "|---|---|---|---|---|"]
    for fam, fit in fits[g][MIN_TRAIN_LOSS].items():
        ns = [r["trainable_params"] for r in sized if r["family"] == fam]
        L.append(f"| {NAMES.get(fam, fam)} | {_short(min(ns))}-{_short(max(ns))} | {_slope(fit)} | "
                 f"{_slope(fits[g][best_of(VAL_LOSS)].get(fam))} | {PAPER_A.get(fam, '-')} |")
    return "\n".join(L)


def replace_block(text: str, block: str) -> str:
    return replace_between(text, TOKENS_BEGIN, TOKENS_END, block, "token-level table")


def _csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=FIELDS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else r[k]) for k in FIELDS})
    return buf.getvalue()


def token_outputs(repo: Path, readme: str | None) -> tuple[dict[str, str], list[dict], dict]:
    """({relative path: text}, rows, fits): the page, its CSV and JSON and the README (when given) with its
    token-level block; nothing when no token run is published and the README has no block."""
    rows = token_rows(repo)
    fits = _rounded(fits_by_group(rows))
    out = {}
    if rows:
        out[PAGE] = token_md(rows, fits, fig=bool(fits))
        out[f"docs/{STEM}.csv"] = _csv(rows)
        out[FITS] = json.dumps(dict(fit="loss = a * log10(trainable_params) + b", keys=list(FIT_KEYS),
                                    paper=dict(SLOPES), groups=fits), indent=1) + "\n"
    if readme is not None and TOKENS_BEGIN in readme:
        out["README.md"] = replace_block(readme, readme_block(rows, fits))
    return out, rows, fits


def _rounded(value, digits: int = 10):
    """`value` with every float rounded to `digits` significant digits: the fits' last bits differ between
    CPUs (vectorised sums), and the report writes the same JSON, pages and figure on every machine."""
    if isinstance(value, float):
        return float(f"{value:.{digits}g}")
    if isinstance(value, dict):
        return {k: _rounded(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_rounded(v, digits) for v in value)
    return value


def plot_tokens(plt, repo: Path, rows: list[dict], fits: dict) -> None:
    """docs/token-scaling.png of main_group's group (reslm.report.scaling.plot_scaling)."""
    if not fits:
        return
    g = main_group(rows, fits)
    sized = [r for r in rows if r["group"] == g and not r["variant"] and r["finished"]]
    plot_scaling(plt, sized, fits[g], Path(repo) / "docs" / f"{STEM}.png")
