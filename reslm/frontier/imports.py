"""A user's reservoir file for `--import FILE.py` (`reslm frontier bench`, which trains on it, and the
commands that read such a run back: eval, generate, memory, recall, verify, publish): run once, its bytes
hashed, and the built-in substrates guarded: a file that re-registers, removes or patches one is refused
(the registry and classes put back), and a reservoir it registers is named NAME@<its sha256's first 12 hex
digits>, so that a run's config, fingerprint and folder name cover the file that computed its states. The
file's whole sha256 goes into reslm.reservoir.registry.SOURCES, against which reslm.models.load checks
the sha256 a run records (reslm.run.source) before it builds the run's model."""
from __future__ import annotations

import hashlib
import sys
import types
from pathlib import Path

from reslm.core.errors import ReslmError
from reslm.core.errors import describe as one_line
from reslm.reservoir import RESERVOIRS
from reslm.reservoir.registry import SOURCES, source_name

def _built_ins(registry: dict) -> dict:
    """The substrates reslm itself registered (their reservoir class is reslm's own), by name."""
    return {n: pair for n, pair in registry.items() if isinstance(pair, tuple) and len(pair) == 2
            and getattr(pair[1], "__module__", "").startswith("reslm.")}


def _class_state(built_ins: dict) -> dict:
    """{class: its attributes} of the built-in substrates' config and reservoir classes and their reslm bases:
    what a file that patches a built-in substrate's methods would change."""
    return {c: dict(vars(c)) for pair in built_ins.values() for cls in pair for c in cls.__mro__
            if c.__module__.startswith("reslm.")}


def _changed_built_ins(built_ins: dict, before: dict) -> list[str]:
    """The built-in substrates an imported file re-registered, removed or patched (by name, or Class.attr)."""
    names = [n for n, pair in built_ins.items() if RESERVOIRS.get(n) is not pair]
    for c, attrs in before.items():
        now = vars(c)
        names += [f"{c.__name__}.{k}" for k in sorted(set(attrs) | set(now)) if now.get(k) is not attrs.get(k)]
    return names


def _put_back(registry: dict, classes: dict) -> None:
    """RESERVOIRS and the built-in classes as they were before a refused file ran."""
    RESERVOIRS.clear()
    RESERVOIRS.update(registry)
    for c, attrs in classes.items():
        for k in set(vars(c)) - set(attrs):
            delattr(c, k)
        for k, v in attrs.items():
            if vars(c).get(k) is not v:
                setattr(c, k, v)


def _run(code: bytes, path: Path) -> None:
    """Execute a user file's bytes as a module of its own (in sys.modules while it runs, as runpy does, so that
    its dataclasses resolve their annotations)."""
    module = types.ModuleType("__reslm_import__")
    module.__file__ = str(path)
    saved = sys.modules.get(module.__name__)
    sys.modules[module.__name__] = module
    try:
        exec(compile(code, str(path), "exec"), module.__dict__)
    finally:
        if saved is None:
            sys.modules.pop(module.__name__, None)
        else:
            sys.modules[module.__name__] = saved


_FROM_FILE: dict[Path, list[str]] = {}   # the names each file run by _import in this process registered


def _import(files: list[str] | None) -> list[dict]:
    """Run each user file, which registers its reservoir(s) in RESERVOIRS; returns each file's path, sha256
    and the names it registered (each also registered as source_name(name, sha256), the name runs record, and
    entered in SOURCES with the file's path, whole sha256 and bytes: what a run trained on it records).

    One line naming the file (ReslmError, exit 2), with RESERVOIRS as it was, when the file is not a .py
    file, is not a regular file, raises, exits (sys.exit), registers nothing, or replaces, removes or patches
    a built-in substrate (a run of `esn` is always reslm's ESN). The file runs in this process: what it
    does beyond RESERVOIRS and the built-in substrates' classes is not checked."""
    out = []
    for f in files or []:
        path = Path(f)
        if path.suffix != ".py":
            raise ReslmError(f"--import {f}: not a Python file (.py); only a .py file is run")
        if not path.is_file():
            raise ReslmError(f"--import {f}: " + ("is a folder" if path.is_dir() else "not a regular file"
                                                  if path.exists() else "no such file"))
        code = path.read_bytes()   # the bytes hashed are the bytes run
        sha = hashlib.sha256(code).hexdigest()
        registry = dict(RESERVOIRS)
        built_ins = _built_ins(registry)
        classes = _class_state(built_ins)
        for n in _FROM_FILE.get(path.resolve(), ()):   # what this file registered when run before: it registers again
            if n not in built_ins:
                RESERVOIRS.pop(n, None)
        try:
            try:
                _run(code, path)
            except SystemExit as e:   # sys.exit() in the file: not reslm's status to end with
                raise ReslmError(f"--import {f} exited (sys.exit({e.code!r})) instead of registering a "
                                 "reservoir") from None
            except KeyboardInterrupt:
                raise
            except BaseException as e:   # the user's file failed: one line naming it, not a traceback
                why = one_line(e)
                raise ReslmError(f"--import {f} failed: " + (why if why.startswith(type(e).__name__)
                                                              else f"{type(e).__name__}: {why}")) from None
            changed = _changed_built_ins(built_ins, classes)
            if changed:
                raise ReslmError(f"--import {f} changes reslm's own substrate(s) ({', '.join(changed[:4])}): "
                                 "register yours under a name of its own")
            names = [n for n in RESERVOIRS if n not in registry or registry[n] is not RESERVOIRS[n]
                     or n in _FROM_FILE.get(path.resolve(), ())]
            if not names:
                raise ReslmError(f"--import {f} registered no reservoir: it should set "
                                 "reslm.reservoir.RESERVOIRS['NAME'] = (ConfigClass, ReservoirClass)")
        except BaseException:
            _put_back(registry, classes)
            raise
        for n in names:
            RESERVOIRS[source_name(n, sha)] = RESERVOIRS[n]
            SOURCES[source_name(n, sha)] = dict(name=n, path=str(path), sha256=sha, code=code)
        _FROM_FILE[path.resolve()] = names
        out.append(dict(path=str(path), sha256=sha, names=names))
    return out
