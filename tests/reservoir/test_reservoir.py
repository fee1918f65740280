"""Reservoir engine invariants: radius, seeding, step == batch, backends and precision, window == from scratch."""
import numpy as np
import pytest
import torch

from reslm.core.errors import ReslmError
from reslm.reservoir import ESN, RESERVOIRS, ESNConfig, child_seed, generator, shard_states, spectral_radius
from reslm.reservoir.base import Reservoir, ReservoirConfig
from reslm.reservoir.matrices import largest_singular_value


@pytest.mark.parametrize("radius,density", [(0.9, 1.0), (1.3, 0.2), (0.5, 0.05)])
def test_spectral_radius_equals_request(radius, density):
    esn = ESN(ESNConfig(size=120, spectral_radius=radius, density=density, seed=4))
    assert spectral_radius(esn.W_T) == pytest.approx(radius, rel=1e-5)


def test_same_seed_same_reservoir_and_states():
    u = torch.randn(3, 20, 16)
    a, b = ESN(ESNConfig(size=64, seed=7)), ESN(ESNConfig(size=64, seed=7))
    assert torch.equal(a.W_T, b.W_T) and torch.equal(a(u)[0], b(u)[0])
    assert not torch.equal(a.W_T, ESN(ESNConfig(size=64, seed=8)).W_T)


@pytest.mark.parametrize("leak,bias,backend,start", [(1.0, 0.0, "loop", "zero"), (0.3, 0.5, "loop", "zero"),
                                                      (0.3, 0.5, "loop", "s0"), (1.0, 0.5, "rnn", "zero"),
                                                      (1.0, 0.5, "rnn", "s0"), (1.0, 0.5, "sigmoid", "s0"),
                                                      (0.3, 0.5, "sigmoid", "zero")])
