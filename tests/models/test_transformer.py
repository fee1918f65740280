"""CharTransformer: Table 1 sizes, seeding, equivalence with nn.TransformerEncoder, learning."""
import math

import pytest
import torch

from reslm.core.errors import ReslmError
from reslm.models.base import WindowFeatures, count_params
from reslm.bench.reference import ReferenceTransformer, copy_weights
from reslm.bench.training import random_windows, trainer
from reslm.models.transformer import CharTransformer, TransformerConfig, sinusoidal_encoding

TABLE1 = {(64, 4, 4): 15067, (72, 8, 8): 30299, (128, 8, 8): 45083, (356, 8, 8): 105275,
          (256, 16, 16): 155803}


def cfg_of(ff, h, L, **kw):
    return TransformerConfig(ff_dim=ff, n_heads=h, n_layers=L, **kw)


@pytest.mark.parametrize("ff,h,L", list(TABLE1))
def test_table1_trainable_counts(ff, h, L):
    trainable, fixed = count_params(CharTransformer(cfg_of(ff, h, L)))
    assert trainable == TABLE1[ff, h, L] == 944 + 1003 + L * (1168 + 33 * ff)
    assert fixed == 32 * 16  # the sinusoidal encoding is a buffer, not trained


def test_same_seed_same_weights_regardless_of_global_rng():
    torch.manual_seed(1)
    a = CharTransformer(cfg_of(64, 4, 2, seed=3))
    torch.manual_seed(2)
    b = CharTransformer(cfg_of(64, 4, 2, seed=3))
    c = CharTransformer(cfg_of(64, 4, 2, seed=4))
    for (k, va), vb, vc in zip(a.state_dict().items(), b.state_dict().values(), c.state_dict().values()):
        assert torch.equal(va, vb), k
    assert any(not torch.equal(va, vc) for va, vc in zip(a.parameters(), c.parameters()))
    x = torch.randint(59, (4, 32))
    assert torch.equal(a.eval()(x)[0], b.eval()(x)[0])


