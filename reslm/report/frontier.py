"""docs/frontier.md: how good a reservoir language model gets at the paper's largest trainable budget,
every character run scored on the whole test shard, with the strict-rules verdict of each.
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

from reslm.core.files import read_json
from reslm.core.metrics import LN2, TEST_LOSS, TEST_LOSS_AT_BEST_VAL, VAL_LOSS, best_of, kept_of
from reslm.models import PRESETS, check_frontier_config, make_config
from reslm.models.budget import FRONTIER_BUDGET
from reslm.models.identity import delta, fingerprint
from reslm.paper import LARGEST, TEST_CE
from reslm.run.registry import both_metrics, published_folders, read_manifest, run_metric
from reslm.report.rows import NOT_PUBLISHED, PAPER_SAMPLING, _variant, whole_shard_final
from reslm.run import CONFIG, SUMMARY, read_metrics
from reslm.run.source import read_source

FRONTIER, FRONTIER_FIG, KN_FILE = "docs/frontier.md", "frontier", "results/kneser-ney.json"
GAP_FIG = "frontier-gap"   # the reservoir beside the tuned ceiling, drawn by reslm.frontier.report
CEILING_BUDGET = 155_803   # the trained ceilings: at most tf-256-16-16's trainable count, the paper's largest
VAL_FIELDS = ("val_fraction", "val_split", "keep_best_val")   # the validation split's training fields
# the training fields of a lab route the frontier table lists where they differ from the paper's protocol
ROUTE_FIELDS = ("optimizer", "lr", "schedule", "warmup_steps", "hold_steps", "cycles", "ema", "weight_decay",
                "grad_clip", "batch_size", "epochs_per_shard", "shard_chars", "epoch_samples", "state_dtype")


def _test_at_best_val(summary: dict, evals: list[dict]):
    """The whole test shard's CE at the run's lowest validation CE: its kept weights' score when it kept them
    (`--keep-best-val`), else that evaluation's own score when it covered the whole shard (None when it
    scored fewer positions: a figure on a sample does not stand beside whole-shard ones)."""
    if summary.get("weights") == "best-val" and summary.get(kept_of(TEST_LOSS)) is not None:
        return summary[kept_of(TEST_LOSS)]
    at = next((r for r in evals if r.get("step") == summary.get("best_val_step")), None)
    whole = max((r.get("test_samples") or 0) for r in evals)
    return summary.get(TEST_LOSS_AT_BEST_VAL) if at and (at.get("test_samples") or 0) == whole else None


def _route(cfg: dict) -> list[str]:
    """What a run changed against the paper's protocol: its context mode, model variant, training fields."""
    tc, model = delta(cfg)["train"], cfg["model"]
    out = [f"{model['context_mode']} context"] if model.get("context_mode", "window") != "window" else []
    out += _variant(cfg)
    out += [f"{k}={tc[k]}" for k in ROUTE_FIELDS if k in tc and
            not (k == "warmup_steps" and cfg["train"].get("schedule") == "constant")]
    return out


def _metric_words(point: dict) -> str:
    """Which test metric a run's figure is on, in words (empty where its summary does not say)."""
    metric = point.get("test_metric") or ""
    if metric == "stream":
        return " with the state carried through the test text"
    return f" on {metric.split('-')[1]}-character windows (the paper's metric)" if metric.startswith("window-") else ""


def _scored_on(point: dict) -> str:
    """The metric of a row's test CE, in a word: the run's (test_metric), else (a legacy row) its context's."""
    metric = point.get("test_metric") or ""
    if metric == "stream" or (not metric and point.get("test_stream") is not None):
        return "state carried"
    return "windows" if metric == "window-32" or point.get("test_window") is not None else "-"


