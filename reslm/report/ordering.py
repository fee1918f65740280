"""docs/ordering.md: the paper's headline ordering, size by size, from the README's rows.

Table 1 pairs an RC, an AERC and a transformer (TF) preset at each of five sizes (about 15k, 30k, 45k, 103k and
155k trainable parameters). At each size the page sets the three side by side at the paper's protocol (the rows
reslm.report.rows.preset_rows chooses for the README: one pass of the paper's recipe, in window context or in the
stream context that stands for it), each with its test CE and bits/char, and their order where all three are
final (≈ where two are closer than TIE, one seed's spread); below the table, the pairs that close, and each
pair of families in the paper's order (TF < AERC < RC) counted over the sizes where both of its rows are
final. A row still training gives its latest whole-test-shard figure and how far it has got, and its size's
order stays open. The paper states numbers only for its largest models (reslm.paper.TEST_CE); its other sizes are
curves in its Fig. 2, so the page compares numbers there only. Last, how far each family's final rows still fell
over the protocol's last shard (its test CE after shard 4 against after shard 5).
"""
from __future__ import annotations

from reslm.core.metrics import LN2
from reslm.models.registry import PRESETS
from reslm.paper import LARGEST, TEST_CE
import statistics

from reslm.report.rows import (CONTINUE_CHECK, PAPER_OPTIMISER, PAPER_SAMPLING, continuation_pairs, continuation_verdict,
                               multi_pass_rows, pass_figures, preset_rows, seed_rows)

ORDERING = "docs/ordering.md"
FAMILIES = {"rc": "RC", "aerc": "AERC", "tf": "TF"}
# two final rows closer than this (nats) are marked as not resolved: each row is one seed, and one seed-to-seed
# standard deviation where reslm measured one is about this size (aerc-seeds, docs/frontier-plans.md: 0.008)
TIE = 0.01


def table1() -> list[dict[str, str]]:
    """The paper's five sizes: at each, {family: preset name} (Table 1's presets, in its order)."""
    by = {f: [n for n, (fam, _, count) in PRESETS.items() if fam == f and count] for f in FAMILIES}
    return [{f: by[f][i] for f in FAMILIES} for i in range(min(len(v) for v in by.values()))]


def _state(r: dict | None) -> dict:
    """A row's figure for the page: its CE (the last test CE of the run; a finished run's final one), whether it
    is final, and for a run still training how far it has got."""
    if r is None:
        return dict(ce=None, final=False, where="not run", fell=None)
    done = [v for v in r["shards"] if v is not None]
    final = not r["partial"] and r.get("finished", True) and bool(done)
    ce = done[-1] if final else (r.get("loss") if r.get("loss") is not None else (done[-1] if done else None))
    where = "" if final else f"training: {len(done)} of {len(r['shards'])} shards done" + \
        (f", step {r['steps']:,}" if r.get("steps") else "")
    fell = done[-2] - done[-1] if final and len(done) == len(r["shards"]) > 1 else None   # over the last shard
    return dict(ce=ce, final=final, where=where, fell=fell)


def _cell(name: str, s: dict) -> str:
    if s["ce"] is None:
        return f"{name}: ... ({s['where']})"
    fig = f"{s['ce']:.4f} ({s['ce'] / LN2:.3f})"
    return f"{name}: {fig}" if s["final"] else f"{name}: {fig}, {s['where']}"


def sizes(rows: list[dict]) -> list[dict]:
    """Per size: {family: (preset, _state)}, the trainable counts, and the order (None while a row is not final)."""
    chosen = {r["name"]: r for r in preset_rows(rows)}
    out = []
    for names in table1():
        st = {f: (n, _state(chosen.get(n))) for f, n in names.items()}
        final = all(s["final"] for _, s in st.values())
        order = sorted(FAMILIES, key=lambda f: st[f][1]["ce"]) if final else None
        out.append(dict(states=st, trainable={f: chosen[n]["trainable"] if n in chosen else PRESETS[n][2]
                                              for f, n in names.items()}, order=order))
    return out


def _order_words(size: dict) -> str:
    if size["order"] is None:
        open_ = [FAMILIES[f] for f, (_, s) in size["states"].items() if not s["final"]]
        return f"open ({', '.join(open_)} not final)"
    parts = [FAMILIES[size["order"][0]]] + [f"{'≈' if gap < TIE else '<'} {FAMILIES[hi]}" for _, hi, gap in
                                            _gaps(size)]
    return " ".join(parts)


