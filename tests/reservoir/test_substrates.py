"""The substrates beside the ESN (leaky, deep, parallel, nvar, diagonal, delay, gru, poly, es2n, legendre,
composite): the reservoir contract (step == forward, seeds), each one against a plain reference, and their use
by rc / aerc / LAERC and the CLI (the long-memory ones' references: test_long_memory.py)."""
import math

import pytest
import torch

from reslm.core.errors import ReslmError
from reslm.models import build_model
from reslm.models.laerc import LAERC, LAERCConfig
from reslm.models.reservoir_lm import ReservoirLMConfig
from reslm.reservoir import (ESN, RESERVOIRS, DeepESN, DeepESNConfig, DelayConfig, DelayReservoir,
                             DiagonalConfig, DiagonalReservoir, ESNConfig, LeakyESN, LeakyESNConfig, NVAR,
                             NVARConfig, ParallelESN, ParallelESNConfig, PolyESN, PolyESNConfig, shard_states)
from reslm.reservoir.nvar import nvar_size
from reslm.reservoir.options import parse_options

D = 5   # input size of the contract tests
SMALL = {"esn": dict(size=24), "leaky": dict(size=24), "deep": dict(size=25, layers=3),
         "parallel": dict(size=25, leaks="1/0.3/0.05", shares="2/1/1"),
         "nvar": dict(size=nvar_size(2, D), k=2), "diagonal": dict(size=24), "diagonal-scan": dict(size=24, chunk=4),
         "diagonal-nl": dict(size=26, nonlinear=True), "delay": dict(size=70),
         "delay-ikeda": dict(size=30, nonlinearity="ikeda"), "gru": dict(size=24),
         "gru-gated": dict(size=24, bias_scaling=0.5, update_bias=1.0, input_init="normal"),
         "poly": dict(size=24), "poly-all": dict(size=14, products=10, leak_rate=0.5),
         "diagonal-tau": dict(size=24, tau_min=1.0, tau_max=200.0, normalize=True, angle_max=0.5),
         "es2n": dict(size=24, beta=0.2), "es2n-cycle": dict(size=24, beta=0.05, orthogonal="cycle"),
         "es2n-identity": dict(size=24, beta=0.5, orthogonal="identity", bias_scaling=0.3),
         "legendre": dict(size=4 * D, theta=6.0), "legendre-chunk3": dict(size=3 * D, theta=20.0, chunk=3),
         "legendre-raw": dict(size=2 * D, theta=4.0, normalize=False, chunk=1),
         "composite": dict(size=32, parts="esn:10(leak_rate=0.5)+legendre:10(theta=8)+diagonal(tau_min=1;tau_max=50)"),
         "composite-two": dict(size=24, parts="es2n(orthogonal=cycle)+parallel(leaks=1/0.3)")}


def make(name, seed=0, **kw):
    cfg_cls, cls = RESERVOIRS[name.split("-")[0]]
    return cls(cfg_cls(input_dim=D, seed=seed, **{**SMALL[name], **kw}))


def inputs(B=3, T=9, seed=0):
    return torch.randn(B, T, D, generator=torch.Generator().manual_seed(seed))