def test_construction_leaves_global_rng_alone():
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    CharTransformer(cfg_of(64, 4, 2))
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("ff,h,L", [(64, 4, 4), (72, 8, 3), (32, 16, 2), (24, 1, 2)])
@pytest.mark.parametrize("T", [32, 7, 1])
def test_eval_logits_equal_torch_encoder(ff, h, L, T):
    """Same weights in nn.TransformerEncoder -> same logits: same architecture, and the last-layer
    shortcut (last query only) changes nothing."""
    torch.manual_seed(0)
    fast = CharTransformer(cfg_of(ff, h, L)).eval()
    ref = copy_weights(fast, ReferenceTransformer(cfg_of(ff, h, L))).eval()
    x = torch.randint(59, (16, T))
    y = torch.randint(59, (16,))
    with torch.no_grad():
        lf, loss_f = fast(x, y)
        lr, loss_r = ref(x, y)
    assert lf.shape == (16, 1, 59)
    torch.testing.assert_close(lf[:, 0], lr.reshape(16, 59), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(loss_f, loss_r, atol=1e-5, rtol=1e-5)
    back = copy_weights(ref, CharTransformer(cfg_of(ff, h, L, seed=9))).eval()
    with torch.no_grad():
        torch.testing.assert_close(back(x)[0].reshape(16, 59), lf[:, 0], atol=1e-6, rtol=0)


def test_train_mode_gradients_match_reference_without_dropout():
    """With dropout 0 the training path (grad flowing through the shortcut) matches torch's too."""
    fast = CharTransformer(cfg_of(64, 4, 2, dropout=0.0)).train()
    ref = copy_weights(fast, ReferenceTransformer(cfg_of(64, 4, 2, dropout=0.0))).train()
    x, y = torch.randint(59, (8, 32)), torch.randint(59, (8,))
    fast(x, y)[1].backward()
    ref(x, y)[1].backward()
    gf = {k: p.grad for k, p in fast.named_parameters()}
    for k, p in ref.named_parameters():
        torch.testing.assert_close(gf[k.removeprefix("encoder.")], p.grad, atol=1e-5, rtol=1e-4)


def test_dropout_is_active_in_training_and_rate_is_p():
    torch.manual_seed(0)
    m = CharTransformer(cfg_of(64, 4, 2)).train()
    x = torch.randint(59, (4, 32))
    assert not torch.equal(m(x)[0], m(x)[0])
    from reslm.models.transformer import dropout_mask
    assert abs(dropout_mask((1 << 20,), 0.1, torch.device("cpu")).float().mean().item() - 0.1) < 2e-3


def test_loss_at_init_is_about_log_vocab():
    torch.manual_seed(0)
    m = CharTransformer(cfg_of(128, 8, 8)).eval()
    x, y = torch.randint(59, (256, 32)), torch.randint(59, (256,))
    with torch.no_grad():
        loss = m(x, y)[1].item()
    assert abs(loss - math.log(59)) < 0.3


@pytest.fixture
def one_thread():
    """Tiny tensors gain nothing from threads, and OpenMP threads crawl on a busy machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_tiny_batch_overfits(one_thread):
    torch.manual_seed(0)
    m = CharTransformer(cfg_of(64, 4, 2, seed=1))
    x, y = torch.randint(59, (8, 32)), torch.randint(59, (8,))
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    for _ in range(120):  # reaches ~0.02 after 50 steps
        loss = m(x, y)[1]
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert m.eval()(x, y)[1].item() < 0.5


def test_features_contract_and_short_windows():
    m = CharTransformer(cfg_of(64, 4, 2)).eval()
    tokens = torch.randint(59, (100,))
    feats = m.features(tokens)
    assert isinstance(feats, WindowFeatures) and len(feats) == 100 - 32
    idx = torch.arange(5)
    xb = feats.batch(idx)
    logits, loss = m.forward_features(xb, feats.targets[idx])
    torch.testing.assert_close(logits, m(xb)[0])
    assert loss.ndim == 0 and m(xb)[1] is None
    assert m(torch.randint(59, (3, 5)))[0].shape == (3, 1, 59)
    with pytest.raises(ReslmError):
        m(torch.randint(59, (2, 33)))


def test_works_under_bf16_autocast():
    m = CharTransformer(cfg_of(64, 4, 2)).train()
    x, y = torch.randint(59, (8, 32)), torch.randint(59, (8,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, loss = m(x, y)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())


@pytest.mark.parametrize("kw", [dict(n_heads=3), dict(embed_dim=0), dict(ff_dim=-1), dict(n_layers=0),
                                dict(dropout=1.0), dict(dropout=-0.1), dict(context=0),
                                dict(vocab_size=0), dict(embed_dim=15, n_heads=5)])
def test_bad_configs_raise(kw):
    with pytest.raises(ReslmError):
        CharTransformer(TransformerConfig(**kw))


def test_sinusoidal_encoding_is_standard():
    pe = sinusoidal_encoding(32, 16)
    assert pe.shape == (32, 16)
    assert torch.allclose(pe[0], torch.tensor([0.0, 1.0] * 8))
    assert torch.allclose(pe[5, 2], torch.tensor(math.sin(5 / 10000 ** (2 / 16))))


def test_the_bench_trains_both_models_with_the_training_step():
    """The bench's transformer row: ours and the reference, each through reslm.train.train_step."""
    cfg = cfg_of(16, 2, 1)
    batches = random_windows(59, 8, 32, torch.device("cpu"), seed=0, n=2)
    for model in (CharTransformer(cfg), ReferenceTransformer(cfg)):
        before = [p.detach().clone() for p in model.parameters()]
        trainer(model, model, batches, family="tf", lr=1e-3)(2)
        assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters()) if a.dim() > 1)


def test_training_flops_formula():
    """The analytic count: a full layer's products, the last layer for the last query, the head; x3."""
    from reslm.models.transformer import training_flops_per_sample
    T, d, f, V = 32, 16, 128, 59
    layer = 6 * T * d * d + 2 * T * T * d + 2 * T * T * d + 2 * T * d * d + 4 * T * d * f
    last = 4 * T * d * d + 2 * d * d + 2 * T * d + 2 * T * d + 2 * d * d + 4 * d * f
    assert training_flops_per_sample(cfg_of(f, 8, 8)) == 3 * (7 * layer + last + 2 * d * V)
    # below "6 x parameters x tokens" plus every layer's attention products (the last layer is mostly skipped)
    approx = 6 * TABLE1[128, 8, 8] * T + 12 * T * T * d * 8
    assert 0.75 < training_flops_per_sample(cfg_of(f, 8, 8)) / approx < 1.0


def test_cpu_evaluation_runs_in_small_pieces_with_the_same_loss():
    from reslm.features import estimate_loss, eval_batch_size, feature_batches
    from reslm.models.rc import RC, RCConfig   # a model without a cap keeps its batch
    tf = CharTransformer(cfg_of(64, 4, 2, context_mode="causal"))
    assert eval_batch_size(tf, 1024, "cpu") == tf.cpu_eval_batch < 1024
    assert eval_batch_size(tf, 16, "cpu") == 16
    assert eval_batch_size(tf, 1024, "cuda") == 1024
    assert eval_batch_size(RC(RCConfig(size=20)), 1024, "cpu") == 1024
    feats = WindowFeatures(torch.randint(59, (600,)), 32)
    whole, n = estimate_loss(tf, feature_batches(feats, 1024))
    pieces, m = estimate_loss(tf, feature_batches(feats, eval_batch_size(tf, 1024, "cpu")))
    assert n == m == 568 and pieces == pytest.approx(whole, rel=1e-6)
