"""A plan's runs: which ones its rule needs now, their state, training and publishing one of them, and
the selection the rule makes from what is finished (reslm.frontier.schedule runs many of them at once).

Runs are found by what they are, not by name: a published folder in results/ whose config has the
configuration's fingerprint and the seed is that run, whatever its folder is called (runs published
before plans existed are found so). A new run trains in RUNS/NAME (NAME from run_name) and is published
to RESULTS/NAME when it finishes; a published unfinished run is continued in place. A run someone holds
(another process, on this machine or one sharing the folder) is skipped, never trained twice.

    plan_table(plan, results, runs)   every run the rule knows of, with its state and figures
    selection(plan, table)            the screen's verdicts, the finalists and the chosen configuration
    pending(plan, table)              the runs to train now (the screen first, then the finalists)
    run_one(plan, config, seed, ...)  train one run (or continue it) and publish it
    to_score(plan, table)             the chosen configuration's runs not yet scored on the paper's metric

A plan ends when its chosen configuration is read on both metrics: a reservoir that trained with its state
carried through the text is scored on the paper's 32-character windows too, so that it compares with a
trained ceiling on the metric the paper reports.
"""
from __future__ import annotations

import shutil
import statistics
from dataclasses import dataclass
from pathlib import Path

from reslm.core import stop
from reslm.core.device import cpu_name
from reslm.core.errors import ReslmError
from reslm.core.files import read_json
from reslm.core.metrics import TEST_LOSS, VAL_LOSS, final_of, kept_of
from reslm.data.datasets import find_dataset
from reslm.scoring.evaluate import record_check, score_check
from reslm.frontier import ledger
from reslm.frontier.plan import Config, Plan
from reslm.models import family
from reslm.models.identity import fingerprint, seed_of
from reslm.publish import publish, unpacked
from reslm.run import CONFIG, SUMMARY, is_finished, lock_run, read_config, read_metrics
from reslm.run.lock import RunInUse, writer_of
from reslm.run.registry import (PROVENANCE, both_metrics, is_published, published_folders, read_manifest,
                                run_metric)
from reslm.train import ensure_run, resume_run, train
from reslm.train.config import STATES as STATE_CACHE
from reslm.train.config import make_run_config

STATES = ("done", "running", "unfinished", "pending", "waiting", "not run")


@dataclass
class Entry:
    """One run of a plan: its configuration, seed, folder (where it is or will be) and state."""
    config: Config
    seed: int
    name: str
    folder: Path | None
    state: str             # done | running (held by a process) | unfinished | pending | waiting | not run
    val: float | None = None
    test: float | None = None
    test_window: float | None = None    # the 32-character metric, where the run's summary has it
    test_stream: float | None = None    # the state carried through the test text, where it has it
    train_seconds: float | None = None
    eval_seconds: float | None = None   # its evaluations' time (runs made before it was logged: None)
    cpu: str | None = None              # where train_seconds was measured (cpu_name), where recorded
    last_cpu: str | None = None         # where it trained last (a run continued on several machines)
    progress: float = 0.0               # shard-epochs done / shard-epochs in all
    epochs_left: int | None = None      # shard-epochs still to train
    recent: float | None = None         # seconds per shard-epoch (training and evaluation) of its last ones
    holder: str | None = None

    @property
    def label(self) -> str:
        return self.config.label or "base"


def index_results(results: Path) -> dict[tuple[str, int], Path]:
    """(fingerprint, seed) -> published folder, for every published run under `results`."""
    out: dict[tuple[str, int], Path] = {}
    for folder in published_folders(results):
        cfg = read_json(folder / CONFIG)
        if not cfg or "family" not in cfg:
            continue
        try:
            out.setdefault((fingerprint(cfg), seed_of(cfg)), folder)
        except ReslmError:
            continue   # a family or field this reslm does not know: not a run of any plan
    return out


