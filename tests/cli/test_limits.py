"""Issue 32.5, 32.7: flags are checked before any work (lab, reproduce, search: before the first run),
--threads stays within the machine's cores on every command (a saved value that no longer fits is
replaced with a note), and a metrics row that was not finite is the NaN guard's stop, not a TypeError.
Tiny rc runs on the shared corpus."""
import json
import shutil

import pytest
import torch

import reslm.train as tt
from reslm.cli import main
from reslm.core.device import usable_cores, use_threads
from reslm.core.errors import ReslmError
from reslm.experiments.lab import run_lab
from reslm.run import CONFIG

MODEL = dict(size=16)
TRAIN = dict(batch_size=64, lr=3e-3, epochs_per_shard=1, epoch_samples=128, log_every=1, eval_samples=256)
TOO_MANY = str(usable_cores() + 1)


@pytest.fixture(scope="module")
def half(chars, tmp_path_factory):
    """An rc run stopped at its first evaluation (of several)."""
    run = tt.create_run(tmp_path_factory.mktemp("limits") / "half", "rc", MODEL, {**TRAIN, "eval_every": 1}, chars)
    tt.train(run, progress=False, stop_at=1)
    return run


@pytest.fixture(autouse=True)
def keep_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def last_error(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error: " in line]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("argv", [
    ["train", "--preset", "rc-250", "--threads", TOO_MANY, "--out", "{tmp}/run"],
    ["train", "--preset", "rc-250", "--threads", "100000", "--out", "{tmp}/run"],
    ["eval", "{tmp}/run", "--threads", TOO_MANY],
    ["generate", "{tmp}/run", "--prompt", "to", "--threads", "10000"],
    ["publish", "{tmp}/run", "--threads", "-1"],
    ["reproduce", "--budget", "smoke", "--threads", TOO_MANY, "--out", "{tmp}/run"],
    ["lab", "--budget", "smoke", "--score", "-5", "--out", "{tmp}/run"],
    ["lab", "--budget", "smoke", "--device", "tpu", "--out", "{tmp}/run"],
    ["reproduce", "--budget", "smoke", "--device", "tpu", "--out", "{tmp}/run"],
    ["sweep", "--threads", TOO_MANY, "--out", "{tmp}/run"],
    ["search", "--threads", TOO_MANY, "--out", "{tmp}/run"],
])
def test_bad_flags_fail_before_any_work(tmp_path, capsys, argv):
    """One line, exit 2, nothing created (the lab used to train 14 runs before refusing --score -5)."""
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(argv) == 2
    last_error(capsys)
    assert list(tmp_path.iterdir()) == []


def test_run_lab_checks_score_before_the_first_run(chars, tmp_path):
    with pytest.raises(ReslmError, match="--score"):
        run_lab(tmp_path / "lab", data=str(chars.path), budget="smoke", score=-5)
    assert list(tmp_path.iterdir()) == []


def test_use_threads_never_exceeds_the_cores(capsys):
    assert use_threads(None) <= usable_cores()
    assert use_threads(10 * usable_cores() + 7) == usable_cores()
    assert "using" in capsys.readouterr().err
    assert torch.get_num_threads() == usable_cores()


def test_a_saved_thread_count_that_no_longer_fits_is_replaced(half, tmp_path, capsys):
    """A run saved with threads 100000 (the issue's segfault): --resume uses this machine's cores with one
    note; --resume --threads 1 records the new count."""
    run = tmp_path / "half"
    shutil.copytree(half, run, ignore=shutil.ignore_patterns(".lock"))
    cfg = json.loads((run / CONFIG).read_text())
    cfg["train"]["threads"] = 100000
    (run / CONFIG).write_text(json.dumps(cfg))
    assert main(["train", "--out", str(run), "--resume", "--no-progress"]) == 0
    assert f"100000 threads asked for, this machine runs {usable_cores()}" in capsys.readouterr().err
    assert main(["train", "--out", str(run), "--resume", "--threads", "1", "--no-progress"]) == 0
    assert json.loads((run / CONFIG).read_text())["train"]["threads"] == 1


@pytest.mark.parametrize("key", ["val_loss", "test_loss", "train_loss"])
def test_a_non_finite_row_stops_the_run(half, tmp_path, capsys, key):
    """A metrics row whose loss was NaN (stored as null by an older reslm): --resume says where the run
    diverged, exit 2, instead of training on into a TypeError without a summary."""
    run = tmp_path / "half"
    shutil.copytree(half, run, ignore=shutil.ignore_patterns(".lock"))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    i = max(i for i, r in enumerate(rows) if r.get("kind") in ("eval", "step"))
    rows[i][key] = None
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["train", "--out", str(run), "--resume", "--no-progress"]) == 2
    line = last_error(capsys)
    assert f"{key} null" in line and "diverged" in line
