"""Stage 8, the results as documents (`reslm report`): every results table and figure, from data only.

Reads (paths relative to the repository root):
    results/NAME/         published runs (reslm.registry): config, metrics, summary, manifest, provenance
    results/legacy.csv    runs measured before the registry whose folders are gone: one row per run and
                          cycle (wall times, CPU, threads), its per-shard-epoch curve in the docs/ CSV it
                          names; shown as "weights not published" until a published run replaces it
    docs/bench-*.json     `reslm bench --json` results; docs/bench-cpus.csv names the CPU of a file the
                          bench wrote before it recorded one ("x86_64")
Writes:
    docs/results.md       the paper-protocol table (per-shard test CE of the last cycle, bits/char, the
                          paper's figure, wall times, CPU of each row), other published runs, Fig. 2
    docs/results-fig2.png and .csv   Fig. 2 of the paper-protocol runs (reslm.figures.plot_char_losses)
    docs/speed.md         the bench tables, one row per JSON, each with its CPU
    README.md             the table between README_BEGIN and README_END (the rest is left as it is)

Same inputs, same bytes: nothing depends on the clock, the machine or the order of a directory listing,
and a file whose content would not change is not rewritten. `check=True` writes nothing and returns
the files that are out of date (a test and CI use it so that no published number drifts).
"""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from reslm import figures
from reslm.errors import ReslmError
from reslm.models import PRESETS, check_frontier_config, make_config
from reslm.models.budget import FRONTIER_BUDGET
from reslm.models.base import LN2, config_dict
from reslm.registry import PROVENANCE, is_published, read_manifest
from reslm.reproduce import LARGEST, PAPER
from reslm.files import atomic_write, read_json
from reslm.run import CONFIG, SUMMARY, read_metrics

README_BEGIN, README_END = "<!-- results:begin -->", "<!-- results:end -->"
LEGACY = "results/legacy.csv"
BENCH_CPUS = "docs/bench-cpus.csv"
FIG = "results-fig2"
FRONTIER, FRONTIER_FIG, KN_FILE = "docs/frontier.md", "frontier", "results/kneser-ney.json"
# the training fields a lab route may change, with the paper's values (what the frontier table lists)
PAPER_ROUTE = dict(optimizer="adam", lr=1e-4, schedule="constant", warmup_steps=0, hold_steps=0, cycles=1, ema=0.0,
                   weight_decay=0.0, grad_clip=0.0, batch_size=1024, epochs_per_shard=5, state_dtype="float32")
# the paper's character protocol ("Training"): what a run must have trained with to sit in its table
PAPER_TRAIN = dict(optimizer="adam", lr=1e-4, batch_size=1024, epochs_per_shard=5, epoch_samples=0, shard_chars=0,
                   eval_samples=0)
NOT_PUBLISHED = "weights not published"


# --- rows --------------------------------------------------------------------------------------------
def _paper(name: str, family: str) -> str:
    return f"{PAPER['test_ce'][family]:.2f}" if LARGEST.get(family) == name else "Fig. 2 only"


def _shard_ends(epochs: list[dict], cycle: int, shards: list[int], last_epoch: int) -> list[float | None]:
    """Test CE after the last epoch of each training shard of `cycle` (None where it has not run yet)."""
    ends = {e["shard"]: e["test_loss"] for e in epochs if e["cycle"] == cycle and e["epoch"] == last_epoch}
    return [ends.get(s) for s in shards]


def _variant(cfg: dict) -> list[str]:
    """How a published run's model differs from its preset (or family) defaults, e.g.
    ["spectral_radius=1.1111", "seed=1"]; the context mode has a column of its own."""
    fam, preset = cfg["family"], cfg.get("preset")
    try:
        base = config_dict(make_config(fam, **(PRESETS[preset][1] if preset in PRESETS else {})))
    except ReslmError:
        return []
    have = cfg.get("model", {})
    return [f"{k}={have[k]}" for k in sorted(have) if k != "context_mode" and k in base and have[k] != base[k]]


def _last_cycle(rows: list[dict], last_epoch: int) -> int:
    """The last cycle with at least one finished training shard (an unfinished run shows the cycle it
    has results for, not an empty one it has just begun)."""
    done = [r["cycle"] for r in rows if r.get("epoch") == last_epoch]
    return max(done, default=0)


