"""`reslm reproduce --budget smoke` end to end on tiny corpora made here: the report, its figures,
resuming (a deleted run is redone, nothing else), and bad input."""
from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

pytest.importorskip("tokenizers")

from reslm.cli import main  # noqa: E402
from reslm.data.chars import prepare_text  # noqa: E402
from reslm.core.errors import ReslmError  # noqa: E402
from reslm.models import PRESETS  # noqa: E402
from reslm.experiments import plans, runner  # noqa: E402
from reslm.experiments.reproduce import reproduce as measure  # noqa: E402
from reslm.scoring.evaluate import EVAL_FILE  # noqa: E402
from reslm.report import write_reproduction  # noqa: E402


def reproduce(budget, families, out, **kw):
    """What `reslm reproduce` does: the measurements (reslm.experiments), then the report drawn from them."""
    results = measure(budget, families, out, **kw)
    write_reproduction(out)
    return results


@pytest.fixture(scope="module")
def char_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("chars")
    rng = random.Random(1)
    words = "to be or not that is the question whether tis nobler in mind suffer slings arrows".split()
    text = "\n".join(" ".join(rng.choice(words) for _ in range(10)) + "." for _ in range(1200))
    f = root / "play.txt"
    f.write_text(text)
    return prepare_text([f], root, "play", verbose=False)


SMALLEST = "rc-250,aerc-75-13,tf-64-4-4"  # the fast suite's smoke: the smallest preset of each family


@pytest.fixture(scope="module")
def smoke(char_data, dataset, tmp_path_factory):
    """One smoke reproduction, all five families, the smallest Table-1 preset of each character family."""
    out = tmp_path_factory.mktemp("rep") / "smoke"
    results = reproduce("smoke", "rc,aerc,tf,laerc,gpt", out, data=str(char_data.path),
                        token_data=str(dataset.path), device="cpu", progress=False, presets=SMALLEST)
    return out, results


@pytest.mark.slow
def test_smoke_all_fifteen_presets(char_data, dataset, tmp_path):
    results = reproduce("smoke", "rc,aerc,tf", tmp_path / "all", data=str(char_data.path), device="cpu",
                        progress=False)
    assert [r["preset"] for r in results["char_runs"]] == [p for p, (_, _, paper) in PRESETS.items() if paper]
    assert all(r["test_loss"] > 0 for r in results["char_runs"])


def test_report_references_only_existing_files(smoke):
    out, results = smoke
    report = (out / "report.md").read_text()
    links = re.findall(r"\]\((figures/[^)]+)\)", report)
    assert {Path(l).name for l in links} >= {"fig2_losses.png", "fig3_overlap.png", "fig4_time.png",
                                             "fig6_token_loss.png", "scaling.png", "fig2_losses.csv",
                                             "fig3_overlap.csv", "fig4_time.csv", "fig6_token_loss.csv",
                                             "scaling.csv"}
    for link in links:
        assert (out / link).is_file() and (out / link).stat().st_size > 0, link
    assert [r["preset"] for r in results["char_runs"]] == SMALLEST.split(",")
    assert len(results["token_runs"]) == 4 and results["presets"] == SMALLEST.split(",")
    assert "Only these Table-1 presets were run" in report
    assert "## Paper vs. this run" in report and "Kneser-Ney" in report and "## Environment" in report
    for fam in ("Transformer", "Reservoir (RC)", "AERC", "LAERC", "GPT"):
        assert f"**{fam}**" in report  # a sample of each family
    kn = results["kneser_ney"]
    assert kn["order"] in kn["settings"]["orders"] and kn["test_loss"] > 0
    row = results["char_runs"][0]
    assert set(row["overlap"]) == {"7", "8"} and row["generation_length"] == 300
    assert json.loads((out / "results.json").read_text())["budget"]["name"] == "smoke"


def test_rerun_redoes_only_the_deleted_run(smoke, char_data, dataset, capsys):
    out, _ = smoke
    import shutil
    keep = out / "runs" / "aerc-75-13" / "checkpoint.pt"
    kept_mtime = keep.stat().st_mtime_ns
    shutil.rmtree(out / "runs" / "rc-250")
    capsys.readouterr()
    reproduce("smoke", "rc,aerc,tf,laerc,gpt", out, data=str(char_data.path), token_data=str(dataset.path),
              device="cpu", progress=False, presets=SMALLEST)
    err = capsys.readouterr().err
    assert "rc-250: starting" in err
    assert err.count(": done") == 2
    assert re.findall(r"evaluating (\S+)", err) == ["rc-250"]
    assert keep.stat().st_mtime_ns == kept_mtime
    assert (out / "runs" / "rc-250" / "eval.json").is_file()


