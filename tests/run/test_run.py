"""The run directory (reslm.run): lock, torn metrics lines, strict JSON, failed writes, damaged files,
bad --out paths, and errors.describe."""
import errno
import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

import reslm.core.errors
from reslm.core import files
from reslm import run as R
from reslm.run import lock as run_lock
from reslm.core.errors import ReslmError, RunInUse, describe

ROOT = Path(__file__).resolve().parents[2]
CFG = dict(family="rc", preset=None, model=dict(reservoir=8), train=dict(lr=1e-3), data=dict(path="/x"))


class NotATensor:
    pass


def one_line(e) -> str:
    msg = str(e.value if hasattr(e, "value") else e)
    assert msg and "\n" not in msg, repr(msg)
    return msg


# --------------------------------------------------------------------------------------------- lock

# the child processes stub torch out: the lock needs none of it, and importing it takes seconds
STUB = "import sys, types; sys.modules['torch'] = types.ModuleType('torch')\n"
HOLDER = STUB + """
import sys
from reslm.run import lock_run
with lock_run(sys.argv[1]):
    print("locked", flush=True)
    sys.stdin.read()    # held until the parent kills it (or closes stdin)
"""


def test_lock_second_process_refused_and_killed_holder_leaves_no_stale_lock(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path), "train", "--out", "x"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert p.stdout.readline().strip() == "locked"
        with pytest.raises(RunInUse) as e:
            with R.lock_run(tmp_path):
                pass
        msg = one_line(e)
        assert isinstance(e.value, ReslmError)
        assert f"is in use by pid {p.pid} (" in msg and "train --out x since " in msg
        assert msg.startswith(str(tmp_path)) and msg.endswith("; wait for it or stop it")
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
        p.stdout.close()
        p.stdin.close()
    assert (tmp_path / R.LOCK).exists()  # the file stays; the kernel dropped the flock
    with R.lock_run(tmp_path) as d:
        assert d == tmp_path
        info = json.loads((tmp_path / R.LOCK).read_text())
        assert info["pid"] == os.getpid()


def test_lock_refuses_another_process_while_held(tmp_path):
    code = STUB + "import sys\nfrom reslm.run import lock_run\nwith lock_run(sys.argv[1]): pass"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with R.lock_run(tmp_path):
        r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env)
    assert r.returncode != 0 and "RunInUse" in r.stderr and f"in use by pid {os.getpid()}" in r.stderr
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr


def test_lock_nested_in_one_process_and_released(tmp_path):
    with R.lock_run(tmp_path):
        with R.lock_run(tmp_path / "." / ""):  # same folder, spelled differently
            pass
        assert run_lock._held  # still held by the outer block
    assert not run_lock._held
    with R.lock_run(tmp_path):  # and can be taken again
        pass


def test_lock_missing_dir_and_create(tmp_path):
    with pytest.raises(ReslmError, match="does not exist"):
        with R.lock_run(tmp_path / "nope"):
            pass
    assert not (tmp_path / "nope").exists()
    with R.lock_run(tmp_path / "runs" / "sweep", create=True) as d:
        assert d.is_dir()


def test_lock_cleans_stale_temps(tmp_path):
    (tmp_path / R.CONFIG).write_text(json.dumps(CFG))                 # a run folder
    (tmp_path / ".checkpoint.pt.abc12_3x.tmp").write_bytes(b"half")    # atomic_write's names (mkstemp: 8 chars)
    (tmp_path / ".metrics.jsonl.x1y2z3w4.tmp").write_text("x")
    (tmp_path / ".eval-noise0.1.json.abcdefgh.tmp").write_text("x")
    old = tmp_path / ".run1.tmp-abcd1234"                              # create_run_dir's, older than a minute
    old.mkdir()
    (old / "config.json").write_text("{}")
    os.utime(old, (0, 0))
    young = tmp_path / ".run2.tmp-abcd1234"
    young.mkdir()
    user_dir = tmp_path / ".backup.tmp-20240101"                       # the pattern, but a user's files in it
    user_dir.mkdir()
    (user_dir / "thesis.tex").write_text("t")
    os.utime(user_dir, (0, 0))
    keep = ["checkpoint.pt", "notes.tmp", ".notes.tmp", ".thesis.tex.abcd1234.tmp", ".checkpoint.pt.ab12.tmp"]
    for k in keep:
        (tmp_path / k).write_text("k")
    with R.lock_run(tmp_path):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [".lock", R.CONFIG, ".run2.tmp-abcd1234", ".backup.tmp-20240101", *keep])
    assert (user_dir / "thesis.tex").read_text() == "t"
    assert R.clean_stale_temps(tmp_path) == []
    assert R.clean_stale_temps(tmp_path / "missing") == []


