"""Issue 32.2-4: a command writes only into a folder of its own kind; publish never silently replaces
another run's published folder; what report, publish and resume read is what was published; eval holds
the run's lock and no stale eval.json is published; a publish appears whole or not at all. Tiny rc
runs on the shared corpus."""
import errno
import json
import shutil
import subprocess
import sys

import pytest
from safetensors import SafetensorError

import reslm.publish as pub
import reslm.train as tt
from reslm.cli import main
from reslm.publish import publish
from reslm.run.registry import EVAL, MANIFEST, PROVENANCE, read_manifest
from reslm.experiments.search import check_search_folder
from reslm.core.errors import ReslmError

MODEL = dict(size=16)
TRAIN = dict(batch_size=64, lr=3e-3, epochs_per_shard=1, epoch_samples=128, log_every=1, eval_samples=256)
EVAL_FLAGS = ["--length", "20", "--score", "300", "--ngrams", "3", "--json"]
DATE = "2026-01-01T00:00:00+00:00"


@pytest.fixture(autouse=True)
def data_root(chars, monkeypatch):
    monkeypatch.setenv("RESLM_DATA", str(chars.path.parent))


@pytest.fixture(scope="module")
def runs(chars, tmp_path_factory):
    """Finished rc runs that differ in one field each, and an unfinished one."""
    base = tmp_path_factory.mktemp("own")
    out = {}
    for name, model, train in (("a", MODEL, TRAIN), ("lr", MODEL, {**TRAIN, "lr": 1e-3}),
                               ("seed", {**MODEL, "seed": 1}, {**TRAIN, "seed": 1}),
                               ("half", MODEL, {**TRAIN, "eval_every": 1})):
        out[name] = tt.create_run(base / name, "rc", model, train, chars)
        tt.train(out[name], progress=False, stop_at=1 if name == "half" else None)
    out["pub"] = base / "pub"
    publish(out["a"], out["pub"], date=DATE)
    out["pubhalf"] = base / "pubhalf"
    publish(out["half"], out["pubhalf"], date=DATE)
    return out


def snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and p.name != ".lock"}


def last_error(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("reslm: error: ")]
    assert lines and "Traceback" not in err, err
    return lines[-1]


def copy(src, dst):
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".lock"))
    return dst


# --- ownership ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("files", [["trials.csv", "best.json", "history.png"], ["notes.txt"], ["study.db"]])
def test_search_refuses_a_folder_that_is_not_a_search_folder(chars, tmp_path, capsys, files):
    """The issue's example: --out DIR holding a user's trials.csv, best.json and history.png (or anything, or
    a study.db that is not SQLite) is refused before any trial; the files are unchanged."""
    out = tmp_path / "mine"
    out.mkdir()
    for f in files:
        (out / f).write_text(f"user's {f}\n")
    before = snapshot(out)
    assert main(["search", "--out", str(out), "--trials", "1", "--size", "16", "--shard-chars", "1000",
                 "--data", str(chars.path), "--no-progress"]) == 2
    assert "not a search folder" in last_error(capsys)
    assert snapshot(out) == before and not (out / ".lock").exists()


def test_search_accepts_its_own_folders(tmp_path):
    check_search_folder(tmp_path / "new")                 # missing
    (tmp_path / "empty").mkdir()
    check_search_folder(tmp_path / "empty")
    (tmp_path / "stamped").mkdir()
    (tmp_path / "stamped" / "search.json").write_text('{"family": "rc"}')
    (tmp_path / "stamped" / "trials.csv").write_text("x")
    check_search_folder(tmp_path / "stamped")
    (tmp_path / "old").mkdir()                             # from before search.json: an SQLite study
    (tmp_path / "old" / "study.db").write_bytes(b"SQLite format 3\x00" + bytes(100))
    check_search_folder(tmp_path / "old")
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ReslmError, match="not a directory"):
        check_search_folder(tmp_path / "afile")


def test_workers_started_together_take_turns_claiming_a_new_search_folder(tmp_path):
    """A worker that finds another one making the folder (its stamp's temp file there, its .lock held)
    waits for it and joins the search, instead of refusing a folder that is not yet stamped."""
    import threading
    from reslm.experiments.search import _claim, _turns
    out = tmp_path / "s"
    out.mkdir()
    joined = {}
    with _turns(out / ".lock"):   # the first worker, half-way through its claim
        (out / ".search.json.x.tmp").write_text('{"family": "rc"}')
        second = threading.Thread(target=lambda: joined.update(made=_claim(out, {"family": "rc"})))
        second.start()
        (out / ".search.json.x.tmp").rename(out / "search.json")
    second.join()
    assert joined == {"made": False} and json.loads((out / "search.json").read_text()) == {"family": "rc"}


