"""A user's reservoir file for `--import FILE.py` (`reslm frontier bench`, which trains on it, and the
commands that read such a run back: eval, generate, memory, recall, verify, publish): run once, its bytes
hashed, and the built-in substrates guarded: a file that re-registers, removes or patches one is refused
(the registry and classes put back), and a reservoir it registers is named NAME@<its sha256's first 12 hex
digits>, so that a run's config, fingerprint and folder name cover the file that computed its states. The
file's whole sha256 goes into reslm.reservoir.registry.SOURCES, against which reslm.models.load checks
the sha256 a run records (reslm.run.source) before it builds the run's model.

The class registered under NAME@SHA12 (what runs record and build) is the file's, probed each time an
instance of it is built (not shape-only): the states of a short fixed input, computed by that instance and by a
fresh one from the same config (the same seed), must be (batch, steps, its declared `size`), finite, and the
same for both (`probe`). A reservoir whose states are not a function of its seed and input (noise from an
unseeded generator), not finite or of another width than it declares is refused in one line naming the file,
before anything is trained, scored or published on it."""
from __future__ import annotations

import hashlib
import random
import sys
import types
from pathlib import Path

import numpy as np
import torch

from reslm.core.errors import ReslmError
from reslm.core.errors import describe as one_line
from reslm.reservoir import RESERVOIRS
from reslm.reservoir.registry import SOURCES, source_name

class ImportFailed(ReslmError):
    """A user's file that raised while it ran (`--import FILE.py failed: ...`); `path`, `sha256` (of the bytes
    run) and `cause` (the exception's type) say which file and why, so that `reslm verify` can report the runs of a
    file that needs a module this machine lacks as not checked, naming it, and check the others."""

    def __init__(self, message: str, path: str, sha256: str, cause: type):
        super().__init__(message)
        self.path, self.sha256, self.cause = path, sha256, cause


PROBE_STEPS, PROBE_BATCH = 16, 2   # the probe input: 2 sequences of 16 steps, drawn from a fixed seed
PROBE_ATOL = 1e-6                  # the same computation twice on one CPU agrees to the bit; noise is far larger


def _probe_input(input_dim: int) -> torch.Tensor:
    """The fixed probe input (PROBE_BATCH, PROBE_STEPS, input_dim), at the embedding's scale N(0, 1/d)."""
    g = torch.Generator().manual_seed(0)
    return torch.randn((PROBE_BATCH, PROBE_STEPS, input_dim), generator=g) / max(input_dim, 1) ** 0.5


def _states_of(res, u: torch.Tensor, where: str) -> torch.Tensor:
    """The probe's states as the reservoir gives them (forward(u) -> (states, last state)), checked against its
    declared width and for finiteness: ReslmError naming the file otherwise."""
    try:
        with torch.no_grad():
            out = res(u)
    except ReslmError as e:
        raise ReslmError(f"{where} failed on a {PROBE_STEPS}-step probe input: {e}") from None
    except Exception as e:   # the user's forward: one line naming the file, not torch's traceback
        why = one_line(e)
        raise ReslmError(f"{where} failed on a {PROBE_STEPS}-step probe input: "
                         + (why if why.startswith(type(e).__name__) else f"{type(e).__name__}: {why}")) from None
    if not (isinstance(out, (tuple, list)) and len(out) == 2 and all(isinstance(t, torch.Tensor) for t in out)):
        raise ReslmError(f"{where}: its forward(u) returned {type(out).__name__}, not (states, last state) "
                         "(two tensors)")
    states, last = out
    size = getattr(res, "size", None)
    want = (PROBE_BATCH, PROBE_STEPS, size)
    if tuple(states.shape) != want or tuple(last.shape) != (PROBE_BATCH, size):
        raise ReslmError(f"{where} declares size {size} but its forward(u) gave states of shape "
                         f"{tuple(states.shape)} and a last state of {tuple(last.shape)} for an input of "
                         f"{tuple(u.shape)}: want {want} and {(PROBE_BATCH, size)}")
    if not (torch.isfinite(states).all() and torch.isfinite(last).all()):
        raise ReslmError(f"{where}: its states are not finite (NaN or inf) on a {PROBE_STEPS}-step probe input, "
                         "before any training: the file's reservoir computes them so, not the learning rate")
    return states.detach().float().clone()


def probe(res, fresh, where: str) -> None:
    """Refuse (ReslmError naming `where`, the file) a reservoir instance `res` whose states of the fixed probe
    input are not (batch, steps, its declared size), not finite, or not those of `fresh()`, a fresh instance from
    the same config (the same seed): states that are not a function of the seed and the input would make a
    run of it impossible to reproduce. The global random generators (torch, numpy, random) are put back as they
    were, so that probing changes nothing that follows. A reservoir whose states are read, not computed
    (`replays`), is not probed."""
    if getattr(res, "replays", False):
        return
    saved = torch.random.get_rng_state(), np.random.get_state(), random.getstate()
    try:
        u = _probe_input(int(getattr(res, "input_dim", 0) or getattr(getattr(res, "config", None), "input_dim", 1)))
        first = _states_of(res, u, where)
        try:
            other = fresh()
        except ReslmError:
            raise
        except Exception as e:
            raise ReslmError(f"{where}: a second instance from the same config failed: {one_line(e)}") from None
        second = _states_of(other, u, where)
    finally:
        torch.random.set_rng_state(saved[0])
        np.random.set_state(saved[1])
        random.setstate(saved[2])
    gap = (first - second).abs().max().item() if first.numel() else 0.0
    if not gap <= PROBE_ATOL:
        raise ReslmError(f"{where}: its states are not a function of its seed and input: two instances from the "
                         f"same seed gave states differing by up to {gap:.3g} on the same {PROBE_STEPS}-step probe "
                         "input (random draws from an unseeded generator?), so a run of it cannot be reproduced")


def _probed(cls: type, name: str, path: str) -> type:
    """The class a run of `name` from the file at `path` builds: `cls` itself, whose every instance built for real
    (not shape-only, on the meta device) is probed (`probe`) before it is used."""
    where = f"--import {path}: reservoir {name}"

    def __init__(self, cfg, *args, **kwargs):
        cls.__init__(self, cfg, *args, **kwargs)
        if not torch.empty(0).is_meta:
            probe(self, lambda: cls(cfg, *args, **kwargs), where)

    return type(cls)(cls.__name__, (cls,), {"__init__": __init__, "__module__": cls.__module__,
                                      "__qualname__": getattr(cls, "__qualname__", cls.__name__),
                                      "__doc__": cls.__doc__})


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
    a built-in substrate (a run of `esn` is always reslm's ESN); ImportFailed (a ReslmError) when it raises.
    The class registered as NAME@SHA12 probes each instance it builds (`probe`: the states' width, finiteness
    and that they are a function of the seed and input). The file runs in this process: what it does beyond
    RESERVOIRS and the built-in substrates' classes is not checked."""
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
                raise ImportFailed(f"--import {f} failed: " + (why if why.startswith(type(e).__name__)
                                                                else f"{type(e).__name__}: {why}"),
                                   str(path), sha, type(e)) from None
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
            pair = RESERVOIRS[n]
            probed = isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[1], type)
            RESERVOIRS[source_name(n, sha)] = (pair[0], _probed(pair[1], n, str(path))) if probed else pair
            SOURCES[source_name(n, sha)] = dict(name=n, path=str(path), sha256=sha, code=code)
        _FROM_FILE[path.resolve()] = names
        out.append(dict(path=str(path), sha256=sha, names=names))
    return out
