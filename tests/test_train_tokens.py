
import numpy as np
import pytest
import torch
import torch.nn as nn

import reslm.train_tokens as tt
from reslm.errors import ReslmError
from reslm.run import read_config, read_metrics

MODELS = {"laerc": dict(dim=16, n_layers=2, context=32, r_mult=2),
          "gpt": dict(dim=32, n_layers=2, n_heads=2, context=32)}
TRAIN = dict(micro_batch=4, grad_accum=2, context=32, max_steps=30, warmup_steps=5, eval_every=10,
             eval_batches=4, log_every=5, lr=3e-3, device="cpu", precision="fp32")



def run(tmp_path, dataset, name, family="laerc", **train):
    out = tt.create_token_run(tmp_path / name, family, MODELS[family], {**TRAIN, **train}, dataset)
    return out, tt.train_token_run(out, progress=False)


@pytest.mark.parametrize("family", ["laerc", "gpt"])
def test_training_reduces_val_loss(family, dataset, tmp_path):
    out, summary = run(tmp_path, dataset, family, family)
    rows = read_metrics(out)
    evals = [r for r in rows if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [0, 10, 20, 30]
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 0.3
    assert evals[-1]["val_bits_per_token"] == pytest.approx(evals[-1]["val_loss"] / np.log(2))
    steps = [r for r in rows if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [5, 10, 15, 20, 25, 30]
    assert set(steps[0]) == {"kind", "step", "lr", "train_loss", "tokens_per_s", "wall"}
    cfg = read_config(out)
    assert cfg["data"]["vocab_size"] == dataset.vocab_size and cfg["family"] == family and "versions" in cfg
    assert summary["final_val_loss"] == evals[-1]["val_loss"]
    assert summary["tokens_seen"] == 30 * 4 * 2 * 32 and summary["trainable_params"] > 0
    assert summary["min_train_loss"] == min(r["train_loss"] for r in steps)
    assert (out / "summary.json").is_file() and (out / "checkpoint.pt").is_file()
    # done: calling again trains nothing more
    again = tt.train_token_run(out, progress=False)
    assert again["final_val_loss"] == summary["final_val_loss"] and len(read_metrics(out)) == len(rows)


def test_resume_equals_uninterrupted(dataset, tmp_path, monkeypatch):
    full, _ = run(tmp_path, dataset, "full", "gpt", max_steps=20, eval_every=5, log_every=3)
    real_save, calls = tt.save_checkpoint, []

    def save_then_die(*a, **k):
        real_save(*a, **k)
        calls.append(1)
        raise KeyboardInterrupt

    monkeypatch.setattr(tt, "save_checkpoint", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, dataset, "cut", "gpt", max_steps=20, eval_every=5, log_every=3)
    monkeypatch.setattr(tt, "save_checkpoint", real_save)
    cut = tmp_path / "cut"
    assert len(calls) == 1 and [r["step"] for r in read_metrics(cut) if r["kind"] == "eval"] == [0, 5]
    with open(cut / "metrics.jsonl", "a") as f:  # rows written after the checkpoint are dropped on resume
        f.write('{"kind": "step", "step": 6, "lr": 0, "train_loss": 9, "tokens_per_s": 1, "wall": 1}\n')
    tt.train_token_run(cut, progress=False)
    key = lambda rows: [tuple((k, v) for k, v in r.items() if k not in ("wall", "tokens_per_s")) for r in rows]
    assert key(read_metrics(full)) == key(read_metrics(cut))
    a = torch.load(full / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(cut / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("family", ["laerc", "gpt"])
def test_weight_decay_groups(family, dataset):
    model = tt.build_token_model(family, {**MODELS[family], "vocab_size": dataset.vocab_size})
    decay, no_decay = tt.param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    linear_w = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    assert decay["params"] and {id(p) for p in decay["params"]} == linear_w
    assert all(p.dim() == 2 for p in decay["params"])
    names = {id(p): n for n, p in model.named_parameters()}
    assert names[id(model.embed.weight)] and all(id(p) != id(model.embed.weight) for p in decay["params"])
    assert all(not n.endswith("bias") and "ln" not in n for n in (names[id(p)] for p in decay["params"]))
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_schedule_and_batches(dataset):
    tc = tt.TokenTrainConfig(lr=1.0, warmup_steps=10, hold_steps=5, max_steps=115, min_lr_frac=0.1)
    assert tt.lr_at(tc, 0) == pytest.approx(0.1) and tt.lr_at(tc, 9) == 1.0 and tt.lr_at(tc, 14) == 1.0
    assert tt.lr_at(tc, 65) == pytest.approx(0.55) and tt.lr_at(tc, 115) == pytest.approx(0.1)
    lrs = [tt.lr_at(tc, k) for k in range(15, 115)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    x, y = tt.token_batch(dataset.train, 5, 16, g1)
    assert x.shape == y.shape == (5, 16) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert torch.equal(x, tt.token_batch(dataset.train, 5, 16, g2)[0])


def test_bad_configs(dataset, tmp_path):
    V = dataset.vocab_size
    bad = [
        ("laerc", {**MODELS["laerc"], "vocab_size": V + 1}, {}, "vocabulary mismatch"),
        ("gpt", MODELS["gpt"], {"context": 64}, "longer than the model"),
        ("gpt", {**MODELS["gpt"], "context": dataset.n_tokens["val"] + 10},
         {"context": dataset.n_tokens["val"] + 5}, "not shorter"),
        ("gpt", MODELS["gpt"], {"lr": 0}, "lr"),
        ("gpt", MODELS["gpt"], {"max_steps": 0}, "max_steps"),
        ("gpt", MODELS["gpt"], {"micro_batch": 2.5}, "micro_batch"),
        ("gpt", MODELS["gpt"], {"precision": "fp8"}, "precision"),
        ("gpt", MODELS["gpt"], {"min_lr_frac": 2}, "min_lr_frac"),
        ("gpt", MODELS["gpt"], {"nope": 1}, "unknown training"),
        ("gpt", {**MODELS["gpt"], "n_heads": 3}, {}, "divisible"),
        ("gpt", {**MODELS["gpt"], "r_mult": 3}, {}, "unknown gpt"),
        ("rnn", {}, {}, "unknown family"),
    ]
    for i, (family, model, train, msg) in enumerate(bad):
        with pytest.raises(ReslmError, match=msg):
            tt.create_token_run(tmp_path / f"r{i}", family, model, {**TRAIN, **train}, dataset)
        assert not (tmp_path / f"r{i}").exists()
    with pytest.raises(ReslmError, match="not shorter"):
        tt.token_batch(np.zeros(10, dtype=np.uint16), 2, 10, torch.Generator())
