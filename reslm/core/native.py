"""Support (every stage), native kernels: a C source of the package compiled on this machine, once.

Some steps are bound by memory passes that torch cannot fuse on a CPU (the character transformer's
window step: reslm.models.window_kernel). Their kernels are plain C files shipped with the package and
compiled here, at first use, by the machine's C compiler (`$CC`, else `cc` or `gcc`) with
`-O3 -march=native -ffast-math -fopenmp`: the instructions of this CPU (AVX-512, AVX2, ...), decided
at run time. `$RESLM_MARCH` names another target (`haswell`: AVX2 code, for a folder of kernels shared
by several CPU kinds, or to measure the AVX2 path on an AVX-512 CPU); the kernels then lay their vectors
out for what that target has. The shared library is cached under `$RESLM_CACHE` (default ~/.cache/reslm)/kernels,
named by a hash of the source, the macro values, the compiler's version, the flags and the CPU's
instruction flags, so a changed source, compiler or CPU builds anew and nothing stale is loaded.
Only the package's own sources are ever compiled, and a cached library is loaded only if its bytes are
those reslm recorded when it built it, in a folder no other user can write (the cache section below).

`build` returns None (and `why_not` says why) where no compiler or no OpenMP is available: callers
then use their plain torch path.
"""
from __future__ import annotations

import ctypes
import fcntl
import functools
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import stat
import subprocess
from pathlib import Path

from reslm.core.errors import ReslmError

FLAGS = ("-O3", "-ffast-math", "-fopenmp", "-shared", "-fPIC", "-std=c11")   # and -march=march()
_why: dict[str, str] = {}


def march() -> str:
    """The target the kernels are compiled for: $RESLM_MARCH (a gcc -march name such as haswell), else
    native. A name with anything but letters, digits, '-', '_' and '.' is refused (ReslmError)."""
    name = os.environ.get("RESLM_MARCH", "").strip() or "native"
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise ReslmError(f"RESLM_MARCH must be a compiler -march name such as haswell or native, got {name!r}")
    return name


def cache_dir() -> Path:
    return Path(os.environ.get("RESLM_CACHE") or Path.home() / ".cache" / "reslm") / "kernels"


def compiler_command() -> list[str] | None:
    """The C compiler's command words: $CC if set (a path or a name on PATH, with any words after it, as
    make takes `CC='ccache gcc'`; split as a shell would split words, never run by one), else cc or gcc;
    None if its first word is no program here."""
    cc = os.environ.get("CC", "").strip()
    try:
        words = shlex.split(cc) if cc else []
    except ValueError:
        return None
    for first, rest in ([(words[0], words[1:])] if words else [("cc", []), ("gcc", [])]):
        found = shutil.which(first)
        if found:
            return [found, *rest]
    return None


def compiler() -> str | None:
    """The C compiler to use, as one string (compiler_command's words joined); None if none."""
    cmd = compiler_command()
    return shlex.join(cmd) if cmd else None


def _no_compiler() -> str:
    cc = os.environ.get("CC", "").strip()
    return (f"CC={cc!r} names no program on PATH (a compiler's name or path, optionally followed by its words, "
            "such as CC='ccache gcc')" if cc else "no C compiler (set CC, or install gcc)")


@functools.lru_cache(maxsize=None)
def _compiler_version(cc: str) -> str:
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


@functools.lru_cache(maxsize=None)
def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def vector_floats() -> int:
    """Floats in one of the widest vector registers the kernels' target has: 16 where it has AVX-512F,
    else 8 (AVX2; narrower CPUs split such vectors). For -march=native, this CPU's flags; for another
    target, what the compiler defines for it (8 where it cannot be asked)."""
    target = march()
    if target == "native":
        return 16 if "avx512f" in _cpu_flags().split() else 8
    return 16 if "__AVX512F__" in _predefined(compiler() or "", target) else 8


@functools.lru_cache(maxsize=None)
def _predefined(cc: str, target: str) -> str:
    """The macros `cc -march=target` predefines ("" where it cannot say)."""
    try:
        return subprocess.run([cc, f"-march={target}", "-dM", "-E", "-x", "c", os.devnull], capture_output=True,
                              text=True, timeout=60).stdout if cc else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def why_not(source: Path) -> str | None:
    """Why the last `build` of `source` returned None (None if it did not)."""
    return _why.get(str(source))


