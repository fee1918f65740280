"""reslm.evaluate: `evaluate_run` (what `reslm eval` writes) on character and token runs."""
import json
import math

import numpy as np
import pytest

import reslm.train as tt
from reslm.core.errors import ReslmError
from reslm.evaluate import EVAL_FILE, evaluate_run, reservoir_clock
from reslm.models import build_model


TRAIN = dict(batch_size=64, epochs_per_shard=1, epoch_samples=64, lr=3e-3, device="cpu", precision="fp32")


@pytest.mark.parametrize("mode", ["window", "stream"])
def test_eval_ce_equals_trainings_on_the_same_slice(chars, tmp_path, mode):
    """`reslm eval --score 0` (the whole test shard) and training's evaluation are one estimator."""
    out = tt.create_run(tmp_path / "rc", "rc", dict(size=32, context_mode=mode), TRAIN, chars)
    summary = tt.train(out, progress=False)
    ev = evaluate_run(out, length=20, score=0)
    if mode == "window":
        assert ev["test_loss"] == pytest.approx(summary["final_test_loss"], rel=1e-6)
    else:  # stream: eval scores in 65,536-sample pieces (each with a 32-char lead-in): near, not equal
        assert ev["test_loss"] == pytest.approx(summary["final_test_loss"], abs=0.05)
    assert ev["test_bits"] == pytest.approx(ev["test_loss"] / math.log(2), rel=1e-12)
    assert ev["test_bpc"] == ev["test_bits"] and ev["kind"] == "chars"
    assert ev["score_positions"] == chars.shards[-1][1] - chars.shards[-1][0] - 32
    assert json.loads((out / EVAL_FILE).read_text())["test_loss"] == ev["test_loss"]
    assert 0 < ev["score_reservoir_seconds"] <= ev["score_seconds"]
    assert len(ev["sample"]) == 20 and set(ev["overlap"]) == {"7", "8"}


def test_a_stream_trained_reservoir_is_scored_on_the_papers_window_metric(chars, tmp_path):
    """context_mode "window": each scored character from a zero state over its 32 preceding characters,
    which is the stream model's first sample over exactly that window; written to eval-window.json."""
    import dataclasses

    import torch

    from reslm.models.load import load_run

    out = tt.create_run(tmp_path / "rc", "rc", dict(size=32, context_mode="stream"), TRAIN, chars)
    tt.train(out, progress=False)
    stream = evaluate_run(out, length=10, score=40, write=False)
    window = evaluate_run(out, length=10, score=40, context_mode="window")
    assert window["context_mode"] == "window" and window["context_mode_trained"] == "stream"
    assert json.loads((out / "eval-window.json").read_text())["test_loss"] == window["test_loss"]
    model, _, _ = load_run(out)
    model.config = dataclasses.replace(model.config, streams=1)   # one piece, from a zero state at its start
    a = chars.shards[chars.test_shard][0]
    test = torch.from_numpy(np.asarray(chars.tokens[a:a + 40 + 32], dtype=np.int64))
    by_hand = []
    with torch.no_grad():
        for i in range(40):   # one window at a time, carried from a zero state over its 32 characters
            feats = model.features(test[i:i + 33], position=a + i)
            first = torch.tensor([0])
            by_hand.append(model.forward_features(feats.batch(first), feats.targets[first])[1].item())
    assert window["test_loss"] == pytest.approx(float(np.mean(by_hand)), rel=1e-5)
    assert window["test_loss"] != pytest.approx(stream["test_loss"], rel=1e-4)
    with pytest.raises(ReslmError, match="scores a reservoir run"):
        gpt = tt.create_run(tmp_path / "tf", "tf", dict(ff_dim=16, n_heads=2, n_layers=1), TRAIN, chars)
        tt.train(gpt, progress=False)
        evaluate_run(gpt, length=10, score=40, context_mode="stream", write=False)


def test_eval_token_run_bits_per_char(dataset, tmp_path):
    """A token run's bits per character: total nats over the scored positions / (ln 2 x the characters
    those positions decode to)."""
    out = tt.create_run(tmp_path / "g", "gpt", dict(dim=16, n_layers=1, n_heads=2, context=16),
                        dict(batch_size=4, grad_accum=1, max_steps=2, eval_every=2, eval_batches=1, device="cpu"),
                        dataset)
    tt.train(out, progress=False)
    ev = evaluate_run(out, length=10, score=64, write=False)
    positions = ev["score_positions"]
    chars = len(dataset.tokenizer().decode(np.asarray(dataset.val[1:positions + 1])))
    assert positions == 64 and ev["kind"] == "tokens"
    assert ev["test_bpc"] == pytest.approx(ev["test_loss"] * positions / chars / math.log(2), rel=1e-12)


def test_reservoir_clock_times_only_the_reservoir():
    import torch
    m = build_model("rc", size=64, vocab_size=9, context=8).eval()
    with reservoir_clock(m) as clock:
        m(torch.randint(0, 9, (32, 8)))
    assert clock["seconds"] > 0
    assert "forward" not in m.reservoir.__dict__            # the wrapper is removed afterwards


def test_eval_refuses_a_run_without_checkpoint(chars, tmp_path):
    out = tt.create_run(tmp_path / "new", "rc", dict(size=16), TRAIN, chars)
    with pytest.raises(ReslmError, match="no checkpoint"):
        evaluate_run(out, length=5)
