"""benchmarks/fused.py, the transformer's compiled-path experiment: its arithmetic equals the plain
path's (eagerly, no compile), and its hashed dropout has the asked rate, is deterministic and
independent between sites."""
import importlib.util
from pathlib import Path

import pytest
import torch

from reslm.core.errors import ReslmError
from reslm.models.transformer import CharTransformer, TransformerConfig

_spec = importlib.util.spec_from_file_location(
    "fused", Path(__file__).resolve().parents[2] / "benchmarks" / "fused.py")
fused = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fused)
DROPOUT_SITES, HashedDropout, draw_seeds = fused.DROPOUT_SITES, fused.HashedDropout, fused.draw_seeds
fused_forward, hashed_drop_mask = fused.fused_forward, fused.hashed_drop_mask


def cfg_of(ff, h, L, **kw):
    return TransformerConfig(ff_dim=ff, n_heads=h, n_layers=L, **kw)


@pytest.mark.parametrize("pointwise", [True, False])
@pytest.mark.parametrize("ff,h,L,T", [(64, 4, 4, 32), (72, 8, 3, 7), (24, 1, 2, 32), (32, 16, 2, 1)])
def test_fused_forward_eval_logits_equal_the_plain_path(ff, h, L, T, pointwise):
    """The fast path's arithmetic (eagerly, no compile: seconds) against the reference path."""
    torch.manual_seed(0)
    m = CharTransformer(cfg_of(ff, h, L)).eval()
    x, y = torch.randint(59, (16, T)), torch.randint(59, (16,))
    with torch.no_grad():
        lp, loss_p = m(x, y)
        lf, loss_f = fused_forward(m, x, y, None, pointwise)
    torch.testing.assert_close(lf, lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(loss_f, loss_p, atol=1e-5, rtol=1e-5)


def test_fused_forward_trains_without_dropout_like_the_plain_path():
    """dropout 0: the fused path's gradients equal the plain path's (same function, train mode)."""
    a = CharTransformer(cfg_of(64, 4, 2, dropout=0.0)).train()
    b = CharTransformer(cfg_of(64, 4, 2, dropout=0.0)).train()
    x, y = torch.randint(59, (8, 32)), torch.randint(59, (8,))
    a(x, y)[1].backward()
    fused_forward(b, x, y, None)[1].backward()
    for (k, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, atol=1e-5, rtol=1e-4, msg=k)


def test_hashed_dropout_rate_determinism_and_independence():
    m = CharTransformer(cfg_of(64, 4, 2))
    torch.manual_seed(3)
    s1 = draw_seeds(m)
    torch.manual_seed(3)
    assert torch.equal(draw_seeds(m), s1) and s1.shape == (2 * DROPOUT_SITES, 2)
    shape = torch.Size((1 << 20,))
    a, b = (hashed_drop_mask(shape, 0.1, s, torch.device("cpu")) for s in s1[:2])
    assert abs(a.float().mean().item() - 0.1) < 2e-3 and abs(b.float().mean().item() - 0.1) < 2e-3
    assert abs((a & b).float().mean().item() - 0.01) < 1e-3          # two sites: independent masks
    assert abs((a[1:] & a[:-1]).float().mean().item() - 0.01) < 1e-3  # neighbours: independent
    assert torch.equal(a, hashed_drop_mask(shape, 0.1, s1[0], torch.device("cpu")))
    m.train()
    with pytest.raises(ReslmError):
        fused_forward(m, torch.randint(59, (2, 32)), None, None)
    d = HashedDropout(s1)
    x = torch.ones(4, 8)
    assert torch.equal(d(x, 0.1, False), x) and d.used == 0
    d(x, 0.5, True)
    assert d.used == 1
