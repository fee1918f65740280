"""The validation split (TrainConfig.val_fraction) and evaluations of two sizes (final_eval_samples):
selection reads validation CE, never test CE, and the last evaluation can score the whole test shard."""
import pytest
import torch

from reslm import train as tt
from reslm.train.batches import CharShards
from reslm.core.errors import ReslmError
from reslm.models import build_model
from reslm.run import read_metrics

TINY = dict(batch_size=64, epochs_per_shard=1, lr=3e-3, log_every=4, device="cpu", precision="fp32")


@pytest.mark.parametrize("family,model", [("rc", dict(size=32)), ("tf", dict(ff_dim=16, n_heads=2, n_layers=1)),
                                          ("rnn", dict(cell="gru", embed_dim=8, hidden=16, context_mode="stream"))])
def test_validation_is_scored_beside_test_and_summarised(chars, tmp_path, family, model):
    out = tt.create_run(tmp_path / "r", family, model, {**TINY, "val_fraction": 0.2, "eval_samples": 100}, chars)
    summary = tt.train(out, progress=False)
    evals = [r for r in read_metrics(out) if r["kind"] == "eval"]
    assert len(evals) == 5 and all("val_loss" in r and "test_loss" in r for r in evals)
    best = min(evals, key=lambda r: r["val_loss"])
    assert summary["selection"] == "validation"
    assert (summary["best_val_loss"], summary["best_val_step"], summary["test_loss_at_best_val"]) == \
        (best["val_loss"], best["step"], best["test_loss"])
    assert summary["final_val_loss"] == evals[-1]["val_loss"] and summary["final_test_loss"] == evals[-1]["test_loss"]


def test_validation_tails_are_never_trained_on(chars):
    """With val_fraction f the training part of a shard ends where its validation tail begins, and the
    tail is the same text whatever the model."""
    m = build_model("tf", ff_dim=16, n_heads=2, n_layers=1, vocab_size=chars.vocab_size)
    src = CharShards(m, chars, tt.train_config("tf", **TINY, val_fraction=0.25), torch.device("cpu"), None, False,
                     holdout=0.25)
    for shard in chars.train_shards:
        a, b = chars.shards[shard]
        cut = a + int((b - a) * 0.75)
        assert src.split.span(shard) == (a, cut)
        assert src.split.span(shard, "heldout") == (cut - 32, b)   # its first sample predicts the first held-out char
    a, cut = src.split.span(0)
    assert src.samples[0] == cut - a - 32             # every training sample lies before the tail


@pytest.fixture(scope="module")
def grouped(tmp_path_factory):
    """A tiny dataset of 24 text files (each its own group) of different lengths."""
    from reslm.data import prepare_text
    root = tmp_path_factory.mktemp("grouped")
    words = "to be or not that is the question whether tis nobler in mind".split()
    paths = []
    for i in range(24):
        (root / f"f{i:02d}.txt").write_text(" ".join(words[(i + j) % len(words)] for j in range(40 + 7 * i)) + "\n")
        paths.append(root / f"f{i:02d}.txt")
    return prepare_text(paths, root, name="grouped", verbose=False)


def test_validation_groups_hold_out_whole_files_at_the_end_of_the_training_text(grouped, tmp_path):
    """val_split groups: the validation split starts at the group boundary closest to the last
    val_fraction of the training text and runs to the test shard; every training shard ends there (or
    before), so no group has text on both sides, and only the shards it reaches are scored."""
    ends = grouped.group_ends()
    assert len(ends) == 24 and ends[-1] == grouped.n_chars
    m = build_model("rc", size=16, vocab_size=grouped.vocab_size)
    tc = tt.train_config("rc", **TINY, val_fraction=0.15, val_split="groups")
    src = CharShards(m, grouped, tc, torch.device("cpu"), None, False, holdout=0.15)
    first, last = grouped.shards[0][0], grouped.shards[grouped.test_shard][0]
    target = last - 0.15 * (last - first)
    cut = src.split.val_cut
    assert cut in ends and all(abs(cut - target) <= abs(g - target) for g in ends if g < last)
    starts = [0] + ends[:-1]
    for a, b in zip(starts, ends):           # each group lies wholly in training or wholly in the split
        assert b <= cut or a >= cut
    for shard in grouped.train_shards:
        a, b = grouped.shards[shard]
        assert src.split.span(shard) == (a, min(b, max(a, cut)))
    assert src.heldout_shards() == [s for s in grouped.train_shards if grouped.shards[s][1] > cut]
    held = [src.split.span(s, "heldout") for s in src.heldout_shards()]
    assert held[0][0] == cut - 32 and held[-1][1] == last
    out = tt.create_run(tmp_path / "r", "rc", dict(size=16), {**TINY, "val_fraction": 0.15, "val_split": "groups",
                                                                "eval_samples": 64}, grouped)
    tt.train(out, progress=False)
    assert all("val_loss" in r for r in read_metrics(out) if r["kind"] == "eval")


