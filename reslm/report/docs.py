"""The repository's results as documents (`reslm report`): every results table and figure, from data only.

Reads (paths relative to the repository root):
    results/NAME/         published runs (reslm.run.registry): config, metrics, summary, manifest, provenance
    results/legacy.csv    runs measured before the registry whose folders are gone: one row per run and
                          cycle (wall times, CPU, threads), its per-shard-epoch curve in the docs/ CSV it
                          names; shown as "weights not published" until a published run replaces it
    results/bench/bench-*.json   `reslm bench --json` results; results/bench/bench-cpus.csv names the CPU
                          of a file the bench wrote before it recorded one ("x86_64")
Writes (the tables: here; the rows: reslm.report.rows; the frontier page: reslm.report.frontier):
    docs/results.md       the paper-protocol table (per-shard test CE of the last cycle, bits/char, the
                          paper's figure, wall times, CPU of each row), other published runs, Fig. 2
    docs/results-fig2.png and .csv   Fig. 2 of the paper-protocol runs (reslm.report.figures.plot_char_losses)
    docs/speed.md         the bench tables, one row per JSON, each with its CPU
    docs/frontier.md and docs/frontier.png and .csv   the reservoir frontier
    docs/ordering.md      the paper's ordering (RC, AERC, TF) at each of Table 1's sizes (reslm.report.ordering)
    docs/token-scaling.md and .png, .csv   the token-level runs, fits and ablations (reslm.report.tokens); the
                          fits as data: results/token-scaling.json
    README.md             the table between README_BEGIN and README_END (one row per Table 1 preset, the ceilings
                          under it; every other row is in docs/results.md) and the token-level lines between
                          TOKENS_BEGIN and TOKENS_END (the rest is left as it is)

Every input is checked before a row is drawn from it (check_inputs): each published folder's files
against the sha256 in its manifest (an edited metrics.jsonl is a one-line error, never a silently
different table), no links or special files, and each curve that results/legacy.csv names is a
plain file inside the repository.

Same inputs, same bytes: nothing depends on the clock, the machine or the order of a directory listing,
and a file whose content would not change is not rewritten. `check=True` writes nothing and returns
the files that are out of date (a test and CI use it so that no published number drifts).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from reslm.core.errors import ReslmError
from reslm.core.files import atomic_write, plain_stat, read_json
from reslm.models import families
from reslm.models.budget import FRONTIER_BUDGET
from reslm.report import figures, plots
from reslm.report.frontier import FRONTIER, FRONTIER_FIG, KN_FILE, _references, frontier_md, frontier_points
from reslm.report.names import REGISTRY, registry_md, registry_rows
from reslm.report.gap import GAP_BEGIN, GAP_END, gap_md
from reslm.report.ordering import ORDERING, ordering_md, spreads
from reslm.report.rows import (LEGACY, NOT_PUBLISHED, PAPER_OPTIMISER, PAPER_SAMPLING, STREAM_TOLERANCE, _read_csv,
                               ceiling_rows, legacy_rows, multi_pass_rows, preset_rows, published_rows, replace_between)
from reslm.report.tokens import plot_tokens, token_outputs
from reslm.run.lock import writer_of
from reslm.run.registry import is_published, verify_published

README_BEGIN, README_END = "<!-- results:begin -->", "<!-- results:end -->"
TOKEN_FAMILIES = families("tokens")
BENCH = "results/bench"   # the bench JSON files and bench-cpus.csv
BENCH_CPUS = f"{BENCH}/bench-cpus.csv"
FIG = "results-fig2"
PROTOCOL_PAGE = "docs/paper-protocol.md"   # its transformer-gap section is generated (reslm.report.gap)


# --- tables --------------------------------------------------------------------------------------------
def _ce(v) -> str:
    return "..." if v is None else f"{v:.4f}"


def _secs(v) -> str:
    return "?" if v is None else f"{v:,.0f} s"


def _bits(r: dict) -> str:
    if r["bits"] is None:
        return "..."
    done = sum(v is not None for v in r["shards"])
    sampled = ", sampled" if r.get("sampled") else ""   # an unfinished run's CE on a sample of the test shard
    return f"{r['bits']:.3f}" + (f" after shard {done}{sampled}" if r["partial"] else "")


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


def _readme_link(r: dict) -> str:
    link = f"[{r['weights']}]({r['weights']})" if r["weights"] else "not published"
    return link + (" (in progress)" if r["weights"] and not r.get("finished", True) else "")


def readme_table(rows: list[dict]) -> str:
    """The README's results: one line per Table 1 preset at the paper's protocol (reslm.report.rows.preset_rows),
    its last test CE beside the paper's figure, bits/char and where its weights are; under it, one line of the
    trained ceilings (rows.ceiling_rows). Every other row is in docs/results.md."""
    L = ["| preset | trainable | context | test CE (nats) | paper | bits/char | weights |",
         "|---|---|---|---|---|---|---|"]
    for r in preset_rows(rows):
        done = [v for v in r["shards"] if v is not None]
        L.append(f"| {r['name']} | {r['trainable']:,} | {r['context']} | {_ce(done[-1] if done else None)} | "
                 f"{_paper_short(r['paper'])} | {_bits(r)} | {_readme_link(r)} |")
    ceilings = ceiling_rows(rows)
    if ceilings:
        L += ["", "Trained ceilings at the same protocol: " + "; ".join(
            f"[{r['name']}]({r['weights']}), {r['trainable']:,} trainable, {r['context']} context: "
            f"{r['shards'][-1]:.4f} nats ({_bits(r)} bits/char)" for r in ceilings) + "."]
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
    """(file name, bench JSON, CPU, note) of every results/bench/bench-*.json, by name."""
    cpus = {r["file"]: r for r in _read_csv(repo / BENCH_CPUS)} if (repo / BENCH_CPUS).is_file() else {}
    out = []
    for path in sorted((repo / BENCH).glob("bench-*.json")):
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
    L = ["# Speed", "", f"Generated by `reslm report` from the `reslm bench --json` results in {BENCH}/ "
         f"(`{BENCH}/bench-*.json`; the CPU of files written before the bench recorded it: `{BENCH_CPUS}`). "
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
        L.append(f"| [{name}](../{BENCH}/{name}) | {cpu} | {d.get('threads')} | {cell('750')} | {cell('2600')} | {bf} | "
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
    """Fig. 2 input, as in the paper one curve per Table 1 preset over the accumulated shard-epochs: its run over
    the most passes (multi_pass_rows, every cycle) once it has got further than the README's row, else the
    README's row's (preset_rows, its one pass), and the trained ceilings' (ceiling_rows), each with its context."""
    def reach(r: dict) -> int:
        return max((e["index"] for e in r["epochs"]), default=-1)

    out = []
    longer = multi_pass_rows(rows)
    further = [longer[r["name"]] if r["name"] in longer and reach(longer[r["name"]]) > reach(r) else r
               for r in preset_rows(rows)]
    for r in further + ceiling_rows(rows):
        epochs = r["epochs"] if r["weights"] else [e for e in r["epochs"] if e["cycle"] == r["cycle"] - 1]
        out.append(dict(family=r["family"], name=r["name"], context=r["context"], trainable_params=r["trainable"],
                        epochs=epochs))
    return out


