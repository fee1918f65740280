"""`reslm publish` and `reslm report`: their parsers and commands (a run into results/NAME; the pages and
tables drawn from results/)."""
from __future__ import annotations

import argparse
import math
import sys
import textwrap
from pathlib import Path

from reslm.cli.flags import imported, shared
from reslm.core.errors import ReslmError
from reslm.frontier import write_plans_page
from reslm.report import report
from reslm.publish import publish
from reslm.run import CHECKPOINT, CONFIG
from reslm.run import growth
from reslm.run.registry import is_published
from reslm.scoring.evaluate import score_check

PUBLISH_DESCRIPTION = textwrap.dedent("""\
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
    a checkpoint that does not say). A run trained on a reservoir from a file of yours (`reslm frontier
    bench --import`) also carries reservoir-source.json (the file's name and sha256) and
    reservoir-source.txt (a copy to read, never run); publishing it, like reading it, takes
    --import FILE.py with that file.

    --check-growth publishes nothing: it reads git's history and prints, for every commit after the
    baseline that results/.growth-baseline records (or --since REV), the MB of the files it adds or
    changes under results/, and exits 2 when one adds more than --limit MB (default {limit:g}): every
    version of a file committed there stays in everyone's clone. Publish an unfinished run once when
    work on it pauses, not after every shard-epoch (docs/registry.md, "Keeping the history small").""").format(
    limit=growth.LIMIT_MB)
REPORT_DESCRIPTION = textwrap.dedent("""\
    Regenerate, from data only: docs/results.md (the paper-protocol table: per-shard test CE of the last
    cycle, bits/char, the paper's figure, wall times and CPU of every row; other published runs; Fig. 2
    as docs/results-fig2.png and .csv), docs/speed.md (the bench tables, from results/bench/bench-*.json, each row
    with its CPU) and the README's results table between <!-- results:begin --> and <!-- results:end -->.
    Rows come from the published runs in results/ and, for earlier runs whose folders are gone, from
    results/legacy.csv (marked "weights not published"). The same inputs give the same bytes.""")


def publish_checked(run_dir: Path, dest: Path, *, command: str | None = None, replace: bool = False) -> dict:
    """Publish a run into `dest` (reslm.publish.publish; returns the manifest) with its check (score_check:
    what `reslm verify` re-scores), finished or not: an unfinished run's check is of the weights it holds
    now; a published folder published again in place is not scored (its check stays when its weights are
    the same)."""
    run, dest = Path(run_dir), Path(dest)
    trained = (run / CONFIG).is_file() and (run / CHECKPOINT).is_file()
    check = score_check(run) if trained and not (is_published(run) and dest.resolve() == run.resolve()) else None
    return publish(run, dest, command=command, replace=replace, check=check)



def add_publish(sub) -> None:
    pb = sub.add_parser("publish", help="publish a run into the results registry (results/NAME)",
                        formatter_class=argparse.RawDescriptionHelpFormatter, description=PUBLISH_DESCRIPTION)
    pb.add_argument("run_dir", nargs="?", help="the run directory (or a published folder, to publish it again in place)")
    pb.add_argument("dest", nargs="?", help="the results folder, e.g. results/aerc-160-30 (default: RUN_DIR itself)")
    pb.add_argument("--command", help="the command that trained the run, for provenance.json (default: a "
                    "`reslm train` command rebuilt from its config)")
    pb.add_argument("--replace", action="store_true", help="DEST may hold a published run of another configuration "
                    "(another model or training field, seed or dataset): replace it, history and all (refused "
                    "without this flag)")
    pb.add_argument("--check-growth", action="store_true", help="publish nothing: print the MB each commit after the "
                    "baseline adds under results/ and exit 2 when one adds more than --limit (run in the clone)")
    pb.add_argument("--since", metavar="REV", help="with --check-growth: the commits after REV (default: the one "
                    f"{growth.BASELINE} records)")
    pb.add_argument("--limit", type=_megabytes, metavar="MB", help="with --check-growth: the most one commit may add "
                    f"under results/, in MB of 10^6 bytes (default {growth.LIMIT_MB:g})")
    shared(pb, "--threads", "--import")
    pb.set_defaults(func=cmd_publish)


def _megabytes(text: str) -> float:
    value = float(text)   # ValueError -> argparse's "invalid _megabytes value"
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of MB")
    return value


def add_report(sub) -> None:
    rep = sub.add_parser("report", help="build the results tables and figures from results/ and results/bench/bench-*.json",
                         formatter_class=argparse.RawDescriptionHelpFormatter, description=REPORT_DESCRIPTION)
    rep.add_argument("--repo", default=".", help="the repository root holding results/, docs/ and README.md "
                     "(default: the current folder)")
    rep.add_argument("--check", action="store_true", help="write nothing; fail (exit 2) naming the outputs that "
                     "differ from what would be written")
    shared(rep, "--threads")
    rep.set_defaults(func=cmd_report)


def cmd_check_growth(args):
    """`reslm publish --check-growth`: one line per commit after the baseline, then a total (stderr)."""
    if args.run_dir or args.dest or args.command or args.replace:
        raise ReslmError("--check-growth publishes nothing: give it no RUN_DIR, DEST, --command or --replace")
    limit = growth.LIMIT_MB if args.limit is None else args.limit
    root = growth.repository_root(Path.cwd())
    since = args.since or growth.read_baseline(root)
    rows = growth.measure(root, since)
    for g in rows:
        print(g.line(limit))
    over = [g.short for g in rows if g.over(limit)]
    print(f"{len(rows)} commit(s) after {since[:12]} add {sum(g.added for g in rows) / growth.MB:.2f} MB under "
          f"{growth.UNDER} ({sum(g.rewritten for g in rows) / growth.MB:.2f} MB of it rewriting files already "
          f"committed); {len(over)} over the {limit:g} MB limit", file=sys.stderr)
    if over:
        raise ReslmError(f"{len(over)} commit(s) add more than {limit:g} MB under {growth.UNDER}: {', '.join(over)}")


def cmd_publish(args):
    if args.check_growth:
        return cmd_check_growth(args)
    if args.since is not None or args.limit is not None:
        raise ReslmError("--since and --limit go with --check-growth")
    if args.run_dir is None:
        raise ReslmError("give the run directory to publish (RUN_DIR), or --check-growth")
    imported(args, [args.run_dir])
    dest = Path(args.dest) if args.dest else Path(args.run_dir)
    m = publish_checked(Path(args.run_dir), dest, command=args.command, replace=args.replace)
    size = sum((dest / n).stat().st_size for n in m["files"])
    state = "finished" if m["finished"] else "in progress, with its checkpoint (continue it with `reslm train --out " \
        f"{dest} --resume`)"
    print(f"{dest}: {m['run']} at step {m['step']:,}, {state}; {len(m['files'])} files, {size / 1024:,.0f} KiB")


def cmd_report(args):
    changed = report(Path(args.repo), check=args.check) + write_plans_page(Path(args.repo), check=args.check)
    if args.check and changed:
        raise ReslmError(f"out of date: {', '.join(changed)} (run `reslm report`)")
    print(f"{'up to date' if not changed else 'updated: ' + ', '.join(changed)}")
