"""Issue 32: what reslm reads or writes in a folder it may not have written (a run folder or a published
folder copied from someone else) is never followed or trusted: links and special files are refused
with one line and the file they point at is left as it was; JSON fields of the wrong type are one
line, not a traceback; names listed inside a folder stay inside it. Tiny rc runs on the shared corpus."""
import json
import os
import shutil
import threading

import pytest

import reslm.train as tt
from reslm.cli import main
from reslm.publish import publish
from reslm.run.registry import MANIFEST, PROVENANCE, WEIGHTS

MODEL = dict(size=16)
TRAIN = dict(batch_size=64, lr=3e-3, epochs_per_shard=1, epoch_samples=128, log_every=1, eval_samples=256)
EVAL = ["--length", "20", "--score", "300", "--ngrams", "3", "--json"]
VICTIM = "precious user data\n"


@pytest.fixture(autouse=True)
def data_root(chars, monkeypatch):
    """Published folders name their dataset only: it is found under RESLM_DATA."""
    monkeypatch.setenv("RESLM_DATA", str(chars.path.parent))


@pytest.fixture(scope="module")
def made(chars, tmp_path_factory):
    """A finished rc run, an unfinished one (stopped at its first evaluation) and a publish of each."""
    base = tmp_path_factory.mktemp("untrusted")
    run = tt.create_run(base / "run", "rc", MODEL, TRAIN, chars)
    tt.train(run, progress=False)
    half = tt.create_run(base / "half", "rc", MODEL, {**TRAIN, "eval_every": 1}, chars)
    tt.train(half, progress=False, stop_at=1)
    publish(run, base / "pub", date="2026-01-01T00:00:00+00:00")
    publish(half, base / "pubhalf", date="2026-01-01T00:00:00+00:00")
    return base


def copy(made, name, tmp_path) -> tuple:
    """(a copy of made/name in tmp_path/x, a user's file beside it)."""
    folder = tmp_path / "x"
    shutil.copytree(made / name, folder, ignore=shutil.ignore_patterns(".lock"))
    victim = tmp_path / "victim.txt"
    victim.write_text(VICTIM)
    return folder, victim


def refused(capsys, *words) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("reslm: error: ")]
    assert lines and "Traceback" not in err, err
    for w in words:
        assert w in lines[-1], lines[-1]
    return lines[-1]


def plant(folder, name, victim):
    """folder/name becomes a symbolic link to the user's file."""
    (folder / name).unlink(missing_ok=True)
    os.symlink(os.path.relpath(victim, folder), folder / name)


# --- 1. symbolic links are never followed --------------------------------------------------------------

@pytest.mark.parametrize("source", ["run", "pub"])
@pytest.mark.parametrize("command", ["eval", "publish"])
def test_a_lock_link_is_not_followed(made, tmp_path, capsys, source, command):
    """The issue's example: X/.lock -> ../victim.txt; eval and publish refuse and the file is unchanged."""
    folder, victim = copy(made, source, tmp_path)
    plant(folder, ".lock", victim)
    argv = ["eval", str(folder), *EVAL, "--write"] if command == "eval" else \
        ["publish", str(made / "half"), str(folder), "--replace"]
    assert main(argv) == 2
    refused(capsys, "link")
    assert victim.read_text() == VICTIM


def test_a_dangling_lock_link_creates_nothing(made, tmp_path, capsys):
    folder, victim = copy(made, "run", tmp_path)
    target = tmp_path / "made-by-reslm.txt"
    os.symlink(os.path.relpath(target, folder), folder / ".lock")
    assert main(["eval", str(folder), *EVAL]) == 2
    refused(capsys, "link")
    assert not target.exists()


def test_a_metrics_link_is_not_cut_on_resume(made, tmp_path, capsys):
    """metrics.jsonl -> a user's file whose last line looks torn: --resume refuses, the file keeps it."""
    folder, victim = copy(made, "half", tmp_path)
    victim.write_text((folder / "metrics.jsonl").read_text() + '{"torn')
    before = victim.read_text()
    plant(folder, "metrics.jsonl", victim)
    assert main(["train", "--out", str(folder), "--resume", "--no-progress"]) == 2
    refused(capsys, "metrics.jsonl", "link")
    assert victim.read_text() == before


@pytest.mark.parametrize("name", ["config.json", "checkpoint.pt", "summary.json"])
def test_links_in_a_run_folder_are_refused(made, tmp_path, capsys, name):
    folder, victim = copy(made, "run", tmp_path)
    shutil.copy(folder / name, victim)
    plant(folder, name, victim)
    before = victim.read_bytes()
    assert main(["publish", str(folder), str(tmp_path / "out")]) == 2
    refused(capsys, name, "link")
    assert victim.read_bytes() == before and not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["config.json", MANIFEST, WEIGHTS, "metrics.jsonl", PROVENANCE, "summary.json"])
def test_links_in_a_published_folder_are_refused(made, tmp_path, capsys, name):
    """A published folder whose listed file is a link (even to a copy of the right bytes) is refused
    by eval (and --resume)."""
    folder, victim = copy(made, "pub", tmp_path)
    shutil.copy(folder / name, victim)
    plant(folder, name, victim)
    argv = ["eval", str(folder), *EVAL] if name != "metrics.jsonl" else ["train", "--out", str(folder), "--resume"]
    assert main(argv) == 2
    refused(capsys, "link")


# --- 2. special files are never opened or waited on --------------------------------------------------------