def test_lock_never_removes_anything_from_a_folder_reslm_did_not_make(tmp_path):
    """A folder that is not a run (no config.json, no budget.json, no earlier .lock) keeps every file,
    even ones named as reslm names its temp files."""
    names = [".notes.tmp", ".checkpoint.pt.abcd1234.tmp", ".config.json.zzzzzzzz.tmp", "draft.tmp"]
    for n in names:
        (tmp_path / n).write_text(n)
    for d in (".backup.tmp-20240101", ".run.tmp-abcdefgh"):
        (tmp_path / d).mkdir()
        (tmp_path / d / ("thesis.tex" if d.startswith(".backup") else R.CONFIG)).write_text("mine")
        os.utime(tmp_path / d, (0, 0))
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    with R.lock_run(tmp_path):
        pass
    assert R.clean_stale_temps(tmp_path) == []
    after = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.name != R.LOCK)
    assert after == before


def test_deleting_the_lock_file_does_not_release_the_lock(tmp_path):
    """The lock is on the folder itself: removing RUN/.lock under a live holder lets no second writer in."""
    code = STUB + "import sys\nfrom reslm.run import lock_run\nwith lock_run(sys.argv[1]): pass"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with R.lock_run(tmp_path):
        (tmp_path / R.LOCK).unlink()
        r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env)
        assert r.returncode != 0 and "RunInUse" in r.stderr and "is in use" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr


# ------------------------------------------------------------------------------------------ metrics

def test_rows_of_one_kind_are_read_without_the_others(tmp_path):
    """read_metrics(folder, "eval"): the evaluation rows (or of several kinds), however the JSON is spaced; a row that only names
    "eval" in a value of another kind is not one; the step rows are not parsed (a bad one goes unseen)."""
    (tmp_path / R.METRICS).write_text('{"kind": "step", "step": 1, "eval_seconds": 2}\n{"kind":"eval","step":1}\n'
                                      'not json at all\n{"kind": "weights", "note": "eval"}\n'
                                      '{"step": 2, "kind": "eval"}\n')
    assert R.read_metrics(tmp_path, "eval") == [dict(kind="eval", step=1), dict(step=2, kind="eval")]
    assert [r["kind"] for r in R.read_metrics(tmp_path, "eval", "weights")] == ["eval", "weights", "eval"]
    with pytest.raises(ReslmError, match="line 3 is not a JSON row"):
        R.read_metrics(tmp_path)


def test_torn_last_line_dropped_with_warning_and_log_continues(tmp_path, capsys):
    path = tmp_path / R.METRICS
    path.write_text('{"kind": "step", "step": 1}\n{"kind": "step", "step": 2}\n{"kind": "st')
    assert [r["step"] for r in R.read_metrics(tmp_path)] == [1, 2]
    err = capsys.readouterr().err
    assert err.strip() == f"reslm: warning: dropped a cut-off last line of {path}"
    log = R.MetricsLog(tmp_path)
    assert log.rows == 2
    assert "cut-off" in capsys.readouterr().err
    log.write(dict(kind="step", step=3))
    assert [r["step"] for r in R.read_metrics(tmp_path)] == [1, 2, 3]
    assert capsys.readouterr().err == ""  # repaired: no more warnings
    log.truncate(1)
    assert log.rows == 1 and R.read_metrics(tmp_path) == [dict(kind="step", step=1)]


