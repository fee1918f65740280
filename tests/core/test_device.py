"""bf16 only where it is fast: both branches of the check, forced with RESLM_BF16 or by
monkeypatching the CPU probe, so that the tests hold on any CPU (with or without bf16 instructions)."""
import os

import pytest
import torch

from reslm.core import device
from reslm.core.device import bf16_fast, bf16_status, resolve_dtype, resolve_precision
from reslm.core.errors import ReslmError

CPU = torch.device("cpu")
SLOW = (False, "AVX2 without bf16 instructions")


@pytest.fixture(autouse=True)
def fresh_probe(monkeypatch):
    """No RESLM_BF16 from the environment, and no cached answer from another test."""
    monkeypatch.delenv("RESLM_BF16", raising=False)
    probe = device.cpu_bf16
    probe.cache_clear()
    yield
    probe.cache_clear()


def slow_cpu(monkeypatch):
    monkeypatch.setattr(device, "cpu_bf16", lambda: SLOW)


def fast_cpu(monkeypatch):
    monkeypatch.setattr(device, "cpu_bf16", lambda: (True, ""))


@pytest.mark.parametrize("value,fast", [("1", True), ("0", False)])
def test_env_var_decides_without_probing(monkeypatch, value, fast):
    monkeypatch.setenv("RESLM_BF16", value)
    monkeypatch.setattr(device, "bf16_matmul_speed", lambda: pytest.fail("probed despite RESLM_BF16"))
    assert bf16_fast(CPU) is fast and bf16_fast("cpu") is fast


def test_env_var_must_be_0_or_1(monkeypatch):
    monkeypatch.setenv("RESLM_BF16", "yes")
    with pytest.raises(ReslmError, match="RESLM_BF16"):
        bf16_fast(CPU)


