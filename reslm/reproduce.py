"""Stage 7, `reslm reproduce`: the paper's comparison, measured on this machine, as a report.

One command trains the 15 Table-1 presets (rc, aerc, tf) on the character corpus and the LAERC / GPT
size families on a BPE corpus, evaluates every run (`reslm.evaluate.evaluate_run`: test CE, a
closed-loop sample, Overlap-n, timings with the reservoir's share apart), fits a character-level
Kneser-Ney baseline, draws the paper's figures and writes a report::

    OUT/runs/<preset>/            character runs (reslm.run layout) + eval.json
    OUT/tokens/<family>-d<D>-l<L>/   LAERC / GPT runs (reslm.sweep layout) + eval.json
    OUT/ngram.json                the Kneser-Ney baseline: order chosen on held-out training text
    OUT/figures/                  fig2_losses, fig3_overlap, fig4_time, fig6_token_loss, scaling (Fig. 7):
                                  each a PNG and the CSV it was drawn from
    OUT/results.json              every number of the report
    OUT/report.md                 paper vs. this run, per-preset table, samples, environment, budget

Budgets (BUDGETS): `smoke` draws every figure from tiny training (minutes; a test runs it), `quick`
gives meaningful numbers in well under an hour on 2 CPU cores, `paper` is the paper's protocol (hours
on a CPU; meant for a GPU). Re-running the same command skips finished runs, continues interrupted ones
from their checkpoints (`reslm train --resume`) and re-evaluates only runs whose eval.json is missing
or older than their checkpoint; a run whose folder was deleted is redone. Asking for a different
budget in an existing folder is refused rather than mixing budgets.
"""
from __future__ import annotations

import contextlib
import json
import math
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

import reslm
from reslm import figures
from reslm.device import cpu_name, pick_device, resolve_precision
from reslm.errors import ReslmError
from reslm.evaluate import EVAL_FILE, evaluate_run
from reslm.models import PRESETS, families
from reslm.models.base import bits
from reslm.ngram import KneserNey, NgramReference, distinct_n, select_order
from reslm.files import atomic_write, read_json, write_json
from reslm.run import CHECKPOINT, CONFIG, SUMMARY, check_output_folder, lock_run, read_metrics
from reslm.run.load import find_dataset
from reslm.sweep import run_sweep, write_scaling
from reslm.train import ensure_run, make_run_config, train

CHAR_FAMILIES = ("tf", "rc", "aerc")          # the paper's order (MODELS holds the same names)
TOKEN_FAMILIES = families("tokens")
ALL_FAMILIES = CHAR_FAMILIES + TOKEN_FAMILIES
assert set(CHAR_FAMILIES) <= set(families("chars"))   # rnn: the frontier's ceiling, not in the paper
LARGEST = {"tf": "tf-256-16-16", "aerc": "aerc-160-30", "rc": "rc-2600"}
PAPER = {"test_ce": {"tf": 1.67, "aerc": 1.73, "rc": 1.81}, "a_TF": -1.72, "a_Res": -0.81}
STATE_DTYPES = ("auto", "float32", "bfloat16")   # --state-dtype of the rc / aerc presets
FAMILY_NAMES = {"tf": "Transformer", "rc": "Reservoir (RC)", "aerc": "AERC", "laerc": "LAERC", "gpt": "GPT"}


@dataclass
class Budget:
    """Everything a budget fixes; `left_out` says what it drops from the paper's protocol."""
    name: str
    char_train: dict                       # TrainConfig overrides shared by the 15 presets
    token_sweep: str                       # a reslm.sweep.SWEEPS name
    reservoir_model: dict = field(default_factory=dict)  # model overrides of the rc / aerc presets
    reservoir_train: dict = field(default_factory=dict)  # training overrides of the rc / aerc presets
    token_train: dict = field(default_factory=dict)  # overrides of that sweep's training budget
    token_data: str = "shakespeare-bpe4096"
    gen_length: int = 2000                 # generated characters per char run (tokens: gen_length // 4)
    score: int = 65536                     # test positions scored per run (0: all)
    kn_orders: tuple = tuple(range(1, 11))
    cache_states: bool = False             # keep reservoir states on disk across interruptions (train())
    left_out: str = ""