def test_torn_line_of_nul_bytes_and_bad_utf8(tmp_path, capsys):
    path = tmp_path / R.METRICS
    path.write_bytes(b'{"a": 1}\n\x00\x00\x00\x00')
    assert R.read_metrics(tmp_path) == [{"a": 1}]
    path.write_bytes(b'{"a": 1}\n{"b": "\xc3')
    assert R.MetricsLog(tmp_path).rows == 1
    assert path.read_bytes() == b'{"a": 1}\n'
    assert capsys.readouterr().err.count("cut-off") == 2


def test_complete_last_line_without_newline_is_kept(tmp_path, capsys):
    (tmp_path / R.METRICS).write_text('{"a": 1}\n{"a": 2}')
    log = R.MetricsLog(tmp_path)
    assert log.rows == 2
    log.write({"a": 3})
    assert [r["a"] for r in R.read_metrics(tmp_path)] == [1, 2, 3]
    assert capsys.readouterr().err == ""


def test_bad_middle_line_raises_with_line_number(tmp_path):
    (tmp_path / R.METRICS).write_text('{"a": 1}\n\n{"a": 2\n{"a": 3}\n')
    with pytest.raises(ReslmError) as e:
        R.read_metrics(tmp_path)
    assert f"{tmp_path / R.METRICS} line 3 is not a JSON row" in one_line(e)
    with pytest.raises(ReslmError, match="line 3"):
        R.MetricsLog(tmp_path)


def test_metrics_write_refuses_nan_and_writes_nothing(tmp_path):
    log = R.MetricsLog(tmp_path)
    log.write(dict(kind="step", loss=1.5))
    with pytest.raises(ReslmError) as e:
        log.write(dict(kind="step", loss=float("nan")))
    assert "loss=nan" in one_line(e)
    with pytest.raises(ReslmError, match=r"extra\.b\[1\]=inf"):
        log.write(dict(kind="x", extra=dict(b=[1.0, float("inf")])))
    assert log.rows == 1 and R.read_metrics(tmp_path) == [dict(kind="step", loss=1.5)]