def frontier_points(repo: Path, paper: list[dict]) -> list[dict]:
    """Every character run scored on the whole test shard: the published ones (with the strict-rules
    verdict and what they changed) and the legacy rows (the paper's protocol)."""
    base, pts, left = repo / "results", [], []
    for folder in published_folders(base):
        cfg = read_json(folder / CONFIG) or {}
        if cfg.get("data", {}).get("kind", "chars") != "chars" or not whole_shard_final(cfg["train"]):
            continue
        rows = [r for r in read_metrics(folder, "eval") if r.get(TEST_LOSS) is not None]
        if not rows or (cfg["train"].get("eval_samples", 0) and not read_manifest(folder).get("finished")):
            continue   # an unfinished run's last score is on fewer positions than the whole shard
        if read_source(folder) is not None:   # its reservoir's config class is in a user's file, never run here
            left.append(folder.name)
            continue
        model = make_config(cfg["family"], **cfg["model"])
        verdict = check_frontier_config(cfg["family"], model)
        route = _route(cfg)
        # a configuration (reslm.models.identity): seeds and where it ran aside; the same without the
        # validation split, so that a run on the whole training text matches the configuration it refits
        summary = read_json(folder / SUMMARY) or {}
        window, stream = both_metrics(folder, summary)
        pts.append(dict(family=cfg["family"], name=folder.name, trainable_params=verdict.trainable_params,
                        **{TEST_LOSS: summary.get(kept_of(TEST_LOSS), rows[-1][TEST_LOSS])},
                        **{VAL_LOSS: summary.get(kept_of(VAL_LOSS), rows[-1].get(VAL_LOSS))}, strict=verdict.ok,
                        weights=summary.get("weights", "last"), test_metric=run_metric(folder, summary),
                        test_window=window, test_stream=stream,
                        config=fingerprint(cfg), base_config=fingerprint(cfg, ignore=VAL_FIELDS),
                        seed=cfg["train"].get("seed", 0), test_at_best_val=_test_at_best_val(summary, rows),
                        **{best_of(VAL_LOSS): summary.get(best_of(VAL_LOSS))},
                        val_split=cfg["train"].get("val_split", "tails") if cfg["train"].get("val_fraction") else None,
                        published=True,
                        source="lab" if route else "paper", route=route, finished=read_manifest(folder).get("finished"),
                        cycle=rows[-1].get("cycle", 0) + 1, folder=f"results/{folder.name}"))   # a solve: one pass
    for r in paper:
        done = [v for v in r["shards"] if v is not None]
        if r["weights"] or not done or r["partial"]:
            continue
        pts.append(dict(family=r["family"], name=f"{r['name']} ({r['context']}, cycle {r['cycle']})",
                        trainable_params=r["trainable"], **{TEST_LOSS: done[-1]},
                        test_window=done[-1] if r["context"] == "window" else None,
                        test_stream=done[-1] if r["context"] == "stream" else None,
                        strict=r["family"] in ("rc", "aerc"),
                        published=False, source="paper", route=[f"{r['context']} context"] if r["context"] != "window"
                        else [], finished=True, cycle=r["cycle"], folder=None))
    if left:   # one line for all of them
        print(f"reslm: note: {len(left)} run(s) left off {FRONTIER}: their reservoir is from a user's file, which the "
              f"report does not run (`reslm verify --import FILE.py` reads them): {', '.join(left)}", file=sys.stderr)
    # ranked by validation CE where the run has a validation split (within a split: whole file groups first,
    # then the shard tails); the others (chosen on test) after them
    return sorted(pts, key=lambda p: (p.get(VAL_LOSS) is None, SPLIT_RANK.get(p.get("val_split"), 2),
                                      p.get(VAL_LOSS) or p[TEST_LOSS], p["name"]))


SPLIT_RANK = {"groups": 0, "tails": 1}   # validation splits, the one without a leak first


