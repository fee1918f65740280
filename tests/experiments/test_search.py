"""`reslm search`: the optuna study (resumable, shared storage), its outputs, the search spaces, the
held-out objective (the test shard unread) and the missing-optuna error."""
import csv
import json
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path

import pytest

import reslm.train.batches as rb
import reslm.train as tt
from reslm.experiments import search
from reslm.cli import main
from reslm.reservoir import RESERVOIRS, parse_options

pytest.importorskip("optuna")

MODEL = dict(size=30, streams=8)


def _csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_search_writes_outputs_and_resumes_the_study(chars, tmp_path, monkeypatch):
    tokens = rb.CharShards.tokens

    def no_test(self, shard, part="train"):
        assert shard != chars.test_shard, "the search read the test shard"
        return tokens(self, shard, part)

    monkeypatch.setattr(rb.CharShards, "tokens", no_test)
    out = tmp_path / "s"
    first = search.run_search(out, chars, reservoir="leaky", model_over=MODEL, trials=2, progress=False)
    assert first["trials"] == 2 and len(_csv(out / "trials.csv")) == 2
    # a second worker on the same storage (an explicit URL) adds to the same study
    storage = f"sqlite:///{out / 'study.db'}"
    best = search.run_search(out, chars, reservoir="leaky", model_over=MODEL, trials=1, storage=storage, worker=1,
                             progress=False)
    rows = _csv(out / "trials.csv")
    assert best["trials"] == 3 and [r["number"] for r in rows] == ["0", "1", "2"]
    assert {"a_min", "a_max", "spectral_radius", "input_scaling", "bias_scaling", "density"} <= set(rows[0])
    assert "leak_rate" not in rows[0]                          # the leaky substrate sets it per unit
    assert best["heldout_loss"] == min(float(r["value"]) for r in rows if r["state"] == "COMPLETE")
    assert json.loads((out / "best.json").read_text()) == best
    command = (out / "best_command.txt").read_text().strip()
    assert command == best["command"] and "--optimizer ridge" in command and "--reservoir leaky" in command
    assert (out / "history.png").stat().st_size > 0


def test_search_is_seeded_and_flags_fix_knobs(chars, tmp_path):
    runs = [search.run_search(tmp_path / k, chars, model_over={**MODEL, "spectral_radius": 0.7}, trials=1,
                              progress=False) for k in "ab"]
    assert runs[0]["params"] == runs[1]["params"] and runs[0]["heldout_loss"] == runs[1]["heldout_loss"]
    assert "spectral_radius" not in runs[0]["params"] and runs[0]["model"]["spectral_radius"] == 0.7


