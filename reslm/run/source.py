"""What a run folder records of a user's file that registered its reservoir (`reslm frontier bench --import
FILE.py`): the run can be read again only where that very file is run, and anyone can read what it was.

    RUN_DIR/reservoir-source.json   {reservoir: the run's NAME@SHA12, name, file: the file's name (no folder),
                                     sha256: the file's whole sha256, copy: reservoir-source.txt}
    RUN_DIR/reservoir-source.txt    the file's bytes, for reading only: reslm never imports, executes or
                                    loads anything from it (`--import` runs only a .py file the user names)

`reslm publish` carries both into results/NAME and its manifest. reslm.models.load reads the record before it
builds such a run's model (check_source there): the file the user names with --import must have this sha256.
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

from reslm.core.errors import ReslmError
from reslm.core.files import atomic_write, read_json, read_plain, write_json

SOURCE, SOURCE_COPY = "reservoir-source.json", "reservoir-source.txt"
_SHA256 = re.compile(r"[0-9a-f]{64}")


def record_source(run_dir: Path, reservoir: str, name: str, path: str, code: bytes) -> None:
    """Record in run_dir that its reservoir `reservoir` (NAME@SHA12) was registered as `name` by the file at
    `path`, whose bytes are `code`: the copy first, then the record over it. A folder that records this file
    already is left as it is; one that records another is refused (one run, one file)."""
    run_dir = Path(run_dir)
    sha = hashlib.sha256(code).hexdigest()
    have = read_source(run_dir)
    if have is not None and have["sha256"] == sha and have["reservoir"] == reservoir:
        return   # recorded when the run started (under the file's name then): kept as it is
    if have is not None:
        raise ReslmError(f"{run_dir} was trained on {have['reservoir']} from {have['file']} (sha256 "
                         f"{have['sha256'][:12]}), not on {reservoir} from {Path(path).name} (sha256 {sha[:12]}): "
                         "remove it or use another output folder")
    atomic_write(run_dir / SOURCE_COPY, lambda p: p.write_bytes(code))
    write_json(run_dir / SOURCE, dict(reservoir=reservoir, name=name, file=Path(path).name, sha256=sha,
                                      copy=SOURCE_COPY))


def read_source(run_dir: Path) -> dict | None:
    """The record of run_dir's reservoir file (None where the run records none), after checking its fields and
    that its copy holds the bytes of that sha256: a ReslmError naming the file otherwise. The copy's bytes are
    hashed, never run."""
    run_dir = Path(run_dir)
    where = run_dir / SOURCE
    if read_plain(where) is None:
        return None
    record = read_json(where)
    if record is None:
        raise ReslmError(f"{where} is not a JSON object")
    for key in ("reservoir", "name", "file", "sha256"):
        if not isinstance(record.get(key), str) or not record[key]:
            raise ReslmError(f"{where}: its {key!r} is missing or not a string")
    if not _SHA256.fullmatch(record["sha256"]):
        raise ReslmError(f"{where}: its sha256 is not 64 hex digits")
    code = read_plain(run_dir / SOURCE_COPY)
    if code is None or hashlib.sha256(code).hexdigest() != record["sha256"]:
        raise ReslmError(f"{run_dir / SOURCE_COPY} " + ("is missing" if code is None else "is not the file")
                         + f" that {SOURCE} records (sha256 {record['sha256'][:12]})")
    return record


__all__ = ["SOURCE", "SOURCE_COPY", "read_source", "record_source"]
