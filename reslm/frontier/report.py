"""What a plan has measured, as text: `status_lines` (the terminal's view: every run, its state and the
time left) and `plan_markdown` (a plan's section of docs/frontier-plans.md: the rule's verdict, one row
per configuration with mean ± sd over its seeds, and the ledger's account of when each candidate joined).
Every figure comes from the published runs; nothing is typed by hand."""
from __future__ import annotations

import re
from pathlib import Path

from reslm.core.files import atomic_write, read_json
from reslm.core.metrics import TEST_LOSS, VAL_LOSS
from reslm.frontier import ledger
from reslm.frontier.plan import BUNDLED, Plan, bundled_plans, load_plan
from reslm.frontier.ranks import RECIPE_PLANS, against_full, recipes_markdown
from reslm.frontier.ranks import hms as _hms
from reslm.frontier.runner import Entry, estimate, index_results, pending, plan_table, selection, to_score
from reslm.models.identity import delta, describe, recipe
from reslm.report.frontier import GAP_FIG, KN_FILE
from reslm.report.plots import plot_gap
from reslm.run import SUMMARY, read_config, read_metrics
from reslm.run.registry import EVAL_WINDOW
from reslm.scoring.pieces import kept

PLANS_PAGE = "docs/frontier-plans.md"
PAGES_WITH_BLOCKS = ("docs/frontier-routes.md", "docs/frontier-tool.md")   # hand-written pages with generated plan tables
# docs/GAP_FIG.png draws these plans side by side: the trained ceilings and the reservoir's routes
GAP_PLANS = (("trained ceiling", ("gru-ceiling", "lstm-ceiling")),
             ("reservoir", ("esn-routes", "esn-substrates", "esn-timescales", "esn-readout-rank", "esn-memory", "esn-head-capacity")))


def _ms(st, digits: int = 4, seeds: int | None = None) -> str:
    """mean ± sd over the seeds that have the figure; "(k seeds)" when fewer than `seeds` have it."""
    if not st:
        return "-"
    mean, sd, n = st
    text = f"{mean:.{digits}f} ± {sd:.{digits}f}" if n > 1 else f"{mean:.{digits}f}"
    return text + (f" ({n} seed{'s' if n > 1 else ''})" if seeds is not None and n < seeds else "")


def status_lines(plan: Plan, table: list[Entry]) -> list[str]:
    """One line per run (state, progress, validation CE, test CE on the paper's 32-character windows and
    with the state carried, time left), then the rule's verdict and the time left in all."""
    sel = selection(plan, table)
    out = [f"plan {plan.name} ({plan.path}, sha {plan.sha[:12]}): rule {plan.rule.select}, seeds "
           f"{list(plan.rule.seeds)}" + (f", screen seed {plan.rule.screen_seed}" if plan.rule.select == "screen" else "")]
    out.append(f"  {'run':<44}{'state':<15}{'done':>6}{'val CE':>9}{'windows':>9}{'carried':>9}{'left':>9}")
    left = 0.0
    unknown = False
    for e in table:
        t = estimate(e, table) if e.state in ("pending", "unfinished", "running", "waiting") else 0.0
        if e.state != "waiting":
            left += t or 0.0
            unknown |= t is None
        val = f"{e.val:.4f}" if e.val is not None else "-"
        window, stream = (f"{v:.4f}" if v is not None and e.state == "done" else "-"
                          for v in (e.test_window, e.test_stream))
        state = e.state + (f" ({e.holder.split(' ')[1]})" if e.state == "running" and e.holder else "")
        out.append(f"  {e.name:<44}{state:<15}{e.progress:>6.0%}{val:>9}{window:>9}{stream:>9}"
                   f"{_hms(t) if e.state not in ('done', 'not run') else '':>9}")
    todo = pending(plan, table)
    out.append("  (test CE: windows, each character from its 32 preceding ones, the paper's metric; carried, with "
               "the state carried through the test text)")
    out.append(f"{sum(e.state == 'done' for e in table)} done, {sum(e.state == 'running' for e in table)} running, "
               f"{len(todo)} to run now, {sum(e.state == 'waiting' for e in table)} waiting on the screen; "
               + (f"about {_hms(left)}{' or more' if unknown else ''} of one run's threads left (estimated from each "
                  "run's pace over its last shard-epochs on this CPU, else its pace so far, else from the plan's "
                  "finished runs, on this CPU where any)" if left or not unknown
                  else "time left unknown (no run of the plan has finished yet)"))
    out += ["  " + line for line in _verdict(plan, sel)]
    if unscored := to_score(plan, table):
        out.append(f"  to score on the paper's 32-character windows: {', '.join(map(_scoring, unscored))} (the next "
                   "`reslm frontier run` does it)")
    return out


