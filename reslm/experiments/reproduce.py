"""`reslm reproduce`: the paper's comparison measured on this machine (the report: reslm.report).

One command trains the 15 Table-1 presets (rc, aerc, tf) on the character corpus and the LAERC / GPT
size families on a BPE corpus, evaluates every run (`reslm.scoring.evaluate.evaluate_run`: test CE, a
closed-loop sample, Overlap-n, timings with the reservoir's share apart) and fits a character-level
Kneser-Ney baseline::

    OUT/runs/<preset>/               character runs (reslm.run layout) + eval.json
    OUT/tokens/<family>-d<D>-l<L>/   LAERC / GPT runs + eval.json
    OUT/ngram.json                   the Kneser-Ney baseline: order chosen on held-out training text
    OUT/results.json                 every number measured; `reslm.report.write_reproduction` adds the
                                     figures' fits and draws OUT/figures/ and OUT/report.md from it

Budgets: plans.BUDGETS. Re-running the same command skips finished runs, continues interrupted ones
from their checkpoints and re-evaluates only runs whose eval.json is missing or older than their
checkpoint; a run whose folder was deleted is redone. Asking for a different budget in an existing
folder is refused rather than mixing budgets.
"""
from __future__ import annotations

import platform
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch

import reslm
from reslm.core.device import cpu_name, pick_device, resolve_precision
from reslm.core.errors import ReslmError
from reslm.experiments.plans import (ALL_FAMILIES, BUDGETS, CHAR_FAMILIES, STATE_DTYPES, TOKEN_FAMILIES, Budget,
                                     char_plan, parse_names, parse_presets, sweep_plan, sweep_rows)
from reslm.experiments.runner import Clock, evaluate_once, run_plan, stamped_folder
from reslm.core.files import read_json, write_json
from reslm.core.metrics import TEST_BPC, TEST_LOSS, bits, final_of
from reslm.ngram import KneserNey, NgramReference, distinct_n, select_order
from reslm.paper import PAPER
from reslm.run import CONFIG, SUMMARY
from reslm.data.datasets import find_dataset


def _log(msg: str) -> None:
    print(f"reslm reproduce: {msg}", file=sys.stderr, flush=True)


def reproduce_folder(budget: str) -> Path:
    """The folder a reproduction writes to when none is given: reproduce-BUDGET."""
    return Path(f"reproduce-{budget}")


def reproduce(budget: str = "quick", families=ALL_FAMILIES, out: Path | None = None, data: str = "shakespeare",
              token_data: str | None = None, data_root: Path | None = None, device: str = "auto",
              progress: bool = True, command: str = "", cycles: int | None = None,
              context_mode: str | None = None, presets=None, state_dtype: str | None = None) -> dict:
    """Train and evaluate the reproduction into `out` (module doc); returns results.json's content.

    cycles: passes over the training shards (default: the budget's, 1); context_mode: rc/aerc context
    mode instead of the budget's ("window" for the paper budget, "stream" otherwise); presets: only these
    Table-1 presets (a list or "name,name"; default all of the chosen character families); state_dtype:
    how rc/aerc store (and, where bf16 is fast, compute) their reservoir states: float32, bfloat16 or
    auto (float32 where it fits in memory), instead of the budget's."""
    if budget not in BUDGETS:
        raise ReslmError(f"unknown budget {budget!r} (use {', '.join(BUDGETS)})")
    bud = BUDGETS[budget]
    if cycles is not None:
        if not isinstance(cycles, int) or cycles < 1:
            raise ReslmError(f"--cycles must be a positive integer, got {cycles!r}")
        bud = replace(bud, char_train={**bud.char_train, "cycles": cycles})
    if context_mode is not None:
        bud = replace(bud, reservoir_model={**bud.reservoir_model, "context_mode": context_mode})
    if state_dtype is not None:
        if state_dtype not in STATE_DTYPES:
            raise ReslmError(f"--state-dtype must be one of {', '.join(STATE_DTYPES)}, got {state_dtype!r}")
        bud = replace(bud, reservoir_train={**bud.reservoir_train, "state_dtype": state_dtype})
    families = parse_names(families, ALL_FAMILIES, "family", "families")
    presets = parse_presets(presets, families)
    pick_device(device)   # every flag checked before the first run
    out = Path(out) if out is not None else reproduce_folder(budget)
    char_ds = tok_ds = None
    if any(f in CHAR_FAMILIES for f in families):
        char_ds = find_dataset(data, "chars", data_root, prepare=True)
    if any(f in TOKEN_FAMILIES for f in families):
        tok_ds = find_dataset(token_data or bud.token_data, "tokens", data_root, prepare=True)
    with stamped_folder(out, budget, "reproduction"):   # one reproduction per folder at a time
        results = measure(out, bud, families, presets, char_ds, tok_ds, device, progress)
        results["command"] = command or f"reslm reproduce --budget {budget}"
        write_json(out / "results.json", results)
    return results