def seed_groups(points: list[dict]) -> list[dict]:
    """Finished published runs of one configuration at several seeds: their number, and the mean and
    sample standard deviation of the validation CE, the final test CE, the test CE on each metric (on the
    paper's windows, with the state carried: where every seed has it) and (with a validation split) the
    test CE at the best-validation evaluation. Ranked by mean validation CE (within a validation split,
    SPLIT_RANK), then mean test CE."""
    by: dict[str, list[dict]] = {}
    for p in points:
        if p.get("folder") and p["finished"] and p.get("config"):
            by.setdefault(p["config"], []).append(p)

    def stats(values, every=False):
        got = [v for v in values if isinstance(v, (int, float))]
        if len(got) < 2 or (every and len(got) < len(values)):
            return None
        return statistics.mean(got), statistics.stdev(got), min(got), max(got)

    groups = []
    for runs in by.values():
        if len({r["seed"] for r in runs}) < 2:
            continue
        runs = sorted(runs, key=lambda r: r["seed"])
        groups.append(dict(runs=runs, family=runs[0]["family"], strict=runs[0]["strict"],
                           base_config=runs[0].get("base_config"),
                           trainable_params=runs[0]["trainable_params"], route=runs[0]["route"],
                           val_split=runs[0].get("val_split"),
                           val=stats([r.get(VAL_LOSS) for r in runs]), test=stats([r[TEST_LOSS] for r in runs]),
                           # a metric's mean only where every seed was scored on it
                           **{k: stats([r.get(k) for r in runs], every=True) for k, _ in METRICS},
                           test_at_best_val=stats([r.get("test_at_best_val") for r in runs])))
    return sorted(groups, key=lambda g: (g["val"] is None, SPLIT_RANK.get(g["val_split"], 2), (g["val"] or g["test"])[0]))


def _level_on_validation(top: dict, groups: list[dict]) -> list[str]:
    """A table of the strict configurations of the same split whose mean validation CE is within one
    standard error of the mean (the larger of the two) of the top one's: validation does not separate
    them, so the top one's test CE is read beside theirs. No lines when there is none."""
    def se(g):
        return g["val"][1] / len(g["runs"]) ** 0.5

    level = [g for g in groups if g is not top and g["strict"] and g["val"] and g["val_split"] == top["val_split"]
             and g["trainable_params"] <= FRONTIER_BUDGET and g["val"][0] - top["val"][0] < max(se(top), se(g))]
    if not level:
        return []
    lines = ["Validation does not separate it from these configurations: the difference of their mean validation "
             "CE from its own is within one standard error of the mean (the larger of the two).", "",
             "| configuration | seeds | mean val CE | difference | standard error | test CE |", "|---|---|---|---|---|---|"]
    for g in level:
        r0 = g["runs"][0]
        lines.append(f"| [{r0['name']}](../{r0['folder']}) | {len(g['runs'])} | {g['val'][0]:.4f} | "
                     f"{g['val'][0] - top['val'][0]:+.5f} | {max(se(top), se(g)):.4f} | {_mean_sd(g['test'])} |")
    return lines + [""]


def _refit_of(top: dict | None, groups: list[dict]) -> dict | None:
    """The seed group that trains the configuration validation chose (top) again on the whole training text:
    the same configuration without a validation split."""
    if top is None or top["base_config"] is None:
        return None
    return next((g for g in groups if g["val"] is None and g["base_config"] == top["base_config"]), None)


def _mean_sd(st) -> str:
    return "-" if st is None else f"{st[0]:.4f} ± {st[1]:.4f}"


METRICS = (("test_window", "on the paper's 32-character windows"),
           ("test_stream", "with the state carried through the test text"))   # a point's test CE on each metric


def _chosen(what: str, group: dict, recipe: str = "") -> str:
    """The headline of a seed group that validation chose: its runs, its size and its test CE on both metrics."""
    r0 = group["runs"][0]
    return (f"**{what} on validation: [{r0['name']}](../{r0['folder']}) and its other seeds, "
            f"{group['trainable_params']:,} trainable parameters{recipe}: {_on_both(group)} (mean ± sd over "
            f"{len(group['runs'])} seeds; the lowest mean validation CE of the configurations at {CHOOSE_SEEDS} seeds "
            "or more).**")


def _on_both(group: dict) -> str:
    """A seed group's mean ± sd test CE on each metric, in words; a metric not scored at every seed says so."""
    return ", ".join(f"{_mean_sd(group[k])} nats test CE {words}" if group.get(k) else f"not yet scored {words} "
                     "at every seed" for k, words in METRICS)


CHOOSE_SEEDS = 3   # the headlines choose among configurations published at this many seeds (a plan's rule's)
TARGETS = ((TEST_CE["tf"], "the paper's transformer"), (1.60, "the first moonshot"))


