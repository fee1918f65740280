"""LAERC (layered reservoir LM, paper Appendix A) and the GPT baseline."""
import math

import pytest
import torch

from reslm.errors import ReslmError
from reslm.models.base import count_params
from reslm.models.gpt import GPT, GPTConfig, gpt_param_count
from reslm.models.laerc import AUTHORS_VARIANT, LAERC, LAERCConfig, laerc_param_count
from reslm.reservoir.esn import spectral_radius

V = 37


def small(**kw) -> LAERCConfig:
    base = dict(vocab_size=V, dim=8, n_layers=3, context=16, seed=0)
    base.update(kw)
    return LAERCConfig(**base)


def closed_form(cfg: LAERCConfig) -> tuple[int, int]:
    """Written out independently of laerc_param_count: per block terms from the equations."""
    V_, D, L, T, R = cfg.vocab_size, cfg.dim, cfg.n_layers, cfg.context, cfg.r_mult * cfg.dim
    H = round(cfg.alpha_res * R)
    if cfg.reservoir:
        gate = (2 * D * D + D) if cfg.gate_layers == 1 else (2 * D * D + D + D * D + D)
        block = (2 * D) + (2 * R) + (R * H + H) + (H * D + D) + 1 + (4 * D) + gate \
            + (2 * D) + (D * 4 * D + 4 * D + 4 * D * D + D) + 1
        fixed = L * (R * R + R * D + R)
    else:
        block, fixed = (2 * D) + (8 * D * D + 5 * D) + 1, 0
    pos = T * D if cfg.pos_encoding == "learned" else 0
    head = 0 if cfg.tie_embeddings else V_ * D
    return V_ * D + pos + L * block + 2 * D + head, fixed


@pytest.mark.parametrize("kw", [dict(), dict(pos_encoding="none", tie_embeddings=False),
                                dict(reservoir=False), dict(alpha_res=0.5, r_mult=2),
                                dict(AUTHORS_VARIANT)])
def test_param_count_formula(kw):
    cfg = small(**kw)
    assert count_params(LAERC(cfg)) == closed_form(cfg) == laerc_param_count(cfg)
    with torch.device("meta"):  # shape-only construction draws nothing and counts the same
        assert count_params(LAERC(cfg)) == closed_form(cfg)


def test_gpt_param_count():
    cfg = GPTConfig(vocab_size=V, dim=16, n_layers=2, n_heads=4, context=16)
    assert count_params(GPT(cfg)) == (gpt_param_count(cfg), 0)


def test_radius_schedule():
    cfg = small(n_layers=4)
    model = LAERC(cfg)
    want = [0.95 + 0.04 * (l - 1) / 3 for l in range(1, 5)]
    got = [spectral_radius(b.reservoir.W_res) for b in model.blocks]
    assert got == pytest.approx(want, abs=1e-5)
    one = LAERC(small(n_layers=1))
    assert spectral_radius(one.blocks[0].reservoir.W_res) == pytest.approx(0.95, abs=1e-5)


def test_authors_variant_singular_norm():
    model = LAERC(small(**AUTHORS_VARIANT))
    for b in model.blocks:
        W = b.reservoir.W_res.double()
        assert torch.linalg.matrix_norm(W, ord=2).item() == pytest.approx(0.9, abs=1e-5)
        assert torch.count_nonzero(b.reservoir.bias) == 0
    assert model.pos is None


def test_alpha_zero_makes_block_output_m():
    torch.manual_seed(0)
    model = LAERC(small())
    x = torch.randn(2, 5, 8)
    for b in model.blocks:
        assert b.alpha.item() == 0.0 and b.beta.item() == 0.0
        m, _ = b.mix(x)
        out, _ = b(x)
        assert b.ffn(m).abs().max() > 0       # the FFN itself is not trivially zero...
        assert torch.equal(out, m)            # ...but alpha = 0 removes it


