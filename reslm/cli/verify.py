"""`reslm verify`: its parser and command."""
from __future__ import annotations

import argparse
import sys
import textwrap
import time
from pathlib import Path

from reslm.cli.flags import imported, int_range, shared
from reslm.core.errors import ReslmError
from reslm.core.metrics import CHECK_LOSS
from reslm.scoring.evaluate import CHECK_POSITIONS
from reslm.scoring.verify import TOLERANCE, record_check, targets, verify_run


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


def cmd_verify(args):
    t0 = time.perf_counter()
    imported(args)   # a run whose reservoir came from a user's file is REFUSED without it, the others verified
    runs = targets([Path(p) for p in args.paths])
    if args.record:
        return _record(args, runs)
    readme = Path(args.readme)
    text = readme.read_text(encoding="utf-8") if readme.is_file() else None
    counts = dict(DIFFERS=0, UNREADABLE=0, REFUSED=0)
    for folder in runs:
        r = verify_run(folder, full=args.full, readme=text, device=args.device)
        where = f"{r['mode']}, {r['positions']:,} positions" if r["positions"] else r["mode"]
        note = f"; {'; '.join(r['notes'])}" if r["notes"] else ""
        if r["ok"]:
            print(f"ok       {folder} ({where}, {r['seconds']:.1f} s{note})", flush=True)
        else:
            counts[r["status"]] += 1
            print(f"{r['status']:<8} {folder}: {'; '.join(r['problems'])}{note}", flush=True)
    bad, refused = sum(counts.values()), counts["REFUSED"]
    print(f"{len(runs)} run(s): {len(runs) - bad} ok, {counts['DIFFERS']} differing, {counts['UNREADABLE']} unreadable"
          + (f", {refused} refused (--import FILE.py)" if refused else "")
          + f" ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    if bad > refused:
        raise ReslmError(f"{bad - refused} of {len(runs)} published run(s) do not re-score to what they publish"
                         + (f" ({counts['UNREADABLE']} unreadable)" if counts["UNREADABLE"] else "")
                         + (f"; {refused} refused" if refused else ""))
    if refused:
        raise ReslmError(f"{refused} of {len(runs)} published run(s) not verified: each needs the file of yours that "
                         "registered its reservoir, with the sha256 it records (--import FILE.py)")


def add_parser(sub) -> None:
    v = sub.add_parser("verify", help="re-score published runs from their weights and compare with what they publish",
                       formatter_class=argparse.RawDescriptionHelpFormatter, description=textwrap.dedent(f"""\
        Check published runs (results/NAME, or every run in a folder such as results/) beyond their
        checksums: every file against its manifest, the fixed reservoir rebuilt from the seed, the
        summary's figures against the metrics rows they came from, the README's row against the run's
        evaluations, and the weights re-scored: on the manifest's check (a fixed {CHECK_POSITIONS:,}
        test positions with the CE recorded at publish; minutes for every run) or, with --full, on the
        whole test shard against the summary's figure. One line per run; exit status 2 when any run
        differs by more than {TOLERANCE:g} nats. --record writes a check into manifests that lack one
        (trust on first use: git's history says when). A run trained on a reservoir from a file of
        yours (`reslm frontier bench --import`) records the file's sha256 and a copy to read (never
        run): it is verified only with --import FILE.py whose sha256 is that one, else REFUSED."""))
    v.add_argument("paths", nargs="+", metavar="PATH", help="a published run folder, or a folder of them")
    v.add_argument("--full", action="store_true", help="re-score the whole test shard (the tables' figure)")
    v.add_argument("--record", action="store_true", help="write a check into each manifest that lacks a current one")
    v.add_argument("--positions", type=int_range(64, 10**7), default=CHECK_POSITIONS,
                   help=f"test positions of a recorded check (default {CHECK_POSITIONS:,})")
    v.add_argument("--readme", default="README.md", help="the README whose rows are checked (default README.md)")
    shared(v, "--device", "--threads", "--import")
    v.set_defaults(func=cmd_verify)