@pytest.mark.parametrize("other,why", [("lr", "lr 0.001, not 0.003"), ("seed", "seed 1, not 0")])
def test_publish_refuses_another_configuration(runs, tmp_path, capsys, other, why):
    """The issue's example: a run with another --lr (or seed) does not silently replace results/NAME."""
    dest = copy(runs["pub"], tmp_path / "pub")
    before = snapshot(dest)
    assert main(["publish", str(runs[other]), str(dest)]) == 2
    line = last_error(capsys)
    assert "holds another published run" in line and "--replace" in line
    assert snapshot(dest) == before


def test_publish_replace_keeps_provenance_true(runs, tmp_path):
    dest = copy(runs["pub"], tmp_path / "pub")
    assert main(["publish", str(runs["lr"]), str(dest), "--replace"]) == 0
    prov = json.loads((dest / PROVENANCE).read_text())
    assert "--lr 0.001" in prov["command"] and len(prov["publishes"]) == 1      # the old run's history is gone
    cfg = json.loads((dest / "config.json").read_text())
    assert cfg["train"]["lr"] == 1e-3
    assert main(["eval", str(dest), *EVAL_FLAGS]) == 0


def test_publishing_the_same_run_again_continues_its_history(runs, tmp_path):
    dest = copy(runs["pub"], tmp_path / "pub")
    publish(runs["a"], dest, date="2026-02-01T00:00:00+00:00")
    prov = json.loads((dest / PROVENANCE).read_text())
    assert len(prov["publishes"]) == 1 and prov["publishes"][0]["date"].startswith("2026-02")   # same step: updated


def test_publish_refuses_a_folder_of_the_users(runs, tmp_path, capsys):
    dest = tmp_path / "mine"
    dest.mkdir()
    (dest / "notes.txt").write_text("mine")
    assert main(["publish", str(runs["a"]), str(dest)]) == 2
    assert "not a published run" in last_error(capsys)
    assert snapshot(dest) == {"notes.txt": b"mine"}


# --- integrity -----------------------------------------------------------------------------------------------

def _repo(runs, tmp_path):
    repo = tmp_path / "repo"
    copy(runs["pub"], repo / "results" / "rc-x")
    return repo


@pytest.mark.parametrize("name", ["metrics.jsonl", "summary.json", "provenance.json", "config.json"])
def test_report_refuses_an_edited_published_file(runs, tmp_path, capsys, name):
    """Lowering test_loss in a published metrics.jsonl no longer changes the table with exit 0."""
    repo = _repo(runs, tmp_path)
    assert main(["report", "--repo", str(repo)]) == 0
    capsys.readouterr()
    path = repo / "results" / "rc-x" / name
    text = path.read_text()
    path.write_text(text.replace('"test_loss": ', '"test_loss": 0.5, "was": ', 1) if name == "metrics.jsonl"
                    else text.replace("{", '{"edited": 1, ', 1))
    assert main(["report", "--repo", str(repo)]) == 2
    assert name in last_error(capsys)


@pytest.mark.parametrize("curve", ["/etc/passwd", "../outside.csv", "docs/missing.csv"])
def test_report_refuses_a_legacy_curve_outside_the_repository(runs, tmp_path, capsys, curve):
    repo = _repo(runs, tmp_path)
    (tmp_path / "outside.csv").write_text("name,shard\n")
    (repo / "results" / "legacy.csv").write_text(
        "preset,family,trainable_params,context_mode,cycle,curve,train_seconds,reservoir_seconds,cpu,threads,"
        f"state_dtype,precision,note\nrc-250,rc,1,window,1,{curve},1,1,x,1,float32,fp32,\n")
    assert main(["report", "--repo", str(repo)]) == 2
    assert "legacy.csv line 2" in last_error(capsys)


@pytest.mark.parametrize("name", ["metrics.jsonl", "summary.json", "provenance.json"])
def test_resume_of_a_published_run_refuses_an_edited_file(runs, tmp_path, capsys, name):
    """train --out results/NAME --resume no longer re-signs an edited file into the new manifest."""
    dest = copy(runs["pubhalf"], tmp_path / "pubhalf")
    path = dest / name
    path.write_text(path.read_text().replace("{", '{"edited": 1, ', 1))
    before = snapshot(dest)
    assert main(["train", "--out", str(dest), "--resume", "--no-progress"]) == 2
    assert name in last_error(capsys)
    assert snapshot(dest) == before


