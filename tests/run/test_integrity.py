"""Issue 23, what reslm reads back is what it wrote: the dataset fingerprint hashes whole token files
(old sampled fingerprints are still checked, the old way), the reservoir-state cache carries a
checksum, and `reslm eval` checks its arguments before any work. Tiny corpora, 16-unit reservoirs."""
from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import reslm.run.state_cache as rs
import reslm.train as tt
from reslm.cli import main
from reslm.data import chars as dchars
from reslm.data import check_fingerprint, prepare_text
from reslm.core.errors import ReslmError
from reslm.run import CONFIG, read_metrics

RC = ["--family", "rc", "--size", "16", "--epoch-samples", "64", "--epochs-per-shard", "1", "--batch-size", "32",
      "--shard-chars", "2000", "--no-progress"]
FAST_EVAL = ["--score", "500", "--length", "20", "--ngrams", "3", "--json"]


def one_error(capsys) -> str:
    """The one line on stderr: `reslm: error: ...`, nothing else, no traceback."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and re.match(r"reslm( [a-z]+)*: error: ", lines[0]) and "Traceback" not in err, err
    return lines[0]


def words(n: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    vocab = "to be or not that is the question whether tis nobler in mind".split()
    return " ".join(rng.choice(vocab) for _ in range(n))


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A character dataset of ~300 KB (bigger than the old fingerprint's 256 KiB of samples) and an rc
    run on it."""
    root = tmp_path_factory.mktemp("big")
    (root / "a.txt").write_text(words(70_000))
    ds = prepare_text([root / "a.txt"], root, name="big", verbose=False)
    assert ds.n_chars > dchars.SAMPLE_BLOCKS * dchars.SAMPLE_BLOCK_BYTES
    run = root / "run"
    assert main(["train", *RC, "--data", str(ds.path), "--out", str(run)]) == 0
    return ds, run