def _gaps(size: dict) -> list[tuple[str, str, float]]:
    """A final size's neighbours in its order, lowest CE first: (family, next family, CE difference)."""
    ces = [size["states"][f][1]["ce"] for f in size["order"]]
    return [(lo, hi, b - a) for lo, hi, a, b in zip(size["order"], size["order"][1:], ces, ces[1:])]


def _close(table: list[dict]) -> list[str]:
    """The pairs of final rows closer than TIE, size by size (the order column marks them ≈)."""
    close = []
    for i, size in enumerate(table, 1):
        if size["order"] is None:
            continue
        close += [f"size {i}, {FAMILIES[lo]} and {FAMILIES[hi]} ({gap:.4f} apart)" for lo, hi, gap in _gaps(size)
                  if gap < TIE]
    return [f"- Closer than {TIE} nats, about one seed-to-seed standard deviation where reslm measured one (every "
            f"row here is one seed), so not resolved: {'; '.join(close)}. The table marks them ≈; the pair counts "
            "below still count them by their CE."] if close else []


def ordering_md(rows: list[dict]) -> str:
    """The page (module doc) from the paper-protocol rows (reslm.report.rows.published_rows and legacy_rows)."""
    table = sizes(rows)
    L = ["# The paper's ordering, size by size", "",
         "Generated by `reslm report` from the README's results rows (results/ and results/legacy.csv): at each of "
         "Table 1's five sizes, the classic reservoir (RC), the attention-enhanced reservoir (AERC) and the "
         f"transformer (TF) at the paper's protocol (one pass of its recipe: {PAPER_SAMPLING}, {PAPER_OPTIMISER}, "
         "each character predicted from its 32-character window; a reservoir's stream figure stands for "
         "the window one where both were measured and agree). Each cell is the preset's test CE in nats and, in "
         "brackets, bits per character. A row still training shows its latest figure on the whole test shard and "
         "how far it has got; its size's order stays open until it finishes.", "",
         "| size | RC (nats (bits/char)) | AERC | TF | order in reslm (lowest CE first) |", "|---|---|---|---|---|"]
    for i, size in enumerate(table, 1):
        cells = [_cell(*size["states"][f]) for f in FAMILIES]
        span = sorted(size["trainable"].values())
        L.append(f"| {i}: {span[0]:,}-{span[-1]:,} | " + " | ".join(cells) + f" | {_order_words(size)} |")
    L += ["", *_spreads(rows), *_verdict(table), *_passes(rows), *_continuation(rows)]
    return "\n".join(L) + "\n"


def _continuation(rows: list[dict]) -> list[str]:
    """Plan continue-check: at each seed, the two-cycle run trained through beside the one continued from the
    seed's one-pass run with a fresh optimiser state, and whether continued rows may stand for runs trained
    through (reslm.report.rows.continuation_verdict)."""
    pairs = continuation_pairs(rows)
    L = ["", "## Continuing a one-pass row with a fresh optimiser state", "",
         "A published row keeps its weights, not Adam's moments, so a later pass can only continue it with a fresh "
         f"optimiser state (`reslm train --continue-from`). Plan continue-check measures what that costs: {CONTINUE_CHECK} "
         "over two passes, trained through and continued from the seed's one-pass run, at seeds 1 and 2 (test CE "
         "after pass 2, nats (bits/char)).", ""]
    if not pairs:
        return L + ["Not measured yet: `reslm frontier run continue-check`. Until it is, the tables above take only "
                    "runs trained through."]
    fig = lambda r: f"{r['loss']:.4f} ({r['loss'] / LN2:.3f})" if r else "training or not run"   # noqa: E731
    L += ["| seed | trained through | continued | continued - through |", "|---|---|---|---|"]
    for seed, p in pairs.items():
        diff = f"{p[True]['loss'] - p[False]['loss']:+.4f}" if len(p) == 2 else "-"
        L.append(f"| {seed} | {fig(p.get(False))} | {fig(p.get(True))} | {diff} |")
    ok, spread = continuation_verdict(rows)
    if ok is None:
        L += ["", "Not decided yet: both ways finished at two seeds decide it. Until then the tables above take only "
                  "runs trained through."]
    else:
        L += ["", f"The trained-through runs' seed spread (sample standard deviation): {spread:.4f} nats. " +
              ("Every continued run lands within it, so a continued row stands for one trained through in the "
               "tables above (its notes say it was continued)." if ok else
               "A continued run lands outside it, so the tables above take only runs trained through.")]
    return L