def test_shard_chars_cuts_the_training_text_not_the_validation_groups(grouped, tmp_path):
    """With val_split groups, shard_chars trains on the first K characters of each shard's training part; the
    held-out groups stay whole, so runs with and without it are validated on the same text."""
    m = build_model("rc", size=16, vocab_size=grouped.vocab_size)
    whole, cut = (CharShards(m, grouped, tt.train_config("rc", **TINY, val_fraction=0.15, val_split="groups", **kw),
                             torch.device("cpu"), None, False, holdout=0.15) for kw in ({}, dict(shard_chars=200)))
    for shard in grouped.train_shards:
        a, b = whole.split.span(shard)
        assert cut.split.span(shard) == (a, min(b, a + 200))
    assert [cut.split.span(s, "heldout") for s in cut.heldout_shards()] == \
        [whole.split.span(s, "heldout") for s in whole.heldout_shards()]
    out = tt.create_run(tmp_path / "r", "rc", dict(size=16), {**TINY, "val_fraction": 0.15, "val_split": "groups",
                                                                "shard_chars": 200, "eval_samples": 64}, grouped)
    assert tt.train(out, progress=False)["best_val_loss"] > 0


def test_validation_groups_need_groups(grouped, chars, tmp_path):
    for data, train, msg in [(grouped, dict(val_split="groups"), "needs val_fraction > 0"),
                             (grouped, dict(val_fraction=0.1, val_split="plays"), "val_split must be one of"),
                             (chars, dict(val_fraction=0.1, val_split="groups"), "no file-group boundary")]:
        with pytest.raises(ReslmError, match=msg):
            tt.create_run(tmp_path / "r", "rc", dict(size=16), {**TINY, **train}, data)
        assert not (tmp_path / "r").exists()


def test_a_run_without_a_split_is_unchanged(chars, tmp_path):
    out = tt.create_run(tmp_path / "r", "rc", dict(size=32), {**TINY, "eval_samples": 100}, chars)
    summary = tt.train(out, progress=False)
    assert "selection" not in summary and "val_loss" not in read_metrics(out)[-1]


def test_the_last_evaluation_can_score_the_whole_test_shard(chars, tmp_path):
    out = tt.create_run(tmp_path / "r", "tf", dict(ff_dim=16, n_heads=2, n_layers=1),
                        {**TINY, "eval_samples": 96, "final_eval_samples": 0}, chars)
    tt.train(out, progress=False)
    evals = [r for r in read_metrics(out) if r["kind"] == "eval"]
    a, b = chars.shards[chars.test_shard]
    assert [r["test_samples"] for r in evals] == [96] * 4 + [b - a - 32]


@pytest.mark.parametrize("train,msg", [(dict(val_fraction=0.2, heldout_eval=True), "val_fraction is a validation"),
                                       (dict(val_fraction=1.0), "val_fraction must be in"),
                                       (dict(final_eval_samples=-2), "final_eval_samples must be"),
                                       (dict(keep_best_val=True), "keep_best_val keeps"),
                                       (dict(test_every="shard"), "test_every shard leaves"),
                                       (dict(val_fraction=0.2, test_every="epoch"), "test_every must be one of")])
def test_bad_split_settings_are_refused(chars, tmp_path, train, msg):
    with pytest.raises(ReslmError, match=msg):
        tt.create_run(tmp_path / "r", "tf", {}, {**TINY, **train}, chars)
    assert not (tmp_path / "r").exists()


def _val_dips_at_the_second_evaluation(monkeypatch):
    """Validation CE 1.0 at the second evaluation and 2.0 elsewhere: the best is not the last."""
    from reslm.train.evaluation import HeldoutLoss
    call, seen = HeldoutLoss.__call__, []

    def fake(self, model, precision, final=False):
        row = call(self, model, precision, final)
        seen.append(1)
        return {**row, "val_loss": 1.0 if len(seen) == 2 else 2.0}
    monkeypatch.setattr(HeldoutLoss, "__call__", fake)


