"""All-position training of the trained character families: the causal transformer (every position of
a chunk a target, a causal mask) and the recurrent model's stream mode (truncated BPTT, the state
carried from chunk to chunk), against the window protocol they stand beside."""
import math

import pytest
import torch
import torch.nn.functional as F

import reslm.models.rnn as rnn_mod
from reslm import train as tt
from reslm.train.batches import CharShards
from reslm.core.errors import ReslmError
from reslm.features import ChunkFeatures
from reslm.models import build_model
from reslm.run import read_metrics

TINY = dict(batch_size=64, epochs_per_shard=1, epoch_samples=256, lr=3e-3, log_every=4, device="cpu",
            precision="fp32")


def test_chunks_cover_the_stream_with_every_position_a_target():
    t = torch.arange(100)
    f = ChunkFeatures(t, 4, phase=3)
    assert len(f) == ChunkFeatures.count(100, 4) == 24
    assert f.inputs[0].tolist() == [3, 4, 5, 6] and f.targets[0].tolist() == [4, 5, 6, 7]
    assert torch.equal(f.targets[:, :-1], f.inputs[:, 1:])            # a chunk's targets are its next tokens
    assert torch.equal(f.inputs.reshape(-1), t[3:3 + 24 * 4])         # contiguous, no overlap
    for phase in range(4):                                           # the count holds at every phase
        assert len(ChunkFeatures(t, 4, phase=phase)) == 24


def test_strided_chunks_overlap_so_that_their_last_positions_tile_the_stream():
    t = torch.arange(100)
    f = ChunkFeatures(t, 8, phase=1, stride=3)          # the last 3 positions of each chunk are scored
    assert len(f) == ChunkFeatures.count(100, 8, stride=3) == 30
    assert f.inputs[0].tolist() == list(range(1, 9)) and f.inputs[1].tolist() == list(range(4, 12))
    assert torch.equal(f.targets, f.inputs + 1)
    assert torch.equal(f.targets[:, -3:].reshape(-1), t[7:7 + 30 * 3])   # each target scored once, in order
    for phase in range(3):                               # the count holds at every phase below the stride
        g = ChunkFeatures(t, 8, phase=phase, stride=3)
        assert len(g) == 30 and g.targets[-1, -1] <= 99


def test_streams_are_pieces_side_by_side_in_order():
    t = torch.arange(100)
    f = ChunkFeatures(t, 4, streams=3)
    assert f.sequential and len(f) == ChunkFeatures.count(100, 4, 3) == 24
    # batch j (samples 3j..3j+2) is chunk j of each of the 3 pieces of 32 tokens
    assert f.inputs[:3, 0].tolist() == [0, 32, 64] and f.inputs[3:6, 0].tolist() == [4, 36, 68]
    assert torch.equal(f.targets, f.inputs + 1)


def test_causal_transformer_scores_each_position_from_its_prefix():
    m = build_model("tf", ff_dim=16, n_heads=2, n_layers=2, dropout=0.0, context_mode="causal").eval()
    x = torch.randint(0, 59, (3, 32))
    every, loss = m(x, torch.randint(0, 59, (3, 32)))
    last, _ = m(x)                                  # scoring: the last position of the window
    assert every.shape == (3, 32, 59) and last.shape == (3, 1, 59) and loss.dim() == 0
    assert torch.allclose(every[:, -1], last[:, 0], atol=1e-5)
    for t in (0, 7, 20):                            # position t sees exactly the t + 1 characters up to it
        prefix, _ = m(x[:, :t + 1])
        assert torch.allclose(every[:, t], prefix[:, 0], atol=1e-5)
    x2 = x.clone()
    x2[:, 16:] = (x2[:, 16:] + 1) % 59              # the future never changes the past
    assert torch.equal(m(x2, torch.zeros(3, 32, dtype=torch.long))[0][:, :16], every[:, :16])


