"""`reslm search`: its parser (the family's model and training flags, fixed when given) and its command."""
from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

from reslm.core.metrics import HELDOUT_LOSS
from reslm.cli.flags import COUNTS, INT64, RIDGE_ONLY, SEED, add_flags, data_root, int_for, int_range, overrides, \
    peek_flag, shared
from reslm.data.datasets import find_dataset
from reslm.models import MODELS
from reslm.experiments.search import FAMILIES, SEARCH_DATA, run_search, search_folder, search_model
from reslm.train import TrainConfig, data_fields

DESCRIPTION = textwrap.dedent("""\
    Tune a reservoir substrate's knobs (spectral radius, input scaling, leak, bias, density and the
    substrate's own: leaky a_min/a_max, deep layers/inter_scaling, nvar k, diagonal r_min, delay
    eta/node_coupling/p) with optuna's TPE sampler. The objective is the cross-entropy on the last
    --holdout of each training shard, never the test shard: the rc ridge readout's (default, one pass
    per trial) or, with --optimizer adam, the CE after the Adam budget (--epochs-per-shard,
    --epoch-samples, --lr, ...) on the rest. A knob given as a flag is fixed, not searched.
    The study lives in SQLite (--storage, default OUT/study.db): re-running adds trials to it, and
    several processes may share it (give each its own --worker). Writes OUT/trials.csv, best.json,
    best_command.txt (a ready `reslm train` command, also printed), history.png and importance.png.
    Needs optuna: pip install 'reslm[lab]'.""")


def add_parser(sub, argv: list[str]) -> None:
    """`reslm search`, with the model and training flags of the family argv names (default rc)."""
    fam_name = peek_flag(argv, "--family") if argv[:1] == ["search"] else None
    fam_name = fam_name if fam_name in FAMILIES else "rc"
    fam = MODELS[fam_name]
    sp = sub.add_parser(
        "search", help="hyperparameter search (optuna TPE) over a reservoir's knobs, on held-out training text",
        formatter_class=argparse.RawDescriptionHelpFormatter, description=DESCRIPTION,
        epilog=f"The options below are {fam_name}'s (`reslm search --family aerc --help` for aerc's).")
    sp.add_argument("--family", choices=list(FAMILIES), default="rc", help="model family (default rc)")
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
    sp.add_argument("--data", help=f"character dataset name under --root, or a path (default {SEARCH_DATA})")
    sp.add_argument("--out", help=f"output folder (default {search_folder('FAMILY', 'RESERVOIR')})")
    shared(sp, "--root", "--device", "--no-progress")
    model_fields = add_flags(sp.add_argument_group(f"{fam_name} model options (fixed: not searched)"),
                             fam.config, {}, skip=("seed", "vocab_size"))
    train_fields = add_flags(sp.add_argument_group("training options (fixed)"), TrainConfig, fam.train,
                             skip={"seed", "device", "optimizer", "heldout_eval", *data_fields("tokens"),
                                   *(RIDGE_ONLY if fam_name != "rc" else ())})
    sp.set_defaults(_model_fields=model_fields, _train_fields=train_fields, func=cmd_search)


def cmd_search(args):
    model_over, train_over = overrides(args)
    reservoir, model_over = search_model(args.family, args.preset, model_over)
    dataset = find_dataset(args.data or SEARCH_DATA, "chars", data_root(args))
    out = Path(args.out) if args.out else search_folder(args.family, reservoir)
    best = run_search(out, dataset, family=args.family, reservoir=reservoir, model_over=model_over,
                      train_over=train_over, trials=args.trials, optimizer=args.optimizer, storage=args.storage,
                      study_name=args.study_name, seed=args.seed, worker=args.worker, progress=not args.no_progress)
    print(f"best of {best['finished']} finished trials: trial {best['best_trial']}, held-out CE "
          f"{best[HELDOUT_LOSS]:.4f} nats (outputs in {out})")
    print(best["command"])
