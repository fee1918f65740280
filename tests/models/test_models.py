"""Invariants of the model contract, for every family (MODELS) and every Table 1 preset."""
import math

import pytest
import torch

from reslm.core.errors import ReslmError
from reslm.models import MODELS, build_model, families, make_config, preset, preset_table
from reslm.models.aerc import AERC, AERCConfig
from reslm.models.base import count_params

TINY = {"rc": dict(size=48), "aerc": dict(size=24, hidden=6), "tf": dict(ff_dim=32, n_heads=2, n_layers=2),
        "rnn": dict(embed_dim=8, hidden=12),
        "laerc": dict(dim=16, n_layers=2, r_mult=2), "gpt": dict(dim=16, n_layers=2, n_heads=2)}
V = 13


def tiny(family, **kw):
    return build_model(family, **{**TINY[family], "vocab_size": V, "context": 8, **kw})


def batch(family, b, seed=0):
    """(idx (b, 8), targets): (b,) for next-token models, (b, 8) for every-position models."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, V, (b, 8), generator=g)
    y = torch.randint(0, V, (b,) if MODELS[family].data == "chars" else (b, 8), generator=g)
    return idx, y


def test_registry_lists_every_family_once():
    assert set(families("chars")) == {"rc", "aerc", "tf", "rnn"} and set(families("tokens")) == {"laerc", "gpt"}
    for name, fam in MODELS.items():
        assert fam.model.family == name and fam.data in ("chars", "tokens")


@pytest.mark.parametrize("family", list(MODELS))
def test_forward_returns_b_t_v(family):
    """One output shape for every family: (B, T, V), T = 1 for next-token-only models."""
    m = tiny(family).eval()
    idx, y = batch(family, 3)
    logits, loss = m(idx, y)
    t = 1 if MODELS[family].data == "chars" else 8
    assert logits.shape == (3, t, V) and loss.shape == ()
    assert m(idx)[1] is None


def test_table1_trainable_counts_exact():
    rows = [r for r in preset_table() if r["paper_trainable_params"] is not None]   # Table 1's, not the ceilings
    assert len(rows) == 15
    for r in rows:
        assert r["trainable_params"] == r["paper_trainable_params"], r["name"]
    rc750 = next(r for r in rows if r["name"] == "rc-750")
    assert rc750["fixed_params"] == 750 * 750 + 750 * 16 + 750 + 59 * 16   # W, W_in, bias, embedding


@pytest.mark.parametrize("family", list(MODELS))
def test_same_seed_same_weights_and_loss(family):
    torch.manual_seed(123)
    a = tiny(family, seed=5)
    torch.manual_seed(456)                      # the global RNG must not matter
    b = tiny(family, seed=5)
    for (na, ta), (nb, tb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert na == nb and torch.equal(ta, tb), na
    idx, y = batch(family, 4)
    a.eval(), b.eval()
    assert torch.equal(a(idx, y)[1], b(idx, y)[1])


@pytest.mark.parametrize("family", list(MODELS))
def test_loss_at_init_is_about_ln_v(family):
    m = tiny(family).eval()
    idx, y = batch(family, 256)
    _, loss = m(idx, y)
    assert abs(loss.item() - math.log(V)) < 0.35


@pytest.mark.parametrize("family", list(MODELS))
def test_tiny_batch_overfits(family):
    torch.manual_seed(0)
    m = tiny(family, **({"dropout": 0.0} if family in ("tf", "gpt") else {}))
    if MODELS[family].data == "chars":
        tokens = torch.randint(0, V, (40,), generator=torch.Generator().manual_seed(2))
        feats = m.features(tokens)
        index = torch.arange(len(feats))
        x, y = feats.batch(index), feats.targets[index]
    else:
        x, y = batch(family, 4, seed=2)
    opt = torch.optim.Adam([p for p in m.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(300):
        _, loss = m.forward_features(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.3


@pytest.mark.parametrize("family", families("chars"))
def test_forward_equals_features_path_in_window_mode(family):
    """forward(window) is forward_features(features): training and inference see the same model."""
    m = tiny(family, **({} if family in ("tf", "rnn") else {"context_mode": "window"})).eval()
    tokens = torch.randint(0, V, (60,), generator=torch.Generator().manual_seed(3))
    feats = m.features(tokens)
    index = torch.tensor([0, 7, 51])
    a, _ = m.forward_features(feats.batch(index))
    b, _ = m(torch.stack([tokens[i:i + 8] for i in index]))
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert torch.equal(feats.targets[index], tokens[index + 8])


@pytest.mark.parametrize("family", ["rc", "aerc"])
def test_step_equals_stream_features(family):
    """Generation's step() walks the same states as the stream-mode features of the text."""
    m = tiny(family, context_mode="stream", streams=1).eval()
    tokens = torch.randint(0, V, (50,), generator=torch.Generator().manual_seed(4))
    feats = m.features(tokens)
    state = m.init_state(1)
    for t in range(49):
        logits, state = m.step(tokens[t:t + 1], state)
        if t >= 7:
            ref, _ = m.forward_features(feats.batch(torch.tensor([t - 7])))
            torch.testing.assert_close(logits, ref[:, 0], rtol=1e-5, atol=1e-5)


def test_aerc_readout_equals_paper_equations():
    m = AERC(AERCConfig(size=30, hidden=5, vocab_size=V))
    h = m.head
    r = torch.randn(7, 30)
    z = torch.relu(h.net1(r))                              # hidden layer of F
    W_att = h.net2(z).view(7, 5, 30)                       # (B, H, N)
    ref = h.out((W_att @ r[:, :, None]).squeeze(-1))       # W_out (W_att r)
    torch.testing.assert_close(h(r), ref, rtol=1e-5, atol=1e-5)