def test_min_context_scores_only_the_positions_with_that_much_context(chars):
    m = build_model("tf", ff_dim=16, n_heads=2, n_layers=1, dropout=0.0, context_mode="causal", min_context=25,
                    vocab_size=chars.vocab_size)
    assert m.chunk_targets == 8
    tc = tt.train_config("tf", **TINY)
    src = CharShards(m, chars, tc, torch.device("cpu"), None, False)
    (x, y), = src.batches(0)
    assert x.shape == (8, 32) and y.shape == (8, 8)      # 64 targets = 8 chunks x their last 8 positions
    assert torch.equal(y, torch.cat([x[:, 25:], y[:, -1:]], 1))   # the next characters of positions 24..31
    logits, loss = m.forward_features(x, y)
    full = build_model("tf", ff_dim=16, n_heads=2, n_layers=1, dropout=0.0, context_mode="causal",
                       vocab_size=chars.vocab_size)
    every, _ = full.forward_features(x, torch.cat([x[:, 1:], y[:, -1:]], 1))
    assert torch.allclose(logits, every[:, 24:], atol=1e-6)   # the same weights score the same positions
    assert loss.item() == pytest.approx(F.cross_entropy(every[:, 24:].reshape(-1, every.shape[-1]),
                                                        y.reshape(-1)).item(), rel=1e-5)


def test_window_and_causal_transformers_have_the_same_weights():
    a = build_model("tf", ff_dim=16, n_heads=2, n_layers=2)
    b = build_model("tf", ff_dim=16, n_heads=2, n_layers=2, context_mode="causal")
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_stream_loss_equals_one_pass_through_the_text(cell, monkeypatch):
    m = build_model("rnn", cell=cell, embed_dim=8, hidden=16, context_mode="stream")
    t = torch.randint(0, 59, (3000,))
    with torch.no_grad():
        out, _ = m.rnn(m.embed(t[None, :-1]))
        one = F.cross_entropy(m.head(out)[0], t[1:]).item()
    monkeypatch.setattr(rnn_mod, "STREAM_PIECES", 1)
    assert m.stream_loss(t) == (pytest.approx(one, rel=1e-6), 2999)
    # pieces side by side, each warmed up on the text before it: the same up to the state's memory
    monkeypatch.setattr(rnn_mod, "STREAM_PIECES", 6)
    monkeypatch.setattr(rnn_mod, "STREAM_WARMUP", 400)
    loss, n = m.stream_loss(t)
    assert n == 2999 and loss == pytest.approx(one, abs=1e-4)


def test_stream_rnn_steps_as_it_reads():
    m = build_model("rnn", cell="lstm", embed_dim=8, hidden=16, context_mode="stream")
    assert m.stateful and not build_model("rnn", cell="lstm", embed_dim=8, hidden=16).stateful
    t = torch.randint(0, 59, (12,))
    state, outs = m.init_state(1), []
    for i in range(12):
        logits, state = m.step(t[i:i + 1], state)
        outs.append(logits)
    with torch.no_grad():
        out, _ = m.rnn(m.embed(t[None]))
    assert torch.allclose(torch.cat(outs), m.head(out[0]), atol=1e-6)


def test_stream_training_carries_the_state_from_batch_to_batch(chars):
    m = build_model("rnn", cell="gru", embed_dim=8, hidden=16, context_mode="stream", vocab_size=chars.vocab_size)
    tc = tt.train_config("rnn", **TINY)
    src = CharShards(m, chars, tc, torch.device("cpu"), None, False)
    (x0, y0), = src.batches(0)
    assert x0.shape == y0.shape == (2, 32)          # batch 64 targets = 2 pieces x 32 characters
    m.forward_features(x0, y0)
    carried = m.carry.clone()
    (x1, _), = src.batches(1)
    assert torch.equal(x1[:, 0], y0[:, -1])          # batch 1 continues batch 0 in each piece
    assert src.state_dict()["carry"] is m.carry and torch.equal(m.carry, carried)
    first_of_next = src.ends[0]
    src.batches(first_of_next)                       # a new shard-epoch: every piece from zero
    assert m.carry is None


@pytest.mark.parametrize("family,model,window", [
    ("tf", dict(ff_dim=16, n_heads=2, n_layers=1), dict(context_mode="causal")),
    ("rnn", dict(cell="gru", embed_dim=8, hidden=16), dict(context_mode="stream"))])
def test_all_position_runs_count_steps_and_targets_as_the_window_protocol(chars, tmp_path, family, model, window):
    """The batch counts targets in both modes: a step of 64 targets is 64 windows or 2 chunks of 32, so
    a shard-epoch has the same number of steps (up to a chunk's rounding); the test CE is the window CE."""
    runs = {}
    for name, extra in (("window", {}), ("all", window)):
        out = tt.create_run(tmp_path / name, family, {**model, **extra}, {**TINY, "epoch_samples": 0,
                                                                          "shard_chars": 640}, chars)
        runs[name] = (tt.train(out, progress=False), read_metrics(out))
    (sw, mw), (sa, ma) = runs["window"], runs["all"]
    chunks = 19 if family == "tf" else 18            # (640 - 32) // 32 chunks; 2 pieces of (639 // 2) // 32
    assert sw["steps"] == 5 * math.ceil((640 - 32) / 64) == 50 and sa["steps"] == 5 * math.ceil(chunks / 2)
    assert sw["test_metric"] == sa["test_metric"] == "window-32"
    evals = [r for r in ma if r["kind"] == "eval"]
    assert all(r["test_loss"] < math.log(chars.vocab_size) for r in evals)
    if family == "rnn":                              # stream mode also scores the state carried through
        assert all("test_stream_loss" in r for r in evals) and "final_test_stream_loss" in sa