def spreads(rows: list[dict]) -> dict[str, tuple[float, float, list[int]]]:
    """Per preset with one-pass runs at two or more seeds (in the README row's context): (mean, sample
    standard deviation, the seeds) of their final test CE."""
    chosen = {r["name"]: r for r in preset_rows(rows)}
    out = {}
    for name, runs in seed_rows(rows).items():
        runs = [r for r in runs if name in chosen and r["context"] == chosen[name]["context"]]
        finals = [[v for v in r["shards"] if v is not None][-1] for r in runs]
        if len(finals) >= 2:
            out[name] = (statistics.mean(finals), statistics.stdev(finals), [r.get("seed", 0) for r in runs])
    return out


def _spreads(rows: list[dict]) -> list[str]:
    got = spreads(rows)
    if not got:
        return []
    parts = [f"{name} {m:.4f} ± {sd:.4f} nats ({m / LN2:.3f} ± {sd / LN2:.3f} bits/char) over seeds "
             f"{', '.join(map(str, seeds))}" for name, (m, sd, seeds) in got.items()]
    return [f"Seed spread, where measured (mean ± sample standard deviation of the final test CE of one-pass runs "
            f"that differ only in their seed): {'; '.join(parts)}. Every other row is one seed.", ""]


def _pass_cell(name: str, fig: tuple[float, bool] | None, run: dict | None) -> str:
    if fig is None:
        return f"{name}: ... ({'not run past one pass' if run is None else 'pass not begun'})"
    ce, complete = fig
    where = "" if complete else f", training (step {run['steps']:,})" if run and run.get("steps") else ", training"
    return f"{name}: {ce:.4f} ({ce / LN2:.3f}){where}"


def pass_table(rows: list[dict]) -> tuple[int, list[dict]]:
    """The most passes any preset's run has begun, and per size {family: (preset, {pass: (CE, complete)}, run)}:
    pass 1 the README's row (one pass), later passes its longest run's end-of-pass figures."""
    chosen = {r["name"]: r for r in preset_rows(rows)}
    longer = multi_pass_rows(rows)
    out, most = [], 1
    for names in table1():
        st = {}
        for f, n in names.items():
            figs = dict(pass_figures(longer[n])) if n in longer else {}
            s1 = _state(chosen.get(n))
            if s1["ce"] is not None:
                figs[1] = (s1["ce"], s1["final"])
            st[f] = (n, figs, longer.get(n))
            most = max(most, *figs) if figs else most
        out.append(st)
    return most, out


def _order_at(st: dict, p: int) -> list[str] | None:
    figs = {f: figs.get(p) for f, (_, figs, _) in st.items()}
    if any(v is None or not v[1] for v in figs.values()):
        return None
    return sorted(figs, key=lambda f: figs[f][0])


def _words(st: dict, order: list[str], p: int) -> str:
    ces = [st[f][1][p][0] for f in order]
    return FAMILIES[order[0]] + "".join(f" {'≈' if b - a < TIE else '<'} {FAMILIES[f]}"
                                        for f, a, b in zip(order[1:], ces, ces[1:]))


PAPER_ORDER = sorted(TEST_CE, key=TEST_CE.get)   # tf, aerc, rc


def _size_sentence(i: int, st: dict, most: int) -> str:
    """Where the paper's order holds at size i, from which pass on, and where not."""
    orders = {p: _order_at(st, p) for p in range(1, most + 1)}
    done = [p for p, o in orders.items() if o is not None]
    holds = [p for p in done if orders[p] == PAPER_ORDER]
    open_ = [p for p, o in orders.items() if o is None]
    if not done:
        return f"- Size {i}: no pass has all three rows final yet."
    last = done[-1]
    head = f"- Size {i}: after pass {last}, {_words(st, orders[last], last)}"
    if holds and holds == done[done.index(holds[0]):]:
        tail = (f"; the paper's order (TF < AERC < RC) holds from pass {holds[0]} on" if holds[0] > 1 else
                "; the paper's order (TF < AERC < RC) holds at every pass measured")
    elif holds:
        tail = f"; the paper's order holds at pass{'es' if len(holds) > 1 else ''} {', '.join(map(str, holds))} only"
    else:
        tf_lowest = [p for p in done if orders[p][0] == "tf"]
        tail = (f"; the paper's order holds at none of passes {done[0]}-{last}" if len(done) > 1 else
                f"; the paper's order does not hold after pass {last}") + \
            (f" (the transformer lowest at pass {', '.join(map(str, tf_lowest))})" if tf_lowest else "")
    more = f"; pass {', '.join(map(str, open_))} not complete for every family" if open_ else ""
    return head + tail + more + "."


