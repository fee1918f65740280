"""The reservoir recurrence's float32 GEMM through oneDNN (reslm.core.device.cpu_gemm): which library is
chosen, and the same states as torch.addmm's."""
import pytest
import torch

import reslm.core.device as device
import reslm.reservoir.esn as esn
from reslm.core.errors import ReslmError
from reslm.reservoir import ESN, ESNConfig


@pytest.fixture
def gemm(monkeypatch):
    """Choose the library (cpu_gemm is decided once per process: its cache is cleared around the test)."""
    def use(name):
        monkeypatch.setenv("RESLM_GEMM", name)
        device.cpu_gemm.cache_clear()
    device.cpu_gemm.cache_clear()
    yield use
    monkeypatch.delenv("RESLM_GEMM", raising=False)
    device.cpu_gemm.cache_clear()


def test_the_library_is_chosen_by_the_blas_and_the_vendor_never_by_a_timing(monkeypatch, gemm):
    monkeypatch.delenv("RESLM_GEMM", raising=False)
    monkeypatch.setattr(torch.backends.mkl, "is_available", lambda: True)
    for vendor, want in (("GenuineIntel", "torch"), ("AuthenticAMD", "onednn"), (None, "torch")):
        monkeypatch.setattr(device, "cpu_vendor", lambda v=vendor: v)
        device.cpu_gemm.cache_clear()
        assert device.cpu_gemm()[0] == (want if device.onednn_available() else "torch"), vendor
    monkeypatch.setattr(torch.backends.mkl, "is_available", lambda: False)
    device.cpu_gemm.cache_clear()
    assert device.cpu_gemm() == ("torch", "torch's BLAS is not MKL")
    gemm("torch")
    assert device.cpu_gemm() == ("torch", "RESLM_GEMM=torch")
    gemm("openblas")
    with pytest.raises(ReslmError, match="RESLM_GEMM must be one of torch, onednn"):
        device.cpu_gemm()


@pytest.mark.skipif(not device.onednn_available(), reason="this torch has no oneDNN inner product")
@pytest.mark.parametrize("backend,leak", [("sigmoid", 1.0), ("loop", 1.0), ("blocked", 0.6)])
def test_onednn_states_equal_the_torch_ones(monkeypatch, gemm, backend, leak):
    """Every recurrence kernel gives the same states (to float32 rounding) through either library, the
    input term included, with and without the caller's work buffer."""
    monkeypatch.setattr(esn, "ONEDNN_MIN_MACS", 0)
    monkeypatch.setattr(esn, "BLOCK_ROWS", 3)
    res = ESN(ESNConfig(size=48, input_dim=8, seed=2, leak_rate=leak, backend=backend, bias_scaling=0.3))
    u = torch.randn(7, 11, 8, generator=torch.Generator().manual_seed(1))
    work = torch.empty(12 * 7 * 48)
    out = {}
    real, routed = esn.onednn_weight, []
    monkeypatch.setattr(esn, "onednn_weight", lambda *a: routed.append(real(*a)) or routed[-1])
    for name in ("torch", "onednn"):
        gemm(name)
        routed.clear()
        with torch.no_grad():
            out[name] = res(u)[0].clone(), res(u, work=work)[0].clone()
        assert routed and all((W is not None) == (name == "onednn") for W in routed)   # recurrence and input term
    for a, b in zip(out["torch"], out["onednn"]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_small_or_non_float32_steps_keep_torch(monkeypatch, gemm):
    gemm("onednn") if device.onednn_available() else None
    W_T = torch.randn(40, 40)
    assert esn.onednn_weight(torch.zeros(2, 40), W_T, rows=2) is None                  # under ONEDNN_MIN_MACS
    monkeypatch.setattr(esn, "ONEDNN_MIN_MACS", 0)
    assert esn.onednn_weight(torch.zeros(2, 40, dtype=torch.bfloat16), W_T, rows=2) is None
    if device.onednn_available():
        assert torch.equal(esn.onednn_weight(torch.zeros(2, 40), W_T, rows=2), W_T.t())
