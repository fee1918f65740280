"""The reservoir's pass over a shard counted before a character run trains (issue 89's last case): streams or
a context that can never fit are refused with the flag that shrinks them (exit 2), nothing else trained."""
import pytest

import reslm.core.device as device
from reslm.cli import main
from reslm.core.device import WORKING_BYTES, reservoir_pass_bytes

TINY = ["--shard-chars", "512", "--epoch-samples", "64", "--epochs-per-shard", "1", "--batch-size", "32",
        "--eval-samples", "64", "--device", "cpu", "--no-progress"]


def test_streams_that_can_never_fit_are_refused_before_training(chars, tmp_path, error_line, monkeypatch):
    # this machine lets reslm hold the process's own and 2 MiB more: 1,024 streams of 256 units need more
    a, b = chars.shards[chars.test_shard]
    assert reservoir_pass_bytes("stream", b - a, 256, 16, 32, 1024, 32) > 2 * 2**20
    monkeypatch.setattr(device, "device_limit", lambda dev: WORKING_BYTES + 2 * 2**20)
    argv = ["train", "--family", "rc", "--context-mode", "stream", "--data", str(chars.path),
            "--out", str(tmp_path / "big"), *TINY]
    assert main([*argv, "--size", "256", "--streams", "1024"]) == 2
    err = error_line()
    assert err.startswith("reslm: error: the reservoir's pass over a shard needs at least")
    assert "give a smaller --streams (now 1,024;" in err
    assert not (tmp_path / "big").exists()
    argv[argv.index("--out") + 1] = str(tmp_path / "small")
    assert main([*argv, "--size", "64", "--streams", "2"]) == 0


@pytest.mark.parametrize("mode, flag", [("stream", "--streams"), ("window", "--context")])
def test_the_fix_names_the_flag_of_the_context_mode(mode, flag):
    from reslm.models import make_config
    from reslm.train.batches import pass_fix
    assert f"give a smaller {flag} (now" in pass_fix(make_config("rc", context_mode=mode))
