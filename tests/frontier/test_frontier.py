"""`reslm frontier`: plans as data, the rule, the ledger, running, claiming, commands and the bench, on a
tiny corpus made in the test."""
import hashlib
import json
import shlex
import shutil
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from reslm.cli import main
from reslm.core.errors import ReslmError
from reslm.core.metrics import VAL_LOSS
from reslm.frontier import bundled_plans, load_plan, plan_table, run_plan, selection
from reslm.frontier import ledger
from reslm.frontier import runner as frunner
from reslm.frontier import schedule as fschedule
from reslm.frontier.bench import bench
from reslm.frontier.report import plan_markdown, status_lines
from reslm.models.identity import fingerprint, name_problem
from reslm.run import LOCK, read_config

BASE = """
[plan]
about = "a tiny plan"

[base]
label = "b"
family = "rc"
data = "tiny"
model = { size = 30, streams = 8 }
train = { batch_size = 64, epochs_per_shard = 1, epoch_samples = 128, lr = 3e-3, val_fraction = 0.2, eval_samples = 100 }

[rule]
seeds = [0, 1]
finalists = 1
"""
CANDIDATES = """
[[candidate]]
label = "lr3e-2"
train = { lr = 3e-2 }

[[candidate]]
label = "lr1e-4"
train = { lr = 1e-4 }
"""


def write_plan(tmp_path, text, name="tiny-plan"):
    path = tmp_path / f"{name}.toml"
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def where(tmp_path, chars):
    """(plan path, results, runs, data root) of a tiny screen plan: a base and two candidates."""
    return write_plan(tmp_path, BASE + CANDIDATES), tmp_path / "results", tmp_path / "runs", chars.path.parent


def run(plan, results, runs, root, **kw):
    return run_plan(load_plan(plan), results, runs, data_root=root, progress=False, say=lambda m: None, **kw)


def stopped_at_once(tmp_path, chars, seeds="[0]"):
    """A tiny plan (rule none, `seeds`) whose first run was stopped at its deadline before its first step
    and published unfinished: (plan path, results, runs, data root, plan, that run's entry before)."""
    path = write_plan(tmp_path, BASE.replace("seeds = [0, 1]", f"seeds = {seeds}\nselect = \"none\""))
    results, runs, root = tmp_path / "results", tmp_path / "runs", chars.path.parent
    plan = load_plan(path)
    entry = plan_table(plan, results, runs)[0]
    assert frunner.run_one(plan, entry, results, runs, until=0.0, data_root=root, progress=False,
                           say=lambda m: None) == "stopped"
    return path, results, runs, root, plan, entry


@pytest.fixture(scope="module")
def screened_once(tmp_path_factory, chars):
    """The tiny plan run to its end once for the module: (folder holding it, the run's table)."""
    home = tmp_path_factory.mktemp("screened")
    path = write_plan(home, BASE + CANDIDATES)
    return home, run(path, home / "results", home / "runs", chars.path.parent)


@pytest.fixture
def screened(tmp_path, screened_once, chars):
    """`where` with the plan already run to its end (a copy of the module's run, the test's own to change),
    and the table that run returned."""
    home, table = screened_once
    for part in ("tiny-plan.toml", "results", "runs"):
        (shutil.copytree if (home / part).is_dir() else shutil.copy)(home / part, tmp_path / part)
    where = write_plan(tmp_path, BASE + CANDIDATES), tmp_path / "results", tmp_path / "runs", chars.path.parent
    return where, [replace(e, folder=e.folder and tmp_path / e.folder.relative_to(home)) for e in table]


def test_a_plan_is_screened_then_its_finalist_finishes_and_the_rule_chooses(screened, monkeypatch):
    (path, results, runs, root), table = screened
    plan = load_plan(path)
    sel = selection(plan, table)
    assert sel["screened"] and len(sel["finalists"]) <= 1
    done = [e for e in table if e.state == "done"]
    assert {(e.label, e.seed) for e in done} >= {("b", 0), ("b", 1), ("lr3e-2", 0), ("lr1e-4", 0)}
    for e in done:   # each published under its derived name, which its config matches
        assert e.folder == results / e.name and name_problem(e.name, read_config(e.folder)) is None
    contenders = ["b", *sel["finalists"]]
    assert all(sel["groups"][k]["complete"] for k in contenders)
    assert sel["chosen"] == min(contenders, key=lambda k: sel["groups"][k]["val"][0])
    losers = [c.label for c in plan.candidates if c.label not in sel["finalists"]]
    assert all(e.state == "not run" for e in table if e.label in losers and e.seed == 1)
    # the chosen configuration, trained with its state carried, was then scored on the paper's windows too
    assert all(e.test_window is not None and e.test_stream is not None for e in table if e.label == sel["chosen"])
    assert frunner.to_score(plan, table) == []
    # a second run finds everything done and trains nothing
    monkeypatch.setattr(frunner, "train", lambda *a, **k: pytest.fail("trained a finished run"))
    again = run(path, results, runs, root)
    assert [e.state for e in again] == [e.state for e in table]
    text = "\n".join(status_lines(plan, again))
    assert f"chosen: {sel['chosen']}" in text and "0 to run now" in text
    for e in (e for e in again if e.state == "done"):   # test CE on both metrics, each in its own column
        cols = next(line.split() for line in text.splitlines() if line.split()[:1] == [e.name])
        assert cols[4:6] == ["-" if v is None else f"{v:.4f}" for v in (e.test_window, e.test_stream)] != ["-", "-"]