def test_bad_input(smoke, char_data, dataset, tmp_path, capsys):
    out, _ = smoke
    with pytest.raises(ReslmError, match="unknown preset rc-9"):
        reproduce("smoke", "rc", tmp_path / "x", data=str(char_data.path), progress=False, presets="rc-9")
    with pytest.raises(ReslmError, match="not in --families"):
        reproduce("smoke", "rc", tmp_path / "x", data=str(char_data.path), progress=False, presets="tf-64-4-4")
    with pytest.raises(ReslmError, match="unknown family"):
        reproduce("smoke", "rc,lstm", tmp_path / "x", data=str(char_data.path), progress=False)
    with pytest.raises(ReslmError, match="holds a `smoke` reproduction"):
        reproduce("quick", "rc", out, data=str(char_data.path), progress=False)
    assert main(["reproduce", "--budget", "smoke", "--families", "rc", "--data", str(tmp_path / "nothing"),
                 "--out", str(tmp_path / "y")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("reslm: error:")


def test_paper_budget_is_window_mode_and_resumes(tmp_path, monkeypatch, capsys):
    """The paper budget: window context for rc/aerc, the family defaults (5 epochs per full shard,
    batch 1024, Adam 1e-4), states stored by need; each preset is evaluated as soon as it is trained; a
    partly finished run resumes, skipping done presets and their evaluations.
    (Generation and scoring shortened: the protocol under test is training's.)"""
    import dataclasses

    import reslm.train as tt
    paper = plans.BUDGETS["paper"]
    assert paper.reservoir_model == {"context_mode": "window"} and "cycles" in paper.left_out
    monkeypatch.setitem(plans.BUDGETS, "paper", dataclasses.replace(paper, gen_length=30, score=512, kn_orders=(1, 2)))
    rng = random.Random(2)
    words = "to be or not that is the question".split()
    (tmp_path / "t.txt").write_text(" ".join(rng.choice(words) for _ in range(1500)))
    char_data = prepare_text([tmp_path / "t.txt"], tmp_path, "tiny", verbose=False)   # shards of ~1.3k chars
    small = {k: v for k, v in plans.PRESETS.items() if k in ("aerc-75-13", "aerc-75-19", "aerc-100-20")}
    monkeypatch.setattr(plans, "PRESETS", small)   # three presets are enough to see skip / resume / start
    real_train, calls = runner.train, []

    def train_two(run, **kw):  # the session ends after one preset
        if len(calls) == 1:
            raise KeyboardInterrupt
        calls.append(run.name)
        assert kw.get("cache_states") is True      # the paper budget keeps states across interruptions
        return real_train(run, **kw)

    monkeypatch.setattr(runner, "train", train_two)
    out = tmp_path / "paper"
    with pytest.raises(KeyboardInterrupt):
        reproduce("paper", "aerc", out, data=str(char_data.path), device="cpu", progress=False)
    # the finished preset was evaluated before the next one started, so the interruption kept it
    assert (out / "runs" / "aerc-75-13" / EVAL_FILE).is_file()
    monkeypatch.setattr(runner, "train", real_train)
    capsys.readouterr()
    results = reproduce("paper", "aerc", out, data=str(char_data.path), device="cpu", progress=False)
    err = capsys.readouterr().err
    assert err.count(": done") == 1 and "aerc-75-13: done" in err and "aerc-75-19: resuming" in err
    assert err.count(": starting") == 1 and "evaluating aerc-75-13" not in err   # read back, not redone
    for r in results["char_runs"]:
        cfg = json.loads((out / "runs" / r["preset"] / "config.json").read_text())
        assert cfg["model"]["context_mode"] == "window"
        assert {k: cfg["train"][k] for k in ("epochs_per_shard", "batch_size", "lr", "cycles", "eval_samples")} == \
            dict(epochs_per_shard=5, batch_size=1024, lr=1e-4, cycles=1, eval_samples=0)
    assert len(results["char_runs"]) == 3 and tt.is_finished(out / "runs" / "aerc-100-20")
    assert not any((out / "runs" / r["preset"] / tt.STATES).exists() for r in results["char_runs"])  # cleaned up
    assert "cycles" in (out / "report.md").read_text()


def test_state_dtype_applies_to_the_reservoir_presets(char_data, tmp_path, capsys):
    """--state-dtype bfloat16 reaches the rc/aerc runs' training config, not the transformer's; a
    reproduction resumed with another state dtype is refused (its states would differ), with one line."""
    out = tmp_path / "bf16"
    reproduce("smoke", "rc,tf", out, data=str(char_data.path), device="cpu", progress=False,
              presets="rc-250,tf-64-4-4", state_dtype="bfloat16")
    dtype = {p: json.loads((out / "runs" / p / "config.json").read_text())["train"].get("state_dtype", "float32")
             for p in ("rc-250", "tf-64-4-4")}
    assert dtype == {"rc-250": "bfloat16", "tf-64-4-4": "float32"}
    with pytest.raises(ReslmError, match="state_dtype"):
        reproduce("smoke", "rc", out, data=str(char_data.path), device="cpu", progress=False, presets="rc-250",
                  state_dtype="float32")
    with pytest.raises(ReslmError, match="--state-dtype must be one of"):
        reproduce("smoke", "rc", out, data=str(char_data.path), progress=False, state_dtype="fp8")
    capsys.readouterr()
    assert main(["reproduce", "--budget", "smoke", "--families", "rc", "--presets", "rc-250", "--out", str(out),
                 "--data", str(char_data.path), "--state-dtype", "float32"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("reslm: error:")