BUDGETS = {
    "smoke": Budget(
        name="smoke",
        char_train=dict(epochs_per_shard=1, cycles=1, shard_chars=4096, epoch_samples=256, eval_samples=1024,
                        batch_size=128, lr=3e-3, log_every=1),
        token_sweep="smoke", token_train=dict(max_steps=12, context=64, batch_size=8, warmup_steps=2,
                                            eval_every=6, eval_batches=2, log_every=1),
        gen_length=300, score=2048, kn_orders=(1, 2, 3, 4, 5, 6),
        left_out="nearly all training: 256 samples per shard-epoch from the first 4,096 characters of each "
                 "shard, 1 epoch per shard (the paper: 5 epochs on each full shard); 12 LAERC/GPT steps at two "
                 "tiny sizes per family. "
                 "It checks that every stage runs and every figure is drawn; its numbers mean nothing."),
    "quick": Budget(
        name="quick",
        char_train=dict(epochs_per_shard=1, cycles=1, shard_chars=131072, epoch_samples=32768,
                        eval_samples=16384, batch_size=256, lr=1e-3, log_every=16),
        token_sweep="cpu",
        left_out="the first 131,072 characters of each training shard, 32,768 samples per shard-epoch, one "
                 "epoch per shard, batch 256 and lr 1e-3 (the paper: 5 epochs over each full shard, batch 1024, "
                 "lr 1e-4, i.e. ~40 M samples per model, ~250x more); test CE on 16,384 samples spread over the "
                 "test shard (the paper: all of it). LAERC/GPT: the `cpu` sweep (bpe:4096 Shakespeare, 300 "
                 "steps of 16x128 tokens) instead of GPT-2 tokens of OpenWebText."),
    "paper": Budget(
        name="paper",
        # the family defaults are the paper's protocol (5 epochs per full shard, batch 1024, Adam 1e-4,
        # the whole test shard); states stored in bfloat16 where float32 would not fit in memory
        char_train=dict(state_dtype="auto"),
        reservoir_model=dict(context_mode="window"),   # every sample's state from its own 32-char window
        token_sweep="paper", token_data="shakespeare-gpt2", gen_length=10000, score=0,
        cache_states=True,   # a shard's window states take hours at rc-1750/2600: never compute them twice
        left_out="the number of cycles over the five training shards, which the paper does not give (1 "
                 "here unless --cycles K). Otherwise the character protocol is the paper's: window "
                 "context (each sample's reservoir state from a zero state over its own 32 characters), "
                 "5 epochs per full shard, batch 1024, Adam 1e-4, the whole test shard; reservoir states "
                 "are stored in bfloat16 where float32 does not fit in memory (rc-2600 on 24 GiB). The "
                 "token-level sweep uses the paper's batch and context on GPT-2 tokens of Shakespeare unless "
                 "--token-data names an OpenWebText dataset (`reslm data bpe --corpus openwebtext --max-docs N`)."),
}


def _log(msg: str) -> None:
    print(f"reslm reproduce: {msg}", file=sys.stderr, flush=True)


def _parse_families(families) -> tuple[str, ...]:
    if isinstance(families, str):
        families = [f.strip() for f in families.split(",") if f.strip()]
    bad = [f for f in families if f not in ALL_FAMILIES]
    if bad or not families:
        raise ReslmError(f"unknown famil{'ies' if len(bad) > 1 else 'y'} {', '.join(bad) or '(none)'}: "
                         f"use a comma-separated subset of {','.join(ALL_FAMILIES)}")
    return tuple(f for f in ALL_FAMILIES if f in families)


