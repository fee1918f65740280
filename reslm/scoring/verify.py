"""`reslm verify`: a published figure re-scored from its weights.

A published folder's manifest lists checksums, which catch damage but not an edit whose author also
rewrote the manifest. Verification re-derives what can be re-derived (docs/failure-behaviour.md, the
trust model), for each run:

    files      every file against the manifest's sha256 (reslm.run.registry.verify_published)
    fixed      the reservoir and embedding rebuilt from the config's seed, against their fingerprints
    summary    the summary's figure against the metrics row it was taken from
    readme     the README's row for the run (where it has one) against a figure of its metrics
    check      (cheap mode) the weights re-scored on the fixed test positions of the manifest's check
               (recorded at publish, or by `--record`), against the CE recorded there
    full       (--full) the weights re-scored on the whole test shard, against the summary's figure

A run is ok when every step agrees within TOLERANCE nats; the report says by how much it does not. A run whose
reservoir came from a user's file (`reslm frontier bench --import`) is checked only where this process ran that
file (--import FILE.py, its sha256 the run's): without it the run is NOT CHECKED, and its line gives the command
that checks it (the file looked for by the name and sha256 the run records: `import_file`). The exit status
(EXIT): 0 every run checked and equal, 1 a run differs or is unreadable (Differs), 3 none differs but some were
not checked (NotChecked), 2 bad input (a path that is no published run, a bad flag, an --import file that
cannot be run for another reason than a module this machine lacks).
`record_check` (reslm.scoring.evaluate, where the check is scored) writes a check into a manifest that has none
(trust on first use: git's history of results/ says when it was recorded); `reslm publish`
(reslm.cli.publish.publish_checked) publishes a run with one.
"""
from __future__ import annotations

import hashlib
import os
import re
import shlex
import time
from pathlib import Path

from reslm.core.errors import ReslmError, describe
from reslm.core.files import read_json
from reslm.core.metrics import CHECK_LOSS, TEST_LOSS, final_of, kept_of
from reslm.scoring.evaluate import evaluate_run, record_check, score_check
from reslm.data.datasets import ensure_dataset
from reslm.models.load import NeedsImport, check_source
from reslm.run import METRICS, SUMMARY, read_config, read_metrics
from reslm.run.registry import is_published, published_folders, verify_published
from reslm.run.source import read_source

TOLERANCE = 1e-4   # nats: float32 arithmetic on another CPU moves a score by far less; an edit by far more
EXIT = dict(ok=0, differs=1, input=2, not_checked=3)   # `reslm verify`'s exit status
NOT_CHECKED = "NOT CHECKED"


class Differs(ReslmError):
    """Some run verified differs from what it publishes, or could not be read (exit 1)."""

    exit_status = EXIT["differs"]


class NotChecked(ReslmError):
    """No run verified differs, but some could not be checked without a file of the user's (exit 3)."""

    exit_status = EXIT["not_checked"]


def _sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def import_file(record: dict, near=()) -> str | None:
    """A file on this machine that is the one a run's record names (reslm.run.source: its file's name and whole
    sha256), as a path to give --import (relative to the working folder where it lies under it), looked for
    beside each of the folders `near` (the --import files given), in the working folder, its examples/ and
    the examples/ of the reslm checkout this is; None when none of them is it. Only hashed, never run."""
    here = Path.cwd()
    folders = [*map(Path, near), here, here / "examples", Path(__file__).resolve().parents[2] / "examples"]
    for folder in dict.fromkeys(folders):
        path = folder / record["file"]
        if path.is_file() and _sha256(path) == record["sha256"]:
            try:
                return os.path.relpath(path) if path.resolve().is_relative_to(here.resolve()) else str(path)
            except ValueError:
                return str(path)
    return None


def check_command(folder: Path, file: str, again=()) -> str:
    """The command that checks one run with its file: `reslm verify RUN [flags] --import FILE`."""
    return shlex.join(["reslm", "verify", str(folder), *again, "--import", file])


def targets(paths: list[Path]) -> list[Path]:
    """The published folders the paths name: a published folder itself, or every one inside a folder."""
    out = []
    for p in map(Path, paths):
        if is_published(p):
            out.append(p)
        elif p.is_dir():
            found = published_folders(p)
            if not found:
                raise ReslmError(f"{p} is neither a published run nor a folder of published runs")
            out += found
        else:
            raise ReslmError(f"{p}: no such folder")
    return out


def _headline(summary: dict) -> float | None:
    """The figure the tables give: the kept weights' test CE, else the last evaluation's."""
    return summary.get(kept_of(TEST_LOSS), summary.get(final_of(TEST_LOSS)))


