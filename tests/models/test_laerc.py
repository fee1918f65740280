"""LAERC (layered reservoir LM, paper Appendix A) and the GPT baseline."""
import math
from dataclasses import dataclass

import pytest
import torch

from reslm.core.errors import ReslmError
from reslm.models.base import count_params
from reslm.models.gpt import GPT, GPTConfig, gpt_param_count
from reslm.models.laerc import AUTHORS_VARIANT, LAERC, LAERCConfig, laerc_param_count
from reslm.reservoir import ESN, RESERVOIRS, ESNConfig, spectral_radius
from reslm.reservoir.base import Reservoir, ReservoirConfig

V = 37


def small(**kw) -> LAERCConfig:
    base = dict(vocab_size=V, dim=8, n_layers=3, context=16, seed=0)
    base.update(kw)
    return LAERCConfig(**base)


def closed_form(cfg: LAERCConfig) -> tuple[int, int]:
    """Written out independently of laerc_param_count: per block terms from the equations."""
    V_, D, L, T, R = cfg.vocab_size, cfg.dim, cfg.n_layers, cfg.context, cfg.r_mult * cfg.dim
    H = round(cfg.alpha_res * (R if cfg.readout_hidden == "res" else D))
    if not cfg.no_reservoir:
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
                                dict(no_reservoir=True), dict(alpha_res=0.5, r_mult=2),
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
    got = [spectral_radius(b.reservoir.W_T) for b in model.blocks]   # rho(W^T) = rho(W)
    assert got == pytest.approx(want, abs=1e-5)
    one = LAERC(small(n_layers=1))
    assert spectral_radius(one.blocks[0].reservoir.W_T) == pytest.approx(0.95, abs=1e-5)


def test_authors_variant_singular_norm():
    model = LAERC(small(**AUTHORS_VARIANT))
    for b in model.blocks:
        W = b.reservoir.W_T.double()
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
    assert model.has_unused_parameters


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
                                dict(no_reservoir=True)])
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
    full, ablated = LAERC(small()), LAERC(small(no_reservoir=True))
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
                                dict(spectral_radius=0.0), dict(bias_scaling=-1.0), dict(input_scaling=float("nan")),
                                dict(pos_encoding="rope"), dict(radius_norm="frobenius"), dict(gate_layers=3),
                                dict(dim=7, pos_encoding="sinusoidal"), dict(vocab_size=2.5),
                                dict(no_reservoir="yes"), dict(reservoir="nope"), dict(readout_hidden="x"),
                                dict(input_init="cauchy"), dict(reservoir_grad=1), dict(embed_lr_mult=0.0),
                                dict(seed=-1), dict(reservoir_dtype="int8")])
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


@pytest.mark.parametrize("D,L,want", [(128, 4, 7_494_536), (512, 16, 93_046_304)])
def test_authors_variant_matches_their_parameter_count(D, L, want):
    """The authors' released model, instantiated at V = 50,257, T = 512, has these trainable counts."""
    cfg = LAERCConfig(vocab_size=50257, dim=D, n_layers=L, context=512, **AUTHORS_VARIANT)
    with torch.device("meta"):   # shapes only: no R x R draws, no eigendecompositions
        model = LAERC(cfg)
    assert count_params(model)[0] == laerc_param_count(cfg)[0] == want
    assert model.blocks[0].res_w1.out_features == D and isinstance(model.blocks[0].gate, torch.nn.Sequential)


def test_authors_variant_reservoir_inputs():
    """W_in ~ N(0, 1) / sqrt(D), zero bias, and LN_res trained (no unused parameters)."""
    model = LAERC(LAERCConfig(vocab_size=V, dim=64, n_layers=1, context=8, **AUTHORS_VARIANT))
    w_in = model.blocks[0].reservoir.W_in_T * 64 ** 0.5           # (D, R) entries ~ N(0, 1)
    assert abs(w_in.mean().item()) < 0.02 and w_in.std().item() == pytest.approx(1.0, abs=0.02)
    assert (w_in < -1).any() and (w_in > 1).any()                  # not uniform in [-1, 1]
    assert not model.has_unused_parameters