def _scoring(e: Entry) -> str:
    """A run to score, and how far an unfinished scoring of it got."""
    done = kept(e.folder, EVAL_WINDOW) if e.folder is not None else None
    return e.name + (f" ({done[0]} of {done[1]} pieces scored)" if done else "")


def _verdict(plan: Plan, sel: dict) -> list[str]:
    if plan.rule.select != "screen":
        return ["rule none: nothing is chosen; each configuration's mean over its seeds is reported"]
    lines = []
    if not sel["screened"]:
        lines.append("the screen is not complete: no finalist yet")
    else:
        base = sel["screen"].get(plan.base.label or "base")
        lines.append(f"screen at seed {plan.rule.screen_seed}: base val {base:.4f}" if base is not None else
                     "screen: the base has no validation CE")
        lines.append("finalists: " + (", ".join(sel["finalists"]) or "none (no candidate below the base)"))
    lines.append(f"chosen: {sel['chosen']}" if sel["chosen"] else "chosen: not yet (finalists' seeds not all done)")
    return lines


def plan_markdown(plan: Plan, results: Path, runs: Path | None, *, heading: bool = True,
                  index: dict | None = None) -> str:
    """A plan's section: what it asks, the rule's verdict, a table of every configuration and the ledger
    (heading False: the table, its comparison with the full budget and the runs alone, for a page that
    says the rest in its own words)."""
    index = index_results(results) if index is None else index
    table = plan_table(plan, results, runs, index)
    sel = selection(plan, table)
    base = plan.base
    changed = describe(delta(base.run_config(0), recipe(base.family, base.preset)))
    L = [f"## {plan.name}", "", plan.about.strip(), "", f"Plan file: `{_shown(plan.path)}` (sha256 {plan.sha[:12]}). Base (`{base.label or 'base'}`): "
         f"{base.preset or base.family} with {', '.join(changed) or 'the paper protocol'}. Rule: "
         + (f"screen at seed {plan.rule.screen_seed} against the base on validation, the {plan.rule.finalists} "
            f"lowest below it on to seeds {list(plan.rule.seeds)}, the lowest mean validation CE chooses."
            if plan.rule.select == "screen" else f"none: every configuration at seeds {list(plan.rule.seeds)}, "
            "nothing chosen.") + (" Strict reservoir rules and the budget checked before any run." if plan.rule.strict
                                  else ""), ""]
    if not heading:
        L = [f"*Generated from plan [{plan.name}](frontier-plans.md#{plan.name}) by `reslm report`.*", ""]
    screen = plan.rule.select == "screen"
    L += ["| configuration | change over the base | seeds done |"
          + (f" val CE at seed {plan.rule.screen_seed} (the screen) |" if screen else "")
          + " val CE | test CE, 32-char windows (nats) | test CE, state carried (nats) | verdict |",
          "|---|---|---|" + ("---|" if screen else "") + "---|---|---|---|"]
    base_key = base.label or "base"
    for c in plan.configs:
        label = c.label or "base"
        g = sel["groups"][label]
        change = ", ".join(describe(delta(c.run_config(0), base.run_config(0)))) or "-"
        at = sel["screen"].get(label)
        L.append(f"| {label} | {change} | {', '.join(map(str, g['seeds'])) or '-'} |"
                 + (f" {'-' if at is None else f'{at:.4f}'} |" if screen else "")
                 + f" {_ms(g['val'])} | {_ms(g['test_window'], seeds=len(g['seeds']))} | "
                 f"{_ms(g['test_stream'], seeds=len(g['seeds']))} | "
                 f"{_verdict_of(label, base_key, sel) if screen else ''} |")
    L += against_full(plan, table, index)
    L += ["", "Runs: " + ", ".join(f"[{e.name}](../results/{e.folder.name})" if e.state == "done"
                                   else f"{e.name} ({e.state})"
                                   for e in table if e.state != "waiting"), ""]
    if heading:
        L += _ledger_lines(plan, results)
    return "\n".join(L) + "\n"


