"""reslm.scoring.evaluate: `evaluate_run` (what `reslm eval` writes) on character and token runs."""
import json
import math

import numpy as np
import pytest

import reslm.train as tt
from reslm.core.errors import ReslmError
from reslm.scoring.evaluate import EVAL_FILE, evaluate_run
from reslm.scoring.pieces import reservoir_clock
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


def _result(**over):
    r = dict(run="runs/x", family="rc", preset="rc-750", kind="chars", trainable_params=45_000, test_loss=1.5,
             test_bits=1.5 / math.log(2), test_bpc=2.1640, score_positions=1000, score_seconds=1.0,
             score_reservoir_seconds=0.5, generation_length=20, generation_seconds=0.25,
             generation_reservoir_seconds=0.125, overlap={"7": 0.5, "8": None}, distinct={"7": 1.0, "8": None},
             prompt="to be", sample=", or not", settings=dict(score=0, temperature=1.0))
    return {**r, **over}


def test_eval_text_is_the_result_as_reslm_eval_prints_it():
    from reslm.scoring.evaluate import eval_text
    assert eval_text(_result()).splitlines() == [
        "runs/x: rc rc-750 (45,000 trainable parameters)",
        "test CE 1.5000 nats/char = 2.164 bits/char over 1,000 positions (the whole test text); scored in 1.00 s "
        "(reservoir 0.50 s)",
        "generated 20 chars in 0.25 s (reservoir 0.12 s)",
        "overlap-7 0.5000   distinct-7 1.0000",
        "overlap-8 n/a   distinct-8 n/a",
        "--- sample (temperature 1.0) ---",
        "to be, or not"]
    token = eval_text(_result(kind="tokens", settings=dict(score=64, temperature=0.5), note="no sample"))
    assert "val CE 1.5000 nats/token = 2.164 bits/token = 2.164 bits/char" in token
    assert "(the start of the val split only; --score 0 scores all of it" in token
    assert token.endswith("no sample") and "generated" not in token


def test_grid_text_is_one_row_per_setting():
    from reslm.scoring.physical import grid_text
    r = dict(run="runs/x", family="rc", preset=None, score_positions=64, physical_trained={"adc_bits": 0},
             grid={"adc_bits": [0, 4]}, rows=[dict(adc_bits=0, test_loss=1.5, test_bits=2.164),
                                             dict(adc_bits=4, test_loss=1.75, test_bits=2.525)])
    assert grid_text(r).splitlines() == [
        "runs/x: rc , test CE over 64 positions (trained with: adc_bits 0)",
        f"{'adc_bits':>15}{'CE (nats)':>12}{'bits/char':>11}",
        f"{0:>15g}{1.5:>12.4f}{2.164:>11.3f}",
        f"{4:>15g}{1.75:>12.4f}{2.525:>11.3f}"]


def _stop_at_piece(monkeypatch, k):
    """Make the reservoir features of piece `k` (0-based) raise, as a kill there would stop the scoring."""
    import reslm.models.reservoir_lm as rl

    real, calls = rl.ReservoirLM.features, []

    def features(self, *a, **kw):
        calls.append(1)
        if len(calls) == k + 1:
            raise KeyboardInterrupt("stopped")
        return real(self, *a, **kw)

    monkeypatch.setattr(rl.ReservoirLM, "features", features)
    return calls


@pytest.mark.parametrize("published", [False, True])
def test_a_scoring_stopped_part_way_continues_from_its_last_piece(chars, tmp_path, monkeypatch, published):
    """`reslm eval` keeps the sums of the pieces it scored (eval-window.partial.json): a scoring stopped
    part-way continues from there and writes the figure of an uninterrupted scoring, to the last bit; the
    progress file is gone once the evaluation is written. In a published folder it is beside the
    manifest, not in it: the folder passes its check part-way."""
    import reslm.scoring.evaluate as ev
    import reslm.scoring.pieces as sc
    from reslm.publish import publish
    from reslm.run.registry import read_manifest, verify_published

    monkeypatch.setattr(sc, "PIECE", 97)
    monkeypatch.setattr(ev, "PIECE", 97)
    out = tt.create_run(tmp_path / "rc", "rc", dict(size=32, context_mode="stream"), TRAIN, chars)
    tt.train(out, progress=False)
    if published:
        publish(out, tmp_path / "pub")
        out = tmp_path / "pub"
        monkeypatch.setenv("RESLM_DATA", str(chars.path.parent))
    whole = evaluate_run(out, length=10, score=0, context_mode="window", write=False)
    pieces = math.ceil(whole["score_positions"] / 97)
    assert pieces >= 4
    partial = out / "eval-window.partial.json"
    with monkeypatch.context() as m:
        _stop_at_piece(m, 2)
        with pytest.raises(KeyboardInterrupt):
            evaluate_run(out, length=10, score=0, context_mode="window")
    kept = json.loads(partial.read_text())
    assert kept["pieces"] == 2 and kept["count"] == 2 * 97 and not (out / "eval-window.json").exists()
    if published:
        assert "eval-window.partial.json" not in read_manifest(out)["files"]
        verify_published(out)
    with monkeypatch.context() as m:
        calls = _stop_at_piece(m, pieces + 5)   # never stops: counts the pieces scored
        resumed = evaluate_run(out, length=10, score=0, context_mode="window")
    assert len(calls) == pieces - 2 + 1   # the pieces left, and one kept piece scored again (its spot check)
    assert resumed["test_loss"] == whole["test_loss"]
    assert resumed["score_seconds"] >= kept["seconds"] and not partial.exists()
    if published:
        assert "eval-window.partial.json" not in read_manifest(out)["files"]
        verify_published(out)