def test_runs_are_found_by_configuration_not_by_name(where):
    path, results, runs, root = where
    plan = load_plan(path)
    run(path, results, runs, root, only=(plan.base.name(0),))
    (results / plan.base.name(0)).rename(results / "an-older-name-s0")
    table = plan_table(plan, results, runs)
    e = next(e for e in table if e.label == "b" and e.seed == 0)
    assert e.state == "done" and e.folder.name == "an-older-name-s0"
    assert fingerprint(read_config(e.folder)) == plan.base.fingerprint


def test_a_seed_waiting_on_the_screen_trains_ahead_when_named_and_is_never_chosen_for_it(where):
    """--only NAME of a candidate's other seed trains it before the screen is done; the rule still screens
    at the screen seed alone, so that run is reported with its candidate, which goes on only on merit."""
    path, results, runs, root = where
    plan = load_plan(path)
    ahead = plan.candidates[0].name(1)
    assert next(e for e in plan_table(plan, results, runs) if e.name == ahead).state == "waiting"
    said = []
    run_plan(plan, results, runs, data_root=root, progress=False, say=said.append, only=(ahead,))
    assert any(ahead in m and "ahead of the rule" in m for m in said)
    table = plan_table(plan, results, runs)
    assert [e.name for e in table if e.state == "done"] == [ahead]
    sel = selection(plan, table)
    assert not sel["screened"] and sel["finalists"] == [] and sel["chosen"] is None
    assert sel["groups"][plan.candidates[0].label]["seeds"] == [1]


def test_time_left_is_paced_by_runs_on_this_cpu_before_runs_on_others(where):
    """A run not begun is estimated from the plan's finished runs on the same CPU first (its configuration,
    then any), and only without any from other CPUs' runs; a begun run from its own pace."""
    plan = load_plan(where[0])
    base, cand = plan.base, plan.candidates[0]
    done = lambda c, s, secs, cpu: frunner.Entry(c, s, c.name(s), None, "done", train_seconds=secs, cpu=cpu)
    todo = frunner.Entry(cand, 0, cand.name(0), None, "pending")
    far, here = done(cand, 1, 100.0, "fast (AVX512)"), done(base, 0, 300.0, "slow (AVX2)")
    assert frunner.estimate(todo, [far], cpu="slow (AVX2)") == 100.0
    assert frunner.estimate(todo, [far, here], cpu="slow (AVX2)") == 300.0
    assert frunner.estimate(todo, [far, here, done(cand, 1, 400.0, "slow (AVX2)")], cpu="slow (AVX2)") == 400.0
    assert frunner.estimate(todo, [far, here], cpu="fast (AVX512)") == 100.0
    begun = frunner.Entry(cand, 0, cand.name(0), None, "unfinished", train_seconds=50.0, progress=0.25)
    assert frunner.estimate(begun, [far, here], cpu="slow (AVX2)") == 150.0
    assert frunner.estimate(todo, [], cpu="slow (AVX2)") is None
    # the evaluations' time counts where a run logged it (a trained network's windows take as long as its training)
    here.eval_seconds, begun.eval_seconds = 200.0, 30.0
    assert frunner.estimate(todo, [far, here], cpu="slow (AVX2)") == 500.0
    assert frunner.estimate(begun, [far, here], cpu="slow (AVX2)") == 240.0
    # its last shard-epochs on this CPU pace it once it has them (a faster step, not its lifetime's pace)
    begun.recent, begun.epochs_left, begun.last_cpu = 20.0, 6, "slow (AVX2)"
    assert frunner.estimate(begun, [far, here], cpu="slow (AVX2)") == 120.0
    assert frunner.estimate(begun, [far, here], cpu="fast (AVX512)") == 240.0    # paced on another CPU


def test_a_runs_recent_pace_is_the_median_of_its_last_shard_epochs():
    assert frunner._recent([100.0, 50.0]) is None
    assert frunner._recent([900.0, 100.0, 50.0, 60.0]) == 60.0


def test_a_finished_run_logs_the_time_of_its_evaluations(screened):
    (path, results, runs, root), _ = screened
    plan = load_plan(path)
    e = next(e for e in plan_table(plan, results, runs) if e.state == "done")
    summary = json.loads((e.folder / "summary.json").read_text())
    assert e.eval_seconds is not None and e.eval_seconds > 0
    assert summary["eval_seconds"] == pytest.approx(e.eval_seconds, abs=1e-2)


def test_a_run_held_by_another_process_is_left_to_it(where):
    path, results, runs, root = where
    plan = load_plan(path)
    name = plan.base.name(0)
    (runs / name).mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from reslm.run import lock_run\n"
         f"with lock_run({str(runs / name)!r}):\n print('held', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        said = []
        table = run_plan(plan, results, runs, data_root=root, progress=False, say=said.append, only=(name,))
        assert any("being trained by pid" in s for s in said)
        assert next(e for e in table if e.name == name).state == "running"
        assert not (results / name).exists()
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    run(path, results, runs, root, only=(name,))   # released: now it trains
    assert (results / name / "manifest.json").is_file()


