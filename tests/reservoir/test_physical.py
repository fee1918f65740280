"""reslm.reservoir.physical: readout-side constraints (gain mismatch -> state noise -> ADC) in the
reservoir models' features, forward() and step(), in training and in `reslm eval` (overrides, grids)."""
import json

import pytest
import torch
import torch.nn.functional as F

import reslm.train as tt
from reslm.cli import main
from reslm.core.errors import ReslmError
from reslm.scoring.evaluate import EVAL_FILE, evaluate_run
from reslm.scoring.physical import physical_grid, run_physical
from reslm.models import build_model
from reslm.reservoir import RESERVOIRS, shard_states
from reslm.reservoir.nvar import nvar_size
from reslm.reservoir.physical import (BLOCK, OTHER_KEY, TEST_KEY, Physical, PhysicalConfig, quantize,
                                      train_key)
from reslm.core.files import write_json
from reslm.run import read_config

V = 11
ON = dict(gain_mismatch=0.1, state_noise=0.05, adc_bits=6)
TRAIN = dict(batch_size=64, epochs_per_shard=1, epoch_samples=64, lr=3e-3, device="cpu", precision="fp32")


def tiny(family="rc", **kw):
    base = dict(vocab_size=V, embed_dim=4, context=8, size=24, streams=4, warmup=8,
                **(dict(hidden=4) if family == "aerc" else {}))
    return build_model(family, **{**base, **kw}).eval()


def text(n=200, seed=0):
    return torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(seed))


# --- off is today's model, bit for bit ------------------------------------------------------------
@pytest.mark.parametrize("mode", ["window", "stream"])
@pytest.mark.parametrize("family", ["rc", "aerc"])
def test_off_is_bitwise_the_unconstrained_model(family, mode):
    m = tiny(family, context_mode=mode)
    tokens = text()
    ref = shard_states(m.reservoir, m.embed, tokens, mode=mode, context=8, streams=4, warmup=8)
    ref = F.layer_norm(ref, (ref.shape[-1],))                  # what features() computed before physical.py
    assert torch.equal(m.features(tokens).inputs, ref)
    assert torch.equal(m.features(tokens, noise_key=train_key(0, 1), offset=7).inputs, ref)
    s = torch.randn(3, 24)
    assert m.physical(s, TEST_KEY) is s and m.physical.online(s) is s
    assert not any(k.startswith("physical") for k in m.state_dict())   # checkpoints unchanged
    assert not m.physical.config.active and m.physical.config.describe() == "none"


# --- each constraint ------------------------------------------------------------------------------
@pytest.mark.parametrize("bits", [1, 3, 6])
def test_adc_levels_and_error(bits):
    x = torch.rand(4000, 5, generator=torch.Generator().manual_seed(bits)) * 2.4 - 1.2   # some out of range
    q = quantize(x.clone(), bits, 1.0)
    step = 2.0 / 2 ** bits
    for u in range(5):
        assert q[:, u].unique().numel() <= 2 ** bits
    inside = x.abs() <= 1
    assert (q - x)[inside].abs().max() <= step / 2 + 1e-6
    assert torch.allclose(q[x > 1], torch.tensor(1 - step / 2)) and torch.allclose(q[x < -1], torch.tensor(step / 2 - 1))
    levels = (q + 1 - step / 2) / step                              # integer level indices 0 .. 2^b - 1
    assert torch.allclose(levels, levels.round(), atol=1e-4) and levels.min() >= -1e-4


def test_adc_in_the_features_takes_at_most_2_to_the_b_values_per_unit():
    m = tiny(adc_bits=3, adc_range=0.5, state_norm=False)     # no normalisation: what the ADC put out
    feats = m.features(text(400)).inputs
    assert max(feats[:, u].unique().numel() for u in range(24)) <= 8
    assert feats.abs().max() <= 0.5


