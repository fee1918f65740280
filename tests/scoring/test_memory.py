"""`reslm memory` (reslm/scoring/memory.py): each target read from exactly k symbols from a zero state, on one set
of positions for every run; the stepped and the windowed read agree; pairing; the command's output and
its one-line errors. Tiny runs on the tiny character corpus."""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from reslm import train as tt
from reslm.cli import main
from reslm.core.errors import ReslmError
from reslm.core.metrics import MEMORY_LOSS
from reslm.data.splits import ShardSplit
from reslm.scoring.memory import memory_positions, memory_profile, window_losses
from reslm.models.load import load_run

TINY = dict(batch_size=64, epochs_per_shard=1, epoch_samples=256, lr=3e-3, log_every=4, device="cpu", precision="fp32")


@pytest.fixture(scope="module")
def runs(chars, tmp_path_factory):
    root = tmp_path_factory.mktemp("memory")
    made = {}
    out = tt.create_run(root / "rc-val", "rc", dict(size=24, context=8), {**TINY, "val_fraction": 0.2}, chars)
    tt.train(out, progress=False)
    made["rc-val"] = out
    for name, family, model in (("rc", "rc", dict(size=24, context=8)),
                                ("rnn", "rnn", dict(cell="gru", embed_dim=8, hidden=16, context=8, context_mode="stream")),
                                ("tf", "tf", dict(ff_dim=16, n_heads=2, n_layers=1, context=8))):
        out = tt.create_run(root / name, family, model, TINY, chars)
        tt.train(out, progress=False)
        made[name] = out
    return made


def test_positions_are_spread_and_leave_room_for_the_longest_length():
    t = memory_positions(1000, 64, 10)
    assert t.numel() == 10 and int(t[0]) == 64 and int(t[-1]) < 1000 and bool((t[1:] > t[:-1]).all())
    assert memory_positions(70, 64, 100).tolist() == [64, 65, 66, 67, 68, 69]   # fewer targets than asked
    with pytest.raises(ReslmError, match="too short for a length of 64"):
        memory_positions(64, 64, 10)
    spans = [(0, 100), (300, 310), (500, 600)]        # each target 64 symbols into its own span: none in the second
    t = memory_positions(spans, 64, 50)
    assert t.numel() == 50 and bool((t[1:] > t[:-1]).all())
    assert all(any(a + 64 <= int(i) < b for a, b in spans) for i in t)
    assert memory_positions(spans, 64, 10**6).tolist() == [*range(64, 100), *range(564, 600)]   # every target once


def test_the_training_text_and_the_validation_split_are_the_runs_own(runs, chars):
    """--text train scores the run's training part of each training shard, --text val its held-out part
    (ShardSplit's spans, from the run's val_fraction), each figure the mean of the windows read there."""
    run = runs["rc-val"]
    model, _, _ = load_run(run)
    ds = chars
    split = ShardSplit(ds, 8, 0.2)
    for text, spans in (("train", [split.span(s) for s in ds.train_shards]),
                        ("val", [(a + 8, b) for a, b in (split.span(s, "heldout") for s in ds.train_shards)])):
        r = memory_profile([run], lengths=(4, 8), positions=120, progress=False, text=text)
        assert r["split"] == text and r["text_symbols"] == sum(b - a for a, b in spans)
        targets = memory_positions(spans, 8, 120)
        tokens = torch.from_numpy(np.array(ds.tokens, dtype=np.int64))
        for k in (4, 8):
            assert r["runs"][0][MEMORY_LOSS][str(k)] == pytest.approx(
                float(window_losses(model, tokens, targets, k).mean()), abs=1e-9)
    with pytest.raises(ReslmError, match="kept no text out of training"):
        memory_profile([runs["rc"]], lengths=(4,), positions=10, progress=False, text="val")
    with pytest.raises(ReslmError, match="their train text differs"):
        memory_profile([run, runs["rc"]], lengths=(4,), positions=10, progress=False, text="train")