def test_no_gradient_into_reservoir():
    model = LAERC(small())
    names = {n for n, _ in model.named_parameters()}
    assert not any("reservoir" in n for n in names)                 # W_res, W_in, b are buffers
    assert all(not b.requires_grad for b in model.buffers())
    idx = torch.randint(0, V, (2, 6))
    _, loss = model(idx, idx)
    loss.backward()
    for b in model.blocks:
        assert b.ln_res.weight.grad is None and b.ln_res.bias.grad is None   # detached input
        assert b.res_w1.weight.grad is not None and b.ln_res_out.weight.grad is not None
        states = b.reservoir(torch.randn(1, 3, 8, requires_grad=True), None)
        assert not states.requires_grad


def assert_step_matches_forward(model, T: int = 12) -> dict:
    """Stepping token by token gives the full forward pass's logits at every position; returns the state."""
    idx = torch.randint(0, V, (3, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full, _ = model(idx)
    state = model.init_state(3)
    for t in range(T):
        logits, state = model.step(idx[:, t], state)
        assert torch.allclose(logits, full[:, t], atol=1e-5, rtol=0), t
    return state


@pytest.mark.parametrize("kw", [dict(), dict(pos_encoding="sinusoidal"), dict(AUTHORS_VARIANT),
                                dict(reservoir=False)])
def test_laerc_step_matches_forward(kw):
    model = LAERC(small(**kw)).eval()
    with torch.no_grad():  # make the FFN and gate paths non-trivial
        for b in model.blocks:
            b.alpha.fill_(0.7)
    assert assert_step_matches_forward(model)["pos"] == 12


def test_gpt_step_matches_forward():
    assert_step_matches_forward(GPT(GPTConfig(vocab_size=V, dim=16, n_layers=2, n_heads=4, context=16)).eval())


def test_same_seed_same_weights():
    a, b, c = LAERC(small(seed=3)), LAERC(small(seed=3)), LAERC(small(seed=4))
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["embed.weight"], sc["embed.weight"])
    assert not torch.equal(sa["blocks.0.reservoir.W_T"], sc["blocks.0.reservoir.W_T"])
    g1, g2 = GPT(GPTConfig(vocab_size=V, dim=16, n_layers=1, n_heads=2, context=8)), \
        GPT(GPTConfig(vocab_size=V, dim=16, n_layers=1, n_heads=2, context=8))
    assert all(torch.equal(x, y) for x, y in zip(g1.state_dict().values(), g2.state_dict().values()))


@pytest.mark.parametrize("make", [lambda: LAERC(small()),
                                  lambda: GPT(GPTConfig(vocab_size=V, dim=16, n_layers=2, n_heads=4, context=16))])
def test_shapes_and_loss_at_init(make):
    model = make()
    g = torch.Generator().manual_seed(5)
    idx, targets = torch.randint(0, V, (2, 4, 16), generator=g)
    logits, loss = model(idx, targets)  # targets independent of idx (tied weights favour y = x)
    assert logits.shape == (4, 16, V)
    assert loss.item() == pytest.approx(math.log(V), abs=0.05)
    assert model(idx)[1] is None


@pytest.mark.parametrize("make", [lambda: LAERC(small(dim=16, n_layers=2)),
                                  lambda: GPT(GPTConfig(vocab_size=V, dim=16, n_layers=2, n_heads=4, context=16))])
def test_tiny_batch_overfits(make):
    torch.manual_seed(0)
    model = make()
    idx = torch.randint(0, V, (2, 16), generator=torch.Generator().manual_seed(2))
    x, y = idx[:, :-1], idx[:, 1:]
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = None
    for _ in range(150):
        _, loss = model(x, y)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.3 * first, (first, loss.item())


def test_no_reservoir_variant():
    full, ablated = LAERC(small()), LAERC(small(reservoir=False))
    assert count_params(ablated)[0] < count_params(full)[0]
    assert count_params(ablated)[1] == 0
    idx = torch.randint(0, V, (2, 8))
    logits, loss = ablated(idx, idx)
    assert logits.shape == (2, 8, V) and torch.isfinite(loss)
    loss.backward()
    # no token mixing: changing an earlier token leaves later logits unchanged
    idx2 = idx.clone()
    idx2[:, 0] = (idx[:, 0] + 1) % V
    with torch.no_grad():
        assert torch.equal(ablated(idx)[0][:, 1:], ablated(idx2)[0][:, 1:])
        assert not torch.equal(full(idx)[0][:, 1:], full(idx2)[0][:, 1:])


@pytest.mark.parametrize("kw", [dict(dim=0), dict(n_layers=-1), dict(r_mult=0), dict(alpha_res=0.0),
                                dict(radius_start=0.0), dict(bias_scaling=-1.0), dict(input_scaling=float("nan")),
                                dict(pos_encoding="rope"), dict(radius_norm="frobenius"), dict(gate_layers=3),
                                dict(dim=7, pos_encoding="sinusoidal"), dict(vocab_size=2.5),
                                dict(reservoir="yes")])
def test_bad_laerc_configs(kw):
    with pytest.raises(ReslmError):
        LAERC(small(**kw))


@pytest.mark.parametrize("kw", [dict(dim=10, n_heads=4), dict(n_heads=0), dict(dropout=1.0), dict(context=0)])
def test_bad_gpt_configs(kw):
    base = dict(vocab_size=V, dim=16, n_layers=1, n_heads=4, context=8)
    base.update(kw)
    with pytest.raises(ReslmError):
        GPT(GPTConfig(**base))


def test_past_context_raises():
    model = LAERC(small(context=4))
    with pytest.raises(ReslmError):
        model(torch.zeros(1, 5, dtype=torch.long))
    state = model.init_state(1)
    for _ in range(4):
        _, state = model.step(torch.zeros(1, dtype=torch.long), state)
    with pytest.raises(ReslmError):
        model.step(torch.zeros(1, dtype=torch.long), state)
    # without a positional table the reservoir runs on past the context
    free = LAERC(small(context=4, pos_encoding="none"))
    assert free(torch.zeros(1, 9, dtype=torch.long))[0].shape == (1, 9, V)


def test_sampler_carries_state_for_token_models():
    """The one sampler drives LAERC and GPT through step(); greedy output equals greedy decoding
    with the full forward pass re-run over the prefix."""
    from reslm.generate import sample
    from reslm.models.gpt import GPT, GPTConfig
    from reslm.models.laerc import LAERC, LAERCConfig

    for model in (LAERC(LAERCConfig(vocab_size=50, dim=16, n_layers=2, context=40, seed=1)),
                  GPT(GPTConfig(vocab_size=50, dim=16, n_layers=2, n_heads=2, context=40, seed=1))):
        model.eval()
        prompt = [3, 7, 1, 4]
        out = sample(model, prompt, 12, temperature=0)
        ids = list(prompt)
        with torch.no_grad():
            for _ in range(12):
                logits, _ = model(torch.tensor([ids]))
                ids.append(int(logits[0, -1].argmax()))
        assert out == ids[len(prompt):]


def test_reservoir_backends_and_precision():
    """The cuDNN path (torch.rnn_tanh, also runnable on CPU) equals the loop; bf16 stays close."""
    from reslm.models.laerc import Reservoir
    cfg = LAERCConfig(vocab_size=50, dim=8, n_layers=1, context=16)
    res = Reservoir(cfg, 1)
    u, s0 = torch.randn(3, 7, 8), torch.randn(3, 32).tanh()
    loop = res(u, s0, backend="loop")
    assert loop.dtype == torch.float32 and res.compute_dtype(torch.device("cpu")) == torch.float32
    torch.testing.assert_close(res(u, s0, backend="rnn"), loop, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(res(u, None, backend="rnn"), res(u, None, backend="loop"), atol=1e-5, rtol=1e-5)
    low = Reservoir(LAERCConfig(vocab_size=50, dim=8, n_layers=1, context=16, reservoir_dtype="bfloat16"), 1)
    out = low(u, s0)
    assert out.dtype == torch.bfloat16 and (out.float() - loop).abs().max() < 0.05
    assert Reservoir(cfg, 1).compute_dtype(torch.device("cuda")) == torch.float16  # auto on a GPU
    with pytest.raises(ReslmError, match="reservoir_dtype"):
        LAERCConfig(reservoir_dtype="int8").validate()
