"""The fourth fault probe's seven faults (issue 51), each refused with one line that names the real cause."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from reslm.cli import main
from reslm.publish import STOPPED_AGE, publish
from reslm.report.docs import check_inputs
from reslm.run import CHECKPOINT, CONFIG
from reslm.run.registry import MANIFEST, published_folders
from reslm.train import create_run, train

ROOT = Path(__file__).resolve().parents[2]
TINY = dict(batch_size=32, epochs_per_shard=1, epoch_samples=64, lr=3e-3, log_every=4, device="cpu")


def one_error(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("reslm: error: ") and "Traceback" not in err, err
    return lines[0]


@pytest.fixture(scope="module")
def runs(chars, tmp_path_factory):
    """A finished tiny rc run and an unfinished one (stopped after its first evaluation), both trained."""
    base = tmp_path_factory.mktemp("runs")
    done = create_run(base / "done", "rc", dict(size=16, streams=4), TINY, chars)
    train(done, progress=False)
    half = create_run(base / "half", "rc", dict(size=16, streams=4), TINY, chars)
    train(half, progress=False, stop_at=2)
    return base, chars


def _rehash(folder: Path, name: str) -> None:
    """What a tamperer who rewrites the manifest does: the file's sha256 and size made to match again."""
    m = json.loads((folder / MANIFEST).read_text())
    data = (folder / name).read_bytes()
    m["files"][name] = hashlib.sha256(data).hexdigest()
    (folder / MANIFEST).write_text(json.dumps(m))


@pytest.mark.parametrize("argv", [
    ["train", "--preset", "rc-250", "--out", ""],
    ["train", "--preset", "rc-250", "--out", "   "],
    ["eval", ""],
    ["generate", " ", "--prompt", "to be"],
    ["publish", "", "results/x"],
    ["publish", "runs/x", " "],
    ["report", "--repo", ""],
    ["reproduce", "--budget", "smoke", "--out", " "],
    ["data", "shakespeare", "--root", ""],
    ["frontier", "run", "esn-lr", "--results", ""],
    ["frontier", "status", " "],
])
def test_an_empty_path_is_refused_for_every_path_argument(argv, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert "is empty: give a path" in one_error(capsys)
    assert not any(tmp_path.iterdir())


def test_a_physical_grid_over_the_cap_is_refused_before_any_work(capsys, tmp_path):
    noise = ",".join(str(i / 1000) for i in range(1000))
    assert main(["eval", str(tmp_path / "no-run"), "--state-noise", noise, "--adc-bits", "0,4,6,8"]) == 2
    line = one_error(capsys)
    assert "4,000 combinations" in line and "cap of 1,000" in line


def test_a_published_unfinished_run_without_its_checkpoint_says_so(runs, capsys, tmp_path):
    base, chars = runs
    dest = tmp_path / "results" / "half"
    publish(base / "half", dest)
    (dest / CHECKPOINT).unlink()
    assert main(["train", "--out", str(dest), "--resume", "--root", str(chars.path.parent), "--no-progress"]) == 2
    line = one_error(capsys)
    assert "unfinished published run" in line and "finished published run (no" not in line


@pytest.mark.parametrize("flags", [["--cycles", "2"], ["--threads", "1"]])
def test_resuming_a_finished_published_run_is_refused_before_its_config_changes(runs, capsys, tmp_path, flags):
    base, chars = runs
    dest = tmp_path / "results" / "done"
    publish(base / "done", dest)
    before = {f.name: f.read_bytes() for f in dest.iterdir()}   # (the lock file aside: it stays, ignored)
    assert main(["train", "--out", str(dest), "--resume", *flags, "--root", str(chars.path.parent),
                 "--no-progress"]) == 2
    assert "finished published run (no" in one_error(capsys)
    assert {f.name: f.read_bytes() for f in dest.iterdir() if f.name != ".lock"} == before


@pytest.mark.parametrize("damage", ["json", "link"])
def test_resume_with_more_cycles_names_a_damaged_config(runs, capsys, tmp_path, damage):
    base, _ = runs
    run = tmp_path / "r"
    shutil.copytree(base / "done", run)
    (run / CONFIG).unlink()
    if damage == "json":
        (run / CONFIG).write_text("{not json")
    else:
        (run / CONFIG).symlink_to(base / "done" / CONFIG)
    assert main(["train", "--out", str(run), "--resume", "--cycles", "2"]) == 2
    line = one_error(capsys)
    assert str(run / CONFIG) in line and "unrecognized arguments" not in line


def test_publishing_a_finished_published_run_in_place_says_it_is_finished(runs, capsys, tmp_path):
    base, _ = runs
    dest = tmp_path / "results" / "done"
    publish(base / "done", dest)
    assert main(["publish", str(dest)]) == 2
    assert "finished published run already" in one_error(capsys)


def test_a_stopped_publish_is_cleaned_by_the_next_and_ignored_meanwhile(runs, tmp_path):
    base, _ = runs
    results = tmp_path / "results"
    dest = results / "done"
    publish(base / "done", dest)
    left = results / ".done.publish-0badf00d"   # what a publish killed before its rename leaves
    shutil.copytree(dest, left)
    assert published_folders(results) == [dest]   # the report and the frontier do not see it
    check_inputs(tmp_path)
    fresh = results / ".done.publish-00c0ffee"
    fresh.mkdir()                                 # one that may be under way right now: kept
    old = time.time() - 2 * STOPPED_AGE
    os.utime(left, (old, old))
    publish(base / "done", dest)
    assert not left.exists() and fresh.exists()
    ignored = subprocess.run(["git", "check-ignore", "-q", "results/.done.publish-0badf00d/"], cwd=ROOT)
    assert ignored.returncode == 0


def test_report_refuses_a_published_run_of_an_unknown_family(runs, tmp_path):
    base, _ = runs
    dest = tmp_path / "results" / "done"
    publish(base / "done", dest)
    cfg = json.loads((dest / CONFIG).read_text())
    (dest / CONFIG).write_text(json.dumps({**cfg, "family": "nosuch"}))
    _rehash(dest, CONFIG)
    with pytest.raises(Exception, match="unknown model family 'nosuch'"):
        check_inputs(tmp_path)