def figures(folder: Path) -> dict:
    """A run's figures from its summary: validation and test CE of the weights it keeps (both metrics
    where the summary has them), training time and the CPU it was measured on (a published run's
    provenance; a run training here: this machine's), progress (evaluations / shard-epochs in all), the
    shard-epochs left and its recent pace (the median time of its last RECENT shard-epochs)."""
    summary = read_json(folder / SUMMARY) or {}
    cfg = read_config(folder)
    tc = cfg["train"]
    rows = read_metrics(folder, "eval", "weights")
    evals = [r for r in rows if r["kind"] == "eval" and r.get("step", 0) > 0]
    timed = [r["eval_seconds"] for r in rows if "eval_seconds" in r]
    total = max(1, len(cfg["data"].get("train_shards", [0] * 5)) * tc.get("epochs_per_shard", 1) * tc.get("cycles", 1))
    done = evals[-1].get("index", len(evals) - 1) + 1 if evals else 0    # shard-epochs done (eval_at: not each evaluated)
    test = summary.get(kept_of(TEST_LOSS), summary.get(final_of(TEST_LOSS)))
    window, stream = both_metrics(folder, summary)
    prov = (read_json(folder / PROVENANCE) or {}) if is_published(folder) else None
    return dict(val=summary.get(kept_of(VAL_LOSS), summary.get(final_of(VAL_LOSS))), test=test,
                test_window=window, test_stream=stream,
                train_seconds=summary.get("train_seconds") or (evals[-1].get("wall") if evals else None),
                eval_seconds=sum(timed) if timed else None,
                cpu=prov.get("cpu") if prov is not None else cpu_name(),
                last_cpu=((prov.get("publishes") or [{}])[-1].get("cpu") or prov.get("cpu")) if prov is not None
                else cpu_name(),
                progress=min(1.0, done / total), epochs_left=max(0, total - done), recent=_recent(_paces(evals)))


def _paces(evals: list[dict]) -> list[float]:
    """Each timed shard-epoch's seconds, its training and its share of the evaluation that ended it: an
    evaluation's segment spans the shard-epochs since the one before (several under eval_at
    shard-after-cycle-1), each counted at the segment's mean."""
    out, before = [], -1
    for r in evals:
        index = r.get("index", before + 1)
        if "seconds" in r:
            span = max(1, index - before)
            out += [(r["seconds"] + r.get("eval_seconds", 0.0)) / span] * span
        before = index
    return out


RECENT = 3   # shard-epochs a begun run's recent pace is read from


def _recent(epoch_seconds: list[float]) -> float | None:
    """The median time of the last RECENT shard-epochs (None before there are that many): the pace of the
    code and machine a run trains on now, which its lifetime pace mixes with earlier ones'."""
    return statistics.median(epoch_seconds[-RECENT:]) if len(epoch_seconds) >= RECENT else None


def _finished(folder: Path) -> bool:
    return bool(read_manifest(folder).get("finished")) if is_published(folder) else \
        bool((read_json(folder / SUMMARY) or {}).get("finished"))


def _entry(c: Config, seed: int, index: dict, runs: Path | None, wanted: bool) -> Entry:
    """A run's entry: published (found in `index`), begun in runs/NAME, or not begun (runs None: only
    what is published counts, as the docs read it)."""
    name = c.name(seed)
    published = index.get((c.fingerprint, seed))
    local = Path(runs) / name if runs is not None else None
    folder = published or (local if local is not None and (local / CONFIG).is_file() else None)
    e = Entry(config=c, seed=seed, name=name, folder=folder or local, state="pending" if wanted else "waiting")
    if folder is None:   # not begun here; a process that is creating it holds its folder
        if local is not None and local.is_dir() and (holder := writer_of(local)):
            e.state, e.holder = "running", holder
        return e
    e.holder = writer_of(folder)
    if published is not None and _finished(folder):
        e.state = "done"
    elif e.holder:
        e.state = "running"
    else:
        e.state = "unfinished"
    try:
        for k, v in figures(folder).items():
            setattr(e, k, v)
    except ReslmError:
        pass   # a run folder being created: no figures yet
    return e


def plan_table(plan: Plan, results: Path, runs: Path | None, index: dict | None = None) -> list[Entry]:
    """Every run the plan's rule may need: the base at every seed and each candidate at the screen seed
    (rule "screen"; the finalists' other seeds follow once the screen is done), or every configuration
    at every seed (rule "none"). A finalist's other seeds are "waiting" until the screen is complete.
    `runs` None: only published runs count (the docs' view). `index`: index_results(results), when the
    caller has it already."""
    index = index_results(results) if index is None else index
    rule = plan.rule
    table = [_entry(plan.base, s, index, runs, True) for s in rule.seeds]
    if rule.select == "none":
        return table + [_entry(c, s, index, runs, True) for c in plan.candidates for s in rule.seeds]
    screen = [_entry(c, rule.screen_seed, index, runs, True) for c in plan.candidates]
    table += screen
    chosen = selection(plan, table)
    for c in plan.candidates:
        for s in rule.seeds:
            if s != rule.screen_seed:
                e = _entry(c, s, index, runs, c.label in chosen["finalists"])
                if e.state == "waiting" and chosen["screened"]:
                    e.state = "not run"   # the screen is done and this candidate did not go on
                table.append(e)
    return table