def results_md(paper: list[dict], other: list[dict], fig: str | None) -> str:
    L = ["# Results", "",
         "Generated by `reslm report` from the published runs in `results/` and, for runs measured before the "
         "registry whose folders are gone, `results/legacy.csv` with their curves in docs/ CSVs "
         f"(\"{NOT_PUBLISHED}\"). Losses are test cross-entropies in nats per character on the whole test "
         "shard (bits/char = nats / ln 2). `reslm eval results/NAME` scores a published run again.", "",
         "## The paper's protocol", "",
         "Every sample's reservoir state from a zero state over its own 32 characters (window context) unless the "
         f"context column says stream; {PAPER_SAMPLING}, {PAPER_OPTIMISER}; the test CE "
         "after the last epoch of each shard of the row's cycle. The training wall time is the run's "
         "`train_seconds` (the readout's steps plus the training shards' reservoir states, in brackets); the test "
         "shard's states and scorings are not in it. Wall times from different CPUs or thread counts do not "
         "compare. The README shows one of these rows per Table 1 preset (`reslm.report.rows.preset_rows`): its "
         "one-pass run in window context, or in stream context where the family's stream figures equal its window "
         f"figures within {STREAM_TOLERANCE:g} nats at every preset measured in both; a finished run with weights "
         "first.", "", results_table(paper), ""]
    if fig:
        L += [f"![Fig. 2 at the paper's protocol]({fig}.png)", "",
              f"*Train (top) and test (bottom) loss after every shard-epoch of the README's rows (one run per "
              f"Table 1 preset, and the trained ceilings), one pass ([data]({fig}.csv); "
              f"`reslm.report.figures.plot_char_losses`).*", ""]
    if other:
        L += ["## Other published runs", "", other_table(other), ""]
    return "\n".join(L)


def replace_readme_table(text: str, table: str) -> str:
    """README text with the part between README_BEGIN and README_END replaced by `table`."""
    return replace_between(text, README_BEGIN, README_END, table, "results table")