def test_bad_model_configs():
    with pytest.raises(ReslmError):
        make_config("aerc", size=10, hidden=11)            # H > N
    with pytest.raises(ReslmError):
        make_config("rc", spectral_radius=0)
    with pytest.raises(ReslmError):
        make_config("rc", context_mode="sideways")
    with pytest.raises(ReslmError):
        make_config("rc", hidden=3)                         # not an RC field
    with pytest.raises(ReslmError):
        make_config("lstm")
    with pytest.raises(ReslmError):
        preset("rc-751")


def test_fixed_weights_get_no_gradient():
    m = tiny("rc")
    trainable = {n for n, p in m.named_parameters() if p.requires_grad}
    assert trainable == {"head.weight", "head.bias"}
    assert count_params(m)[0] == 48 * V + V


@pytest.mark.parametrize("mode", ["window", "stream"])
@pytest.mark.parametrize("family,head", [("rc", {}), ("rc", dict(head="mlp", head_hidden=5)), ("aerc", {})])
def test_a_readout_projection_reads_a_larger_reservoir_through_fixed_channels(mode, family, head):
    """readout_dim D: the head reads D fixed random projections of the N units (the projection is a
    buffer drawn from the seed, never trained); features, forward and step see the same model, the
    trainable count is the one of a D-unit reservoir's head, and the stored states are (M, D)."""
    m = tiny(family, size=40, readout_dim=12, context_mode=mode, streams=1, **head).eval()
    same_head = tiny(family, size=12, context_mode=mode, streams=1, **head)
    assert m.projection.shape == (40, 12) and not m.projection.requires_grad
    assert count_params(m)[0] == count_params(same_head)[0]
    assert torch.equal(m.projection, tiny(family, size=40, readout_dim=12).projection)   # the seed draws it
    tokens = torch.randint(0, V, (60,), generator=torch.Generator().manual_seed(5))
    feats = m.features(tokens)
    assert feats.inputs.shape == (52, 12)
    raw = m.reservoir(m.embed(tokens[None, :8]))[1]
    torch.testing.assert_close(m.read(raw), raw @ m.projection)
    strided = torch.randn(3, 4, 40).transpose(0, 1)   # (B, k, N) views, as the stream path reads them
    torch.testing.assert_close(m.read(strided), strided @ m.projection)
    index = torch.tensor([0, 9, 51])
    a, _ = m.forward_features(feats.batch(index))
    if mode == "window":
        b, _ = m(torch.stack([tokens[i:i + 8] for i in index]))
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    else:
        state, steps = m.init_state(1), []
        for t in range(59):
            logits, state = m.step(tokens[t:t + 1], state)
            steps.append(logits)
        torch.testing.assert_close(a[:, 0], torch.cat([steps[i + 7] for i in index.tolist()]), rtol=1e-5, atol=1e-5)
    with pytest.raises(ReslmError, match="readout_dim must be >= 0"):
        make_config(family, readout_dim=-1)
    with pytest.raises(ReslmError, match="must not exceed the state it reads"):
        make_config("aerc", size=40, hidden=13, readout_dim=12)


@pytest.mark.parametrize("head,hidden,rank,head_input", [("mlp", 7, 5, "state"), ("mlp2", 6, 3, "state+onehot"),
                                                         ("mlp3", 4, 9, "state"), ("glu", 5, 2, "state+embed")])
def test_a_low_rank_head_reads_the_state_through_a_trainable_r_wide_layer(head, hidden, rank, head_input):
    """head_rank r: a bias-free trainable Linear(D, r) before the mlp/glu head; head_params and
    widest_hidden count it, check_frontier sees the same count, and r = 0 is the plain head bit for bit."""
    from reslm.models.budget import check_frontier
    from reslm.models.heads import head_params, widest_hidden
    m = tiny("rc", head=head, head_hidden=hidden, head_rank=rank, head_input=head_input).eval()
    D = m.head_width
    assert m.head.down.weight.shape == (rank, D) and m.head.down.bias is None
    expected = head_params(head, D, hidden, V, rank=rank)
    assert count_params(m)[0] == expected == sum(p.numel() for p in m.parameters() if p.requires_grad)
    assert check_frontier(m).trainable_params == expected
    idx, _ = batch("rc", 3)
    assert m(idx)[0].shape == (3, 1, V)
    budget = expected + 50
    h = widest_hidden(head, D, V, budget, rank=rank)
    assert head_params(head, D, h, V, rank) <= budget < head_params(head, D, h + 1, V, rank)
    plain = tiny("rc", head=head, head_hidden=hidden, head_input=head_input).eval()
    zero = tiny("rc", head=head, head_hidden=hidden, head_input=head_input, head_rank=0).eval()
    assert plain.state_dict().keys() == zero.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), zero.state_dict().values()))
    assert torch.equal(plain(idx)[0], zero(idx)[0])
    for bad, match in [(dict(head_rank=-1), "head_rank must be"), (dict(head="linear", head_hidden=0, head_rank=2),
                                                                   "linear head"),
                       (dict(head_rank=D), "head rank must be in")]:
        with pytest.raises(ReslmError, match=match):
            tiny("rc", **{**dict(head=head, head_hidden=hidden, head_input=head_input), **bad})