def _unsampled_test_offset(ds) -> int:
    """A byte offset in the test shard that lies between two of the old fingerprint's sampled blocks."""
    size, block, n = ds.n_chars, dchars.SAMPLE_BLOCK_BYTES, dchars.SAMPLE_BLOCKS
    starts = [(size - block) * i // (n - 1) for i in range(n)]
    a, _ = ds.shards[ds.test_shard]
    for s, nxt in zip(starts, starts[1:]):
        if s >= a and s + block + 8 < nxt:
            return s + block + 4
    raise AssertionError("no gap between sampled blocks in the test shard")


def test_eval_refuses_a_dataset_edited_outside_the_old_sampled_blocks(big, tmp_path, capsys):
    """Issue 23.3: bytes of the test shard overwritten between the blocks the old fingerprint sampled
    (the sampled checksum cannot see them) make `reslm eval` refuse with one line."""
    ds, run = big
    copy = tmp_path / "big"
    shutil.copytree(ds.path, copy)
    cfg = json.loads((run / CONFIG).read_text())
    cfg["data"]["path"] = str(copy)
    run2 = tmp_path / "run"
    shutil.copytree(run, run2)
    (run2 / CONFIG).write_text(json.dumps(cfg))
    assert main(["eval", str(run2), *FAST_EVAL]) == 0   # unchanged: accepted
    capsys.readouterr()
    written = (run2 / "eval.json").read_bytes()
    old = dchars.sample_sha256(copy / "tokens.bin")
    tokens = np.fromfile(copy / "tokens.bin", dtype=np.uint8)
    at = _unsampled_test_offset(ds)
    tokens[at:at + 4] = (tokens[at:at + 4] + 1) % ds.vocab_size       # still valid ids
    tokens.tofile(copy / "tokens.bin")
    assert dchars.sample_sha256(copy / "tokens.bin") == old            # what the old fingerprint missed
    assert main(["eval", str(run2), *FAST_EVAL]) == 2
    line = one_error(capsys)
    assert line == f"reslm: error: the dataset at {copy} no longer matches this run: tokens.bin contents differ"
    assert (run2 / "eval.json").read_bytes() == written


def test_an_old_sampled_fingerprint_is_still_checked_the_old_way(big, tmp_path):
    """Run configs written before whole-file hashes (fingerprint_version 1, `sample_sha256`) stay
    readable: an unchanged dataset passes, a change in a sampled block is refused."""
    ds, _ = big
    fp = ds.fingerprint()
    assert fp["fingerprint_version"] == 2 and set(fp["files"]["tokens.bin"]) == {"bytes", "sha256"}
    old = dict(fp, fingerprint_version=1,
               files={"tokens.bin": {"bytes": ds.n_chars, "sample_sha256": dchars.sample_sha256(ds.path / "tokens.bin")}})
    check_fingerprint(old, ds)
    copy = tmp_path / "big"
    shutil.copytree(ds.path, copy)
    tokens = np.fromfile(copy / "tokens.bin", dtype=np.uint8)
    tokens[-1] = (tokens[-1] + 1) % ds.vocab_size                     # the last block is sampled
    tokens.tofile(copy / "tokens.bin")
    edited = dchars.CharDataset.load(copy)
    with pytest.raises(ReslmError, match=r"no longer matches this run: tokens.bin contents differ$"):
        check_fingerprint(old, edited)
    with pytest.raises(ReslmError, match=r"no longer matches this run: tokens.bin contents differ$"):
        check_fingerprint(fp, edited)


def test_the_whole_file_hash_sees_every_byte(tmp_path):
    f = tmp_path / "t.bin"
    data = bytearray(np.random.default_rng(0).integers(0, 256, 1_000_000, dtype=np.uint8).tobytes())
    f.write_bytes(bytes(data))
    digest = dchars.file_sha256(f)
    import hashlib
    assert digest == hashlib.sha256(bytes(data)).hexdigest()
    data[8000] ^= 1  # between the old sampled blocks
    f.write_bytes(bytes(data))
    assert dchars.file_sha256(f) != digest                            # rewritten: hashed again, not remembered


# --- eval arguments ------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, needle", [
    (["--length", "5"], "--ngrams 7 is longer than the sample (--length 5): it has no 7-gram; give --length 7 or more"),
    (["--ngrams", "1000", "--length", "500"], "--ngrams 1000 is longer than the sample (--length 500)"),
    (["--ngrams", "100000000000000000000"], "--ngrams 100000000000000000000 is longer than the sample (--length 2000)"),
    (["--length", "100000000000000000000"], "argument --length: 100000000000000000000 is out of range (an integer from 1 "
                                            "to 1,000,000)"),
])
def test_eval_refuses_impossible_lengths_and_ngrams_before_any_work(big, tmp_path, monkeypatch, capsys, argv, needle):
    """Issue 23.6: an n-gram order longer than the sample (or an endless --length) is refused with one
    line before any scoring: nothing is scored, generated, written, or built (a missing dataset)."""
    _, run = big
    import reslm.cli.runs as cr
    import reslm.scoring.evaluate as ev

    def no_work(*a, **k):
        raise AssertionError("scored or built before the arguments were checked")

    monkeypatch.setattr(ev, "timed", no_work)
    monkeypatch.setattr(cr, "ensure_dataset", no_work)
    assert main(["eval", str(run), *argv]) == 2
    assert needle in one_error(capsys)
    assert not (run / "eval.json").exists()


def test_evaluate_run_checks_ngrams_before_scoring(big, monkeypatch):
    """The library does the same check before anything is scored or generated; a NaN that still comes
    out (a token sample decoding to fewer characters than n) is written as null, never as NaN."""
    _, run = big
    import reslm.scoring.evaluate as ev

    def no_work(*a, **k):
        raise AssertionError("scored before the arguments were checked")

    monkeypatch.setattr(ev, "timed", no_work)
    with pytest.raises(ReslmError, match=r"^--ngrams 7 is longer than the sample \(--length 5\)"):
        ev.evaluate_run(run, length=5)
    assert ev._defined({"7": float("nan"), "8": 0.5}) == {"7": None, "8": 0.5}


# --- the reservoir-state cache ---------------------------------------------------------------------------
CACHE_TRAIN = dict(batch_size=64, epochs_per_shard=1, epoch_samples=256, lr=3e-3, device="cpu", precision="fp32")