def _summary_problems(folder: Path, summary: dict) -> list[str]:
    """The summary's figures against the metrics rows they were taken from."""
    rows = read_metrics(folder)
    kept = next((r for r in rows if r.get("kind") == "weights"), None)
    evals = [r for r in rows if r.get("kind") == "eval" and r.get("step", 0) > 0]
    pairs = []
    if kept is not None and kept_of(TEST_LOSS) in summary:
        pairs.append((kept_of(TEST_LOSS), summary[kept_of(TEST_LOSS)], kept.get(TEST_LOSS)))
    if evals and final_of(TEST_LOSS) in summary:
        pairs.append((final_of(TEST_LOSS), summary[final_of(TEST_LOSS)], evals[-1].get(TEST_LOSS)))
    return [f"{SUMMARY} says {k} {a:.6f}, {METRICS} {b:.6f} (differs by {a - b:+.2e})" for k, a, b in pairs
            if isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(a - b) > TOLERANCE]


def _readme_problems(folder: Path, readme: str | None) -> list[str]:
    """The README's row for the run: its test CE must be one of the run's evaluations, rounded as shown."""
    if not readme:
        return []
    out = []
    evals = {round(r[TEST_LOSS], 4) for r in read_metrics(folder)
             if r.get("kind") in ("eval", "weights") and isinstance(r.get(TEST_LOSS), (int, float))}
    for line in readme.splitlines():
        if f"](results/{folder.name})" not in line:
            continue
        figures = [float(x) for x in re.findall(r"\|\s*(\d\.\d{4})\s*\|", line)]
        if figures and not any(v in evals for v in figures):
            out.append(f"the README's row shows {figures[0]:.4f}, no evaluation of the run gives it")
    return out


class Unreadable(ReslmError):
    """A published file that verify cannot read as what it should be (a damaged manifest check, a figure
    of the wrong type): the run is reported UNREADABLE, and the other runs are still verified."""


def _check_of(folder: Path, manifest: dict) -> dict | None:
    """The manifest's check (None without one), its fields typed: Unreadable naming the file otherwise."""
    check = manifest.get("check")
    if check is None:
        return None
    where = folder / "manifest.json"
    if not isinstance(check, dict):
        raise Unreadable(f"{where}: its check is not an object")
    for key, kinds in (("positions", int), (CHECK_LOSS, (int, float)), ("weights_digest", str)):
        if key not in check:
            raise Unreadable(f"{where}: its check has no {key!r}")
        if not isinstance(check[key], kinds) or isinstance(check[key], bool):
            raise Unreadable(f"{where}: its check's {key!r} is {type(check[key]).__name__}, not a "
                             f"{'string' if kinds is str else 'number'}")
    return check


def _sampled(cfg: dict, summary: dict) -> int:
    """How many test samples the summary's headline figure was scored on (0: the whole test shard): a run
    trained with eval_samples (or final_eval_samples) N scores N samples, in 8 blocks (eval_slices), at each
    evaluation; the kept weights' figure comes from any of them, the last one's from the last."""
    train = cfg.get("train") or {}
    every = train.get("eval_samples", 0)
    final = train.get("final_eval_samples", -1)
    last = every if not isinstance(final, int) or final < 0 else final
    sizes = [last] if kept_of(TEST_LOSS) not in summary else [every, last]
    return max((n for n in sizes if isinstance(n, int) and n > 0), default=0)


def _check_problems(folder: Path, check: dict | None, device: str) -> tuple[list[str], int | None]:
    """The weights re-scored on the check's positions against the CE recorded there."""
    if not check:
        return ["no check recorded (publish again, or `reslm verify --record`)"], None
    got = score_check(folder, check["positions"], device=device)
    positions, out = got["positions"], []
    if got["weights_digest"] != check["weights_digest"]:
        out.append("the weights are not those the check was recorded for")
    if abs(got[CHECK_LOSS] - check[CHECK_LOSS]) > TOLERANCE:
        out.append(f"re-scored on the check's {positions:,} test positions: {got[CHECK_LOSS]:.6f}, "
                   f"recorded {check[CHECK_LOSS]:.6f} (differs by {got[CHECK_LOSS] - check[CHECK_LOSS]:+.2e})")
    return out, positions