def _row(*, name, family, trainable, context, cycle, shards, epochs, train_s, reservoir_s, cpu, threads, notes,
         weights) -> dict:
    """One row of the paper-protocol table; `shards`: test CE after each training shard of `cycle`."""
    done = [v for v in shards if v is not None]
    final = done[-1] / LN2 if done else None
    partial = len(done) < len(shards)
    return dict(name=name, family=family, trainable=int(trainable), context=context, cycle=cycle, shards=shards,
                bits=final, partial=partial, paper=_paper(name, family), train_seconds=train_s,
                reservoir_seconds=reservoir_s, cpu=cpu, threads=threads, notes=notes, weights=weights,
                epochs=epochs)


def published_rows(repo: Path) -> tuple[list[dict], list[dict]]:
    """(paper-protocol rows, other rows) of the published runs under repo/results, by folder name."""
    paper, other = [], []
    base = repo / "results"
    for folder in sorted(p for p in base.iterdir() if p.is_dir() and is_published(p)) if base.is_dir() else []:
        m = read_manifest(folder)
        cfg = read_json(folder / CONFIG) or {}
        prov = read_json(folder / PROVENANCE) or {}
        summary = read_json(folder / SUMMARY) or {}
        if not cfg:
            raise ReslmError(f"{folder} has no readable {CONFIG}")
        tc, model = cfg["train"], cfg["model"]
        trainable = sum(math.prod(t["shape"]) for t in m.get("trainable", {}).values())
        name = cfg.get("preset") or folder.name
        notes = _variant(cfg) + [n for n, on in ((f"{tc.get('state_dtype')} states", tc.get("state_dtype") not in (None, "float32")),
                                 (tc.get("precision", "auto"), tc.get("precision", "auto") not in ("auto", "fp32")),
                                 ("in progress", not m.get("finished"))) if on]
        wall = prov.get("wall", {})
        rows = [r for r in read_metrics(folder) if r.get("kind") == "eval" and r.get("step", 0) > 0]
        link = f"results/{folder.name}"
        if "shard" not in (rows[0] if rows else {"shard": 0}):     # a token-level run: the other table
            other.append(dict(name=name, family=cfg["family"], trainable=trainable, folder=link, rows=rows,
                              finished=m.get("finished"), loss=rows[-1].get("val_loss") if rows else None,
                              steps=m.get("step"), cpu=prov.get("cpu", "?"), train_seconds=wall.get("train_seconds"),
                              notes=notes))
            continue
        shards = list(cfg["data"].get("train_shards", sorted({r["shard"] for r in rows})))
        cycle = _last_cycle(rows, tc.get("epochs_per_shard", 1) - 1)
        row = _row(name=name, family=cfg["family"], trainable=trainable, context=model.get("context_mode", "window"),
                   cycle=cycle + 1, shards=_shard_ends(rows, cycle, shards, tc.get("epochs_per_shard", 1) - 1),
                   epochs=rows, train_s=summary.get("train_seconds") or wall.get("train_seconds"),
                   reservoir_s=wall.get("reservoir_seconds"), cpu=prov.get("cpu", "?"), threads=prov.get("threads"),
                   notes=notes, weights=link)
        is_paper = all(tc.get(k) == v for k, v in PAPER_TRAIN.items()) and tc.get("cycles", 1) >= 1
        (paper if is_paper else other).append({**row, "folder": link, "finished": m.get("finished"),
                                              "variant": bool(_variant(cfg)),
                                              "loss": rows[-1]["test_loss"] if rows else None,
                                              "steps": m.get("step")})
    return paper, other


def _read_csv(path: Path) -> list[dict]:
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    except OSError as e:
        raise ReslmError(f"cannot read {path}: {e.strerror or e}") from None


def _num(v: str):
    if v in ("", None):
        return None
    x = float(v)
    return int(x) if x.is_integer() and "." not in v else x


