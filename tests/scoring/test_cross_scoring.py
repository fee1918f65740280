"""`reslm eval RUN --data NAME`: a character run scored on another dataset's test shard with its vocabulary
(eval-on-NAME.json), and the authors' recipe (plan authors-tf) in small: the 90/10 split, layers as copies."""
import json
import math
import random

import pytest

import reslm.train as tt
from reslm.cli import main
from reslm.core.errors import ReslmError
from reslm.data import prepare_text
from reslm.frontier import load_plan
from reslm.scoring.evaluate import EVAL_FILE, eval_text, evaluate_run

# the sizes of test_evaluate's transformer: one fused-kernel library for the scoring tests (a process that loads
# two of them is not safe while reslm.core.native loads each through /proc/self/fd/N: the lead's fix)
TINY = dict(ff_dim=16, n_heads=2, n_layers=1, layer_init="copies")
TRAIN = dict(batch_size=64, epochs_per_shard=1, epoch_samples=128, lr=3e-3, device="cpu", precision="fp32")


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    """One made-up text written as three datasets under one root: the authors' split twice ("a", "b": the same
    text and split under two names) and the paper's six shards ("p")."""
    root = tmp_path_factory.mktemp("cross")
    rng = random.Random(1)
    words = "to be or not that is the question whether tis nobler in the mind to suffer".split()
    f = root / "t.txt"
    f.write_text(" ".join(rng.choice(words) for _ in range(1600)))
    sets = {n: prepare_text([f], root, name=n, split="paper" if n == "p" else "authors", verbose=False)
            for n in ("a", "b", "p")}
    return root, sets


@pytest.fixture(scope="module")
def run_a(text, tmp_path_factory):
    root, sets = text
    out = tt.create_run(tmp_path_factory.mktemp("run") / "tf", "tf", TINY, TRAIN, sets["a"])
    tt.train(out, progress=False)
    return out


def test_on_the_same_text_and_split_it_is_the_runs_own_eval(text, run_a):
    root, sets = text
    own = evaluate_run(run_a, length=20, score=0, write=False, root=root)
    other = evaluate_run(run_a, length=20, score=0, root=root, data="b")
    summary = json.loads((run_a / "summary.json").read_text())
    assert other["test_loss"] == own["test_loss"] == pytest.approx(summary["final_test_loss"], rel=1e-6)
    assert other["score_positions"] == own["score_positions"] == sets["b"].shards[1][1] - sets["b"].shards[1][0] - 32
    on = other["scored_on"]
    assert on["name"] == "b" and on["same_stream"] is True and on["trained_chars_in_test"] == 0
    assert on["test_span"] == list(sets["b"].shards[1]) and on["fingerprint"] == sets["b"].fingerprint()
    assert on["note"].startswith("held out") and on["run_data"] == "a"
    written = json.loads((run_a / "eval-on-b.json").read_text())
    assert written["test_loss"] == other["test_loss"] and not (run_a / EVAL_FILE).exists()
    assert "on dataset b's test shard" in eval_text(other)


def test_the_overlap_with_the_runs_training_text_is_counted_and_said(text, run_a, tmp_path):
    """The authors' model on the paper's test shard: its training 90% covers the start of that shard."""
    root, sets = text
    r = evaluate_run(run_a, length=10, score=0, write=False, root=root, data="p")
    (ta, tb), cut = sets["p"].shards[5], sets["a"].shards[0][1]
    assert r["scored_on"]["trained_chars_in_test"] == cut - ta > 0
    assert r["scored_on"]["note"].startswith(f"not a held-out figure: the run's training shards (dataset a) hold "
                                             f"{cut - ta:,} of the {tb - ta:,} characters")
    # the paper's model on the authors' last 10%: inside its test shard, so none of it was trained on
    out = tt.create_run(tmp_path / "p", "tf", dict(TINY, layer_init="independent"), TRAIN, sets["p"])
    tt.train(out, progress=False)
    back = evaluate_run(out, length=10, score=0, write=False, root=root, data="a")
    assert back["scored_on"]["trained_chars_in_test"] == 0 and back["scored_on"]["same_stream"] is True
    assert back["score_positions"] == sets["a"].shards[1][1] - sets["a"].shards[1][0] - 32


def test_another_text_of_the_same_vocabulary_has_no_overlap_count(text, run_a, tmp_path):
    root, sets = text
    f = tmp_path / "other.txt"
    f.write_text(("".join(sets["a"].vocab) + " ") * 200)   # every character, another stream
    prepare_text([f], root, name="other", split="authors", verbose=False)
    r = evaluate_run(run_a, length=10, score=0, write=False, root=root, data="other")
    assert r["scored_on"]["same_stream"] is False and r["scored_on"]["trained_chars_in_test"] is None
    assert "is not the token stream of the run's dataset a (their tokens differ)" in r["scored_on"]["note"]


