"""The results registry (reslm.run.registry, reslm.publish): publish a run, eval / generate it from the folder
alone on a dataset found by name elsewhere, continue an unfinished published run after moving it, and
every bad folder the issue lists (one line on stderr, exit 2)."""
import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import reslm.train as tt
from reslm.cli import main
from reslm.core.errors import ReslmError
from reslm.publish import TIMING, publish, train_command
from reslm.report.docs import check_inputs
from reslm.run.lock import lock_run
from reslm.run.registry import MANIFEST, WEIGHTS, read_manifest
from reslm.run import read_metrics

MODEL = dict(size=32)
TRAIN = dict(batch_size=64, lr=3e-3, epochs_per_shard=1, epoch_samples=128, log_every=1, eval_samples=256)
EVAL = ["--length", "40", "--score", "300", "--ngrams", "3", "--json"]


@pytest.fixture(scope="module")
def world(chars, tmp_path_factory):
    """A finished rc run published to results/rc, and the dataset moved to another root: the folder must
    find it by name there (a fresh clone on another machine)."""
    base = tmp_path_factory.mktemp("registry")
    run = tt.create_run(base / "runs" / "rc", "rc", MODEL, TRAIN, chars)
    tt.train(run, progress=False)
    root = base / "elsewhere"
    shutil.copytree(chars.path, root / chars.name)
    return dict(base=base, run=run, root=root)


def fresh(world, tmp_path, monkeypatch):
    """results/rc published from the run, copied alone to tmp_path; the run and the original dataset
    path are out of reach (RESLM_DATA points at the moved copy)."""
    published = world["base"] / "results" / "rc"
    if not published.exists():
        publish(world["run"], published, date="2026-01-01T00:00:00+00:00")
    folder = tmp_path / "clone" / "results" / "rc"
    shutil.copytree(published, folder, ignore=shutil.ignore_patterns(".lock"))
    monkeypatch.setenv("RESLM_DATA", str(world["root"]))
    return folder


