"""The one dataset format on disk, shared by character and BPE datasets.

Dataset directory ``<root>/<name>/``
------------------------------------
``tokens.bin``  every token of the dataset, shards back to back: uint8 or uint16 (native
                little-endian), shape (n,).
``meta.json``   ``kind`` ("char" or "bpe"), ``dtype``, ``shards`` ([start, end) ranges of
                tokens.bin: views, contiguous and covering it), ``train_shards`` and
                ``test_shard`` (indices into ``shards``), and each kind's own fields: a character
                dataset's vocabulary and split rule (reslm.data.chars), a BPE dataset's tokenizer
                and token counts (reslm.data.bpe, whose ``val`` split is its test shard).
``tokenizer.json``  a trained BPE tokenizer (``bpe:K`` only).

`TokenFile` is what both dataset classes share: the memory-mapped token file and its views.
Datasets are written atomically: built in ``<root>/.<name>.tmp-XXXX`` (`building`), their files and
folder fsynced, renamed into place and the root fsynced (`commit_dataset`); an existing dataset is
replaced only with ``overwrite=True``, and only when it is recognisably a dataset.

Fingerprints
------------
``fingerprint()`` of a dataset is a small JSON-ready dict that a run saves; ``check_fingerprint(saved,
dataset)`` raises a one-line ReslmError when the dataset at that path has since been replaced or
edited: another vocabulary or tokenizer, another split, other sizes, or any other byte of the token
data (``sha256`` of each named range, read in 1 MiB blocks; a range is hashed once per process while
its file's size, mtime, ctime and inode stay the same). A character dataset names one range, the
whole ``tokens.bin``; a BPE dataset names its two views ``train.bin`` and ``val.bin``, the files they
were before the one format, so a run made on an older BPE dataset checks against the same tokens
written anew. Fingerprints of ``fingerprint_version`` 1 (runs made before whole-file hashes) hold
``sample_sha256`` instead: 64 evenly spaced 4 KiB blocks, the whole range up to 256 KiB. Those runs
are still checked, the old way, which cannot see an edit between the sampled blocks.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Iterator

import numpy as np

import reslm
from reslm.core.errors import ReslmError, writing
from reslm.core.files import fsync_dir, fsync_tree, make_temp_dir

FINGERPRINT_VERSION = 2  # 1: sampled token-file checksums; 2: whole-file sha256
SAMPLE_BLOCKS = 64
SAMPLE_BLOCK_BYTES = 4096
TOKENS = "tokens.bin"
META = "meta.json"


def default_data_root() -> Path:
    """Dataset root: ``$RESLM_DATA`` if set, else ``./data``."""
    env = os.environ.get("RESLM_DATA")
    return Path(env).expanduser() if env else Path("data")


def read_meta(path: Path | str) -> tuple[Path, Any, Path]:
    """(dataset dir, parsed meta.json, its path) of a dataset directory; ReslmError if it is not one."""
    path = Path(path)
    if not path.is_dir():
        raise ReslmError(f"not a dataset directory: {path} (no such directory)")
    meta_path = path / META
    if not meta_path.is_file():
        raise ReslmError(f"not a dataset directory: {path} (no {META})")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ReslmError(f"cannot read {meta_path}: {e}") from None
    return path, meta, meta_path


# --- the token file and its views -------------------------------------------------------


class TokenFile:
    """A dataset folder in the one format: tokens.bin memory-mapped, its shards as views."""

    def __init__(self, path: Path, meta: dict[str, Any]):
        self.path = Path(path)
        self.meta = meta
        self.name: str = meta["name"]
        self.dtype = np.dtype(meta["dtype"])
        self.shards: list[tuple[int, int]] = [(int(s), int(e)) for s, e in meta["shards"]]
        self.n_shards: int = len(self.shards)
        self.train_shards: list[int] = [int(i) for i in meta["train_shards"]]
        self.test_shard: int = int(meta["test_shard"])
        self._tokens: np.ndarray | None = None

    @property
    def tokens(self) -> np.ndarray:
        """All tokens, shards back to back. Shape (n,), read-only memmap (an empty array when n = 0)."""
        if self._tokens is None:
            n = self.shards[-1][1]
            self._tokens = (np.memmap(self.path / TOKENS, dtype=self.dtype, mode="r", shape=(n,)) if n
                            else np.zeros(0, dtype=self.dtype))   # np.memmap refuses empty files
        return self._tokens

    def shard(self, i: int) -> np.ndarray:
        """Tokens of shard i (a memmap slice, no copy). Shape (end - start,)."""
        if not -self.n_shards <= i < self.n_shards:
            raise ReslmError(f"shard {i} out of range: dataset {self.name} has {self.n_shards} shards")
        start, end = self.shards[i]
        return self.tokens[start:end]

    def check_token_file(self) -> None:
        """ReslmError unless tokens.bin exists and holds exactly the tokens meta.json describes."""
        f = self.path / TOKENS
        if not f.is_file():
            raise ReslmError(f"dataset {self.path} is missing {TOKENS}")
        n, size = self.shards[-1][1], f.stat().st_size
        if size % self.dtype.itemsize:
            raise ReslmError(f"{f} has {size} bytes, not a whole number of {self.dtype.name} tokens; "
                             "re-create the dataset")
        if size != n * self.dtype.itemsize:
            raise ReslmError(f"{f} has {size} bytes but {META} implies {n * self.dtype.itemsize} "
                             f"({n} x {self.dtype.name}); re-create the dataset")

    def ranges(self) -> dict[str, tuple[Path, int, int | None]]:
        """The byte ranges a fingerprint names: {name: (file, start byte, end byte or None = to the end)}."""
        return {TOKENS: (self.path / TOKENS, 0, None)}

    def range_digests(self) -> dict[str, dict[str, Any]]:
        return {name: file_digest(*r) for name, r in self.ranges().items()}


def sample_blocks(tokens: np.ndarray, block: int = 1 << 14, n_blocks: int = 16) -> np.ndarray:
    """Head, tail and evenly spaced blocks of a token stream (a cheap range check)."""
    n = tokens.shape[0]
    if n <= block * (n_blocks + 2):
        return np.asarray(tokens)
    starts = np.linspace(0, n - block, n_blocks + 2).astype(np.int64)
    return np.concatenate([np.asarray(tokens[s:s + block]) for s in starts.tolist()])


def meta_checker(meta: Any, meta_path: Path, kind: str, keys: tuple[str, ...]):
    """The checks every dataset's meta.json passes (a JSON object of this `kind` with these `keys`);
    returns `bad(why)`, the ReslmError naming the file, for the format's own checks."""
    def bad(why: str) -> ReslmError:
        return ReslmError(f"invalid {meta_path}: {why}")

    if not isinstance(meta, dict):
        raise bad("not a JSON object")
    if meta.get("kind") != kind:
        raise bad(f"kind is {meta.get('kind')!r}, expected {kind!r}")
    for key in keys:
        if key not in meta:
            raise bad(f"missing {key!r}")
    return bad