@pytest.mark.parametrize("name", ["rc", "rnn"])
def test_stepping_through_k_symbols_is_the_window_forward(runs, name, monkeypatch):
    """Reading k symbols from a zero state gives what stepping through them one by one gives, and (k up
    to the context) what the model's forward computes over a window of them (the paper's metric at
    k = context). A reservoir model reads with forward at any k, in time pieces when the window is long."""
    import reslm.models.reservoir_lm as reservoir_lm
    monkeypatch.setattr(reservoir_lm, "WINDOW_ELEMS", 16 * 24 * 3)   # pieces of 3 steps for a batch of 16
    model, _, _ = load_run(runs[name])
    tokens = torch.randint(0, model.config.vocab_size, (300,), generator=torch.Generator().manual_seed(0))
    targets = memory_positions(300, 20, 50)
    for k in (1, 5, 8, 20):
        read = window_losses(model, tokens, targets, k, batch=16)
        idx = tokens[targets[:, None] + torch.arange(-k, 0)]
        with torch.no_grad():
            state = model.init_state(idx.shape[0])
            for j in range(k):
                logits, state = model.step(idx[:, j], state)
            ce = F.cross_entropy(logits, tokens[targets], reduction="none").double()
            torch.testing.assert_close(read, ce, rtol=1e-5, atol=1e-5)
            if k <= 8:
                logits = model(idx)[0][:, -1]
                torch.testing.assert_close(read, F.cross_entropy(logits, tokens[targets], reduction="none").double(),
                                           rtol=1e-5, atol=1e-5)


def test_runs_are_paired_on_one_set_of_positions(runs):
    r = memory_profile([runs["rc"], runs["rnn"], runs["tf"]], lengths=(16, 2, 8), positions=200, progress=False)
    assert r["lengths"] == [2, 8, 16] and r["positions"] == 200 and r["unit"] == "nats/symbol"
    rc, rnn, tf = r["runs"]
    assert (rc["family"], rnn["family"], tf["family"]) == ("rc", "rnn", "tf")
    assert tf[MEMORY_LOSS]["16"] is None and tf[MEMORY_LOSS]["8"] is not None   # a window model: k <= context
    for row, p in zip((rnn, tf), r["paired"]):
        assert p["against"] == rc["run"] and p["run"] == row["run"]
        for k in ("2", "8"):   # the mean of the differences is the difference of the means
            assert p["difference"][k] == pytest.approx(row[MEMORY_LOSS][k] - rc[MEMORY_LOSS][k], abs=1e-12)
            assert p["se"][k] > 0
    assert memory_profile([runs["rc"], runs["rnn"], runs["tf"]], lengths=(16, 2, 8), positions=200,
                          progress=False) == r                                     # same positions, same figures


def test_the_command_prints_writes_and_draws(runs, tmp_path, capsys):
    out, png = tmp_path / "m.json", tmp_path / "m.png"
    assert main(["memory", str(runs["rc"]), str(runs["rnn"]), "--lengths", "1,4", "--positions", "64",
                 "--out", str(out), "--plot", str(png), "--no-progress", "--threads", "1"]) == 0
    text = capsys.readouterr().out
    assert "predicted from exactly k symbols before it" in text and "[1] - [0]" in text
    result = json.loads(out.read_text())
    assert result["positions"] == 64 and [r["family"] for r in result["runs"]] == ["rc", "rnn"]
    assert png.read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("argv,msg", [
    (["--lengths", "1,x"], "--lengths must be comma-separated integers"),
    (["--lengths", "0,4"], "lengths must be integers >= 1"),
    (["--out", "m.txt"], "must end in .json"),
    (["--plot", "m.jpg"], "must end in .png"),
    (["--text", "val"], "kept no text out of training: --text test or train")])
def test_bad_input_is_one_line_and_writes_nothing(runs, tmp_path, capsys, monkeypatch, argv, msg):
    monkeypatch.chdir(tmp_path)
    assert main(["memory", str(runs["rc"]), "--no-progress", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("reslm: error:") and msg in err and "\n" not in err
    assert list(tmp_path.iterdir()) == []


def test_runs_of_two_datasets_are_refused(runs, dataset, tmp_path, capsys):
    other = tt.create_run(tmp_path / "gpt", "gpt", dict(dim=8, n_layers=1, n_heads=2, context=8), {}, dataset)
    assert main(["memory", str(runs["rc"]), str(other), "--no-progress"]) == 2
    assert "runs are compared on one text" in capsys.readouterr().err
