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

A run is ok when every step agrees within TOLERANCE nats; the report says by how much it does not.
`record_check` (reslm.evaluate, where the check is scored) writes a check into a manifest that has none
(trust on first use: git's history of results/ says when it was recorded); `publish_checked` (`reslm
publish`) publishes a finished run with one.
"""
from __future__ import annotations

import re
import time
from pathlib import Path

from reslm.core.errors import ReslmError
from reslm.core.files import read_json
from reslm.core.metrics import CHECK_LOSS, TEST_LOSS, final_of, kept_of
from reslm.evaluate import evaluate_run, record_check, score_check
from reslm.data.datasets import ensure_dataset
from reslm.publish import publish
from reslm.run import CHECKPOINT, CONFIG, METRICS, SUMMARY, is_finished, read_config, read_metrics
from reslm.run.registry import is_published, published_folders, verify_published

TOLERANCE = 1e-4   # nats: float32 arithmetic on another CPU moves a score by far less; an edit by far more


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


def verify_run(folder: Path, *, full: bool = False, readme: str | None = None, device: str = "cpu") -> dict:
    """Verify one published run; returns {run, ok, problems, mode, positions, seconds}."""
    t0 = time.perf_counter()
    folder = Path(folder)
    problems: list[str] = []
    positions = None
    try:
        manifest = verify_published(folder)
        ensure_dataset(read_config(folder))   # a fresh clone: the Shakespeare datasets are built, as eval does
        summary = read_json(folder / SUMMARY) or {}
        problems += _summary_problems(folder, summary) + _readme_problems(folder, readme)
        if full:
            r = evaluate_run(folder, write=False, score=0, length=1, ns=(1,), seed=0, device=device)
            want = _headline(summary)
            if want is None and r["kind"] == "tokens":   # a token run's figure: its whole-val-split eval.json
                ev = read_json(folder / "eval.json") or {}
                want = ev.get(TEST_LOSS) if ev.get("settings", {}).get("score") == 0 else None
            positions = r["score_positions"]
            if want is None:
                problems.append("no published figure to compare with (an unfinished run)")
            elif abs(r[TEST_LOSS] - want) > TOLERANCE:
                problems.append(f"re-scored on the whole test text: {r[TEST_LOSS]:.6f}, published {want:.6f} "
                                f"(differs by {r[TEST_LOSS] - want:+.2e})")
        else:
            check = manifest.get("check")
            if not check:
                problems.append("no check recorded (publish again, or `reslm verify --record`)")
            else:
                got = score_check(folder, check["positions"], device=device)
                positions = got["positions"]
                if got["weights_digest"] != check["weights_digest"]:
                    problems.append("the weights are not those the check was recorded for")
                if abs(got[CHECK_LOSS] - check[CHECK_LOSS]) > TOLERANCE:
                    problems.append(f"re-scored on the check's {positions:,} test positions: {got[CHECK_LOSS]:.6f}, "
                                    f"recorded {check[CHECK_LOSS]:.6f} (differs by {got[CHECK_LOSS] - check[CHECK_LOSS]:+.2e})")
    except ReslmError as e:
        problems.append(str(e))
    return dict(run=str(folder), ok=not problems, problems=problems, mode="full" if full else "check",
                positions=positions, seconds=time.perf_counter() - t0)


def publish_checked(run_dir: Path, dest: Path, *, command: str | None = None, replace: bool = False) -> dict:
    """Publish a run into `dest` (reslm.publish.publish; returns the manifest), a finished one with its check
    (score_check: what `reslm verify` re-scores); a published folder published again in place is not scored
    (its check stays when its weights are the same)."""
    run, dest = Path(run_dir), Path(dest)
    finished = (run / CONFIG).is_file() and is_finished(run) and (run / CHECKPOINT).is_file()
    check = score_check(run) if finished and not (is_published(run) and dest.resolve() == run.resolve()) else None
    return publish(run, dest, command=command, replace=replace, check=check)


__all__ = ["TOLERANCE", "publish_checked", "record_check", "targets", "verify_run"]
