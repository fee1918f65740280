"""`reslm generate`, `reslm eval`, `reslm memory` and `reslm recall`: their parsers and commands (a trained
run sampled, scored, and scored at each length of context; a reservoir's state decoded at each lag)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from reslm.cli.flags import INT64, SEED, data_root, imported, int_range, shared
from reslm.core.device import pick_device
from reslm.core.errors import ReslmError
from reslm.data.datasets import data_kind, ensure_dataset
from reslm.scoring.evaluate import check_ngrams, eval_file_name, eval_text, evaluate_run
from reslm.scoring.physical import GRID_FILE, check_grid, grid_text, physical_grid
from reslm.frontier.plan import load_plan
from reslm.frontier.runner import plan_items
from reslm.generate import MAX_LENGTH, check_length, sample
from reslm.scoring.memory import BATCH, LENGTHS, POSITIONS, TEXTS, memory_profile, memory_text, plot_memory, write_memory
from reslm.models.load import load_run
from reslm.scoring.recall import FIT, MAX_LAG, SCORE, plot_recall, recall_profile, recall_text, run_item, write_recall
from reslm.run import read_config
from reslm.run.registry import is_published

EVAL_DESCRIPTION = (
    "Evaluate a run directory: test cross-entropy (nats, bits) on a fixed chunk of "
    "the test text, closed-loop generation of --length symbols after the test text's first "
    "window, Overlap-n (unique n-grams of the sample found in the test text) and distinct-n, "
    "and the time of scoring and of generating, with the reservoir's share apart, and, for "
    "rc/aerc runs, the readout-side physical constraints measured through. "
    "Writes RUN_DIR/eval.json (a published folder only with --write), holding the run's lock "
    "for the whole command; a character run's written scoring keeps its sums after each piece of "
    "65,536 positions in RUN_DIR/eval*.partial.json, so the same command, stopped, continues "
    "from there (to the same figure) and removes it when done. A published run's dataset is prepared when it is missing and "
    "buildable (the Shakespeare datasets). --data NAME scores a character run on another dataset's "
    "test shard instead (the same vocabulary; RUN_DIR/eval-on-NAME.json). "
    "The constraint flags score the trained model under other "
    "constraints without retraining: one value each -> the full evaluation, written to "
    "RUN_DIR/eval-<settings>.json (eval.json is left as it is); a comma-separated list in "
    "any of them -> test CE for every combination from one reservoir pass, written to "
    "RUN_DIR/eval-physical.json and .csv (e.g. --state-noise 0,0.01,0.05 --adc-bits 0,4,6,8).")
# `reslm eval` flags of the readout-side constraints: (field, flag, type, help)
PHYSICAL_FLAGS = (("state_noise", "--state-noise", float, "S", "std of the Gaussian noise on the measured state"),
                  ("adc_bits", "--adc-bits", int, "B", "ADC resolution in bits (0 = no quantisation)"),
                  ("gain_mismatch", "--gain-mismatch", float, "G", "per-unit gain spread: gain 1 + G N(0,1)"),
                  ("adc_range", "--adc-range", float, "R", "the ADC reads [-R, R] and clips outside"))
GENERATE_DESCRIPTION = ("Closed-loop generation: each predicted symbol is fed back as input. "
                        "Stateful models (stream-mode reservoirs, LAERC, GPT's KV cache) carry their state: "
                        "one step per generated symbol. A character run needs only its folder (its vocabulary "
                        "is in config.json): the dataset is not read, so it is not checked either; a token run "
                        "reads its tokenizer from the dataset and checks the dataset's fingerprint first.")


def _sampling(parser, unit: str, length: int, min_length: int):
    parser.add_argument("run_dir", help="a run directory written by `reslm train`, or a published results/NAME")
    parser.add_argument("--length", type=int_range(min_length, MAX_LENGTH), default=length,
                        help=f"{unit}s to generate (default {length}, at most {MAX_LENGTH:,})")
    parser.add_argument("--temperature", type=float, default=1.0,
                        help="sampling temperature; 0 = greedy (default 1: the model's own distribution)")
    parser.add_argument("--top-k", type=int_range(*INT64), help=f"sample among the k most likely {unit}s")
    parser.add_argument("--top-p", type=float, help="nucleus sampling: smallest set with this probability mass")
    parser.add_argument("--seed", type=int_range(*SEED), default=0, help="sampling seed (default 0)")
    shared(parser, "--device", "--threads", "--import")


def add_generate(sub) -> None:
    gen = sub.add_parser("generate", help="generate text from a trained run (closed loop)",
                         description=GENERATE_DESCRIPTION)
    _sampling(gen, "symbol", 200, 0)
    gen.add_argument("--prompt", required=True, help="text to start from (characters of the vocabulary)")
    gen.set_defaults(func=cmd_generate)


def add_eval(sub) -> None:
    ev = sub.add_parser("eval", help="score a trained run, generate text, n-gram overlap, timings",
                        description=EVAL_DESCRIPTION)
    _sampling(ev, "symbol", 2000, 1)
    ev.add_argument("--ngrams", default="7,8", help="n of Overlap-n / distinct-n, comma-separated (default 7,8)")
    ev.add_argument("--score", type=int_range(0, 2**63 - 1), default=0,
                    help="test positions to score (default 0 = the whole test text, the figure of the README's "
                    "table; N = the first N positions)")
    ev.add_argument("--write", action=argparse.BooleanOptionalAction, default=None,
                    help="record the result in the run folder (default: yes for a run directory, no for a "
                    "published results/NAME, whose tracked files stay as they are)")
    ev.add_argument("--json", action="store_true", help="print the result as JSON")
    ev.add_argument("--context-mode", choices=("window", "stream"), help="score a reservoir run (rc, aerc) in this "
                    "context mode, not the one it trained in: window = the paper's metric, each test character "
                    "from a zero state over its context (written to RUN_DIR/eval-window.json)")
    ev.add_argument("--data", metavar="NAME", help="score a character run on the test shard of another prepared "
                    "character dataset (a name under --root, or a path) with the run's very vocabulary, e.g. "
                    "shakespeare-authors (built when missing, as the run's own Shakespeare data is); written to "
                    "RUN_DIR/eval-on-NAME.json (eval-window-on-NAME.json with --context-mode window), which a "
                    "published folder lists in its manifest with --write. The result says how many characters of "
                    "that test shard the run's training shards hold, where the two datasets are one token stream")
    shared(ev, "--root")
    phys = ev.add_argument_group("physical constraints (rc/aerc; default: as trained; comma lists make a grid)")
    for _, flag, _, letter, help_ in PHYSICAL_FLAGS:
        phys.add_argument(flag, metavar=f"{letter}[,{letter}...]", help=help_)
    ev.set_defaults(func=cmd_eval)


MEMORY_DESCRIPTION = (
    "How far back trained runs read: each of --positions symbols (evenly spread over the test shard, a "
    "token run's val split; --text val: the runs' validation split; --text train: the text they trained "
    "on) is predicted from exactly its k preceding symbols, read from a zero "
    "state, for each k of --lengths. Prints CE (nats, bits, standard error) by k for every run and, "
    "from the second run on, its paired difference from the first on the same positions. A stateful "
    "model (rc, aerc, rnn, laerc, gpt) steps through the k symbols; a transformer reads them as one "
    "window, up to its context. These are not the runs' test CE (the whole text at their own protocol).")


def add_memory(sub) -> None:
    mem = sub.add_parser("memory", help="test CE by how many symbols each target is predicted from",
                         description=MEMORY_DESCRIPTION)
    mem.add_argument("run_dirs", nargs="+", metavar="RUN",
                     help="run directories or published results/NAME, all trained on one dataset")
    mem.add_argument("--lengths", default=",".join(map(str, LENGTHS)),
                     help=f"comma-separated k (default {','.join(map(str, LENGTHS))})")
    mem.add_argument("--positions", type=int_range(1, 10**9), default=POSITIONS,
                     help=f"symbols scored at every k (default {POSITIONS:,})")
    mem.add_argument("--text", choices=TEXTS, default="test",
                     help="the text scored: test (default), val (the runs' validation split) or train (the "
                     "text they trained on: CE there beside CE on test tells fit from generalisation)")
    mem.add_argument("--batch", type=int_range(1, 10**7), default=BATCH,
                     help=f"positions read at once (default {BATCH:,}; lower it to use less memory)")
    _add_outputs(mem, "CE against k")
    shared(mem, "--device", "--threads", "--import")
    mem.set_defaults(func=cmd_memory)


def cmd_memory(args):
    try:
        lengths = [int(k) for k in args.lengths.split(",")]
    except ValueError:
        raise ReslmError(f"--lengths must be comma-separated integers, got {args.lengths!r}") from None
    _check_outputs(args)
    imported(args, args.run_dirs)
    for run in args.run_dirs:
        ensure_dataset(read_config(Path(run)))
    r = memory_profile(args.run_dirs, lengths, args.positions, pick_device(args.device), args.batch,
                       progress=not args.no_progress, text=args.text)
    if args.out:
        write_memory(r, Path(args.out))
    if args.plot:
        plot_memory(r, Path(args.plot))
    print(json.dumps(r, indent=2) if args.json else memory_text(r))


RECALL_DESCRIPTION = (
    "How far back a reservoir's state holds the text, before any readout is trained: for each lag k, a "
    "linear decoder (ridge regression) learns to name the character k steps back from the model's "
    "features (its reservoir states as its head reads them), and its held-out accuracy gives the recall "
    "at k: 0 is no better than always naming the most frequent character, 1 names every one. The "
    "capacity is the sum over lags 1..K, in characters (the reservoir field's memory capacity, for "
    "symbols). Reads the first training shard only (--fit characters to solve the decoders, --score "
    "after them to pick the ridge penalty and to score), never the test shard. Name runs (rc or aerc on "
    "characters: their fixed part, the trained head is not read; a trained GRU/LSTM run: its hidden "
    "state) or a plan's reservoir configurations (--plan; nothing is trained), all on one dataset. A "
    "linear decoder gives a lower bound of what the state holds.")


def add_recall(sub) -> None:
    rec = sub.add_parser("recall", help="how many characters back a reservoir's state can be decoded",
                         description=RECALL_DESCRIPTION)
    rec.add_argument("run_dirs", nargs="*", metavar="RUN", help="run directories or published results/NAME (a reservoir's "
                     "fixed part: its trained weights are not read; an rnn run's trained hidden state)")
    rec.add_argument("--plan", help="also a plan's configurations, as a run at --seed would build them "
                     "(a plan file or the name of a plan reslm ships)")
    rec.add_argument("--only", action="append", default=[], metavar="LABEL",
                     help="only this configuration of --plan (repeatable; the base is `base` where it has no label)")
    rec.add_argument("--seed", type=int_range(*SEED), default=0, help="the seed of --plan's configurations (default 0)")
    rec.add_argument("--max-lag", type=int_range(1, 4096), default=MAX_LAG, help=f"K, the largest lag (default {MAX_LAG})")
    rec.add_argument("--fit", type=int_range(1_000, 10**9), default=FIT,
                     help=f"samples the decoders are solved on (default {FIT:,})")
    rec.add_argument("--score", type=int_range(1_000, 10**9), default=SCORE,
                     help=f"at least this many samples after them: half pick the penalty, half are "
                     f"scored (default {SCORE:,})")
    _add_outputs(rec, "the recall against the lag")
    shared(rec, "--root", "--device", "--threads", "--import")
    rec.set_defaults(func=cmd_recall)


def cmd_recall(args):
    _check_outputs(args)
    if args.only and not args.plan:
        raise ReslmError("--only names configurations of --plan: give --plan")
    imported(args, args.run_dirs)
    items = [run_item(Path(r)) for r in args.run_dirs]
    for _, cfg, _ in items:
        ensure_dataset(cfg)
    if args.plan:
        items += plan_items(load_plan(args.plan), args.only, args.seed, data_root(args))
    r = recall_profile(items, args.max_lag, args.fit, args.score, pick_device(args.device),
                       progress=not args.no_progress)
    if args.out:
        write_recall(r, Path(args.out))
    if args.plot:
        plot_recall(r, Path(args.plot))
    print(json.dumps(r, indent=2) if args.json else recall_text(r))


def _add_outputs(parser, drawn: str) -> None:
    """--out, --plot, --json and --no-progress of a command that measures runs (memory, recall)."""
    parser.add_argument("--out", metavar="FILE.json", help="also write the result as JSON")
    parser.add_argument("--plot", metavar="FILE.png", help=f"also draw {drawn}")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _check_outputs(args):
    """--out and --plot: the right suffix, in a folder that exists (checked before minutes of measuring)."""
    for path, suffix in ((args.out, ".json"), (args.plot, ".png")):
        if path is not None and not path.endswith(suffix):
            raise ReslmError(f"{path} must end in {suffix}")
        if path is not None and not Path(path).resolve().parent.is_dir():
            raise ReslmError(f"{path}: its folder {Path(path).resolve().parent} does not exist")


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
    imported(args, [args.run_dir])
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


def _physical_values(args) -> dict[str, list]:
    """{field: [values]} of the physical-constraint flags given (comma-separated lists)."""
    out = {}
    for name, flag, kind, _, _ in PHYSICAL_FLAGS:
        text = getattr(args, name)
        if text is None:
            continue
        try:
            out[name] = [kind(v) for v in text.split(",")]
        except ValueError:
            raise ReslmError(f"{flag} must be a comma-separated list of {kind.__name__}s, got {text!r}") from None
    return out


def _ngrams(text: str) -> tuple[int, ...]:
    try:
        ns = tuple(int(n) for n in text.split(","))
    except ValueError:
        raise ReslmError(f"--ngrams must be comma-separated integers, got {text!r}") from None
    if not ns or min(ns) < 1:
        raise ReslmError("--ngrams must be positive integers")
    return ns


def _written(run: Path, write: bool, where) -> None:
    print(f"(written to {where})" if write else
          f"(not written: {run} is a published run; add --write to record it there)", file=sys.stderr)


def cmd_eval(args):
    _check_sampling(args)
    physical = _physical_values(args)
    check_grid(physical)
    imported(args, [args.run_dir])
    run = Path(args.run_dir)
    write = args.write if args.write is not None else not is_published(run)   # results/NAME: only read
    cfg, grid = read_config(run), any(len(v) > 1 for v in physical.values())
    ns = _ngrams(args.ngrams) if grid else check_ngrams(_ngrams(args.ngrams), args.length)   # before any data is built
    if args.data is not None and physical:
        raise ReslmError("--data scores the run as trained: the physical-constraint flags are another evaluation "
                         "(give one or the other)")
    if args.data is None:   # with --data, the run's own dataset is not read (evaluate_run builds the other one)
        ensure_dataset(cfg, data_root(args))   # a fresh clone: the Shakespeare data is built, as train does
    if grid:   # test CE only, one reservoir pass
        r = physical_grid(run, physical, score=args.score, device=args.device, write=write, root=data_root(args))
        print(json.dumps(r, indent=2) if args.json else grid_text(r))
        _written(run, write, f"{run / GRID_FILE}.json and .csv")
        return
    r = evaluate_run(run, length=args.length, ns=ns, score=args.score, temperature=args.temperature,
                     top_k=args.top_k, top_p=args.top_p, seed=args.seed, device=args.device,
                     physical={k: v[0] for k, v in physical.items()}, write=write, context_mode=args.context_mode,
                     root=data_root(args), data=args.data)
    print(json.dumps(r, indent=2) if args.json else eval_text(r))
    if not args.json:   # the JSON alone
        _written(run, write, run / eval_file_name(r))