def test_a_min_context_run_keeps_the_window_protocols_steps(chars, tmp_path):
    """Chunks that score their last 8 positions overlap by 24 characters: a shard-epoch scores every
    character once, so a step of 64 targets (8 chunks) gives as many steps as 64 windows."""
    out = tt.create_run(tmp_path / "r", "tf", dict(ff_dim=16, n_heads=2, n_layers=1, context_mode="causal",
                                                  min_context=25), {**TINY, "epoch_samples": 0, "shard_chars": 640}, chars)
    s = tt.train(out, progress=False)
    assert s["steps"] == 5 * math.ceil((640 - 32) / 64) == 50 and s["test_metric"] == "window-32"
    assert s["final_test_loss"] < math.log(chars.vocab_size)


@pytest.mark.parametrize("family,model,train,msg", [
    ("tf", dict(context_mode="causal"), dict(batch_size=100), "32 per chunk: batch_size 100 is not a multiple of 32"),
    ("tf", dict(context_mode="causal", min_context=25), dict(batch_size=100), "8 per chunk: batch_size 100 is not a multiple of 8"),
    ("tf", dict(min_context=25), {}, "min_context applies to causal training"),
    ("tf", dict(context_mode="causal", min_context=33), {}, "min_context must be from 1 to the context"),
    ("tf", dict(context_mode="causal", min_context=0), {}, "min_context must be from 1 to the context"),
    ("rnn", dict(context_mode="stream"), dict(grad_accum=2), "grad_accum must be 1"),
    ("tf", dict(context_mode="stream"), {}, "context_mode must be one of window, causal"),
    ("rnn", dict(context_mode="causal"), {}, "context_mode must be one of window, stream")])
def test_all_position_modes_refuse_what_they_cannot_do(chars, tmp_path, family, model, train, msg):
    with pytest.raises(ReslmError, match=msg):
        tt.create_run(tmp_path / "r", family, model, {**TINY, **train}, chars)
    assert not (tmp_path / "r").exists()


def test_eval_of_a_stream_rnn_gives_both_metrics(chars, tmp_path):
    from reslm.scoring.evaluate import evaluate_run
    out = tt.create_run(tmp_path / "r", "rnn", dict(cell="gru", embed_dim=8, hidden=16, context_mode="stream"),
                        {**TINY, "eval_samples": 100}, chars)
    tt.train(out, progress=False)
    result = evaluate_run(out, length=20, ns=(3,), score=0)
    assert result["test_loss"] > 0 and result["test_stream_loss"] > 0
    w = tt.create_run(tmp_path / "w", "rnn", dict(cell="gru", embed_dim=8, hidden=16), {**TINY, "eval_samples": 100},
                      chars)
    tt.train(w, progress=False)
    assert "test_stream_loss" not in evaluate_run(w, length=20, ns=(3,), score=0)


@pytest.mark.parametrize("final_eval_samples,score", [(0, 0), (-1, 100 + 1 - 32)])
def test_the_carried_test_ce_covers_the_text_it_names(chars, tmp_path, final_eval_samples, score):
    """The state-carried test CE of a training evaluation of n samples reads the test text's first n + 1
    tokens (100 samples in 8 blocks), or all of it (final_eval_samples 0): the figure `reslm eval`
    gives for the same tokens (score s reads the first s + context)."""
    from reslm.scoring.evaluate import evaluate_run
    out = tt.create_run(tmp_path / "r", "rnn", dict(cell="gru", embed_dim=8, hidden=16, context_mode="stream"),
                        {**TINY, "eval_samples": 100, "final_eval_samples": final_eval_samples}, chars)
    summary = tt.train(out, progress=False)
    result = evaluate_run(out, length=1, ns=(1,), score=score, write=False)
    assert summary["final_test_stream_loss"] == pytest.approx(result["test_stream_loss"], rel=1e-6)
