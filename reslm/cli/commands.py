"""What each subcommand does: `cmd_<name>(args)` calls the library with the parsed flags."""
from __future__ import annotations

import contextlib
import json
import math
import os
import sys
from pathlib import Path

from reslm import data
from reslm.bench import format_summary, run_bench
from reslm.cli.flags import given
from reslm.data import bpe as data_bpe
from reslm.data import hf as data_hf
from reslm.core.device import pick_device
from reslm.core.errors import ReslmError
from reslm.evaluate import GRID_FILE, check_grid, eval_file_name, evaluate_run, physical_grid, score_check
from reslm.experiments import run_demo, run_lab, run_sweep
from reslm.experiments.reproduce import reproduce
from reslm.experiments.sweep import SWEEP_OUTPUTS
from reslm.generate import check_length, sample
from reslm.models import MODELS, preset, preset_table
from reslm.experiments.runner import evaluate_and_publish
from reslm.frontier import write_plans_page
from reslm.publish import publish, unpacked
from reslm.run.registry import is_published
from reslm.report import demo_text, report, write_lab, write_reproduction, write_scaling
from reslm.reservoir.physical import PhysicalConfig
from reslm.run import CHECKPOINT, CONFIG, check_runs_folder, drop_stale_evals, is_finished, lock_new_run, read_config
from reslm.data.datasets import data_kind, ensure_dataset, find_dataset
from reslm.models.load import load_run
from reslm.search import run_search
from reslm.recording import DRIVE_FILE, export_drive, import_states, simulate
from reslm.verify import record_check
from reslm.train import authors_variant, create_run, resume_run, sampler_for, train


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
    model_over = given(args, args._model_fields)
    train_over = given(args, args._train_fields)
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
        grown, train_over = resume_run(out, train_over)
        if grown:
            print(f"reslm: {out} goes on to {grown} cycles", file=sys.stderr)
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
    published = is_published(out)
    if not fresh and not published:
        drop_stale_evals(out)   # an evaluation of weights a killed resume already trained on
    with unpacked(out) if published else contextlib.nullcontext():   # results/NAME: published again after
        summary = train(out, progress=not args.no_progress, checkpoint_seconds=60 * args.checkpoint_minutes,
                        cache_states=args.cache_states)
    if published:   # and its check recorded for the weights it now holds (reslm verify)
        record_check(out)
    if not fresh and not published:
        drop_stale_evals(out)
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
    cfg = read_config(Path(args.run_dir))
    if data_kind(cfg["data"]) == "tokens":   # its tokenizer is the dataset's: built in a fresh clone, as eval does
        ensure_dataset(cfg)
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
    check_grid(physical)
    run = Path(args.run_dir)
    write = args.write if args.write is not None else not is_published(run)   # results/NAME: only read
    ensure_dataset(read_config(run))   # a fresh clone: the Shakespeare data is built, as train does
    if any(len(v) > 1 for v in physical.values()):   # a grid: test CE only, one reservoir pass
        r = physical_grid(run, physical, score=args.score, device=args.device, write=write)
        if args.json:
            print(json.dumps(r, indent=2))
        else:
            _print_grid(r)
        print(f"(written to {run / GRID_FILE}.json and .csv)" if write else
              f"(not written: {run} is a published run; add --write to record it there)", file=sys.stderr)
        return
    try:
        ns = tuple(int(n) for n in args.ngrams.split(","))
    except ValueError:
        raise ReslmError(f"--ngrams must be comma-separated integers, got {args.ngrams!r}") from None
    if not ns or min(ns) < 1:
        raise ReslmError("--ngrams must be positive integers")
    r = evaluate_run(run, length=args.length, ns=ns, score=args.score, temperature=args.temperature,
                     top_k=args.top_k, top_p=args.top_p, seed=args.seed, device=args.device,
                     physical={k: v[0] for k, v in physical.items()}, write=write)
    if args.json:
        print(json.dumps(r, indent=2))
        return
    unit = "token" if r["kind"] == "tokens" else "char"
    print(f"{r['run']}: {r['family']} {r.get('preset') or ''} ({r['trainable_params']:,} trainable parameters)")
    split = "val split" if unit == "token" else "test text"   # token datasets have train and val only
    print(f"{split.split()[0]} CE {r['test_loss']:.4f} nats/{unit} = {r['test_bits']:.3f} bits/{unit}"
          + (f" = {r['test_bpc']:.3f} bits/char" if unit == "token" else "")
          + f" over {r['score_positions']:,} positions "
          + (f"(the whole {split})" if args.score == 0 else f"(the start of the {split} only; --score 0 scores "
             "all of it, as the README's table does)")
          + f"; scored in {r['score_seconds']:.2f} s "
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
    print(f"(written to {run / eval_file_name(r)})" if write else
          f"(not written: {run} is a published run; add --write to record it there)", file=sys.stderr)


def cmd_publish(args):
    dest = Path(args.dest) if args.dest else Path(args.run_dir)
    run = Path(args.run_dir)
    finished = (run / CONFIG).is_file() and is_finished(run) and (run / CHECKPOINT).is_file()
    check = score_check(run) if finished and not (is_published(run) and dest.resolve() == run.resolve()) else None
    m = publish(run, dest, command=args.command, replace=args.replace, check=check)
    size = sum((dest / n).stat().st_size for n in m["files"])
    state = "finished" if m["finished"] else "in progress, with its checkpoint (continue it with `reslm train --out " \
        f"{dest} --resume`)"
    print(f"{dest}: {m['run']} at step {m['step']:,}, {state}; {len(m['files'])} files, {size / 1024:,.0f} KiB")


def cmd_report(args):
    changed = report(Path(args.repo), check=args.check) + write_plans_page(Path(args.repo), check=args.check)
    if args.check and changed:
        raise ReslmError(f"out of date: {', '.join(changed)} (run `reslm report`)")
    print(f"{'up to date' if not changed else 'updated: ' + ', '.join(changed)}")


def cmd_reproduce(args):
    out = Path(args.out) if args.out else None
    reproduce(args.budget, args.families, out, data=args.data, token_data=args.token_data,
              data_root=Path(args.root) if args.root else None, device=args.device,
              progress=not args.no_progress, cycles=args.cycles, context_mode=args.context_mode,
              presets=args.presets, state_dtype=args.state_dtype, command="reslm " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["reproduce"] else "")
    print(write_reproduction(out or Path("reproduce-" + args.budget)))


def cmd_lab(args):
    out = Path(args.out or f"lab-{args.budget}")
    run_lab(out, data=args.data, budget=args.budget, substrates=args.substrates, families=args.families,
            physical_substrate=args.physical_substrate, data_root=Path(args.root) if args.root else None,
            device=args.device, progress=not args.no_progress, score=args.score)
    print(write_lab(out))


def cmd_bench(args):
    result = run_bench(quick=args.quick, progress=not args.no_progress, only=args.only)
    print(json.dumps(result, indent=2) if args.json else format_summary(result))


def cmd_sweep(args):
    out = Path(args.out or f"runs/sweep-{args.sweep}")
    check_runs_folder(out, SWEEP_OUTPUTS, "a sweep")   # flags and folders before the dataset is looked for
    publish = Path(args.publish) if args.publish else None
    if publish is not None and publish.exists() and not publish.is_dir():
        raise ReslmError(f"--publish {publish}: not a folder")
    dataset = find_dataset(args.data or "shakespeare-bpe4096", "tokens", Path(args.root) if args.root else None)
    over = {k: v for k, v in dict(max_steps=args.max_steps, device=args.device, precision=args.precision,
                                  threads=args.threads).items() if v is not None}
    say = (lambda msg: print(msg, file=sys.stderr, flush=True)) if not args.no_progress else None
    after = (lambda run_dir: evaluate_and_publish(run_dir, publish, say)) if publish is not None else None
    rows = run_sweep(out, dataset, args.sweep, tuple(args.families.split(",")), over, progress=not args.no_progress,
                     after=after, extras=not args.no_extras)
    result = write_scaling(out, rows)
    if result["note"]:
        print(f"reslm: {result['note']}", file=sys.stderr)
    print(json.dumps(result["fits"], indent=2))


def cmd_search(args):
    model_over = given(args, args._model_fields)
    train_over = given(args, args._train_fields)
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
        fields_ = given(args, args._reservoir_fields)
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
    print(demo_text(run_demo(Path(args.out), data_root=Path(args.root) if args.root else None,
                             progress=not args.no_progress)))


# --- parser -------------------------------------------------------------------------------------