def legacy_rows(repo: Path, published: list[dict]) -> list[dict]:
    """The rows of results/legacy.csv that no published run replaces (same preset as Table 1 defines it,
    same context mode),
    their per-shard CE read from the curve CSV each names."""
    path = repo / LEGACY
    if not path.is_file():
        return []
    have = {(r["name"], r["context"]) for r in published if not r.get("variant")}   # a variant replaces nothing
    curves: dict[str, list[dict]] = {}
    out = []
    for r in _read_csv(path):
        if (r["preset"], r["context_mode"]) in have:
            continue
        if r["curve"] not in curves:
            curves[r["curve"]] = [{k: (v if k in ("family", "name") else _num(v)) for k, v in row.items()}
                                  for row in _read_csv(repo / r["curve"])]
        cycle = int(r["cycle"])
        epochs = [e for e in curves[r["curve"]] if e["name"] == r["preset"]]
        if not epochs:
            raise ReslmError(f"{path}: {r['preset']} has no rows in {r['curve']}")
        shards = sorted({e["shard"] for e in curves[r["curve"]]})   # every run's: a partial run has fewer
        last_epoch = max(e["epoch"] for e in epochs)
        notes = [n for n in (f"{r['state_dtype']} states" if r["state_dtype"] not in ("", "float32") else "",
                             r["note"]) if n]
        out.append(_row(name=r["preset"], family=r["family"], trainable=int(r["trainable_params"]),
                        context=r["context_mode"], cycle=cycle, shards=_shard_ends(epochs, cycle - 1, shards, last_epoch),
                        epochs=epochs, train_s=_num(r["train_seconds"]), reservoir_s=_num(r["reservoir_seconds"]),
                        cpu=r["cpu"], threads=_num(r["threads"]), notes=notes, weights=None))
    return out


# --- tables --------------------------------------------------------------------------------------------
def _ce(v) -> str:
    return "..." if v is None else f"{v:.4f}"


def _secs(v) -> str:
    return "?" if v is None else f"{v:,.0f} s"


def _bits(r: dict) -> str:
    if r["bits"] is None:
        return "..."
    done = sum(v is not None for v in r["shards"])
    return f"{r['bits']:.3f}" + (f" after shard {done}" if r["partial"] else "")


def _weights(r: dict) -> str:
    return f"[{r['weights']}](../{r['weights']})" if r["weights"] else NOT_PUBLISHED