def test_avx2_without_bf16_flags_is_slow_without_probing(monkeypatch):
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    monkeypatch.setattr(device, "cpu_bf16_flags", lambda: set())
    monkeypatch.setattr(device.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(device, "bf16_matmul_speed", lambda: pytest.fail("probed an AVX2 CPU"))
    assert bf16_status(CPU) == SLOW


@pytest.mark.parametrize("speed,fast", [(0.01, False), (0.49, False), (0.6, True), (3.0, True)])
def test_cpu_with_bf16_instructions_is_confirmed_by_the_probe(monkeypatch, speed, fast):
    calls = []
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.setattr(device, "cpu_bf16_flags", lambda: {"avx512_bf16"})
    monkeypatch.setattr(device, "bf16_matmul_speed", lambda: calls.append(1) or speed)
    assert bf16_fast(CPU) is fast and bf16_fast(CPU) is fast
    assert calls == [1]   # probed once per process
    if not fast:
        assert "fp32 speed" in bf16_status(CPU)[1]


def test_the_real_probe_runs_and_is_cached():
    speed = device.bf16_matmul_speed(n=64, reps=2)
    assert speed > 0
    first = bf16_status(CPU)
    assert isinstance(first[0], bool) and bf16_status(CPU) == first
    assert device.cpu_bf16.cache_info().hits >= 1


def test_resolve_dtype_passes_float32_through(monkeypatch, capsys):
    slow_cpu(monkeypatch)
    assert resolve_dtype("float32", CPU, explicit=True, what="reservoir states") == torch.float32
    assert capsys.readouterr().err == ""


def test_resolve_dtype_keeps_bf16_where_fast(monkeypatch, capsys):
    fast_cpu(monkeypatch)
    assert resolve_dtype("bfloat16", CPU, explicit=True, what="reservoir states") == torch.bfloat16
    assert capsys.readouterr().err == ""


def test_resolve_dtype_falls_back_with_one_line_when_not_asked_for(monkeypatch, capsys):
    slow_cpu(monkeypatch)
    assert resolve_dtype("bfloat16", CPU, explicit=False, what="reservoir states") == torch.float32
    assert capsys.readouterr().err == ("reslm: bf16 is slow on this CPU (AVX2 without bf16 instructions); "
                                       "using float32 for reservoir states\n")


def test_resolve_dtype_refuses_an_explicit_bf16_where_slow(monkeypatch):
    slow_cpu(monkeypatch)
    with pytest.raises(ReslmError) as e:
        resolve_dtype("bf16", CPU, explicit=True, what="reservoir states")
    msg = str(e.value)
    assert "\n" not in msg and "AVX2 without bf16 instructions" in msg and "use float32 for reservoir states" in msg
    with pytest.raises(ReslmError, match="unknown dtype"):
        resolve_dtype("int8", CPU, explicit=True, what="x")


def test_resolve_precision_consults_bf16_fast(monkeypatch, capsys):
    fast_cpu(monkeypatch)
    assert resolve_precision("bf16", CPU) == "bf16"
    assert resolve_precision("auto", CPU) == "fp32"
    slow_cpu(monkeypatch)
    with pytest.raises(ReslmError, match="use precision fp32"):
        resolve_precision("bf16", CPU)
    assert resolve_precision("bf16", CPU, explicit=False) == "fp32"
    assert "using precision fp32 for training" in capsys.readouterr().err
    assert resolve_precision("fp32", CPU) == "fp32"
    with pytest.raises(ReslmError):
        resolve_precision("fp16", CPU)


def test_env_var_forces_bf16_even_on_a_slow_cpu(monkeypatch):
    slow_cpu(monkeypatch)
    monkeypatch.setenv("RESLM_BF16", "1")
    assert resolve_precision("bf16", CPU) == "bf16"
    assert resolve_dtype("bfloat16", CPU, explicit=True, what="states") == torch.bfloat16


def test_bf16_reservoir_refused_where_bf16_is_slow(monkeypatch):
    """An explicit bfloat16 reservoir on a CPU without fast bf16 is one clear error, not a 400x crawl."""
    from reslm.models.load import load_model
    from reslm.core.errors import ReslmError
    cfg = dict(family="laerc", model=dict(vocab_size=11, dim=8, n_layers=1, context=8, r_mult=2,
                                          reservoir_dtype="bfloat16"))
    monkeypatch.setenv("RESLM_BF16", "0")
    with pytest.raises(ReslmError, match="slow here"):
        load_model(cfg)
    monkeypatch.setenv("RESLM_BF16", "1")
    assert load_model(cfg) is not None


def test_cpu_name_says_the_model_and_the_kernel_level(monkeypatch):
    level = f"({torch.backends.cpu.get_cpu_capability()})"
    assert device.cpu_name().endswith(level) and device.cpu_name() != level
    real_open = open

    def no_cpuinfo(path, *a, **k):                       # a machine without /proc/cpuinfo
        if path == "/proc/cpuinfo":
            raise OSError("no such file")
        return real_open(path, *a, **k)

    device.cpu_name.cache_clear()
    monkeypatch.setattr("builtins.open", no_cpuinfo)
    try:
        assert device.cpu_name().endswith(level) and device.cpu_name() != level
    finally:
        device.cpu_name.cache_clear()


def test_the_state_check_counts_held_out_states_and_the_process_and_exits_75(tmp_path, monkeypatch, capsys):
    """Reservoir states that fit only without their held-out part or the process's own memory are refused
    with OutOfMemory, which the CLI turns into exit status 75 (try again when the machine is free)."""
    from reslm.cli import main
    from reslm.core import claims
    from reslm.core.errors import OutOfMemory
    fast_cpu(monkeypatch)
    monkeypatch.setattr(claims, "CLAIMS", tmp_path / "claims")          # no other process's claims
    row = 1000 * 2                                           # 1,000 bfloat16 values per state
    avail = int((10**6 * row + device.WORKING_BYTES) / 0.9) + 1
    monkeypatch.setattr(device, "available_memory", lambda d: avail)
    assert device.state_dtypes("bfloat16", CPU, 1000, 900_000, 100_000)[0] == torch.bfloat16
    with pytest.raises(OutOfMemory, match="held-out states"):
        device.state_dtypes("bfloat16", CPU, 1000, 900_000, 100_000, heldout_rows=1_000)
    monkeypatch.setattr("reslm.cli._threads", lambda args: (_ for _ in ()).throw(OutOfMemory("states need more")))
    assert main(["presets"]) == 75
    assert capsys.readouterr().err == "reslm: error: states need more\n"


def test_memory_another_training_has_claimed_and_not_yet_allocated_is_not_counted_as_free(tmp_path, monkeypatch):
    """Two trainings started together: the second's check counts the first's claim less what the first
    holds already; a claim goes with its process, and this process's own claim is never counted."""
    import subprocess
    import sys
    from reslm.core import claims
    from reslm.core.errors import OutOfMemory
    fast_cpu(monkeypatch)
    monkeypatch.setattr(claims, "CLAIMS", tmp_path / "claims")
    other = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert claims._resident(other.pid) > 0                          # read from /proc
        monkeypatch.setattr(claims, "_resident", lambda pid: 2**30)     # it holds 1 GiB ...
        (tmp_path / "claims").mkdir()
        (tmp_path / "claims" / str(other.pid)).write_text(str(11 * 2**30))   # ... of 11: 10 GiB to come
        assert claims.unclaimed() == 10 * 2**30
        monkeypatch.setattr(device, "available_memory", lambda d: 12 * 2**30)
        with pytest.raises(OutOfMemory, match=r"but 2\.0 GiB is available"):
            device.state_dtypes("bfloat16", CPU, 1000, 900_000, 100_000)      # 2.9 GiB with the process's own
        assert not (tmp_path / "claims" / str(os.getpid())).exists()      # refused: nothing claimed
        device.state_dtypes("bfloat16", CPU, 100, 900_000, 100_000)           # 1.2 GiB: fits, and is claimed
        assert int((tmp_path / "claims" / str(os.getpid())).read_text()) == 10**6 * 200 + device.WORKING_BYTES
        assert claims.unclaimed() == 10 * 2**30                           # its own claim is not counted
        claims.release()
        assert not (tmp_path / "claims" / str(os.getpid())).exists()
    finally:
        other.stdin.close()
        other.wait()
    assert claims.unclaimed() == 0 and not (tmp_path / "claims" / str(other.pid)).exists()   # gone with it