@pytest.mark.parametrize("ema", [0.0, 0.9])
def test_keep_best_val_makes_the_best_evaluation_the_runs_model(chars, tmp_path, monkeypatch, ema):
    """keep_best_val: the finished run's model (what eval, generate and publish read) is the weights of
    its best evaluation on validation, scored again on the whole test shard; the summary says so; the
    last weights stay in the checkpoint, and a run stopped and resumed ends the same."""
    from reslm.scoring.evaluate import evaluate_run
    from reslm.run import load_checkpoint
    _val_dips_at_the_second_evaluation(monkeypatch)
    train = {**TINY, "val_fraction": 0.2, "eval_samples": 64, "final_eval_samples": 0, "keep_best_val": True,
             "ema": ema}
    out = tt.create_run(tmp_path / "r", "rc", dict(size=32, head="mlp", head_hidden=8), train, chars)
    summary = tt.train(out, progress=False)
    evals = [r for r in read_metrics(out) if r["kind"] == "eval"]
    assert summary["weights"] == "best-val" and summary["weights_step"] == evals[1]["step"] < evals[-1]["step"]
    assert summary["weights_val_loss"] == 2.0 and summary["weights_test_samples"] == evals[-1]["test_samples"]
    ck = load_checkpoint(out)
    assert all(torch.equal(ck["best"]["model"][k], ck["model"][k]) for k in ck["best"]["model"])
    assert "reservoir.W_T" in ck["model"] and not any("reservoir" in k for k in ck["best"]["model"])
    assert not torch.equal(ck["model"]["head.out.weight"], ck["last"]["head.out.weight"])
    scored = evaluate_run(out, write=False, score=0, length=8)
    assert scored["test_loss"] == pytest.approx(summary["weights_test_loss"], abs=1e-5)

    monkeypatch.undo()
    _val_dips_at_the_second_evaluation(monkeypatch)
    again = tt.create_run(tmp_path / "s", "rc", dict(size=32, head="mlp", head_hidden=8), train, chars)
    tt.train(again, progress=False, stop_at=evals[2]["step"])
    resumed = tt.train(again, progress=False)
    assert {k: v for k, v in resumed.items() if "seconds" not in k} == \
        {k: v for k, v in summary.items() if "seconds" not in k}
    ck2 = load_checkpoint(again)
    assert all(torch.equal(ck2["model"][k], ck["model"][k]) for k in ck["model"])


def test_test_every_shard_scores_test_at_shard_ends_and_trains_the_same(chars, tmp_path):
    """test_every shard: validation at every evaluation, the test CE only at each shard's last one and the
    final one; the weights, the validation CEs and the run's configuration are those of test_every
    evaluation (a record field: it changes what is logged, not what is trained)."""
    from reslm.models.identity import fingerprint
    from reslm.run import load_checkpoint, read_config
    train = {**TINY, "epochs_per_shard": 2, "val_fraction": 0.2, "eval_samples": 64, "keep_best_val": True}
    runs = {every: tt.create_run(tmp_path / every, "rc", dict(size=32), {**train, "test_every": every}, chars)
            for every in ("evaluation", "shard")}
    summaries = {every: tt.train(out, progress=False) for every, out in runs.items()}
    rows = {every: [r for r in read_metrics(out) if r["kind"] == "eval"] for every, out in runs.items()}
    assert [r["val_loss"] for r in rows["shard"]] == [r["val_loss"] for r in rows["evaluation"]]
    assert [r["epoch"] for r in rows["shard"] if "test_loss" in r] == [1] * 5 and len(rows["shard"]) == 10
    assert [r["test_loss"] for r in rows["shard"] if "test_loss" in r] == \
        [r["test_loss"] for r in rows["evaluation"] if r["epoch"] == 1]
    a, b = (load_checkpoint(out)["model"] for out in runs.values())
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert summaries["shard"]["weights_test_loss"] == summaries["evaluation"]["weights_test_loss"]
    assert fingerprint(read_config(runs["shard"])) == fingerprint(read_config(runs["evaluation"]))


def test_test_every_final_scores_test_once_and_keeps_the_same_figure(chars, tmp_path):
    """test_every final (the bench's quick budget): validation at every evaluation, the test CE only at the final
    one and the kept weights'; the kept weights and their test CE are those of test_every evaluation."""
    from reslm.models.identity import fingerprint
    from reslm.run import load_checkpoint, read_config
    train = {**TINY, "epochs_per_shard": 2, "val_fraction": 0.2, "eval_samples": 64, "keep_best_val": True}
    runs = {every: tt.create_run(tmp_path / every, "rc", dict(size=32), {**train, "test_every": every}, chars)
            for every in ("evaluation", "final")}
    summaries = {every: tt.train(out, progress=False) for every, out in runs.items()}
    rows = {every: [r for r in read_metrics(out) if r["kind"] == "eval"] for every, out in runs.items()}
    assert [r["val_loss"] for r in rows["final"]] == [r["val_loss"] for r in rows["evaluation"]]
    assert ["test_loss" in r for r in rows["final"]] == [False] * 9 + [True]
    assert rows["final"][-1]["test_loss"] == rows["evaluation"][-1]["test_loss"]
    a, b = (load_checkpoint(out)["model"] for out in runs.values())
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert summaries["final"]["weights_test_loss"] == summaries["evaluation"]["weights_test_loss"]
    assert fingerprint(read_config(runs["final"])) == fingerprint(read_config(runs["evaluation"]))
