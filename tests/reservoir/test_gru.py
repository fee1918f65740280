"""The frozen random GRU (reslm/reservoir/gru.py): seeds, step == forward, the gate equations against a
plain loop and torch.nn.GRU, fixed weights (no gradient, no trainable parameter), bounded states, and
an rc model on it that trains (the contract tests of every substrate: tests/reservoir/test_substrates.py)."""
import pytest
import torch

from reslm.core.errors import ReslmError
from reslm.models import build_model
from reslm.models.base import count_params
from reslm.models.budget import check_frontier
from reslm.reservoir import ESN, RESERVOIRS, ESNConfig, FrozenGRU, GRUConfig, spectral_radius

D = 5


def gru(seed=0, **kw):
    return FrozenGRU(GRUConfig(**{**dict(size=24, input_dim=D, seed=seed), **kw}))


def inputs(B=3, T=11, seed=0, dtype=torch.float32):
    return torch.randn(B, T, D, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def test_registered_under_gru():
    assert RESERVOIRS["gru"] == (GRUConfig, FrozenGRU)
    assert FrozenGRU.pure and FrozenGRU.drivable and not FrozenGRU.replays


def test_same_seed_same_states_other_seed_other_states():
    u = inputs()
    assert torch.equal(gru(seed=7)(u)[0], gru(seed=7)(u)[0])
    assert torch.equal(gru(seed=7).w_hh, gru(seed=7).w_hh)
    assert not torch.allclose(gru(seed=7)(u)[0], gru(seed=8)(u)[0])


@pytest.mark.parametrize("kw", [{}, dict(bias_scaling=0.4, update_bias=1.5, gate_scaling=2.0)])
def test_step_by_step_equals_the_whole_sequence(kw):
    res = gru(**kw)
    u = inputs(T=20)
    states, last = res(u)
    s = res.init_state(3)
    for t in range(20):
        s = res.step(u[:, t], s)
        torch.testing.assert_close(s, states[:, t], rtol=0, atol=1e-6)
    torch.testing.assert_close(last, s, rtol=0, atol=1e-6)
    head, mid = res(u[:, :8])                                  # a split run continues from its state
    torch.testing.assert_close(res(u[:, 8:], mid)[0], states[:, 8:], rtol=0, atol=1e-6)


def test_the_gate_equations_and_torch_gru():
    res = gru(bias_scaling=0.3, update_bias=0.5, input_init="normal")
    u = inputs(T=7, dtype=torch.float64)
    states, _ = res(u)
    assert states.dtype == torch.float64                       # dtype "input": u's precision
    N = res.size
    (Wr_i, Wz_i, Wn_i), (Wr, Wz, Wn), (br, bz, bn) = (t.double().split(N) for t in (res.w_ih, res.w_hh, res.b_ih))
    s = torch.zeros(3, N, dtype=torch.float64)
    for t in range(7):
        x = u[:, t]
        r = torch.sigmoid(x @ Wr_i.T + s @ Wr.T + br)
        z = torch.sigmoid(x @ Wz_i.T + s @ Wz.T + bz)
        n = torch.tanh(x @ Wn_i.T + bn + r * (s @ Wn.T))
        s = (1 - z) * n + z * s
        torch.testing.assert_close(states[:, t], s, rtol=0, atol=1e-12)
    ref = torch.nn.GRU(D, N, batch_first=True).double()
    with torch.no_grad():
        for name, buf in (("weight_ih_l0", res.w_ih), ("weight_hh_l0", res.w_hh), ("bias_ih_l0", res.b_ih),
                          ("bias_hh_l0", res.b_hh)):
            getattr(ref, name).copy_(buf)
        torch.testing.assert_close(ref(u)[0], states, rtol=0, atol=1e-12)


def test_the_candidate_is_the_esns_reservoir():
    res = gru(size=40, spectral_radius=0.8, input_scaling=1.5, bias_scaling=0.2, seed=3)
    esn = ESN(ESNConfig(size=40, input_dim=D, spectral_radius=0.8, input_scaling=1.5, bias_scaling=0.2, seed=3))
    torch.testing.assert_close(res.w_hh[80:], esn.W_T.T)
    torch.testing.assert_close(res.w_ih[80:], esn.W_in_T.T)
    torch.testing.assert_close(res.b_ih[80:], esn.bias)
    assert spectral_radius(res.w_hh[80:]) == pytest.approx(0.8, rel=1e-5)
    gates = gru(size=400, gate_scaling=0.5)
    for k in (0, 1):                                           # the gates' recurrent matrices: radius ~ gate_scaling
        assert spectral_radius(gates.w_hh[400 * k:400 * (k + 1)]) == pytest.approx(0.5, rel=0.1)
    assert torch.allclose(gru(update_bias=2.0).b_ih[24:48], gru().b_ih[24:48] + 2.0)   # the update gate only
    assert torch.equal(gru(update_bias=2.0).b_ih[:24], gru().b_ih[:24])


def test_fixed_weights_no_gradient():
    res = gru()
    assert not list(res.parameters()) and {n for n, _ in res.named_buffers()} >= {"w_ih", "w_hh", "b_ih"}
    assert not res(inputs())[0].requires_grad
    u = inputs().requires_grad_()                               # the input alone may ask for one
    res(u)[0].square().sum().backward()
    assert u.grad is not None and u.grad.abs().sum() > 0
    assert all(b.grad is None for b in res.buffers())


def test_trainable_count_does_not_depend_on_the_gru():
    def trainable(**kw):
        with torch.device("meta"):
            m = build_model("rc", vocab_size=11, embed_dim=4, context=6, context_mode="stream", **kw)
        return count_params(m), check_frontier(m)
    (t_gru, fixed_gru), verdict = trainable(size=40, reservoir="gru")
    (t_esn, fixed_esn), _ = trainable(size=40)
    assert t_gru == t_esn and fixed_gru > fixed_esn             # three N x N matrices, all fixed
    assert verdict.ok, verdict.reasons
    small, big = trainable(size=16, reservoir="gru", readout_dim=8), trainable(size=64, reservoir="gru", readout_dim=8)
    assert small[0][0] == big[0][0] and small[0][1] < big[0][1]   # through the projection: size costs nothing trainable


def test_states_are_bounded():
    """In (-1, 1): a convex mix of tanh values and the state before (a tanh rounds to 1 only past the
    dtype's precision, so the strong setting runs in float64)."""
    for kw, dtype in (({}, torch.float32), (dict(input_scaling=2.0, spectral_radius=2.0, gate_scaling=3.0,
                                               bias_scaling=1.0), torch.float64)):
        states, _ = gru(size=64, **kw)(inputs(T=200, dtype=dtype))
        assert states.abs().max() < 1 and states.abs().max() > 0.5


def test_bad_configs_are_one_line_errors():
    for bad, match in [(dict(size=0), "size"), (dict(spectral_radius=0.0), "spectral_radius"),
                       (dict(gate_scaling=-1.0), "gate_scaling"), (dict(update_bias=float("inf")), "update_bias"),
                       (dict(input_init="cauchy"), "input_init"), (dict(dtype="int8"), "dtype"),
                       (dict(seed=-1), "seed")]:
        with pytest.raises(ReslmError, match=match):
            gru(**bad)


def test_shape_only_construction_draws_nothing():
    with torch.device("meta"):
        res = gru(size=3000)
    assert res.w_hh.is_meta and res.w_hh.shape == (9000, 3000)


def test_cli_trains_rc_on_the_gru(chars, tmp_path):
    from reslm.cli import main
    from reslm.run import read_config
    out = tmp_path / "run"
    assert main(["train", "--family", "rc", "--reservoir", "gru", "--reservoir-options", "update_bias=0.5",
                 "--size", "16", "--data", str(chars.path), "--out", str(out), "--epochs-per-shard", "1",
                 "--batch-size", "64", "--no-progress"]) == 0
    cfg = read_config(out)
    assert cfg["model"]["reservoir"] == "gru" and "update_bias=0.5" in str(cfg)