# --- stage 1: character-level runs (the 15 presets) ---------------------------------------------
def _parse_presets(presets, families) -> tuple[str, ...] | None:
    """None (every Table-1 preset of the chosen families) or the named ones, checked."""
    if presets is None:
        return None
    if isinstance(presets, str):
        presets = [p.strip() for p in presets.split(",") if p.strip()]
    unknown = [p for p in presets if p not in PRESETS]
    if unknown or not presets:
        raise ReslmError(f"unknown preset {', '.join(unknown) or '(none)'}: see `reslm presets`")
    excluded = [p for p in presets if PRESETS[p][0] not in families]
    if excluded:
        raise ReslmError(f"preset {', '.join(excluded)} is not in --families {','.join(families)}")
    return tuple(presets)


def _char_runs(out: Path, budget: Budget, families, presets, dataset, device: str, progress: bool,
               evaluate, clock) -> list[Path]:
    """Train (or continue) each chosen preset and evaluate it as soon as it is trained, so that a
    reproduction interrupted later, hours into the next preset, keeps every finished run's evaluation."""
    train_over = dict(budget.char_train, device=device)
    res = ("rc", "aerc")
    plan = [(name, fam, {**model, **(budget.reservoir_model if fam in res else {})},
             {**train_over, **(budget.reservoir_train if fam in res else {})})
            for name, (fam, model, paper) in PRESETS.items()   # by default Table 1's, not the frontier's ceilings
            if fam in families and (name in presets if presets is not None else paper is not None)]
    for name, fam, model, over in plan:  # validate every config before the first run starts
        make_run_config(fam, model, over, dataset, preset=name)
    dirs = []
    for i, (name, fam, model, over) in enumerate(plan, 1):
        run = out / "runs" / name
        what = ensure_run(run, fam, model, over, dataset, preset=name)
        _log(f"[{i}/{len(plan)}] {name}: {what}")
        if what != "done":
            with clock("character training"):
                train(run, progress=progress, cache_states=budget.cache_states and fam in ("rc", "aerc"))
        with clock("evaluation"):
            evaluate(run)
        dirs.append(run)
    return dirs


# --- stage 2: LAERC / GPT ------------------------------------------------------------------------
def _token_runs(out: Path, budget: Budget, families, dataset, device: str, progress: bool) -> list[dict]:
    fams = [f for f in TOKEN_FAMILIES if f in families]
    if not fams:
        return []
    _log(f"LAERC / GPT sweep `{budget.token_sweep}` on {dataset.path.name}")
    return run_sweep(out / "tokens", dataset, budget.token_sweep, families=fams,
                     train_overrides=dict(budget.token_train, device=device), progress=progress)


# --- stage 3: evaluation -------------------------------------------------------------------------
def _evaluate(run: Path, settings: dict, reference, device: str) -> dict:
    have = read_json(run / EVAL_FILE)
    ck = run / CHECKPOINT
    fresh = have is not None and (run / EVAL_FILE).stat().st_mtime >= ck.stat().st_mtime
    if fresh and all(have.get("settings", {}).get(k) == v for k, v in settings.items()):
        return have
    _log(f"evaluating {run.name}")
    return evaluate_run(run, reference=reference, device=device, **_eval_kwargs(settings))


def _eval_kwargs(settings: dict) -> dict:
    return dict(length=settings["length"], score=settings["score"], temperature=settings["temperature"],
                seed=settings["seed"], ns=(7, 8))


# --- stage 4: the Kneser-Ney baseline ------------------------------------------------------------
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
                  test_loss=test_loss, test_bpc=bits(test_loss), discounts={str(k): v for k, v in model.discounts.items()},
                  overlap={str(n): reference.overlap(gen, n) for n in (7, 8)},
                  distinct={str(n): distinct_n(gen, n) for n in (7, 8)},
                  prompt=dataset.decode(test[:32]), sample=dataset.decode(gen), seconds=time.perf_counter() - t0)
    write_json(path, result)
    return result


