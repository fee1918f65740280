"""`reslm verify`: a published figure re-scored from its weights catches what a re-hashed manifest hides."""
import hashlib
import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from reslm.cli import main
from reslm.run.registry import MANIFEST, WEIGHTS
from reslm.train import create_run, train

TINY = dict(batch_size=32, epochs_per_shard=1, epoch_samples=64, lr=3e-3, log_every=4, device="cpu",
            eval_samples=0)


@pytest.fixture(scope="module")
def published(chars, tmp_path_factory):
    """A finished tiny rc run published with `reslm publish` (its manifest gets a check)."""
    base = tmp_path_factory.mktemp("verify")
    run = create_run(base / "run", "rc", dict(size=16, streams=4, head="mlp", head_hidden=8), TINY, chars)
    train(run, progress=False)
    assert main(["publish", str(run), str(base / "results" / "tiny")]) == 0
    return base / "results" / "tiny", chars


@pytest.fixture
def copy(published, tmp_path, monkeypatch):
    folder, chars = published
    monkeypatch.setenv("RESLM_DATA", str(chars.path.parent))
    dest = tmp_path / "results" / "tiny"
    shutil.copytree(folder, dest)
    return dest


def rehash(folder, name):
    """What a tamperer who rewrites the manifest does."""
    m = json.loads((folder / MANIFEST).read_text())
    m["files"][name] = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    (folder / MANIFEST).write_text(json.dumps(m))


def verify(capsys, *args):
    rc = main(["verify", *map(str, args), "--readme", "/nonexistent"])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_a_published_run_verifies(copy, capsys):
    assert "check" in json.loads((copy / MANIFEST).read_text())
    rc, out, err = verify(capsys, copy)
    assert rc == 0 and out.startswith("ok ") and "1 ok, 0 differing, 0 unreadable" in err
    rc, out, _ = verify(capsys, copy, "--full")
    assert rc == 0 and "full" in out


def test_a_hand_edited_summary_with_a_rehashed_manifest_fails(copy, capsys):
    summary = json.loads((copy / "summary.json").read_text())
    key = "final_test_loss"
    summary[key] -= 0.05
    (copy / "summary.json").write_text(json.dumps(summary))
    rehash(copy, "summary.json")
    rc, out, err = verify(capsys, copy)
    assert rc == 1 and out.startswith("DIFFERS") and f"summary.json says {key}" in out and "-5.00e-02" in out
    assert "do not re-score" in err


def test_scaled_weights_with_a_rehashed_manifest_fail(copy, capsys):
    weights = load_file(copy / WEIGHTS)
    save_file({k: v * 1.5 for k, v in weights.items()}, copy / WEIGHTS)
    rehash(copy, WEIGHTS)
    rc, out, _ = verify(capsys, copy)
    assert rc == 1 and "not those the check was recorded for" in out and "recorded" in out