def check_shards(meta: dict[str, Any], n: Any, bad) -> None:
    """Raise bad(why) unless meta's shards are contiguous [start, end) views covering [0, n) and
    train_shards / test_shard are distinct indices into them."""
    shards = meta["shards"]
    if not isinstance(n, int) or n < 0:
        raise bad("the token count must be a non-negative integer")
    ok = isinstance(shards, list) and len(shards) >= 2 and all(
        isinstance(s, list) and len(s) == 2 and all(isinstance(x, int) for x in s) for s in shards)
    if not ok:
        raise bad("shards must be a list of [start, end) pairs")
    if shards[0][0] != 0 or shards[-1][1] != n or any(
            a[1] != b[0] for a, b in zip(shards, shards[1:])) or any(s > e for s, e in shards):
        raise bad("shards must be contiguous and cover [0, n_chars)" if meta.get("kind") == "char"
                  else "shards must be contiguous and cover [0, n_tokens)")
    ids = list(meta["train_shards"]) + [meta["test_shard"]]
    if not all(isinstance(i, int) and 0 <= i < len(shards) for i in ids) or len(set(ids)) != len(ids):
        raise bad("train_shards / test_shard must be distinct shard indices")


# --- fingerprints ---------------------------------------------------------------------------


def _json_sha256(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, ensure_ascii=False, sort_keys=True).encode("utf-8")).hexdigest()


def _range(f, start: int, end: int | None) -> tuple[os.stat_result, int]:
    st = os.fstat(f.fileno())
    return st, (st.st_size if end is None else end) - start