def _passes(rows: list[dict]) -> list[str]:
    """The same five sizes after each pass the runs have reached: one table per pass, and a sentence per size."""
    most, table = pass_table(rows)
    if most < 2:
        return []
    L = ["", "## Past one pass", "",
         "The same protocol over more passes (cycles) over the five training shards: the longest published run "
         "of each preset at seed 0 (plans passes-tf, passes-rc, passes-aerc: three cycles, the whole test shard "
         "after every shard-epoch of the first pass and after every shard of the later ones); pass 1 is the "
         "table above. A cell still training shows its latest whole-test-shard figure.", ""]
    for p in range(2, most + 1):
        L += [f"After pass {p}:", "", "| size | RC | AERC | TF | order (lowest CE first) |", "|---|---|---|---|---|"]
        for i, st in enumerate(table, 1):
            order = _order_at(st, p)
            cells = [_pass_cell(n, figs.get(p), run) for n, figs, run in (st[f] for f in FAMILIES)]
            L.append(f"| {i} | " + " | ".join(cells) + f" | {_words(st, order, p) if order else 'open'} |")
        L.append("")
    L += [_size_sentence(i, st, most) for i, st in enumerate(table, 1)]
    return L


def _pairs(table: list[dict]) -> list[str]:
    """Each pair of families in the paper's order at its largest size (TF < AERC < RC): at how many sizes
    where both rows are final reslm has them in that order too."""
    paper = sorted(TEST_CE, key=TEST_CE.get)
    parts = []
    for i, lo in enumerate(paper):
        for hi in paper[i + 1:]:
            both = [(s["states"][lo][1], s["states"][hi][1]) for s in table]
            both = [(a["ce"], b["ce"]) for a, b in both if a["final"] and b["final"]]
            if both:
                parts.append(f"{FAMILIES[lo]} below {FAMILIES[hi]} at {sum(a < b for a, b in both)} of {len(both)}")
    return [f"- Pair by pair, in the paper's order, over the sizes where both rows are final: {'; '.join(parts)}."
            ] if parts else []


def _still_falling(table: list[dict]) -> list[str]:
    """How much each family's final rows still gained over the protocol's last shard (its 5 epochs)."""
    parts = []
    for f, label in FAMILIES.items():
        fell = sorted(s["states"][f][1]["fell"] for s in table if s["states"][f][1]["fell"] is not None)
        if fell:
            span = f"{fell[0]:.3f}" if len(fell) == 1 else f"{fell[0]:.3f} to {fell[-1]:.3f}"
            parts.append(f"{label} by {span} nats ({len(fell)} of {len(table)} sizes)")
    return [f"- Still falling at the end of the protocol: over its last shard (test CE after shard 4 against after "
            f"shard 5) the final rows' test CE fell, {'; '.join(parts)}. The paper does not say how many passes "
            "over the shards it ran; these rows are one pass."] if parts else []


def _verdict(table: list[dict]) -> list[str]:
    """Where reslm agrees with the paper and where it does not, from the table alone."""
    final = [s for s in table if s["order"] is not None]
    best = [i for i, s in enumerate(table, 1) if s["order"] and s["order"][0] == "tf"]
    L = ["## Against the paper", "",
         f"- Sizes with all three rows final: {len(final)} of {len(table)}"
         + (f"; the transformer is lowest at {len(best)} of them (size {', '.join(map(str, best))})" if best else
            ("; the transformer is lowest at none of them" if final else "")) + ". The paper: \"the Transformer "
         "achieves the best overall performance\"."]
    L += _close(table) + _pairs(table) + _still_falling(table)
    largest = table[-1]["states"] if table else {}
    paper = " < ".join(f"{FAMILIES[f]} {TEST_CE[f]:.2f}" for f in sorted(TEST_CE, key=TEST_CE.get))
    L.append(f"- The largest size, the one the paper gives numbers for: the paper's order is {paper} nats.")
    for f, (name, s) in largest.items():
        if name != LARGEST.get(f):
            continue
        if s["ce"] is None:
            L.append(f"  - {name}: not measured yet (the paper: {TEST_CE[f]:.2f})")
            continue
        L.append(f"  - {name}: {s['ce']:.4f} against the paper's {TEST_CE[f]:.2f}, {s['ce'] - TEST_CE[f]:+.3f} nats"
                 if s["final"] else f"  - {name}: still training ({s['where'][len('training: '):]}; latest "
                 f"{s['ce']:.4f}); the paper: {TEST_CE[f]:.2f}")
    L += ["", "The AERC gap at the largest size, measured: "
          "[paper-protocol.md](paper-protocol.md#the-gap-to-the-papers-aerc-figure-180-against-173). How the "
          "transformer rows train on a CPU: [window-step.md](window-step.md)."]
    return L