def _cut_run(chars, path: Path, monkeypatch) -> Path:
    """An rc run with cache_states killed at its 6th checkpoint (shard-epoch 2: shard 1's and the test
    states are in RUN/states)."""
    real_save, saves = tt.loop.save_checkpoint, []

    def save_then_die(run_dir, state):
        real_save(run_dir, state)
        saves.append(state)
        if len(saves) == 6:
            raise KeyboardInterrupt

    cut = tt.create_run(path, "rc", dict(size=32), CACHE_TRAIN, chars)
    monkeypatch.setattr(tt.loop, "save_checkpoint", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        tt.train(cut, progress=False, checkpoint_seconds=0, cache_states=True)
    monkeypatch.setattr(tt.loop, "save_checkpoint", real_save)
    return cut


def _count_cache_reads(monkeypatch) -> list:
    """(name, read back?) for every StateCache.load of the next training (a resumed run logs no second
    states row, so the cache's own reads say what was read back and what was computed again)."""
    real_load, hits = rs.StateCache.load, []

    def load(self, name, dtype):
        feats = real_load(self, name, dtype)
        hits.append((name, feats is not None))
        return feats

    monkeypatch.setattr(rs.StateCache, "load", load)
    return hits


@pytest.mark.parametrize("how", ["noise", "no checksum"])
def test_a_changed_state_cache_is_recomputed_with_a_warning(chars, tmp_path, monkeypatch, capsys, how):
    """Issue 23.8: RUN/states re-saved with noise (the checksum kept from the original) or without a
    checksum is not used: a warning names the file, the states are computed again, and the run ends
    bitwise as an uninterrupted one."""
    full = tt.create_run(tmp_path / "full", "rc", dict(size=32), CACHE_TRAIN, chars)
    tt.train(full, progress=False)
    cut = _cut_run(chars, tmp_path / "cut", monkeypatch)
    f = cut / tt.STATES / "train-shard1.pt"
    d = torch.load(f, weights_only=True)
    assert d["sha256"] == rs.tensors_sha256(d["inputs"], d["targets"])
    d["inputs"] = d["inputs"] + 1e-3 * torch.randn(d["inputs"].shape, generator=torch.Generator().manual_seed(0))
    if how == "no checksum":
        del d["sha256"]
    torch.save(d, f)
    capsys.readouterr()
    hits = _count_cache_reads(monkeypatch)
    tt.train(cut, progress=False, cache_states=True)
    err = capsys.readouterr().err
    why = "has no checksum (written by an older reslm)" if how == "no checksum" else "does not match its checksum (changed since it was written)"
    assert f"reslm: warning: the cached reservoir states {f} {why}: computing them again" in err
    rows = read_metrics(cut)
    states = [(r["shard"], r.get("cached", False)) for r in rows if r["kind"] == "states"]
    assert states[:3] == [(0, False), (1, False), (2, False)]   # one row per shard, resumed or not
    assert ("train-shard1", False) in hits                 # shard 1 computed again
    a = torch.load(full / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(cut / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_an_intact_state_cache_is_read_back(chars, tmp_path, monkeypatch, capsys):
    cut = _cut_run(chars, tmp_path / "cut", monkeypatch)
    capsys.readouterr()
    hits = _count_cache_reads(monkeypatch)
    tt.train(cut, progress=False, cache_states=True)
    assert "warning" not in capsys.readouterr().err
    assert ("train-shard1", True) in hits                  # read back, not computed again
    bf = torch.randn(3, 4).to(torch.bfloat16)
    assert rs.tensors_sha256(bf, torch.arange(3)) != rs.tensors_sha256(bf.float(), torch.arange(3))


# --- generate ------------------------------------------------------------------------------------------
def test_char_generate_reads_only_the_run_folder(big, tmp_path, capsys):
    """`reslm generate` on a character run needs only RUN/ (vocabulary in config.json, weights in the
    checkpoint): it generates the same text with its dataset gone, and its --help says that the dataset
    is neither read nor checked (a token run reads and checks it: test_faults)."""
    ds, run = big
    argv = ["generate", str(run), "--prompt", "to be", "--length", "40", "--seed", "3", "--device", "cpu"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    moved = tmp_path / "moved"
    shutil.move(str(ds.path), moved)
    try:
        assert main(argv) == 0
        assert capsys.readouterr().out == text
    finally:
        shutil.move(str(moved), ds.path)
    assert main(["generate", "--help"]) == 0
    assert "the dataset is not read, so it is not checked either" in " ".join(capsys.readouterr().out.split())
