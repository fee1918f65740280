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
Only the package's own sources are ever compiled; the cache folder holds what reslm wrote there.

`build` returns None (and `why_not` says why) where no compiler or no OpenMP is available: callers
then use their plain torch path.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
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


def compiler() -> str | None:
    """The C compiler to use: $CC if set (a path or a name on PATH), else cc or gcc; None if none."""
    for name in ([os.environ["CC"]] if os.environ.get("CC") else ["cc", "gcc"]):
        found = shutil.which(name)
        if found:
            return found
    return None


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


@functools.lru_cache(maxsize=None)
def build(source: Path, macros: tuple[tuple[str, int], ...]) -> ctypes.CDLL | None:
    """`source` compiled with `-DNAME=VALUE` for each of `macros`, loaded; None when it cannot be built
    here (no compiler, a compiler error), with the reason kept for `why_not`. A process loads each
    (source, macros) once: the package's sources do not change while it runs."""
    cc = compiler()
    if cc is None:
        _why[str(source)] = "no C compiler (set CC, or install gcc)"
        return None
    text = source.read_bytes()
    defines = [f"-D{k}={int(v)}" for k, v in macros]
    flags = (*FLAGS, f"-march={march()}")
    key = hashlib.sha256(b"\0".join([text, " ".join(flags + tuple(defines)).encode(), _compiler_version(cc).encode(),
                                     _cpu_flags().encode(), platform.machine().encode()])).hexdigest()[:20]
    folder = cache_dir()
    lib = folder / f"{source.stem}-{key}.so"
    if not lib.is_file():
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{source.stem}-", suffix=".so", dir=folder)
            os.close(fd)
            done = subprocess.run([cc, *flags, *defines, str(source), "-o", tmp, "-lm"], capture_output=True,
                                  text=True, timeout=300)
            if done.returncode != 0:
                os.unlink(tmp)
                first = (done.stderr.strip().splitlines() or ["?"])[0]
                _why[str(source)] = f"{Path(cc).name} failed on {source.name}: {first}"
                return None
            os.replace(tmp, lib)   # atomic: two processes compiling at once both leave a whole file
        except (OSError, subprocess.SubprocessError) as e:
            _why[str(source)] = f"could not compile {source.name}: {e}"
            return None
    try:
        return ctypes.CDLL(str(lib))
    except OSError as e:
        _why[str(source)] = f"could not load {lib.name}: {e}"
        return None
