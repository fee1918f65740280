"""Quick against full: how a plan's reduced-budget runs rank against the published runs of their full budgets
(a configuration's `full`), by Spearman's rho overall and by halves fixed by each label's sha256 (half A
by validation CE, what a choice of quick recipe may read; half B by test CE, the held-out figure)."""
from __future__ import annotations

import hashlib
import statistics

from reslm.frontier.plan import Plan, load_plan
from reslm.frontier.runner import Entry, figures


def hms(seconds: float | None) -> str:
    """Seconds as "Nh MM" or "N min" ("?" unknown)."""
    if seconds is None:
        return "?"
    m = round(seconds / 60)
    return f"{m // 60}h{m % 60:02d}" if m >= 60 else f"{m} min"


def spearman(a: list[float], b: list[float]) -> float | None:
    """Spearman's rank correlation of two equally long lists (average ranks for ties); None under 3."""
    if len(a) < 3:
        return None
    ra, rb = (_ranks(x) for x in (a, b))
    ma, mb = statistics.mean(ra), statistics.mean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    var = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return cov / var if var else None


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in order[i:j + 1]:
            ranks[k] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def quick_against_full(plan: Plan, table: list[Entry], index: dict) -> list[dict]:
    """For each configuration with a full budget (`full`): its test CE at the plan's budget and its full
    budget's published test CE, both at the seeds it has done (means), and the full run's folder
    (`index`: index_results of the results folder)."""
    rows = []
    for c in plan.configs:
        full = c.full_config()
        done = [e for e in table if e.config == c and e.state == "done" and e.test is not None]
        if full is None or not done:
            continue
        folders = [index.get((full.fingerprint, e.seed)) for e in done]
        if any(f is None for f in folders):
            continue
        figs = [figures(f) for f in folders]   # each full run's summary, metrics and provenance, read once
        vals = [e.val for e in done] + [g["val"] for g in figs]
        rows.append(dict(label=c.label or "base", seeds=[e.seed for e in done],
                         quick=statistics.mean(e.test for e in done),
                         full=statistics.mean(g["test"] for g in figs), folders=folders,
                         quick_val=None if None in vals else statistics.mean(e.val for e in done),
                         full_val=None if None in vals else statistics.mean(g["val"] for g in figs),
                         seconds=statistics.mean(e.train_seconds or 0 for e in done),
                         full_seconds=statistics.mean(g["train_seconds"] or 0 for g in figs)))
    return rows


def against_full(plan: Plan, table: list[Entry], index: dict) -> list[str]:
    rows = quick_against_full(plan, table, index)
    if not rows:
        return []
    rq, rf = _ranks([r["quick"] for r in rows]), _ranks([r["full"] for r in rows])
    rho = spearman([r["quick"] for r in rows], [r["full"] for r in rows])
    L = ["", "Against the full budget (each configuration's published full-budget run at the same seeds):", "",
         "| configuration | seeds | test CE here | rank | test CE, full budget | rank | train time here | full |",
         "|---|---|---|---|---|---|---|---|"]
    for r, a, b in zip(rows, rq, rf):
        L.append(f"| {r['label']} | {', '.join(map(str, r['seeds']))} | {r['quick']:.4f} | {a:g} | "
                 f"[{r['full']:.4f}](../results/{r['folders'][0].name}) | {b:g} | {hms(r['seconds'])} | "
                 f"{hms(r['full_seconds'])} |")
    L += ["", f"Spearman's rank correlation over {len(rows)} configurations: "
          + (f"**rho = {rho:.2f}**." if rho is not None else "too few to say (under 3).")
          + inversions(rows, rq, rf)]
    return L + _halves(rows)


def inversions(rows: list[dict], rq: list[float], rf: list[float], most: int = 3) -> str:
    """The configurations whose rank moves most between the two budgets (at most `most`, largest first), as
    a sentence."""
    moved = sorted((r for r in zip(rows, rq, rf) if r[1] != r[2]), key=lambda r: (-abs(r[1] - r[2]), r[0]["label"]))
    if not moved:
        return " Every configuration keeps its rank."
    told = [f"{r['label']} ({a:g} here, {b:g} at full)" for r, a, b in moved[:most]]
    return f" Largest rank moves: {', '.join(told)}."


HALVES_FROM = 6   # configurations with both budgets before the halves are reported


def half_of(label: str) -> str:
    """A configuration's half, fixed by its label alone (the parity of its sha256), never by its figures: "A"
    chooses (a quick recipe is chosen on A's validation ranks), "B" is held out (its test ranks are reported)."""
    return "A" if int(hashlib.sha256(label.encode()).hexdigest(), 16) % 2 == 0 else "B"


def halves(rows: list[dict]) -> tuple[list[dict], list[dict], float | None, float | None]:
    """(half A's rows, half B's rows, A's rho by validation CE, B's rho by test CE) of quick_against_full's
    rows: A's figure is what a choice of quick recipe may read, B's what a user is told."""
    a = [r for r in rows if half_of(r["label"]) == "A" and r["quick_val"] is not None]
    b = [r for r in rows if half_of(r["label"]) == "B"]
    return (a, b, spearman([r["quick_val"] for r in a], [r["full_val"] for r in a]),
            spearman([r["quick"] for r in b], [r["full"] for r in b]))