def _earlier_position_grad(model, idx):
    """Gradient of the last position's logits w.r.t. the embedding output at the earlier positions:
    only the reservoir path mixes positions, so it is the gradient through the reservoir."""
    out = {}

    def keep(_, __, x):
        x.retain_grad()
        out["x"] = x
    handle = model.embed.register_forward_hook(keep)
    logits, _ = model(idx)
    handle.remove()
    logits[:, -1].sum().backward()
    return out["x"].grad[:, :-1]


def test_reservoir_grad_reaches_the_embedding():
    idx = torch.randint(0, V, (2, 6), generator=torch.Generator().manual_seed(3))
    default = LAERC(small(pos_encoding="none"))
    assert torch.count_nonzero(_earlier_position_grad(default, idx)) == 0
    through = LAERC(small(pos_encoding="none", reservoir_grad=True))
    assert _earlier_position_grad(through, idx).abs().min() > 0
    for b in through.blocks:
        assert b.ln_res.weight.grad is not None and b.ln_res.weight.grad.abs().sum() > 0
    assert all(not t.requires_grad for t in through.buffers())       # reservoir weights stay fixed
    assert not through.has_unused_parameters


def test_param_groups():
    model = LAERC(small(embed_lr_mult=0.2, tie_embeddings=False, pos_encoding="none"))
    groups = model.param_groups(0.1)
    params = [p for g in groups for p in g["params"]]
    assert len(params) == len({id(p) for p in params}) == len(list(model.parameters()))
    decay, no_decay, embed = groups
    assert decay["weight_decay"] == 0.1 and all(p.dim() == 2 for p in decay["params"])
    assert any(p is model.head.weight for p in decay["params"])     # an untied head is a linear map
    assert no_decay["weight_decay"] == 0.0 and all(p.dim() <= 1 for p in no_decay["params"])
    assert embed == dict(params=[model.embed.weight], weight_decay=0.0, lr_mult=0.2)
    torch.optim.AdamW(groups, lr=1e-3)                               # AdamW takes them as they are
    tied = LAERC(small(pos_encoding="learned")).param_groups(0.1)
    assert sum(len(g["params"]) for g in tied) == len(list(LAERC(small()).parameters()))
    assert any(p.dim() == 2 and p.shape[0] == 16 for p in tied[1]["params"])   # positions: no decay


def test_layers_get_different_reservoirs():
    model = LAERC(small(spectral_radius=0.9, spectral_radius_end=0.9))
    Ws = [b.reservoir.W_T for b in model.blocks]
    assert not torch.equal(Ws[0], Ws[1]) and not torch.equal(Ws[1], Ws[2])
    assert not torch.equal(model.blocks[0].reservoir.W_in_T, model.blocks[1].reservoir.W_in_T)


@dataclass
class LeakyConfig(ReservoirConfig):
    """A reservoir with its own config: only size, input_dim and seed (LAERC fills what exists)."""
    size: int = 8
    input_dim: int = 4
    seed: int = 0

    def validate(self):
        pass


class Leaky(Reservoir):
    """A non-ESN reservoir for the registry test: s_t = 0.5 s_{t-1} + tanh(W_in u_t)."""

    def __init__(self, cfg: LeakyConfig):
        super().__init__()
        self.size, self.input_dim = cfg.size, cfg.input_dim
        self.register_buffer("W_in_T", torch.randn(cfg.input_dim, cfg.size,
                                                   generator=torch.Generator().manual_seed(cfg.seed)))

    def init_state(self, batch, device=None, dtype=None):
        return torch.zeros(batch, self.size, device=device, dtype=dtype)

    def forward(self, u, s0=None):
        s = s0 if s0 is not None else self.init_state(u.shape[0], u.device, u.dtype)
        out = []
        for t in range(u.shape[1]):
            s = 0.5 * s + torch.tanh(u[:, t] @ self.W_in_T)
            out.append(s)
        return torch.stack(out, 1), s

    def step(self, u_t, s):
        return self.forward(u_t[:, None], s)[1]