BLOCK = re.compile(r"(<!-- plan:(?P<name>[A-Za-z0-9._-]+):begin -->\n)(?P<body>.*?)(<!-- plan:(?P=name):end -->)", re.S)


def fill_plan_blocks(text: str, results: Path, index: dict | None = None, plans: dict[str, Plan] | None = None) -> str:
    """Every `<!-- plan:NAME:begin -->` ... `<!-- plan:NAME:end -->` block of a page, filled with that
    plan's table from results/ (plan_markdown without its heading), a `<!-- routes:begin -->` ...
    `<!-- routes:end -->` block with routes_markdown and a `<!-- recipes:begin -->` ... `<!-- recipes:end -->`
    block with the bench's quick recipes (`plans`: name -> Plan, those not given are loaded): a page's prose
    stays its own, its figures are generated."""
    index = index_results(results) if index is None else index
    text = BLOCK.sub(lambda m: m[1] + plan_markdown(load_plan(m["name"]), results, None, heading=False, index=index)
                     + m[4], text)
    text = RECIPES_BLOCK.sub(lambda m: m[1] + _recipes(results, index, plans) + m[3], text)
    return ROUTES_BLOCK.sub(lambda m: m[1] + routes_markdown(results, index, plans) + m[3], text)


ROUTES_BLOCK = re.compile(r"(<!-- routes:begin -->\n)(?P<body>.*?)(<!-- routes:end -->)", re.S)
RECIPES_BLOCK = re.compile(r"(<!-- recipes:begin -->\n)(?P<body>.*?)(<!-- recipes:end -->)", re.S)


def _recipes(results: Path, index: dict, plans: dict[str, Plan] | None) -> str:
    """The bench's candidate quick recipes and the one chosen (reslm.frontier.ranks.recipes_markdown)."""
    candidates = [(plans or {}).get(name) or load_plan(name) for name in RECIPE_PLANS]
    return recipes_markdown(candidates, {p.name: plan_table(p, results, None, index) for p in candidates}, index)


