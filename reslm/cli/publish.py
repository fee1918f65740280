"""`reslm publish` and `reslm report`: their parsers and commands (a run into results/NAME; the pages and
tables drawn from results/)."""
from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

from reslm.cli.flags import imported, shared
from reslm.core.errors import ReslmError
from reslm.frontier import write_plans_page
from reslm.report import report
from reslm.publish import publish
from reslm.run import CHECKPOINT, CONFIG
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
    --import FILE.py with that file.""")
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
    pb.add_argument("run_dir", help="the run directory (or a published folder, to publish it again in place)")
    pb.add_argument("dest", nargs="?", help="the results folder, e.g. results/aerc-160-30 (default: RUN_DIR itself)")
    pb.add_argument("--command", help="the command that trained the run, for provenance.json (default: a "
                    "`reslm train` command rebuilt from its config)")
    pb.add_argument("--replace", action="store_true", help="DEST may hold a published run of another configuration "
                    "(another model or training field, seed or dataset): replace it, history and all (refused "
                    "without this flag)")
    shared(pb, "--threads", "--import")
    pb.set_defaults(func=cmd_publish)


def add_report(sub) -> None:
    rep = sub.add_parser("report", help="build the results tables and figures from results/ and results/bench/bench-*.json",
                         formatter_class=argparse.RawDescriptionHelpFormatter, description=REPORT_DESCRIPTION)
    rep.add_argument("--repo", default=".", help="the repository root holding results/, docs/ and README.md "
                     "(default: the current folder)")
    rep.add_argument("--check", action="store_true", help="write nothing; fail (exit 2) naming the outputs that "
                     "differ from what would be written")
    shared(rep, "--threads")
    rep.set_defaults(func=cmd_report)


def cmd_publish(args):
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
