"""The one training loop: token windows (laerc, gpt) and character shards (rc, aerc, tf)."""
import numpy as np
import pytest
import torch
import torch.nn as nn

import reslm.train.batches as rb
import reslm.run.state_cache as rs
import reslm.train as tt
from reslm.models import build_model
from reslm.core.metrics import bits
from reslm.models.base import decay_groups
from reslm.core.errors import ReslmError
from reslm.run import read_config, read_metrics, save_checkpoint
from reslm.publish import TIMING

MODELS = {"laerc": dict(dim=16, n_layers=2, context=32, r_mult=2),
          "gpt": dict(dim=32, n_layers=2, n_heads=2, context=32)}
TRAIN = dict(batch_size=4, grad_accum=2, max_steps=30, warmup_steps=5, eval_every=10,
             eval_batches=4, log_every=5, lr=3e-3, device="cpu", precision="fp32")



def run(tmp_path, dataset, name, family="laerc", **train):
    out = tt.create_run(tmp_path / name, family, MODELS[family], {**TRAIN, **train}, dataset)
    return out, tt.train(out, progress=False)


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
    assert set(steps[0]) == {"kind", "step", "lr", "train_loss", "samples_per_s", "tokens_per_s", "wall"}
    cfg = read_config(out)
    assert cfg["data"]["vocab_size"] == dataset.vocab_size and cfg["family"] == family and "versions" in cfg
    assert summary["final_val_loss"] == evals[-1]["val_loss"]
    assert summary["tokens_seen"] == 30 * 4 * 2 * 32 and summary["trainable_params"] > 0
    assert summary["min_train_loss"] == min(r["train_loss"] for r in steps)
    assert (out / "summary.json").is_file() and (out / "checkpoint.pt").is_file()
    # done: calling again trains nothing more
    again = tt.train(out, progress=False)
    assert again["final_val_loss"] == summary["final_val_loss"] and len(read_metrics(out)) == len(rows)


