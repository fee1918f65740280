"""`reslm verify`: its parser and command."""
from __future__ import annotations

import argparse
import shlex
import sys
import textwrap
import time
from pathlib import Path

from reslm.cli.flags import int_range, shared
from reslm.core.errors import ReslmError
from reslm.core.metrics import CHECK_LOSS
from reslm.frontier.imports import ImportFailed, _import
from reslm.scoring.evaluate import CHECK_POSITIONS
from reslm.scoring.verify import (EXIT, NOT_CHECKED, TOLERANCE, Differs, NotChecked, record_check, targets,
                                  verify_run)


def _record(args, runs: list[Path]) -> None:
    """--record: a check written into each manifest that lacks a current one, one line per run."""
    failed = 0
    for folder in runs:
        try:
            got = record_check(folder, args.positions, device=args.device)
        except ReslmError as e:
            failed += 1
            print(f"FAILED   {folder}: {e}", flush=True)
            continue
        print(f"recorded {folder}: {got[CHECK_LOSS]:.6f} nats on {got['positions']:,} positions" if got
              else f"current  {folder}: its check is of these weights", flush=True)
    if failed:
        raise ReslmError(f"no check recorded for {failed} of {len(runs)} run(s)")


def _imports(files: list[str] | None) -> tuple[dict, dict]:
    """Run each --import file (reslm.frontier.imports, the bench's guarded import), each on its own: returns
    ({sha256: path} of the files run, {sha256: {path, why}} of those that could not run for want of a module
    this machine lacks: their runs are not checked, with a note). Any other failure is bad input (exit 2)."""
    ran, failed = {}, {}
    for f in files or []:
        try:
            (done,) = _import([f])
        except ImportFailed as e:
            if not issubclass(e.cause, ImportError):
                raise
            failed[e.sha256] = dict(path=e.path, why=str(e).removeprefix(f"--import {f} failed: "))
            print(f"reslm: note: {e}: the runs of its reservoir are not checked", file=sys.stderr)
            continue
        ran[done["sha256"]] = done["path"]
    return ran, failed


def _again(args) -> list[str]:
    """The flags of this command that a command checking one more run repeats (mode, README)."""
    return (["--full"] if args.full else []) + (["--readme", args.readme] if args.readme != "README.md" else [])


def cmd_verify(args):
    t0 = time.perf_counter()
    ran, failed = _imports(args.imports)   # a run whose reservoir came from a user's file: checked with it only
    runs = targets([Path(p) for p in args.paths])
    if args.record:
        return _record(args, runs)
    readme = Path(args.readme)
    text = readme.read_text(encoding="utf-8") if readme.is_file() else None
    near = [Path(f).parent for f in args.imports or []]
    counts = {"DIFFERS": 0, "UNREADABLE": 0, NOT_CHECKED: 0}
    needs, used = [], set()
    for folder in runs:
        r = verify_run(folder, full=args.full, readme=text, device=args.device, failed=failed, near=near,
                       again=_again(args))
        where = f"{r['mode']}, {r['positions']:,} positions" if r["positions"] else r["mode"]
        note = f"; {'; '.join(r['notes'])}" if r["notes"] else ""
        if r["ok"]:
            print(f"ok       {folder} ({where}, {r['seconds']:.1f} s{note})", flush=True)
        else:
            counts[r["status"]] += 1
            print(f"{r['status']:<8} {folder}: {'; '.join(r['problems'])}{note}", flush=True)
        if r["status"] == NOT_CHECKED:
            needs.append(r["needs"])
        used.add(r["sha256"])
    for sha, path in ran.items():
        if sha not in used:
            print(f"reslm: note: --import {path} (sha256 {sha[:12]}) is the file of none of these runs",
                  file=sys.stderr)
    differing, unchecked = counts["DIFFERS"] + counts["UNREADABLE"], counts[NOT_CHECKED]
    print(f"{len(runs)} run(s): {len(runs) - differing - unchecked} ok, {counts['DIFFERS']} differing, "
          f"{counts['UNREADABLE']} unreadable, {unchecked} not checked ({time.perf_counter() - t0:.0f} s)",
          file=sys.stderr)
    if differing:
        raise Differs(f"{differing} of {len(runs)} published run(s) do not re-score to what they publish"
                      + (f" ({counts['UNREADABLE']} unreadable)" if counts["UNREADABLE"] else "")
                      + (f"; {unchecked} not checked" if unchecked else ""))
    if unchecked:
        files = list(dict.fromkeys([*(args.imports or []), *(n for n in needs if n)]))
        found = sum(n is not None for n in needs)
        if found:
            command = shlex.join(["reslm", "verify", *args.paths, *_again(args),
                                  *(w for f in files for w in ("--import", f))])
            print(f"to check {'them' if found == unchecked else f'{found} of them'}: {command}"
                  + "".join(f" (where {v['path']} can run: {v['why']})" for sha, v in failed.items() if sha in used),
                  file=sys.stderr)
        raise NotChecked(f"{unchecked} of {len(runs)} published run(s) not checked: each needs the file of yours "
                         "that registered its reservoir (--import FILE.py, with the sha256 it records): "
                         + ("the command above checks them" if found == unchecked else
                            "the line of each names its file"))


def add_parser(sub) -> None:
    v = sub.add_parser("verify", help="re-score published runs from their weights and compare with what they publish",
                       formatter_class=argparse.RawDescriptionHelpFormatter, description=textwrap.dedent(f"""\
        Check published runs (results/NAME, or every run in a folder such as results/) beyond their
        checksums: every file against its manifest, the fixed reservoir rebuilt from the seed, the
        summary's figures against the metrics rows they came from, the README's row against the run's
        evaluations, and the weights re-scored: on the manifest's check (a fixed {CHECK_POSITIONS:,}
        test positions with the CE recorded at publish; minutes for every run) or, with --full, on the
        whole test shard against the summary's figure. One line per run. --record writes a check into
        manifests that lack one (trust on first use: git's history says when). A run trained on a
        reservoir from a file of yours (`reslm frontier bench --import`) records the file's name,
        sha256 and a copy to read (never run): it is checked only with --import FILE.py whose sha256 is
        that one (--import is repeatable: each file checks the runs that record it), else reported NOT
        CHECKED with the command that checks it (the file looked for by its name beside the --import
        files, in . and ./examples); a file that needs a module this machine lacks leaves its runs not
        checked, with a note.

        Exit status: {EXIT['ok']} every run checked and equal (within {TOLERANCE:g} nats); {EXIT['differs']} a run
        differs or is unreadable; {EXIT['not_checked']} none differs but some run was not checked (it needs
        --import FILE.py); {EXIT['input']} bad input (no published run at PATH, a bad flag or --import file)."""))
    v.add_argument("paths", nargs="+", metavar="PATH", help="a published run folder, or a folder of them")
    v.add_argument("--full", action="store_true", help="re-score the whole test shard (the tables' figure)")
    v.add_argument("--record", action="store_true", help="write a check into each manifest that lacks a current one")
    v.add_argument("--positions", type=int_range(64, 10**7), default=CHECK_POSITIONS,
                   help=f"test positions of a recorded check (default {CHECK_POSITIONS:,})")
    v.add_argument("--readme", default="README.md", help="the README whose rows are checked (default README.md)")
    shared(v, "--device", "--threads", "--import")
    v.set_defaults(func=cmd_verify)