def routes_markdown(results: Path, index: dict | None = None, plans: dict[str, Plan] | None = None) -> str:
    """How far each route got: every candidate the reservoir plans of GAP_PLANS screened (a configuration
    two plans screen, once), ranked by its validation CE at the screen seed minus its plan's base's there,
    with its trainable parameters, seeds, test CE on both metrics and the rule's verdict; then the trained
    ceilings each plan of theirs chose, for scale."""
    index = index_results(results) if index is None else index
    rows, chosen = {}, []
    for side, names in GAP_PLANS:
        for name in names:
            plan = (plans or {}).get(name) or load_plan(name)
            table = plan_table(plan, results, None, index)
            sel = selection(plan, table)
            if side != "reservoir":
                if sel["chosen"]:
                    chosen.append((name, sel["chosen"], sel["groups"][sel["chosen"]]))
                continue
            seed = plan.rule.screen_seed if plan.rule.select == "screen" else plan.rule.seeds[0]
            done = {e.label: e for e in table if e.seed == seed and e.state == "done"}
            val = {label: e.val for label, e in done.items()}
            base_key = plan.base.label or "base"
            for c in plan.candidates:
                at, base_val = val.get(c.label), val.get(base_key)
                if at is None or base_val is None:
                    continue
                g = sel["groups"][c.label]
                verdict = _verdict_of(c.label, base_key, sel) if plan.rule.select == "screen" else \
                    "a diagnostic: nothing chosen"
                if c.fingerprint in rows:   # a configuration two plans screen: one row, its plans named
                    rows[c.fingerprint]["plans"].append(name)
                    rows[c.fingerprint]["verdicts"].append(f"{verdict} ({name})")
                    continue
                rows[c.fingerprint] = dict(
                    plans=[name], label=c.label, verdicts=[f"{verdict} ({name})"], diff=at - base_val,
                    cells=f"{', '.join(describe(delta(c.run_config(0), plan.base.run_config(0)))) or '-'} | "
                          f"{(read_json(done[c.label].folder / SUMMARY) or {}).get('trainable_params', 0):,} | "
                          f"{at:.4f} | {at - base_val:+.4f} | {len(g['seeds'])} | "
                          f"{_ms(g['test_window'], seeds=len(g['seeds']))} | "
                          f"{_ms(g['test_stream'], seeds=len(g['seeds']))}")
    L = ["*Generated from the plans' published runs by `reslm report`.*", "",
         "| plan: configuration | change over its plan's base | trainable | val CE at the screen seed | minus the "
         "base's | seeds | test CE, 32-char windows (nats) | test CE, state carried (nats) | verdict |",
         "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows.values(), key=lambda r: r["diff"]):
        verdicts = r["verdicts"] if len(r["verdicts"]) > 1 else [r["verdicts"][0].rsplit(" (", 1)[0]]
        L.append(f"| {', '.join(r['plans'])}: {r['label']} | {r['cells']} | {'; '.join(verdicts)} |")
    if chosen:
        L += ["", "For scale, the trained ceilings their plans chose: " + "; ".join(
            f"{name}: {label}, {_ms(g['test_window'])} on the windows, {_ms(g['test_stream'])} with the state carried "
            f"({len(g['seeds'])} seeds)" for name, label, g in chosen) + "."]
    return "\n".join(L) + "\n"


def _verdict_of(label: str, base_key: str, sel: dict) -> str:
    """A configuration's verdict under the screen rule, in words."""
    if sel["chosen"] == label:
        return "**chosen**"
    if label == base_key:
        return "the base" + ("" if sel["chosen"] else " (nothing chosen yet)")
    at, base = sel["screen"].get(label), sel["screen"].get(base_key)
    if at is None or base is None:
        return "screen not done"
    if at >= base:
        return "screened out (not below the base)"
    if not sel["screened"]:
        return "below the base (the screen is not complete)"
    if label not in sel["finalists"]:
        return "below the base, not a finalist"
    return "finalist" + (f", not chosen (mean val above {sel['chosen']}'s)" if sel["chosen"] else "")


def _shown(path: Path) -> str:
    """A plan file as the docs name it: reslm/frontier/plans/NAME.toml for one reslm ships."""
    return f"reslm/frontier/plans/{path.name}" if Path(path).resolve().parent == BUNDLED else str(path)


def _ledger_lines(plan: Plan, results: Path) -> list[str]:
    events = ledger.read_ledger(results, plan.name)
    if not events:
        return ["Ledger: none yet (`reslm frontier run` has started no run of this plan; its finished runs were "
                "trained before plans existed, or by another plan with the same configurations)."]
    joined = ledger.added_after(events)
    versions = [e for e in events if e.get("event") == "plan"]
    L = [f"Ledger (`results/plans/{plan.name}.jsonl`): {len(versions)} plan text(s) seen, the current one "
         f"{'recorded' if any(e['sha'] == plan.sha for e in versions) else 'not yet recorded'}."]
    for c in plan.configs:
        e = joined.get(c.label)
        if e is None:
            L.append(f"- {c.label or 'base'}: not in any recorded plan text")
        else:
            known = e.get("known", [])
            L.append(f"- {c.label or 'base'}: joined on {e['at'][:10]} (plan {e['sha'][:12]}), when "
                     + (f"{len(known)} of the plan's runs had finished: {', '.join(known)}" if known else
                        "none of the plan's runs had finished"))
    return L


def gap_figures(plans: dict[str, Plan], results: Path, index: dict) -> tuple[list[dict], list[dict]]:
    """The rows and curves of `plot_gap` from the published runs of GAP_PLANS' plans (`plans`: name ->
    Plan, those not given are loaded). A configuration in several plans (a shared base) is drawn once,
    under the first. rows: each configuration with a finished run, its test CE on both metrics over the
    seeds done. curves: each screen run (finished or published unfinished) against its plan's base at
    the screen seed: validation CE minus the base's, interpolated at the same number of samples."""
    rows, curves, seen = [], [], set()
    for side, names in GAP_PLANS:
        for name in names:
            plan = plans.get(name) or load_plan(name)
            table = plan_table(plan, results, None, index)
            groups = selection(plan, table)["groups"]
            base = next((e for e in table if e.config == plan.base and e.seed == plan.rule.screen_seed), None)
            base_curve = _val_curve(base.folder) if base and base.folder else []
            for c in plan.configs:
                if c.fingerprint in seen:
                    continue
                seen.add(c.fingerprint)
                label = c.label or "base"
                g = groups[label]
                if g["test_window"] or g["test_stream"]:
                    rows.append(dict(side=side, plan=name, configuration=label, seeds=len(g["seeds"]),
                                     **{f"{k}{sfx}": (g[k][i] if g[k] else None) for k in ("test_window", "test_stream")
                                        for i, sfx in ((0, ""), (1, "_sd"))},
                                     val_screen=next((e.val for e in table if e.config == c and e.state == "done"
                                                       and e.seed == plan.rule.screen_seed), None)))
                run = next((e for e in table if e.config == c and e.seed == plan.rule.screen_seed), None)
                if c is plan.base or run is None or run.folder is None or run.state not in ("done", "unfinished"):
                    continue
                for step, samples, val in _val_curve(run.folder):
                    at = _interpolate(base_curve, samples)
                    if at is not None:
                        curves.append({"side": side, "plan": name, "configuration": label, "seed": run.seed,
                                       "step": step, "samples": samples, VAL_LOSS: val, f"base_{VAL_LOSS}": at,
                                       "difference": val - at, "finished": run.state == "done"})
    return rows, curves


def _val_curve(folder: Path) -> list[tuple[int, int, float]]:
    """(step, samples seen, validation CE) of each evaluation a run folder recorded."""
    batch = read_config(folder)["train"].get("batch_size", 1)
    return [(r["step"], r["step"] * batch, r[VAL_LOSS]) for r in read_metrics(folder, "eval")
            if r.get("step", 0) > 0 and isinstance(r.get(VAL_LOSS), (int, float))]


def _interpolate(curve: list[tuple[int, int, float]], samples: int) -> float | None:
    """The curve's validation CE at `samples`, linear between its evaluations; None outside them."""
    for (_, s0, v0), (_, s1, v1) in zip(curve, curve[1:]):
        if s0 <= samples <= s1:
            return v0 + (v1 - v0) * (samples - s0) / (s1 - s0) if s1 > s0 else v0
    return None


def write_gap_figure(repo: Path, plans: dict[str, Plan] | None = None, index: dict | None = None) -> dict | None:
    """docs/frontier-gap.png and its CSVs (plot_gap) from results/; None when no plan of GAP_PLANS has a
    finished configuration."""
    repo = Path(repo)
    index = index_results(repo / "results") if index is None else index
    rows, curves = gap_figures(plans or {}, repo / "results", index)
    if not rows:
        return None
    kn = read_json(repo / KN_FILE)
    refs = {f"Kneser-Ney {kn['order']}-gram": kn[TEST_LOSS]} if kn else {}
    return plot_gap(rows, curves, repo / "docs", stem=GAP_FIG, references=refs)


def write_plans_page(repo: Path, plans: list[Plan] | None = None, check: bool = False) -> list[str]:
    """docs/frontier-plans.md: one section per plan (default: every plan reslm ships), and the plan blocks
    of PAGES_WITH_BLOCKS, from results/ alone (runs in progress elsewhere change nothing), and
    docs/frontier-gap.png (write_gap_figure). Returns the pages that changed (with check=True: would
    change, and nothing is written; the figure is not compared)."""
    repo = Path(repo)
    plans = plans if plans is not None else [load_plan(p) for p in bundled_plans()]
    index = index_results(repo / "results")
    body = ["# Frontier plans", "",
            "Every plan reslm ships (`reslm frontier list`), with what its runs measured: generated by "
            "`reslm frontier report` from results/ (mean ± sd over seeds; test CE read only for reporting, "
            "every choice made on validation). How to run one: `reslm frontier run NAME`; its state: "
            "`reslm frontier status NAME`.", ""]
    for plan in plans:
        body.append(plan_markdown(plan, repo / "results", None, index=index))
    pages = {PLANS_PAGE: "\n".join(body)}
    for rel in PAGES_WITH_BLOCKS:   # pages whose tables are plans' (their prose is hand-written)
        if (repo / rel).is_file():
            pages[rel] = fill_plan_blocks((repo / rel).read_text(encoding="utf-8"), repo / "results", index,
                                          {p.name: p for p in plans})
    changed = []
    for rel, text in pages.items():
        path = repo / rel
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            continue
        changed.append(rel)
        if not check:
            atomic_write(path, lambda p, t=text: p.write_text(t, encoding="utf-8"))
    if not check and (repo / "docs").is_dir():
        made = write_gap_figure(repo, {p.name: p for p in plans}, index)
        if made and made.get("note"):
            print(f"reslm: {made['note']}")
    return changed


__all__ = ["GAP_PLANS", "PAGES_WITH_BLOCKS", "PLANS_PAGE", "fill_plan_blocks", "gap_figures", "plan_markdown",
           "routes_markdown", "status_lines", "write_gap_figure", "write_plans_page"]