# --- stage 5: figures ----------------------------------------------------------------------------
def _figures(out: Path, char_rows: list[dict], token_rows: list[dict], kn: dict | None) -> dict:
    fig_dir = out / "figures"
    made = {}
    if char_rows:
        made["fig2"] = figures.plot_char_losses(
            [dict(family=r["family"], name=r["preset"], trainable_params=r["trainable_params"],
                  epochs=r["epochs"], shards_per_cycle=r["shards_per_cycle"]) for r in char_rows], fig_dir)
        baselines = {f"Kneser-Ney order {kn['order']}": kn["overlap"]} if kn else None
        made["fig3"] = figures.plot_overlap(char_rows, fig_dir, baselines=baselines)
        made["fig4"] = figures.plot_times(
            [dict(family=r["family"], name=r["preset"], trainable_params=r["trainable_params"],
                  train_seconds=r["train_seconds"], infer_seconds=r["generation_trainable_seconds"],
                  reservoir_train_seconds=r["reservoir_train_seconds"],
                  reservoir_infer_seconds=r["generation_reservoir_seconds"]) for r in char_rows], fig_dir)
    if token_rows:
        made["fig6"] = figures.plot_token_curves(
            [dict(family=r["family"], name=r["name"], trainable_params=r["trainable_params"], steps=r["steps_rows"],
                  evals=r["eval_rows"]) for r in token_rows], fig_dir)
        made["fig7"] = write_scaling(fig_dir, token_rows)
    _matplotlib_note(made)
    return made


def _matplotlib_note(made: dict) -> str:
    """Say once on stderr when the figures are CSV only for lack of matplotlib (report.md says it too)."""
    note = figures.missing_matplotlib(made)
    if note:
        _log(note)
    return note


# --- the report ----------------------------------------------------------------------------------
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