def plan_items(plan: Plan, labels=(), seed: int = 0, root: Path | None = None) -> list[tuple[str, dict, None]]:
    """(PLAN:LABEL, the config a run at `seed` would get, None) of a plan's configurations (the base is
    "base" where it has no label), all or those named in `labels`, as `reslm recall` reads them untrained;
    nothing is trained or written."""
    configs = {c.label or "base": c for c in plan.configs}
    unknown = [x for x in labels if x not in configs]
    if unknown:
        raise ReslmError(f"plan {plan.name} has no configuration {unknown[0]!r} (it has: {', '.join(configs)})")
    out = []
    for label, c in configs.items():
        if labels and label not in labels:
            continue
        run = c.run_config(seed)
        ds = find_dataset(c.data, family(c.family).data, root, prepare=True)
        out.append((f"{plan.name}:{label}", make_run_config(c.family, run["model"], run["train"], ds, c.preset), None))
    return out


def _stats(values: list[float]) -> tuple[float, float, int] | None:
    values = [v for v in values if isinstance(v, (int, float))]
    if not values:
        return None
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0, len(values)


def selection(plan: Plan, table: list[Entry]) -> dict:
    """What the rule says from the finished runs in `table`.

    screened: every screen run is done. screen: {label: validation CE at the screen seed}. finalists:
    the candidates (at most rule.finalists, lowest first) whose screen validation CE is below the
    base's. groups: {label: {"val", "test", "test_window", "test_stream": (mean, sd, n) or None,
    "seeds": [...], "complete": every rule seed done}}. chosen: the label with the lowest mean
    validation CE among the base and the finalists once all their seeds are done (rule "screen"), else
    None; rule "none" chooses nothing."""
    rule = plan.rule
    done = [e for e in table if e.state == "done"]
    groups = {}
    for c in plan.configs:
        runs = [e for e in done if e.config == c]
        groups[c.label or "base"] = dict(
            seeds=sorted(e.seed for e in runs), complete={e.seed for e in runs} >= set(rule.seeds),
            **{k: _stats([getattr(e, k) for e in runs]) for k in ("val", "test", "test_window", "test_stream")},
            train_seconds=_stats([e.train_seconds for e in runs]))
    out = dict(screened=False, screen={}, finalists=[], groups=groups, chosen=None)
    if rule.select != "screen":
        return out
    screen = {e.label: e.val for e in table if e.seed == rule.screen_seed and e.state == "done"}
    out["screen"] = screen
    out["screened"] = all(e.state == "done" for e in table if e.seed == rule.screen_seed)
    base_key = plan.base.label or "base"
    base_val = screen.get(base_key)
    if out["screened"] and base_val is not None:
        better = sorted((v, c.label) for c in plan.candidates if (v := screen.get(c.label)) is not None and v < base_val)
        out["finalists"] = [label for _, label in better[:rule.finalists]]
        contenders = [base_key, *out["finalists"]]
        if all(groups[k]["complete"] and groups[k]["val"] for k in contenders):
            out["chosen"] = min(contenders, key=lambda k: groups[k]["val"][0])
    return out


def pending(plan: Plan, table: list[Entry], ahead: tuple[str, ...] = ()) -> list[Entry]:
    """The runs to train now, not done and not held by another process: the screen seed's first. `ahead`:
    run names to train although the rule does not need them now (waiting on the screen, or not run)."""
    todo = [e for e in table if e.state in ("pending", "unfinished")
            or (e.name in ahead and e.state in ("waiting", "not run"))]
    return sorted(todo, key=lambda e: e.seed != plan.rule.screen_seed)


def _length(e: Entry) -> int:
    t = e.config.train
    return t.get("cycles", 1) * t.get("epochs_per_shard", 5)