def verify_run(folder: Path, *, full: bool = False, readme: str | None = None, device: str = "cpu",
               failed: dict | None = None, near=(), again=()) -> dict:
    """Verify one published run; returns {run, ok, status, problems, notes, mode, positions, seconds, needs,
    sha256 (of the user's file its reservoir came from, else None)}.
    status: "ok", "DIFFERS" (a figure or file is not what it should be), "UNREADABLE" (a file verify cannot
    read, or any other failure: one run's problem never stops the others) or NOT_CHECKED (its reservoir came
    from a user's file this process did not run: --import FILE.py, reslm.models.load.check_source; its problem
    ends with the command that checks it, `again` its flags, and `needs` is the file found for it (import_file,
    looked for beside `near`), else None). `failed`: {sha256: {path, why}} of --import files that could not
    run here (a module this machine lacks): a run of one says so. notes: what could not be compared, and why.

    `full` compares like with like: the whole test shard's CE with a figure of the whole shard (the summary's,
    or an eval.json scored on all of it). A summary figure of a run that evaluated N sampled positions
    (eval_samples) is not a figure of the whole shard: without a whole-shard eval.json, the check's positions
    are re-scored in its place and a note says why."""
    t0 = time.perf_counter()
    folder = Path(folder)
    problems: list[str] = []
    notes: list[str] = []
    positions = needs = record = None
    status = "DIFFERS"
    try:
        manifest = verify_published(folder)
        check = _check_of(folder, manifest)
        cfg = read_config(folder)
        record = read_source(folder)
        needs = import_file(record, near) if record else None
        how = f"check it with `{check_command(folder, needs or (record or {}).get('file') or 'FILE.py', again)}`"
        check_source(folder, cfg, how=how)   # before any work: the user's file named, or the run not checked
        ensure_dataset(cfg)   # a fresh clone: the Shakespeare datasets are built, as eval does
        summary = read_json(folder / SUMMARY) or {}
        problems += _summary_problems(folder, summary) + _readme_problems(folder, readme)
        found, positions = (_full_problems(folder, cfg, summary, check, device, notes) if full
                            else _check_problems(folder, check, device))
        problems += found
    except NeedsImport as e:
        why = str(e).removeprefix(f"{folder}: ")
        ran = (failed or {}).get(record["sha256"]) if record else None
        if ran is not None:   # its file was given but could not run here
            why = (f"its reservoir {record['reservoir']} is from {ran['path']} (sha256 {record['sha256'][:12]}), "
                   f"which could not run here ({ran['why']}): {how}")
        problems.append(why)
        status = NOT_CHECKED
    except Unreadable as e:
        problems.append(str(e))
        status = "UNREADABLE"
    except ReslmError as e:
        problems.append(str(e))
    except Exception as e:   # a file verify cannot read as it should: this run's line, then the next run
        problems.append(describe(e))
        status = "UNREADABLE"
    return dict(run=str(folder), ok=not problems, status="ok" if not problems else status, problems=problems,
                notes=notes, mode="full" if full else "check", positions=positions,
                seconds=time.perf_counter() - t0, needs=needs if status == NOT_CHECKED else None,
                sha256=(record or {}).get("sha256"))


def _full_problems(folder: Path, cfg: dict, summary: dict, check: dict | None, device: str,
                   notes: list[str]) -> tuple[list[str], int | None]:
    """(--full) The whole test shard re-scored against a figure of the whole shard (see verify_run); the
    check's positions re-scored in its place when the run published none, with a note in `notes`."""
    r = evaluate_run(folder, write=False, score=0, length=1, ns=(1,), seed=0, device=device)
    positions = r["score_positions"]
    ev = read_json(folder / "eval.json") or {}
    whole = ev.get(TEST_LOSS) if (ev.get("settings") or {}).get("score") == 0 and \
        ev.get("weights_sha256") in (None, r["weights_sha256"]) else None   # eval.json of these weights
    sampled = _sampled(cfg, summary)
    want, what, elsewhere = _headline(summary), "published", False
    if r["kind"] == "tokens" and want is None:   # a token run's figure: its whole-val-split eval.json
        want, what = whole, "eval.json"
    elif 0 < sampled < positions:   # the summary's figure is of sampled positions: not comparable
        want, what, elsewhere = whole, "eval.json (whole test text)", whole is None
        notes.append(f"{SUMMARY}'s figure is of {sampled:,} sampled test positions (eval_samples), not the "
                     f"whole shard's {positions:,}: " + ("not compared; the check re-scored instead"
                                                         if elsewhere else "eval.json's whole-shard figure "
                                                         "compared instead"))
    if elsewhere:
        return _check_problems(folder, check, device)
    if want is None:
        return ["no published figure to compare with (an unfinished run)"], positions
    if abs(r[TEST_LOSS] - want) > TOLERANCE:
        return [f"re-scored on the whole test text: {r[TEST_LOSS]:.6f}, {what} {want:.6f} "
                f"(differs by {r[TEST_LOSS] - want:+.2e})"], positions
    return [], positions


__all__ = ["EXIT", "NOT_CHECKED", "TOLERANCE", "Differs", "NotChecked", "Unreadable", "check_command", "import_file",
           "record_check", "targets", "verify_run"]
