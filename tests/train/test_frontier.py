"""The reservoir frontier (issue 26): the rules as code, readout heads, EMA, the ceiling family, L-BFGS."""
import json
import math

import pytest
import torch
import torch.nn as nn

from reslm.cli import main
from reslm.models import build_model, check_frontier_config, make_config, preset, preset_table
from reslm.models.budget import FRONTIER_BUDGET, check_frontier
from reslm.models.rc import RC
import reslm.train.batches as rb
import reslm.run.state_cache as rs
from reslm.publish import TIMING


def test_presets_frontier_verdicts():
    rows = {r["name"]: r for r in preset_table()}
    assert rows["aerc-160-30"]["frontier"] and rows["aerc-160-30"]["trainable_params"] == FRONTIER_BUDGET == 155_459
    assert all(rows[n]["frontier"] for n in rows if n.startswith(("rc-", "aerc-")))
    assert not any(r["frontier"] for r in rows.values() if r["family"] == "tf")
    fam, over = preset("tf-64-4-4")
    v = check_frontier_config(fam, make_config(fam, **over))
    assert not v.ok and v.trainable_params == 15067 and "not a reservoir family" in v.reasons[0]


def test_frontier_budget_and_structure_rules():
    over = check_frontier_config("rc", make_config("rc", size=2700))      # 59 * 2701 > 155,459
    assert not over.ok and over.trainable_params == 59 * 2701 and "over the budget" in over.reasons[-1]
    m = build_model("rc", size=20, vocab_size=7)
    assert check_frontier(m).ok and check_frontier(m).trainable_params == 7 * 21
    m.reservoir.W_leak = nn.Parameter(torch.zeros(3))                    # a trained part of the substrate
    v = check_frontier(m)
    assert not v.ok and any("outside the readout head" in r for r in v.reasons)
    assert any("substrate has trainable" in r for r in v.reasons)

    class Peeks(RC):                                                     # a head that reads more than the state
        def forward_features(self, states, targets=None):
            return super().forward_features(states, targets)

    v = check_frontier(Peeks(make_config("rc", size=20, vocab_size=7)))
    assert not v.ok and "overridden (forward_features)" in v.reasons[0]

    wide = build_model("rc", size=60, readout_dim=20, vocab_size=7)     # a larger reservoir read through 20 channels
    assert check_frontier(wide).ok and check_frontier(wide).trainable_params == 7 * 21
    wide.projection = nn.Parameter(wide.projection.clone())              # a trained projection is not a substrate
    v = check_frontier(wide)
    assert not v.ok and any("readout projection is trained" in r for r in v.reasons)


def test_presets_command_prints_the_verdict(capsys):
    assert main(["presets"]) == 0
    lines = {ln.split()[0]: ln.split() for ln in capsys.readouterr().out.splitlines()[1:]}
    assert lines["aerc-160-30"][-1] == "yes" and lines["tf-256-16-16"][-1] == "no"
    assert main(["presets", "--json"]) == 0
    assert all("frontier" in r for r in json.loads(capsys.readouterr().out))


CHAR_TRAIN = dict(batch_size=64, epochs_per_shard=1, epoch_samples=128, lr=3e-3, log_every=4, device="cpu",
                  precision="fp32")


@pytest.mark.parametrize("family,model,ok", [("rc", dict(size=24, streams=8), True),
                                             ("tf", dict(ff_dim=16, n_heads=2, n_layers=1), False)])
def test_summary_says_whether_the_run_qualifies(chars, tmp_path, family, model, ok):
    import reslm.train as tt
    summary = tt.train(tt.create_run(tmp_path / family, family, model, CHAR_TRAIN, chars), progress=False)
    assert summary["frontier"] is ok


# --- readout heads ----------------------------------------------------------------------------------
from reslm.core.errors import ReslmError  # noqa: E402
from reslm.models.heads import head_params, widest_hidden  # noqa: E402

V = 13
HEADED = [("rc", dict(head="mlp", head_hidden=9)), ("rc", dict(head="glu", head_hidden=7, head_input="state+onehot")),
          ("rc", dict(head="mlp", head_hidden=5, head_input="state+embed")), ("rc", dict(head_input="state+onehot")),
          ("aerc", dict(hidden=4, head_input="state+onehot"))]


