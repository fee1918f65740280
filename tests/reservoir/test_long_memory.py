"""The long-memory substrates (es2n, legendre, diagonal timescales, composite) against plain references,
and Jaeger's memory capacity (reslm.reservoir.capacity). Their reservoir contract (step == forward, seeds,
gradients, models) is test_substrates.py's, parametrised over every substrate."""
import math

import pytest
import torch

from reslm.core.errors import ReslmError
from reslm.models import build_model
from reslm.models.reservoir_lm import ReservoirLMConfig
from reslm.reservoir import (ESN, RESERVOIRS, Composite, CompositeConfig, DiagonalConfig, DiagonalReservoir, ES2N,
                             ES2NConfig, ESNConfig, LegendreConfig, LegendreMemory, child_seed)
from reslm.reservoir.capacity import capacity_reach, memory_capacity
from reslm.reservoir.composite import PART_KEY, split_parts
from reslm.reservoir.legendre import discretise, legendre_system, stationary_variance
from reslm.reservoir.nvar import nvar_size

D = 5


def inputs(B=3, T=9, seed=0, d=D, dtype=torch.float32):
    return torch.randn(B, T, d, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# --- es2n ----------------------------------------------------------------------------------------
def test_es2n_with_the_identity_is_the_leaky_esn_and_beta_1_is_the_esn():
    u = inputs(T=20)
    kw = dict(size=30, input_dim=D, seed=2, spectral_radius=0.8, bias_scaling=0.2)
    esn = ESN(ESNConfig(**kw, leak_rate=0.3, backend="loop"))
    es2n = ES2N(ES2NConfig(**kw, beta=0.3, orthogonal="identity"))
    torch.testing.assert_close(es2n(u)[0], esn(u)[0], rtol=0, atol=1e-6)
    for kind in ("random", "cycle"):
        one = ES2N(ES2NConfig(**kw, beta=1.0, orthogonal=kind))
        torch.testing.assert_close(one(u)[0], ESN(ESNConfig(**kw, backend="loop"))(u)[0], rtol=0, atol=1e-6)


@pytest.mark.parametrize("kind", ["random", "cycle"])
def test_es2n_equations(kind):
    res = ES2N(ES2NConfig(size=20, input_dim=D, seed=4, beta=0.1, orthogonal=kind, bias_scaling=0.5))
    O = res.orthogonal_matrix().double()
    torch.testing.assert_close(O @ O.T, torch.eye(20, dtype=torch.float64), rtol=0, atol=1e-5)
    if kind == "cycle":
        assert torch.equal(O, torch.roll(torch.eye(20, dtype=torch.float64), 1, dims=0))
    assert torch.equal(res.W_T, ESN(ESNConfig(size=20, input_dim=D, seed=4, bias_scaling=0.5)).W_T)   # the ESN's W
    u = inputs(T=12)
    states, _ = res(u)
    W, W_in, b = res.W_T.T.double(), res.W_in_T.T.double(), res.bias.double()
    x = torch.zeros(3, 20, dtype=torch.float64)
    for t in range(12):
        x = 0.1 * torch.tanh(x @ W.T + u[:, t].double() @ W_in.T + b) + 0.9 * x @ O.T
        torch.testing.assert_close(states[:, t].double(), x, rtol=0, atol=1e-5)


def test_es2n_random_map_is_seeded_and_checked():
    a, b = (ES2N(ES2NConfig(size=16, input_dim=D, seed=s)) for s in (1, 1))
    assert torch.equal(a.WO_T, b.WO_T)
    assert not torch.equal(a.WO_T, ES2N(ES2NConfig(size=16, input_dim=D, seed=2)).WO_T)
    with torch.device("meta"):                                           # shape-only construction
        assert ES2N(ES2NConfig(size=3000, input_dim=D)).WO_T.shape == (3000, 6000)
    for bad, match in [(dict(beta=0.0), "beta"), (dict(beta=1.5), "beta"), (dict(orthogonal="haar"), "orthogonal"),
                       (dict(leak_rate=0.5), "leak_rate")]:
        with pytest.raises(ReslmError, match=match):
            ES2N(ES2NConfig(size=8, input_dim=D, **bad))


# --- legendre ------------------------------------------------------------------------------------
def test_legendre_order_one_is_a_zoh_leaky_integrator():
    res = LegendreMemory(LegendreConfig(size=1, input_dim=1, theta=5.0, normalize=False))
    a = math.exp(-1 / 5)
    torch.testing.assert_close(res.Abar, torch.tensor([[a]], dtype=torch.float64), rtol=1e-12, atol=0)
    torch.testing.assert_close(res.Bbar, torch.tensor([1 - a], dtype=torch.float64), rtol=1e-12, atol=0)
    A, B = legendre_system(3, 1.0)
    assert A.tolist() == [[-1, -1, -1], [3, -3, -3], [-5, 5, -5]] and B.tolist() == [1, -3, 5]


def _legendre_loop(res, u, s0):
    A, Bv = res.Abar.double(), res.Bbar.double()
    B, T, d = u.shape
    m, out = s0.double().view(B, d, -1), []
    for t in range(T):
        m = m @ A.T + u[:, t].double()[..., None] * Bv
        out.append(m.reshape(B, -1))
    return torch.stack(out, 1)


@pytest.mark.parametrize("chunk", [1, 7, 64, 2000])
def test_legendre_fast_path_equals_the_recurrence(chunk):
    res = LegendreMemory(LegendreConfig(size=4 * 12, input_dim=4, theta=300.0, chunk=chunk))
    u = inputs(B=2, T=1000, d=4)
    s0 = res(inputs(B=2, T=50, d=4, seed=3))[1]                          # a reachable state
    states, last = res(u, s0)
    exact = _legendre_loop(res, u, s0)
    scale = exact.abs().max()
    torch.testing.assert_close(states.double() / scale, exact / scale, rtol=0, atol=2e-5)
    torch.testing.assert_close(last, states[:, -1])
    states64, _ = res(u.double(), s0.double())                          # float64 in, float64 out
    assert states64.dtype == torch.float64
    torch.testing.assert_close(states64, exact, rtol=1e-9, atol=1e-9)
    s = s0.double()
    for t0 in range(0, 40, 3):                                           # short calls (stream mode: T < chunk)
        short, s = res(u[:, t0:t0 + 3].double(), s)
        torch.testing.assert_close(short, exact[:, t0:t0 + 3], rtol=1e-9, atol=1e-9)


def test_legendre_memory_holds_the_window_and_each_dimension_apart():
    q, theta = 12, 50.0
    res = LegendreMemory(LegendreConfig(size=q, input_dim=1, theta=theta, normalize=False))
    t = torch.arange(800, dtype=torch.float64)
    u = torch.sin(2 * math.pi * t / 200)[None, :, None]
    m = res(u)[0][0]

    def shifted_legendre(i, r):
        return (-1) ** i * sum(math.comb(i, j) * math.comb(i + j, j) * (-r) ** j for j in range(i + 1))
    for r in (0.0, 0.5, 1.0):                                            # u(t - r theta) from the q coefficients
        lag = int(r * theta)
        decoded = m @ torch.tensor([shifted_legendre(i, r) for i in range(q)], dtype=torch.float64)
        assert (decoded[400:] - u[0, 400 - lag:800 - lag, 0]).abs().max() < 0.03
    res = LegendreMemory(LegendreConfig(size=3 * 4, input_dim=3, theta=10.0))
    u = torch.zeros(1, 20, 3)
    u[0, :, 1] = 1.0                                                     # only the second dimension moves
    s = res(u)[0].view(1, 20, 3, 4)
    assert s[..., 0, :].abs().max() == 0 and s[..., 2, :].abs().max() == 0 and s[..., 1, :].abs().max() > 0.1


@pytest.mark.parametrize("q, theta", [(8, 4.0), (64, 256.0), (256, 64.0)])
def test_the_stationary_variance_stops_doubling_where_the_terms_underflow_with_the_same_bits(q, theta):
    Abar, Bbar = discretise(*legendre_system(q, theta), theta)
    P, Ak = torch.outer(Bbar, Bbar), Abar.clone()
    for _ in range(40):   # every doubling, denormal products included
        P, Ak = P + Ak @ P @ Ak.T, Ak @ Ak
    assert torch.equal(stationary_variance(Abar, Bbar), torch.diagonal(P))


def test_legendre_built_on_the_meta_device_has_the_real_ones_buffers():
    cfg = LegendreConfig(size=3 * 16, input_dim=3, theta=40.0, chunk=8)
    with torch.device("meta"):
        shape = LegendreMemory(cfg)
    real = LegendreMemory(cfg)
    assert [(n, b.shape, b.dtype) for n, b in shape.named_buffers()] == \
        [(n, b.shape, b.dtype) for n, b in real.named_buffers()] and shape.q == real.q == 16


def test_legendre_normalize_is_a_fixed_diagonal_change_of_basis():
    kw = dict(size=2 * 8, input_dim=2, theta=40.0)
    raw, norm = LegendreMemory(LegendreConfig(**kw, normalize=False)), LegendreMemory(LegendreConfig(**kw))
    torch.testing.assert_close(stationary_variance(norm.Abar.double(), norm.Bbar.double()),
                               torch.ones(8, dtype=torch.float64), rtol=1e-4, atol=0)
    u = inputs(B=1, T=300, d=2)
    ratio = norm(u)[0] / raw(u)[0]
    torch.testing.assert_close(ratio, ratio[:, -1:].expand_as(ratio), rtol=1e-3, atol=1e-3)   # constant per unit
    for bad, match in [(dict(size=17, input_dim=2), "multiple of input_dim"), (dict(size=16, input_dim=2, order=4),
                       "set size to 8"), (dict(theta=0.0), "theta"), (dict(chunk=0), "chunk")]:
        with pytest.raises(ReslmError, match=match):
            LegendreMemory(LegendreConfig(**{**kw, **bad}))


# --- diagonal timescales -------------------------------------------------------------------------
def test_diagonal_timescales_are_log_uniform_and_the_default_draw_is_unchanged():
    res = DiagonalReservoir(DiagonalConfig(size=2000, input_dim=D, tau_min=1.0, tau_max=512.0, spectral_radius=1.1111))
    tau = -1 / res.radius.double().log()
    assert 0.99 < tau.min() < 1.2 and 450 < tau.max() < 513
    assert abs(tau.log().mean().item() - math.log(512) / 2) < 0.2         # log-uniform: the mean of log tau
    assert abs((tau < math.sqrt(512)).double().mean().item() - 0.5) < 0.06
    from reslm.reservoir.seeding import generator
    old = DiagonalReservoir(DiagonalConfig(size=20, input_dim=D, r_min=0.3, seed=5))   # the substrate as it was
    g = generator(5, 0)
    r = 0.3 + (0.99 - 0.3) * torch.rand(10, generator=g, dtype=torch.float64)
    assert torch.equal(old.radius, r.float()) and torch.equal(old.angle, (math.pi * torch.rand(10, generator=g,
                                                                                               dtype=torch.float64)).float())


def test_diagonal_normalize_scales_each_unit_by_its_stationary_gain():
    kw = dict(size=20, input_dim=D, tau_min=2.0, tau_max=100.0, seed=3)
    raw, norm = DiagonalReservoir(DiagonalConfig(**kw)), DiagonalReservoir(DiagonalConfig(**kw, normalize=True))
    gain = torch.sqrt(1 - raw.radius.double() ** 2).repeat_interleave(2).float()
    torch.testing.assert_close(norm.B_T, raw.B_T * gain, rtol=1e-6, atol=0)
    long = DiagonalReservoir(DiagonalConfig(size=32, input_dim=D, tau_min=50.0, tau_max=500.0, chunk=64))
    u = inputs(B=2, T=1000)
    loop = DiagonalReservoir(DiagonalConfig(size=32, input_dim=D, tau_min=50.0, tau_max=500.0, chunk=1))
    scale = loop(u)[0].abs().max()
    torch.testing.assert_close(long(u)[0] / scale, loop(u)[0] / scale, rtol=0, atol=1e-5)
    for bad in (dict(tau_min=2.0, tau_max=0.0), dict(tau_min=0.0, tau_max=5.0), dict(tau_min=9.0, tau_max=5.0)):
        with pytest.raises(ReslmError, match="tau_min"):
            DiagonalReservoir(DiagonalConfig(size=8, **bad))
    with pytest.raises(ReslmError, match="angle_max"):
        DiagonalReservoir(DiagonalConfig(size=8, angle_max=7.0))


# --- composite -----------------------------------------------------------------------------------
def test_composite_is_its_parts_side_by_side_each_from_its_own_child_seed():
    cfg = CompositeConfig(size=41, input_dim=D, seed=3, spectral_radius=0.5,
                          parts="esn:12(input_init=normal)+legendre(theta=8)+esn(spectral_radius=1.2)")
    assert split_parts(cfg.parts) == [("esn", 12, "input_init=normal"), ("legendre", None, "theta=8"),
                                      ("esn", None, "spectral_radius=1.2")]
    assert cfg.part_sizes() == [12, 15, 14]                              # the 29 left split evenly, first ones first
    res = Composite(cfg)
    parts = cfg.part_configs()
    assert [p.seed for p in parts] == [child_seed(3, PART_KEY, k) for k in (1, 2, 3)]
    assert parts[0].spectral_radius == 0.5 and parts[0].input_init == "normal"   # the knob, then its own options
    assert parts[2].spectral_radius == 1.2 and parts[1].theta == 8.0
    u = inputs(T=11)
    alone = [RESERVOIRS[n][1](p)(u)[0] for n, p in zip(("esn", "legendre", "esn"), parts)]
    states, last = res(u)
    torch.testing.assert_close(states, torch.cat(alone, -1), rtol=0, atol=0)
    assert states.shape == (3, 11, 41) and torch.equal(last, states[:, -1])


def test_composite_takes_a_users_registered_substrate(monkeypatch):
    class Ring(ESN):
        """A user's substrate: an ESN whose W is a scaled cyclic shift."""
        def __init__(self, cfg):
            super().__init__(cfg)
            self.W_T.copy_(cfg.spectral_radius * torch.roll(torch.eye(cfg.size), 1, dims=0))

    monkeypatch.setitem(RESERVOIRS, "ring-test", (ESNConfig, Ring))
    res = Composite(CompositeConfig(size=20, input_dim=D, parts="ring-test:8(spectral_radius=0.7)+esn"))
    assert isinstance(res.parts[0], Ring) and res.sizes == [8, 12] and res.pure and res.drivable
    m = build_model("rc", vocab_size=11, embed_dim=4, context=6, size=20, reservoir="composite",
                    reservoir_options="parts=ring-test:8+esn(input_init=normal;leak_rate=0.5)",
                    context_mode="stream", streams=1).eval()
    assert isinstance(m.reservoir.parts[0], Ring) and m.reservoir.parts[1].config.leak_rate == 0.5
    tokens = torch.randint(0, 11, (20,), generator=torch.Generator().manual_seed(0))
    state = m.init_state(1)
    for t in range(20):
        _, state = m.step(tokens[t:t + 1], state)
    full, _ = m.reservoir(m.embed(tokens)[None])
    torch.testing.assert_close(state, full[:, -1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("parts,match", [
    ("esn:10+esn:20", "do not add up to size 24"), ("esn:30+esn", "do not add up"), ("nope:12+esn", "unknown reservoir 'nope'"),
    ("composite:12+esn", "cannot be a part"), ("recorded:12+esn", "cannot be a part"), ("esn:12(leak=1)+esn", "part 1.*no option 'leak'"),
    ("esn:12+legendre(theta=x)", "part 2.*theta='x'"), ("esn:12(input_init=normal+esn", "is not NAME"), ("esn:+esn", "is not NAME"),
    ("", "is not NAME"), ("legendre:7+esn", "part 1.*legendre's size"), ("esn:12(seed=3)+esn", "no option 'seed'")])
def test_composite_refuses_bad_parts_in_one_line(parts, match):
    with pytest.raises(ReslmError, match=match) as e:
        Composite(CompositeConfig(size=24, input_dim=4, parts=parts))
    assert "\n" not in str(e.value)


def test_composite_options_pass_through_the_models_parser():
    cfg = ReservoirLMConfig(reservoir="composite", size=2250, spectral_radius=1.1111, input_scaling=1.1111,
                            reservoir_options="parts=esn(input_init=normal)+legendre:768(theta=64;order=48)")
    rc = cfg.reservoir_config()
    assert rc.part_sizes() == [1482, 768]
    esn, leg = rc.part_configs()
    assert (esn.size, esn.spectral_radius, esn.input_scaling, esn.input_init) == (1482, 1.1111, 1.1111, "normal")
    assert (leg.theta, leg.q, leg.input_dim, leg.input_scaling) == (64.0, 48, 16, 1.1111)
    with pytest.raises(ReslmError, match="part 2"):
        ReservoirLMConfig(reservoir="composite", reservoir_options="parts=esn+legendre:7").validate()


# --- memory capacity -----------------------------------------------------------------------------
def test_memory_capacity_of_a_delay_line_and_of_a_nonlinear_reservoir():
    cfg_cls, cls = RESERVOIRS["nvar"]
    nvar = cls(cfg_cls(size=nvar_size(3, 2), input_dim=2, k=3, input_scaling=1.0))   # holds u_t, u_t-1, u_t-2 exactly
    mc = memory_capacity(nvar, max_delay=8, fit=2000, streams=4)
    assert mc["delay0"] > 0.999 and mc["r2"][0] > 0.999 and mc["r2"][1] > 0.999 and max(mc["r2"][2:]) < 0.02
    assert 1.99 < mc["capacity"] < 2.1 and capacity_reach(mc["r2"]) == 2 and mc["fit"] == 2000
    assert memory_capacity(nvar, max_delay=8, fit=2000, streams=4) == mc                 # seeded: the same figure
    kw = dict(size=30, input_dim=D, seed=1, spectral_radius=0.9, input_scaling=0.2)
    esn = memory_capacity(ESN(ESNConfig(**kw)), max_delay=60, fit=3000)
    es2n = memory_capacity(ES2N(ES2NConfig(**kw, beta=0.1)), max_delay=60, fit=3000)
    assert 0 < esn["capacity"] < es2n["capacity"] < 30 + 60 * 0.01                     # MC <= N (plus the estimate's bias)
    lin = memory_capacity(LegendreMemory(LegendreConfig(size=6 * D, input_dim=D, theta=20.0)), max_delay=40, fit=3000,
                          channels=D)
    assert 6 * D * 0.7 < lin["capacity"] < 6 * D + 0.5 and lin["channels"] == D          # d independent signals
    assert max(lin["r2"]) <= D + 1e-9 and capacity_reach([4.5, 2.4, 0.3], 0.5, channels=D) == 1
    for bad, match in [(dict(streams=6), "multiple of 4"), (dict(channels=9), "channels"), (dict(max_delay=0), "max_delay")]:
        with pytest.raises(ReslmError, match=match):
            memory_capacity(esn and ESN(ESNConfig(size=8, input_dim=D)), **bad)