def measure(out: Path, bud: Budget, families, presets, char_ds, tok_ds, device: str, progress: bool) -> dict:
    """Train, evaluate, Kneser-Ney: everything results.json holds but the command line and the figures'
    fits (which the report adds)."""
    clock = Clock()
    settings = dict(length=bud.gen_length, score=bud.score, temperature=1.0, seed=0)
    reference, char_dirs = None, []
    if char_ds is not None:
        reference = NgramReference(np.asarray(char_ds.shard(char_ds.test_shard), dtype=np.int64),
                                   base=char_ds.vocab_size)
        plan = char_plan(bud, families, presets, device)

        def evaluate(run: Path) -> None:   # as soon as a run is trained: an interruption later keeps it
            with clock("evaluation"):
                evaluate_once(run, settings, reference, device, say=_log)
            char_dirs.append(run)

        run_plan(out / "runs", plan, char_ds, progress=progress, say=_log, after=evaluate,
                 clock=lambda stage: clock("character training"))
    with clock("token training"):
        sweep_rows = _token_runs(out, bud, families, tok_ds, device, progress) if tok_ds is not None else []
    with clock("evaluation"):   # the character runs' evaluations are read back (done after each run)
        char_rows = [_char_row(run, evaluate_once(run, settings, reference, device, say=_log)) for run in char_dirs]
        token_rows = _token_rows(out, bud, sweep_rows, tok_ds, settings, device)
    with clock("Kneser-Ney"):
        kn = _kneser_ney(out, bud, char_ds, reference, settings) if char_ds is not None else None
    clock.timings["total"] = time.perf_counter() - clock.t0
    dev = pick_device(device)
    return dict(
        budget=asdict(bud), families=list(families), presets=list(presets) if presets else None,
        data=str(char_ds.path) if char_ds else None, token_data=str(tok_ds.path) if tok_ds else None,
        eval_settings=settings, char_runs=char_rows, token_runs=token_rows, kneser_ney=kn,
        scaling_fits=None, time_fits=None, figures={},   # the report's (reslm.report.write_reproduction)
        paper=PAPER, timings=clock.timings,
        environment=dict(device=str(dev), cpu=cpu_name(), precision=resolve_precision("auto", dev), torch=torch.__version__,
                         python=platform.python_version(), threads=torch.get_num_threads(),
                         platform=platform.platform(), reslm=reslm.__version__, git=_git_commit(), seed=0))


def _token_runs(out: Path, budget: Budget, families, dataset, device: str, progress: bool) -> list[dict]:
    fams = [f for f in TOKEN_FAMILIES if f in families]
    if not fams:
        return []
    _log(f"LAERC / GPT sweep `{budget.token_sweep}` on {dataset.path.name}")
    plan = sweep_plan(budget.token_sweep, fams, dict(budget.token_train, device=device))
    say = (lambda msg: print(msg, file=sys.stderr, flush=True)) if progress else None
    return sweep_rows(plan, run_plan(out / "tokens", plan, dataset, progress=progress, say=say, lock=True))


