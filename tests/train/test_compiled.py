"""The compiled training forward (reslm.train.compiled): when it is used, and that a step through it
computes what the plain step does."""
import pytest
import torch

from reslm.models import build_model
from reslm.train.compiled import compiled_forward, wants_compile
from reslm.train.loop import train_step
from reslm.train.optim import make_optimizer
from reslm.settings import TrainConfig


def _tiny(dropout=0.1):
    model = build_model("tf", embed_dim=8, ff_dim=16, n_heads=2, n_layers=1, context=8, dropout=dropout)
    model.window_step = "plain"   # the compiled forward is the plain one's (the fused step: test_window_kernel)
    return model


def test_only_on_compiles():
    tf, rc = _tiny(), build_model("rc", size=16)
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert not wants_compile(tf, "auto", cpu) and not wants_compile(tf, "auto", cuda)
    assert not wants_compile(rc, "auto", cuda)
    assert wants_compile(rc, "on", cpu) and wants_compile(tf, "on", cuda) and not wants_compile(tf, "off", cuda)
    assert compiled_forward(tf, "auto", cpu).__func__ is type(tf).forward_features   # the plain forward


def test_compile_is_a_resource_field_checked_like_the_others():
    from reslm.core.errors import ReslmError
    from reslm.settings import field_roles

    assert field_roles()["compile"] == "resource"   # never part of a run's identity
    with pytest.raises(ReslmError, match="compile must be one of auto, on, off"):
        TrainConfig(compile="yes").validate()


def _losses(compile_, backend, steps=4):
    model = _tiny()
    tc = TrainConfig(lr=3e-3)
    opt = make_optimizer(model, tc, torch.device("cpu"))
    forward = compiled_forward(model, compile_, torch.device("cpu"), backend=backend, announce=False)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    g = torch.Generator().manual_seed(1)
    out = []
    for step in range(steps):
        rows = 16 if step < steps - 1 else 5   # the last batch of a shard-epoch is shorter
        x, y = torch.randint(0, 59, (rows, 8), generator=g), torch.randint(0, 59, (rows,), generator=g)
        torch.manual_seed(100 + step)   # the loop seeds dropout per step
        loss, _ = train_step(forward, [(x, y)], opt, scaler, lr=tc.lr, step=step)
        out.append(loss.item())
    return out, [p.detach().clone() for p in model.parameters()]


def test_a_compiled_step_computes_what_the_plain_step_does():
    """Traced and differentiated by torch.compile (backend aot_eager: no kernels generated), with
    dropout on and a shorter last batch: the same losses and weights up to float rounding. The traced
    backward may sum a gradient in another order than eager autograd: on some CPUs a weight then
    differs in its last bits, never by more."""
    plain, w_plain = _losses("off", None)
    compiled, w_compiled = _losses("on", "aot_eager")
    assert compiled == pytest.approx(plain, rel=1e-6)
    for a, b in zip(w_plain, w_compiled):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-8)


@pytest.mark.slow
def test_an_inductor_compiled_step_agrees_with_the_plain_step_to_rounding():
    plain, w_plain = _losses("off", None)
    compiled, w_compiled = _losses("on", None)
    assert compiled == pytest.approx(plain, abs=1e-5)
    # Adam turns the rounding of a near-zero gradient into a step of up to lr (3e-3): weights agree to that
    assert max((a - b).abs().max().item() for a, b in zip(w_plain, w_compiled)) < 2 * 3e-3 * 4