def _targets(test: float) -> str:
    """The frontier's fixed targets, each said met or not by a run's test CE; the trained ceiling below is
    the target after them."""
    return "Targets: " + ", ".join(f"{v:.2f} ({what}{', met' if test <= v else ''})" for v, what in TARGETS) + \
        "; then the trained ceiling of the same size."


def _recipe(route: list[str]) -> str:
    """A run's route in words: the paper's recipe (in a context mode), or what it changed."""
    if all(r.endswith(" context") for r in route):
        return "the paper's recipe" + (f" in {route[0]}" if route else "")
    return "with " + "; ".join(route)


def frontier_md(points: list[dict], kn: dict | None, fig: str | None) -> str:
    """docs/frontier.md: the rules, the headlines, the table over seeds, every run's row, the references."""
    strict = [p for p in points if p["strict"] and p["trainable_params"] <= FRONTIER_BUDGET]
    # published configurations near the budget (seeds aside): the ones compared with each other
    configs = len({p["config"] for p in strict if p.get("config") and p["trainable_params"] >= 0.9 * FRONTIER_BUDGET})
    groups = [g for g in seed_groups(points) if g["trainable_params"] >= 0.9 * FRONTIER_BUDGET]
    # each side's headline chooses among the configurations at CHOOSE_SEEDS seeds or more: means alike
    top = next((g for g in groups if g["strict"] and g["val"] and g["trainable_params"] <= FRONTIER_BUDGET
                and len(g["runs"]) >= CHOOSE_SEEDS), None)
    L = _rules(configs) + _top_lines(top, groups) + _best_run_lines(strict, configs) + _ceiling_lines(top, groups)
    if groups:
        L += _seeds_table(groups)
    L += _runs_table(points, groups) + _references_lines(kn, fig)
    return "\n".join(L) + "\n"


def _rules(configs: int) -> list[str]:
    """The page's title and opening, the rules of a strict run and of an honest selection, and the lab budget."""
    return ["# The reservoir frontier", "",
            "How good does a reservoir language model get at the paper's largest trainable budget? Generated by "
            "`reslm report` from `results/`; every number links to the published run it came from. What each "
            "route (optimisation, readout, state, search, seeds, ceilings) bought: "
            "[frontier-routes.md](frontier-routes.md).", "",
            "## The rules", "",
            "A run is a **strict reservoir-family** run (`reslm.models.budget.check_frontier`) when: the substrate "
            "is fixed and untrained (any registered reservoir, recorded ones included, optionally read through fixed "
            "random projections of its state: `--readout-dim`); every trained part reads only the substrate's "
            "current state, plus the current character's fixed embedding or one-hot; no gradient flows into or "
            "through the substrate; and its trainable parameters, counted as Table 1 counts them, are at most "
            f"{FRONTIER_BUDGET:,} (aerc-160-30's). The score is the test CE on the whole test shard after the run's "
            "last shard-epoch. Selection is honest only on text the test shard is not: ridge's alpha, L-BFGS's "
            "penalty and `reslm search` use held-out slices of the training shards, and a run with a validation "
            "split (`--val-fraction`) is ranked by its validation CE (the val column), its test CE reported beside "
            "it. Validation CEs compare only within one split: whole file groups at the end of the training text "
            "(`--val-split groups`, no play on both sides; the selection column says *validation (groups)*) rank "
            "first, then the tails of the training shards (`--val-split tails`, which share each play with the "
            "text trained on: [the leak](frontier-routes.md#0-selection-on-validation-and-the-honest-figure)). The "
            "rows without a validation split were compared, and their recipes chosen, on the test shard itself "
            "(marked *test* in the selection column; a dash: a run that chose nothing, the paper's protocol): "
            f"{configs} strict configurations within 10% of the budget so far, so the best of them is a "
            "best-of-many figure. Fully trained networks (tf, rnn) are ceilings to read the reservoirs against.", "",
            f"The lab budget: the paper's data and sampling ({PAPER_SAMPLING}), stream context (the state carried "
            "through the text; 1/32 of window context's reservoir steps), one cycle unless the row says "
            "otherwise.", ""]