def err_line(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("reslm: error: ") and "Traceback" not in "\n".join(err)
    return err[-1]


def test_published_folder_holds_trainable_weights_and_fingerprints_only(world, tmp_path, monkeypatch):
    folder = fresh(world, tmp_path, monkeypatch)
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["config.json", MANIFEST, "metrics.jsonl", "provenance.json", "summary.json", WEIGHTS]
    m = read_manifest(folder)
    assert m["finished"] and set(m["files"]) == set(names) - {MANIFEST}
    ck = torch.load(world["run"] / "checkpoint.pt", weights_only=True)["model"]
    weights = load_file(str(folder / WEIGHTS))
    assert set(weights) == {"head.weight", "head.bias"}          # the reservoir and embedding are not there
    assert all(torch.equal(weights[k], ck[k]) for k in weights)
    assert set(m["fixed"]) == {"embedding", "reservoir.W_T", "reservoir.W_in_T", "reservoir.bias"}
    prov = json.loads((folder / "provenance.json").read_text())
    assert prov["command"].startswith("reslm train --family rc --size 32") and "--data tiny" in prov["command"]
    assert prov["cpu"] and prov["torch"] == torch.__version__ and prov["wall"]["train_seconds"] > 0
    assert prov["publishes"][0]["date"] == "2026-01-01T00:00:00+00:00"


def test_eval_and_generate_from_the_folder_alone(world, tmp_path, monkeypatch, capsys):
    """Same numbers as the run directory gives, from the folder and a dataset found by its name."""
    folder = fresh(world, tmp_path, monkeypatch)
    assert main(["eval", str(world["run"]), *EVAL]) == 0
    want = json.loads(capsys.readouterr().out)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert main(["eval", str(folder), *EVAL]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["test_loss"] == want["test_loss"] and got["sample"] == want["sample"]
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before   # a published folder is only read
    assert main(["eval", str(folder), *EVAL, "--write"]) == 0
    assert read_manifest(folder)["files"]["eval.json"]      # --write: eval.json written into the folder and listed
    assert main(["eval", str(folder), *EVAL]) == 0          # ... and the manifest still holds
    capsys.readouterr()
    for run in (world["run"], folder):
        assert main(["generate", str(run), "--prompt", "to be", "--length", "30", "--seed", "2"]) == 0
    a, b = capsys.readouterr().out.splitlines()
    assert a == b


def test_eval_refuses_a_missing_or_altered_weight_file(world, tmp_path, monkeypatch, capsys):
    folder = fresh(world, tmp_path, monkeypatch)
    w = load_file(str(folder / WEIGHTS))
    w["head.bias"] = w["head.bias"] + 1
    save_file(w, str(folder / WEIGHTS))
    assert main(["eval", str(folder), *EVAL]) == 2
    assert "weights.safetensors does not match its sha256" in err_line(capsys)
    (folder / WEIGHTS).unlink()
    assert main(["generate", str(folder), "--prompt", "to"]) == 2
    assert "weights.safetensors is missing" in err_line(capsys)


def test_report_names_a_run_trained_in_place(world, tmp_path, monkeypatch):
    """A published run continued in place (`train --out results/NAME --resume`) changes its files
    while it trains: `reslm report` names the writer instead of calling the files damaged."""
    folder = fresh(world, tmp_path, monkeypatch)
    with open(folder / "metrics.jsonl", "a") as f:
        f.write("{}\n")
    with pytest.raises(ReslmError, match="altered or damaged"):
        check_inputs(tmp_path / "clone")                     # no writer: a damaged folder
    with lock_run(folder):
        with pytest.raises(ReslmError, match=f"being trained in place by pid {os.getpid()} "):
            check_inputs(tmp_path / "clone")


def test_eval_refuses_a_reservoir_that_does_not_match_its_fingerprint(world, tmp_path, monkeypatch, capsys):
    """Another seed in config.json (its sha256 updated too, as a careless hand edit would) rebuilds
    another reservoir: the fingerprint catches it."""
    folder = fresh(world, tmp_path, monkeypatch)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["model"]["seed"] = 1
    (folder / "config.json").write_text(json.dumps(cfg))
    assert main(["eval", str(folder), *EVAL]) == 2
    assert "config.json does not match its sha256" in err_line(capsys)
    m = read_manifest(folder)
    m["files"]["config.json"] = __import__("hashlib").sha256((folder / "config.json").read_bytes()).hexdigest()
    (folder / MANIFEST).write_text(json.dumps(m))
    assert main(["eval", str(folder), *EVAL]) == 2
    line = err_line(capsys)
    assert "does not match its fingerprint" in line and "different values" in line


def test_a_rounding_difference_is_a_warning(world, tmp_path, monkeypatch, capsys):
    """The same reservoir scaled by another CPU's eigenvalue routine differs in the last bits only."""
    folder = fresh(world, tmp_path, monkeypatch)
    m = read_manifest(folder)
    fp = m["fixed"]["reservoir.W_T"]
    m["fixed"]["reservoir.W_T"] = {**fp, "sha256": "0" * 64, "sumsq": fp["sumsq"] * (1 + 1e-7)}
    (folder / MANIFEST).write_text(json.dumps(m))
    assert main(["generate", str(folder), "--prompt", "to", "--length", "5"]) == 0
    assert "differs from the published one only by rounding" in capsys.readouterr().err


def test_eval_refuses_a_newer_format(world, tmp_path, monkeypatch, capsys):
    folder = fresh(world, tmp_path, monkeypatch)
    m = read_manifest(folder)
    (folder / MANIFEST).write_text(json.dumps({**m, "format": 99}))
    assert main(["eval", str(folder), *EVAL]) == 2
    assert "registry format 99, newer than this reslm reads (1)" in err_line(capsys)


def test_publish_refuses_what_it_cannot_publish(world, chars, tmp_path, capsys):
    empty = tt.create_run(tmp_path / "new", "rc", MODEL, TRAIN, chars)      # never trained
    assert main(["publish", str(empty), str(tmp_path / "r")]) == 2
    assert "has no checkpoint yet" in err_line(capsys)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("x")
    assert main(["publish", str(world["run"]), str(tmp_path / "taken")]) == 2
    assert "is not a published run" in err_line(capsys)
    other = tt.create_run(tmp_path / "other", "rc", dict(size=24), TRAIN, chars)
    tt.train(other, progress=False, stop_at=1)
    assert main(["publish", str(other), str(tmp_path / "o")]) == 0
    assert main(["publish", str(world["run"]), str(tmp_path / "o")]) == 2
    assert "holds another published run (size 24, not 32)" in err_line(capsys)


def test_train_command_rebuilds_the_run(world):
    cfg = json.loads((world["run"] / "config.json").read_text())
    cmd = train_command(cfg)
    assert "--epoch-samples 128" in cmd and "--batch-size 64" in cmd and "--preset" not in cmd


@pytest.mark.parametrize("family,model,extra", [
    ("rc", MODEL, {}), ("tf", dict(ff_dim=16, n_heads=2, n_layers=1), {}),
    ("rc", dict(size=32, head="mlp", head_hidden=8), dict(ema=0.9, val_fraction=0.2, keep_best_val=True)),
    ("rc", dict(size=48, readout_dim=16, head="mlp", head_hidden=8), {})])
def test_resume_a_moved_published_run_equals_the_uninterrupted_one(chars, tmp_path, monkeypatch, capsys, family,
                                                                   model, extra):
    """Train K steps, publish (with its checkpoint), move the folder and the dataset, `reslm train --out
    FOLDER --resume` to the end: weights and every logged row equal an uninterrupted run's, bitwise;
    the finished folder drops its checkpoint, and provenance lists both publishes. The published
    checkpoint keeps of its other copies of the weights (EMA's raw, the best on validation) only the
    trainable tensors."""
    train = {**TRAIN, **extra}
    full = tt.create_run(tmp_path / "full", family, model, train, chars)
    tt.train(full, progress=False)
    cut = tt.create_run(tmp_path / "cut", family, model, train, chars)
    tt.train(cut, progress=False, stop_at=4)                       # an eval point (2 steps per shard-epoch)
    assert main(["publish", str(cut), str(tmp_path / "results" / "x")]) == 0
    assert "in progress, with its checkpoint" in capsys.readouterr().out
    m = read_manifest(tmp_path / "results" / "x")
    assert not m["finished"] and "checkpoint.pt" in m["files"]
    ck = torch.load(tmp_path / "results" / "x" / "checkpoint.pt", weights_only=True)
    trainable = set(load_file(str(tmp_path / "results" / "x" / WEIGHTS)))
    assert "model" not in ck and ("raw" in ck) == (ck.get("best") is not None) == bool(extra)
    if extra:
        assert set(ck["raw"]) == set(ck["best"]["model"]) == trainable
    moved = tmp_path / "machine2" / "results" / "x"
    shutil.move(str(tmp_path / "results" / "x"), str(moved))
    shutil.rmtree(cut)
    monkeypatch.setenv("RESLM_DATA", str(tmp_path / "machine2" / "data"))
    shutil.copytree(chars.path, tmp_path / "machine2" / "data" / chars.name)
    assert main(["train", "--out", str(moved), "--resume", "--no-progress"]) == 0
    capsys.readouterr()
    m = read_manifest(moved)
    assert m["finished"] and not (moved / "checkpoint.pt").exists() and "checkpoint.pt" not in m["files"]
    a = torch.load(full / "checkpoint.pt", weights_only=True)["model"]
    b = load_file(str(moved / WEIGHTS))
    assert b and all(torch.equal(a[k], b[k]) for k in b)
    key = lambda rows: [{k: v for k, v in r.items() if k not in TIMING} for r in rows if r["kind"] != "states"]
    assert key(read_metrics(full)) == key(read_metrics(moved))
    assert json.loads((moved / "summary.json").read_text())["final_test_loss"] == \
        json.loads((full / "summary.json").read_text())["final_test_loss"]
    prov = json.loads((moved / "provenance.json").read_text())
    assert [p["step"] for p in prov["publishes"]] == [4, m["step"]] and prov["publishes"][-1]["finished"]
    assert main(["train", "--out", str(moved), "--resume", "--no-progress"]) == 2    # finished: nothing to resume
    assert "nothing to resume" in err_line(capsys)


def test_a_stream_run_is_read_on_both_metrics_once_scored_on_windows(chars, tmp_path, monkeypatch):
    """A stream-mode reservoir's test CE is the state-carried one; its CE on the paper's windows counts
    once `reslm eval --context-mode window --score 0 --write` has scored every test position into its
    published folder (a sampled score does not). A summary that does not name its metric (an older run)
    gets the one training gives its config."""
    from reslm.core.metrics import TEST_LOSS
    from reslm.run.registry import both_metrics, run_metric
    run = tt.create_run(tmp_path / "runs" / "s", "rc", dict(MODEL, context_mode="stream"), TRAIN, chars)
    tt.train(run, progress=False)
    folder = tmp_path / "results" / "s"
    publish(run, folder, date="2026-01-01T00:00:00+00:00")
    monkeypatch.setenv("RESLM_DATA", str(chars.path.parent))   # the folder finds its dataset by name
    summary = json.loads((folder / "summary.json").read_text())
    assert run_metric(folder, summary) == "stream" == run_metric(folder, {})
    window, stream = both_metrics(folder, summary)
    assert window is None and stream == summary["final_test_loss"]
    window_eval = ["eval", str(folder), "--context-mode", "window", "--length", "20", "--write"]
    assert main([*window_eval, "--score", "100"]) == 0
    assert both_metrics(folder, summary)[0] is None                 # 100 positions: not the whole shard
    assert main([*window_eval, "--score", "0"]) == 0
    scored = json.loads((folder / "eval-window.json").read_text())[TEST_LOSS]
    assert both_metrics(folder, summary) == (scored, stream)
    window_run = tt.create_run(tmp_path / "runs" / "w", "rc", dict(MODEL, context_mode="window"), TRAIN, chars)
    assert run_metric(window_run, {}) == "window-32"