def test_gain_mismatch_is_fixed_by_the_seed():
    a = tiny(gain_mismatch=0.2)
    g = a.physical.gain
    assert g.shape == (24,) and torch.equal(g, tiny(gain_mismatch=0.2).physical.gain)
    assert not torch.equal(g, tiny(gain_mismatch=0.2, seed=1).physical.gain)
    # the same pattern at another spread: (gain - 1) scales with g
    torch.testing.assert_close(tiny(gain_mismatch=0.1).physical.gain - 1, (g - 1) / 2)
    s = torch.randn(5, 24)
    torch.testing.assert_close(a.physical(s, OTHER_KEY), s * g)
    assert "physical.gain" not in a.state_dict()                # a function of (seed, g), not saved
    wide = Physical(PhysicalConfig(gain_mismatch=0.2), 4000, seed=0).gain
    assert abs(wide.mean().item() - 1) < 0.02 and abs(wide.std().item() - 0.2) < 0.01


def test_noise_streams_train_and_test_independent_and_reproducible():
    m, tokens = tiny(state_noise=0.1, state_norm=False), text()
    clean = tiny(state_norm=False).features(tokens).inputs
    tr = m.features(tokens, noise_key=train_key(0, 0)).inputs
    te = m.features(tokens, noise_key=TEST_KEY).inputs
    assert torch.equal(tr, tiny(state_noise=0.1, state_norm=False).features(tokens, noise_key=train_key(0, 0)).inputs)
    assert not torch.allclose(tr, te)
    assert not torch.allclose(tr, m.features(tokens, noise_key=train_key(1, 0)).inputs)   # next cycle: fresh
    assert not torch.allclose(tr, m.features(tokens, noise_key=train_key(0, 1)).inputs)   # another shard
    noise = (te - clean) / 0.1
    assert abs(noise.mean().item()) < 0.05 and abs(noise.std().item() - 1) < 0.05
    assert abs(torch.corrcoef(torch.stack([(tr - clean).flatten(), noise.flatten()]))[0, 1].item()) < 0.05
    assert not torch.equal(tiny(state_noise=0.1, seed=1, state_norm=False).features(tokens, noise_key=TEST_KEY).inputs, te)


def test_noise_depends_on_the_position_not_on_the_pieces():
    """Row p of a stream is the same whether the text is scored whole or in pieces (eval vs training)."""
    p = Physical(PhysicalConfig(state_noise=1.0), 6, seed=0)
    whole = p.noise(TEST_KEY, 0, 3 * BLOCK)
    for start, rows in ((0, 5), (BLOCK - 3, 7), (2 * BLOCK + 1, BLOCK - 1)):
        assert torch.equal(p.noise(TEST_KEY, start, rows), whole[start:start + rows])
    m, tokens = tiny(state_noise=0.2, context_mode="window"), text(300)
    full = m.features(tokens, noise_key=TEST_KEY).inputs
    part = m.features(tokens[100:180], noise_key=TEST_KEY, offset=100).inputs
    torch.testing.assert_close(part, full[100:172], rtol=1e-5, atol=1e-5)


