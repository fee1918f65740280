"""Running plans: their runs to train and to score, one at a time in this process or several at once, each
in a process of its own (`reslm frontier run PLAN --only NAME`, `reslm eval RUN ...`), to a deadline; and
those processes' command lines, for a cluster's scheduler (`reslm frontier run --commands`).

    run_plans(plans, results, runs, jobs=, minutes=)  every run the plans need now, then their choices scored
    command_args(plan, name, ...)                     the command that trains one run of a plan and publishes it
    score_args(folder, ...)                           the command that scores a published run on the paper's metric
    command_lines(plans, results, runs, ...)          `--commands`: those commands as shell lines, each word quoted
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

from reslm.core import stop
from reslm.core.device import usable_cores
from reslm.core.errors import OutOfMemory, ReslmError
from reslm.core.shell import path_word, shell_line
from reslm.frontier import ledger
from reslm.frontier.plan import BUNDLED, Plan
from reslm.frontier.runner import Entry, estimate, finished_names, pending, plan_table, run_one, to_score
from reslm.models.identity import command_words

# `reslm eval` flags that score a run on the paper's metric over the whole test shard, recorded in its folder
SCORE_ARGS = ("--context-mode", "window", "--score", "0", "--write")


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
    screen (or did not go on), trained ahead of the rule when named: the rule still chooses at the screen
    seed, so such a run is reported beside its candidate, never chosen for it. A run held by another
    process is left to it, and counts among the `jobs` when that process is on this machine. Returns each
    plan's final table, by plan name.

    `minutes`: a time budget for the whole call. Within each plan the runs go in order of their estimated
    time left (`estimate`, the shortest first); every run is stopped at the deadline and published
    unfinished, and no run starts with under a minute left. A later call continues them. A scoring keeps
    its sums piece by piece (reslm.scoring): one still going at the deadline is stopped, and a later call
    continues it from its last whole piece.

    A training whose process ran out of memory (exit status 75, the memory its states need held by the runs
    beside it; or killed by the kernel's out-of-memory killer) goes again alone: no job starts until the
    others end, then it runs by itself, with the threads of all the call's jobs. Any other failure, or one
    alone, leaves the run to a later call. Once nothing is left to start, the jobs going share the call's
    cores (`jobs` x `threads`): a job started then starts with its share, and a training with fewer threads
    than its share is stopped and goes again with it (`_widen`)."""
    until = None if minutes is None else time.time() + 60 * minutes
    _begin(plans, results, runs, only, say)
    if jobs <= 1:   # in this process, one at a time
        return _run_here(plans, results, runs, threads, device, until, only, data_root, progress, say)
    return _run_in_processes(plans, results, runs, jobs, threads, device, until, only, data_root, say, poll)


def _rounds(plans: list[Plan], results: Path, runs: Path, only: tuple[str, ...], until: float | None,
            skipped: set[str], busy: Callable[[], set[str]], say) -> Iterator[tuple[dict, list, bool]]:
    """The scheduler's rounds, without end: each plan's table, what to start next (neither `skipped` nor
    `busy()`), and whether the time budget is spent (said once, with the jobs it leaves)."""
    told = False
    while True:
        tables = {p.name: plan_table(p, results, runs) for p in plans}
        todo = _queue(plans, tables, only, until, skipped, busy())
        spent = (until is not None and until - time.time() < 60) or stop.requested()
        if todo and spent and not told:
            why = "asked to stop (SIGTERM)" if stop.requested() else "the time budget is spent"
            say(f"{why}: {len(todo)} job{'s' if len(todo) != 1 else ''} left for the next call")
            told = True
        yield tables, todo, spent


def _run_here(plans: list[Plan], results: Path, runs: Path, threads: int | None, device: str | None,
              until: float | None, only: tuple[str, ...], data_root: Path | None, progress: bool,
              say) -> dict[str, list[Entry]]:
    """`run_plans` one job at a time in this process (a scoring in a process of its own, waited on), until
    nothing is left or the time budget is spent; each plan's final table."""
    skipped: set[str] = set()            # run names this call leaves (given up on, or no time left)
    for tables, todo, spent in _rounds(plans, results, runs, only, until, skipped, set, say):   # none busy
        if not todo or spent:
            return tables
        p, e, job = todo[0]
        if job == "score":
            what = _wait(_start(p, e, job, results, runs, threads, data_root, device, until, say), until)
        else:
            what = run_one(p, e, results, runs, threads=threads, device=device, until=until,
                           data_root=data_root, progress=progress, say=say)
        if what != "trained":   # a run that trained said so itself
            say(f"{e.name}: {SCORED if what == 'scored' else what}")
        if what not in ("trained", "scored"):
            skipped.add(e.name)