@pytest.mark.slow
def test_the_best_command_reproduces_the_best_trial(chars, tmp_path, capsys):
    out = tmp_path / "s"
    best = search.run_search(out, chars, model_over=MODEL, trials=4, progress=False)
    assert (out / "importance.png").stat().st_size > 0
    argv = shlex.split(best["command"])[1:]
    argv[argv.index("--out") + 1] = str(tmp_path / "best-run")
    assert main(argv + ["--no-progress", "--device", "cpu"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["heldout_loss"] == pytest.approx(best["heldout_loss"], abs=1e-6)


def test_search_with_the_adam_objective(chars, tmp_path):
    best = search.run_search(tmp_path / "s", chars, model_over=MODEL, optimizer="adam", trials=1, progress=False,
                             train_over=dict(epochs_per_shard=1, epoch_samples=256, batch_size=64, lr=3e-3))
    assert best["finished"] == 1 and 0 < best["heldout_loss"] < 10 and "--optimizer adam" in best["command"]


def test_the_adam_objective_is_a_training_run_on_the_heldout_tails(chars, tmp_path, monkeypatch):
    """An adam trial is reslm.train.train itself (heldout_eval): the same value at the same seed, the
    last evaluation of an ordinary run with heldout_eval, and the test shard never read."""
    over = dict(epochs_per_shard=1, epoch_samples=256, batch_size=64, lr=3e-3)
    tokens = rb.CharShards.tokens

    def no_test(self, shard, part="train"):
        assert shard != chars.test_shard, "the search read the test shard"
        return tokens(self, shard, part)

    monkeypatch.setattr(rb.CharShards, "tokens", no_test)
    a, b = (search.heldout_loss("aerc", dict(MODEL, hidden=4), over, chars, "adam")["value"] for _ in "ab")
    assert a == b and 0 < a < 10
    run = tt.create_run(tmp_path / "run", "aerc", dict(MODEL, hidden=4),
                        {**over, "optimizer": "adam", "heldout_eval": True}, chars)
    summary = tt.train(run, progress=False)
    assert summary["final_heldout_loss"] == a and "final_test_loss" not in summary


@pytest.mark.parametrize("name", list(search.SPACE))
def test_every_substrate_has_a_valid_space(name):
    assert set(search.SPACE) == set(RESERVOIRS) - {"recorded"}   # a recording has no knobs
    model, options = search.search_space(name, {}, {})
    cfg_fields = {f.name for f in fields(RESERVOIRS[name][0])}
    assert set(model) <= cfg_fields and set(options) <= cfg_fields and (model or options)
    for bounds in [*model.values(), *options.values()]:
        low, high, log = bounds
        assert low < high and (not log or low > 0)
    point_model = {k: b[1] for k, b in model.items()}
    point_options = {k: b[0] for k, b in options.items()}
    search._repair(name, point_model, point_options)
    parse_options(name, RESERVOIRS[name][0], search._options_text(point_options))
    fixed, _ = search.search_space(name, {"input_scaling": 1.0}, {})
    assert "input_scaling" not in fixed


def test_a_fixed_string_option_passes_through_the_search_unquoted():
    text = search._options_text({"input_init": "normal", "k": 2, "a_min": 0.1})
    assert text == "input_init=normal,k=2,a_min=0.1"
    assert parse_options("esn", RESERVOIRS["esn"][0], "input_init=normal") == {"input_init": "normal"}


def test_missing_optuna_is_one_line(chars, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "optuna", None)        # import optuna -> ImportError
    assert main(["search", "--data", str(chars.path), "--out", str(tmp_path / "s"), "--trials", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "pip install 'reslm[lab]'" in err
    assert not (tmp_path / "s").exists()


def test_search_bad_input(chars, tmp_path, capsys):
    assert main(["search", "--family", "aerc", "--data", str(chars.path), "--out", str(tmp_path / "a")]) == 2
    assert "use --optimizer adam" in capsys.readouterr().err
    assert main(["search", "--data", str(chars.path), "--out", str(tmp_path / "b"), "--holdout", "0.999"]) == 2
    assert "holdout" in capsys.readouterr().err
    for url in ("bogus://x", f"sqlite:///{tmp_path / 'no' / 'dir' / 'x.db'}"):   # one line, no empty --out left
        assert main(["search", "--data", str(chars.path), "--out", str(tmp_path / "c"), "--storage", url]) == 2
        assert "cannot open study" in capsys.readouterr().err and not (tmp_path / "c").exists()
    assert main(["search", "--help"]) == 0
    assert "held-out" in capsys.readouterr().out


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::optuna.exceptions.ExperimentalWarning")
def test_a_trial_killed_mid_run_is_failed_and_retried(chars, tmp_path):
    """A worker killed mid-trial leaves a RUNNING trial whose heartbeat stops: the next worker marks it
    failed and retries its parameters; finished trials stay as they were. No clock is raced: the dead
    worker's last heartbeat is written into the database as decades old, so it is stale under any
    grace period (waiting out a short one flaked: SQLite's CURRENT_TIMESTAMP has 1-second resolution)."""
    import sqlite3

    import optuna
    out = tmp_path / "s"
    search.run_search(out, chars, model_over=MODEL, trials=2, progress=False)
    db = (out / "study.db").resolve()
    url = f"sqlite:///{db}"
    storage = optuna.storages.RDBStorage(url, heartbeat_interval=search.HEARTBEAT_S, grace_period=search.GRACE_S)
    study = optuna.load_study(study_name="rc-esn-ridge", storage=storage)
    before = [(t.number, t.value) for t in study.trials]
    dead = study.ask({"spectral_radius": optuna.distributions.FloatDistribution(0.1, 1.5)})
    storage.record_heartbeat(dead._trial_id)     # as a worker does, then it "dies": no more heartbeats
    storage.remove_session()
    with sqlite3.connect(db) as con:             # ... long ago
        changed = con.execute("UPDATE trial_heartbeats SET heartbeat = '2000-01-01 00:00:00.000000' "
                              "WHERE trial_id = ?", (dead._trial_id,)).rowcount
    con.close()
    assert changed == 1
    search.run_search(out, chars, model_over=MODEL, trials=1, progress=False)
    trials = optuna.load_study(study_name="rc-esn-ridge", storage=url).trials
    assert [(t.number, t.value) for t in trials[:2]] == before
    assert trials[dead.number].state == optuna.trial.TrialState.FAIL
    retried = [t for t in trials if t.system_attrs.get("failed_trial") == dead.number]
    assert retried and retried[0].state == optuna.trial.TrialState.COMPLETE
    assert retried[0].params["spectral_radius"] == dead.params["spectral_radius"]


def _complete(db: Path, *also: str) -> list[tuple[int, float]]:
    """(number, value) of the study's complete trials, and of those in the states `also` names."""
    import optuna
    study = optuna.load_study(study_name="rc-esn-ridge", storage=f"sqlite:///{db}")
    return [(t.number, t.value) for t in study.trials if t.state.name in ("COMPLETE", *also)]


def test_two_workers_started_together_on_a_new_folder_share_one_study(chars, tmp_path):
    """Two real `reslm search --worker` processes started at once on a folder that does not exist yet: one
    makes it while the other waits its turn, and both add their trials to the one study."""
    out = tmp_path / "s"

    def worker(index: int):
        return subprocess.Popen([sys.executable, "-m", "reslm.cli", "search", "--data", str(chars.path), "--out",
                                 str(out), "--size", "30", "--streams", "8", "--trials", "1", "--worker", str(index),
                                 "--no-progress"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    workers = [worker(0), worker(1)]
    for w in workers:
        assert w.wait(timeout=600) == 0, w.stderr.read()
    assert len(_complete(out / "study.db", "FAIL")) == 2 and json.loads((out / "search.json").read_text())


@pytest.mark.slow
def test_two_workers_share_a_study_and_survive_kill_9(chars, tmp_path):
    """The issue's check, with real processes: two workers fill one SQLite study, one is killed with
    SIGKILL mid-search, its finished trials survive, and re-running it finishes a study of >= 50
    trials. A trial may fail on its own (a density drawn too low for 30 units: "spectral radius 0"), and
    the killed one is failed by its heartbeat only once its grace has passed, which nothing here waits
    for: the count is of finished trials, complete or failed. Heartbeats are shortened so that the
    retry can happen within the run."""
    out, db = tmp_path / "s", tmp_path / "s" / "study.db"
    code = ("import sys; import reslm.experiments.search as s; s.HEARTBEAT_S, s.GRACE_S = 1, 3; from reslm.cli import main; "
            "sys.exit(main(sys.argv[1:]))")

    def worker(index: int, trials: int):
        argv = ["search", "--data", str(chars.path), "--out", str(out), "--size", "30", "--streams", "8",
                "--trials", str(trials), "--worker", str(index), "--no-progress"]
        return subprocess.Popen([sys.executable, "-c", code, *argv], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)

    out.mkdir()
    first = worker(0, 40)
    second = worker(1, 25)
    while first.poll() is None and (not db.exists() or len(_complete(db)) < 10):   # no clock: the worker's
        time.sleep(0.5)                                                            # own end bounds the wait
    first.send_signal(signal.SIGKILL)
    first.wait()
    before = _complete(db)
    assert len(before) >= 10
    assert second.wait(timeout=600) == 0, second.stderr.read()
    again = worker(0, max(1, 50 - len(_complete(db, "FAIL"))))
    assert again.wait(timeout=600) == 0, again.stderr.read()
    after = _complete(db)
    assert set(before) <= set(after) and len(_complete(db, "FAIL")) >= 50
    rows = _csv(out / "trials.csv")
    assert len(rows) == len(after) + sum(r["state"] != "COMPLETE" for r in rows)


def test_a_search_takes_its_size_from_a_preset_of_its_family():
    assert search.search_model("rc", "rc-750", {"spectral_radius": 0.9}) == \
        ("esn", {"size": 750, "spectral_radius": 0.9})
    assert search.search_model("rc", None, {"reservoir": "leaky", "size": 8}) == ("leaky", {"size": 8})
    with pytest.raises(search.ReslmError, match=r"preset rc-750 is family rc, not aerc \(add --family rc\)"):
        search.search_model("aerc", "rc-750", {})
    assert search.search_folder("rc", "esn") == Path("runs/search-rc-esn")