# --- forward and step ---------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["rc", "aerc"])
def test_step_equals_forward_with_constraints(family):
    """step() after init_state measures with the noise forward() draws on the same window (both index
    the ONLINE stream by reservoir steps); the state carried on stays exact."""
    idx = text(3 * 8).view(3, 8)
    m = tiny(family, context_mode="window", gain_mismatch=0.1, state_noise=0.05)
    a, _ = m(idx)
    state = m.init_state(3)
    for t in range(8):
        b, state = m.step(idx[:, t], state)
    torch.testing.assert_close(b, a[:, 0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state, tiny(family)
                               .reservoir(m.embed(idx))[1], rtol=1e-5, atol=1e-5)   # no noise fed back
    again, _ = m(idx)                                           # the clock moved on: fresh noise
    assert not torch.allclose(again, a)
    torch.testing.assert_close(tiny(family, context_mode="window", gain_mismatch=0.1, state_noise=0.05)(idx)[0], a)


@pytest.mark.parametrize("family", ["rc", "aerc"])
def test_step_walks_the_stream_features_without_noise(family):
    """With gain mismatch (and no noise) generation reads the states the stream-mode features hold."""
    m = tiny(family, context_mode="stream", streams=1, gain_mismatch=0.2)
    tokens = text(40, seed=4)
    feats = m.features(tokens)
    state = m.init_state(1)
    for t in range(39):
        logits, state = m.step(tokens[t:t + 1], state)
        if t >= 7:
            ref, _ = m.forward_features(feats.batch(torch.tensor([t - 7])))
            torch.testing.assert_close(logits, ref[:, 0], rtol=1e-5, atol=1e-5)


SUBSTRATES = [("esn", 24, "", 1.0), ("leaky", 24, "", 1.0), ("deep", 24, "layers=2", 1.0),
              ("parallel", 24, "leaks=1/0.3", 1.0),
              ("nvar", nvar_size(2, 4), "k=2", 4.0), ("diagonal", 24, "", 4.0), ("delay", 24, "eta=0.5", 2.0),
              ("gru", 24, "", 1.0), ("poly", 24, "", 1.0), ("es2n", 24, "beta=0.2", 1.0), ("legendre", 24, "theta=8", 4.0),
              ("composite", 24, "parts=esn:12+legendre(theta=8)", 4.0)]


def test_the_table_covers_every_substrate():
    # a recording replays a device's file (tests/reservoir/test_recorded.py); its states are measured the same way
    assert {s[0] for s in SUBSTRATES} == set(RESERVOIRS) - {"recorded"}


@pytest.mark.parametrize("mode", ["window", "stream"])
@pytest.mark.parametrize("name,size,options,limit", SUBSTRATES)
def test_every_substrate_and_mode_measures(name, size, options, limit, mode):
    m = tiny("rc", reservoir=name, size=size, reservoir_options=options, context_mode=mode, adc_range=limit,
             **ON)
    tokens = text(60)
    raw = m.states(tokens)
    feats = m.features(tokens, noise_key=TEST_KEY)
    assert feats.inputs.shape == raw.shape and torch.isfinite(feats.inputs).all()
    assert not torch.allclose(feats.inputs, F.layer_norm(raw, (size,)))
    logits, _ = m(tokens[:16].view(2, 8))
    state = m.init_state(2)
    out, state = m.step(tokens[:2], state)
    assert logits.shape == (2, 1, V) and out.shape == (2, V) and torch.isfinite(out).all()


def test_bad_constraints_are_one_line_errors():
    for bad in (dict(state_noise=-0.1), dict(adc_bits=17), dict(adc_bits=-1), dict(adc_range=0.0),
                dict(gain_mismatch=float("nan"))):
        with pytest.raises(ReslmError, match=next(iter(bad))):
            tiny(**bad)
    assert PhysicalConfig(**ON).tag() == "noise0.05-adc6-gain0.1"
    assert PhysicalConfig(adc_bits=4, adc_range=2.0).describe() == "ADC 4 bits on [-2, 2]"


# --- training and reslm eval ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def noisy_run(chars, tmp_path_factory):
    """A tiny rc run trained under every constraint (window mode: eval's chunks equal training's)."""
    out = tmp_path_factory.mktemp("phys") / "rc"
    tt.create_run(out, "rc", dict(size=32, context_mode="window", **ON), TRAIN, chars)
    return out, tt.train(out, progress=False)


def test_eval_reproduces_trainings_test_ce_under_noise(noisy_run):
    out, summary = noisy_run
    ev = evaluate_run(out, length=20, score=0)
    assert ev["test_loss"] == pytest.approx(summary["final_test_loss"], rel=1e-6)   # the same test noise
    assert ev["physical"] == ev["physical_trained"] == {**ON, "adc_range": 1.0} and ev["physical_overrides"] == {}
    assert json.loads((out / EVAL_FILE).read_text())["physical"]["state_noise"] == 0.05
    assert evaluate_run(out, length=20, score=0, write=False)["sample"] == ev["sample"]   # reproducible


def test_eval_overrides_are_recorded_apart(noisy_run):
    out, _ = noisy_run
    before = (out / EVAL_FILE).read_text() if (out / EVAL_FILE).exists() else None
    ev = evaluate_run(out, length=10, score=300, physical=dict(state_noise=0.5, adc_bits=0))
    name = out / "eval-noise0.5-adc0-gain0.1.json"
    assert json.loads(name.read_text())["physical_overrides"] == dict(state_noise=0.5, adc_bits=0)
    assert ev["physical"]["state_noise"] == 0.5 and ev["physical_trained"]["state_noise"] == 0.05
    assert ((out / EVAL_FILE).read_text() if (out / EVAL_FILE).exists() else None) == before
    with pytest.raises(ReslmError, match="adc_bits"):
        evaluate_run(out, length=10, score=300, physical=dict(adc_bits=40), write=False)


def test_grid_reuses_the_states_and_ce_rises_with_noise(noisy_run):
    out, _ = noisy_run
    trained = evaluate_run(out, length=10, score=500, write=False)["test_loss"]
    g = physical_grid(out, dict(state_noise=[0.05, 0.0, 0.3, 1.0], adc_bits=[6, 0]), score=500)
    rows = {(r["state_noise"], r["adc_bits"]): r["test_loss"] for r in g["rows"]}
    assert len(rows) == 8 and g["score_positions"] == 500
    assert rows[(0.05, 6)] == pytest.approx(trained, rel=1e-6)          # the trained setting is eval's CE
    assert rows[(1.0, 0)] > rows[(0.3, 0)] > rows[(0.0, 0)]               # loose: much noise hurts
    csv_lines = (out / "eval-physical.csv").read_text().splitlines()
    assert csv_lines[0].startswith("gain_mismatch,state_noise,adc_bits,adc_range,test_loss") and len(csv_lines) == 9
    assert json.loads((out / "eval-physical.json").read_text())["rows"] == g["rows"]


def test_cli_eval_flags(noisy_run, capsys):
    out, _ = noisy_run
    assert main(["eval", str(out), "--length", "10", "--score", "200", "--state-noise", "0.2"]) == 0
    assert "readout constraints: gain mismatch 0.1, state noise 0.2, ADC 6 bits on [-1, 1] (trained with: " \
           "gain mismatch 0.1, state noise 0.05, ADC 6 bits on [-1, 1])" in capsys.readouterr().out
    assert (out / "eval-noise0.2-adc6-gain0.1.json").exists()
    assert main(["eval", str(out), "--score", "200", "--state-noise", "0,0.1", "--adc-bits", "4"]) == 0
    printed = capsys.readouterr().out
    assert "state_noise" in printed and len(printed.strip().splitlines()) == 4
    assert main(["eval", str(out), "--state-noise", "x"]) == 2
    assert "--state-noise must be a comma-separated list" in capsys.readouterr().err


def test_constraints_refused_for_a_transformer():
    tf = build_model("tf", vocab_size=V, ff_dim=16, n_heads=2, n_layers=1)
    with pytest.raises(ReslmError, match="apply to reservoir runs"):
        run_physical(tf, dict(family="tf"), dict(state_noise=0.1))
    assert run_physical(tf, dict(family="tf"), {}) == (None, None)         # eval.json then has no physical


def test_a_run_made_before_the_constraints_still_matches(chars, tmp_path):
    """reproduce / sweep continue runs whose config.json predates the constraint fields."""
    out = tt.create_run(tmp_path / "old", "rc", dict(size=16), TRAIN, chars)
    cfg = read_config(out)
    for k in ("gain_mismatch", "state_noise", "adc_bits", "adc_range"):
        del cfg["model"][k]
    write_json(out / "config.json", cfg)
    assert tt.ensure_run(out, "rc", dict(size=16), TRAIN, chars) == "resuming"
    with pytest.raises(ReslmError, match="different model"):
        tt.ensure_run(out, "rc", dict(size=16, state_noise=0.1), TRAIN, chars)
