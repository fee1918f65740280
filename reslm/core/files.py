"""Durable files: atomic writes, fsync, strict JSON, checksums. The floor every writer stands on.

Data preparation (reslm.data), the run folder (reslm.run), reports and publishing all write through
these helpers, so they sit below all of them and import nothing from reslm but errors.

A file is written atomically and durably (atomic_write: temp file beside it, fsync, rename, fsync of
the folder), so a kill or a power cut leaves the previous complete file, never a half-written one. A
failed write (disk full) raises ReslmError "could not write PATH: no space left on device", keeps the
previous file and leaves no temp file. A folder is built the same way: make_temp_dir beside it,
fsync_tree, rename, fsync_dir of the parent.

JSON files are strict JSON: write_json refuses NaN and +-Infinity with a ReslmError naming the key,
before anything is written (callers pass None for a missing value).

Folders reslm may not have written (run folders, results/, search and lab folders: anyone may copy one
in) are read and written through open_plain and the helpers on it: a file there is opened without
following a symbolic link and only when it is a regular file (a link, a FIFO or a device is a one-line
ReslmError, never followed, never waited on); names read from such a folder's files are checked with
plain_name before they are joined to it, so that a path named inside a folder stays inside it.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import hashlib
import json
import math
import os
import secrets
import stat
import tempfile
from pathlib import Path

from reslm.core.errors import ReslmError, describe, write_error


def reason(e: OSError) -> str:
    """'no space left on device' for OSError(ENOSPC); describe() for anything else."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror[:1].lower() + e.strerror[1:]
    return describe(e)


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def _not_plain(path: Path, mode: int) -> ReslmError:
    what = ("a symbolic link" if stat.S_ISLNK(mode) else "a folder" if stat.S_ISDIR(mode)
            else "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device file")
    return ReslmError(f"{path} is {what}, not a regular file: reslm does not follow links or open special files "
                      f"in a folder it reads (replace it with the file itself, or remove it)")


def plain_stat(path: Path) -> os.stat_result | None:
    """lstat of path, or None when it does not exist; ReslmError when it is not a regular file (a
    symbolic link, a folder, a FIFO, a device): nothing is opened or followed."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ReslmError(f"cannot read {path}: {reason(e)}") from None
    if not stat.S_ISREG(st.st_mode):
        raise _not_plain(Path(path), st.st_mode)
    return st


def open_plain(path: Path, flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
    """A file descriptor of the regular file at `path`, opened without following a symbolic link and
    without blocking on a FIFO (O_NOFOLLOW | O_NONBLOCK, the latter cleared once it is known to be a
    regular file). A link or special file raises ReslmError (see plain_stat); other OSErrors
    (missing, permissions, no space) pass through for the caller to word. With O_CREAT a missing file
    is created (never through a dangling link)."""
    path = Path(path)
    if not flags & os.O_CREAT:
        plain_stat(path)   # look before opening: a device is never opened, a FIFO never waited on
    try:
        fd = os.open(path, flags | _NOFOLLOW | _NONBLOCK | _CLOEXEC, mode)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EMLINK, errno.ENXIO):   # O_NOFOLLOW on a link; a FIFO with no reader
            raise _not_plain(path, os.lstat(path).st_mode) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _not_plain(path, st.st_mode)
        if _NONBLOCK:
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_plain(path: Path) -> bytes | None:
    """The bytes of the regular file at `path`, or None when it does not exist (see open_plain: a link
    or a special file is a ReslmError; another failure to read is "cannot read PATH: REASON")."""
    try:
        fd = open_plain(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ReslmError(f"cannot read {path}: {reason(e)}") from None
    with os.fdopen(fd, "rb") as f:
        try:
            return f.read()
        except OSError as e:
            raise ReslmError(f"cannot read {path}: {reason(e)}") from None


def plain_name(name, where: str) -> str:
    """`name` when it is one plain file name (a string, no "/", not "." or "..", no NUL or control
    characters): a name read from a folder's file that reslm joins to that folder, so that it stays
    inside. Anything else is a ReslmError naming `where` it was read."""
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name \
            or any(ord(c) < 32 for c in name):
        raise ReslmError(f"{where} names {name!r}, which is not a plain file name in its folder")
    return name


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write) -> None:
    """Call write(tmp_path) on a temp file next to `path`, fsync it, rename it onto `path`, fsync the
    folder. On any failure `path` keeps its previous content and the temp file is removed; an OSError
    (ENOSPC, EACCES, ...) or torch's failed-write RuntimeError becomes a one-line ReslmError
    "could not write PATH: no space left on device". A ReslmError from `write` passes through."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:200]}.", suffix=".tmp")
    except OSError as e:
        raise ReslmError(f"could not write {path}: {reason(e)}") from None
    os.close(fd)
    tmp = Path(tmp)
    try:
        write(tmp)
        fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException as e:
        err = write_error(path, e)  # before the unlink, which frees the space it looks at
        tmp.unlink(missing_ok=True)
        if err is not None:
            raise err from None
        raise
    fsync_dir(path.parent)


