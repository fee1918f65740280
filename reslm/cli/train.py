"""`reslm train`: its parser (the family's model and training flags, read from argv before parsing) and
its command."""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

from reslm.cli.flags import RC_ONLY, SEED, add_flags, data_root, int_range, overrides, peek_flag, shared
from reslm.core.distributed import launched_main
from reslm.core.errors import ReslmError
from reslm.models import MODELS, PRESETS, preset
from reslm.publish import check_resumable, unpacked
from reslm.run import CONFIG, read_config
from reslm.run.registry import is_published
from reslm.train import CHECKPOINT_SECONDS, TrainConfig, data_fields, sampler_for, train
from reslm.train.config import current_evals, own_run, run_folder, start_run
from reslm.scoring.verify import record_check


def _is_train(argv: list[str]) -> bool:
    return argv[:1] == ["train"] or "train" in argv[:2]


def train_family(argv: list[str]) -> str | None:
    """The family `reslm train` will train: --family, the preset's, or the resumed run's."""
    name = peek_flag(argv, "--family")
    if name in MODELS:
        return name
    p = peek_flag(argv, "--preset")
    if p in PRESETS:
        return PRESETS[p][0]
    source = peek_flag(argv, "--continue-from")   # a continued run is its source's family
    if source and "--resume" not in argv:
        try:
            fam = read_config(Path(source))["family"]
        except (ReslmError, OSError):
            return None
        return fam if fam in MODELS else None
    out = peek_flag(argv, "--out")
    if "--resume" in argv and out:
        try:
            fam = read_config(Path(out))["family"]
        except (ReslmError, OSError):
            return None
        return fam if fam in MODELS else None
    return None


def check_resume(argv: list[str]) -> None:
    """`reslm train --out X --resume` where X holds no run, or a run whose config.json is damaged (or a
    link): say so before the family's flags are parsed (with no family, its flags would read as
    unrecognised)."""
    out = peek_flag(argv, "--out")
    if _is_train(argv) and "--resume" in argv and out and not ({"-h", "--help"} & set(argv)):
        if not os.path.lexists(Path(out) / CONFIG):
            raise ReslmError(f"{out} holds no run to resume (no {CONFIG})")
        read_config(Path(out))   # a damaged config.json is named now, not as "unrecognized arguments" later


def check_continue(argv: list[str]) -> None:
    """`reslm train --continue-from SRC` where SRC is not a published run with a readable config: say so before
    the family's flags are parsed (its family comes from SRC's config; without it they read as unrecognised)."""
    source = peek_flag(argv, "--continue-from")
    if _is_train(argv) and source and not ({"-h", "--help", "--resume"} & set(argv)):
        if not is_published(Path(source)):
            raise ReslmError(f"--continue-from {source}: not a published run folder (`reslm publish` makes one)")
        read_config(Path(source))


def check_preset(argv: list[str]) -> None:
    """`reslm train --preset NAME` with an unknown NAME: say so before the family's flags are parsed (with no
    family they would read as unrecognised: "unrecognized arguments: --shard-chars")."""
    name = peek_flag(argv, "--preset")
    if _is_train(argv) and name is not None and name not in PRESETS and "--resume" not in argv \
            and not ({"-h", "--help"} & set(argv)):
        preset(name)   # raises "unknown preset 'NAME' (see `reslm presets`)"


def _family_flags(t, fam_name: str) -> tuple[list[str], list[str]]:
    """fam_name's model and training flags (the other data kind's training fields hidden)."""
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
    return model_fields, train_fields