def _f(x, fmt=".4f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _order(values: dict) -> str:
    return " < ".join(FAMILY_NAMES[f] for f in sorted(values, key=values.get))


def write_report(out: Path, results: dict) -> Path:
    b = results["budget"]
    chars, tokens, kn = results["char_runs"], results["token_runs"], results.get("kneser_ney")
    L = [f"# reslm reproduction: budget `{b['name']}`", "",
         f"Reproduces Köster & Uchida, *Reservoir Computing as a Language Model*, on this machine with "
         f"`{results['command']}`. Every number below was measured by this run; the paper's are quoted "
         f"for comparison. Losses are cross-entropies in nats (bits = nats / ln 2).", "",
         "## Paper vs. this run", "",
         "| quantity | paper | this run |", "|---|---|---|"]
    largest = {}
    for fam in CHAR_FAMILIES:
        row = next((r for r in chars if r["preset"] == LARGEST[fam]), None)
        if row:
            largest[fam] = row["test_loss"]
            L.append(f"| test CE, largest {FAMILY_NAMES[fam]} ({LARGEST[fam]}) | {PAPER['test_ce'][fam]:.2f} | "
                     f"{row['test_loss']:.4f} ({row['test_bpc']:.3f} bits/char) |")
    if len(largest) == 3:
        L.append(f"| ordering of the largest models (lowest CE first) | {_order(PAPER['test_ce'])} | "
                 f"{_order(largest)} |")
    for fam in CHAR_FAMILIES:
        row = next((r for r in chars if r["preset"] == LARGEST[fam]), None)
        if row:
            L.append(f"| Overlap-7 / Overlap-8, {LARGEST[fam]} | Fig. 3 (values not given in the text) | "
                     f"{_f(row['overlap']['7'], '.3f')} / {_f(row['overlap']['8'], '.3f')} |")
    fits = results.get("scaling_fits") or {}
    for fam, key in (("gpt", "a_TF"), ("laerc", "a_Res")):
        if fam in fits:
            f = fits[fam]
            L.append(f"| scaling slope a in L_min = a log10 N + b, {FAMILY_NAMES[fam]} | {PAPER[key]} | "
                     f"{f['a']:.3f} (b = {f['b']:.2f}, R² = {f['r2']:.3f}, {f['n']} sizes) |")
    if kn:
        L.append(f"| character Kneser-Ney baseline (order {kn['order']}, chosen on held-out training text), "
                 f"test CE on the whole test shard | not in the paper | {kn['test_loss']:.4f} "
                 f"({kn['test_bpc']:.3f} bits/char); Overlap-7/8 {_f(kn['overlap']['7'], '.3f')} / "
                 f"{_f(kn['overlap']['8'], '.3f')} |")
    L += ["", f"What this budget leaves out compared with the paper's protocol: {b['left_out']}", ""]
    if results.get("presets"):
        L += [f"Only these Table-1 presets were run (`--presets`): {', '.join(results['presets'])}.", ""]
    if chars:
        L += ["## Character-level runs (Table 1 presets)", "",
              "Test CE is the run's last evaluation (the training protocol's test set); Overlap-n compares the "
              "unique n-grams of a closed-loop sample with the test shard's. Times in seconds: `train` is the "
              "trainable part (the paper's figure), `reservoir` the digital reservoir's extra cost (states for "
              "training; reservoir steps while generating), `infer` the trainable part of generating "
              f"{results['eval_settings']['length']:,} characters at temperature "
              f"{results['eval_settings']['temperature']}.", "",
              "| preset | trainable | test CE | bits/char | Overlap-7 | Overlap-8 | distinct-8 | train s | "
              "reservoir train s | infer s | reservoir infer s |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in chars:
            L.append(f"| {r['preset']} | {r['trainable_params']:,} | {r['test_loss']:.4f} | {r['test_bpc']:.3f} | "
                     f"{_f(r['overlap']['7'], '.3f')} | {_f(r['overlap']['8'], '.3f')} | "
                     f"{_f(r['distinct']['8'], '.3f')} | {r['train_seconds']:.1f} | "
                     f"{r['reservoir_train_seconds']:.1f} | {r['generation_trainable_seconds']:.2f} | "
                     f"{r['generation_reservoir_seconds']:.2f} |")
        tf = results.get("time_fits") or {}
        if tf:
            L += ["", "Fits y = α log10(x) of time against trainable parameters (paper Fig. 4):", "",
                  "| family | α train | α infer | α train + reservoir | α infer + reservoir |", "|---|---|---|---|---|"]
            for fam, f in tf.items():
                L.append(f"| {FAMILY_NAMES.get(fam, fam)} | {_f(f.get('train'), '.3f')} | {_f(f.get('infer'), '.3f')} | "
                         f"{_f(f.get('train_total'), '.3f')} | {_f(f.get('infer_total'), '.3f')} |")
        L.append("")
    if tokens:
        L += ["## LAERC vs. GPT (token level)", "",
              f"Sweep `{b['token_sweep']}` on `{results['token_data']}`; every size trained with the same budget. "
              "Min train loss is the paper's L_min (the lowest logged training loss).", "",
              "| run | trainable | min train loss | final val loss | val CE (eval) | bits/char (eval) | train s |",
              "|---|---|---|---|---|---|---|"]
        for r in tokens:
            L.append(f"| {r['name']} | {r['trainable_params']:,} | {_f(r['min_train_loss'])} | "
                     f"{_f(r['final_val_loss'])} | {_f(r.get('test_loss'))} | {_f(r.get('test_bpc'), '.3f')} | "
                     f"{_f(r['train_seconds'], '.1f')} |")
        L.append("")
    L += ["## Figures", ""]
    if figures.missing_matplotlib(results["figures"]):
        L += [f"Note: {figures.NO_MATPLOTLIB}.", ""]
    titles = {"fig2": "Fig. 2: train and test loss over shard-epochs", "fig3": "Fig. 3: 7-gram and 8-gram overlap",
              "fig4": "Fig. 4: training and inference time", "fig6": "Fig. 6: LAERC and GPT training loss",
              "fig7": "Fig. 7: scaling of L_min with trainable parameters"}
    for key, fig in results["figures"].items():
        png, csv = fig.get("png"), fig.get("csv")
        if png:
            L += [f"![{titles[key]}](figures/{Path(png).name})", ""]
        L += [f"{titles[key]}: data in [figures/{Path(csv).name}](figures/{Path(csv).name})"
              + (f" ({fig['note']})" if fig.get("note") else ""), ""]
    L += ["## Samples", "", f"Closed-loop, temperature {results['eval_settings']['temperature']}, after the test "
          "text's first window (shown before the `|`); the largest size of each family.", ""]
    for fam in ALL_FAMILIES:
        pool = [r for r in chars + tokens if r["family"] == fam]
        if pool:
            r = max(pool, key=lambda r: r["trainable_params"])
            L += [f"**{FAMILY_NAMES[fam]}** ({r.get('preset') or r.get('name')}):", "", "```",
                  (r["prompt"] + "|" + r["sample"][:600]).strip("\n"), "```", ""]
    if kn:
        L += [f"**Kneser-Ney, order {kn['order']}**:", "", "```", (kn["prompt"] + "|" + kn["sample"][:600]).strip("\n"),
              "```", ""]
    env = results["environment"]
    L += ["## Environment", "",
          f"- device: {env['device']}" + (f" ({env['cpu']})" if env.get("cpu") else "") + f"; precision: {env['precision']}; torch {env['torch']}, python {env['python']}, "
          f"{env['threads']} CPU threads; {env['platform']}",
          f"- reslm {env['reslm']}, git commit {env['git']}",
          f"- seeds: every run uses training seed {env['seed']} (shuffling, dropout, reservoir and weight draws); "
          f"sampling seed {results['eval_settings']['seed']}",
          f"- budget `{b['name']}`: character training {json.dumps(b['char_train'])}; token sweep `{b['token_sweep']}` "
          f"with overrides {json.dumps(b['token_train'])}; rc/aerc model {json.dumps(b.get('reservoir_model', {}))}, "
          f"training {json.dumps(b.get('reservoir_train', {}))}",
          "- wall time of this invocation: " + ", ".join(f"{k} {v:.0f} s" for k, v in results["timings"].items()),
          "", "Finished runs are reused when the command is re-run, so a re-run's wall times cover only what it redid.",
          ""]
    path = out / "report.md"
    atomic_write(path, lambda tmp: tmp.write_text("\n".join(L), encoding="utf-8"))
    return path


# --- the command ---------------------------------------------------------------------------------
def reproduce(budget: str = "quick", families=ALL_FAMILIES, out: Path | None = None, data: str = "shakespeare",
              token_data: str | None = None, data_root: Path | None = None, device: str = "auto",
              progress: bool = True, command: str = "", cycles: int | None = None,
              context_mode: str | None = None, presets=None, state_dtype: str | None = None) -> dict:
    """Run the whole reproduction into `out` (see the module docstring); returns results.json's content.

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
    families = _parse_families(families)
    presets = _parse_presets(presets, families)
    out = Path(out) if out is not None else Path(f"reproduce-{budget}")
    char_ds = tok_ds = None
    if any(f in CHAR_FAMILIES for f in families):
        char_ds = find_dataset(data, "chars", data_root, prepare=True)
    if any(f in TOKEN_FAMILIES for f in families):
        tok_ds = find_dataset(token_data or bud.token_data, "tokens", data_root, prepare=True)
    check_output_folder(out, "budget.json", "a reproduction folder")   # never write into a user's folder
    with lock_run(out, create=True):  # one reproduction per folder at a time
        stamp = out / "budget.json"
        have = read_json(stamp)
        if have is not None and have.get("budget") != budget:
            raise ReslmError(f"{out} holds a `{have.get('budget')}` reproduction; use another --out for `{budget}`")
        write_json(stamp, dict(budget=budget))
        results = _stages(out, bud, families, presets, char_ds, tok_ds, device, progress)
        results["command"] = command or f"reslm reproduce --budget {budget}"
        write_json(out / "results.json", results)
        report = write_report(out, results)
    _log(f"wrote {report} ({results['timings']['total']:.0f} s)")
    return results


class _Clock:
    """Wall time per stage: `with clock("name"):` adds to clock.timings["name"]."""

    def __init__(self):
        self.timings, self.t0 = {}, time.perf_counter()

    @contextlib.contextmanager
    def __call__(self, name: str):
        t = time.perf_counter()
        yield
        self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - t


def _stages(out: Path, bud: Budget, families, presets, char_ds, tok_ds, device: str, progress: bool) -> dict:
    """Train, evaluate, Kneser-Ney, figures: everything results.json holds but the command line."""
    clock = _Clock()
    settings = dict(length=bud.gen_length, score=bud.score, temperature=1.0, seed=0)
    reference, char_dirs = None, []
    if char_ds is not None:
        reference = NgramReference(np.asarray(char_ds.shard(char_ds.test_shard), dtype=np.int64),
                                   base=char_ds.vocab_size)
        char_dirs = _char_runs(out, bud, families, presets, char_ds, device, progress,
                               lambda run: _evaluate(run, settings, reference, device), clock)
    with clock("token training"):
        sweep_rows = _token_runs(out, bud, families, tok_ds, device, progress) if tok_ds is not None else []
    with clock("evaluation"):   # the character runs' evaluations are read back (done after each run)
        char_rows = [_char_row(run, _evaluate(run, settings, reference, device)) for run in char_dirs]
        token_rows = _token_rows(out, bud, sweep_rows, tok_ds, settings, device)
    with clock("Kneser-Ney"):
        kn = _kneser_ney(out, bud, char_ds, reference, settings) if char_ds is not None else None
    with clock("figures"):
        figs = _figures(out, char_rows, token_rows, kn)
    clock.timings["total"] = time.perf_counter() - clock.t0
    dev = pick_device(device)
    return dict(
        budget=asdict(bud), families=list(families), presets=list(presets) if presets else None,
        data=str(char_ds.path) if char_ds else None, token_data=str(tok_ds.path) if tok_ds else None,
        eval_settings=settings,
        char_runs=[{k: v for k, v in r.items() if k != "epochs"} for r in char_rows],
        token_runs=[{k: v for k, v in r.items() if k not in ("steps_rows", "eval_rows")} for r in token_rows],
        kneser_ney=kn, scaling_fits=figs.get("fig7", {}).get("fits"), time_fits=figs.get("fig4", {}).get("fits"),
        figures={k: {kk: (str(vv) if isinstance(vv, Path) else vv) for kk, vv in v.items() if kk in ("png", "csv", "note")}
                 for k, v in figs.items()},
        paper=PAPER, timings=clock.timings,
        environment=dict(device=str(dev), cpu=cpu_name(), precision=resolve_precision("auto", dev), torch=torch.__version__,
                         python=platform.python_version(), threads=torch.get_num_threads(),
                         platform=platform.platform(), reslm=reslm.__version__, git=_git_commit(), seed=0))


def _char_row(run: Path, ev: dict) -> dict:
    summary = read_json(run / SUMMARY)
    cfg = read_json(run / CONFIG)
    epochs = [r for r in read_metrics(run) if r["kind"] == "eval"]
    return dict(ev, preset=cfg["preset"], name=cfg["preset"], family=cfg["family"], test_loss=summary["final_test_loss"],
                test_bpc=summary["final_test_bpc"], eval_chunk_loss=ev["test_loss"],
                train_seconds=summary["train_seconds"], reservoir_train_seconds=summary["reservoir_seconds"],
                epochs=epochs, shards_per_cycle=len(cfg["data"]["train_shards"]))


def _token_rows(out: Path, bud: Budget, sweep_rows: list[dict], tok_ds, settings: dict, device: str) -> list[dict]:
    if not sweep_rows:
        return []
    tok_ref = NgramReference(tok_ds.tokenizer().decode(np.asarray(tok_ds.val)))
    tok_settings = dict(settings, length=max(50, bud.gen_length // 4), score=bud.score // 4)
    rows = []
    for row in sweep_rows:
        run = out / "tokens" / row["name"]
        ev = _evaluate(run, tok_settings, tok_ref, device)
        metrics = read_metrics(run)
        rows.append(dict(row, test_loss=ev["test_loss"], test_bpc=ev["test_bpc"], overlap=ev["overlap"],
                         prompt=ev["prompt"], sample=ev["sample"],
                         steps_rows=[r for r in metrics if r["kind"] == "step"],
                         eval_rows=[r for r in metrics if r["kind"] == "eval"]))
    return rows