def non_finite(obj, where: str = ""):
    """(key path, value) of the first NaN/Infinity in a JSON-like object, or None."""
    if isinstance(obj, float):
        return None if math.isfinite(obj) else (where or "the value", obj)
    if isinstance(obj, dict):
        items = ((f"{where}.{k}" if where else str(k), v) for k, v in obj.items())
    elif isinstance(obj, (list, tuple)):
        items = ((f"{where}[{i}]", v) for i, v in enumerate(obj))
    else:
        return None
    for w, v in items:
        bad = non_finite(v, w)
        if bad is not None:
            return bad
    return None


def strict_dumps(obj, path: Path, **kw) -> str:
    bad = non_finite(obj)
    if bad is not None:
        raise ReslmError(f"cannot write {path}: {bad[0]} is {bad[1]}, not a finite number "
                         f"(JSON has no NaN or Infinity; use null for a missing value)")
    return json.dumps(obj, allow_nan=False, **kw)


def write_json(path: Path, obj) -> None:
    """Write `obj` as strict, indented JSON, atomically (see atomic_write). A NaN or Infinity anywhere
    in `obj` raises ReslmError naming its key ("cannot write PATH: fits.rc.r2 is nan, not a finite
    number ...") and nothing is written."""
    text = strict_dumps(obj, Path(path), indent=2) + "\n"
    atomic_write(path, lambda p: p.write_text(text))


def read_json(path: Path) -> dict | None:
    """A JSON object from a file, or None when the file is missing or is not a JSON object. A symbolic
    link or special file in its place is a ReslmError (open_plain), never followed."""
    try:
        data = read_plain(path)
    except ReslmError as e:
        if "not a regular file" in str(e):
            raise
        return None
    try:
        obj = json.loads(data) if data is not None else None
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def sha256_file(path: Path) -> str:
    """Hex sha256 of a regular file's bytes, read in 1 MiB blocks (a link or special file: ReslmError)."""
    h = hashlib.sha256()
    with os.fdopen(open_plain(path), "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------------
# folders

def fsync_dir(path: Path) -> None:
    """Make a folder's entries (a rename into it, new files) durable; a no-op where folders cannot
    be opened (Windows)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_tree(folder: Path) -> None:
    """fsync every file under folder, then every folder (deepest first): call before renaming it."""
    folders = []
    for dirpath, _, filenames in os.walk(folder):
        folders.append(Path(dirpath))
        for name in filenames:
            fd = os.open(Path(dirpath) / name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    for d in reversed(folders):
        fsync_dir(d)


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


def exchange(a: Path, b: Path) -> None:
    """Swap two existing folders in one step (renameat2 RENAME_EXCHANGE, Linux >= 3.15): whoever looks
    at `b` sees its old content or its new one, never neither. Where the call is missing, two renames
    (b -> a's temporary name, then a -> b) do it, with a moment in between where b is absent."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        renameat2 = None
    if renameat2 is not None:
        at_fdcwd, rename_exchange = -100, 2
        if renameat2(at_fdcwd, os.fsencode(str(a)), at_fdcwd, os.fsencode(str(b)), rename_exchange) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
            raise OSError(err, os.strerror(err), str(b))
    aside = Path(a).with_name(Path(a).name + ".old")
    os.rename(b, aside)
    os.rename(a, b)
    os.rename(aside, a)


def missing_parents(path: Path) -> tuple[list[Path], Path]:
    """(path's parent folders that do not exist yet, innermost first; the nearest one that exists)."""
    missing, p = [], Path(path).parent
    while not (p.exists() or p.is_symlink()) and p.parent != p:
        missing.append(p)
        p = p.parent
    return missing, p


def remove_empty_dirs(folders: list[Path]) -> None:
    """rmdir each folder in turn (innermost first), stopping at the first that is not empty or gone:
    undoes the parent folders a failed command created, never anything it did not."""
    for q in folders:
        try:
            q.rmdir()
        except OSError:
            break