def results_table(rows: list[dict]) -> str:
    """docs/results.md's paper-protocol table."""
    n = max((len(r["shards"]) for r in rows), default=5)
    L = [f"| preset | family | trainable | context | cycle | test CE after shards {' / '.join(map(str, range(1, n + 1)))}"
         f" (nats) | final bits/char | paper | training wall time (reservoir states) | CPU, threads | notes | weights |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        res = f" ({_secs(r['reservoir_seconds'])})" if r["reservoir_seconds"] else ""
        L.append(f"| {r['name']} | {r['family']} | {r['trainable']:,} | {r['context']} | {r['cycle']} | "
                 f"{' / '.join(_ce(v) for v in r['shards'])} | {_bits(r)} | {r['paper']} | "
                 f"{_secs(r['train_seconds'])}{res} | {r['cpu']}, {r['threads'] or '?'} | "
                 f"{'; '.join(r['notes']) or ''} | {_weights(r)} |")
    return "\n".join(L)


def _paper_short(paper: str) -> str:
    """The paper's figure, or "-" where it gives none (only its largest model per family is a number)."""
    return "-" if paper == "Fig. 2 only" else paper


def readme_table(rows: list[dict]) -> str:
    """The README's results table: one line per paper-protocol run of a preset as Table 1 defines it
    (variants of a preset are in docs/results.md and docs/frontier.md), its last test CE, the paper's
    figure and where its weights are."""
    L = ["| preset | trainable | context | cycle | test CE (nats) | bits/char | paper | weights |",
         "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("variant"):
            continue
        done = [v for v in r["shards"] if v is not None]
        link = f"[{r['weights']}]({r['weights']})" if r["weights"] else "not published"
        if r["weights"] and not r.get("finished", True):
            link += " (in progress)"
        L.append(f"| {r['name']} | {r['trainable']:,} | {r['context']} | {r['cycle']} | "
                 f"{_ce(done[-1] if done else None)} | {_bits(r)} | {_paper_short(r['paper'])} | {link} |")
    return "\n".join(L)


def other_table(rows: list[dict]) -> str:
    L = ["| run | family | trainable | steps | finished | last test / val CE (nats) | training wall time | CPU | notes |",
         "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        L.append(f"| [{r['name']}](../{r['folder']}) | {r['family']} | {r['trainable']:,} | {r['steps'] or 0:,} | "
                 f"{'yes' if r['finished'] else 'no'} | {_ce(r['loss'])} | {_secs(r['train_seconds'])} | {r['cpu']} | "
                 f"{'; '.join(r['notes'])} |")
    return "\n".join(L)


# --- docs/speed.md -------------------------------------------------------------------------------------
def _bench_files(repo: Path) -> list[tuple[str, dict, str, str]]:
    """(file name, bench JSON, CPU, note) of every docs/bench-*.json, by name."""
    cpus = {r["file"]: r for r in _read_csv(repo / BENCH_CPUS)} if (repo / BENCH_CPUS).is_file() else {}
    out = []
    for path in sorted((repo / "docs").glob("bench-*.json")):
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ReslmError(f"cannot read {path}: {e}") from None
        known = cpus.get(path.name, {})
        name = d.get("device_name") or ""
        cpu = known.get("cpu") or (name if name not in ("", "x86_64", "aarch64", "cpu") else "unknown CPU")
        out.append((path.name, d, cpu, known.get("note", "")))
    return out


def _fmt(v, spec=",.0f") -> str:
    return "" if v is None else format(v, spec)


def speed_md(repo: Path) -> str:
    files = _bench_files(repo)
    L = ["# Speed", "", "Generated by `reslm report` from the `reslm bench --json` results in docs/ "
         "(`docs/bench-*.json`; the CPU of files written before the bench recorded it: `docs/bench-cpus.csv`). "
         "Figures from different CPUs, or from a noisy host, do not compare; every row names its own.", ""]
    L += ["## Reservoir recurrence against a plain GEMM of the same shape", "",
          "The reservoir step's speed as a fraction of GEMM's (1.0: the recurrence costs only its GEMM).", "",
          "| file | CPU | threads | N=750 fp32 (GEMM GFLOP/s) | N=2600 fp32 (GEMM GFLOP/s) | N=750 / 2600 bf16 | "
          "seconds | note |", "|---|---|---|---|---|---|---|---|"]
    for name, d, cpu, note in files:
        r, g, rb = d.get("reservoir_vs_gemm", {}), d.get("gemm_gflops", {}), d.get("reservoir_vs_gemm_bf16", {})
        if not r:
            continue
        cell = lambda n: f"{r[n]:.2f} ({g.get(n, 0):.0f})" if n in r else ""  # noqa: E731
        bf = " / ".join(_fmt(rb.get(n), ".2f") for n in ("750", "2600")) if rb else "skipped"
        L.append(f"| [{name}]({name}) | {cpu} | {d.get('threads')} | {cell('750')} | {cell('2600')} | {bf} | "
                 f"{_fmt(d.get('seconds'))} | {note} |")
    L += ["", "## Reservoir states, characters per second", "",
          "`model.features` over a shard: stream (one reservoir step per character) and window (32 steps per "
          "sample, the paper's context).", "",
          "| file | CPU | N | stream fp32 | window fp32 | stream bf16 | window bf16 |", "|---|---|---|---|---|---|---|"]
    for name, d, cpu, _ in files:
        fp, bf = d.get("reservoir_chars_per_s", {}), d.get("reservoir_chars_per_s_bf16", {})
        for n in sorted(fp, key=int):
            L.append(f"| {name} | {cpu} | {n} | {_fmt(fp[n].get('stream'))} | {_fmt(fp[n].get('window'))} | "
                     f"{_fmt(bf.get(n, {}).get('stream'))} | {_fmt(bf.get(n, {}).get('window'))} |")
    L += ["", "## Training against the authors' approach", "",
          "Samples/s per sample-epoch (RC/AERC: states computed once per shard and reused over its 5 epochs; "
          "head = the trainable part alone) and the speed-up over re-implementations of the authors' approach "
          "timed in the same run.", "",
          "| file | CPU | model | mode | samples/s | head samples/s | x authors | bf16 autocast x authors |",
          "|---|---|---|---|---|---|---|---|"]
    for name, d, cpu, _ in files:
        sp, bf = d.get("speedup_vs_authors", {}), d.get("speedup_vs_authors_bf16", {})
        for model, v in d.get("training_samples_per_s", {}).items():
            if isinstance(v, dict):
                for mode, figs in v.items():
                    L.append(f"| {name} | {cpu} | {model} | {mode} | {_fmt(figs.get('amortised'))} | "
                             f"{_fmt(figs.get('head'))} | {_fmt(sp.get(model, {}).get(mode), '.1f')} | |")
            else:
                L.append(f"| {name} | {cpu} | {model} | window | {_fmt(v)} | | {_fmt(sp.get(model), '.2f')} | "
                         f"{_fmt(bf.get(model), '.2f')} |")
    L += ["", "## Lab substrates, stream states", "", "| file | CPU | substrate | N | chars/s | vs the dense ESN |",
          "|---|---|---|---|---|---|"]
    for name, d, cpu, _ in files:
        for sub, v in d.get("substrate_chars_per_s", {}).items():
            L.append(f"| {name} | {cpu} | {sub} | {v.get('size')} | {_fmt(v.get('chars_per_s'))} | "
                     f"x{_fmt(v.get('vs_esn'), '.2f')} |")
    return "\n".join(L) + "\n"


# --- docs/results.md and README ----------------------------------------------------------------------
def _curves(rows: list[dict]) -> list[dict]:
    """Fig. 2 input: the first-cycle curve of each paper-protocol run (all of a published run's)."""
    out = []
    for r in rows:
        epochs = r["epochs"] if r["weights"] else [e for e in r["epochs"] if e["cycle"] == r["cycle"] - 1]
        if r["cycle"] == 1 or r["weights"]:
            out.append(dict(family=r["family"], name=r["name"], trainable_params=r["trainable"], epochs=epochs))
    return out


def results_md(paper: list[dict], other: list[dict], fig: str | None) -> str:
    L = ["# Results", "",
         "Generated by `reslm report` from the published runs in `results/` and, for runs measured before the "
         "registry whose folders are gone, `results/legacy.csv` with their curves in docs/ CSVs "
         f"(\"{NOT_PUBLISHED}\"). Losses are test cross-entropies in nats per character on the whole test "
         "shard (bits/char = nats / ln 2). `reslm eval results/NAME` scores a published run again.", "",
         "## The paper's protocol", "",
         "Every sample's reservoir state from a zero state over its own 32 characters (window context) unless the "
         "context column says stream; 5 epochs on each full training shard, batch 1024, Adam 1e-4; the test CE "
         "after the last epoch of each shard of the row's cycle. The training wall time is the run's "
         "`train_seconds` (the readout's steps plus the training shards' reservoir states, in brackets); the test "
         "shard's states and scorings are not in it. Wall times from different CPUs or thread counts do not "
         "compare.", "", results_table(paper), ""]
    if fig:
        L += [f"![Fig. 2 at the paper's protocol]({fig}.png)", "",
              f"*Train (top) and test (bottom) loss after every shard-epoch of the runs above, first cycle "
              f"([data]({fig}.csv); `reslm.figures.plot_char_losses`).*", ""]
    if other:
        L += ["## Other published runs", "", other_table(other), ""]
    return "\n".join(L)


# --- the frontier ---------------------------------------------------------------------------------
def _route(cfg: dict) -> list[str]:
    """What a run changed against the paper's protocol: its context mode, model variant, training fields."""
    tc, model = cfg["train"], cfg["model"]
    out = [f"{model['context_mode']} context"] if model.get("context_mode", "window") != "window" else []
    out += _variant(cfg)
    out += [f"{k}={tc[k]}" for k, v in PAPER_ROUTE.items() if k in tc and tc[k] != v and
            not (k == "warmup_steps" and tc.get("schedule") == "constant")]
    return out


def frontier_points(repo: Path, paper: list[dict]) -> list[dict]:
    """Every character run scored on the whole test shard: the published ones (with the strict-rules
    verdict and what they changed) and the legacy rows (the paper's protocol)."""
    base, pts = repo / "results", []
    for folder in sorted(p for p in base.iterdir() if p.is_dir() and is_published(p)) if base.is_dir() else []:
        cfg = read_json(folder / CONFIG) or {}
        if cfg.get("data", {}).get("kind", "chars") != "chars" or cfg["train"].get("eval_samples", 0) != 0:
            continue
        rows = [r for r in read_metrics(folder) if r.get("kind") == "eval" and r.get("test_loss") is not None]
        if not rows:
            continue
        verdict = check_frontier_config(cfg["family"], make_config(cfg["family"], **cfg["model"]))
        route = _route(cfg)
        pts.append(dict(family=cfg["family"], name=folder.name, trainable_params=verdict.trainable_params,
                        test_loss=rows[-1]["test_loss"], strict=verdict.ok, published=True,
                        source="lab" if route else "paper", route=route, finished=read_manifest(folder).get("finished"),
                        cycle=rows[-1]["cycle"] + 1, folder=f"results/{folder.name}"))
    for r in paper:
        done = [v for v in r["shards"] if v is not None]
        if r["weights"] or not done or r["partial"]:
            continue
        pts.append(dict(family=r["family"], name=f"{r['name']} ({r['context']}, cycle {r['cycle']})",
                        trainable_params=r["trainable"], test_loss=done[-1], strict=r["family"] in ("rc", "aerc"),
                        published=False, source="paper", route=[f"{r['context']} context"] if r["context"] != "window"
                        else [], finished=True, cycle=r["cycle"], folder=None))
    return sorted(pts, key=lambda p: (p["test_loss"], p["name"]))


def frontier_md(points: list[dict], kn: dict | None, fig: str | None) -> str:
    strict = [p for p in points if p["strict"] and p["trainable_params"] <= FRONTIER_BUDGET]
    best = strict[0] if strict else None
    L = ["# The reservoir frontier", "",
         "How good does a reservoir language model get at the paper's largest trainable budget? Generated by "
         "`reslm report` from `results/`; every number links to the published run it came from.", "",
         "## The rules", "",
         f"A run is a **strict reservoir-family** run (`reslm.models.budget.check_frontier`) when: the substrate is "
         "fixed and untrained (any registered reservoir, recorded ones included); every trained part reads only the "
         "substrate's current state, plus the current character's fixed embedding or one-hot; no gradient flows into "
         f"or through the substrate; and its trainable parameters, counted as Table 1 counts them, are at most "
         f"{FRONTIER_BUDGET:,} (aerc-160-30's). The score is the test CE on the whole test shard after the run's last "
         "shard-epoch; model selection (ridge's alpha, L-BFGS's penalty, `reslm search`) uses held-out slices of the "
         "training shards only. Fully trained networks (tf, rnn) are ceilings to read the reservoirs against.", "",
         "The lab budget: the paper's data and sampling (5 epochs on each full training shard, batch 1024), stream "
         "context (the state carried through the text; 1/32 of window context's reservoir steps), one cycle unless "
         "the row says otherwise.", ""]
    if best:
        L += [f"**Best strict reservoir-family run so far: [{best['name']}](../{best['folder']}) at "
              f"{best['test_loss']:.4f} nats ({best['test_loss'] / LN2:.3f} bits/char), {best['trainable_params']:,} "
              "trainable parameters.** Targets: 1.67 (the paper's transformer), moonshot 1.60." if best.get("folder")
              else f"**Best strict reservoir-family run so far: {best['name']} at {best['test_loss']:.4f} nats.**", ""]
    L += ["| run | family | trainable | strict | test CE (nats) | bits/char | cycle | what differs from the paper's "
          "protocol | weights |", "|---|---|---|---|---|---|---|---|---|"]
    for p in points:
        link = f"[{p['folder']}](../{p['folder']})" + ("" if p["finished"] else " (in progress)") if p["folder"] \
            else NOT_PUBLISHED
        L.append(f"| {p['name']} | {p['family']} | {p['trainable_params']:,} | {'yes' if p['strict'] else 'no'} | "
                 f"{p['test_loss']:.4f} | {p['test_loss'] / LN2:.3f} | {p['cycle']} | {'; '.join(p['route']) or '-'} | "
                 f"{link} |")
    L += ["", "References: the paper's largest models (RC 1.81, AERC 1.73, transformer 1.67 nats)"]
    if kn:
        L[-1] += (f"; a Kneser-Ney character {kn['order']}-gram fitted on the five training shards, its order chosen "
                  f"on held-out training text: {kn['test_loss']:.4f} nats on the same test shard "
                  f"([data](../{KN_FILE}))")
    L[-1] += "."
    if fig:
        L += ["", f"![test CE against trainable parameters]({fig}.png)", "",
              f"*Test CE against trainable parameters, every run above ([data]({fig}.csv); "
              "`reslm.figures.plot_frontier`).*"]
    return "\n".join(L) + "\n"


def _references(kn: dict | None) -> dict:
    refs = {f"paper {short}: {PAPER['test_ce'][fam]}": (PRESETS[LARGEST[fam]][2], PAPER["test_ce"][fam])
            for fam, short in (("rc", "RC"), ("aerc", "AERC"), ("tf", "TF"))}
    if kn:
        refs[f"Kneser-Ney {kn['order']}-gram: {kn['test_loss']:.4f}"] = (None, kn["test_loss"])
    return refs


def replace_readme_table(text: str, table: str) -> str:
    """README text with the part between README_BEGIN and README_END replaced by `table`."""
    a, b = text.find(README_BEGIN), text.find(README_END)
    if a < 0 or b < a:
        raise ReslmError(f"README.md has no {README_BEGIN} ... {README_END} markers around its results table")
    return text[:a + len(README_BEGIN)] + "\n" + table + "\n" + text[b:]


def build(repo: Path) -> tuple[dict[str, str], list[dict]]:
    """{relative path: text} of every text output, and the Fig. 2 input."""
    repo = Path(repo)
    paper, other = published_rows(repo)
    order = {"rc": 0, "aerc": 1, "tf": 2}
    paper = sorted(paper + legacy_rows(repo, paper),   # by family and size; a size's window row first
                   key=lambda r: (order.get(r["family"], 9), r["trainable"], r["context"] != "window", r["cycle"],
                                  r["weights"] or ""))
    kn = read_json(repo / KN_FILE)
    points = frontier_points(repo, paper)
    outputs = {"docs/results.md": results_md(paper, other, FIG if paper else None), "docs/speed.md": speed_md(repo),
               FRONTIER: frontier_md(points, kn, FRONTIER_FIG if points else None)}
    readme = repo / "README.md"
    if readme.is_file():
        outputs["README.md"] = replace_readme_table(readme.read_text(encoding="utf-8"), readme_table(paper))
    return outputs, dict(curves=_curves(paper), frontier=points, references=_references(kn))


def report(repo: Path = Path("."), check: bool = False) -> list[str]:
    """Write (or with check=True, only compare) every output; returns the paths that changed (or would)."""
    repo = Path(repo)
    if not (repo / "results").is_dir():   # nothing to report from: write no empty pages into a stray folder
        raise ReslmError(f"{repo} has no results/ folder: run `reslm report` in the repository (or pass --repo)")
    outputs, figs = build(repo)
    curves = figs["curves"]
    changed = []
    for rel, text in outputs.items():
        path = repo / rel
        old = path.read_text(encoding="utf-8") if path.is_file() else None
        if old != text:
            changed.append(rel)
            if not check:
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(path, lambda p, t=text: p.write_text(t, encoding="utf-8"))
    if curves and not check:
        made = figures.plot_char_losses(curves, repo / "docs", stem=FIG)
        if made.get("note"):
            print(f"reslm: {made['note']}")
    if figs["frontier"] and not check:
        figures.plot_frontier([{k: p[k] for k in figures.FRONTIER_FIELDS} for p in figs["frontier"]], repo / "docs",
                              stem=FRONTIER_FIG, references=figs["references"], budget=FRONTIER_BUDGET)
    return changed


__all__ = ["report", "build", "README_BEGIN", "README_END", "replace_readme_table", "published_rows", "legacy_rows",
           "speed_md"]