def _top_lines(top: dict | None, groups: list[dict]) -> list[str]:
    """The headline of the strict configuration validation chose (top), its refit on the whole training text and
    the configurations validation does not separate from it; no lines without one."""
    if not top:
        return []
    L = [_chosen("Best strict reservoir-family configuration", top), ""]
    refit = _refit_of(top, groups)
    if refit:
        r0 = refit["runs"][0]
        L += [f"Trained again on the whole training text (the validation split folded back in, the final "
              f"weights scored, nothing chosen): [{r0['name']}](../{r0['folder']}) and its other seeds at "
              f"**{_mean_sd(refit['test'])}** nats test CE over {len(refit['runs'])} seeds.", ""]
    return L + _level_on_validation(top, groups)


def _best_run_lines(strict: list[dict], configs: int) -> list[str]:
    """The headline of the best single strict run (in the ranking's order, finished), and the lowest test CE of
    all named apart from it, as the best-of-many figure it is; no lines without a strict run."""
    best = next((p for p in strict if p.get("finished", True)), None)
    if not best:
        return []
    lowest = min(strict, key=lambda p: p[TEST_LOSS])
    how = (f"the lowest validation CE, {best[VAL_LOSS]:.4f} on the {best['val_split']} split"
           if best.get(VAL_LOSS) is not None else f"the best test CE of {configs} configurations, chosen on test")
    L = [f"**Best single strict reservoir-family run: [{best['name']}](../{best['folder']}) at "
         f"{best[TEST_LOSS]:.4f} nats{_metric_words(best)} ({best[TEST_LOSS] / LN2:.3f} bits/char), "
         f"{best['trainable_params']:,} trainable parameters ({how}).** {_targets(best[TEST_LOSS])}"
         if best.get("folder")
         else f"**Best strict reservoir-family run so far: {best['name']} at {best[TEST_LOSS]:.4f} nats.**", ""]
    if lowest is not best and lowest.get("folder"):
        L += [f"The lowest test CE of the {len(strict)} strict runs, [{lowest['name']}](../{lowest['folder']}) at "
              f"{lowest[TEST_LOSS]:.4f} nats{_metric_words(lowest)}, is the best of many figures read off the test "
              "shard, not a selection.", ""]
    return L


def _ceiling_lines(top: dict | None, groups: list[dict]) -> list[str]:
    """The headline of the trained ceiling of the same size, chosen like the reservoir, and the reservoir's gap
    to it on each metric; no lines without one."""
    # the trained networks of the same size (the ceilings: tf-256-16-16's count is the largest the paper has),
    # chosen like the reservoir: the lowest mean validation CE over seeds, read on both metrics
    ceiling = next((g for g in groups if not g["strict"] and g["val"] and g["trainable_params"] <= CEILING_BUDGET
                    and len(g["runs"]) >= CHOOSE_SEEDS), None)
    if not ceiling:
        return []
    L = [_chosen("Best trained ceiling of the same size", ceiling, f", {_recipe(ceiling['route'])}"), ""]
    if top:
        gaps = [f"{top[k][0] - ceiling[k][0]:.4f} nats {words}" for k, words in METRICS
                if top[k] and ceiling[k]]
        L += [f"The reservoir's gap to it: {' and '.join(gaps)}." if gaps else
              "The two are not yet scored on a common metric at every seed.", ""]
    return L + [f"The reservoir's routes beside the ceiling tuned as hard, on both metrics, and each route's screen "
                f"against its base: [{GAP_FIG}.png]({GAP_FIG}.png) (the plans of "
                "[frontier-routes.md, section 6]"
                "(frontier-routes.md#6-one-metric-for-both-sides-and-the-tuned-ceiling-issue-49)).", ""]