def check_inputs(repo: Path) -> None:
    """ReslmError (one line) unless every input of the report is what reslm wrote: each published
    folder under results/ verifies against its manifest (reslm.run.registry.verify_published; one that a
    live process is training in place is named with its writer), no folder there is a link, and every
    curve results/legacy.csv names is a regular file inside the repository (a relative path without
    "..")."""
    repo = Path(repo)
    base = repo / "results"
    for folder in sorted(base.iterdir()) if base.is_dir() else []:
        if folder.name.startswith("."):   # a stopped publish's leftover (reslm.run.registry.published_folders)
            continue
        if folder.is_symlink():
            raise ReslmError(f"{folder} is a symbolic link: reslm report reads only real folders in results/")
        if folder.is_dir() and is_published(folder):
            try:
                verify_published(folder)
            except ReslmError:   # a run trained in place (train --out results/NAME --resume) changes under us
                writer = writer_of(folder)
                if writer:
                    raise ReslmError(f"{folder} is being trained in place by {writer}; run reslm report when "
                                     f"it has stopped") from None
                raise
            family = (read_json(folder / "config.json") or {}).get("family")
            if family not in families():
                raise ReslmError(f"{folder}: its config names an unknown model family {family!r} (known: "
                                 f"{', '.join(families())}): reslm report tabulates only runs it can load")
    legacy = repo / LEGACY
    if plain_stat(legacy) is None:
        return
    for i, row in enumerate(_read_csv(legacy), start=2):
        curve = row.get("curve") or ""
        parts = Path(curve).parts
        if not curve or Path(curve).is_absolute() or ".." in parts:
            raise ReslmError(f"{legacy} line {i} names curve {curve!r}: not a path inside the repository")
        for k in range(1, len(parts)):   # no folder on the way is a link out of the repository
            if (repo.joinpath(*parts[:k])).is_symlink():
                raise ReslmError(f"{legacy} line {i}: {'/'.join(parts[:k])} is a symbolic link")
        if plain_stat(repo / curve) is None:
            raise ReslmError(f"{legacy} line {i} names {curve}, which does not exist")


def build(repo: Path) -> tuple[dict[str, str], list[dict]]:
    """{relative path: text} of every text output, and the Fig. 2 input (after check_inputs)."""
    repo = Path(repo)
    check_inputs(repo)
    paper, other = published_rows(repo)
    other = [r for r in other if r["family"] not in TOKEN_FAMILIES]   # docs/token-scaling.md has those
    order = {"rc": 0, "aerc": 1, "tf": 2}
    paper = sorted(paper + legacy_rows(repo, paper),   # by family and size; a size's window row first
                   key=lambda r: (order.get(r["family"], 9), r["trainable"], r["context"] != "window", r["cycle"],
                                  r["weights"] or ""))
    kn = read_json(repo / KN_FILE)
    points = frontier_points(repo, paper)
    outputs = {"docs/results.md": results_md(paper, other, FIG if paper else None), "docs/speed.md": speed_md(repo),
               FRONTIER: frontier_md(points, kn, FRONTIER_FIG if points else None), ORDERING: ordering_md(paper)}
    protocol = repo / PROTOCOL_PAGE
    if protocol.is_file():
        outputs[PROTOCOL_PAGE] = replace_between(protocol.read_text(encoding="utf-8"), GAP_BEGIN, GAP_END,
                                                 gap_md(repo, paper, spreads(paper)), "transformer gap section",
                                                 page=PROTOCOL_PAGE)
    readme = repo / "README.md"
    if readme.is_file():
        outputs["README.md"] = replace_readme_table(readme.read_text(encoding="utf-8"), readme_table(paper))
    tokens, token_runs, token_fits = token_outputs(repo, outputs.get("README.md"))
    outputs.update(tokens)
    names = registry_rows(repo)
    outputs[REGISTRY] = registry_md(names)
    return outputs, dict(curves=_curves(paper), frontier=points, references=_references(kn),
                         token_rows=token_runs, token_fits=token_fits, names=names)


def report(repo: Path = Path("."), check: bool = False) -> list[str]:
    """Write (or with check=True, only compare) every output; returns the paths that changed (or would)."""
    repo = Path(repo)
    if not (repo / "results").is_dir():   # nothing to report from: write no empty pages into a stray folder
        raise ReslmError(f"{repo} has no results/ folder: run `reslm report` in the repository (or pass --repo)")
    outputs, figs = build(repo)
    for r in figs["names"]:
        if r["problem"]:
            print(f"reslm: note: results/{r['folder']}: {r['problem']} (see {REGISTRY})", file=sys.stderr)
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
    if figs["token_fits"] and not check:
        plt = figures._pyplot()
        if plt is not None:
            plot_tokens(plt, repo, figs["token_rows"], figs["token_fits"])
    if figs["frontier"] and not check:
        plots.plot_frontier([{k: p[k] for k in plots.FRONTIER_FIELDS} for p in figs["frontier"]], repo / "docs",
                              stem=FRONTIER_FIG, references=figs["references"], budget=FRONTIER_BUDGET)
    return changed

