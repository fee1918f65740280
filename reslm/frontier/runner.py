"""Running a plan: which runs its rule needs now, their state, training and publishing them, and the
selection the rule makes from what is finished.

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
    score_args(folder, ...)           the `reslm eval` command that scores one of them on it

A plan ends when its chosen configuration is read on both metrics: a reservoir that trained with its state
carried through the text is scored on the paper's 32-character windows too (`reslm eval RUN --context-mode
window --score 0 --write`), so that it compares with a trained ceiling on the metric the paper reports.
"""
from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from reslm.core.device import cpu_name
from reslm.core.errors import ReslmError
from reslm.core.files import read_json
from reslm.core.metrics import TEST_LOSS, VAL_LOSS, final_of, kept_of
from reslm.data.datasets import find_dataset
from reslm.evaluate import evaluate_run, record_check, score_check
from reslm.frontier import ledger
from reslm.frontier.plan import BUNDLED, Config, Plan
from reslm.models.identity import fingerprint, seed_of
from reslm.publish import publish, unpacked
from reslm.run import CONFIG, SUMMARY, is_finished, lock_run, read_config, read_metrics
from reslm.run.lock import RunInUse, writer_of
from reslm.run.registry import (EVAL_WINDOW, PROVENANCE, both_metrics, is_published, published_folders, read_manifest,
                                run_metric)
from reslm.train import ensure_run, resume_run, train
from reslm.train.config import STATES as STATE_CACHE

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
    progress: float = 0.0               # shard-epochs done / shard-epochs in all
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
    provenance; a run training here: this machine's), and progress (evaluations / shard-epochs in all)."""
    summary = read_json(folder / SUMMARY) or {}
    cfg = read_config(folder)
    tc = cfg["train"]
    rows = read_metrics(folder)
    evals = [r for r in rows if r.get("kind") == "eval" and r.get("step", 0) > 0]
    timed = [r["eval_seconds"] for r in rows if r.get("kind") in ("eval", "weights") and "eval_seconds" in r]
    total = max(1, len(cfg["data"].get("train_shards", [0] * 5)) * tc.get("epochs_per_shard", 1) * tc.get("cycles", 1))
    test = summary.get(kept_of(TEST_LOSS), summary.get(final_of(TEST_LOSS)))
    window, stream = both_metrics(folder, summary)
    return dict(val=summary.get(kept_of(VAL_LOSS), summary.get(final_of(VAL_LOSS))), test=test,
                test_window=window, test_stream=stream,
                train_seconds=summary.get("train_seconds") or (evals[-1].get("wall") if evals else None),
                eval_seconds=sum(timed) if timed else None,
                cpu=(read_json(folder / PROVENANCE) or {}).get("cpu") if is_published(folder) else cpu_name(),
                progress=min(1.0, len(evals) / total))


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
    a run logged their time; runs made before that count their training only): from its own pace when
    it has begun, else from the plan's finished runs, scaled by its number of shard-epochs. Of those,
    the first group that has any: its configuration on `cpu`, any configuration on `cpu`, its
    configuration anywhere, any: one CPU's pace says little of another's."""
    if e.state == "done":
        return 0.0
    if e.progress > 0 and e.train_seconds:
        return _seconds(e) * (1 - e.progress) / e.progress
    cpu = cpu or cpu_name()
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


# `reslm eval` flags that score a run on the paper's metric over the whole test shard, recorded in its folder
SCORE_ARGS = ("--context-mode", "window", "--score", "0", "--write")


def to_score(plan: Plan, table: list[Entry]) -> list[Entry]:
    """The runs of the configuration the rule chose that are done but lack the paper's metric: a reservoir
    trained with its state carried (its test CE is on that metric alone), scored on 32-character windows
    from a zero state by `score_one`. None before the rule has chosen."""
    chosen = selection(plan, table)["chosen"]
    if chosen is None:
        return []
    return [e for e in table if e.label == chosen and e.state == "done" and e.test_window is None
            and run_metric(e.folder, read_json(e.folder / SUMMARY) or {}) == "stream"]


def score_estimate(e: Entry, table: list[Entry]) -> float | None:
    """Seconds to score `e` on the windows: the median of the plan's runs already scored so (its own
    configuration's first, on this CPU first); None when none is."""
    timed = [(d, t) for d in table if d.state == "done" and d.folder is not None
             and (t := (read_json(d.folder / EVAL_WINDOW) or {}).get("score_seconds"))]
    groups = ([t for d, t in timed if d.config == e.config and d.cpu == e.cpu], [t for d, t in timed if d.cpu == e.cpu],
              [t for _, t in timed])
    same = next((g for g in groups if g), None)
    return statistics.median(same) if same else None


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
            if is_finished(folder):
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
        publish(run_dir, Path(results) / entry.name, check=score_check(run_dir) if is_finished(run_dir) else None)
        say(f"{entry.name}: published to {Path(results) / entry.name}"
            + ("" if is_finished(run_dir) else " unfinished (the deadline); run the plan again to continue it"))
        return "trained" if is_finished(run_dir) else "stopped"
    except RunInUse as e:
        return f"skipped: {e}"


