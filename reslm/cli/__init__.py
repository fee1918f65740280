"""The command line: argparse subcommands that call the library; no logic of their own.

Each command's parser and handler stand in one module (data, train, runs: generate and eval, publish:
publish and report, experiments: reproduce, lab, bench, sweep and demo, search, substrate, frontier,
verify); parsers.build_parser assembles them. What a command decides (default folders, start or resume,
presets) and prints (reslm.scoring.evaluate.eval_text) is the library's.

Model and training flags of `reslm train` are generated per family from the config dataclasses
(reslm.models, reslm.train): every field is a flag, its type converts the value, the comment beside
the field is its help, and the default shown is the family's. The family is read from argv first
(`--family`, `--preset`, or the run being resumed), so each family gets exactly its own flags
(`--reservoir NAME` for rc, aerc and laerc; laerc's `--no-reservoir` ablation: a bool field named
no_* is a plain switch). `main` is the single error boundary: any error
becomes one line on stderr and a non-zero exit (`--debug` or RESLM_DEBUG=1 shows the traceback).
"""
from __future__ import annotations

import os
import signal
import sys
import threading

from reslm.cli.flags import check_paths
from reslm.cli.parsers import build_parser
from reslm.cli.train import check_continue, check_preset, check_resume
from reslm.core.device import use_threads
from reslm.core import stop
from reslm.core.errors import OutOfMemory, ReslmError, describe


# Commands that train take their thread count from each run's config (train, sweep, search: --threads is
# a training field) or leave torch's default unless --threads is given (reproduce, lab, demo), so that a
# training's numbers do not depend on the machine's load; the others default to the idle cores.
_RUN_THREADS = ("train", "sweep", "search", "frontier")
_TRAINING = ("reproduce", "lab", "demo", "bench")


def _threads(args) -> None:
    if args.command in _RUN_THREADS:
        return
    n = getattr(args, "threads", None)
    if n is not None or args.command not in _TRAINING:
        use_threads(n)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        check_resume(argv)
        check_continue(argv)
        check_preset(argv)
        args = build_parser(argv).parse_args(argv)
        check_paths(args)
    except ReslmError as e:
        print(f"reslm: error: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:  # --help, or a bad flag (one line already printed)
        return int(e.code or 0)
    debug = args.debug or os.environ.get("RESLM_DEBUG", "") not in ("", "0")
    # SIGTERM (`kill`, a batch scheduler's stop, the end of a session): a training stops at the end of its
    # step as at its deadline (reslm.core.stop); anything else, or a second SIGTERM, stops as Ctrl-C does
    # (a training keeps its last checkpoint and a published folder is published again)
    previous = signal.signal(signal.SIGTERM, _interrupt) if threading.current_thread() is threading.main_thread() \
        else None
    try:
        _threads(args)
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
        return OutOfMemory.exit_status if isinstance(e, MemoryError) else getattr(e, "exit_status", 2)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        stop.clear()   # a stop asked of this command ends with it
    return 0


def _interrupt(signum, frame):
    if stop.request():
        print("reslm: asked to stop (SIGTERM): stopping at the end of this step (SIGTERM again: at once)",
              file=sys.stderr)
        return
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