# --- the contract --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(SMALL))
@pytest.mark.parametrize("start", ["zero", "s0"])
def test_step_equals_forward(name, start):
    res = make(name)
    u = inputs()
    s = res.init_state(3) if start == "zero" else res(inputs(seed=5))[1]   # a reachable state
    states, last = res(u, None if start == "zero" else s)
    assert states.shape == (3, 9, res.size) and last.shape == (3, res.size)
    for t in range(9):
        s = res.step(u[:, t], s)
        torch.testing.assert_close(s, states[:, t], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(last, s, rtol=1e-5, atol=1e-5)
    a, b = res(u[:, :4], None if start == "zero" else res(inputs(seed=5))[1])   # split run == one run
    torch.testing.assert_close(res(u[:, 4:], b)[0], states[:, 4:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", list(SMALL))
def test_seeds(name):
    u = inputs()
    assert torch.equal(make(name, seed=3)(u)[0], make(name, seed=3)(u)[0])
    if name.split("-")[0] not in ("nvar", "legendre"):   # they draw nothing: the seed is only there for the contract
        assert not torch.allclose(make(name, seed=3)(u)[0], make(name, seed=4)(u)[0])


@pytest.mark.parametrize("name", list(SMALL))
def test_gradient_only_when_the_input_asks(name):
    res = make(name)
    assert not any(p.requires_grad for p in res.parameters())
    assert not res(inputs())[0].requires_grad
    u = inputs().requires_grad_()
    res(u)[0].square().sum().backward()
    assert u.grad is not None and u.grad.abs().sum() > 0


# --- references ----------------------------------------------------------------------------------
def test_leaky_with_unit_rates_is_the_esn():
    u = inputs(T=15)
    esn = ESN(ESNConfig(size=30, input_dim=D, seed=2))
    leaky = LeakyESN(LeakyESNConfig(size=30, input_dim=D, seed=2, a_min=1.0, a_max=1.0))
    # step by step against one (T*B, d) input GEMM: equal up to the GEMM's rounding, which on some CPUs
    # (AMD EPYC) depends on the row count
    torch.testing.assert_close(leaky(u)[0], esn(u)[0], rtol=0, atol=1e-6)


def test_leaky_equations_and_rates():
    cfg = LeakyESNConfig(size=200, input_dim=D, seed=1, a_min=0.01, a_max=0.5)
    res = LeakyESN(cfg)
    a = res.leak
    assert 0.01 <= a.min() and a.max() <= 0.5 and a.min() < 0.02 and a.max() > 0.3   # spans the range
    logs = a.log()
    assert abs(logs.mean().item() - (math.log(0.01) + math.log(0.5)) / 2) < 0.3          # log-uniform
    u = inputs(T=6)
    states, _ = res(u)
    W, W_in = res.W_T.T, res.W_in_T.T
    s = torch.zeros(3, 200)
    for t in range(6):
        s = (1 - a) * s + a * torch.tanh(s @ W.T + u[:, t] @ W_in.T)
        torch.testing.assert_close(states[:, t], s, rtol=1e-5, atol=1e-6)
    with pytest.raises(ReslmError, match="a_min"):
        LeakyESN(LeakyESNConfig(a_min=0.5, a_max=0.1))
    with pytest.raises(ReslmError, match="leak_rate"):
        LeakyESN(LeakyESNConfig(leak_rate=0.5))


def test_deep_one_layer_is_the_esn_and_layers_stack():
    u = inputs()
    esn = ESN(ESNConfig(size=30, input_dim=D, seed=2, leak_rate=0.7))
    deep = DeepESN(DeepESNConfig(size=30, input_dim=D, seed=2, leak_rate=0.7, layers=1))
    assert torch.equal(deep(u)[0], esn(u)[0])
    deep = DeepESN(DeepESNConfig(size=31, input_dim=D, seed=2, layers=3))
    assert deep.sizes == [11, 10, 10]
    x, ref = u, []
    for l in range(1, 4):   # each layer an ESN reading the layer below
        x, _ = ESN(deep.config.layer_config(l))(x)
        ref.append(x)
    assert torch.equal(deep(u)[0], torch.cat(ref, -1))
    assert torch.equal(deep.layers[0].W_T, ESN(ESNConfig(size=11, input_dim=D, seed=2)).W_T)


def test_parallel_blocks_are_independent_esns_with_their_own_leak():
    u = inputs()
    esn = ESN(ESNConfig(size=30, input_dim=D, seed=2, leak_rate=0.4))
    one = ParallelESN(ParallelESNConfig(size=30, input_dim=D, seed=2, leaks="0.4"))
    assert torch.equal(one(u)[0], esn(u)[0])                               # one block: the ESN
    res = ParallelESN(ParallelESNConfig(size=31, input_dim=D, seed=2, leaks="1/0.2", shares="2/1"))
    assert res.sizes == [21, 10]
    ref = [ESN(res.config.block_config(k))(u)[0] for k in (1, 2)]          # each block reads u alone
    assert [b.config.leak_rate for b in res.blocks] == [1.0, 0.2]
    assert torch.equal(res(u)[0], torch.cat(ref, -1))
    assert torch.equal(res.blocks[0].W_T, ESN(ESNConfig(size=21, input_dim=D, seed=2)).W_T)
    assert not torch.equal(res.blocks[1].W_T[:10, :10], res.blocks[0].W_T[:10, :10])
    for bad, match in [(dict(leaks="1/0"), "in \\(0, 1\\]"), (dict(leaks="1/x"), "separated by '/'"),
                       (dict(shares="1/inf"), "finite numbers"),
                       (dict(shares="1/2/3"), "one positive number per block"), (dict(leak_rate=0.5), "leak_rate"),
                       (dict(size=1), "empty")]:
        with pytest.raises(ReslmError, match=match):
            ParallelESN(ParallelESNConfig(**{**dict(size=31, input_dim=D, leaks="1/0.2"), **bad}))


def test_parallel_blocks_take_their_own_radius_and_input_scaling():
    u = inputs()
    cfg = dict(size=31, input_dim=D, seed=2, leaks="1/0.2")
    res = ParallelESN(ParallelESNConfig(**cfg, radii="0.5/0.9", scalings="1/3"))
    for k, (block, rho, scale) in enumerate(zip(res.blocks, (0.5, 0.9), (1.0, 3.0)), 1):
        assert abs(torch.linalg.eigvals(block.W_T.double()).abs().max().item() - rho) < 1e-4
        seed = 2 if k == 1 else res.config.block_config(k).seed
        alone = ESN(ESNConfig(size=res.sizes[k - 1], input_dim=D, seed=seed, leak_rate=res.config.block_leaks()[k - 1],
                              spectral_radius=rho, input_scaling=scale))
        assert torch.equal(block.W_T, alone.W_T) and torch.equal(block.W_in_T, alone.W_in_T)
    plain = ParallelESN(ParallelESNConfig(**cfg))                           # empty = the shared values
    same = ParallelESN(ParallelESNConfig(**cfg, radii="0.9/0.9", scalings="2/2"))
    assert torch.equal(plain(u)[0], same(u)[0])
    assert torch.equal(plain(u)[0], torch.cat([ESN(plain.config.block_config(k))(u)[0] for k in (1, 2)], -1))
    for bad in (dict(radii="0.5"), dict(radii="0.5/0"), dict(scalings="1/2/3"), dict(scalings="1/-1")):
        with pytest.raises(ReslmError, match="one positive number per block"):
            ParallelESN(ParallelESNConfig(**cfg, **bad))
    assert parse_options("parallel", ParallelESNConfig, "leaks=1/0.2,radii=0.5/1.2,scalings=1/2") == \
        dict(leaks="1/0.2", radii="0.5/1.2", scalings="1/2")


def test_nvar_equals_plain_construction():
    k, d, T = 3, 2, 7
    res = NVAR(NVARConfig(size=nvar_size(k, d), input_dim=d, k=k, input_scaling=0.5))
    u = torch.randn(2, T, d, generator=torch.Generator().manual_seed(0))
    states, _ = res(u)
    x = (0.5 * u).tolist()
    for b in range(2):
        for t in range(T):
            lin = []
            for j in range(k):                                  # u_t, u_{t-1}, ..., zeros before the start
                lin += x[b][t - j] if t - j >= 0 else [0.0] * d
            quad = [lin[i] * lin[j] for i in range(len(lin)) for j in range(i, len(lin))]
            torch.testing.assert_close(states[b, t], torch.tensor([1.0, *lin, *quad]))
    assert res.size == 1 + 6 + 21
    with pytest.raises(ReslmError, match="set size to 28"):
        NVAR(NVARConfig(size=30, input_dim=d, k=k))


def _diagonal_loop(res, u, dtype):
    lam = torch.polar(res.radius.to(dtype), res.angle.to(dtype))
    v = torch.view_as_complex((u.to(dtype) @ res.B_T.to(dtype)).view(*u.shape[:2], -1, 2))
    h, out = torch.zeros_like(v[:, 0]), []
    for t in range(u.shape[1]):
        h = lam * h + v[:, t]
        out.append(h)
    return torch.view_as_real(torch.stack(out, 1)).flatten(2)


def test_poly_is_the_esn_and_its_monomials():
    esn = ESN(ESNConfig(size=15, input_dim=D, spectral_radius=0.8, leak_rate=0.6, seed=2))
    res = PolyESN(PolyESNConfig(size=40, products=25, input_dim=D, spectral_radius=0.8, leak_rate=0.6, seed=2))
    u = inputs(T=12)
    states, last = res(u)
    x = esn(u)[0]
    torch.testing.assert_close(states[..., :15], x, rtol=0, atol=0)
    i, j = res.pairs
    assert res.pairs.shape == (2, 25) and bool((i <= j).all()) and len(set(zip(i.tolist(), j.tolist()))) == 25
    torch.testing.assert_close(states[..., 15:], x[..., i] * x[..., j], rtol=0, atol=0)
    again = PolyESN(PolyESNConfig(size=40, products=25, input_dim=D, spectral_radius=0.8, leak_rate=0.6, seed=2))
    assert torch.equal(again.pairs, res.pairs)
    full = PolyESN(PolyESNConfig(size=20, products=15, input_dim=D))     # 5 units: every one of the 15 pairs
    assert torch.equal(full.pairs, torch.triu_indices(5, 5))
    assert PolyESN(PolyESNConfig(size=24, input_dim=D)).units == 12     # products 0: half the size
    with torch.device("meta"):                                           # shape-only construction
        assert PolyESN(PolyESNConfig(size=3000, input_dim=D)).pairs.shape == (2, 1500)
    for bad, match in [(dict(size=4, products=4), "leaves 0"), (dict(size=6, products=4), "3 pairs"),
                       (dict(size=24, products=-1), "products"), (dict(size=24, spectral_radius=0.0), "spectral_radius")]:
        with pytest.raises(ReslmError, match=match):
            PolyESN(PolyESNConfig(input_dim=D, **bad))


@pytest.mark.parametrize("chunk", [0, 64, 1000, 7])
def test_diagonal_scan_equals_sequential_loop_long(chunk):
    res = DiagonalReservoir(DiagonalConfig(size=32, input_dim=D, spectral_radius=0.999, r_min=0.9, chunk=chunk))
    u = inputs(B=2, T=1000)
    states, last = res(u)
    assert states.dtype == torch.float32
    exact = _diagonal_loop(res, u, torch.float64)
    scale = exact.abs().max()
    assert scale > 10                                          # a long memory: powers matter
    torch.testing.assert_close(states.double() / scale, exact / scale, rtol=0, atol=1e-5)
    loop32 = _diagonal_loop(res, u, torch.float32)
    torch.testing.assert_close(states / scale, loop32 / scale, rtol=0, atol=1e-4)


def test_diagonal_eigenvalues_and_nonlinear_features():
    res = DiagonalReservoir(DiagonalConfig(size=400, input_dim=D, spectral_radius=0.95, r_min=0.5))
    assert 0.5 <= res.radius.min() and res.radius.max() <= 0.95
    assert 0 <= res.angle.min() and res.angle.max() <= math.pi
    nl = DiagonalReservoir(DiagonalConfig(size=22, input_dim=D, nonlinear=True))
    u = inputs()
    states, _ = nl(u)
    lin = _diagonal_loop(nl, u, torch.float64).float()       # K = 22 // 4 = 5 complex units
    assert lin.shape[-1] == 10
    torch.testing.assert_close(states[..., :10], lin, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(states[..., 10:], torch.tanh(lin @ nl.M_T), rtol=1e-5, atol=1e-5)
    with pytest.raises(ReslmError, match="even"):
        DiagonalReservoir(DiagonalConfig(size=25))


def _delay_loop(res, u):
    c = res.config
    M = res.M_T.T.double()                                     # gamma M
    a, f = c.node_coupling, res.f
    x = [0.0] * c.size
    out = []
    for t in range(u.shape[1]):
        J = (M @ u[0, t].double()).tolist()
        new = []
        for i in range(c.size):                                # node i-1 of node 0: last node, previous step
            prev = new[i - 1] if i else x[-1]
            new.append((1 - a) * prev + a * c.eta * f(torch.tensor(x[i] + J[i], dtype=torch.float64)).item())
        x = new
        out.append(x)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("kw", [dict(size=150), dict(size=40, nonlinearity="ikeda", mask="uniform"),
                                dict(size=130, node_coupling=0.05, p=2.0), dict(size=9, node_coupling=1.0)])
def test_delay_equals_node_loop(kw):
    res = DelayReservoir(DelayConfig(input_dim=D, seed=1, input_scaling=0.7, **kw))
    u = inputs(B=1, T=6)
    torch.testing.assert_close(res(u)[0][0].double(), _delay_loop(res, u), rtol=1e-5, atol=1e-6)
    if res.config.mask == "binary":
        assert set(res.M_T.unique().tolist()) == {-0.7, 0.7} or torch.allclose(res.M_T.abs(), torch.tensor(0.7))


# --- inside the models ---------------------------------------------------------------------------
MODEL_SUBSTRATES = [("leaky", 24, ""), ("deep", 24, "layers=2"), ("parallel", 24, "leaks=1/0.3"), ("nvar", nvar_size(2, 4), "k=2"),
                    ("diagonal", 24, "r_min=0.8"), ("diagonal", 24, "nonlinear=true"), ("delay", 24, "eta=0.5"),
                    ("gru", 24, "update_bias=1"), ("poly", 24, "products=16"),
                    ("diagonal", 24, "tau_min=1,tau_max=64,normalize=true"), ("es2n", 24, "beta=0.3,orthogonal=cycle"),
                    ("legendre", 24, "theta=8"), ("composite", 24, "parts=esn:12(input_init=normal)+legendre(theta=8)")]


@pytest.mark.parametrize("family", ["rc", "aerc"])
@pytest.mark.parametrize("name,size,options", MODEL_SUBSTRATES)
def test_character_families_run_each_substrate(family, name, size, options):
    extra = dict(hidden=4) if family == "aerc" else {}
    m = build_model(family, vocab_size=11, embed_dim=4, context=6, size=size, reservoir=name,
                    reservoir_options=options, context_mode="stream", streams=1, **extra).eval()
    tokens = torch.randint(0, 11, (30,), generator=torch.Generator().manual_seed(0))
    feats = m.features(tokens)                                 # stream mode, one stream
    state = m.init_state(1)
    for t in range(29):                                        # generation walks the same states
        logits, state = m.step(tokens[t:t + 1], state)
        if t >= 5:
            ref, _ = m.forward_features(feats.batch(torch.tensor([t - 5])))
            torch.testing.assert_close(logits, ref[:, 0], rtol=1e-4, atol=1e-4)
    m.config.context_mode = "window"                           # window mode: forward == features path
    feats = m.features(tokens)
    idx = torch.tensor([0, 9, 23])
    a, _ = m.forward_features(feats.batch(idx))
    b, _ = m(torch.stack([tokens[i:i + 6] for i in idx]))
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["leaky", "deep", "parallel", "diagonal", "delay", "gru", "poly", "es2n", "legendre",
                                  "composite"])
def test_laerc_blocks_take_the_substrates(name):
    model = LAERC(LAERCConfig(vocab_size=13, dim=8, n_layers=2, context=8, r_mult=2, reservoir=name)).eval()
    assert all(type(b.reservoir) is RESERVOIRS[name][1] and b.reservoir.size == 16 for b in model.blocks)
    idx = torch.randint(0, 13, (2, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full, _ = model(idx)
        state = model.init_state(2)
        for t in range(6):
            logits, state = model.step(idx[:, t], state)
            torch.testing.assert_close(logits, full[:, t], rtol=1e-4, atol=1e-4)


def test_stream_states_of_a_substrate_match_one_pass():
    res = make("diagonal", spectral_radius=0.5)
    emb = torch.randn(11, D, generator=torch.Generator().manual_seed(0))
    tokens = torch.randint(0, 11, (200,), generator=torch.Generator().manual_seed(1))
    embed = lambda idx: emb[idx]  # noqa: E731
    states = shard_states(res, embed, tokens, mode="stream", context=8, streams=5, warmup=40, chunk_elems=24 * 5 * 7)
    full, _ = res(embed(tokens)[None])
    torch.testing.assert_close(states, full[0, 7:199], atol=1e-5, rtol=1e-4)


# --- options -------------------------------------------------------------------------------------
def test_reservoir_options_are_parsed_with_field_types():
    cfg = ReservoirLMConfig(reservoir="leaky", reservoir_options="a_min=0.02, a_max=0.5", spectral_radius=0.7)
    rc = cfg.reservoir_config()
    assert (rc.a_min, rc.a_max, rc.spectral_radius, rc.input_dim) == (0.02, 0.5, 0.7, cfg.embed_dim)
    rc = ReservoirLMConfig(reservoir="diagonal", reservoir_options="nonlinear=true,chunk=8").reservoir_config()
    assert rc.nonlinear is True and rc.chunk == 8 and rc.size == 750
    rc = ReservoirLMConfig(reservoir="delay", reservoir_options="nonlinearity=ikeda").reservoir_config()
    assert rc.nonlinearity == "ikeda"
    for bad, match in [("a_mni=0.1", "no option 'a_mni'.*a_min, a_max"), ("a_min=low", "a_min='low'"),
                       ("a_min", "key=value"), ("size=10", "own flag"), ("a_min=2", "a_min")]:
        with pytest.raises(ReslmError, match=match):
            ReservoirLMConfig(reservoir="leaky", reservoir_options=bad).validate()
    with pytest.raises(ReslmError, match="true or false|valid bool"):
        ReservoirLMConfig(reservoir="diagonal", reservoir_options="nonlinear=maybe").validate()


def test_cli_trains_rc_on_a_substrate_with_options(chars, tmp_path):
    from reslm.cli import main
    from reslm.run import read_config
    out = tmp_path / "run"
    assert main(["train", "--family", "rc", "--reservoir", "leaky", "--reservoir-options", "a_min=0.02",
                 "--size", "16", "--data", str(chars.path), "--out", str(out), "--epochs-per-shard", "1",
                 "--batch-size", "64", "--no-progress"]) == 0
    assert "a_min=0.02" in str(read_config(out))
