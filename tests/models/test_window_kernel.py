"""The transformer's fused window step (reslm.models.window_kernel): the same model as the plain path
(eval logits, and gradients given the same dropout masks), masks that are Bernoulli(p) and independent,
the choice of step in training, and runs that move between the two steps."""
import math

import pytest
import torch

from reslm.core.errors import ReslmError
from reslm.models import build_model
from reslm.models.base import next_token_loss
from reslm.models import window_kernel as wk
from reslm.models.transformer import CharTransformer, TransformerConfig
from reslm.train.compiled import choose_window_step

CPU = torch.device("cpu")
SIZES = [(64, 4, 4, 32), (32, 16, 3, 32), (24, 8, 1, 16), (16, 1, 2, 8)]   # ff, heads, layers, context


def _model(ff, h, L, T, **kw):
    model = CharTransformer(TransformerConfig(ff_dim=ff, n_heads=h, n_layers=L, context=T, seed=1, **kw))
    if wk.library(model.config) is None:
        pytest.skip(f"no fused kernel here: {wk.unsupported(model.config) or wk.native.why_not(wk.SOURCE)}")
    return model


@pytest.mark.parametrize("ff,h,L,T", SIZES)
def test_eval_logits_equal_the_plain_path(ff, h, L, T):
    model = _model(ff, h, L, T).eval()
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, 59, (37, T), generator=g), torch.randint(0, 59, (37,), generator=g)
    with torch.no_grad():
        fused, loss_f = wk.fused_forward(model, x, y)
        model.window_step = "plain"
        plain, loss_p = model.forward_features(x, y)
    torch.testing.assert_close(fused, plain, rtol=0, atol=1e-5)
    assert abs(loss_f.item() - loss_p.item()) < 1e-5


@pytest.mark.parametrize("one_pass", [True, False], ids=["loss-in-kernel", "through-logits"])
@pytest.mark.parametrize("ff,h,L,T", SIZES)
def test_gradients_equal_the_plain_path_given_the_same_masks(ff, h, L, T, one_pass):
    """The plain path given the kernel's masks (HashedDropout with the same seed pairs): the same loss and
    the same gradient of every parameter, the embedding's and the head's included; both when the
    kernel computes the loss and its gradients in one pass (targets given) and when the gradient comes
    back through its output (the layers recomputed in the backward)."""
    model = _model(ff, h, L, T, dropout=0.3).train()
    g = torch.Generator().manual_seed(2)
    x, y = torch.randint(0, 59, (29, T), generator=g), torch.randint(0, 59, (29,), generator=g)
    torch.manual_seed(7)
    seeds = wk.draw_seeds(L)
    loss_p = model._forward(x, y, wk.HashedDropout(seeds), False)[1]
    loss_p.backward()
    plain = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    if one_pass:
        logits, loss_f = wk.fused_forward(model, x, y, seeds)
        assert logits.shape == (29, 1, 59)
        assert abs(next_token_loss(logits, y).item() - loss_f.item()) < 1e-5
        with pytest.raises(ReslmError, match="gradient of its loss only"):
            (loss_f + logits.sum()).backward(retain_graph=True)
    else:
        loss_f = next_token_loss(wk.fused_forward(model, x, None, seeds)[0], y)
    loss_f.backward()
    assert abs(loss_f.item() - loss_p.item()) < 1e-5
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, plain[name], rtol=1e-4, atol=1e-6, msg=name)