def sample_sha256(path: Path, start: int = 0, end: int | None = None, n_blocks: int = SAMPLE_BLOCKS,
                  block: int = SAMPLE_BLOCK_BYTES) -> str:
    """sha256 of the size and n_blocks evenly spaced blocks of `block` bytes (first and last included)
    of the file's bytes [start, end) (the whole file by default); all of them when they are at most
    n_blocks * block bytes."""
    try:
        with open(path, "rb") as f:
            _, size = _range(f, start, end)
            h = hashlib.sha256(f"{size}\n".encode())
            if size <= n_blocks * block:
                f.seek(start)
                h.update(f.read(size))
            else:
                for i in range(n_blocks):
                    f.seek(start + (size - block) * i // (n_blocks - 1))
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


_DIGESTS: dict[tuple, str] = {}  # (path, size, mtime_ns, ctime_ns, inode, device, start, end) -> sha256


def file_sha256(path: Path, start: int = 0, end: int | None = None) -> str:
    """sha256 of the file's bytes [start, end) (the whole file by default), read in 1 MiB blocks.
    Remembered for this process while the file's size, mtime, ctime, inode and device stay the same
    (ctime changes on every write and cannot be set back), so one command that checks a dataset twice
    reads it once."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            st, left = _range(f, start, end)
            key = (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev, start, end)
            if key in _DIGESTS:
                return _DIGESTS[key]
            h = hashlib.sha256()
            f.seek(start)
            while left > 0:
                data = f.read(min(1 << 20, left))
                if not data:
                    break
                h.update(data)
                left -= len(data)
    except OSError as e:
        raise ReslmError(f"cannot read {path}: {e.strerror or e}") from None
    _DIGESTS[key] = h.hexdigest()
    return _DIGESTS[key]


def file_digest(path: Path, start: int = 0, end: int | None = None) -> dict[str, Any]:
    """{"bytes": size, "sha256": file_sha256(...)} of a file's bytes [start, end) (fingerprint_version 2)."""
    size = _size(path) - start if end is None else end - start
    return {"bytes": size, "sha256": file_sha256(path, start, end)}


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
            elif not _same_contents(old, new, dataset.ranges()[name]):
                diffs.append(f"{name} contents differ")
    if diffs:
        raise ReslmError(f"{where} no longer matches this run: {'; '.join(diffs)}")


def _same_contents(old: dict[str, Any], new: dict[str, Any], where: tuple[Path, int, int | None]) -> bool:
    """Whether a token range still has the contents a saved entry describes: its sha256
    (fingerprint_version 2), or for a run made before those its sampled checksum (version 1)."""
    if "sha256" in old:
        return old["sha256"] == new["sha256"]
    if "sample_sha256" in old:
        return old["sample_sha256"] == sample_sha256(*where)
    return True  # no checksum saved: only the size could be compared


# --- writing a dataset ----------------------------------------------------------------------


def commit_dataset(tmp: Path, root: Path, name: str, overwrite: bool) -> Path:
    """Rename the finished temp dir to <root>/<name> (replacing an old dataset if allowed); its files
    and folders are fsynced before the rename and the root after, so a crash leaves the old dataset
    or the complete new one."""
    target = root / name
    check_target(target, overwrite)  # something may have appeared meanwhile
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


def write_meta(folder: Path, meta: dict[str, Any]) -> None:
    with writing(folder / META):
        (folder / META).write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def check_target(target: Path, overwrite: bool) -> None:
    if not (target.exists() or target.is_symlink()):
        return
    if not overwrite:
        raise ReslmError(f"dataset {target} already exists (use overwrite to replace it)")
    # Replacing means deleting: only ever delete something that is recognisably a dataset.
    if not target.is_dir() or target.is_symlink() or not (
            (target / META).is_file() or not any(target.iterdir())):
        raise ReslmError(f"refusing to overwrite {target}: it is not a reslm dataset directory")


NAME_MAX_BYTES = 200  # a folder name is at most 255 bytes; building uses ".<name>.tmp-XXXXXXXX" beside it


def check_name(name: str) -> None:
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


def logger(verbose: bool):
    def log(msg: str) -> None:
        if verbose:
            print(f"reslm data: {msg}", file=sys.stderr, flush=True)
    return log


def reslm_version() -> str | None:
    try:
        return version("reslm")
    except PackageNotFoundError:
        return reslm.__version__
    except Exception:  # version is informative only; never fail a build over it
        return None