def test_step_by_step_equals_batched_and_equations(leak, bias, backend, start):
    esn = ESN(ESNConfig(size=40, leak_rate=leak, bias_scaling=bias, backend=backend, seed=1))
    u = torch.randn(5, 12, 16)
    s = esn.init_state(5) if start == "zero" else torch.randn(5, 40).tanh()
    states, last = esn(u, None if start == "zero" else s)
    W, W_in = esn.W_T.T, esn.W_in_T.T
    for t in range(12):
        ref = (1 - leak) * s + leak * torch.tanh(s @ W.T + u[:, t] @ W_in.T + esn.bias)  # paper eq. 1 + leak
        s = esn.step(u[:, t], s)
        torch.testing.assert_close(s, ref, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(states[:, t], s, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(last, s)


@pytest.mark.parametrize("leak,start", [(1.0, "zero"), (0.3, "s0")])
def test_blocked_backend_equals_the_loop(leak, start, monkeypatch):
    """The blocked loop is the same arithmetic per row: equal states, including a ragged last block."""
    import reslm.reservoir.esn as esn_mod
    monkeypatch.setattr(esn_mod, "BLOCK_ROWS", 4)
    cfg = dict(size=48, leak_rate=leak, bias_scaling=0.3, seed=2)
    loop, blocked = ESN(ESNConfig(**cfg, backend="loop")), ESN(ESNConfig(**cfg, backend="blocked"))
    u = torch.randn(10, 7, 16)
    s0 = None if start == "zero" else torch.randn(10, 48).tanh()
    a, b = loop(u, s0), blocked(u, s0)
    torch.testing.assert_close(a[0], b[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(a[1], b[1], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("leak,start", [(1.0, "zero"), (0.3, "s0"), (1.0, "s0")])
def test_sigmoid_backend_equals_the_loop(leak, start):
    """tanh as 2 sigmoid(2z) - 1 (the CPU default): within 2 ulp of 1.0 of torch.tanh's states, over a
    long run too (the echo state property keeps the differences from growing); in float64 and bfloat16
    it is the loop, bit for bit."""
    cfg = dict(size=64, leak_rate=leak, bias_scaling=0.3, seed=2, spectral_radius=0.99)
    loop, fast = ESN(ESNConfig(**cfg, backend="loop")), ESN(ESNConfig(**cfg, backend="sigmoid"))
    assert ESN(ESNConfig(**cfg)).backend(torch.device("cpu")) == "sigmoid"
    u = torch.randn(10, 300, 16) * 2
    s0 = None if start == "zero" else torch.randn(10, 64).tanh()
    (a, a_T), (b, b_T) = loop(u, s0), fast(u, s0)
    assert not torch.equal(a, b)                              # a different formula ...
    assert (a - b).abs().max() < 1e-6                         # ... the same states
    torch.testing.assert_close(b_T, a_T, rtol=0, atol=1e-6)
    for dtype in (torch.float64, torch.bfloat16):             # the "input" dtype: u's
        v, v0 = u.to(dtype), None if s0 is None else s0.to(dtype)
        assert torch.equal(loop(v, v0)[0], fast(v, v0)[0])


def test_bad_reservoir_configs():
    for bad in [dict(spectral_radius=0), dict(spectral_radius=-1), dict(leak_rate=0), dict(density=0),
                dict(size=0), dict(radius_norm="frobenius"), dict(dtype="int8"), dict(backend="cudnn"),
                dict(backend="rnn", leak_rate=0.5), dict(input_init="cauchy"), dict(seed=-1),
                dict(input_scale_by_dim="yes")]:
        with pytest.raises(ReslmError):
            ESN(ESNConfig(**bad))


def _embed(idx):
    return torch.nn.functional.embedding(idx, torch.randn(11, 16, generator=torch.Generator().manual_seed(0)))


def test_window_mode_equals_from_scratch_run():
    esn = ESN(ESNConfig(size=48, seed=2))
    tokens = torch.randint(0, 11, (300,), generator=torch.Generator().manual_seed(0))
    states = shard_states(esn, _embed, tokens, mode="window", context=32, chunk_elems=48 * 32 * 17)
    assert states.shape == (300 - 32, 48)
    for i in [0, 1, 100, 267]:
        _, ref = esn(_embed(tokens[i:i + 32])[None])       # 32 steps from a zero state
        torch.testing.assert_close(states[i], ref[0])


def _repetitive_text(n: int, seed: int) -> torch.Tensor:
    """Tokens of a text that repeats words, as natural text does (random tokens share few prefixes)."""
    g = torch.Generator().manual_seed(seed)
    words = [torch.randint(0, 11, (int(torch.randint(1, 7, (1,), generator=g)),), generator=g) for _ in range(12)]
    return torch.cat([words[int(i)] for i in torch.randint(0, 12, (n,), generator=g)])[:n]


@pytest.mark.parametrize("name", ["esn", "leaky", "deep", "parallel", "nvar", "diagonal", "delay", "gru", "poly", "es2n",
                                  "legendre", "composite"])
@pytest.mark.parametrize("chunk", [64, 10**6])
def test_shared_prefix_window_states_equal_the_plain_ones(name, chunk):
    """Window states computed once per distinct prefix (the default for a pure reservoir) equal every
    window run from zero, for every registered substrate, across chunk boundaries and repeated windows."""
    from reslm.reservoir import RESERVOIRS
    from reslm.reservoir.nvar import nvar_size
    cfg_cls, cls = RESERVOIRS[name]
    d = 4 if name == "nvar" else 16
    size = nvar_size(2, d) if name == "nvar" else 48 if name == "legendre" else 40   # nvar's: its feature count; legendre's: d x order
    res = cls(cfg_cls(size=size, input_dim=d, seed=3))
    emb = torch.randn(11, d, generator=torch.Generator().manual_seed(0))
    tokens = _repetitive_text(700, seed=5)
    kw = dict(mode="window", context=12, chunk_elems=size * chunk)
    assert getattr(res, "pure", False)
    shared = shard_states(res, lambda i: emb[i], tokens, share_prefixes=True, **kw)
    plain = shard_states(res, lambda i: emb[i], tokens, share_prefixes=False, **kw)
    torch.testing.assert_close(shared, plain, rtol=1e-5, atol=1e-6)


def test_shared_prefixes_step_only_the_distinct_prefixes(monkeypatch):
    """The shared path runs one reservoir step per distinct prefix (within a sorted chunk). It is the
    default for a pure reservoir from SHARE_MIN_SIZE on; one not declared pure gets the plain path
    (every window from zero)."""
    import reslm.reservoir.states as states
    monkeypatch.setattr(states, "SHARE_MIN_SIZE", 24)
    esn = ESN(ESNConfig(size=24, seed=1))
    tokens = _repetitive_text(600, seed=2)
    ctx, M = 10, 600 - 10
    windows = {tuple(tokens[i:i + ctx].tolist()) for i in range(M)}
    distinct = sum(len({w[:k] for w in windows}) for k in range(1, ctx + 1))
    rows, forward = [], ESN.forward

    def count(self, u, s0=None, work=None):
        rows.append(u.shape[0] * u.shape[1])
        return forward(self, u, s0, work)

    monkeypatch.setattr(ESN, "forward", count)
    shard_states(esn, _embed, tokens, mode="window", context=ctx, chunk_elems=24 * 10**6)   # one chunk
    assert sum(rows) == distinct < 0.6 * ctx * M
    for size, pure in [(23, True), (24, False)]:   # below the size, or not pure: every window from zero
        rows.clear()
        monkeypatch.setattr(ESN, "pure", pure)
        shard_states(ESN(ESNConfig(size=size, seed=1)), _embed, tokens, mode="window", context=ctx)
        assert sum(rows) == ctx * M


@pytest.mark.parametrize("streams,warmup", [(1, 32), (7, 32), (64, 0), (300, 5)])
def test_stream_mode_matches_sequential_run(streams, warmup):
    """Each stream piece, after its warm-up, carries the same state a single pass over the text does
    (up to the reservoir's fading memory of the zero start state); stream 0 matches exactly."""
    esn = ESN(ESNConfig(size=48, spectral_radius=0.5, seed=3))
    tokens = torch.randint(0, 11, (400,), generator=torch.Generator().manual_seed(1))
    states = shard_states(esn, _embed, tokens, mode="stream", context=16, streams=streams, warmup=warmup,
                          chunk_elems=48 * 64 * 5)
    full, _ = esn(_embed(tokens)[None])
    ref = full[0, 15:399]                                   # state after token i + context - 1
    assert states.shape == ref.shape
    L = -(-399 // min(streams, 399))                        # positions per piece
    n0 = max(0, L - 15)                                     # samples that lie in stream 0
    torch.testing.assert_close(states[:n0], ref[:n0])       # stream 0 is the sequential run itself
    if warmup >= 32:                                        # 0.5^32: fading memory has washed out the start
        torch.testing.assert_close(states, ref, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("mode", ["window", "stream"])
def test_one_work_buffer_for_every_chunk_same_states(mode, monkeypatch):
    """shard_states hands the ESN one buffer for all chunks; the states are bitwise those of
    fresh buffers (a reservoir whose forward takes no `work` gets none)."""
    esn = ESN(ESNConfig(size=48, seed=4))
    tokens = torch.randint(0, 11, (500,), generator=torch.Generator().manual_seed(2))
    kw = dict(mode=mode, context=16, streams=8, chunk_elems=48 * 16 * 9)
    seen, forward = [], ESN.forward

    def spy(self, u, s0=None, work=None):
        seen.append(None if work is None else work.data_ptr())
        return forward(self, u, s0, work)

    monkeypatch.setattr(ESN, "forward", spy)
    reused = shard_states(esn, _embed, tokens, **kw)
    assert len(seen) >= 2 and len({p for p in seen if p is not None}) == 1
    monkeypatch.setattr(ESN, "forward", lambda self, u, s0=None: forward(self, u, s0))   # no `work`
    seen.clear()
    fresh = shard_states(esn, _embed, tokens, **kw)
    assert torch.equal(reused, fresh)


@pytest.mark.parametrize("norm,measure", [("spectral", spectral_radius), ("singular", largest_singular_value)])
def test_radius_norm_gives_the_requested_radius(norm, measure):
    esn = ESN(ESNConfig(size=80, spectral_radius=0.9, radius_norm=norm, seed=5))
    assert measure(esn.W_T) == pytest.approx(0.9, rel=1e-6)
    if norm == "singular":   # sigma_max >= rho, so the spectral radius lies below the request
        assert spectral_radius(esn.W_T) < 0.9


def test_seeding_is_reservoirpy_spawn():
    """child_seed(seed, k) is SeedSequence(seed).spawn(...)[k]; keys and seeds give independent streams."""
    kids = np.random.SeedSequence(11).spawn(3)
    assert [child_seed(11, k) for k in range(3)] == [int(c.generate_state(1, np.uint64)[0]) for c in kids]
    assert child_seed(11, 0, 2) == int(kids[0].spawn(3)[2].generate_state(1, np.uint64)[0])
    assert len({child_seed(11), child_seed(11, 0), child_seed(11, 1), child_seed(12, 0)}) == 4
    assert torch.equal(torch.rand(4, generator=generator(3, 1)), torch.rand(4, generator=generator(3, 1)))
    with pytest.raises(ReslmError):
        child_seed(-1)


def test_matrices_come_from_independent_streams():
    """Changing W_in's density or distribution leaves W (and b) as they were."""
    a = ESN(ESNConfig(size=30, bias_scaling=0.5, seed=2))
    b = ESN(ESNConfig(size=30, bias_scaling=0.5, input_density=0.3, input_init="normal", seed=2))
    assert torch.equal(a.W_T, b.W_T) and torch.equal(a.bias, b.bias) and not torch.equal(a.W_in_T, b.W_in_T)


def test_input_options():
    base = ESN(ESNConfig(size=30, input_dim=25, input_scaling=2.0, seed=3))
    scaled = ESN(ESNConfig(size=30, input_dim=25, input_scaling=2.0, input_scale_by_dim=True, seed=3))
    torch.testing.assert_close(scaled.W_in_T, base.W_in_T / 5)
    assert base.W_in_T.abs().max() <= 2.0
    normal = ESN(ESNConfig(size=200, input_dim=25, input_scaling=1.0, input_init="normal", seed=3))
    assert normal.W_in_T.std().item() == pytest.approx(1.0, abs=0.05) and normal.W_in_T.abs().max() > 1


def test_rnn_backend_equals_loop():
    """torch.rnn_tanh (cuDNN's fused RNN on a GPU) runs on the CPU too: same states as the loop."""
    cfg = dict(size=32, input_dim=8, bias_scaling=0.2, seed=4)
    loop, rnn = ESN(ESNConfig(**cfg, backend="loop")), ESN(ESNConfig(**cfg, backend="rnn"))
    assert loop.backend(torch.device("cpu")) == "loop"
    assert ESN(ESNConfig(**cfg)).backend(torch.device("cuda")) == "rnn"
    assert ESN(ESNConfig(**cfg, leak_rate=0.5)).backend(torch.device("cuda")) == "loop"
    u, s0 = torch.randn(3, 7, 8), torch.randn(3, 32).tanh()
    for start in (None, s0):
        (a, a_T), (b, b_T) = loop(u, start), rnn(u, start)
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(b_T, a_T, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["loop", "rnn"])
def test_low_precision(backend):
    cfg = dict(size=32, input_dim=8, seed=4, backend=backend)
    u, s0 = torch.randn(3, 7, 8), torch.randn(3, 32).tanh()
    ref, _ = ESN(ESNConfig(**cfg))(u, s0)
    low = ESN(ESNConfig(**cfg, dtype="bfloat16"))
    out, last = low(u, s0)
    assert out.dtype == last.dtype == torch.bfloat16 and (out.float() - ref).abs().max() < 0.05
    assert low.W_T.dtype == torch.float32                    # the buffers (the checkpoint) stay float32
    assert low._weights(torch.bfloat16)[0] is low._weights(torch.bfloat16)[0]   # cast once, cached
    assert ESN(ESNConfig(**cfg))(u.bfloat16())[0].dtype == torch.bfloat16   # "input": u's dtype (bench)
    auto = ESN(ESNConfig(**cfg, dtype="auto"))
    assert auto.compute_dtype(torch.device("cuda")) == torch.float16
    assert auto.compute_dtype(torch.device("cpu"), torch.bfloat16) == torch.float32
    assert auto(u.bfloat16())[0].dtype == torch.float32


def test_cast_cache_follows_the_buffers():
    """Loading other weights into an ESN that has cached a low-precision copy uses the new weights."""
    a = ESN(ESNConfig(size=16, input_dim=4, dtype="bfloat16", seed=1))
    b = ESN(ESNConfig(size=16, input_dim=4, dtype="bfloat16", seed=2))
    u = torch.randn(2, 5, 4)
    a(u)
    a.load_state_dict(b.state_dict())
    assert torch.equal(a(u)[0], b(u)[0])


@pytest.mark.parametrize("backend,leak", [("loop", 1.0), ("loop", 0.4), ("rnn", 1.0)])
def test_gradient_through_the_recurrence(backend, leak):
    """With u requiring grad the recurrence is recorded (same states as the in-place loop) and u gets
    a gradient; without, it runs under no_grad. The weights never get one."""
    esn = ESN(ESNConfig(size=24, input_dim=6, leak_rate=leak, bias_scaling=0.1, backend=backend, seed=6))
    u = torch.randn(2, 9, 6, requires_grad=True)
    s0 = torch.randn(2, 24).tanh()
    states, last = esn(u, s0)
    ref, _ = esn(u.detach(), s0)
    assert states.requires_grad and not ref.requires_grad
    torch.testing.assert_close(states, ref, atol=1e-5, rtol=1e-5)
    states[:, -1].sum().backward()
    assert u.grad[:, 0].abs().sum() > 0                     # the first input reaches the last state
    assert all(not t.requires_grad and t.grad is None for t in esn.buffers())
    with torch.no_grad():
        assert not esn(u, s0)[0].requires_grad


def test_empty_sequence():
    esn = ESN(ESNConfig(size=10, input_dim=3))
    states, last = esn(torch.zeros(2, 0, 3))
    assert states.shape == (2, 0, 10) and torch.equal(last, torch.zeros(2, 10))
    s0 = torch.randn(2, 10)
    assert torch.equal(esn(torch.zeros(2, 0, 3), s0)[1], s0)


def test_shape_only_construction_draws_nothing():
    with torch.device("meta"):
        esn = ESN(ESNConfig(size=5000, input_dim=8))
    assert esn.W_T.is_meta and esn.W_T.shape == (5000, 5000)


def test_every_registered_reservoir_states_its_capabilities():
    """The contract (reservoir/base.py): capabilities are class attributes of one base class, not methods
    probed for: every digital substrate is pure and drivable; the recording alone replays and cannot drive."""
    for name, (cfg_cls, res_cls) in RESERVOIRS.items():
        assert issubclass(cfg_cls, ReservoirConfig) and issubclass(res_cls, Reservoir), name
        assert res_cls.pure == res_cls.drivable == (not res_cls.replays) == (name != "recorded"), name
        assert set(cfg_cls.context_modes) <= {"window", "stream"}, name
    assert RESERVOIRS["recorded"][0].context_modes == ("stream",)
    assert RESERVOIRS["esn"][0].implied({}) == {}
    with pytest.raises(NotImplementedError):
        ESN(ESNConfig(size=4, seed=0)).replay(torch.zeros(3, dtype=torch.long), 0)