def run_plan(plan: Plan, results: Path, runs: Path, **kw) -> list[Entry]:
    """`run_plans` for one plan: its final table."""
    return run_plans([plan], results, runs, **kw)[plan.name]


def run_plans(plans: list[Plan], results: Path, runs: Path, *, jobs: int = 1, threads: int | None = None,
              device: str | None = None, minutes: float | None = None, only: tuple[str, ...] = (),
              data_root: Path | None = None, progress: bool = True, say=print,
              poll: float = 5.0) -> dict[str, list[Entry]]:
    """Train every run the plans' rules need now and publish each as it finishes, `jobs` at a time (more
    than one: each in its own `reslm frontier run PLAN --only NAME` process, with `threads` threads), until
    nothing is left: the plans in the order given, each its screen first, then its finalists' other seeds
    (a screen that completes while others train puts its finalists' seeds in the queue), then its chosen
    configuration's runs scored on the paper's metric where they lack it (`to_score`: each a `reslm eval`
    process). A configuration in two plans trains once. `only`: just these run names, trained, nothing
    scored (how the parent's processes are called), including a candidate's other seeds that wait on the
    screen (or did not go on), trained ahead of the rule when named: the rule still chooses at the screen seed, so such a run is reported beside its candidate, never
    chosen for it. A run held by another process is left to it, and counts among the `jobs` when that
    process is on this machine. Returns each plan's final table, by plan name.

    `minutes`: a time budget for the whole call. Within each plan the runs go in order of their estimated
    time left (`estimate`, the shortest first); every run is stopped at the deadline and published
    unfinished, and no run starts with under a minute left. A later call continues them. A scoring starts
    only when the plan's earlier scorings (`score_estimate`) say it ends before the deadline, or none has
    been timed; one still going at the deadline is stopped, nothing written, and scored by a later call."""
    until = None if minutes is None else time.time() + 60 * minutes
    first = {p.name: plan_table(p, results, runs) for p in plans}
    unknown = sorted(set(only) - {e.name for table in first.values() for e in table})
    if unknown:
        raise ReslmError(f"no run of plan {', '.join(p.name for p in plans)} is named {', '.join(unknown)} "
                         "(see `reslm frontier status`)")
    for p in plans:
        ledger.note_plan(results, p, finished_names(first[p.name]))
        for e in first[p.name]:
            if e.state == "running" and (not only or e.name in only):
                say(f"{e.name}: being trained by {e.holder}; left to it")
            if e.state in ("waiting", "not run") and e.name in only:
                say(f"{e.name}: {'waits on the screen' if e.state == 'waiting' else 'its candidate did not go on'}; "
                    "trained as named, ahead of the rule, which still chooses at the screen seed")
    skipped: set[str] = set()
    running: dict[str, subprocess.Popen] = {}
    told = False
    while True:
        tables = {p.name: plan_table(p, results, runs) for p in plans}
        todo = _queue(plans, tables, only, until, skipped, set(running), say)
        spent = until is not None and until - time.time() < 60
        if todo and spent and not told:
            say(f"the time budget is spent: {len(todo)} job(s) left for the next call")
            told = True
        if jobs <= 1:
            if not todo or spent:
                return tables
            p, e, job = todo[0]
            if job == "score":
                what = _wait(_score(e, threads, data_root, device, say), until)
                if what == "scored":
                    say(f"{e.name}: scored on the paper's 32-character windows")
            else:
                what = run_one(p, e, results, runs, threads=threads, device=device, until=until,
                               data_root=data_root, progress=progress, say=say)
            if what.startswith("skipped") or what in ("stopped", "failed"):
                say(f"{e.name}: {what}")
                skipped.add(e.name)
            continue
        # runs of these plans that other processes on this machine train take their share of the cores
        others = {e.name for t in tables.values() for e in t if e.state == "running" and e.name not in running
                  and e.holder and " on " not in e.holder.split(" (")[0]}
        for p, e, job in ([] if spent else todo[:max(0, jobs - len(running) - len(others))]):
            if job == "score":
                running[e.name] = _score(e, threads, data_root, device, say)
                continue
            say(f"{e.name}: started in its own process ({threads or 'default'} threads)")
            left = None if until is None else (until - time.time()) / 60
            running[e.name] = subprocess.Popen(_self_command(p, e.name, results, runs, threads, data_root, device,
                                                             minutes=left))
        if not running and not (others and todo and not spent):
            return tables
        time.sleep(poll)
        for name, proc in list(running.items()):
            scoring = getattr(proc, "scoring", False)
            if scoring and until is not None and time.time() > until and proc.poll() is None:
                _stop(proc)
                say(f"{name}: its scoring was stopped at the deadline (nothing written); a later call scores it")
            elif proc.poll() is not None and scoring and not proc.returncode:
                say(f"{name}: scored on the paper's 32-character windows")
            elif proc.poll() is not None and proc.returncode:
                say(f"{name}: its {'scoring ' if scoring else ''}process exited with status {proc.returncode}")
            if proc.poll() is not None:
                del running[name]
                if proc.returncode:
                    skipped.add(name)