def test_a_run_another_process_here_trains_counts_among_the_jobs(tmp_path, chars, monkeypatch):
    """--jobs 2 with one run of the plan held by another process on this machine (a call started again
    while its runs go on): one run at a time of its own, never three on two cores."""
    path = write_plan(tmp_path, BASE.replace("seeds = [0, 1]", "seeds = [0, 1, 2]\nselect = \"none\""))
    results, runs = tmp_path / "results", tmp_path / "runs"
    plan = load_plan(path)
    held = plan.base.name(0)
    (runs / held).mkdir(parents=True)
    real, live = fschedule.subprocess.Popen, []

    def popen(cmd, *args, **kw):
        if "reslm.cli" not in cmd:   # not a run's own process
            return real(cmd, *args, **kw)
        live[:] = [p for p in live if p.poll() is None]
        assert not live, "two runs of its own beside the one held"
        live.append(real(cmd, *args, **kw))
        return live[-1]

    monkeypatch.setattr(fschedule.subprocess, "Popen", popen)
    holder = real([sys.executable, "-c", "import sys; from reslm.run import lock_run\n"
                   f"with lock_run({str(runs / held)!r}):\n print('held', flush=True); sys.stdin.read()"],
                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        table = run(path, results, runs, chars.path.parent, jobs=2, threads=1, poll=0.2)
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert [e.state for e in table] == ["running", "done", "done"] and len(live) == 1


def test_commands_print_one_self_contained_line_per_run_to_run_now(where, capsys):
    path, results, runs, root = where
    assert main(["frontier", "run", str(path), "--commands", "--results", str(results), "--runs", str(runs),
                 "--root", str(root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    plan = load_plan(path)
    assert len(lines) == 4   # the base at two seeds, each candidate at the screen seed
    first = shlex.split(lines[0].split("   # = ")[0])
    assert first[:3] == ["reslm", "frontier", "run"] and first[first.index("--only") + 1] == plan.base.name(0)
    assert "reslm train --family rc" in lines[0] and "reslm publish" in lines[0]
    assert main(first[1:]) == 0   # the line alone trains and publishes that run
    assert (results / plan.base.name(0) / "manifest.json").is_file()
    assert not (results / plan.base.name(1)).exists()


def test_the_chosen_configuration_is_scored_on_the_windows_and_a_stopped_scoring_continues(where, monkeypatch, capsys):
    path, results, runs, root = where
    plan = load_plan(path)
    with monkeypatch.context() as m:   # the plan trained by an earlier call that scored nothing
        m.setattr(fschedule, "to_score", lambda *a: [])
        run(path, results, runs, root)
    waiting = frunner.to_score(plan, plan_table(plan, results, runs))
    chosen = selection(plan, plan_table(plan, results, runs))["chosen"]
    assert [e.label for e in waiting] == [chosen, chosen] and all(e.test_window is None for e in waiting)
    assert f"to score on the paper's 32-character windows: {waiting[0].name}, {waiting[1].name}" in \
        "\n".join(status_lines(plan, plan_table(plan, results, runs)))
    # a scoring stopped part-way (the deadline, a kill) keeps its pieces, and status says how far it got
    import reslm.scoring.evaluate as ev
    import reslm.scoring.pieces as sc
    monkeypatch.setattr(sc, "PIECE", 200)
    monkeypatch.setattr(ev, "PIECE", 200)
    real = sc.Progress.save

    def save_then_stop(self):
        real(self)
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(sc.Progress, "save", save_then_stop)
        with pytest.raises(KeyboardInterrupt):
            ev.evaluate_run(waiting[0].folder, length=10, score=0, context_mode="window", root=root)
    positions = json.loads((waiting[0].folder / "eval-window.partial.json").read_text())["key"]["score_positions"]
    pieces = -(-positions // 200)
    assert pieces > 2 and f"{waiting[0].name} (1 of {pieces} pieces scored), {waiting[1].name}" in \
        "\n".join(status_lines(plan, plan_table(plan, results, runs)))
    # --commands prints the scoring, one self-contained line each; a line alone scores its run
    capsys.readouterr()
    assert main(["frontier", "run", str(path), "--commands", "--results", str(results), "--runs", str(runs),
                 "--root", str(root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [shlex.split(line)[:3] for line in lines] == [["reslm", "eval", str(e.folder)] for e in waiting]
    assert main(shlex.split(lines[0])[1:]) == 0   # continues the scoring stopped above
    assert [e.name for e in frunner.to_score(plan, plan_table(plan, results, runs))] == [waiting[1].name]
    assert not (waiting[0].folder / "eval-window.partial.json").exists()


def test_the_ledger_says_what_was_finished_when_a_candidate_joined(screened):
    (path, results, runs, root), _ = screened
    finished = len([e for e in plan_table(load_plan(path), results, runs) if e.state == "done"])
    path.write_text(path.read_text() + '\n[[candidate]]\nlabel = "lr1e-3"\ntrain = { lr = 1e-3 }\n')
    plan = load_plan(path)
    ledger.note_plan(results, plan, frunner.finished_names(plan_table(plan, results, runs)))
    joined = ledger.added_after(ledger.read_ledger(results, plan.name))
    assert joined["lr3e-2"]["known"] == [] and len(joined["lr1e-3"]["known"]) == finished
    page = plan_markdown(plan, results, runs)
    assert f"lr1e-3: joined on" in page and f"when {finished} of the plan's runs had finished" in page
    starts = [e for e in ledger.read_ledger(results, plan.name) if e["event"] == "start"]
    assert len(starts) == finished and all(e["sha"] != plan.sha for e in starts)


def test_parallel_jobs_each_in_its_own_process(tmp_path, chars):
    path = write_plan(tmp_path, BASE.replace("seeds = [0, 1]", "seeds = [0, 1]\nselect = \"none\""))
    results, runs = tmp_path / "results", tmp_path / "runs"
    table = run(path, results, runs, chars.path.parent, jobs=2, threads=1, poll=0.2)
    assert [e.state for e in table] == ["done", "done"]
    assert all(read_config(e.folder)["train"]["threads"] == 1 for e in table)


def test_several_plans_in_one_call_share_a_configuration_and_a_deadline(tmp_path, chars, monkeypatch, capsys):
    """`frontier run A B --jobs 2 --minutes M`: both plans' runs, A's first; a configuration both plans
    have (here their bases) trains once; every child process gets the time left to the one deadline."""
    one_candidate = '[[candidate]]\nlabel = "lr3e-2"\ntrain = { lr = 3e-2 }\n'
    a = write_plan(tmp_path, BASE.replace("seeds = [0, 1]", "seeds = [0]") + one_candidate, name="plan-a")
    b_text = BASE.replace('label = "b"', 'label = "bb"').replace("seeds = [0, 1]", 'seeds = [0]\nselect = "none"')
    b = write_plan(tmp_path, b_text + '[[candidate]]\nlabel = "lr1e-3"\ntrain = { lr = 1e-3 }\n', name="plan-b")
    results, runs = tmp_path / "results", tmp_path / "runs"
    real, commands = fschedule.subprocess.Popen, []

    def popen(cmd, *args, **kw):
        if "reslm.cli" in cmd:   # a run's own process (not another subprocess of this one)
            commands.append(cmd)
        return real(cmd, *args, **kw)

    monkeypatch.setattr(fschedule.subprocess, "Popen", popen)
    plans = [load_plan(a), load_plan(b)]
    tables = fschedule.run_plans(plans, results, runs, jobs=2, threads=1, minutes=30, data_root=chars.path.parent,
                               progress=False, say=lambda m: None, poll=0.2)
    assert all(e.state in ("done", "not run") for t in tables.values() for e in t)
    assert [e.state for e in tables["plan-b"]] == ["done", "done"]
    shared = [f for f in results.glob("*-s0") if fingerprint(read_config(f)) == plans[0].base.fingerprint]
    trained = [c for c in commands if "frontier" in c]
    # each published run came from a process of its own (one that found the folder of runs busy, another
    # creating its run, stopped and was started again); then plan A's choice was scored on the paper's
    # windows, each of its runs in a process of its own; nothing else was started
    assert len(shared) == 1 and {c[c.index("--only") + 1] for c in trained} == {f.name for f in results.glob("*-s*")}
    assert all(float(cmd[cmd.index("--minutes") + 1]) <= 30 for cmd in trained)
    assert trained[0][trained[0].index("frontier") + 2] == str(a)   # plan A's runs go first
    chosen = [e for e in tables["plan-a"] if e.label == selection(plans[0], tables["plan-a"])["chosen"]]
    scored = [c[c.index("eval") + 1] for c in commands if "eval" in c]
    assert sorted(scored) == sorted(str(e.folder) for e in chosen) and len(commands) == len(trained) + len(scored)
    assert all(e.test_window is not None and e.test_stream is not None for e in chosen)
    assert frunner.to_score(plans[0], tables["plan-a"]) == []
    where = ["--results", str(results), "--runs", str(runs)]
    capsys.readouterr()
    assert main(["frontier", "status", str(a), str(b), *where]) == 0
    assert [line.split()[1] for line in capsys.readouterr().out.splitlines() if line.startswith("plan ")] == \
        ["plan-a", "plan-b"]
    assert main(["frontier", "status", str(a), str(b), *where, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["plan"] for r in rows} == {"plan-a", "plan-b"} and all("test_window" in r for r in rows)


def test_a_run_going_on_is_not_started_again_under_another_plans_label(tmp_path):
    a = load_plan(write_plan(tmp_path, BASE + CANDIDATES, name="plan-a"))
    b = load_plan(write_plan(tmp_path, BASE.replace('label = "b"', 'label = "bb"'), name="plan-b"))
    results, runs = tmp_path / "results", tmp_path / "runs"
    tables = {p.name: plan_table(p, results, runs) for p in (a, b)}
    going = a.base.name(0)
    todo = fschedule._queue([b, a], tables, (), None, set(), {going})
    assert b.base.name(0) != going and b.base.fingerprint == a.base.fingerprint
    assert (a.base.fingerprint, 0) not in {(e.config.fingerprint, e.seed) for _, e, _ in todo}
    assert b.base.name(1) in {e.name for _, e, _ in todo}


class _Proc:   # a job's process: running (returncode None) or ended
    def __init__(self, returncode=None):
        self.returncode = returncode

    def poll(self):
        return self.returncode


def test_a_training_that_ran_out_of_memory_goes_again_alone():
    """A run whose process ran out of memory beside another (exit 75, or the kernel's SIGKILL) waits to
    go alone; failing alone, or failing otherwise, it is left for a later call."""
    skipped, alone, tried, said = set(), [], set(), []
    running = {"big": ("train", _Proc(75)), "small": ("train", _Proc()), "killed": ("train", _Proc(-9)),
               "bad": ("train", _Proc(2))}
    fschedule._reap(running, None, skipped, alone, tried, said.append)
    assert alone == ["big", "killed"] and skipped == {"bad"} and list(running) == ["small"]
    assert said[0] == "big: its process exited with status 75; out of memory: it goes again alone once the jobs " \
        "beside it end" and said[-1] == "bad: its process exited with status 2; left to a later call"
    tried.add(alone.pop(0))   # how run_plans starts it, once nothing else runs
    running = {"big": ("train", _Proc(75)), "score": ("score", _Proc(75))}
    fschedule._reap(running, None, skipped, alone, tried, said.append)
    assert skipped == {"bad", "big", "score"} and alone == ["killed"]


def test_a_run_out_of_memory_waits_for_the_machine_then_runs_by_itself(tmp_path, monkeypatch):
    """With --jobs 2, a run that ran out of memory beside another starts again only once no other job
    runs, with both jobs' threads, and nothing starts beside it."""
    plan = load_plan(write_plan(tmp_path, BASE + CANDIDATES))
    results, runs = tmp_path / "results", tmp_path / "runs"
    big, starts, live, threaded = plan.base.name(0), [], {}, []
    monkeypatch.setattr(fschedule, "usable_cores", lambda: 2)

    class Proc(_Proc):   # ends after two polls: 75 the first time `big` starts, else 0
        def __init__(self, name):
            super().__init__()
            self.name, self.polls = name, 2

        def poll(self):
            self.polls -= 1
            if self.polls <= 0 and self.returncode is None:
                self.returncode = 75 if self.name == big and len([n for n, _ in starts if n == big]) == 1 else 0
                live.pop(self.name)
            return self.returncode

    def start(p, e, job, results, runs, threads, *args):
        starts.append((e.name, sorted(live)))
        threaded.append(threads)
        live[e.name] = proc = Proc(e.name)
        return proc

    def reap(running, until, skipped, alone, tried, say):
        real_reap(running, until, skipped, alone, tried, say)
        skipped.update(n for n, _ in starts if n not in alone and n not in running)   # ended: not queued again

    real_reap = fschedule._reap
    monkeypatch.setattr(fschedule, "_start", start)
    monkeypatch.setattr(fschedule, "_reap", reap)
    fschedule.run_plans([plan], results, runs, jobs=2, threads=1, poll=0, say=lambda m: None)
    first, again = [i for i, (n, _) in enumerate(starts) if n == big]
    assert threaded[again] == 2 and set(threaded[:again] + threaded[again + 1:]) == {1}   # alone: both threads
    assert starts[first][1] or starts[first + 1][1] == [big]   # it first ran beside another job
    assert starts[again][1] == []                                  # then alone
    assert all(big not in beside for _, beside in starts[again + 1:])   # and nothing started beside it


@pytest.mark.parametrize("ahead", [3600.0, 60.0])
def test_a_training_left_at_the_tail_goes_again_with_the_cores_the_ended_jobs_left(tmp_path, monkeypatch, ahead):
    """With --jobs 2 --threads 1 and nothing left to start, once one job has ended the training still going
    is stopped (SIGTERM) and goes again with both threads; one with under WIDEN_MINUTES ahead of it is left."""
    one_candidate = CANDIDATES[:CANDIDATES.index("[[candidate]]", 5)]
    plan = load_plan(write_plan(tmp_path, BASE.replace("seeds = [0, 1]", "seeds = [0]\nselect = \"none\"") + one_candidate))
    results, runs = tmp_path / "results", tmp_path / "runs"
    short, long = (e.name for e in plan_table(plan, results, runs))
    starts, finished, said = [], set(), []
    monkeypatch.setattr(fschedule, "usable_cores", lambda: 2)
    monkeypatch.setattr(fschedule, "estimate", lambda e, table: ahead)
    monkeypatch.setattr(fschedule, "WIDEN_AFTER", 0)   # its process has trained long enough to take a stop

    class Proc(_Proc):   # `short` ends after 2 polls; `long` after 50 unless stopped first (4: started again)
        def __init__(self, name, again):
            super().__init__()
            self.name, self.stopped = name, False
            self.polls = 2 if name == short else 4 if again else 50

        def send_signal(self, sig):
            assert sig == fschedule.signal.SIGTERM
            self.stopped = True

        def poll(self):
            if self.returncode is None and self.stopped:
                self.returncode = 0
            elif self.returncode is None:
                self.polls -= 1
                if self.polls <= 0:
                    self.returncode = 0
                    finished.add(self.name)
            return self.returncode

    def start(p, e, job, results, runs, threads, *args):
        again = any(n == e.name for n, _ in starts)
        starts.append((e.name, threads))
        return Proc(e.name, again)

    def reap(running, until, skipped, alone, tried, say):
        real_reap(running, until, skipped, alone, tried, say)
        skipped.update(finished - set(running))   # ended at its end: not queued again

    real_reap = fschedule._reap
    monkeypatch.setattr(fschedule, "_start", start)
    monkeypatch.setattr(fschedule, "_reap", reap)
    fschedule.run_plans([plan], results, runs, jobs=2, threads=1, poll=0, say=said.append)
    if ahead < 60 * fschedule.WIDEN_MINUTES:   # too little ahead of it: it goes on with its one thread
        assert sorted(starts) == sorted([(short, 1), (long, 1)]) and not any("stopped to go again" in m for m in said)
        return
    assert sorted(starts[:2]) == sorted([(short, 1), (long, 1)]) and starts[2:] == [(long, 2)]
    assert f"{long}: nothing left to start beside it; stopped to go again with 2 threads, the cores of the jobs " \
           "that ended" in said


def test_a_run_that_starts_with_nothing_left_after_it_starts_with_the_calls_cores(tmp_path, monkeypatch):
    """--jobs 2 --threads 1 with one run to train: it starts with both threads, not with one to be widened."""
    plan = load_plan(write_plan(tmp_path, BASE.replace("seeds = [0, 1]", "seeds = [0]\nselect = \"none\"")))
    starts, ended = [], set()
    monkeypatch.setattr(fschedule, "usable_cores", lambda: 2)

    def start(p, e, job, results, runs, threads, *args):
        starts.append((e.name, threads))
        ended.add(e.name)
        return _Proc(0)

    def reap(running, until, skipped, alone, tried, say):
        real_reap(running, until, skipped, alone, tried, say)
        skipped.update(ended)   # ended at its end: not queued again

    real_reap = fschedule._reap
    monkeypatch.setattr(fschedule, "_start", start)
    monkeypatch.setattr(fschedule, "_reap", reap)
    fschedule.run_plans([plan], tmp_path / "results", tmp_path / "runs", jobs=2, threads=1, poll=0, say=lambda m: None)
    assert starts == [(plan.base.name(0), 2)]


def test_a_candidate_may_name_another_preset_of_the_family(tmp_path):
    plan = load_plan(write_plan(tmp_path, """
        [base]
        preset = "tf-64-4-4"
        model = { dropout = 0.2 }
        [rule]
        select = "none"
        strict = false
        [[candidate]]
        label = "wide"
        preset = "tf-128-8-8"
        """))
    wide = plan.candidates[0]
    assert wide.preset == "tf-128-8-8" and wide.model["ff_dim"] == 128 and wide.model["n_layers"] == 8
    assert wide.model["dropout"] == 0.2   # the base's change, over the candidate's preset
    assert wide.name(0).startswith("tf-128-8-8-wide-")


def test_a_deadline_stops_a_run_and_publishes_it_unfinished_until_a_later_call(tmp_path, chars, monkeypatch):
    monkeypatch.setenv("RESLM_DATA", str(chars.path.parent))   # a published run finds its data there
    path = write_plan(tmp_path, BASE.replace("seeds = [0, 1]", "seeds = [0]\nselect = \"none\""))
    results, runs, root = tmp_path / "results", tmp_path / "runs", chars.path.parent
    plan = load_plan(path)
    real_train, cached = frunner.train, []

    def train(folder, **kw):   # the states are kept while it trains, and gone once it stops
        cached.append(kw["cache_states"])
        return real_train(folder, **kw)

    monkeypatch.setattr(frunner, "train", train)
    entry = plan_table(plan, results, runs)[0]
    assert frunner.run_one(plan, entry, results, runs, until=0.0, data_root=root, progress=False,
                           say=lambda m: None) == "stopped"
    entry = plan_table(plan, results, runs)[0]
    assert entry.state == "unfinished" and entry.folder == results / entry.name
    assert not (runs / entry.name / "states").exists() and not (entry.folder / "states").exists()
    assert run(path, results, runs, root, minutes=0.5)[0].state == "unfinished"   # under a minute: nothing starts
    assert run(path, results, runs, root, minutes=30)[0].state == "done"          # continued in place
    assert cached == ["auto", "auto"] and not (entry.folder / "states").exists()


def test_a_published_run_continues_from_the_data_root_and_a_failed_start_leaves_it_as_published(
        tmp_path, chars, monkeypatch):
    monkeypatch.delenv("RESLM_DATA", raising=False)   # the data is only where --root says
    monkeypatch.chdir(tmp_path)
    path, results, runs, root, plan, _ = stopped_at_once(tmp_path, chars)
    folder = plan_table(plan, results, runs)[0].folder
    files = lambda: {f.name: f.read_bytes() for f in folder.iterdir() if f.is_file() and f.name != LOCK}  # noqa: E731
    published = files()
    real_train = frunner.train

    def failing(folder, **kw):
        raise ReslmError("the dataset is gone")

    monkeypatch.setattr(frunner, "train", failing)
    with pytest.raises(ReslmError, match="gone"):   # threads given: its config is restored too
        frunner.run_one(plan, plan_table(plan, results, runs)[0], results, runs, threads=2, data_root=root,
                        progress=False, say=lambda m: None)
    assert files() == published   # not re-signed
    monkeypatch.setattr(frunner, "train", real_train)
    assert run(path, results, runs, root, minutes=30)[0].state == "done"   # found under root, not ./data


@pytest.mark.parametrize("change, message", [
    ("[base]\nlabel = 'x'\nfamily = 'rc'\ncolour = 1\n", "unknown key(s) colour"),
    ("[base]\nfamily = 'rc'\nmodel = { sise = 3 }\n", "unknown rc option(s): sise"),
    ("[base]\nfamily = 'rc'\ntrain = { lr = 'fast' }\n", "lr must be of type float"),
    ("[base]\nfamily = 'rc'\ntrain = { seed = 3 }\n", "sets seed"),
    ("[base]\npreset = 'tf-64-4-4'\n[rule]\nselect = 'none'\n", "breaks the strict rules"),
    ("[base]\nfamily = 'rc'\nmodel = { size = 5000 }\n[rule]\nselect = 'none'\n", "over the plan's budget"),
    ("[base]\nfamily = 'rc'\n[rule]\nselect = 'screen'\n", "no validation split"),
    ("[base]\nfamily = 'rc'\n[rule]\nselect = 'none'\n[[candidate]]\ntrain = { lr = 1e-3 }\n", "needs a label"),
    ("[base]\nfamily = 'rc'\n[rule]\nselect = 'none'\n[[candidate]]\nlabel = 'same'\n", "same configuration as base"),
    ("[base]\nfamily = 'rc'\n[rule]\nseeds = [0, 0]\nselect = 'none'\n", "distinct"),
    ("[base]\npreset = 'rc-9'\n", "unknown preset"),
    ("[base]\npreset = 'tf-64-4-4'\n[rule]\nselect = 'none'\nstrict = false\n[[candidate]]\nlabel = 'x'\n"
     "preset = 'rc-750'\n", "'rc-750' is not a tf preset"),
    ("[base\n", "not valid TOML"),
])
def test_a_bad_plan_is_refused_before_anything_runs(tmp_path, capsys, change, message):
    path = write_plan(tmp_path, change, name="bad")
    with pytest.raises(ReslmError, match="plan .*bad.toml") as e:
        load_plan(path)
    assert message in str(e.value)
    assert main(["frontier", "run", str(path), "--results", str(tmp_path / "r"), "--runs", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not (tmp_path / "r").exists() and not (tmp_path / "runs").exists()


def test_every_bundled_plan_loads():
    plans = [load_plan(p) for p in bundled_plans()]
    assert {"esn-lr", "gru-ceiling"} <= {p.name for p in plans}
    for p in plans:
        assert p.about.strip() and all(c.label for c in p.candidates)


def test_bench_runs_a_reservoir_from_a_user_file_in_the_recipe(where, tmp_path, monkeypatch, capsys, registry):
    path, results, runs, root = where
    monkeypatch.chdir(tmp_path)
    user = tmp_path / "ring.py"
    user.write_text(textwrap.dedent("""\
        import torch
        from reslm.reservoir import ESN, ESNConfig, RESERVOIRS

        class RingESN(ESN):
            def __init__(self, cfg):
                super().__init__(cfg)
                self.W_T.copy_(cfg.spectral_radius * torch.roll(torch.eye(cfg.size), 1, dims=0))

        RESERVOIRS["ring-test"] = (ESNConfig, RingESN)
        """))
    out = tmp_path / "bench"
    r = bench("ring-test", imports=[str(user)], seeds=(0, 1), out=out, results=results, data_root=root,
              progress=False, recipe_plan=str(path), memory_positions=0)
    assert r["mine"]["test"][2] == 2 and f"**ring-test** (this bench; {user}, sha256 " in r["table"]
    # its runs record the reservoir by its name and the file's sha256
    sha = hashlib.sha256(user.read_bytes()).hexdigest()[:12]
    assert all(read_config(Path(d))["model"]["reservoir"] == f"ring-test@{sha}" for d in r["runs"].values())
    card = (out / "card.md").read_text()
    assert "ring-test" in card and str(user) in card and "Strict reservoir rules" in card
    # the seeds at once, each in its own process: it must register the user's reservoir too, and train the same
    again = bench("ring-test", imports=[str(user)], seeds=(0, 1), out=tmp_path / "jobs", results=results,
                  data_root=root, progress=False, recipe_plan=str(path), jobs=2, memory_positions=0)
    assert again["mine"]["test"] == r["mine"]["test"]
    with pytest.raises(ReslmError, match="unknown reservoir"):
        bench("no-such-reservoir", out=out, results=results, recipe_plan=str(path))
    capsys.readouterr()
    assert main(["frontier", "bench", "--reservoir", "nope", "--out", str(out), "--results", str(results)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown reservoir 'nope'" in err[0]


def test_a_run_trained_again_from_its_plan_gives_the_same_figures(where, tmp_path):
    """Same plan, same seed, same machine: a run re-trained into a fresh registry scores what it did."""
    path, results, runs, root = where
    plan = load_plan(path)
    name = plan.base.name(0)
    run(path, results, runs, root, only=(name,))
    again = tmp_path / "again"
    run(path, again / "results", again / "runs", root, only=(name,))
    a, b = (json.loads((r / name / "summary.json").read_text()) for r in (results, again / "results"))
    figures = [k for k in a if k.endswith(("_loss", "_bpc"))]
    assert figures and all(a[k] == b[k] for k in figures)


def test_an_unknown_device_is_refused_before_any_run_starts(where, capsys):
    path, results, runs, root = where
    assert main(["frontier", "run", str(path), "--device", "bogus", "--results", str(results), "--runs", str(runs),
                 "--root", str(root)]) == 2
    assert "unknown device 'bogus'" in capsys.readouterr().err and not runs.exists()


def test_the_gap_figure_draws_each_configuration_and_each_screen_against_its_base(screened, monkeypatch, tmp_path):
    from reslm.frontier import report as freport
    from reslm.frontier.runner import index_results
    (path, results, runs, root), table = screened
    plan = load_plan(path)
    monkeypatch.setattr(freport, "GAP_PLANS", (("reservoir", (plan.name,)),))
    rows, curves = freport.gap_figures({plan.name: plan}, results, index_results(results))
    groups = selection(plan, table)["groups"]
    assert {r["configuration"] for r in rows} == {k for k, g in groups.items() if g["seeds"]}
    base = next(r for r in rows if r["configuration"] == "b")
    assert base["seeds"] == 2 and base["test_stream"] == pytest.approx(groups["b"]["test_stream"][0])
    # every candidate shares the base's schedule, so each evaluation meets one of the base's exactly
    assert {c["configuration"] for c in curves} == {"lr3e-2", "lr1e-4"}
    for c in curves:
        assert c["difference"] == pytest.approx(c[VAL_LOSS] - c[f"base_{VAL_LOSS}"]) and c["finished"]
    # how far each route got: every screened candidate, ranked by its validation CE minus the base's
    text = freport.fill_plan_blocks("<!-- routes:begin -->\n<!-- routes:end -->\n", results, plans={plan.name: plan})
    ranked = [line.split(" | ") for line in text.splitlines() if line.startswith(f"| {plan.name}: ")]
    screen = selection(plan, table)["screen"]
    assert [r[0][2:] for r in ranked] == [f"{plan.name}: {k}" for k in sorted(("lr3e-2", "lr1e-4"), key=screen.get)]
    assert all(float(r[4]) == pytest.approx(screen[r[0].split(": ")[1]] - screen["b"], abs=1e-4) for r in ranked)
    (tmp_path / "docs").mkdir()
    (tmp_path / "results").mkdir(exist_ok=True)
    made = freport.write_gap_figure(tmp_path, {plan.name: plan})
    assert made["csv"].is_file() and made["curves_csv"].is_file()
    assert made["png"] is None or made["png"].is_file()


def test_sigterm_stops_a_run_continued_in_place_as_the_deadline_does_and_starts_no_other(tmp_path, chars,
                                                                                        monkeypatch):
    """A published unfinished run continued in place, then SIGTERM (reslm.core.stop): it stops at the end of
    that step with its checkpoint and summary, is published again with its check (`reslm verify` accepts
    it), and the call starts no other run; a second SIGTERM interrupts at once. A later call finishes both."""
    import signal as signals

    from reslm.cli import _interrupt
    from reslm.core import stop
    from reslm.train import loop
    monkeypatch.setenv("RESLM_DATA", str(chars.path.parent))
    path, results, runs, root, plan, first = stopped_at_once(tmp_path, chars, seeds="[0, 1]")
    real_step, steps = loop._train_step, []

    def step_then_sigterm(t):
        steps.append(t.step)
        lr = real_step(t)
        if len(steps) == 3:
            _interrupt(signals.SIGTERM, None)   # the handler main() installs: taken, so it returns
            with pytest.raises(KeyboardInterrupt):
                _interrupt(signals.SIGTERM, None)   # a second one: at once
        return lr

    monkeypatch.setattr(loop, "_train_step", step_then_sigterm)
    try:
        table = run(path, results, runs, root)
    finally:
        assert stop.requested()
        stop.clear()
    assert [e.state for e in table] == ["unfinished", "pending"] and not (runs / table[1].name).exists()
    folder = results / first.name
    manifest = json.loads((folder / "manifest.json").read_text())
    summary = json.loads((folder / "summary.json").read_text())
    assert manifest["step"] == summary["steps"] == steps[0] + 3 and manifest["check"]
    assert main(["verify", str(folder)]) == 0
    monkeypatch.setattr(loop, "_train_step", real_step)
    assert [e.state for e in run(path, results, runs, root)] == ["done", "done"]
