"""The closed-form readout (reslm.train.ridge, `--optimizer ridge`): the solve, streaming, temperature,
held-out selection (the test shard unread), and the run directory it writes."""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import reslm.core.linear as linear
import reslm.train.ridge as ridge
import reslm.train.batches as rb
import reslm.train as tt
from reslm.cli import main
from reslm.core.errors import ReslmError
from reslm.scoring.evaluate import evaluate_run
from reslm.run import CONFIG, read_metrics

MODEL = dict(size=40, streams=8)
RIDGE = dict(optimizer="ridge", device="cpu")


def _problem(m=300, n=12, v=5, seed=0):
    """Features x (m, n) and classes y (m,) that depend on them (the argmax of a noisy projection)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, n, generator=g, dtype=torch.float64)
    y = (x @ torch.randn(n, v, generator=g, dtype=torch.float64) + torch.randn(m, v, generator=g,
                                                                              dtype=torch.float64)).argmax(1)
    return x, y


def test_solve_equals_a_direct_solve():
    x, y = _problem()
    acc = linear.RidgeAccumulator(12, 5).add(x, y)
    xa = np.hstack([x.numpy(), np.ones((len(x), 1))])
    Y = np.eye(5)[y.numpy()]
    for alpha in (1e-3, 0.5):
        lam = alpha * np.mean(np.sum(x.numpy() ** 2, axis=0))
        D = np.diag([1.0] * 12 + [0.0])                        # the bias is not penalised
        want = np.linalg.solve(xa.T @ xa + lam * D, xa.T @ Y)
        np.testing.assert_allclose(acc.solve(alpha).numpy(), want, rtol=1e-9, atol=1e-10)
    lstsq = np.linalg.lstsq(xa, Y, rcond=None)[0]              # alpha -> 0: least squares
    np.testing.assert_allclose(acc.solve(1e-12).numpy(), lstsq, rtol=1e-6, atol=1e-8)


def test_streaming_over_shards_and_chunks_equals_one_shot(monkeypatch):
    x, y = _problem(m=500)
    x = x.float()                                              # float32 features, float64 sums
    one = linear.RidgeAccumulator(12, 5).add(x, y)
    monkeypatch.setattr(linear, "CHUNK_ELEMS", 13 * 7)          # 7-row chunks
    a = linear.RidgeAccumulator(12, 5).add(x[:230], y[:230])    # two shards
    b = linear.RidgeAccumulator(12, 5).add(x[230:], y[230:])
    both = a + b
    assert both.count == one.count == 500
    torch.testing.assert_close(both.G, one.G, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(both.Ct, one.Ct, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(both.solve(1e-2), one.solve(1e-2), rtol=1e-9, atol=1e-12)
    assert torch.equal(one.Ct[:, -1], torch.bincount(y, minlength=5).double())   # class counts in the bias column


def test_temperature_fit_lowers_heldout_ce():
    x, y = _problem(m=2000)
    acc = linear.RidgeAccumulator(12, 5).add(x[:1500], y[:1500])
    z = linear.logits_of(acc.solve(1e-3), x[1500:].float())
    beta, ce = linear.fit_temperature(z, y[1500:])
    assert ce < F.cross_entropy(z, y[1500:]).item() - 1e-4   # beta = 1: the raw least-squares outputs
    grid = [F.cross_entropy(z * b, y[1500:]).item() for b in np.geomspace(beta / 4, beta * 4, 41)]
    assert ce <= min(grid) + 1e-6


def test_ridge_run_never_reads_the_test_shard_while_fitting(chars, tmp_path, monkeypatch):
    calls = []
    tokens, evaluate = rb.CharShards.tokens, rb.CharShards.evaluate
    monkeypatch.setattr(rb.CharShards, "tokens", lambda self, shard, part="train": (
        calls.append((shard, part)), tokens(self, shard, part))[1])
    monkeypatch.setattr(rb.CharShards, "evaluate", lambda self, *a, **k: (calls.append("evaluate"), evaluate(self, *a, **k))[1])
    out = tt.create_run(tmp_path / "r", "rc", MODEL, RIDGE, chars)
    summary = tt.train(out, progress=False)
    fitting = calls[:calls.index("evaluate")]
    assert chars.test_shard not in {s for s, _ in fitting}
    assert sorted(fitting) == sorted((s, p) for s in chars.train_shards for p in ("train", "heldout"))
    rows = read_metrics(out)
    tried = [r for r in rows if r["kind"] == "ridge"]
    assert [r["alpha"] for r in tried] == list(ridge.ALPHAS)
    best = min(tried, key=lambda r: r["heldout_loss"])          # alpha is the held-out slice's choice
    assert summary["ridge_alpha"] == best["alpha"] and summary["heldout_loss"] == best["heldout_loss"]
    (ev,) = [r for r in rows if r["kind"] == "eval"]
    assert summary["finished"] and summary["steps"] == 1 and summary["final_test_loss"] == ev["test_loss"]
    assert summary["final_test_bpc"] == pytest.approx(ev["test_loss"] / np.log(2))
    assert summary["final_test_loss"] < np.log(chars.vocab_size) - 1     # it learned something
    assert summary["heldout_samples"] > 0 and summary["fit_samples"] > summary["heldout_samples"]


def test_ridge_run_dir_works_with_eval_generate_and_resume(chars, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--family", "rc", "--optimizer", "ridge", "--size", "40", "--streams", "8",
                 "--ridge-alpha", "1e-4", "--data", str(chars.path), "--out", str(out), "--device", "cpu",
                 "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["ridge_alpha"] == 1e-4 and len([r for r in read_metrics(out) if r["kind"] == "ridge"]) == 1
    rows = read_metrics(out)
    again = tt.train(out, progress=False)                       # finished: nothing more is done
    assert again["final_test_loss"] == summary["final_test_loss"] and read_metrics(out) == rows
    r = evaluate_run(out, length=30, score=200)
    assert np.isfinite(r["test_loss"]) and len(r["sample"]) == 30
    assert main(["generate", str(out), "--prompt", "to be", "--length", "20"]) == 0
    assert capsys.readouterr().out.startswith("to be")


def test_ridge_is_deterministic_and_refit_uses_every_sample(chars, tmp_path):
    a = tt.train(tt.create_run(tmp_path / "a", "rc", MODEL, RIDGE, chars), progress=False)
    b = tt.train(tt.create_run(tmp_path / "b", "rc", MODEL, RIDGE, chars), progress=False)
    assert a["final_test_loss"] == b["final_test_loss"] and a["ridge_alpha"] == b["ridge_alpha"]
    c = tt.train(tt.create_run(tmp_path / "c", "rc", MODEL, {**RIDGE, "ridge_refit": False}, chars), progress=False)
    assert a["fit_samples"] == c["fit_samples"] + c["heldout_samples"]


def test_ridge_bad_configs(chars, tmp_path):
    with pytest.raises(ReslmError, match="rc family"):
        tt.make_run_config("aerc", dict(size=20, hidden=4), RIDGE, chars)
    with pytest.raises(ReslmError, match="holdout must be in"):
        tt.make_run_config("rc", MODEL, {**RIDGE, "holdout": 0.0}, chars)
    with pytest.raises(ReslmError, match="leaves"):
        tt.make_run_config("rc", MODEL, {**RIDGE, "holdout": 0.99}, chars)
    assert main(["train", "--family", "rc", "--optimizer", "ridge", "--ridge-alpha", "-1", "--data",
                 str(chars.path), "--out", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()


def test_runs_made_before_the_ridge_fields_still_match(chars, tmp_path):
    over = dict(lr=3e-3, batch_size=64, epochs_per_shard=1, device="cpu")
    out = tt.create_run(tmp_path / "old", "rc", MODEL, over, chars)
    cfg = json.loads((out / CONFIG).read_text())
    for k in ("holdout", "ridge_alpha", "ridge_refit", "ridge_heldout_samples"):
        del cfg["train"][k]
    (out / CONFIG).write_text(json.dumps(cfg))
    assert tt.ensure_run(out, "rc", MODEL, over, chars) == "resuming"
    with pytest.raises(ReslmError, match="different budget"):
        tt.ensure_run(out, "rc", MODEL, {**over, "holdout": 0.2}, chars)