def estimate(e: Entry, table: list[Entry], cpu: str | None = None) -> float | None:
    """Seconds left for a run on `cpu` (default: this machine's), its training and its evaluations (where
    a run logged their time; runs made before that count their training only): from its own recent pace
    (its last RECENT shard-epochs) when it has that many on `cpu`, else its pace so far when it has begun,
    else from the plan's finished runs, scaled by its number of shard-epochs. Of those,
    the first group that has any: its configuration on `cpu`, any configuration on `cpu`, its
    configuration anywhere, any: one CPU's pace says little of another's."""
    if e.state == "done":
        return 0.0
    cpu = cpu or cpu_name()
    if e.recent is not None and e.epochs_left is not None and e.last_cpu == cpu:
        return e.recent * e.epochs_left
    if e.progress > 0 and e.train_seconds:
        return _seconds(e) * (1 - e.progress) / e.progress
    done = [d for d in table if d.state == "done" and d.train_seconds]
    groups = ([d for d in done if d.config == e.config and d.cpu == cpu], [d for d in done if d.cpu == cpu],
              [d for d in done if d.config == e.config], done)
    same = next((g for g in groups if g), None)
    if same is None:
        return None
    return statistics.median(_seconds(d) / _length(d) for d in same) * _length(e)


def _seconds(e: Entry) -> float:
    return (e.train_seconds or 0.0) + (e.eval_seconds or 0.0)


def finished_names(table: list[Entry]) -> list[str]:
    return [e.folder.name for e in table if e.state == "done"]


def to_score(plan: Plan, table: list[Entry]) -> list[Entry]:
    """The runs of the configuration the rule chose that are done but lack the paper's metric: a reservoir
    trained with its state carried (its test CE is on that metric alone), to score on 32-character windows
    from a zero state (reslm.frontier.schedule.score_args). None before the rule has chosen."""
    chosen = selection(plan, table)["chosen"]
    if chosen is None:
        return []
    return [e for e in table if e.label == chosen and e.state == "done" and e.test_window is None
            and run_metric(e.folder, read_json(e.folder / SUMMARY) or {}) == "stream"]


def run_one(plan: Plan, entry: Entry, results: Path, runs: Path, *, threads: int | None = None,
            device: str | None = None, until: float | None = None, data_root: Path | None = None,
            progress: bool = True, say=print) -> str:
    """Train one run of the plan (or continue it) and publish it into results/NAME, finished or, stopped
    at the wall-clock deadline `until` (time.time()), unfinished. `threads` and `device` are where it
    runs (resource fields: never part of its identity). Returns what happened: "trained", "stopped"
    (at the deadline), "skipped: ..." (done, or held by another process)."""
    folder = entry.folder
    if entry.state == "done":
        return "skipped: done"
    if folder is not None and (holder := writer_of(folder)):
        return f"skipped: {folder} is being trained by {holder}"
    known = finished_names(plan_table(plan, results, runs))
    ledger.note_start(results, plan, entry.label, entry.seed, entry.name, known)
    over = {k: v for k, v in (("threads", threads), ("device", device)) if v}
    try:
        if folder is not None and is_published(folder):    # published unfinished: continue it in place
            with unpacked(folder):   # published again, in place, when training stops
                if over:
                    resume_run(folder, over)
                try:   # its states kept for this call only (results/*/states/ is never committed)
                    train(folder, progress=progress, until=until, cache_states="auto", data_root=data_root)
                finally:
                    shutil.rmtree(folder / STATE_CACHE, ignore_errors=True)
            record_check(folder, root=data_root)   # the check of the weights it now holds (reslm verify)
            return "trained" if is_finished(folder) else "stopped"
        c, cfg = entry.config, entry.config.run_config(entry.seed)
        dataset = find_dataset(c.data, "chars", data_root, prepare=True)
        run_dir = Path(runs) / entry.name
        with lock_run(Path(runs), create=True):   # creating a run folder: one process at a time
            what = ensure_run(run_dir, c.family, cfg["model"], {**cfg["train"], **over}, dataset, preset=c.preset)
        if over and what != "starting":
            resume_run(run_dir, over)
        say(f"{entry.name}: {what}")
        # its states kept on disk for this call (a later cycle reads a shard's back), removed once published
        try:
            train(run_dir, progress=progress, until=until, cache_states="auto")
        finally:   # a later call continues the published run, or this one from its checkpoint
            shutil.rmtree(run_dir / STATE_CACHE, ignore_errors=True)
        publish(run_dir, Path(results) / entry.name, check=score_check(run_dir))   # finished or not: reslm verify
        say(f"{entry.name}: published to {Path(results) / entry.name}"
            + ("" if is_finished(run_dir) else f" unfinished ({'asked to stop' if stop.requested() else 'the deadline'}"
                                                "); run the plan again to continue it"))
        return "trained" if is_finished(run_dir) else "stopped"
    except RunInUse as e:
        return f"skipped: {e}"


__all__ = ["Entry", "STATES", "estimate", "figures", "finished_names", "index_results", "pending", "plan_table", "run_one",
           "selection", "to_score"]