def test_metrics_write_disk_full_leaves_no_half_row(tmp_path, monkeypatch):
    log = R.MetricsLog(tmp_path)
    log.write({"a": 1})
    before = (tmp_path / R.METRICS).read_bytes()
    real_write = os.write

    def half_then_full(fd, data):
        if len(data) > 3:
            return real_write(fd, bytes(data[:3]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(ReslmError) as e:
        log.write({"a": 2, "b": "long enough"})
    monkeypatch.undo()
    assert one_line(e) == f"could not write {tmp_path / R.METRICS}: no space left on device"
    assert (tmp_path / R.METRICS).read_bytes() == before and log.rows == 1


# --------------------------------------------------------------------------------------- json, ckpt

def test_write_json_refuses_nan_naming_the_key(tmp_path):
    with pytest.raises(ReslmError) as e:
        files.write_json(tmp_path / "s.json", dict(fits=dict(rc=dict(r2=float("nan")))))
    assert "fits.rc.r2 is nan" in one_line(e)
    with pytest.raises(ReslmError, match=r"rows\[0\] is -inf"):
        files.write_json(tmp_path / "s.json", dict(rows=[float("-inf")]))
    assert list(tmp_path.iterdir()) == []
    files.write_json(tmp_path / "s.json", dict(a=None, b=1.5))
    assert json.loads((tmp_path / "s.json").read_text()) == dict(a=None, b=1.5)


def test_save_checkpoint_disk_full_keeps_previous(tmp_path, monkeypatch):
    R.save_checkpoint(tmp_path, dict(step=1, w=torch.ones(3)))
    before = (tmp_path / R.CHECKPOINT).read_bytes()

    def full(obj, f):
        f.write(b"PK\x03\x04partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(ReslmError) as e:
        R.save_checkpoint(tmp_path, dict(step=2, w=torch.zeros(3)))
    assert one_line(e) == f"could not write {tmp_path / R.CHECKPOINT}: no space left on device"

    def torch_full(obj, f):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    monkeypatch.setattr(torch, "save", torch_full)
    monkeypatch.setattr(reslm.core.errors, "_low_on_space", lambda folder: True)
    with pytest.raises(ReslmError) as e:
        R.save_checkpoint(tmp_path, dict(step=2))
    assert one_line(e) == f"could not write {tmp_path / R.CHECKPOINT}: no space left on device"
    monkeypatch.undo()
    assert (tmp_path / R.CHECKPOINT).read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [R.CHECKPOINT]
    assert R.load_checkpoint(tmp_path)["step"] == 1


def test_save_checkpoint_interrupt_removes_temp(tmp_path, monkeypatch):
    def interrupted(obj, f):
        f.write(b"x")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        R.save_checkpoint(tmp_path, {})
    assert list(tmp_path.iterdir()) == []


def test_load_checkpoint_damaged_files_give_one_line(tmp_path):
    assert R.load_checkpoint(tmp_path) is None
    ck = tmp_path / R.CHECKPOINT
    R.save_checkpoint(tmp_path, dict(step=3, w=torch.arange(1000.0)))
    good = ck.read_bytes()
    assert R.load_checkpoint(tmp_path)["step"] == 3
    cases = {b"": "the file is empty", b"hello world": "not a PyTorch checkpoint",
             pickle.dumps({"a": 1}): "not a PyTorch checkpoint", good[: len(good) // 2]: "truncated or damaged",
             good[:10]: "truncated or damaged"}
    for data, want in cases.items():
        ck.write_bytes(data)
        with pytest.raises(ReslmError) as e:
            R.load_checkpoint(tmp_path)
        assert one_line(e).startswith(f"cannot read checkpoint {ck}: ") and want in str(e.value), (data[:20], e.value)
    torch.save(dict(a=NotATensor()), ck)
    with pytest.raises(ReslmError, match="objects other than tensors"):
        R.load_checkpoint(tmp_path)
    torch.save([1, 2], ck)
    with pytest.raises(ReslmError, match="not a reslm checkpoint"):
        R.load_checkpoint(tmp_path)


# ------------------------------------------------------------------------------------------- config

@pytest.mark.parametrize("change, want", [
    (dict(family=3), "'family' must be a non-empty string"),
    (dict(model=None), "'model' must be an object"),
    (dict(train="abc"), "'train' must be an object"),
    (dict(data=None), "'data' must be an object"),
    (dict(data={}), "'data.path' must be a string"),
    (dict(preset=5), "'preset' must be a string or null"),
])
def test_read_config_bad_types(tmp_path, change, want):
    (tmp_path / R.CONFIG).write_text(json.dumps({**CFG, **change}))
    with pytest.raises(ReslmError) as e:
        R.read_config(tmp_path)
    assert one_line(e) == f"{tmp_path / R.CONFIG} is not a valid run config: {want}"


def test_read_config_missing_keys_and_non_json(tmp_path):
    for text, want in [(json.dumps({k: v for k, v in CFG.items() if k != "data"}), "'data' is missing"),
                       ("[1, 2]", "must be a JSON object"), ("", "the file is empty"),
                       ("{", "not JSON"), ('{"family": "rc"', "not JSON")]:
        (tmp_path / R.CONFIG).write_text(text)
        with pytest.raises(ReslmError) as e:
            R.read_config(tmp_path)
        assert want in one_line(e)
    (tmp_path / R.CONFIG).write_bytes(b"\xff\xfe")
    with pytest.raises(ReslmError, match="not UTF-8"):
        R.read_config(tmp_path)
    (tmp_path / R.CONFIG).write_text(json.dumps(CFG))
    assert R.read_config(tmp_path) == CFG


# ------------------------------------------------------------------------------------------ --out

def test_create_run_dir_ok_and_into_locked_empty_folder(tmp_path):
    out = R.create_run_dir(tmp_path / "a" / "b" / "run", CFG)
    assert R.read_config(out) == CFG and sorted(p.name for p in (tmp_path / "a" / "b").iterdir()) == ["run"]
    with pytest.raises(ReslmError, match="already exists and is not empty"):
        R.create_run_dir(out, CFG)
    locked = tmp_path / "locked"
    with R.lock_run(locked, create=True):
        R.create_run_dir(locked, CFG)
    assert R.read_config(locked) == CFG


def _bad_outs(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    full = tmp_path / "full"
    full.mkdir()
    (full / "old.txt").write_text("x")
    yield Path("/proc/reslm-test-run"), "cannot create run directory /proc/reslm-test-run"
    yield Path("/proc/reslm-test-a/run"), "cannot create run directory"
    yield Path("/dev/null"), "exists and is not a directory"
    yield f, "exists and is not a directory"
    yield f / "run", "is not a directory"
    yield f / "deeper" / "run", "is not a directory"
    yield full, "already exists and is not empty"
    yield tmp_path / "new" / ("x" * 256), "256 bytes long"
    yield tmp_path / "new" / ("é" * 128), "256 bytes long"
    yield tmp_path / "new" / "a\nb", "control characters"
    yield tmp_path / "new\tdir" / "run", "control characters"


def test_create_run_dir_bad_out_paths_create_nothing(tmp_path):
    for out, want in _bad_outs(tmp_path):
        before = sorted(tmp_path.rglob("*"))
        with pytest.raises(ReslmError) as e:
            R.create_run_dir(out, CFG)
        assert want in one_line(e), (out, e.value)
        assert sorted(tmp_path.rglob("*")) == before, out
        assert not Path("/proc/reslm-test-a").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_create_run_dir_unwritable_folder(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(ReslmError, match="permission denied"):
            R.create_run_dir(ro / "a" / "run", CFG)
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o755)


def test_create_run_dir_failure_after_parents_removes_them(tmp_path, monkeypatch):
    def full(**kw):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(tempfile, "mkdtemp", full)
    with pytest.raises(ReslmError, match="no space left on device"):
        R.create_run_dir(tmp_path / "a" / "b" / "run", CFG)
    monkeypatch.undo()
    with pytest.raises(ReslmError, match="is nan"):
        R.create_run_dir(tmp_path / "c" / "run", {**CFG, "train": dict(lr=float("nan"))})
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------- describe

@pytest.mark.parametrize("exc, want", [
    (OSError(errno.ENOSPC, "No space left on device", "/r/checkpoint.pt"), "/r/checkpoint.pt: no space left on device"),
    (FileNotFoundError(errno.ENOENT, "No such file or directory"), "no such file or directory"),
    (OSError(errno.EXDEV, "Invalid cross-device link", "/a", None, "/b"), "/a -> /b: invalid cross-device link"),
    (OSError(), "OSError"),
    (OSError("plain message"), "plain message"),
    (RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"), "unexpected pos 704 vs 598"),
    (RuntimeError("\n\n  CUDA out of memory.\tTried to allocate 2 GiB\nmore"), "CUDA out of memory. Tried to allocate 2 GiB"),
    (RuntimeError(""), "RuntimeError"),
    (ValueError("\x1b[1mbad\x1b[0m value\nsecond"), "bad value"),
    (ValueError("   \n  "), "ValueError"),
    (KeyError("model"), "missing key 'model'"),
    (KeyError(), "KeyError"),
    (EOFError(), "EOFError"),
    (ReslmError("one\ntwo"), "one"),
    (ZeroDivisionError("division by zero"), "ZeroDivisionError: division by zero"),
    (TypeError(), "TypeError"),
])
def test_describe(exc, want):
    assert describe(exc) == want


def test_describe_long_and_broken():
    assert len(describe(ValueError("x" * 1000))) <= 300

    class Broken(Exception):
        def __str__(self):
            raise RuntimeError("no")

    assert describe(Broken()) == "Broken"
