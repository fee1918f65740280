"""Reservoir engine invariants: spectral radius, seeding, step == batch, window == from scratch."""
import pytest
import torch

from reslm.errors import ReslmError
from reslm.reservoir import ESN, ESNConfig, shard_states, spectral_radius


@pytest.mark.parametrize("radius,density", [(0.9, 1.0), (1.3, 0.2), (0.5, 0.05)])
def test_spectral_radius_equals_request(radius, density):
    esn = ESN(ESNConfig(size=120, spectral_radius=radius, density=density, seed=4))
    assert spectral_radius(esn.W_T) == pytest.approx(radius, rel=1e-5)


def test_same_seed_same_reservoir_and_states():
    u = torch.randn(3, 20, 16)
    a, b = ESN(ESNConfig(size=64, seed=7)), ESN(ESNConfig(size=64, seed=7))
    assert torch.equal(a.W_T, b.W_T) and torch.equal(a(u)[0], b(u)[0])
    assert not torch.equal(a.W_T, ESN(ESNConfig(size=64, seed=8)).W_T)


@pytest.mark.parametrize("leak,bias", [(1.0, 0.0), (0.3, 0.5)])
def test_step_by_step_equals_batched_and_equations(leak, bias):
    esn = ESN(ESNConfig(size=40, leak_rate=leak, bias_scaling=bias, seed=1))
    u = torch.randn(5, 12, 16)
    states, last = esn(u)
    s = esn.init_state(5)
    W, W_in = esn.W_T.T, esn.W_in_T.T
    for t in range(12):
        ref = (1 - leak) * s + leak * torch.tanh(s @ W.T + u[:, t] @ W_in.T + esn.bias)  # paper eq. 1 + leak
        s = esn.step(u[:, t], s)
        torch.testing.assert_close(s, ref, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(states[:, t], s, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(last, s)


def test_bad_reservoir_configs():
    for bad in [dict(spectral_radius=0), dict(spectral_radius=-1), dict(leak_rate=0), dict(density=0),
                dict(size=0)]:
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