def test_another_vocabulary_is_refused_in_one_line(text, run_a, tmp_path, capsys):
    root, _ = text
    f = tmp_path / "z.txt"
    f.write_text("xyz 123 " * 300)
    prepare_text([f], root, name="zz", split="authors", verbose=False)
    with pytest.raises(ReslmError, match="dataset zz has another vocabulary than the run's"):
        evaluate_run(run_a, length=10, score=0, write=False, root=root, data="zz")
    assert main(["eval", str(run_a), "--data", "zz", "--root", str(root), "--score", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("reslm: error: dataset zz has another vocabulary")
    assert not (run_a / "eval-on-zz.json").exists() and not list(run_a.glob("eval-on-zz*"))
    for argv in (["--data", "nope"], ["--data", "b", "--state-noise", "0.1"], ["--data", ""]):
        assert main(["eval", str(run_a), *argv, "--root", str(root)]) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_a_published_folder_records_it_only_with_write(text, run_a, tmp_path, capsys, monkeypatch):
    from reslm.publish import publish
    from reslm.run.registry import read_manifest, verify_published

    root, _ = text
    pub = tmp_path / "pub"
    publish(run_a, pub)
    monkeypatch.setenv("RESLM_DATA", str(root))
    assert main(["eval", str(pub), "--data", "b", "--score", "0", "--length", "10", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert not (pub / "eval-on-b.json").exists() and "eval-on-b.json" not in read_manifest(pub)["files"]
    assert main(["eval", str(pub), "--data", "b", "--score", "0", "--length", "10", "--write"]) == 0
    out = capsys.readouterr()
    assert "on dataset b's test shard" in out.out and f"(written to {pub / 'eval-on-b.json'})" in out.err
    assert "eval-on-b.json" in read_manifest(pub)["files"] and EVAL_FILE not in read_manifest(pub)["files"]
    assert json.loads((pub / "eval-on-b.json").read_text())["test_loss"] == shown["test_loss"]
    verify_published(pub)   # the manifest stays true
    assert not list(pub.glob("*.partial.json"))


def test_a_token_run_is_refused(dataset, tmp_path, text):
    root, _ = text
    out = tt.create_run(tmp_path / "g", "gpt", dict(dim=16, n_layers=1, n_heads=2, context=16),
                        dict(batch_size=4, grad_accum=1, max_steps=2, eval_every=2, eval_batches=1, device="cpu"),
                        dataset)
    tt.train(out, progress=False)
    with pytest.raises(ReslmError, match="--data scores a character run"):
        evaluate_run(out, length=10, score=0, write=False, root=root, data="a")


def test_the_authors_plan_and_its_recipe_in_small(text, tmp_path):
    """authors-tf: one run, tf-256-16-16 on shakespeare-authors, layers as copies, 5 epochs of one shard in one
    cycle at the paper's optimiser, fp32, every test character after every epoch. The same training fields on
    a tiny model and text: 5 evaluations, each of the whole test shard, every window of the training shard
    in each epoch."""
    plan = load_plan("authors-tf")
    assert plan.candidates == () and plan.rule.seeds == (0,) and plan.rule.select == "none"
    c = plan.base
    assert (c.preset, c.data, c.model["layer_init"]) == ("tf-256-16-16", "shakespeare-authors", "copies")
    assert {k: c.train[k] for k in ("epochs_per_shard", "cycles", "lr", "schedule", "batch_size", "eval_samples",
                                    "precision", "optimizer")} == dict(
        epochs_per_shard=5, cycles=1, lr=1e-4, schedule="constant", batch_size=1024, eval_samples=0,
        precision="fp32", optimizer="adam")
    assert c.name(0).startswith("tf-256-16-16-authors-") and c.name(0).endswith("-s0")
    for word in ("fp16", "CUDA", "fp32", "570,784"):
        assert word in plan.about
    root, sets = text
    train = {**c.train, "batch_size": 256, "lr": 3e-3, "device": "cpu"}
    out = tt.create_run(tmp_path / "authors", "tf", TINY, train, sets["a"])
    summary = tt.train(out, progress=False)
    (a, b), (ta, tb) = sets["a"].shards
    assert summary["evaluations"] == 5 and summary["steps"] == 5 * math.ceil((b - a - 32) / 256)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if r.get("kind") == "eval"]
    assert len(evals) == 5 and all(math.isfinite(r["test_loss"]) for r in evals)