# --- the cache: what it trusts ----------------------------------------------------------------------
# A library is loaded only if it is the file reslm built: its sha256 and size are recorded, when it is
# built, in a RECORD file beside it, and the library's bytes are hashed again before each load. The
# folder is one reslm made (or checks as if it had): a real directory, not a symlink, owned by this user
# and writable by nobody else, so no other user can put a library and a record there. Every file in it is
# opened relative to the folder's checked descriptor, never following a symlink, and the library loaded
# is the very file hashed (/proc/self/fd/N where there is one). Builds run under an flock of LOCK, so two
# processes never interleave a library and its record; a build leaves no temp file, and one a killed build
# left is removed by the next (TEMP_PREFIX, under the lock). See docs/failure-behaviour.md.
RECORD = ".sha256"          # the record's suffix: {"sha256", "bytes", "built_by"} of LIB
LOCK = ".lock"
TEMP_PREFIX = ".tmp-"
_PROC_FD = Path("/proc/self/fd")
_LOADED: list[int] = []     # the descriptors of the libraries loaded (see build)


class _Untrusted(Exception):
    """The cache folder cannot be trusted: a one-line reason; the kernel is not used."""


def _open_folder(folder: Path) -> int:
    """A descriptor of the kernel cache folder, made (0700) where missing; _Untrusted unless it is a real
    directory (no symlink followed), owned by this user and not writable by group or others."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        if folder.is_symlink():
            raise _Untrusted(f"the kernel cache {folder} is a symlink; reslm follows none there") from None
        raise _Untrusted(f"the kernel cache {folder} cannot be used: {e.strerror or e}") from None
    st = os.fstat(fd)
    problem = (f"is owned by uid {st.st_uid}, not this user ({os.getuid()})" if st.st_uid != os.getuid() else
               f"is writable by {'group' if st.st_mode & 0o020 else 'others'} (mode {stat.S_IMODE(st.st_mode):o})"
               if st.st_mode & 0o022 else None)
    if problem:
        os.close(fd)
        raise _Untrusted(f"the kernel cache {folder} {problem}: not used (chmod go-w it, or set RESLM_CACHE)")
    return fd


def _at(folder_fd: int, name: str) -> str:
    """A path naming `name` in the folder of `folder_fd` itself, not whatever the folder's path names now
    (/proc/self/fd/N/NAME; where there is no /proc, the cache folder's path)."""
    return str(_PROC_FD / str(folder_fd) / name) if _PROC_FD.is_dir() else str(cache_dir() / name)


def _open_own(folder_fd: int, name: str) -> int | None:
    """A read descriptor of the regular file `name` of the folder, not a symlink, owned by this user and not
    writable by others; None when there is no such file (a symlink, another file type or owner: not one
    reslm wrote)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder_fd)
    except OSError:
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        os.close(fd)
        return None
    return fd


def _read(fd: int, limit: int | None = None) -> bytes:
    with os.fdopen(os.dup(fd), "rb") as f:
        return f.read(limit) if limit else f.read()


def _record_of(folder_fd: int, lib: str) -> dict | None:
    fd = _open_own(folder_fd, lib + RECORD)
    if fd is None:
        return None
    try:
        record = json.loads(_read(fd, 4096))
        return record if isinstance(record, dict) else None
    except ValueError:
        return None
    finally:
        os.close(fd)


def _verified(folder_fd: int, lib: str) -> int | None:
    """A descriptor of the library `lib` when its bytes are those its record names (size and sha256), else
    None: no record, a damaged, cut or foreign file, or one that is not a plain file of this user's."""
    record = _record_of(folder_fd, lib)
    fd = _open_own(folder_fd, lib) if record else None
    if fd is None:
        return None
    if os.fstat(fd).st_size == record.get("bytes") and hashlib.sha256(_read(fd)).hexdigest() == record.get("sha256"):
        return fd
    os.close(fd)
    return None


def _remove(folder_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=folder_fd)
    except FileNotFoundError:
        pass


def _compile(folder_fd: int, cmd: list[str], source: Path, lib: str) -> str | None:
    """Compile `source` into `lib` and its record, atomically (a temp file renamed into place, then the
    record); the reason when the compiler fails. Called under the folder's lock: temp files found are a
    killed build's, removed first."""
    for name in os.listdir(folder_fd):
        if name.startswith(TEMP_PREFIX):
            _remove(folder_fd, name)
    tmp = f"{TEMP_PREFIX}{os.getpid()}-{lib}"
    try:
        done = subprocess.run([*cmd, str(source), "-o", _at(folder_fd, tmp), "-lm"], capture_output=True,
                              text=True, timeout=300, pass_fds=(folder_fd,))   # the same N in the compiler
        if done.returncode != 0:
            first = (done.stderr.strip().splitlines() or ["?"])[0]
            return f"{Path(cmd[0]).name} failed on {source.name}: {first}"
        fd = _open_own(folder_fd, tmp)
        if fd is None:
            return f"the compiler left no library for {source.name}"
        try:
            body = _read(fd)
        finally:
            os.close(fd)
        record = json.dumps(dict(sha256=hashlib.sha256(body).hexdigest(), bytes=len(body), built_by=cmd[0],
                                 source=source.name)).encode()
        rec_tmp = tmp + RECORD
        rfd = os.open(rec_tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=folder_fd)
        with os.fdopen(rfd, "wb") as f:
            f.write(record)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, lib, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
        os.replace(rec_tmp, lib + RECORD, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
        return None
    finally:
        for name in (tmp, tmp + RECORD):
            _remove(folder_fd, name)


@functools.lru_cache(maxsize=None)
def build(source: Path, macros: tuple[tuple[str, int], ...]) -> ctypes.CDLL | None:
    """`source` compiled with `-DNAME=VALUE` for each of `macros`, loaded; None when it cannot be built
    or trusted here (no compiler, a compiler error, a cache folder that is not this user's alone), with
    the reason kept for `why_not`. A cached library whose bytes are not those its record names is built
    again, never loaded. A process loads each (source, macros) once: the package's sources do not change
    while it runs."""
    cmd = compiler_command()
    if cmd is None:
        _why[str(source)] = _no_compiler()
        return None
    text = source.read_bytes()
    defines = [f"-D{k}={int(v)}" for k, v in macros]
    flags = (*FLAGS, f"-march={march()}")
    key = hashlib.sha256(b"\0".join([text, " ".join(flags + tuple(defines)).encode(), shlex.join(cmd).encode(),
                                     _compiler_version(cmd[0]).encode(), _cpu_flags().encode(),
                                     platform.machine().encode()])).hexdigest()[:20]
    lib = f"{source.stem}-{key}.so"
    try:
        folder_fd = _open_folder(cache_dir())
    except _Untrusted as e:
        _why[str(source)] = str(e)
        return None
    try:
        fd = _verified(folder_fd, lib)
        if fd is None:
            lock = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600, dir_fd=folder_fd)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX)
                fd = _verified(folder_fd, lib)        # another process may have built it meanwhile
                if fd is None:
                    for name in (lib, lib + RECORD):  # a file reslm did not write, or a damaged one
                        _remove(folder_fd, name)
                    failed = _compile(folder_fd, [*cmd, *flags, *defines], source, lib)
                    if failed:
                        _why[str(source)] = failed
                        return None
                    fd = _verified(folder_fd, lib)
            finally:
                os.close(lock)
        if fd is None:
            _why[str(source)] = f"the library built for {source.name} does not match its record"
            return None
        if not _PROC_FD.is_dir():
            os.close(fd)
            return ctypes.CDLL(str(cache_dir() / lib))
        # the file just hashed, by its descriptor: nothing can swap it in between. The descriptor stays open
        # for the life of the process: the loader knows a library by its path, and a closed N would name the
        # next library /proc/self/fd/N too, which it would take for the first
        _LOADED.append(fd)
        return ctypes.CDLL(str(_PROC_FD / str(fd)))
    except (OSError, subprocess.SubprocessError) as e:
        _why[str(source)] = f"could not build or load {source.name}: {e}"
        return None
    finally:
        os.close(folder_fd)