def test_an_edit_of_summary_and_metrics_together_is_caught_by_the_full_mode(copy, capsys):
    shift = 0.05
    rows = [json.loads(line) for line in (copy / "metrics.jsonl").read_text().splitlines()]
    rows = [{**r, "test_loss": r["test_loss"] - shift} if "test_loss" in r else r for r in rows]
    (copy / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = json.loads((copy / "summary.json").read_text())
    (copy / "summary.json").write_text(json.dumps({**summary, "final_test_loss": summary["final_test_loss"] - shift}))
    for name in ("metrics.jsonl", "summary.json"):
        rehash(copy, name)
    assert verify(capsys, copy)[0] == 0          # the check's positions do not see it
    rc, out, _ = verify(capsys, copy, "--full")
    assert rc == 1 and "re-scored on the whole test text" in out


def test_record_writes_a_check_where_there_is_none(copy, capsys):
    m = json.loads((copy / MANIFEST).read_text())
    del m["check"]
    (copy / MANIFEST).write_text(json.dumps(m))
    rc, out, _ = verify(capsys, copy)
    assert rc == 1 and "no check recorded" in out
    assert main(["verify", "--record", str(copy)]) == 0 and "recorded" in capsys.readouterr().out
    assert verify(capsys, copy.parent)[0] == 0   # a folder of runs: every run in it


def test_a_readme_row_that_no_evaluation_gives_is_named(copy, tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text(f"| rc-16 | 1 | stream | 1 | 9.8765 | 1.234 | - | [results/{copy.name}](results/{copy.name}) |\n")
    rc = main(["verify", str(copy), "--readme", str(readme)])
    assert rc == 1 and "the README's row shows 9.8765" in capsys.readouterr().out


@pytest.fixture(scope="module")
def sampled(chars, tmp_path_factory):
    """A finished tiny rc run that evaluated 200 sampled test positions (eval_samples), published."""
    base = tmp_path_factory.mktemp("sampled")
    run = create_run(base / "run", "rc", dict(size=16, streams=4, head="mlp", head_hidden=8),
                     {**TINY, "eval_samples": 200}, chars)
    train(run, progress=False)
    assert main(["publish", str(run), str(base / "results" / "sampled")]) == 0
    return base / "results" / "sampled"


def test_full_compares_a_sampled_figure_like_with_like(sampled, published, tmp_path, monkeypatch, capsys):
    """An untampered run whose figure is of 200 sampled positions is not DIFFERS beside the whole shard's CE:
    the check is re-scored in its place, and the line says why; a tampered check is still caught."""
    monkeypatch.setenv("RESLM_DATA", str(published[1].path.parent))
    copy = tmp_path / "results" / "sampled"
    shutil.copytree(sampled, copy)
    rc, out, _ = verify(capsys, copy, "--full")
    assert rc == 0 and out.startswith("ok ") and "200 sampled test positions" in out and "check re-scored" in out
    m = json.loads((copy / MANIFEST).read_text())
    m["check"]["loss"] += 0.05
    (copy / MANIFEST).write_text(json.dumps(m))
    rc, out, _ = verify(capsys, copy, "--full")
    assert rc == 1 and out.startswith("DIFFERS") and "re-scored on the check's" in out


def test_a_damaged_manifest_is_one_line_and_the_other_runs_are_verified(copy, tmp_path, capsys):
    other = copy.parent / "other"
    shutil.copytree(copy, other)
    m = json.loads((copy / MANIFEST).read_text())
    del m["check"]["loss"]
    (copy / MANIFEST).write_text(json.dumps(m))
    rc, out, err = verify(capsys, copy.parent)
    lines = out.splitlines()
    assert rc == 1 and len(lines) == 2, out
    bad = next(line for line in lines if str(copy) + ":" in line)
    assert bad.startswith("UNREADABLE") and f"{copy / MANIFEST}: its check has no 'loss'" in bad
    assert any(line.startswith("ok ") and str(other) in line for line in lines)
    assert "1 ok, 0 differing, 1 unreadable" in err and "Traceback" not in err


def test_an_unfinished_published_run_carries_a_check_and_verifies(chars, tmp_path, monkeypatch, capsys):
    """`reslm publish` of a run stopped part-way records the check of the weights it holds now, so `reslm verify`
    passes on it (as on a finished one) and would catch an edit of its weights."""
    monkeypatch.setenv("RESLM_DATA", str(chars.path.parent))
    run = create_run(tmp_path / "run", "rc", dict(size=16, streams=4, head="mlp", head_hidden=8), TINY, chars)
    train(run, progress=False, stop_at=2)
    assert main(["publish", str(run), str(tmp_path / "results" / "part")]) == 0
    manifest = json.loads((tmp_path / "results" / "part" / MANIFEST).read_text())
    assert not manifest["finished"] and manifest["check"]["loss"] > 0
    assert verify(capsys, str(tmp_path / "results" / "part"))[0] == 0