def add_parser(sub, argv: list[str]) -> None:
    """`reslm train`, with the model and training flags of the family argv names (none when it names none)."""
    fam_name = train_family(argv) if _is_train(argv) else None
    fam_list = "\n".join(f"  {n:<6} {f.help} ({f.data})" for n, f in MODELS.items())
    t = sub.add_parser(
        "train", help="train a model: char families shard-cyclic (paper), laerc/gpt on BPE tokens",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train a preset or a family with overrides into a run directory; re-run with --resume "
                    "to continue from its last checkpoint. `--continue-from results/NAME --cycles K` starts a new "
                    "run from a published finished run's weights, its configuration with K cycles and a fresh "
                    "optimiser state (the record says so).",
        epilog=f"families:\n{fam_list}\n\n" + (
            f"The options below are {fam_name}'s, with its defaults." if fam_name else
            "Model and training options depend on the family: `reslm train --family F --help` (or "
            "--preset P --help) lists F's options with F's defaults."))
    t.add_argument("--preset", help="a preset name from `reslm presets`, e.g. rc-750, aerc-100-20, tf-128-8-8")
    t.add_argument("--family", choices=list(MODELS), help="model family, when not using a preset")
    t.add_argument("--data", help="dataset name under --root, or a dataset path "
                   "(default: shakespeare; shakespeare-gpt2 for laerc/gpt)")
    t.add_argument("--out", help=f"run directory (default: {run_folder('<preset or family>', None)})")
    t.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint "
                   "(with its saved config; --cycles K, more than it has, lets a character run go on to K cycles); "
                   "--out may be an unfinished published folder (results/NAME, `reslm publish`): it is published "
                   "again in place when training stops")
    t.add_argument("--seed", type=int_range(*SEED), help="seeds everything: weights, reservoir, shuffling, dropout (default 0)")
    t.add_argument("--checkpoint-minutes", type=float, default=CHECKPOINT_SECONDS / 60, metavar="MIN",
                   help="between evaluations, also checkpoint after this many minutes of training, so that a kill "
                        f"loses at most that much (default {CHECKPOINT_SECONDS / 60:g}; the result is the same)")
    t.add_argument("--stop-at", type=int_range(1, 2**62), metavar="STEP",
                   help="stop once this many optimiser steps are done (after an evaluation and a checkpoint); "
                        "--resume continues the run to its end (default: train to the end)")
    t.add_argument("--cache-states", action="store_true",
                   help="character reservoir runs: keep the current shard's and the test reservoir states in "
                        "RUN/states, so that --resume reads them back instead of computing them again, and with "
                        "--cycles above 1 every shard's while a tenth of the disk (at least 4 GiB) stays free, so "
                        "that a later cycle reads them back too (disk: states x N x 4 bytes per shard; removed "
                        "when the run finishes)")
    shared(t, "--root", "--device", "--no-progress")
    model_fields, train_fields = _family_flags(t, fam_name) if fam_name else ([], [])
    t.set_defaults(_model_fields=model_fields, _train_fields=train_fields, func=cmd_train)


def cmd_train(args):
    model_over, train_over = overrides(args)
    source = train_over.get("continue_from")
    out = Path(args.out) if args.out else (
        run_folder(f"{Path(source).name}-to-{train_over.get('cycles')}c", None) if source and not args.preset
        else run_folder(args.preset, args.family))
    with own_run(out):  # a second `reslm train` of the same run waits for nothing: it fails
        _train(args, out, model_over, train_over)


def _train(args, out: Path, model_over: dict, train_over: dict):
    if not math.isfinite(args.checkpoint_minutes) or args.checkpoint_minutes < 0:
        raise ReslmError(f"--checkpoint-minutes must be a finite number >= 0, got {args.checkpoint_minutes}")
    published = is_published(out)   # results/NAME: continued, then published again in place
    if args.resume and published:
        check_resumable(out)   # before --cycles or --threads change its config
    fresh, notes = start_run(out, resume=args.resume, preset=args.preset, family=args.family, model_over=model_over,
                             train_over=train_over, data=args.data, data_root=data_root(args),
                             authors=getattr(args, "authors_variant", False))
    for note in notes:
        print(f"reslm: {note}", file=sys.stderr)
    with unpacked(out) if published else current_evals(out, fresh):   # results/NAME: published again after
        summary = train(out, progress=not args.no_progress, checkpoint_seconds=60 * args.checkpoint_minutes,
                        cache_states=args.cache_states, stop_at=args.stop_at)
    if published:   # and its check recorded for the weights it now holds (reslm verify)
        record_check(out)
    if launched_main():
        print(json.dumps(summary, indent=2))