def test_progress_kept_for_other_weights_or_positions_is_started_over(chars, tmp_path, monkeypatch):
    """A progress file that names another scoring (other weights, other positions) or cannot be read is
    not added to this one's sums: the scoring starts at its first piece."""
    import reslm.scoring.evaluate as ev
    import reslm.scoring.pieces as sc

    monkeypatch.setattr(sc, "PIECE", 97)
    monkeypatch.setattr(ev, "PIECE", 97)
    out = tt.create_run(tmp_path / "rc", "rc", dict(size=32, context_mode="window"), TRAIN, chars)
    tt.train(out, progress=False)
    whole = evaluate_run(out, length=10, score=300, write=False)
    with monkeypatch.context() as m:
        _stop_at_piece(m, 1)
        with pytest.raises(KeyboardInterrupt):
            evaluate_run(out, length=10, score=300)
    partial = out / "eval.partial.json"
    kept = json.loads(partial.read_text())
    for key in ({**kept["key"], "weights_sha256": "0" * 64}, {**kept["key"], "score_positions": 299}):
        partial.write_text(json.dumps({**kept, "key": key, "total": 1e9}))
        assert evaluate_run(out, length=10, score=300)["test_loss"] == whole["test_loss"]
    partial.write_text("{not json")
    assert evaluate_run(out, length=10, score=300)["test_loss"] == whole["test_loss"]
    assert not partial.exists()


@pytest.fixture
def small_pieces(monkeypatch):
    import reslm.scoring.evaluate as ev
    import reslm.scoring.pieces as sc
    monkeypatch.setattr(sc, "PIECE", 97)
    monkeypatch.setattr(ev, "PIECE", 97)


@pytest.fixture
def stream_run(chars, tmp_path):
    out = tt.create_run(tmp_path / "rc", "rc", dict(size=32, context_mode="stream"), TRAIN, chars)
    tt.train(out, progress=False)
    return out


# the child: `reslm eval` in pieces of 97 samples, which stops for good (marker written) after its 2nd piece is kept
_KILLED_CHILD = """
import sys, time
from pathlib import Path
import reslm.scoring.evaluate as ev, reslm.scoring.pieces as sc
sc.PIECE = ev.PIECE = 97
real = sc.Progress.save
def save(self):
    real(self)
    if self.pieces == 2:
        Path(sys.argv[1]).write_text("kept")
        time.sleep(3600)
sc.Progress.save = save
from reslm.cli import main
sys.exit(main(sys.argv[2:]))
"""


def test_a_scoring_killed_with_kill_9_continues_to_the_same_figure(stream_run, small_pieces, tmp_path):
    """A real `reslm eval` process killed with SIGKILL after two kept pieces: the next call continues from
    them and writes the uninterrupted figure (to 1e-9; in fact to the last bit)."""
    import signal
    import subprocess
    import sys
    import time
    whole = evaluate_run(stream_run, length=10, score=0, context_mode="window", write=False)
    marker = tmp_path / "kept"
    child = subprocess.Popen([sys.executable, "-c", _KILLED_CHILD, str(marker), "eval", str(stream_run),
                              "--context-mode", "window", "--score", "0", "--length", "10", "--write"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while child.poll() is None and not marker.exists():   # no clock: the child's own end bounds the wait
        time.sleep(0.1)
    assert marker.exists(), child.stderr.read()
    child.send_signal(signal.SIGKILL)
    child.wait()
    kept = json.loads((stream_run / "eval-window.partial.json").read_text())
    assert kept["pieces"] == 2 and not (stream_run / "eval-window.json").exists()
    resumed = evaluate_run(stream_run, length=10, score=0, context_mode="window")
    assert abs(resumed["test_loss"] - whole["test_loss"]) <= 1e-9
    assert not (stream_run / "eval-window.partial.json").exists()


def _stopped(out, monkeypatch) -> dict:
    """The progress file a scoring stopped after 2 pieces keeps."""
    with monkeypatch.context() as m:
        _stop_at_piece(m, 2)
        with pytest.raises(KeyboardInterrupt):
            evaluate_run(out, length=10, score=0, context_mode="window")
    return json.loads((out / "eval-window.partial.json").read_text())


def _redigest(d: dict) -> dict:
    """What a tamperer who knows the format does: the digest made to match the edited fields again."""
    import hashlib
    body = {k: v for k, v in d.items() if k != "digest"}
    return {**body, "digest": hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()}


@pytest.mark.parametrize("tamper, warning", [
    (lambda d: {**d, "total": d["total"] - 10.0}, "does not match its digest"),
    (lambda d: {k: v for k, v in d.items() if k not in ("digest", "sums")}, "has no digest"),
    (lambda d: _redigest({**d, "total": d["total"] - 20.0,
                          "sums": [[t - 10.0, n] for t, n in d["sums"]]}), "re-scores to"),
])
def test_a_tampered_partial_file_is_detected_and_scored_again(stream_run, small_pieces, monkeypatch, capsys,
                                                               tamper, warning):
    """A kept scoring is never trusted as written: an edited file (digest), an older one (no digest) and
    a consistent forgery with a recomputed digest (a kept piece, drawn at random, re-scored) are each
    scored from the start with a warning, to the uninterrupted figure."""
    whole = evaluate_run(stream_run, length=10, score=0, context_mode="window", write=False)
    partial = stream_run / "eval-window.partial.json"
    partial.write_text(json.dumps(tamper(_stopped(stream_run, monkeypatch))))
    capsys.readouterr()
    resumed = evaluate_run(stream_run, length=10, score=0, context_mode="window")
    err = capsys.readouterr().err
    assert warning in err and "scoring from the start" in err and str(partial) in err
    assert resumed["test_loss"] == whole["test_loss"] and not partial.exists()