def _char_row(run: Path, ev: dict) -> dict:
    summary = read_json(run / SUMMARY)
    cfg = read_json(run / CONFIG)
    return dict(ev, preset=cfg["preset"], name=cfg["preset"], family=cfg["family"], **{TEST_LOSS: summary[final_of(TEST_LOSS)]},
                **{TEST_BPC: summary[final_of(TEST_BPC)]}, eval_chunk_loss=ev[TEST_LOSS],
                train_seconds=summary["train_seconds"], reservoir_train_seconds=summary["reservoir_seconds"],
                shards_per_cycle=len(cfg["data"]["train_shards"]))


def _token_rows(out: Path, bud: Budget, sweep_rows: list[dict], tok_ds, settings: dict, device: str) -> list[dict]:
    if not sweep_rows:
        return []
    tok_ref = NgramReference(tok_ds.tokenizer().decode(np.asarray(tok_ds.val)))
    tok_settings = dict(settings, length=max(50, bud.gen_length // 4), score=bud.score // 4)
    rows = []
    for row in sweep_rows:
        ev = evaluate_once(out / "tokens" / row["name"], tok_settings, tok_ref, device, say=_log)
        rows.append(dict(row, **{TEST_LOSS: ev[TEST_LOSS], TEST_BPC: ev[TEST_BPC]}, overlap=ev["overlap"],
                         prompt=ev["prompt"], sample=ev["sample"]))
    return rows


def _kneser_ney(out: Path, budget: Budget, dataset, reference, settings: dict) -> dict:
    """Order chosen on the last 10% of the training text (fitted on the rest), then refitted on all
    training shards and scored on the whole test shard; a sample of gen_length characters."""
    path = out / "ngram.json"
    want = dict(orders=list(budget.kn_orders), heldout_fraction=0.1, data=str(dataset.path), sampler="pick",
                length=settings["length"], seed=settings["seed"], temperature=settings["temperature"])
    have = read_json(path)
    if have and have.get("settings") == want:
        return have
    _log(f"Kneser-Ney baseline: choosing the order among {list(budget.kn_orders)} on held-out training text")
    t0 = time.perf_counter()
    train = np.concatenate([np.asarray(dataset.shard(s), dtype=np.int64) for s in dataset.train_shards])
    test = np.asarray(dataset.shard(dataset.test_shard), dtype=np.int64)
    V = dataset.vocab_size
    orders = [k for k in budget.kn_orders if V ** k < 2 ** 63]
    cut = int(len(train) * 0.9)
    best, heldout = select_order(train[:cut], train[cut:], V, orders)
    model = KneserNey(best, V).fit(train)
    test_loss = model.cross_entropy(test)
    gen = model.sample(test[:32], settings["length"], seed=settings["seed"], temperature=settings["temperature"])
    result = dict(settings=want, order=best, heldout_ce={str(k): v for k, v in heldout.items()},
                  **{TEST_LOSS: test_loss, TEST_BPC: bits(test_loss)}, discounts={str(k): v for k, v in model.discounts.items()},
                  overlap={str(n): reference.overlap(gen, n) for n in (7, 8)},
                  distinct={str(n): distinct_n(gen, n) for n in (7, 8)},
                  prompt=dataset.decode(test[:32]), sample=dataset.decode(gen), seconds=time.perf_counter() - t0)
    write_json(path, result)
    return result


def _git_commit() -> str:
    try:
        r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).resolve().parent,
                           capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=Path(__file__).resolve().parent, capture_output=True, text=True, timeout=10)
        return (r.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")) \
            if r.returncode == 0 else "unknown (not a git checkout)"
    except (OSError, subprocess.SubprocessError):
        return "unknown (git not available)"
