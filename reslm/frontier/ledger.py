"""A plan's ledger, results/plans/NAME.jsonl: what was known when each candidate joined the plan.

"Committed before it ran" is a claim about time; the ledger lets the tool check it instead of a reader
of git history. Each line is one event, appended and never rewritten:

    {"event": "plan", "sha": ..., "at": ..., "labels": [...], "known": [...]}
        a plan text not seen before: its candidates, and the plan's runs already finished (whose test
        CE was known) at that moment
    {"event": "start", "run": NAME, "label": ..., "seed": ..., "sha": ..., "at": ..., "known": [...]}
        a run started by `reslm frontier run`, under which plan text, and what was finished then

`added_after(plan, events)` reads it back: for each label, the first plan text that held it and the
runs finished before it appeared.
"""
from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

from reslm.core.errors import ReslmError
from reslm.core.files import open_plain

LEDGER_DIR = "plans"   # under the results folder


def ledger_path(results: Path, plan_name: str) -> Path:
    return Path(results) / LEDGER_DIR / f"{plan_name}.jsonl"


def read_ledger(results: Path, plan_name: str) -> list[dict]:
    """The ledger's events, oldest first ([] when there is none; a torn last line is left out)."""
    path = ledger_path(results, plan_name)
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def append(results: Path, plan_name: str, event: dict) -> dict:
    """Append one event (with its time) in one write, synced: concurrent appenders never interleave."""
    path = ledger_path(results, plan_name)
    event = {**event, "at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = open_plain(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, (json.dumps(event, sort_keys=True) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        raise ReslmError(f"could not write {path}: {e.strerror or e}") from None
    return event


def note_plan(results: Path, plan, known: list[str]) -> None:
    """Record the plan's text the first time it is seen (its sha), with the runs finished by then."""
    if any(e.get("event") == "plan" and e.get("sha") == plan.sha for e in read_ledger(results, plan.name)):
        return
    append(results, plan.name, dict(event="plan", sha=plan.sha, labels=[c.label for c in plan.configs],
                                     known=sorted(known)))


def note_start(results: Path, plan, label: str, seed: int, name: str, known: list[str]) -> None:
    """Record a run's first start under this plan (a resumed run is not started again)."""
    if any(e.get("event") == "start" and e.get("run") == name for e in read_ledger(results, plan.name)):
        return
    append(results, plan.name, dict(event="start", run=name, label=label, seed=seed, sha=plan.sha, known=sorted(known)))


def added_after(events: list[dict]) -> dict[str, dict]:
    """{label: the first "plan" event that held it}: when it joined, and what was finished then."""
    out: dict[str, dict] = {}
    for e in events:
        if e.get("event") == "plan":
            for label in e.get("labels", []):
                out.setdefault(label, e)
    return out


__all__ = ["LEDGER_DIR", "added_after", "append", "ledger_path", "note_plan", "note_start", "read_ledger"]
