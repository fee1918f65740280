"""The runs `reslm report` tabulates, read from the repository: the published runs under results/ (their
config, metrics, summary, manifest and provenance) and results/legacy.csv (runs measured before the
registry whose folders are gone, their per-shard-epoch curves in the docs/ CSVs each row names), and which of
them the README shows (preset_rows: one per Table 1 preset at the paper's protocol; ceiling_rows: the trained
networks under it).
"""
from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path

from reslm.core.errors import ReslmError
from reslm.core.files import read_json
from reslm.core.metrics import LN2, TEST_LOSS, VAL_LOSS
from reslm.models.identity import delta
from reslm.paper import LARGEST, PROTOCOL, TEST_CE
from reslm.run.registry import PROVENANCE, published_folders, read_manifest
from reslm.run import CONFIG, SUMMARY, read_metrics

LEGACY = "results/legacy.csv"
CONTINUE_CHECK = "tf-64-4-4"   # the preset plan continue-check trains through two cycles and continues
# the paper's character protocol (reslm.paper.PROTOCOL): what a run must have trained with to sit in its table
PAPER_TRAIN = {k: PROTOCOL[k] for k in ("optimizer", "lr", "batch_size", "epochs_per_shard", "epoch_samples",
                                         "shard_chars")}


def lr_words(lr: float) -> str:
    """A learning rate as the paper writes it: 1e-4."""
    mantissa, exponent = f"{lr:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


# the same protocol in the pages' words: its sampling, and its optimiser with the learning rate
PAPER_SAMPLING = f"{PROTOCOL['epochs_per_shard']} epochs on each full training shard, batch {PROTOCOL['batch_size']}"
PAPER_OPTIMISER = f"{PROTOCOL['optimizer'].capitalize()} {lr_words(PROTOCOL['lr'])}"


def whole_shard_final(tc: dict) -> bool:
    """Whether a run's last evaluation scored the whole test shard (eval_samples 0, or
    final_eval_samples 0 after evaluations on fewer positions along the way)."""
    final = tc.get("final_eval_samples", -1)
    return final == 0 or (final == -1 and tc.get("eval_samples", 0) == 0)
NOT_PUBLISHED = "weights not published"


# --- rows --------------------------------------------------------------------------------------------
def _paper(name: str, family: str) -> str:
    return f"{TEST_CE[family]:.2f}" if LARGEST.get(family) == name else "Fig. 2 only"


def _shard_ends(epochs: list[dict], cycle: int, shards: list[int], last_epoch: int) -> list[float | None]:
    """Test CE after the last epoch of each training shard of `cycle` (None where it has not run yet)."""
    ends = {e["shard"]: e.get(TEST_LOSS) for e in epochs if e["cycle"] == cycle and e["epoch"] == last_epoch}
    return [ends.get(s) for s in shards]