def _halves(rows: list[dict]) -> list[str]:
    """Spearman's rho on each half (halves); under HALVES_FROM configurations, nothing."""
    if len(rows) < HALVES_FROM:
        return []
    a, b, rho_a, rho_b = halves(rows)
    shown = [f"{x:.2f}" if x is not None else "too few to say" for x in (rho_a, rho_b)]
    return ["", f"By halves, fixed by each label's sha256 (reslm.frontier.report.half_of): half A "
            f"({', '.join(r['label'] for r in a) or 'none'}) ranks by validation CE at rho = {shown[0]} over {len(a)}, "
            "the figure a choice of quick recipe may read; half B "
            f"({', '.join(r['label'] for r in b) or 'none'}) by test CE at rho = {shown[1]} over {len(b)}, the "
            "held-out figure a user reads."]


# the candidate quick recipes of the bench (issue 71): plans that train the same substrates at seed 0.
# substrate-ranks-lr1.5e-3 (no EMA) is shipped but not a candidate: left out, before any of its runs had
# trained, for the core time it would have taken
RECIPE_PLANS = ("substrate-ranks", "substrate-ranks-lr3e-3", "substrate-ranks-half")


QUICK_PLAN = "substrate-ranks-lr3e-3"   # the candidate quick recipe the bench runs: recipe_choice's choice


def quick_fields(plan_name: str = QUICK_PLAN) -> dict:
    """The quick budget's training fields: those a candidate quick-recipe plan's base trains with where its
    `full` gives the full budget back (the budget and the schedule the quick recipe replaces), and the test
    shard scored once, at the end (test_every: a record field, the same runs)."""
    base = load_plan(plan_name).base
    return {**{k: base.train[k] for k in base.full}, "test_every": "final"}


def recipe_choice(plans: list[Plan], tables: dict[str, list[Entry]], index: dict) -> tuple[list[dict], str | None]:
    """(one row per candidate recipe plan, the chosen plan's name or None). The rule: among the plans whose
    half A is complete (every configuration of the plan in half A done at both budgets), the highest half A
    rho by validation CE, ties to the cheaper (mean training seconds here); half B's test rho is read only
    for the one chosen, and only reported. None until every candidate's half A is complete."""
    rows = []
    for plan in plans:
        got = quick_against_full(plan, tables[plan.name], index)
        a, b, rho_a, rho_b = halves(got)
        want_a = [c for c in plan.configs if half_of(c.label or "base") == "A" and c.full_config() is not None]
        want_b = [c for c in plan.configs if half_of(c.label or "base") == "B" and c.full_config() is not None]
        rows.append(dict(plan=plan.name, a=len(a), a_of=len(want_a), b=len(b), b_of=len(want_b), rho_a=rho_a,
                         rho_b=rho_b, seconds=statistics.mean(r["seconds"] for r in got) if got else None))
    ready = [r for r in rows if r["a"] == r["a_of"] and r["rho_a"] is not None]
    if len(ready) < len(rows):
        return rows, None
    best = max(ready, key=lambda r: (round(r["rho_a"], 2), -(r["seconds"] or 0)))
    return rows, best["plan"]


def recipes_markdown(plans: list[Plan], tables: dict[str, list[Entry]], index: dict) -> str:
    """The recipe_choice table and its verdict, as the docs show it."""
    rows, chosen = recipe_choice(plans, tables, index)
    L = ["*Generated from the plans' published runs by `reslm report`.*", "",
         "| candidate quick recipe (plan) | half A done | rho, half A (validation CE) | half B done | "
         "rho, half B (test CE) | training time per run here |", "|---|---|---|---|---|---|"]
    for r in rows:
        rho_a = "-" if r["rho_a"] is None else f"{r['rho_a']:.2f}"
        rho_b = "read for the chosen recipe only" if r["plan"] != chosen else \
            (f"**{r['rho_b']:.2f}**" + (" (partial: not the figure yet)" if r["b"] < r["b_of"] else "")
             if r["rho_b"] is not None else "too few to say")
        L.append(f"| [{r['plan']}](frontier-plans.md#{r['plan'].replace('.', '')}) | {r['a']} of {r['a_of']} | "
                 f"{rho_a} | {r['b']} of {r['b_of']} | {rho_b} | {hms(r['seconds'])} |")
    L += ["", f"Chosen: **{chosen}** (the highest half A rho; its half B figure is the one a user reads)."
          if chosen else "Chosen: none yet (every candidate's half A must be complete first).",
          "", f"The bench's quick budget runs: **{QUICK_PLAN}** (QUICK_PLAN in reslm/frontier/ranks.py)"
          + ("." if chosen in (None, QUICK_PLAN) else f", not yet the chosen {chosen}.")]
    return "\n".join(L) + "\n"


__all__ = ["HALVES_FROM", "QUICK_PLAN", "RECIPE_PLANS", "against_full", "half_of", "halves", "hms", "inversions",
           "quick_against_full", "quick_fields", "recipe_choice", "recipes_markdown", "spearman"]