def _run_in_processes(plans: list[Plan], results: Path, runs: Path, jobs: int, threads: int | None,
                      device: str | None, until: float | None, only: tuple[str, ...], data_root: Path | None,
                      say, poll: float) -> dict[str, list[Entry]]:
    """`run_plans` with up to `jobs` processes at once (a run out of memory again by itself, once the machine
    is free), polled every `poll` seconds until none is left to start or wait on; each plan's final table.
    A SIGTERM is passed on to the jobs, which stop as at the deadline, and no job starts after it."""
    skipped: set[str] = set()            # run names this call leaves (given up on, or no time left)
    alone: list[str] = []                # trainings that ran out of memory: each goes again by itself
    tried: set[str] = set()              # trainings that have run alone
    running: dict[str, tuple[str, subprocess.Popen]] = {}   # run name -> (job, its process)
    given: dict[str, tuple] = {}         # run name -> (the threads its process was started with, when)
    wider: dict[str, int] = {}           # trainings stopped to go again with more threads -> those threads
    passed_on = False                    # a stop asked of this call, passed on to its jobs
    with stop.graceful():
        for tables, todo, spent in _rounds(plans, results, runs, only, until, skipped,
                                           lambda: set(running) | set(alone), say):
            if stop.requested() and not passed_on:
                for _, proc in running.values():
                    proc.send_signal(signal.SIGTERM)
                passed_on = True
            # runs of these plans that other processes on this machine train take their share of the cores
            others = {e.name for t in tables.values() for e in t if e.state == "running" and e.name not in running
                      and e.holder and " on " not in e.holder.split(" (")[0]}
            if (alone or tried & running.keys()) and not spent:   # until the machine is free, then the run by itself
                if alone and not running and not others:
                    p, e = next((p, e) for p in plans for e in tables[p.name] if e.name == alone[0])
                    tried.add(alone.pop(0))
                    every = min(usable_cores(), threads * jobs) if threads else None   # the call's threads, all
                    running[e.name] = ("train", _start(p, e, "train", results, runs, every, data_root, device, until,
                                                       say))
            else:
                free = max(0, jobs - len(running) - len(others))
                now = [] if spent else todo[:free]
                tail = bool(threads) and not spent and not others and len(todo) <= free   # none waits after these
                every, going = (min(usable_cores(), threads * jobs) if threads else None), len(running) + len(now)
                for p, e, job in now:   # at the tail a job starts with its share of the call's cores
                    n = wider.pop(e.name, threads)
                    n = max(n, every // going) if tail else n
                    running[e.name] = (job, _start(p, e, job, results, runs, n, data_root, device, until, say))
                    given[e.name] = (n, time.time())
                if tail:
                    _widen(running, given, wider, every, tables, until, say)
            if not running and not (others and (todo or alone) and not spent):
                return tables
            time.sleep(poll)
            _reap(running, until, skipped, alone, tried, say)


SCORED = "scored on the paper's 32-character windows"
WIDEN_MINUTES = 10   # a training goes again with the cores that ended jobs left only with this much time ahead of it
WIDEN_AFTER = 120    # and only once its process has run this many seconds (it takes a stop once it trains)


def _widen(running: dict, given: dict, wider: dict, cores: int, tables: dict, until: float | None, say) -> None:
    """The tail of a call, nothing left to start: a training that has fewer threads than its share of the
    call's `cores` (split evenly over the jobs still going) is stopped (SIGTERM: it stops at the end of its
    step and is published where it is) and put in `wider` to go again with its share, so that the cores of
    the jobs that ended do not idle. Only a training with WIDEN_MINUTES or more ahead of it, by its estimate
    and by the deadline, whose process has run WIDEN_AFTER seconds (so that it trains, and takes the stop at
    the end of a step), is stopped for this."""
    share = cores // max(1, len(running))
    ahead = 60 * WIDEN_MINUTES
    if until is not None and until - time.time() < ahead:
        return
    entries = {e.name: (e, table) for table in tables.values() for e in table}
    for name, (job, proc) in running.items():
        n, began = given.get(name, (None, 0.0))
        if job != "train" or name in wider or (n or share) >= share or name not in entries \
                or time.time() - began < WIDEN_AFTER:
            continue
        left = estimate(*entries[name])
        if left is not None and left >= ahead:
            proc.send_signal(signal.SIGTERM)
            wider[name] = share
            say(f"{name}: nothing left to start beside it; stopped to go again with {share} threads, the cores "
                "of the jobs that ended")


def _begin(plans: list[Plan], results: Path, runs: Path, only: tuple[str, ...], say) -> None:
    """Refuse a name in `only` that no plan has; note each plan in its ledger; say which runs are left to
    other processes, and which named ones train ahead of the rule."""
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


def _start(p: Plan, e: Entry, job: str, results: Path, runs: Path, threads: int | None, data_root: Path | None,
           device: str | None, until: float | None, say) -> subprocess.Popen:
    """A job's own process: `reslm frontier run PLAN --only NAME` (train, with the time left) or `reslm eval
    RUN ...` (score on the paper's metric, its report not printed)."""
    if job == "score":
        say(f"{e.name}: scoring it on the paper's 32-character windows in its own process "
            f"({_threads(threads)})")
        return subprocess.Popen([sys.executable, "-m", "reslm.cli", *score_args(e.folder, threads, data_root, device)],
                                stdout=subprocess.DEVNULL)
    say(f"{e.name}: started in its own process ({_threads(threads)})")
    left = None if until is None else (until - time.time()) / 60
    return subprocess.Popen(_self_command(p, e.name, results, runs, threads, data_root, device, minutes=left))


def _threads(n: int | None) -> str:
    return "default threads" if not n else f"{n} thread{'s' if n != 1 else ''}"


# a training process's exit statuses that say it ran out of memory: reslm's OutOfMemory (EX_TEMPFAIL), and
# SIGKILL, which only the kernel's out-of-memory killer or a user sends it (the deadline stops it with SIGTERM)
MEMORY = (OutOfMemory.exit_status, -signal.SIGKILL)


def _reap(running: dict, until: float | None, skipped: set[str], alone: list[str], tried: set[str], say) -> None:
    """Forget the jobs that ended; stop a scoring the deadline has passed (a training stops itself there).
    A training whose process ran out of memory (MEMORY) beside other jobs joins `alone`, to go again by
    itself; any other failed job, and one that failed alone (`tried`), joins `skipped`."""
    for name, (job, proc) in list(running.items()):
        if job == "score" and until is not None and time.time() > until and proc.poll() is None:
            _stop(proc)
            say(f"{name}: its scoring was stopped at the deadline; a later call continues it from the pieces it kept")
        elif proc.poll() is None:
            continue
        elif proc.returncode:
            memory = job == "train" and proc.returncode in MEMORY and name not in tried
            say(f"{name}: its {'scoring ' if job == 'score' else ''}process exited with status {proc.returncode}"
                + ("; out of memory: it goes again alone once the jobs beside it end" if memory else
                   "; left to a later call"))
            (alone.append if memory else skipped.add)(name)
        elif job == "score":   # a run that trained said so itself
            say(f"{name}: {SCORED}")
        del running[name]


def _queue(plans: list[Plan], tables: dict, only: tuple[str, ...], until: float | None, skipped: set[str],
           running: set[str]) -> list[tuple[Plan, Entry, str]]:
    """What to start next, in order: each plan's runs to train ("train"; shortest-left first under a
    deadline), then its chosen configuration's runs to score ("score"); a run two plans share, once."""
    # a run going on blocks its configuration and seed in every plan (the same run under another label)
    todo, seen = [], {(e.config.fingerprint, e.seed, job) for t in tables.values() for e in t if e.name in running
                      for job in ("train", "score")}
    for p in plans:
        table = tables[p.name]
        wanted = [e for e in pending(p, table, ahead=only) + ([] if only else to_score(p, table))
                  if e.name not in skipped | running and (not only or e.name in only)]
        mine = [e for e in wanted if e.state != "done"]
        if until is not None:
            left = {e.name: estimate(e, table) for e in mine}
            mine.sort(key=lambda e: (left[e.name] is None, left[e.name] or 0.0))
        scores = [e for e in wanted if e.state == "done"]
        for job, entries in (("train", mine), ("score", scores)):
            for e in entries:   # a configuration two plans share: once, under the first
                if (e.config.fingerprint, e.seed, job) not in seen:
                    seen.add((e.config.fingerprint, e.seed, job))
                    todo.append((p, e, job))
    return todo


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
        return "stopped at the deadline; a later call continues its scoring from the pieces it kept"
    return "failed" if proc.returncode else "scored"


def score_args(folder: Path, threads: int | None = None, data_root: Path | None = None,
               device: str | None = None) -> list[str]:
    """`eval RUN --context-mode window --score 0 --write ...`: the run scored on the paper's metric."""
    return (["eval", path_word(folder), *SCORE_ARGS, "--json"] + (["--threads", str(threads)] if threads else [])
            + (["--device", device] if device else []) + (["--root", path_word(data_root)] if data_root else []))


def _self_command(plan: Plan, name: str, results: Path, runs: Path, threads: int | None,
                  data_root: Path | None, device: str | None = None, minutes: float | None = None) -> list[str]:
    return [sys.executable, "-m", "reslm.cli", *command_args(plan, name, results, runs, threads, data_root, device),
            *(["--minutes", f"{minutes:.3f}"] if minutes is not None else [])]


def command_lines(plans: list[Plan], results: Path, runs: Path, threads: int | None = None,
                  data_root: Path | None = None, device: str | None = None) -> tuple[list[str], int]:
    """`reslm frontier run --commands`: one shell line per job to run now, and how many runs wait on a screen.
    A training line is `reslm frontier run PLAN --only NAME ...` with, after `#`, the `reslm train` and
    `reslm publish` commands it amounts to; a scoring line is `reslm eval RUN ...`. Every word of every line
    is quoted (reslm.core.shell.shell_line), so a path or value holding `$(...)`, `;` or a space is passed as
    text; one holding a newline is refused before any line is returned. A configuration two plans share: once."""
    lines, waiting, seen = [], 0, set()
    for plan in plans:
        table = plan_table(plan, results, runs)
        for e in pending(plan, table):
            if (e.config.fingerprint, e.seed) in seen:
                continue
            seen.add((e.config.fingerprint, e.seed))
            line = shell_line(["reslm", *command_args(plan, e.name, results, runs, threads, data_root, device)])
            train = shell_line(command_words(e.config.run_config(e.seed), out=str(runs / e.name)))
            publish = shell_line(["reslm", "publish", path_word(runs / e.name), path_word(results / e.name)])
            lines.append(f"{line}   # = {train} && {publish}")
        for e in to_score(plan, table):   # the chosen configuration, on the paper's metric
            if (e.config.fingerprint, e.seed, "score") not in seen:
                seen.add((e.config.fingerprint, e.seed, "score"))
                lines.append(shell_line(["reslm", *score_args(e.folder, threads, data_root, device)]))
        waiting += sum(e.state == "waiting" for e in table)
    return lines, waiting


def command_args(plan: Plan, name: str, results: Path, runs: Path, threads: int | None = None,
                 data_root: Path | None = None, device: str | None = None) -> list[str]:
    """`frontier run PLAN --only NAME ...`: one run of the plan, self-contained (trains or continues it,
    then publishes it; skips it when done or held by another process)."""
    shipped = Path(plan.path).resolve() == (BUNDLED / f"{plan.name}.toml").resolve()
    args = ["frontier", "run", plan.name if shipped else path_word(plan.path), "--only", name,
            "--results", path_word(results), "--runs", path_word(runs), "--no-progress"]
    return (args + (["--threads", str(threads)] if threads else []) + (["--device", device] if device else [])
            + (["--root", path_word(data_root)] if data_root else []))


__all__ = ["SCORE_ARGS", "command_args", "command_lines", "run_plan", "run_plans", "score_args"]