def _queue(plans: list[Plan], tables: dict, only: tuple[str, ...], until: float | None, skipped: set[str],
           running: set[str], say) -> list[tuple[Plan, Entry, str]]:
    """What to start next, in order: each plan's runs to train ("train"; shortest-left first under a
    deadline), then its chosen configuration's runs to score ("score"); a run two plans share, once. A
    scoring the time left cannot hold joins `skipped` (the run names this call leaves)."""
    todo, seen = [], set()
    for p in plans:
        table = tables[p.name]
        wanted = [e for e in pending(p, table, ahead=only) + ([] if only else to_score(p, table))
                  if e.name not in skipped | running and (not only or e.name in only)]
        mine = [e for e in wanted if e.state != "done"]
        if until is not None:
            left = {e.name: estimate(e, table) for e in mine}
            mine.sort(key=lambda e: (left[e.name] is None, left[e.name] or 0.0))
        scores = []
        for e in (e for e in wanted if e.state == "done"):
            need = score_estimate(e, table) if until is not None else None
            if need is not None and until - time.time() < need:
                skipped.add(e.name)
                say(f"{e.name}: scoring it on the paper's windows takes about {need / 60:.0f} min, more than is "
                    "left; a later call scores it")
            else:
                scores.append(e)
        for job, entries in (("train", mine), ("score", scores)):
            for e in entries:   # a configuration two plans share: once, under the first
                if (e.config.fingerprint, e.seed, job) not in seen:
                    seen.add((e.config.fingerprint, e.seed, job))
                    todo.append((p, e, job))
    return todo


def _score(e: Entry, threads: int | None, data_root: Path | None, device: str | None, say) -> subprocess.Popen:
    """Start `reslm eval` on a published run: scored on the paper's metric, recorded in its folder."""
    cmd = [sys.executable, "-m", "reslm.cli", *score_args(e.folder, threads, data_root, device)]
    say(f"{e.name}: scoring it on the paper's 32-character windows in its own process ({threads or 'default'} threads)")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    proc.scoring = True
    return proc


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _wait(proc: subprocess.Popen, until: float | None) -> str:
    """One scoring process to its end, or to the deadline: "scored", "failed" or "stopped"."""
    try:
        proc.wait(timeout=None if until is None else max(0.0, until - time.time()))
    except subprocess.TimeoutExpired:
        _stop(proc)
        return "stopped"
    return "failed" if proc.returncode else "scored"


def score_args(folder: Path, threads: int | None = None, data_root: Path | None = None,
               device: str | None = None) -> list[str]:
    """`eval RUN --context-mode window --score 0 --write ...`: the run scored on the paper's metric."""
    return (["eval", str(folder), *SCORE_ARGS, "--json"] + (["--threads", str(threads)] if threads else [])
            + (["--device", device] if device else []) + (["--root", str(data_root)] if data_root else []))


def _self_command(plan: Plan, name: str, results: Path, runs: Path, threads: int | None,
                  data_root: Path | None, device: str | None = None, minutes: float | None = None) -> list[str]:
    return [sys.executable, "-m", "reslm.cli", *command_args(plan, name, results, runs, threads, data_root, device),
            *(["--minutes", f"{minutes:.3f}"] if minutes is not None else [])]


def command_args(plan: Plan, name: str, results: Path, runs: Path, threads: int | None = None,
                 data_root: Path | None = None, device: str | None = None) -> list[str]:
    """`frontier run PLAN --only NAME ...`: one run of the plan, self-contained (trains or continues it,
    then publishes it; skips it when done or held by another process)."""
    shipped = Path(plan.path).resolve() == (BUNDLED / f"{plan.name}.toml").resolve()
    args = ["frontier", "run", plan.name if shipped else str(plan.path), "--only", name, "--results", str(results), "--runs", str(runs),
            "--no-progress"]
    return (args + (["--threads", str(threads)] if threads else []) + (["--device", device] if device else [])
            + (["--root", str(data_root)] if data_root else []))


__all__ = ["Entry", "STATES", "command_args", "estimate", "figures", "finished_names", "index_results", "pending", "plan_table", "run_one",
           "run_plan", "run_plans", "score_args", "score_estimate", "selection", "to_score"]