def test_masks_are_bernoulli_p_and_independent_across_elements_positions_and_steps():
    """Deterministic (fixed seeds), so not a flaky test: the rate within 5 standard errors of p, and
    neighbours along the last axis, along positions, and the same element in two steps are dropped
    together at rate p^2 (independence), within 5 standard errors."""
    p, shape = 0.1, (256, 8, 32, 32)   # (windows, heads, positions, positions): an attention site
    torch.manual_seed(0)
    a, b = wk.draw_seeds(1)[:2]
    m1, m2 = wk.hashed_drop_mask(shape, p, a).float(), wk.hashed_drop_mask(shape, p, b).float()
    n = m1.numel()
    assert abs(m1.mean().item() - p) < 5 * math.sqrt(p * (1 - p) / n)
    for joint in ((m1[..., 1:] * m1[..., :-1]).mean(), (m1[:, :, 1:] * m1[:, :, :-1]).mean(),
                  (m1[1:] * m1[:-1]).mean(), (m1 * m2).mean()):
        assert abs(joint.item() - p * p) < 5 * math.sqrt(p * p * (1 - p * p) / (n // 2)), joint
    assert not torch.equal(m1, m2)


def test_the_kernel_draws_the_masks_of_hashed_drop_mask():
    """One layer without attention or feed-forward signal would hide a mask; instead: the fused loss with
    p = 0.5 equals the plain loss under HashedDropout and differs from it under other seeds."""
    model = _model(16, 2, 1, 8, dropout=0.5).train()
    x, y = torch.randint(0, 59, (64, 8)), torch.randint(0, 59, (64,))
    seeds = wk.draw_seeds(1)
    fused = wk.fused_forward(model, x, y, seeds)[1].item()
    assert fused == pytest.approx(model._forward(x, y, wk.HashedDropout(seeds), False)[1].item(), abs=1e-5)
    assert fused != pytest.approx(model._forward(x, y, wk.HashedDropout(seeds + 1), False)[1].item(), abs=1e-5)


def test_same_torch_seed_same_step_and_dropout_drawn_from_torch():
    model = _model(32, 4, 2, 16).train()
    x, y = torch.randint(0, 59, (50, 16)), torch.randint(0, 59, (50,))
    losses = []
    for seed in (3, 3, 4):
        torch.manual_seed(seed)
        losses.append(model.forward_features(x, y)[1].item())
    assert losses[0] == losses[1] != losses[2]


def test_the_plain_path_takes_what_the_kernel_does_not_cover():
    model = _model(32, 4, 2, 16).eval()
    calls = []
    real = wk.fused_forward
    wk_fused = lambda *a, **k: calls.append(1) or real(*a, **k)   # noqa: E731
    try:
        wk.fused_forward = wk_fused
        with torch.no_grad():
            model.forward_features(torch.randint(0, 59, (4, 16)))          # full windows: fused
            model.forward_features(torch.randint(0, 59, (4, 9)))           # a shorter window: plain
            with torch.autocast("cpu", dtype=torch.bfloat16):
                model.forward_features(torch.randint(0, 59, (4, 16)))      # bf16 autocast: plain
            model.window_step = "plain"
            model.forward_features(torch.randint(0, 59, (4, 16)))          # asked for the plain path
    finally:
        wk.fused_forward = real
    assert calls == [1]


def test_evaluation_batches_are_capped_only_where_the_plain_path_runs():
    from reslm.features import estimate_loss, eval_batch_size, feature_batches
    from reslm.models.base import WindowFeatures
    model = _model(32, 4, 2, 16)
    assert eval_batch_size(model, 1024, "cpu") == 1024                       # the fused step: the whole batch
    assert eval_batch_size(model, 1024, "cpu", "bf16") == model.cpu_eval_batch   # autocast: the plain path
    feats = WindowFeatures(torch.randint(0, 59, (300,)), 16)
    whole, n = estimate_loss(model, feature_batches(feats, 1024))
    model.window_step = "plain"
    assert eval_batch_size(model, 1024, "cpu") == model.cpu_eval_batch < 1024
    plain, m = estimate_loss(model, feature_batches(feats, eval_batch_size(model, 1024, "cpu")))
    assert n == m == 284 and plain == pytest.approx(whole, abs=1e-5)


def test_choose_window_step_says_what_runs_and_refuses_fused_where_it_cannot_run():
    model = _model(32, 4, 2, 16)
    assert choose_window_step(model, "auto", "auto", CPU, "fp32", announce=False) == "fused"
    assert choose_window_step(model, "plain", "auto", CPU, "fp32", announce=False) == "plain"
    assert model.window_step == "plain"
    assert choose_window_step(model, "auto", "auto", CPU, "bf16", announce=False) == "plain"
    with pytest.raises(ReslmError, match="--window-step fused: the fused step computes in fp32"):
        choose_window_step(model, "fused", "auto", CPU, "bf16", announce=False)
    causal = build_model("tf", ff_dim=16, n_heads=2, n_layers=1, context=8, context_mode="causal")
    with pytest.raises(ReslmError, match="for window mode"):
        choose_window_step(causal, "fused", "auto", CPU, "fp32", announce=False)
    with pytest.raises(ReslmError, match="character transformer"):
        choose_window_step(build_model("rc", size=16), "fused", "auto", CPU, "fp32", announce=False)
    wide = build_model("tf", embed_dim=24, ff_dim=16, n_heads=2, n_layers=1, context=8)   # 12 lanes per head
    assert choose_window_step(wide, "auto", "auto", CPU, "fp32", announce=False) == "plain"
    with pytest.raises(ReslmError, match="embed_dim a multiple of"):
        choose_window_step(wide, "fused", "auto", CPU, "fp32", announce=False)


def test_a_run_trained_on_the_plain_step_continues_on_the_fused_one(chars, tmp_path):
    """window_step is a resource field: a resume may change it (reslm train --resume --window-step ...), the
    checkpoint is the same, and the run goes on to its end from where the plain step stopped."""
    import reslm.train as tt
    from reslm.run import read_metrics
    from reslm.train.config import resume_run

    _model(16, 2, 1, 32)
    train = dict(batch_size=64, epochs_per_shard=1, epoch_samples=128, lr=3e-3, log_every=1, device="cpu",
                 precision="fp32", window_step="plain")
    run = tt.create_run(tmp_path / "run", "tf", dict(ff_dim=16, n_heads=2, n_layers=1), train, chars)
    tt.train(run, progress=False, stop_at=4)
    before = torch.load(run / "checkpoint.pt", weights_only=True)["model"]
    resume_run(run, {"window_step": "fused"})
    tt.train(run, progress=False)
    after = torch.load(run / "checkpoint.pt", weights_only=True)["model"]
    steps = [r["step"] for r in read_metrics(run) if r["kind"] == "step"]
    assert tt.is_finished(run) and steps == sorted(steps) and steps[-1] > 4
    assert before.keys() == after.keys() and any(not torch.equal(before[k], after[k]) for k in before)


@pytest.fixture
def avx2(tmp_path, monkeypatch):
    """The kernel built for an AVX2 target (RESLM_MARCH=haswell: 8-float vectors) on an AVX-512 CPU, in a
    cache of the test's own; where this CPU builds the 8-float layout itself, the tests above cover it."""
    if wk.native.vector_floats() != 16:
        pytest.skip("this CPU builds the 8-float layout natively")
    monkeypatch.setenv("RESLM_MARCH", "haswell")
    monkeypatch.setenv("RESLM_CACHE", str(tmp_path / "cache"))
    wk.native.build.cache_clear()
    assert wk.native.vector_floats() == 8
    yield
    wk.native.build.cache_clear()


@pytest.mark.parametrize("ff,h,L,T", SIZES[:3])
def test_the_avx2_layout_computes_the_same_model(avx2, ff, h, L, T):
    """The kernel as an AVX2 CPU builds it: the same eval logits and, given the masks, the same gradients."""
    test_eval_logits_equal_the_plain_path(ff, h, L, T)
    test_gradients_equal_the_plain_path_given_the_same_masks(ff, h, L, T, one_pass=True)
    assert "-march=haswell" in wk.status(_model(ff, h, L, T).config)[1]


def test_a_run_resumed_on_another_window_step_says_it_will_not_equal_the_uninterrupted_run(chars, tmp_path,
                                                                                            capsys):
    """Issue 89: killed on the fused step and resumed where the plain one runs (no compiler, or asked), the
    run says so in one line; resumed on the step it began with, it says nothing."""
    import reslm.train as tt
    from reslm.train.config import resume_run

    if not wk.status(_model(16, 2, 1, 32).config)[0]:
        pytest.skip("the fused step cannot run here")
    train = dict(batch_size=64, epochs_per_shard=1, epoch_samples=128, lr=3e-3, log_every=1, device="cpu",
                 precision="fp32", window_step="fused")
    run = tt.create_run(tmp_path / "run", "tf", dict(ff_dim=16, n_heads=2, n_layers=1), train, chars)
    tt.train(run, progress=False, stop_at=2)
    capsys.readouterr()
    tt.train(run, progress=False, stop_at=3)                       # the same step: no word
    assert "will not equal" not in capsys.readouterr().err
    resume_run(run, {"window_step": "plain"})
    tt.train(run, progress=False, stop_at=4)
    lines = [line for line in capsys.readouterr().err.splitlines() if "will not equal" in line]
    assert len(lines) == 1 and "fused window step" in lines[0] and "plain one" in lines[0]