def test_resume_equals_uninterrupted(dataset, tmp_path, monkeypatch):
    full, _ = run(tmp_path, dataset, "full", "gpt", max_steps=20, eval_every=5, log_every=3)
    real_save, calls = tt.loop.save_checkpoint, []

    def save_then_die(*a, **k):
        real_save(*a, **k)
        calls.append(1)
        raise KeyboardInterrupt

    monkeypatch.setattr(tt.loop, "save_checkpoint", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, dataset, "cut", "gpt", max_steps=20, eval_every=5, log_every=3)
    monkeypatch.setattr(tt.loop, "save_checkpoint", real_save)
    cut = tmp_path / "cut"
    assert len(calls) == 1 and [r["step"] for r in read_metrics(cut) if r["kind"] == "eval"] == [0, 5]
    with open(cut / "metrics.jsonl", "a") as f:  # rows written after the checkpoint are dropped on resume
        f.write('{"kind": "step", "step": 6, "lr": 0, "train_loss": 9, "tokens_per_s": 1, "wall": 1}\n')
    tt.train(cut, progress=False)
    timing = TIMING
    key = lambda rows: [tuple((k, v) for k, v in r.items() if k not in timing) for r in rows]
    assert key(read_metrics(full)) == key(read_metrics(cut))
    a = torch.load(full / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(cut / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("family", ["laerc", "gpt"])
def test_weight_decay_groups(family, dataset):
    model = build_model(family, **{**MODELS[family], "vocab_size": dataset.vocab_size})
    decay, no_decay = decay_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    linear_w = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    assert decay["params"] and {id(p) for p in decay["params"]} == linear_w
    assert all(p.dim() == 2 for p in decay["params"])
    names = {id(p): n for n, p in model.named_parameters()}
    assert names[id(model.embed.weight)] and all(id(p) != id(model.embed.weight) for p in decay["params"])
    assert all(not n.endswith("bias") and "ln" not in n for n in (names[id(p)] for p in decay["params"]))
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_schedule_and_batches(dataset):
    tc = tt.TrainConfig(schedule="cosine", lr=1.0, warmup_steps=10, hold_steps=5, max_steps=115, min_lr_frac=0.1)
    assert tt.lr_at(tc, 0, 115) == pytest.approx(0.1) and tt.lr_at(tc, 9, 115) == 1.0 and tt.lr_at(tc, 14, 115) == 1.0
    assert tt.lr_at(tc, 65, 115) == pytest.approx(0.55) and tt.lr_at(tc, 115, 115) == pytest.approx(0.1)
    assert tt.lr_at(tt.TrainConfig(lr=0.5), 77, 115) == 0.5                     # constant (characters)
    lrs = [tt.lr_at(tc, k, 115) for k in range(15, 115)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    x, y = rb.token_batch(dataset.train, 5, 16, g1)
    assert x.shape == y.shape == (5, 16) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert torch.equal(x, rb.token_batch(dataset.train, 5, 16, g2)[0])


def test_bad_configs(dataset, tmp_path):
    V = dataset.vocab_size
    bad = [
        ("laerc", {**MODELS["laerc"], "vocab_size": V + 1}, {}, "does not match the dataset"),
        ("gpt", MODELS["gpt"], {"context": 64}, "unknown training"),               # a model field
        ("gpt", {**MODELS["gpt"], "context": dataset.n_tokens["val"] + 10}, {}, "not shorter"),
        ("gpt", MODELS["gpt"], {"lr": 0}, "lr"),
        ("gpt", MODELS["gpt"], {"max_steps": 0}, "max_steps"),
        ("gpt", MODELS["gpt"], {"batch_size": 2.5}, "batch_size"),
        ("gpt", MODELS["gpt"], {"lr": float("nan")}, "finite"),
        ("gpt", MODELS["gpt"], {"schedule": "linear"}, "schedule"),
        ("gpt", MODELS["gpt"], {"precision": "fp8"}, "precision"),
        ("gpt", MODELS["gpt"], {"min_lr_frac": 2}, "min_lr_frac"),
        ("gpt", MODELS["gpt"], {"heldout_eval": True}, "heldout_eval holds out the tails of character shards"),
        ("gpt", MODELS["gpt"], {"nope": 1}, "unknown training"),
        ("gpt", {**MODELS["gpt"], "n_heads": 3}, {}, "divisible"),
        ("gpt", {**MODELS["gpt"], "r_mult": 3}, {}, "unknown gpt"),
        ("mamba", {}, {}, "unknown model family"),
        ("rnn", {"hidden": 8}, {}, "trains on chars"),
        ("rc", {"size": 8}, {}, "trains on chars"),
    ]
    for i, (family, model, train, msg) in enumerate(bad):
        with pytest.raises(ReslmError, match=msg):
            tt.create_run(tmp_path / f"r{i}", family, model, {**TRAIN, **train}, dataset)
        assert not (tmp_path / f"r{i}").exists()
    with pytest.raises(ReslmError, match="not shorter"):
        rb.token_batch(np.zeros(10, dtype=np.uint16), 2, 10, torch.Generator())


# --- character shards ------------------------------------------------------------------------------
CHAR_TRAIN = dict(batch_size=64, epochs_per_shard=2, lr=3e-3, log_every=4, device="cpu", precision="fp32")


def test_char_schedule_steps_and_eval_points(chars, tmp_path):
    out = tt.create_run(tmp_path / "rc", "rc", dict(size=32), {**CHAR_TRAIN, "epoch_samples": 100}, chars)
    summary = tt.train(out, progress=False)
    evals = [r for r in read_metrics(out) if r["kind"] == "eval"]
    # 5 training shards x 2 epochs, 100 samples per shard-epoch at batch 64: 2 steps each
    assert [r["step"] for r in evals] == list(range(2, 21, 2))
    assert [(r["shard"], r["epoch"]) for r in evals[:3]] == [(0, 0), (0, 1), (1, 0)]
    assert summary["evaluations"] == 10 and summary["finished"] and summary["steps"] == 20
    for r in evals:
        assert r["test_bpc"] == pytest.approx(r["test_loss"] / np.log(2), rel=1e-12)
        assert r["test_bpc"] == pytest.approx(bits(r["test_loss"]))
    assert summary["final_test_loss"] == evals[-1]["test_loss"] < np.log(chars.vocab_size)


CAUSAL_TF = dict(ff_dim=16, n_heads=2, n_layers=1, context_mode="causal")
STREAM_RNN = dict(cell="gru", embed_dim=8, hidden=16, context_mode="stream")


@pytest.mark.parametrize("family,model", [("rc", dict(size=32)), ("tf", dict(ff_dim=16, n_heads=2, n_layers=1)),
                                          ("tf", CAUSAL_TF), ("rnn", STREAM_RNN)])
def test_char_resume_is_bitwise(chars, tmp_path, monkeypatch, family, model):
    train = {**CHAR_TRAIN, "epoch_samples": 128, "epochs_per_shard": 1}
    full = tt.create_run(tmp_path / "full", family, model, train, chars)
    tt.train(full, progress=False)
    cut = tt.create_run(tmp_path / "cut", family, model, train, chars)
    tt.train(cut, progress=False, stop_at=4)            # an eval point (2 steps per shard-epoch)
    tt.train(cut, progress=False)
    mid = tt.create_run(tmp_path / "mid", family, model, train, chars)
    tt.train(mid, progress=False, stop_at=5)            # mid shard-epoch: an extra evaluation, same weights
    tt.train(mid, progress=False)
    timing = TIMING
    key = lambda rows: [tuple((k, v) for k, v in r.items() if k not in timing) for r in rows if r["kind"] != "states"]
    assert key(read_metrics(full)) == key(read_metrics(cut))
    a = torch.load(full / "checkpoint.pt", weights_only=True)["model"]
    for run in (cut, mid):
        b = torch.load(run / "checkpoint.pt", weights_only=True)["model"]
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_run_stopped_at_its_deadline_resumes_to_what_an_uninterrupted_run_ends_at(chars, tmp_path):
    """`until` (a wall-clock deadline, here one already past): the run stops after its first step with a
    checkpoint, and the resumed run ends bitwise where an uninterrupted one does."""
    train = {**CHAR_TRAIN, "epoch_samples": 128, "epochs_per_shard": 1}
    model = dict(ff_dim=16, n_heads=2, n_layers=1)
    full = tt.create_run(tmp_path / "full", "tf", model, train, chars)
    tt.train(full, progress=False)
    cut = tt.create_run(tmp_path / "cut", "tf", model, train, chars)
    tt.train(cut, progress=False, until=0.0)
    assert torch.load(cut / "checkpoint.pt", weights_only=False)["step"] == 1 and not tt.is_finished(cut)
    tt.train(cut, progress=False)
    a = torch.load(full / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(cut / "checkpoint.pt", weights_only=True)["model"]
    assert tt.is_finished(cut) and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("family,model,data", [("tf", dict(ff_dim=16, n_heads=2, n_layers=1), "chars"),
                                                ("tf", CAUSAL_TF, "chars"), ("rnn", STREAM_RNN, "chars"),
                                                ("rc", dict(size=32), "chars"), ("gpt", MODELS["gpt"], "dataset")])
def test_killed_between_evaluations_resumes_from_the_timed_checkpoint(request, tmp_path, monkeypatch, family, model,
                                                                       data):
    """checkpoint_seconds=0 writes a checkpoint after every step between evaluations; a run killed right
    after one of them (mid shard-epoch) resumes from it and logs and ends exactly as an uninterrupted run."""
    ds = request.getfixturevalue(data)
    train = ({**CHAR_TRAIN, "epoch_samples": 256, "epochs_per_shard": 1, "log_every": 3} if data == "chars"
             else {**TRAIN, "max_steps": 12, "eval_every": 6, "log_every": 4})
    full = tt.create_run(tmp_path / "full", family, model, train, ds)
    tt.train(full, progress=False)
    real_save, saves = tt.loop.save_checkpoint, []

    def save_then_die(run_dir, state):
        real_save(run_dir, state)
        saves.append(state)
        if len(saves) == 5:
            raise KeyboardInterrupt

    monkeypatch.setattr(tt.loop, "save_checkpoint", save_then_die)
    cut = tt.create_run(tmp_path / "cut", family, model, train, ds)
    with pytest.raises(KeyboardInterrupt):
        tt.train(cut, progress=False, checkpoint_seconds=0)
    assert "segment" in saves[-1] and saves[-1]["segment"]["n"] > 0     # died between two evaluations
    monkeypatch.setattr(tt.loop, "save_checkpoint", real_save)
    tt.train(cut, progress=False)
    timing = TIMING
    key = lambda rows: [tuple((k, v) for k, v in r.items() if k not in timing) for r in rows if r["kind"] != "states"]
    assert key(read_metrics(full)) == key(read_metrics(cut))
    a = torch.load(full / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(cut / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_cached_states_are_read_back_on_resume_and_removed_at_the_end(chars, tmp_path, monkeypatch):
    """cache_states keeps the shard's and the test features in RUN/states: a run killed mid shard-epoch
    reads them back (and logs no second states row), ends bitwise as an uninterrupted run, and removes the
    folder; a torn cache file is computed again, never trusted."""
    model, train = dict(size=32), {**CHAR_TRAIN, "epoch_samples": 256, "epochs_per_shard": 1}
    full = tt.create_run(tmp_path / "full", "rc", model, train, chars)
    tt.train(full, progress=False)
    real_save, saves = tt.loop.save_checkpoint, []

    def save_then_die(run_dir, state):
        real_save(run_dir, state)
        saves.append(state)
        if len(saves) == 6:                  # step 6: shard-epoch 2, after the test states exist
            raise KeyboardInterrupt

    monkeypatch.setattr(tt.loop, "save_checkpoint", save_then_die)
    cut = tt.create_run(tmp_path / "cut", "rc", model, train, chars)
    with pytest.raises(KeyboardInterrupt):
        tt.train(cut, progress=False, checkpoint_seconds=0, cache_states=True)
    monkeypatch.setattr(tt.loop, "save_checkpoint", real_save)
    cached = sorted(p.name for p in (cut / tt.STATES).glob("*.pt"))
    assert cached == ["test-0.pt", "train-shard1.pt"]       # one cycle: shard 0's file went with shard 0
    torn = cut / tt.STATES / "test-0.pt"
    torn.write_bytes(torn.read_bytes()[:100])
    real_load, hits = rs.StateCache.load, []

    def load(self, name, dtype):
        feats = real_load(self, name, dtype)
        hits.append((name, feats is not None))
        return feats

    monkeypatch.setattr(rs.StateCache, "load", load)
    tt.train(cut, progress=False, cache_states=True)
    assert hits[:2] == [("train-shard1", True), ("test-0", False)]   # shard 1 read back; the torn file not
    rows = read_metrics(cut)
    states = [(r["shard"], r.get("cached", False)) for r in rows if r["kind"] == "states"]
    assert states[:3] == [(0, False), (1, False), (2, False)]   # the resume logs no second row for shard 1
    timing = TIMING
    key = lambda rows: [tuple((k, v) for k, v in r.items() if k not in timing) for r in rows if r["kind"] != "states"]
    assert key(read_metrics(full)) == key(rows)
    a = torch.load(full / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(cut / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not (cut / tt.STATES).exists()


@pytest.mark.parametrize("room", [True, False])
def test_a_later_cycle_reads_every_shard_back_while_the_disk_has_room(chars, tmp_path, monkeypatch, room):
    """With cycles > 1, cache_states keeps every training shard's states (the disk permitting): the
    second cycle reads them back instead of computing them, and the run ends bitwise as one without a
    cache. Without room (the reserve above the free disk) only the current shard's file is kept."""
    model, train = dict(size=32), {**CHAR_TRAIN, "epoch_samples": 256, "epochs_per_shard": 1, "cycles": 2}
    plain = tt.create_run(tmp_path / "plain", "rc", model, train, chars)
    tt.train(plain, progress=False)
    if not room:
        monkeypatch.setattr(rs, "reserve_bytes", lambda folder: 1 << 62)
    kept = []
    real_store = rs.StateCache.store

    def store(self, name, feats, **kw):
        real_store(self, name, feats, **kw)
        kept.append(sorted(p.stem for p in self.folder.glob("train-*.pt")))

    monkeypatch.setattr(rs.StateCache, "store", store)
    cached = tt.create_run(tmp_path / "cached", "rc", model, train, chars)
    tt.train(cached, progress=False, cache_states=True)
    shards = len(chars.train_shards)
    rows = [r for r in read_metrics(cached) if r["kind"] == "states"]
    assert [r.get("cached", False) for r in rows if r["cycle"] == 1] == [room] * shards
    assert kept[-1] == ([f"train-shard{s}" for s in sorted(chars.train_shards)] if room else [kept[-1][0]])
    timing = TIMING
    key = lambda rows: [tuple((k, v) for k, v in r.items() if k not in timing) for r in rows if r["kind"] != "states"]
    assert key(read_metrics(plain)) == key(read_metrics(cached))
    assert not (cached / tt.STATES).exists()


def test_non_finite_loss_stops_with_the_last_checkpoint_kept(chars, tmp_path):
    out = tt.create_run(tmp_path / "nan", "tf", dict(ff_dim=16, n_heads=2, n_layers=1),
                        {**CHAR_TRAIN, "epoch_samples": 128, "epochs_per_shard": 1, "lr": 1.0}, chars)
    tt.train(out, progress=False, stop_at=2)
    before = (out / "checkpoint.pt").read_bytes()
    with torch.no_grad():  # poison the weights the way a diverged run would
        pass
    ck = torch.load(out / "checkpoint.pt", weights_only=True)
    ck["model"]["head.weight"].fill_(float("nan"))
    save_checkpoint(out, ck)   # as reslm would save it (with its checksum): a poisoned, not a damaged file
    with pytest.raises(ReslmError, match="non-finite loss or gradient at step 3"):
        tt.train(out, progress=False)
    assert (out / "checkpoint.pt").read_bytes() != before  # the poisoned file is what we wrote, untouched since
    assert all(np.isfinite(r.get("train_loss", 0.0)) for r in read_metrics(out))


def test_more_cycles_grow_a_finished_run_into_the_longer_one(chars, tmp_path):
    """A finished 1-cycle run asked for 2 cycles goes on and ends where a fresh 2-cycle run ends."""
    model = dict(size=24, hidden=4)
    train = {**CHAR_TRAIN, "epoch_samples": 128, "epochs_per_shard": 1}
    fresh = tt.create_run(tmp_path / "fresh", "aerc", model, {**train, "cycles": 2}, chars)
    tt.train(fresh, progress=False)
    grown = tmp_path / "grown"
    assert tt.ensure_run(grown, "aerc", model, train, chars) == "starting"
    tt.train(grown, progress=False)
    assert tt.ensure_run(grown, "aerc", model, train, chars) == "done"
    assert tt.ensure_run(grown, "aerc", model, {**train, "cycles": 2}, chars) == "resuming to 2 cycles"
    tt.train(grown, progress=False)
    assert tt.ensure_run(grown, "aerc", model, {**train, "cycles": 2}, chars) == "done"
    timing = TIMING
    key = lambda rows: [tuple((k, v) for k, v in r.items() if k not in timing) for r in rows if r["kind"] != "states"]
    assert key(read_metrics(fresh)) == key(read_metrics(grown))
    a = torch.load(fresh / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(grown / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ReslmError, match="different budget"):   # fewer cycles than the run has
        tt.ensure_run(grown, "aerc", model, train, chars)
    cosine = tt.create_run(tmp_path / "cosine", "aerc", model, {**train, "schedule": "cosine"}, chars)
    with pytest.raises(ReslmError, match="cannot be extended"):
        tt.grow_cycles(cosine, 2)




def test_resumed_run_logs_exactly_what_an_uninterrupted_one_does(chars, tmp_path, monkeypatch):
    """Stopped in the middle of a shard (between its two epochs) and killed mid-epoch after a timed
    checkpoint, then resumed each time, a run's log holds the same rows as an uninterrupted run's,
    states rows included (one per shard, not one per attempt); only wall times differ. The checkpoint's
    metrics_rows, the weights and the summary (wall times aside) are the same."""
    model, train = dict(size=32), {**CHAR_TRAIN, "epoch_samples": 128}   # 2 steps per epoch, 2 epochs per shard
    full = tt.create_run(tmp_path / "full", "rc", model, train, chars)
    s_full = tt.train(full, progress=False)
    cut = tt.create_run(tmp_path / "cut", "rc", model, train, chars)
    tt.train(cut, progress=False, stop_at=6)      # shard 1, between its two epochs
    real_save = tt.loop.save_checkpoint

    def save_then_die(run_dir, state):
        real_save(run_dir, state)
        if state["step"] == 11:                   # shard 2, mid-epoch: a timed checkpoint
            raise KeyboardInterrupt

    monkeypatch.setattr(tt.loop, "save_checkpoint", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        tt.train(cut, progress=False, checkpoint_seconds=0)
    monkeypatch.setattr(tt.loop, "save_checkpoint", real_save)
    s_cut = tt.train(cut, progress=False)
    strip = lambda rows: [{k: v for k, v in r.items() if k not in TIMING} for r in rows]  # noqa: E731
    a, b = read_metrics(full), read_metrics(cut)
    assert [r["kind"] for r in a].count("states") == 5
    assert strip(a) == strip(b)
    ck_a = torch.load(full / "checkpoint.pt", weights_only=True)
    ck_b = torch.load(cut / "checkpoint.pt", weights_only=True)
    assert ck_a["metrics_rows"] == ck_b["metrics_rows"] == len(a)
    assert all(torch.equal(ck_a["model"][k], ck_b["model"][k]) for k in ck_a["model"])
    per_attempt = ("train_seconds", "reservoir_seconds", "eval_seconds")
    assert {k: v for k, v in s_full.items() if k not in per_attempt} == \
           {k: v for k, v in s_cut.items() if k not in per_attempt}


def test_min_train_loss_covers_every_logged_loss(chars, tmp_path):
    """min_train_loss is the least train loss logged anywhere, the evaluations' (final_train_loss among
    them) included, not only the sparse step rows'."""
    out = tt.create_run(tmp_path / "rc", "rc", dict(size=32), {**CHAR_TRAIN, "epoch_samples": 128,
                                                               "log_every": 3}, chars)
    summary = tt.train(out, progress=False)
    rows = read_metrics(out)
    losses = [r["train_loss"] for r in rows if r["kind"] in ("step", "eval") and "train_loss" in r]
    assert summary["min_train_loss"] == min(losses)
    assert summary["min_train_loss"] <= summary["final_train_loss"]


def test_samplers_carry_what_the_loop_and_the_cli_branched_on(chars, dataset):
    """The one loop and the CLI ask the family's sampler (kind, default dataset, weights, rates) and the
    TrainConfig field metadata (data_fields) instead of branching on the family's data kind."""
    assert tt.data_fields("chars") == ("epochs_per_shard", "cycles", "epoch_samples", "shard_chars", "eval_samples",
                                       "final_eval_samples", "state_dtype", "val_fraction", "val_split",
                                       "eval_at", "test_every", "keep_best_val", "continue_from")
    assert tt.data_fields("tokens") == ("max_steps", "eval_every", "eval_batches")
    assert set(tt.data_fields()) == set(tt.data_fields("chars")) | set(tt.data_fields("tokens"))
    assert [tt.sampler_for(f) for f in ("rc", "aerc", "tf", "rnn", "laerc", "gpt")] == [rb.CharShards] * 4 + [
        rb.TokenWindows] * 2
    assert (rb.CharShards.kind, rb.TokenWindows.kind) == ("chars", "tokens")
    micro = [(None, torch.zeros(3)), (None, torch.zeros(1))]
    assert rb.CharShards.weights(micro) == ([0.75, 0.25], 4)      # by samples; the step weighs 4 in a segment
    assert rb.TokenWindows.weights(micro) == ([0.5, 0.5], 1)      # equal windows; the step weighs 1


def test_token_families_read_the_one_declaration_of_their_training_defaults():
    """reslm.settings declares the token families' defaults (TOKEN_TRAIN) and the authors' variant's
    training values (AUTHORS_TRAIN); the registry, train_config and authors_variant read them there."""
    from reslm.models import MODELS
    from reslm.models.laerc import AUTHORS_VARIANT
    from reslm.settings import AUTHORS_TRAIN, TOKEN_TRAIN, authors_train
    assert MODELS["laerc"].train is TOKEN_TRAIN and MODELS["gpt"].train is TOKEN_TRAIN and not MODELS["rc"].train
    assert tt.train_config("gpt").lr == TOKEN_TRAIN["lr"] and tt.train_config("rc").lr == tt.TrainConfig().lr
    assert AUTHORS_TRAIN == dict(lr=4e-4, warmup_frac=0.01, hold_frac=0.10)
    assert authors_train(1500) == dict(lr=4e-4, warmup_steps=15, hold_steps=150)
    model, train = tt.authors_variant({"dim": 8}, {"max_steps": 2000, "lr": 1e-3})
    assert model == {**AUTHORS_VARIANT, "dim": 8}   # the user's own overrides win
    assert train == dict(lr=1e-3, warmup_steps=20, hold_steps=200, max_steps=2000)
