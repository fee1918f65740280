"""Issue 23.7, messages that say what went wrong: an unknown preset before unknown flags, a long path
shortened (not the reason), a full disk naming the file, an out-of-range integer naming its flag, counts
with a stated maximum, and a file that is not a .npy array. Each is one line and exit 2."""
from __future__ import annotations

import contextlib
import errno
import re
import resource
import signal
from pathlib import Path

import numpy as np
import pytest

import reslm.core.errors
from reslm.cli import main
from reslm.core.errors import MAX_LINE, ReslmError, describe, write_error
from reslm.reservoir.recorded import StateFile, load_npy


def one_error(capsys) -> str:
    """The one error line on stderr ("reslm: error: ..." or argparse's "reslm CMD: error: ..."), no traceback
    (progress lines, "reslm data: ...", aside)."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("reslm data: ")]
    assert len(lines) == 1 and re.match(r"reslm( [a-z]+)*: error: ", lines[0]) and "Traceback" not in err, err
    return lines[0]


def test_an_unknown_preset_is_named_before_its_family_flags(capsys):
    assert main(["train", "--preset", "rc-9999", "--shard-chars", "20000"]) == 2
    assert one_error(capsys) == "reslm: error: unknown preset 'rc-9999' (see `reslm presets`)"
    assert main(["train", "--preset=rc-9999"]) == 2
    assert "unknown preset 'rc-9999'" in one_error(capsys)


def test_a_long_path_is_shortened_and_the_reason_kept(chars, tmp_path, capsys):
    out = tmp_path / ("x" * 300)
    assert main(["train", "--out", str(out), "--family", "rc", "--data", str(chars.path), "--no-progress"]) == 2
    line = one_error(capsys)
    assert line.endswith(": file name too long") and "..." in line and len(line) <= len("reslm: error: ") + MAX_LINE
    assert describe(OSError(errno.ENAMETOOLONG, "File name too long", "/r/" + "y" * 400)).endswith(
        "yyy: file name too long")
    assert len(describe(ValueError("x" * 1000))) <= MAX_LINE


@contextlib.contextmanager
def file_size_limit(n: int):
    """Writes past n bytes of any file fail (RLIMIT_FSIZE): numpy and torch then report the short write
    exactly as on a full disk ("N requested and M written", "unexpected pos")."""
    old_limit, old_handler = resource.getrlimit(resource.RLIMIT_FSIZE), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (n, old_limit[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)


@pytest.fixture
def full_disk(monkeypatch):
    """The file system reads as full (statvfs), as it is when a write stops short for want of space."""
    monkeypatch.setattr(reslm.core.errors, "_low_on_space", lambda folder: True)


def test_a_full_disk_in_data_prepare_names_the_file(tmp_path, capsys, full_disk):
    src = tmp_path / "a.txt"
    src.write_text("to be or not to be " * 20_000)   # 380,000 characters: tokens.bin is 380,000 bytes
    with file_size_limit(200_000):
        code = main(["data", "text", str(src), "--name", "t", "--root", str(tmp_path / "data")])
    assert code == 2
    line = one_error(capsys)
    assert re.fullmatch(r"reslm: error: could not write .*/data/\.t\.tmp-\w+/tokens\.bin: no space left on device",
                        line), line
    assert list((tmp_path / "data").iterdir()) == []                # nothing half-written is left


def test_a_full_disk_in_substrate_export_names_the_file(chars, tmp_path, capsys, full_disk):
    with file_size_limit(4_000):   # embedding.npy fits, tokens.npy (4 bytes x ~7,000 tokens) does not
        code = main(["substrate", "export", "--data", str(chars.path), "--out", str(tmp_path / "drive"),
                     "--no-progress"])
    assert code == 2
    line = one_error(capsys)
    assert re.fullmatch(r"reslm: error: could not write .*/tokens\.npy: no space left on device", line), line
    assert not (tmp_path / "drive").exists()


def test_short_writes_read_as_what_they_are(tmp_path, monkeypatch):
    """numpy's and torch's short-write messages: "no space left on device" when the file system is
    full, else the short write itself; an OSError keeps its own reason. The file is always named."""
    f = tmp_path / "x.bin"
    with file_size_limit(1_000), pytest.raises(OSError) as e:
        np.zeros(5_000, np.uint8).tofile(f)
    assert str(e.value) == "5000 requested and 1000 written"
    assert str(write_error(f, e.value)) == f"could not write {f}: only 1000 of 5000 items written"
    torch_error = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    assert str(write_error(f, torch_error)) == f"could not write {f}: unexpected pos 704 vs 598"
    assert str(write_error(f, OSError(errno.ENOSPC, "No space left on device"))) == \
        f"could not write {f}: no space left on device"
    assert write_error(f, ValueError("not a write")) is None
    monkeypatch.setattr(reslm.core.errors, "_low_on_space", lambda folder: True)
    assert str(write_error(f, e.value)) == f"could not write {f}: no space left on device"
    assert str(write_error(f, torch_error)) == f"could not write {f}: no space left on device"


@pytest.mark.parametrize("argv, flag, limit", [
    (["train", "--family", "rc", "--seed", "99999999999999999999999"], "--seed", "0 to 9,223,372,036,854,775,807"),
    (["train", "--family", "rc", "--seed", "-1"], "--seed", "0 to 9,223,372,036,854,775,807"),
    (["train", "--family", "rc", "--size", "99999999999999999999999"], "--size", "to 9,223,372,036,854,775,807"),
    (["generate", "RUN", "--prompt", "a", "--seed", "18446744073709551616"], "--seed", "0 to 9,223,372,036,854,775,807"),
    (["substrate", "simulate", "D", "--out", "s.npy", "--noise-seed", "-3"], "--noise-seed", "0 to 9,"),
])
def test_an_out_of_range_integer_names_its_flag(argv, flag, limit, capsys):
    assert main(argv) == 2
    line = one_error(capsys)
    assert f"argument {flag}: " in line and "is out of range (an integer from " in line and limit in line, line


@pytest.mark.parametrize("argv, flag, limit", [
    (["generate", "RUN", "--prompt", "a", "--length", "100000000000000000000"], "--length", "0 to 1,000,000"),
    (["eval", "RUN", "--length", "1000001"], "--length", "1 to 1,000,000"),
    (["search", "--trials", "100000000000000000000"], "--trials", "1 to 100,000"),
    (["train", "--family", "gpt", "--max-steps", "100000000000000000000"], "--max-steps", "0 to 1,000,000,000"),
    (["train", "--family", "rc", "--cycles", "100000000000000000000"], "--cycles", "0 to 10,000"),
    (["train", "--family", "rc", "--epochs-per-shard", "100000000000000000000"], "--epochs-per-shard", "0 to 10,000"),
])
def test_endless_counts_are_refused_with_their_maximum(argv, flag, limit, capsys):
    assert main(argv) == 2
    line = one_error(capsys)
    assert f"argument {flag}: " in line and f"out of range (an integer from {limit})" in line, line


def test_a_file_that_is_not_npy_is_one_line(tmp_path, capsys):
    junk = tmp_path / "states.npy"
    junk.write_bytes(np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8).tobytes())
    pickled = tmp_path / "pickled.npy"
    np.save(pickled, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    torn = tmp_path / "torn.npy"
    np.save(torn, np.zeros((4, 3), np.float32))
    torn.write_bytes(torn.read_bytes()[:-8])
    with pytest.raises(ReslmError, match=r"states.npy is not a valid .npy file \(it does not start with the .npy magic"):
        StateFile(junk)
    with pytest.raises(ReslmError, match=r"pickled.npy is not a valid .npy file \(it holds pickled Python objects"):
        load_npy(pickled)
    with pytest.raises(ReslmError, match=r"torn.npy is not a valid .npy file \("):
        StateFile(torn)
    # through the command line: `reslm substrate import` of random bytes
    drive = tmp_path / "drive"
    assert main(["substrate", "export", "--data", str(_tiny(tmp_path)), "--out", str(drive), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["substrate", "import", str(junk), "--drive", str(drive), "--out", str(tmp_path / "sub"),
                 "--no-progress"]) == 2
    line = one_error(capsys)
    assert line == f"reslm: error: {junk} is not a valid .npy file (it does not start with the .npy magic bytes)"
    assert "allow_pickle" not in line


def _tiny(tmp_path: Path) -> Path:
    from reslm.data import prepare_text
    (tmp_path / "t.txt").write_text("to be or not to be, that is the question. " * 50)
    return prepare_text([tmp_path / "t.txt"], tmp_path / "data", name="t", verbose=False).path