@pytest.mark.parametrize("name", ["checkpoint.pt", "metrics.jsonl", "config.json", ".lock"])
def test_a_fifo_is_refused_without_hanging(made, tmp_path, capsys, name):
    """A FIFO in place of a run's file: one line at once (the old code blocked reading checkpoint.pt)."""
    folder, _ = copy(made, "half", tmp_path)
    (folder / name).unlink(missing_ok=True)
    os.mkfifo(folder / name)
    result = {}
    t = threading.Thread(target=lambda: result.update(rc=main(["train", "--out", str(folder), "--resume",
                                                                "--no-progress"])), daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "reslm hung on a FIFO"
    assert result["rc"] == 2
    refused(capsys, "FIFO")


def test_a_folder_in_place_of_a_file_is_refused(made, tmp_path, capsys):
    folder, _ = copy(made, "pub", tmp_path)
    (folder / "summary.json").unlink()
    (folder / "summary.json").mkdir()
    assert main(["eval", str(folder), *EVAL]) == 2
    refused(capsys, "summary.json")


# --- 3. JSON fields are type-checked: one line, never a traceback ------------------------------------------

def _edit(path, change):
    obj = json.loads(path.read_text())
    change(obj)
    path.write_text(json.dumps(obj))


MANIFEST_EDITS = {
    "format a string": lambda m: m.update(format="1"),
    "files a list": lambda m: m.update(files=[]),
    "a digest a number": lambda m: m["files"].update({"config.json": 5}),
    "a listed name outside": lambda m: m["files"].update({"../victim.txt": "0" * 64}),
    "a listed absolute name": lambda m: m["files"].update({"/etc/passwd": "0" * 64}),
    "fixed entries not objects": lambda m: m["fixed"].update({k: 3 for k in m["fixed"]}),
    "a shape of strings": lambda m: [fp.update(shape=["a"]) for fp in m["fixed"].values()],
    "step a string": lambda m: m.update(step="10"),
    "finished a string": lambda m: m.update(finished="yes"),
}


@pytest.mark.parametrize("edit", list(MANIFEST_EDITS))
def test_a_wrongly_typed_manifest_is_one_line(made, tmp_path, capsys, edit):
    folder, victim = copy(made, "pub", tmp_path)
    _edit(folder / MANIFEST, MANIFEST_EDITS[edit])
    for argv in (["eval", str(folder), *EVAL], ["generate", str(folder), "--length", "5", "--prompt", "to"],
                 ["publish", str(made / "run"), str(folder)]):
        assert main(argv) == 2, argv
        refused(capsys)
    assert victim.read_text() == VICTIM


PROVENANCE_EDITS = {
    "publishes a dict": lambda p: p.update(publishes={}),
    "a publish without a cpu": lambda p: p["publishes"][0].pop("cpu"),
    "a step string": lambda p: p["publishes"][0].update(step="1"),
    "wall a list": lambda p: p.update(wall=[1, 2]),
    "threads a string": lambda p: p.update(threads="2"),
    "command a number": lambda p: p.update(command=3),
    "not an object": lambda p: p.clear() or p.update(x=1) and None,
}


@pytest.mark.parametrize("edit", list(PROVENANCE_EDITS))
def test_a_wrongly_typed_provenance_is_one_line(made, tmp_path, capsys, edit):
    """publish into (and over) a folder whose provenance.json has a field of the wrong type."""
    folder, _ = copy(made, "pub", tmp_path)
    path = folder / PROVENANCE
    if edit == "not an object":
        path.write_text("[1, 2]")
    else:
        _edit(path, PROVENANCE_EDITS[edit])
    assert main(["publish", str(made / "run"), str(folder)]) == 2
    refused(capsys, PROVENANCE)


CONFIG_EDITS = {
    "vocab a number": lambda c: c["data"].update(vocab=3),
    "vocab of numbers": lambda c: c["data"].update(vocab=[1, 2]),
    "fingerprint a list": lambda c: c["data"].update(fingerprint=[]),
    "a model field an object": lambda c: c["model"].update(size={"a": 1}),
    "a train field a list": lambda c: c["train"].update(lr=[1]),
    "name a number": lambda c: c["data"].update(name=5),
}


@pytest.mark.parametrize("edit", list(CONFIG_EDITS))
def test_a_wrongly_typed_config_is_one_line(made, tmp_path, capsys, edit):
    folder, _ = copy(made, "run", tmp_path)
    _edit(folder / "config.json", CONFIG_EDITS[edit])
    for argv in (["eval", str(folder), *EVAL], ["publish", str(folder), str(tmp_path / "out")]):
        assert main(argv) == 2
        refused(capsys, "config.json")


def test_a_states_link_is_not_followed(made, tmp_path, capsys):
    """RUN/states -> a user's folder: --cache-states would have removed its *.pt files; it is refused."""
    folder, _ = copy(made, "half", tmp_path)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "model.pt").write_text(VICTIM)
    os.symlink(mine, folder / "states")
    assert main(["train", "--out", str(folder), "--resume", "--cache-states", "--no-progress"]) == 2
    refused(capsys, "states", "link")
    assert (mine / "model.pt").read_text() == VICTIM and sorted(p.name for p in mine.iterdir()) == ["model.pt"]


def test_a_search_lock_link_is_not_followed(chars, tmp_path, capsys):
    out = tmp_path / "search"
    out.mkdir()
    (out / "search.json").write_text('{"family": "rc"}')
    victim = tmp_path / "victim.txt"
    victim.write_text(VICTIM)
    os.symlink(victim, out / "study.db.lock")
    assert main(["search", "--out", str(out), "--trials", "1", "--size", "16", "--shard-chars", "1000",
                 "--data", str(chars.path), "--no-progress"]) == 2
    refused(capsys, "link")
    assert victim.read_text() == VICTIM