def _variant(cfg: dict) -> list[str]:
    """How a published run's model differs from its preset (or family) defaults (reslm.models.identity),
    with its seed, e.g. ["spectral_radius=1.1111", "seed=1"]; the context mode has a column of its own."""
    try:
        d = delta(cfg)["model"]
    except ReslmError:
        return []
    seed = (cfg.get("model") or {}).get("seed", 0)
    d = {**d, **({"seed": seed} if seed else {})}
    return [f"{k}={d[k]}" for k in sorted(d) if k != "context_mode"]


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
    for folder in published_folders(base):
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
                                 ("in progress", not m.get("finished")),
                                 ("continued from its published run's weights with a fresh optimiser state",
                                  bool(tc.get("continue_from"))),
                                 (f"per-shard CE on {tc.get('eval_samples', 0):,} test positions",
                                  tc.get("eval_samples", 0) != 0)) if on]
        wall = prov.get("wall", {})
        rows = [r for r in read_metrics(folder, "eval") if r.get("step", 0) > 0]
        link = f"results/{folder.name}"
        if "shard" not in (rows[0] if rows else {"shard": 0}):     # a token-level run: the other table
            other.append(dict(name=name, family=cfg["family"], trainable=trainable, folder=link, rows=rows,
                              finished=m.get("finished"), loss=rows[-1].get(VAL_LOSS) if rows else None,
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
        is_paper = (all(tc.get(k) == v for k, v in PAPER_TRAIN.items()) and tc.get("cycles", 1) >= 1
                    and whole_shard_final(tc))
        (paper if is_paper else other).append({**row, "folder": link, "finished": m.get("finished"),
                                              "variant": bool(_variant(cfg)),
                                              "sampled": bool(tc.get("eval_samples", 0)),
                                              # the last test CE (test_every shard: not every evaluation's)
                                              "loss": next((r[TEST_LOSS] for r in reversed(rows) if TEST_LOSS in r),
                                                           None),
                                              "steps": m.get("step"), "cycles": int(tc.get("cycles", 1)),
                                              "epochs_per_shard": int(tc.get("epochs_per_shard", 1)),
                                              "seed": int(model.get("seed", 0) or 0),
                                              "continued": bool(tc.get("continue_from")),
                                              "seed_only": _variant(cfg) == [f"seed={model.get('seed', 0)}"]})
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
    # a published run replaces the legacy row of its preset and context, unless it is a variant or has not
    # yet got as far (fewer evaluations than the legacy curve: both rows stay)
    have = {(r["name"], r["context"]): len(r["epochs"]) for r in published if not r.get("variant")}
    curves: dict[str, list[dict]] = {}
    out = []
    for r in _read_csv(path):
        if r["curve"] not in curves:
            curves[r["curve"]] = [{k: (v if k in ("family", "name") else _num(v)) for k, v in row.items()}
                                  for row in _read_csv(repo / r["curve"])]
        cycle = int(r["cycle"])
        epochs = [e for e in curves[r["curve"]] if e["name"] == r["preset"]]
        if not epochs:
            raise ReslmError(f"{path}: {r['preset']} has no rows in {r['curve']}")
        if have.get((r["preset"], r["context_mode"]), -1) >= len(epochs):
            continue
        shards = sorted({e["shard"] for e in curves[r["curve"]]})   # every run's: a partial run has fewer
        last_epoch = max(e["epoch"] for e in epochs)
        notes = [n for n in (f"{r['state_dtype']} states" if r["state_dtype"] not in ("", "float32") else "",
                             r["note"]) if n]
        out.append(_row(name=r["preset"], family=r["family"], trainable=int(r["trainable_params"]),
                        context=r["context_mode"], cycle=cycle, shards=_shard_ends(epochs, cycle - 1, shards, last_epoch),
                        epochs=epochs, train_s=_num(r["train_seconds"]), reservoir_s=_num(r["reservoir_seconds"]),
                        cpu=r["cpu"], threads=_num(r["threads"]), notes=notes, weights=None))
    return out


# --- the README's rows -------------------------------------------------------------------------------
STREAM_TOLERANCE = 3e-4   # nats: how closely a family's stream figures must equal its window figures to stand for them


def _final(r: dict) -> float | None:
    done = [v for v in r["shards"] if v is not None]
    return done[-1] if done else None


def _unfinished(r: dict) -> bool:
    return r["partial"] or not r.get("finished", True)


def stream_stands_for_window(rows: list[dict]) -> set[str]:
    """The families whose stream figure is the paper's (window) figure, as measured: at least one preset has a
    finished one-pass row in both contexts, and every such pair agrees within STREAM_TOLERANCE."""
    finals: dict[tuple[str, str], dict[str, list[float]]] = {}
    for r in rows:
        if r["cycle"] == 1 and not r.get("variant") and not _unfinished(r):
            finals.setdefault((r["family"], r["name"]), {}).setdefault(r["context"], []).append(_final(r))
    agree: dict[str, list[bool]] = {}
    for (family, _), by in finals.items():
        agree.setdefault(family, [])
        agree[family] += [abs(w - s) <= STREAM_TOLERANCE for w in by.get("window", []) for s in by.get("stream", [])]
    return {family for family, pairs in agree.items() if pairs and all(pairs)}


def preset_rows(rows: list[dict]) -> list[dict]:
    """One row per preset of the paper's character families (reslm.paper.LARGEST), in the rows' order: its
    one-pass run at the paper's protocol (window context, or stream where stream_stands_for_window), the first of
    finished with weights (a window run before a stream one), finished without (results/legacy.csv), then
    unfinished (its latest figure). Variants, other contexts and cycles are in docs/results.md only."""
    stream_ok = stream_stands_for_window(rows)
    chosen: dict[str, tuple[tuple, int, dict]] = {}
    for i, r in enumerate(rows):
        if r.get("variant") or r["cycle"] != 1 or r["family"] not in LARGEST:
            continue
        if r["context"] != "window" and not (r["context"] == "stream" and r["family"] in stream_ok):
            continue
        rank = (_unfinished(r), r["weights"] is None, r["context"] != "window")
        if r["name"] not in chosen or rank < chosen[r["name"]][0]:
            chosen[r["name"]] = (rank, i, r)
    return [r for _, _, r in sorted(chosen.values(), key=lambda c: c[1])]


def _context_ok(r: dict, stream_ok: set[str]) -> bool:
    return r["context"] == "window" or (r["context"] == "stream" and r["family"] in stream_ok)


def pass_figures(r: dict) -> dict[int, tuple[float, bool]]:
    """A row's test CE at the end of each pass (cycle, from 1) it has begun: {pass: (CE, complete)}, complete
    when the pass's last shard-epoch was scored, else its latest whole-test-shard figure."""
    last_epoch = r.get("epochs_per_shard", 1 + max((e["epoch"] for e in r["epochs"]), default=0)) - 1
    shards = len(r["shards"]) - 1
    out: dict[int, tuple[float, bool]] = {}
    for e in sorted(r["epochs"], key=lambda e: e["index"]):
        if e.get(TEST_LOSS) is not None:
            out[e["cycle"] + 1] = (e[TEST_LOSS], e["epoch"] == last_epoch and e["shard"] == shards)
    return out


def continuation_pairs(rows: list[dict]) -> dict[int, dict[bool, dict]]:
    """Plan continue-check's finished runs by seed: {seed: {False: the two-cycle run trained through, True: the
    one continued from the seed's one-pass run with a fresh optimiser state}}, each where published."""
    out: dict[int, dict[bool, dict]] = {}
    for r in rows:
        if (r["name"] == CONTINUE_CHECK and r.get("cycles") == 2 and not _unfinished(r) and r["context"] == "window"
                and (not r.get("variant") or r.get("seed_only"))):
            out.setdefault(r.get("seed", 0), {}).setdefault(bool(r.get("continued")), r)
    return dict(sorted(out.items()))


def continuation_verdict(rows: list[dict]) -> tuple[bool | None, float | None]:
    """(whether a continued run lands within the seed spread of the runs trained through: at every seed of
    plan continue-check its final test CE is within one sample standard deviation of the trained-through runs'
    final test CE over those seeds; None until both ways are finished at two seeds, that standard deviation)."""
    both = [p for p in continuation_pairs(rows).values() if len(p) == 2]
    if len(both) < 2:
        return None, None
    spread = statistics.stdev(p[False]["loss"] for p in both)
    return all(abs(p[True]["loss"] - p[False]["loss"]) <= spread for p in both), spread


def multi_pass_rows(rows: list[dict]) -> dict[str, dict]:
    """Per preset of the paper's character families, its run at the paper's protocol over the most passes
    (more than one, seed 0, no variant; the context preset_rows allows; a continued one only where plan
    continue-check says a continuation lands within the seed spread): a finished one first, a window one before
    a stream one, one trained through before a continued one."""
    stream_ok = stream_stands_for_window(rows)
    continued_ok = continuation_verdict(rows)[0] is True
    chosen: dict[str, tuple[tuple, dict]] = {}
    for r in rows:
        if (r.get("variant") or r.get("cycles", 1) < 2 or r["family"] not in LARGEST or r["weights"] is None
                or not _context_ok(r, stream_ok) or (r.get("continued") and not continued_ok)):
            continue
        rank = (-r["cycles"], not r.get("finished", True), r["context"] != "window", bool(r.get("continued")))
        if r["name"] not in chosen or rank < chosen[r["name"]][0]:
            chosen[r["name"]] = (rank, r)
    return {name: r for name, (_, r) in chosen.items()}


def seed_rows(rows: list[dict]) -> dict[str, list[dict]]:
    """Per preset, its finished one-pass runs at the paper's protocol that differ from the README's row only
    in the seed (the seed-0 row first where there is one): the seed spread of its one-pass figure."""
    stream_ok = stream_stands_for_window(rows)
    out: dict[str, list[dict]] = {}
    for r in rows:
        if (r["family"] in LARGEST and r["cycle"] == 1 and r.get("cycles", 1) == 1 and not _unfinished(r)
                and _context_ok(r, stream_ok) and (not r.get("variant") or r.get("seed_only"))):
            out.setdefault(r["name"], []).append(r)
    return {k: sorted(v, key=lambda r: r.get("seed", 0)) for k, v in out.items()}


def ceiling_rows(rows: list[dict]) -> list[dict]:
    """The finished one-pass runs of the trained networks beyond the paper's families (rnn: GRU, LSTM), one
    per preset, in the rows' order: the ceilings the paper's comparison is read against."""
    out: dict[str, dict] = {}
    for r in rows:
        if (r["family"] not in LARGEST and not r.get("variant") and r["cycle"] == 1 and not _unfinished(r)
                and r["weights"]):
            out.setdefault(r["name"], r)
    return list(out.values())


def replace_between(text: str, begin: str, end: str, block: str, what: str, page: str = "README.md") -> str:
    """text with the part between the markers `begin` and `end` replaced by `block` (README.md's
    generated tables, a docs page's generated section); ReslmError naming `what` when the markers are missing."""
    a, b = text.find(begin), text.find(end)
    if a < 0 or b < a:
        raise ReslmError(f"{page} has no {begin} ... {end} markers around its {what}")
    return text[:a + len(begin)] + "\n" + block + "\n" + text[b:]