def headed(family, over, **kw):
    size = dict(size=24) if family == "rc" else dict(size=16)
    return build_model(family, **{**size, "vocab_size": V, "context": 8, "embed_dim": 6, **over, **kw})


@pytest.mark.parametrize("kind,hi,width", [("linear", "state", 24), ("mlp", "state", 24), ("glu", "state+onehot", 24 + V),
                                           ("mlp", "state+embed", 24 + 6), ("mlp2", "state", 24), ("mlp3", "state", 24)])
def test_head_trainable_counts_are_exact(kind, hi, width):
    hidden = 0 if kind == "linear" else 11
    m = headed("rc", dict(head=kind, head_hidden=hidden, head_input=hi))
    v = check_frontier(m)
    assert v.ok and v.trainable_params == head_params(kind, width, hidden, V)
    assert m.head_width == width
    # the widest head under the frontier budget at N = 1000: fits, one more unit does not
    h = widest_hidden(kind if kind != "linear" else "mlp", 1000 + V, 59, FRONTIER_BUDGET)
    k = kind if kind != "linear" else "mlp"
    assert head_params(k, 1000 + V, h, 59) <= FRONTIER_BUDGET < head_params(k, 1000 + V, h + 1, 59)


def test_mlp2_head_and_head_dropout():
    """mlp2 stacks two GELU layers of width H; head dropout drops hidden units while training only (the
    same seed, the same mask), and a linear head has no hidden units to drop."""
    m = headed("rc", dict(head="mlp2", head_hidden=6, head_dropout=0.5))
    h, u = m.head, torch.randn(5, 24)
    gelu = torch.nn.functional.gelu
    h.eval()
    torch.testing.assert_close(h(u), gelu(gelu(u @ h.fc.weight.T + h.fc.bias) @ h.fc2.weight.T + h.fc2.bias)
                               @ h.out.weight.T + h.out.bias)
    h.train()
    torch.manual_seed(3)
    a = h(u)
    torch.manual_seed(3)
    assert torch.equal(a, h(u)) and not torch.allclose(a, h.eval()(u))
    with pytest.raises(ReslmError, match="head_dropout"):
        headed("rc", dict(head_dropout=0.1))
    with pytest.raises(ReslmError, match="head_dropout"):
        headed("rc", dict(head="mlp", head_hidden=4, head_dropout=1.0))


def test_mlp3_head_and_head_input_dropout():
    """mlp3 stacks three GELU layers (its count by formula is the model's); head input dropout drops the
    state's channels while training only, and the linear head keeps the paper's form."""
    m = headed("rc", dict(head="mlp3", head_hidden=6, head_input_dropout=0.5))
    h, u = m.head, torch.randn(5, 24)
    gelu = torch.nn.functional.gelu
    layer = lambda x, fc: gelu(x @ fc.weight.T + fc.bias)  # noqa: E731
    h.eval()
    torch.testing.assert_close(h(u), layer(layer(layer(u, h.fc), h.fc2), h.fc3) @ h.out.weight.T + h.out.bias)
    h.train()
    torch.manual_seed(3)
    a = h(u)
    torch.manual_seed(3)
    assert torch.equal(a, h(u)) and not torch.allclose(a, h.eval()(u))
    torch.manual_seed(3)
    dropped = torch.nn.functional.dropout(u, 0.5, True)          # the same mask on the inputs, nothing else
    torch.testing.assert_close(a, h.eval()(dropped))
    with pytest.raises(ReslmError, match="head_input_dropout"):
        headed("rc", dict(head_input_dropout=0.1))
    with pytest.raises(ReslmError, match="head_input_dropout"):
        headed("rc", dict(head="glu", head_hidden=4, head_input_dropout=-0.1))


def test_glu_and_mlp_heads_compute_what_they_say():
    m = headed("rc", dict(head="glu", head_hidden=7))
    u = torch.randn(5, 24)
    h = m.head
    a, b = (u @ h.fc.weight.T + h.fc.bias).split(7, dim=-1)
    torch.testing.assert_close(h(u), (torch.nn.functional.silu(a) * b) @ h.out.weight.T + h.out.bias)