class TinyESN(ESN):
    """An ESN subclass registered under its own name."""


@pytest.mark.parametrize("name,entry", [("leaky", (LeakyConfig, Leaky)), ("tiny", (ESNConfig, TinyESN))])
def test_registered_reservoir_runs_inside_laerc(monkeypatch, name, entry):
    monkeypatch.setitem(RESERVOIRS, name, entry)
    model = LAERC(small(reservoir=name)).eval()
    assert all(type(b.reservoir) is entry[1] and b.reservoir.size == 32 for b in model.blocks)
    with torch.no_grad():
        for b in model.blocks:
            b.alpha.fill_(0.7)
    assert_step_matches_forward(model)
    assert count_params(model)[0] == laerc_param_count(model.config)[0]
    with pytest.raises(ReslmError, match="reservoir must be one of"):
        small(reservoir="absent").validate()


def test_old_run_configs_read_with_the_current_field_names(tmp_path):
    """LAERC's `reservoir: bool` + `reservoir_type: str` became `no_reservoir` + `reservoir: str` (the character
    models' name): a run config written before builds the same model and compares as the same run."""
    from reslm.models import make_config
    from reslm.models.base import config_dict
    from reslm.models.identity import same_run_problem
    from reslm.run import create_run_dir, read_config
    base = dict(vocab_size=V, dim=8, n_layers=1, context=16)
    assert make_config("laerc", **base, reservoir=False, reservoir_type="esn") == small(**base, no_reservoir=True)
    old = make_config("laerc", **base, reservoir=True, reservoir_type="leaky")
    assert old.reservoir == "leaky" and not old.no_reservoir
    assert make_config("laerc", **base, reservoir="leaky") == old
    torch.testing.assert_close(LAERC(old).state_dict(), LAERC(small(**base, reservoir="leaky")).state_dict())
    legacy = dict(family="laerc", preset=None, train=dict(lr=1e-3), data=dict(path="/x"),
                  model={**config_dict(small(**base)), "reservoir": True, "reservoir_type": "esn"})
    del legacy["model"]["no_reservoir"]
    create_run_dir(tmp_path / "old", legacy)
    want = {**legacy, "model": config_dict(small(**base))}
    assert same_run_problem(read_config(tmp_path / "old"), want) is None
    assert "different model" in same_run_problem(read_config(tmp_path / "old"),
                                                  {**want, "model": config_dict(small(**base, no_reservoir=True))})


def test_old_radius_fields_read_as_spectral_radius(tmp_path):
    """LAERC's `radius_start` / `radius_end` became `spectral_radius` (the ESN's name) / `spectral_radius_end`:
    a run config written before builds the same reservoirs and compares as the same run."""
    from reslm.models import make_config
    from reslm.models.base import config_dict
    from reslm.models.identity import same_run_problem
    from reslm.run import create_run_dir, read_config
    base = dict(vocab_size=V, dim=8, n_layers=2, context=16)
    old = make_config("laerc", **base, radius_start=0.5, radius_end=0.7)
    assert old == small(**base, spectral_radius=0.5, spectral_radius_end=0.7)
    assert [old.radius(layer) for layer in (1, 2)] == [0.5, 0.7]
    torch.testing.assert_close(LAERC(old).state_dict(), LAERC(small(**base, spectral_radius=0.5,
                                                                     spectral_radius_end=0.7)).state_dict())
    model = {k: v for k, v in config_dict(small(**base)).items() if k not in ("spectral_radius", "spectral_radius_end")}
    legacy = dict(family="laerc", preset=None, train=dict(lr=1e-3), data=dict(path="/x"),
                  model={**model, "radius_start": 0.95, "radius_end": 0.99})
    create_run_dir(tmp_path / "old", legacy)
    assert same_run_problem(read_config(tmp_path / "old"), {**legacy, "model": config_dict(small(**base))}) is None