def test_eval_refuses_a_run_that_is_training(runs, tmp_path, capsys):
    """Another process holds the run (as a trainer does): eval is refused at once and writes nothing."""
    run = copy(runs["a"], tmp_path / "run")
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from reslm.run import lock_run\n"
                               f"with lock_run({str(run)!r}):\n print('held', flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main(["eval", str(run), *EVAL_FLAGS]) == 2
        assert "in use by pid" in last_error(capsys)
        assert not (run / EVAL).exists()
    finally:
        holder.stdin.close()
        holder.wait(30)


def test_a_stale_eval_is_dropped_at_resume_and_never_published(runs, tmp_path, capsys):
    """eval.json of step 1, then --resume trains on: the eval is removed; a copy put back is left out of a
    publish (its weights_sha256 is not the weights'); a current one is published."""
    run = copy(runs["half"], tmp_path / "half")
    assert main(["eval", str(run), *EVAL_FLAGS]) == 0
    old = (run / EVAL).read_bytes()
    assert main(["train", "--out", str(run), "--resume", "--no-progress"]) == 0
    assert not (run / EVAL).exists()
    (run / EVAL).write_bytes(old)
    capsys.readouterr()
    publish(run, tmp_path / "p1", date=DATE)
    assert EVAL not in read_manifest(tmp_path / "p1")["files"] and "left out" in capsys.readouterr().err
    assert main(["eval", str(run), *EVAL_FLAGS]) == 0
    publish(run, tmp_path / "p2", date=DATE)
    assert EVAL in read_manifest(tmp_path / "p2")["files"]
    ev = json.loads((tmp_path / "p2" / EVAL).read_text())
    assert ev["run"] == "p2"                                    # no path of this machine


def test_published_files_hold_no_absolute_paths(runs, tmp_path):
    assert main(["eval", str(runs["a"]), *EVAL_FLAGS]) == 0
    publish(runs["a"], tmp_path / "p", date=DATE)
    machine = str(runs["a"].parents[1])                         # the folder every test path of this machine is in
    for p in (tmp_path / "p").iterdir():
        if p.suffix in (".json", ".jsonl"):
            assert machine not in p.read_text(), p.name


# --- atomic publish --------------------------------------------------------------------------------------------

def _fail_weights(monkeypatch, kind="oserror"):
    def boom(*a, **k):
        if kind == "safetensors":   # what safetensors raises with ~30 KB free (it was a traceback)
            raise SafetensorError("Error while serializing: IoError(No space left on device (os error 28))")
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(pub, "save_file", boom)


@pytest.mark.parametrize("kind", ["oserror", "safetensors"])
def test_a_failed_publish_leaves_nothing_and_can_be_rerun(runs, tmp_path, capsys, monkeypatch, kind):
    """A full disk mid-publish: one line, no half folder (config/metrics without a manifest), no temp
    folder; the same command then succeeds."""
    dest = tmp_path / "results" / "new"
    _fail_weights(monkeypatch, kind)
    assert main(["publish", str(runs["a"]), str(dest)]) == 2
    assert "could not write" in last_error(capsys)
    assert not (tmp_path / "results").exists()               # not even the parent it made
    monkeypatch.undo()
    assert main(["publish", str(runs["a"]), str(dest)]) == 0
    assert sorted(p.name for p in dest.parent.iterdir()) == ["new"]


def test_a_failed_update_keeps_the_published_folder(runs, tmp_path, capsys, monkeypatch):
    dest = copy(runs["pub"], tmp_path / "pub")
    before = snapshot(dest)
    _fail_weights(monkeypatch)
    assert main(["publish", str(runs["a"]), str(dest)]) == 2
    capsys.readouterr()
    assert snapshot(dest) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pub"]


def test_an_interrupted_publish_leaves_nothing(runs, tmp_path, monkeypatch):
    dest = tmp_path / "new"

    def interrupt(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(pub, "save_checkpoint", interrupt)
    with pytest.raises(KeyboardInterrupt):
        publish(runs["half"], dest, date=DATE)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["sweep", "demo"])
def test_sweep_and_demo_refuse_a_folder_of_the_users(tmp_path, capsys, command):
    """sweep writes scaling.csv/.json/.png and demo writes demo.json into --out: a folder holding anything
    else (here the user's scaling.csv is a folder's of notes) is refused before any training."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    argv = ["sweep", "--out", str(out)] if command == "sweep" else ["demo", "--out", str(out)]
    assert main(argv) == 2
    assert "notes.txt, which is not" in last_error(capsys)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
