"""The flags of the command line: integer ranges, the shared flags, and the model and training flags
generated from the config dataclasses (a field's type converts the value, its comment is the help)."""
from __future__ import annotations

import argparse
import inspect
import sys
from dataclasses import MISSING, fields
from pathlib import Path

from reslm.core.device import usable_cores
from reslm.core.errors import ReslmError
from reslm.frontier.imports import _import
from reslm.models.load import check_source
from reslm.run import read_config
from reslm.settings import COUNT_LIMITS


RIDGE_ONLY = ("ridge_alpha", "ridge_refit", "ridge_heldout_samples",   # the closed-form readout (reslm.train.ridge)
              "lbfgs_samples", "lbfgs_iters", "lbfgs_l2")                # and the L-BFGS one (reslm.train.lbfgs)
RC_ONLY = ("holdout", *RIDGE_ONLY)
def int_for_threads(text: str) -> int:
    """--threads N: an integer from 0 to this machine's usable cores (0: the default)."""
    return int_range(*COUNTS["threads"])(text)


int_for_threads.__name__ = "int"
# Declared once, added to the subcommands that take them.
SHARED = {
    "--root": dict(help="datasets folder (default: $RESLM_DATA or ./data)"),
    "--device": dict(default="auto", help="auto (CUDA when present), cpu, cuda or cuda:N (default auto)"),
    "--no-progress": dict(action="store_true", help="no progress bars or progress lines"),
    "--threads": dict(type=int_for_threads, metavar="N",
                      help=f"torch CPU threads, at most this machine's {usable_cores()} (default: the cores its load "
                           f"leaves idle, so a training in the background is not slowed down, nor this command)"),
    "--import": dict(dest="imports", action="append", metavar="FILE.py",
                     help="the Python file of yours that registered the reservoir a run was trained on (`reslm "
                          "frontier bench --import`): run first, as the bench runs it (built-in substrates "
                          "guarded); the run is read only when its sha256 is the one the run records "
                          "(repeatable). Without it such a run is refused, naming the file it needs"),
}
TRAINING_THREADS = ("torch CPU threads for the runs it trains, at most this machine's "
                    f"{usable_cores()} (default: each run's own setting, else torch's default)")


INT64 = (-2**63, 2**63 - 1)
SEED = (0, 2**63 - 1)          # every seed: a non-negative 64-bit integer
# Count flags whose work grows with the value: the largest accepted, so that a typo (1e20) is refused
# with its limit instead of running for ever. Other integer flags take any 64-bit value (their own
# checks follow).
COUNTS = {**{name: (0, most) for name, most in COUNT_LIMITS.items()}, "trials": (1, 10**5),
          "threads": (0, usable_cores())}   # threads: never more than this machine runs (10,000 stalled it)


def int_range(lo: int, hi: int):
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


def int_for(name: str):
    """The integer type of flag `name` (a dest): seeds, the bounded counts, or any 64-bit integer."""
    return int_range(*(SEED if name == "seed" or name.endswith("_seed") else COUNTS.get(name, INT64)))


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (argparse's own print the usage block first)."""

    def error(self, message):
        print(f"{self.prog}: error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        raise SystemExit(2)


def shared(parser, *names, **override):
    """Add the SHARED flags `names`; `override` replaces the help of --threads (threads_help=...)."""
    for name in names:
        spec = dict(SHARED[name])
        if name == "--threads" and "threads_help" in override:
            spec["help"] = override["threads_help"]
        parser.add_argument(name, **spec)


# --- flags from dataclasses --------------------------------------------------------------------
def field_comments(cls) -> dict[str, str]:
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


def add_flags(group, cls, defaults: dict, skip=()) -> list[str]:
    """--field-name for every field of dataclass `cls` not in skip; help shows `defaults` (the family's).
    The parsed value is None when the flag is not given, so only given flags override anything."""
    comments = field_comments(cls)
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
            group.add_argument(flag, dest=f.name, type=int_for(f.name) if kind is int else kind, default=None,
                               metavar=kind.__name__.upper(), help=help_)
        names.append(f.name)
    return names


def given(args, names) -> dict:
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def overrides(args) -> tuple[dict, dict]:
    """The model and training fields given as flags (train, search): one --seed seeds everything (weights,
    reservoir, shuffling, dropout), and --device, unless auto, is a training field."""
    model_over, train_over = given(args, args._model_fields), given(args, args._train_fields)
    if args.seed is not None:
        model_over["seed"] = train_over["seed"] = args.seed
    if args.device != "auto":
        train_over["device"] = args.device
    return model_over, train_over


def imported(args, runs=()) -> None:
    """Run the --import files (reslm.frontier.imports, the bench's guarded import), then refuse, before any
    work, each of `runs` whose reservoir a user's file registered when this process did not run that very
    file (reslm.models.load.check_source: one line naming the run, the reservoir, its sha256 and the flag)."""
    _import(getattr(args, "imports", None))
    for run in map(Path, runs):
        check_source(run, read_config(run))


def data_root(args) -> Path | None:
    """--root as a path (None: $RESLM_DATA or ./data)."""
    return Path(args.root) if args.root else None


def peek_flag(argv: list[str], flag: str) -> str | None:
    """The value of `flag` in argv (`--flag V` or `--flag=V`), before parsing."""
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


# every argument that names a file or folder, by its dest, with how the user wrote it
PATH_ARGS = {"out": "--out", "root": "--root", "repo": "--repo", "publish": "--publish", "drive": "--drive",
             "states": "STATES", "run_dir": "RUN_DIR", "dest": "DEST", "data": "--data", "files": "FILE",
             "corpus": "--corpus", "plan": "PLAN", "plans": "PLAN", "results": "--results", "runs": "--runs",
             "imports": "--import", "storage": "--storage", "paths": "PATH", "readme": "--readme"}


def check_paths(args) -> None:
    """An empty or blank path is a mistake, never a default: ReslmError naming the argument."""
    for dest, shown in PATH_ARGS.items():
        value = getattr(args, dest, None)
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, str) and not v.strip():
                raise ReslmError(f"{shown} is empty: give a path")