@pytest.mark.parametrize("family,over", HEADED)
def test_head_loss_at_init_is_near_ln_v_and_a_tiny_batch_overfits(family, over):
    m = headed(family, over)
    g = torch.Generator().manual_seed(0)
    idx, y = torch.randint(0, V, (16, 8), generator=g), torch.randint(0, V, (16,), generator=g)
    _, loss = m(idx, y)
    assert abs(loss.item() - torch.log(torch.tensor(float(V))).item()) < 0.5
    opt = torch.optim.Adam([p for p in m.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(300):
        opt.zero_grad()
        _, loss = m(idx, y)
        loss.backward()
        opt.step()
    assert loss.item() < 0.05


@pytest.mark.parametrize("family,over", HEADED)
def test_head_step_and_window_forward_match_the_features(family, over):
    """step() walks the stream features (with the current character where head_input asks), and
    forward() on a window equals the window-mode features of the text."""
    m = headed(family, over, context_mode="stream", streams=1).eval()
    tokens = torch.randint(0, V, (40,), generator=torch.Generator().manual_seed(4))
    feats = m.features(tokens)
    state = m.init_state(1)
    for t in range(39):
        logits, state = m.step(tokens[t:t + 1], state)
        if t >= 7:
            ref, _ = m.forward_features(feats.batch(torch.tensor([t - 7])))
            torch.testing.assert_close(logits, ref[:, 0], rtol=1e-5, atol=1e-5)
    w = headed(family, over, context_mode="window").eval()
    feats = w.features(tokens)
    index = torch.tensor([0, 9, 31])
    a, _ = w.forward_features(feats.batch(index))
    b, _ = w(torch.stack([tokens[i:i + 8] for i in index]))
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_head_bad_configs(chars):
    import reslm.train as tt
    for over, msg in [(dict(head="mlp"), "head_hidden >= 1"), (dict(head_hidden=4), "linear head has none"),
                      (dict(head="conv", head_hidden=4), "head must be one of"),
                      (dict(head_input="state+past"), "head_input must be one of")]:
        with pytest.raises(ReslmError, match=msg):
            make_config("rc", size=10, **over)
    with pytest.raises(ReslmError, match="linear head on the state alone"):
        tt.make_run_config("rc", dict(size=20, head="mlp", head_hidden=4), dict(optimizer="ridge"), chars)


def test_headed_run_with_cached_states_resumes_bitwise(chars, tmp_path, monkeypatch):
    import reslm.train as tt
    model = dict(size=24, streams=8, head="glu", head_hidden=8, head_input="state+onehot")
    full = tt.create_run(tmp_path / "full", "rc", model, CHAR_TRAIN, chars)
    s = tt.train(full, progress=False)
    assert s["frontier"] and s["trainable_params"] == head_params("glu", 24 + chars.vocab_size, 8, chars.vocab_size)
    cut = tt.create_run(tmp_path / "cut", "rc", model, CHAR_TRAIN, chars)
    tt.train(cut, progress=False, stop_at=5, cache_states=True)
    assert any((cut / "states").glob("*.pt"))
    real_load, hits = rs.StateCache.load, []

    def load(self, name, dtype):          # the resumed run reads the cached (state, char id) features back
        feats = real_load(self, name, dtype)
        hits.append(feats is not None)
        return feats

    monkeypatch.setattr(rs.StateCache, "load", load)
    tt.train(cut, progress=False, cache_states=True)
    assert any(hits)
    a = torch.load(full / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(cut / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


# --- EMA of the weights -----------------------------------------------------------------------------
def test_ema_update_follows_the_formula_and_applied_restores():
    from reslm.train.ema import EMA
    lin = nn.Linear(3, 2)
    ema = EMA(lin, 0.9)
    start = lin.weight.detach().clone()
    with torch.no_grad():
        lin.weight.add_(1.0)
    ema.update(1)                                   # d_1 = min(0.9, 2 / 11)
    d = 2 / 11
    torch.testing.assert_close(ema.shadow[0], d * start + (1 - d) * lin.weight.detach())
    trained = lin.weight.detach().clone()
    with ema.applied():
        assert torch.equal(lin.weight, ema.shadow[0])
    assert torch.equal(lin.weight, trained)
    with pytest.raises(ReslmError):
        EMA(lin, 1.0)


@pytest.mark.parametrize("family,model", [("rc", dict(size=24, streams=8, head="mlp", head_hidden=8)),
                                          ("tf", dict(ff_dim=16, n_heads=2, n_layers=1))])
def test_ema_run_evaluates_the_shadow_and_resumes_bitwise(chars, tmp_path, monkeypatch, family, model):
    import reslm.train as tt
    from reslm.models.load import load_run
    from reslm.models.base import estimate_loss, feature_batches
    from reslm.run import read_metrics
    train = {**CHAR_TRAIN, "ema": 0.9}
    full = tt.create_run(tmp_path / "full", family, model, train, chars)
    summary = tt.train(full, progress=False)
    ck = torch.load(full / "checkpoint.pt", weights_only=True)
    assert set(ck) >= {"model", "raw"} and any(not torch.equal(ck["model"][k], ck["raw"][k]) for k in ck["raw"])
    # the logged test loss is the shadow's: the checkpoint's "model", which eval and generate load
    m, _, cfg = load_run(full, "cpu")
    src = rb.CharShards(m, tt.loop.open_dataset(cfg["data"]), tt.TrainConfig.of_run(cfg), torch.device("cpu"), None, False)
    assert src.evaluate(m, "fp32")["test_loss"] == pytest.approx(summary["final_test_loss"], abs=1e-7)
    # killed mid shard-epoch after a timed checkpoint and at an evaluation: the same run, bitwise
    real_save, saves = tt.loop.save_checkpoint, []

    def save_then_die(run_dir, state):
        real_save(run_dir, state)
        saves.append(state)
        if len(saves) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(tt.loop, "save_checkpoint", save_then_die)
    cut = tt.create_run(tmp_path / "cut", family, model, train, chars)
    with pytest.raises(KeyboardInterrupt):
        tt.train(cut, progress=False, checkpoint_seconds=0)
    monkeypatch.setattr(tt.loop, "save_checkpoint", real_save)
    tt.train(cut, progress=False, stop_at=6)
    tt.train(cut, progress=False)
    timing = TIMING
    key = lambda rows: [tuple((k, v) for k, v in r.items() if k not in timing) for r in rows if r["kind"] != "states"]
    assert key(read_metrics(full)) == key(read_metrics(cut))
    b = torch.load(cut / "checkpoint.pt", weights_only=True)
    for part in ("model", "raw"):
        assert all(torch.equal(ck[part][k], b[part][k]) for k in ck[part])


def test_ema_bad_values(chars):
    import reslm.train as tt
    for over, msg in [(dict(ema=1.0), "ema must be in"), (dict(ema=-0.1), "ema must be in"),
                      (dict(ema=0.9, optimizer="ridge"), "ridge solves")]:
        with pytest.raises(ReslmError, match=msg):
            tt.train_config("rc", **over)


# --- the ceilings -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name,count", [("rnn-gru-32-200", 154_147), ("rnn-lstm-32-173", 155_398),
                                        ("tf-e64-144-4-4", 149_755)])
def test_ceiling_presets_fit_the_budget_and_are_not_reservoirs(name, count):
    from reslm.models.rnn import rnn_params
    row = next(r for r in preset_table() if r["name"] == name)
    assert row["trainable_params"] == count <= FRONTIER_BUDGET and row["paper_trainable_params"] is None
    assert not row["frontier"]
    c = row["config"]
    if row["family"] == "rnn":
        assert count == rnn_params(c["cell"], 59, c["embed_dim"], c["hidden"])


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_rnn_reads_the_window_from_a_zero_state_and_overfits(cell):
    m = build_model("rnn", cell=cell, embed_dim=8, hidden=16, vocab_size=V, context=8)
    idx = torch.randint(0, V, (16, 8), generator=torch.Generator().manual_seed(0))
    y = torch.randint(0, V, (16,), generator=torch.Generator().manual_seed(1))
    ref = m.head(m.rnn(m.embed(idx), None)[0][:, -1])             # torch's own zero initial state
    torch.testing.assert_close(m(idx)[0][:, 0], ref)
    assert abs(m(idx, y)[1].item() - torch.log(torch.tensor(float(V))).item()) < 0.3
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    for _ in range(200):
        opt.zero_grad()
        loss = m(idx, y)[1]
        loss.backward()
        opt.step()
    assert loss.item() < 0.05
    with pytest.raises(ReslmError, match="cell must be"):
        make_config("rnn", cell="rnn")


def test_rnn_trains_resumes_and_generates_through_the_cli(chars, tmp_path, capsys):
    import reslm.train as tt
    from reslm.run import read_metrics
    model = dict(embed_dim=8, hidden=16)
    full = tt.create_run(tmp_path / "full", "rnn", model, {**CHAR_TRAIN, "ema": 0.5}, chars)
    s = tt.train(full, progress=False)
    assert s["finished"] and not s["frontier"] and s["final_test_loss"] < torch.log(torch.tensor(59.0)).item()
    cut = tt.create_run(tmp_path / "cut", "rnn", model, {**CHAR_TRAIN, "ema": 0.5}, chars)
    tt.train(cut, progress=False, stop_at=4)
    tt.train(cut, progress=False)
    timing = TIMING
    key = lambda rows: [tuple((k, v) for k, v in r.items() if k not in timing) for r in rows if r["kind"] != "states"]
    assert key(read_metrics(full)) == key(read_metrics(cut))
    out = tmp_path / "cli"
    assert main(["train", "--family", "rnn", "--cell", "lstm", "--embed-dim", "8", "--hidden", "12",
                 "--epoch-samples", "64", "--epochs-per-shard", "1", "--batch-size", "32", "--data", str(chars.path),
                 "--out", str(out), "--device", "cpu", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["trainable_params"] > 0
    assert main(["generate", str(out), "--prompt", "to be", "--length", "20"]) == 0
    assert capsys.readouterr().out.startswith("to be")


# --- L-BFGS readout ---------------------------------------------------------------------------------
LBFGS = dict(optimizer="lbfgs", lbfgs_samples=2000, lbfgs_iters=30, device="cpu")


def test_lbfgs_reaches_a_lower_training_ce_than_adam_steps(chars):
    import reslm.train.lbfgs as lb
    import reslm.train as tt
    m = build_model("rc", size=32, streams=8, vocab_size=chars.vocab_size)
    tc = tt.train_config("rc", **LBFGS)
    src = rb.CharShards(m, chars, tc, torch.device("cpu"), None, False, holdout=tc.holdout)
    X, y, Xh, yh, held = lb.gather(src, tc)
    assert len(y) == 2000 and len(yh) == held > 0
    V, D = chars.vocab_size, 32
    W, b = torch.zeros(V, D), torch.zeros(V)
    lb.solve(X, y, W, b, 1e-6, 100)
    lin = nn.Linear(D, V)
    opt = torch.optim.Adam(lin.parameters(), lr=1e-2)
    for _ in range(30):                                    # full-batch Adam steps on the same problem
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(lin(X), y)
        loss.backward()
        opt.step()
    adam = torch.nn.functional.cross_entropy(lin(X), y).item()
    assert lb.ce(X, y, W, b) < adam - 0.05
    # at the optimum the gradient of the penalised objective vanishes (a well-conditioned penalty)
    W, b = torch.zeros(V, D), torch.zeros(V)
    lb.solve(X, y, W, b, 1e-2, 200)
    W.requires_grad_(True)
    obj = torch.nn.functional.cross_entropy(X @ W.T + b, y) + 0.5e-2 * W.pow(2).sum()
    (g,) = torch.autograd.grad(obj, W)
    assert g.abs().max().item() < 1e-3


def test_lbfgs_run_picks_l2_on_the_heldout_slice_and_never_reads_the_test_shard(chars, tmp_path, monkeypatch):
    import reslm.train.lbfgs as lb
    import reslm.train as tt
    from reslm.run import read_metrics
    calls = []
    tokens, evaluate = rb.CharShards.tokens, rb.CharShards.evaluate
    monkeypatch.setattr(rb.CharShards, "tokens", lambda self, shard, part="train": (
        calls.append((shard, part)), tokens(self, shard, part))[1])
    monkeypatch.setattr(rb.CharShards, "evaluate", lambda self, *a, **k: (calls.append("evaluate"), evaluate(self, *a, **k))[1])
    model = dict(size=32, streams=8, head_input="state+onehot")
    out = tt.create_run(tmp_path / "r", "rc", model, LBFGS, chars)
    s = tt.train(out, progress=False)
    assert chars.test_shard not in {c[0] for c in calls[:calls.index("evaluate")]}
    rows = [r for r in read_metrics(out) if r["kind"] == "lbfgs"]
    assert [r["l2"] for r in rows] == list(lb.L2_GRID)
    best = min(rows, key=lambda r: r["heldout_loss"])
    assert s["lbfgs_l2"] == best["l2"] and s["heldout_loss"] == best["heldout_loss"]
    assert s["finished"] and s["steps"] == 1 and s["frontier"] and s["final_test_loss"] < math.log(chars.vocab_size) - 1
    again = tt.train(tt.create_run(tmp_path / "again", "rc", model, LBFGS, chars), progress=False)
    assert again["final_test_loss"] == s["final_test_loss"]                    # same seed, same result
    assert main(["generate", str(out), "--prompt", "to be", "--length", "10"]) == 0


def test_lbfgs_bad_configs(chars, tmp_path):
    import reslm.train as tt
    with pytest.raises(ReslmError, match="rc family"):
        tt.make_run_config("aerc", dict(size=20, hidden=4), LBFGS, chars)
    with pytest.raises(ReslmError, match="linear head"):
        tt.make_run_config("rc", dict(size=20, head="mlp", head_hidden=4), LBFGS, chars)
    with pytest.raises(ReslmError, match="lbfgs_samples"):
        tt.train_config("rc", **{**LBFGS, "lbfgs_iters": 0})
    assert main(["train", "--family", "rc", "--optimizer", "lbfgs", "--lbfgs-l2", "-1", "--data",
                 str(chars.path), "--out", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()


def test_a_shards_states_are_freed_before_the_next_shards_are_computed(chars):
    """One training shard's states at a time: at a new shard the sampler holds no reference to the last
    one's (they would double the memory of the largest states at every shard's start)."""
    import gc
    import weakref
    import reslm.train as tt
    m = build_model("rc", size=32, streams=8, vocab_size=chars.vocab_size)
    tc = tt.train_config("rc", device="cpu", batch_size=256, epochs_per_shard=1, eval_samples=512)
    src = rb.CharShards(m, chars, tc, torch.device("cpu"), None, False)
    compute, held = src._compute, []

    def tracked(shard, cycle, part="train"):
        gc.collect()
        assert part != "train" or all(r() is None for r in held), "the previous shard's states are still held"
        feats = compute(shard, cycle, part)
        if part == "train":
            held.append(weakref.ref(feats))
        return feats

    src._compute = tracked
    for step in range(src.total):
        src.batches(step)
    assert len(held) == len(chars.train_shards) > 1


def test_a_training_claims_its_states_memory_while_it_runs_and_drops_the_claim_after(chars, tmp_path, monkeypatch):
    """The memory a reservoir run's states take is claimed for other reslm processes to see
    (reslm.core.claims) while it trains, and no longer once it has ended."""
    import os
    import reslm.train as tt
    from reslm.core import claims
    monkeypatch.setattr(claims, "CLAIMS", tmp_path / "claims")
    mine = tmp_path / "claims" / str(os.getpid())
    seen = []
    evaluate = rb.CharShards.evaluate
    monkeypatch.setattr(rb.CharShards, "evaluate", lambda self, *a, **k: (seen.append(mine.exists()),
                                                                          evaluate(self, *a, **k))[1])
    out = tt.create_run(tmp_path / "r", "rc", dict(size=16, streams=8), CHAR_TRAIN, chars)
    tt.train(out, progress=False)
    assert seen and all(seen) and not mine.exists()


def test_a_finished_training_leaves_no_states_behind_in_its_process(chars, tmp_path, monkeypatch):
    """Runs trained one after another in one process (`frontier run --jobs 1`, `reproduce`, a search)
    do not keep an earlier run's states: its sampler is gone once train() returns."""
    import weakref
    import reslm.train as tt
    made = []
    init = rb.CharShards.__init__

    def tracked(self, *a, **k):
        init(self, *a, **k)
        made.append(weakref.ref(self))

    monkeypatch.setattr(rb.CharShards, "__init__", tracked)
    out = tt.create_run(tmp_path / "r", "rc", dict(size=16, streams=8), CHAR_TRAIN, chars)
    tt.train(out, progress=False)
    assert made and all(r() is None for r in made)