def _seeds_table(groups: list[dict]) -> list[str]:
    """The section "Over seeds": one row per seed group, the mean ± sd of its CEs."""
    L = ["## Over seeds", "",
         "Configurations within 10% of the budget published at several seeds (`--seed` changes the reservoir, "
         "the weights and the shuffling): mean ± sample standard deviation over the seeds, ranked by mean "
         "validation CE, then mean test CE. Test CE on the two metrics: each character from its 32 preceding "
         "ones read from a zero state (the paper's), and with the state carried through the test text; a dash "
         "where not every seed was scored on it. *Test CE at best val*: each seed's test CE on its own metric "
         "at its lowest validation CE, what selecting the evaluation on validation gives.", "",
         "| configuration | family | trainable | strict | seeds | val CE | test CE, 32-char windows | "
         "test CE, state carried | test CE at best val |", "|---|---|---|---|---|---|---|---|---|"]
    for g in groups:
        links = ", ".join(f"[{r['seed']}](../{r['folder']})" for r in g["runs"])
        L.append(f"| {g['runs'][0]['name']} | {g['family']} | {g['trainable_params']:,} | "
                 f"{'yes' if g['strict'] else 'no'} | {links} | {_mean_sd(g['val'])} | "
                 f"{_mean_sd(g.get('test_window'))} | {_mean_sd(g.get('test_stream'))} | "
                 f"{_mean_sd(g['test_at_best_val'])} |")
    return L + [""]


def _runs_table(points: list[dict], groups: list[dict]) -> list[str]:
    """Every run's row (a section of its own, "Every run", below the table over seeds): its CEs, what it
    chose and on what, and what it changed."""
    L = ["## Every run", ""] if groups else []
    L += ["*Scored on*: the test metric of the row's test CE, each character from its 32 preceding ones read from "
          "a zero state (*windows*, the paper's) or with the state carried through the test text (*state carried*).", "",
          "| run | family | trainable | strict | val CE | test CE (nats) | bits/char | scored on | selection | cycle | "
          "what differs from the paper's protocol | weights |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    # a configuration compared on whole held-out plays at several seeds, trained again without the split
    refits = {g["base_config"] for g in groups if g["val_split"] == "groups"}
    for p in points:
        link = f"[{p['folder']}](../{p['folder']})" + ("" if p["finished"] else " (in progress)") if p["folder"] \
            else NOT_PUBLISHED
        val = p.get(VAL_LOSS)
        # what was chosen, and on what: nothing (the paper's protocol, a context mode at most), or a
        # recipe compared on validation, or on the test shard itself
        chose = any(not (r.endswith(" context") or r.startswith("state_dtype=")) for r in p["route"])
        selection = (f"validation ({p['val_split']})" if val is not None else
                     "refit of validation (groups)" if p.get("base_config") in refits else "*test*" if chose else "-")
        L.append(f"| {p['name']} | {p['family']} | {p['trainable_params']:,} | {'yes' if p['strict'] else 'no'} | "
                 f"{'-' if val is None else f'{val:.4f}'} | {p[TEST_LOSS]:.4f} | {p[TEST_LOSS] / LN2:.3f} | "
                 f"{_scored_on(p)} | {selection} | {p['cycle']} | {'; '.join(p['route']) or '-'} | "
                 f"{link} |")
    return L


def _references_lines(kn: dict | None, fig: str | None) -> list[str]:
    """The page's end: the reference CEs (the paper's largest models, the Kneser-Ney baseline) and the figure."""
    refs = (f"References: the paper's largest models (RC {TEST_CE['rc']}, AERC {TEST_CE['aerc']}, transformer "
            f"{TEST_CE['tf']} nats)")
    if kn:
        refs += (f"; a Kneser-Ney character {kn['order']}-gram fitted on the five training shards, its order chosen "
                 f"on held-out training text: {kn[TEST_LOSS]:.4f} nats on the same test shard "
                 f"([data](../{KN_FILE}))")
    L = ["", refs + "."]
    if fig:
        L += ["", f"![test CE against trainable parameters]({fig}.png)", "",
              f"*Test CE against trainable parameters, every run above ([data]({fig}.csv); "
              "`reslm.report.plots.plot_frontier`).*"]
    return L


def _references(kn: dict | None) -> dict:
    refs = {f"paper {short}: {TEST_CE[fam]}": (PRESETS[LARGEST[fam]][2], TEST_CE[fam])
            for fam, short in (("rc", "RC"), ("aerc", "AERC"), ("tf", "TF"))}
    if kn:
        refs[f"Kneser-Ney {kn['order']}-gram: {kn[TEST_LOSS]:.4f}"] = (None, kn[TEST_LOSS])
    return refs
