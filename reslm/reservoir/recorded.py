"""Tokens -> reservoir states, for a physical substrate: the states a device measured, replayed.

The device is driven outside reslm: `reslm substrate export` writes the input vectors to play
(reslm/recording.py), the device writes one state row per input row, and `reslm substrate import`
checks that file and writes a small substrate folder this module reads:

    SUBSTRATE/manifest.json   format "reslm-recorded", the states file (absolute path, bytes, sampled
                              sha256), its shape (T, N) and dtype, the tokens' sha256, the dataset
                              (name, fingerprint, shards) and the drive (input size d, embedding seed)
    SUBSTRATE/tokens.npy      the token ids the device was driven with, int32 (T,)

Row t of the states is the device's state right after reading token t of the dataset's whole stream;
the device returns to rest at every shard start and runs continuously within a shard (the in-process
equivalent is stream context with `streams 1`: see reslm/recording.py).

`RecordedReservoir` serves the reservoir LMs (rc, aerc) in stream context only: for the tokens
tokens[a:b] of the stream, ReservoirLM.features(tokens, position=a) calls `replay`, which checks that
they are the recording's tokens a..b-1 and reads rows a..b-1 of the memory-mapped file (only those rows
are read: .npy through np.load(mmap_mode="r"), .safetensors through safe_open's slices). A recording
cannot read new input, so `forward` and `step` raise: closed-loop generation and window context need
the device in the loop (`drivable` is False; `reslm eval` scores and skips its sample).

Its config's `size` and the model's `embed_dim` come from the file (`RecordedConfig.implied`, applied by
ReservoirLMConfig.complete), e.g. `reslm train --family rc --reservoir recorded --reservoir-options
path=SUBSTRATE`.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from reslm.data.chars import file_fingerprint
from reslm.core.errors import ReslmError
from reslm.reservoir.base import Reservoir, ReservoirConfig

SUBSTRATE_FORMAT, SUBSTRATE_VERSION = "reslm-recorded", 1
MANIFEST, TOKENS_FILE = "manifest.json", "tokens.npy"
STATE_DTYPES = ("float16", "bfloat16", "float32", "float64")
_SAFETENSORS_DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64"}
SCAN_ELEMS = 2**24  # rows are read in blocks of at most this many values (64 MiB in float32)


def tokens_sha256(ids: np.ndarray) -> str:
    """sha256 of token ids as little-endian int32 (what tokens.npy holds): the tie between a token
    stream, its drive and its recording."""
    return hashlib.sha256(np.ascontiguousarray(ids, dtype="<i4").tobytes()).hexdigest()


def read_json_file(path: Path, what: str) -> dict:
    try:
        obj = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ReslmError(f"{path} is missing: not {what}") from None
    except (OSError, ValueError) as e:
        raise ReslmError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    if not isinstance(obj, dict):
        raise ReslmError(f"{path} is not a JSON object: not {what}")
    return obj


def load_npy(path: Path, mmap_mode: str | None = None) -> np.ndarray:
    """np.load(path, allow_pickle=False) with one-line errors: a file that is not a .npy array (random
    bytes, a pickle, a torn header) is "PATH is not a valid .npy file (why)", never numpy's hint to load
    it with allow_pickle."""
    try:
        with open(path, "rb") as f:
            magic = f.read(6)
        if magic != b"\x93NUMPY":
            raise ReslmError(f"{path} is not a valid .npy file (it does not start with the .npy magic bytes)")
        return np.load(path, mmap_mode=mmap_mode, allow_pickle=False)
    except OSError as e:
        raise ReslmError(f"cannot read {path}: {e.strerror or e}") from None
    except (ValueError, EOFError) as e:
        why = "it holds pickled Python objects, which reslm never loads" if "pickle" in str(e) else \
            (str(e).splitlines() or [type(e).__name__])[0]
        raise ReslmError(f"{path} is not a valid .npy file ({why})") from None


def load_tokens(path: Path, want_sha256: str) -> np.ndarray:
    """The int32 ids in a tokens.npy, checked against the sha256 its manifest recorded."""
    ids = load_npy(path)
    if ids.ndim != 1 or tokens_sha256(ids) != want_sha256:
        raise ReslmError(f"{path} does not match the tokens sha256 of its manifest (the token stream changed "
                         f"since it was written)")
    return ids.astype(np.int32, copy=False)


class StateFile:
    """A (T, N) states file, memory-mapped: .npy (np.load, mmap_mode "r") or .safetensors (one tensor,
    or the one named "states"; read through safe_open slices). `rows(a, b)` -> float32 (b - a, N)."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        kind = self.path.suffix.lower()
        self.metadata: dict = {}
        if kind == ".npy":
            self._array = load_npy(self.path, mmap_mode="r")
            self.shape, self.dtype = tuple(self._array.shape), self._array.dtype.name
        elif kind == ".safetensors":
            self._open_safetensors()
        else:
            raise ReslmError(f"{self.path}: states must be a .npy or .safetensors file")
        if len(self.shape) != 2 or min(self.shape) < 1:
            raise ReslmError(f"{self.path} holds an array of shape {self.shape}: states must be (T, N)")
        if self.dtype not in STATE_DTYPES:
            raise ReslmError(f"{self.path} holds {self.dtype} values: states must be {', '.join(STATE_DTYPES)}")

    def _open_safetensors(self):
        try:
            from safetensors import safe_open
        except ImportError:
            raise ReslmError("reading .safetensors needs the safetensors package: pip install 'reslm[hw]'") from None
        try:
            self._file = safe_open(str(self.path), framework="pt")   # the file stays mapped, nothing read yet
        except Exception as e:  # safetensors raises its own error types for a bad header
            raise ReslmError(f"cannot read {self.path} as .safetensors: {str(e).splitlines()[0] if str(e) else e!r}") from None
        names = list(self._file.keys())
        name = "states" if "states" in names else (names[0] if len(names) == 1 else None)
        if name is None:
            raise ReslmError(f"{self.path} holds {len(names)} tensors: give it one, or name the states 'states'")
        self.metadata = self._file.metadata() or {}
        self._slice = self._file.get_slice(name)
        self.shape = tuple(self._slice.get_shape())
        raw = self._slice.get_dtype()
        self.dtype = _SAFETENSORS_DTYPES.get(raw, raw)

    def rows(self, a: int, b: int) -> torch.Tensor:
        """Rows a..b-1 as a new float32 tensor (only those rows are read from the file). A C-order .npy
        maps just those rows and unmaps them after the copy, so reading the file piece by piece never
        keeps more of it mapped (resident) than one piece."""
        if not hasattr(self, "_array"):
            return self._slice[a:b].to(torch.float32).contiguous()
        whole = self._array
        if not whole.flags.c_contiguous or b <= a:
            return torch.from_numpy(np.array(whole[a:b], dtype=np.float32))
        row_bytes = whole.shape[1] * whole.dtype.itemsize
        window = np.memmap(whole.filename, dtype=whole.dtype, mode="r", offset=whole.offset + a * row_bytes,
                           shape=(b - a, whole.shape[1]))
        try:
            return torch.from_numpy(np.array(window, dtype=np.float32))
        finally:
            del window

    def blocks(self):
        """(first row, float32 rows) over the whole file, SCAN_ELEMS values at a time."""
        T, N = self.shape
        step = max(1, SCAN_ELEMS // N)
        for a in range(0, T, step):
            yield a, self.rows(a, min(T, a + step))


def read_substrate(path: Path | str) -> dict:
    """The manifest of an imported substrate folder (format checked; the states file must still exist
    with the size it had at import)."""
    folder = Path(path)
    if not folder.is_dir():
        raise ReslmError(f"recorded substrate {folder} is not a folder (make one with `reslm substrate import`)")
    m = read_json_file(folder / MANIFEST, "a recorded substrate (`reslm substrate import` writes it)")
    if m.get("format") != SUBSTRATE_FORMAT:
        raise ReslmError(f"{folder / MANIFEST} is not a recorded substrate manifest (format {m.get('format')!r})")
    if m.get("version") != SUBSTRATE_VERSION:
        raise ReslmError(f"{folder / MANIFEST} has version {m.get('version')!r}; this reslm reads version "
                         f"{SUBSTRATE_VERSION}: re-import the states")
    states = Path(m["states"]["path"])
    try:
        size = states.stat().st_size
    except OSError:
        raise ReslmError(f"the states file of {folder}, {states}, is missing: re-import it") from None
    if size != m["states"]["file"]["bytes"]:
        raise ReslmError(f"the states file {states} changed since it was imported into {folder}: re-import it")
    return m


@dataclass
class RecordedConfig(ReservoirConfig):
    size: int = 0                   # N: the recording's state columns (the character models take it from the file)
    input_dim: int = 16             # d: the drive's input size (taken from the file too)
    seed: int = 0                   # unused: a recording draws nothing (kept for the reservoir contract)
    path: str = ""                  # the folder `reslm substrate import --out` wrote

    context_modes = ("stream",)     # not a field: a recording has one state per position of the stream

    def validate(self):
        if not self.path:
            raise ReslmError("the recorded substrate needs path=SUBSTRATE (a folder from `reslm substrate import`); "
                             "it serves the character families rc and aerc")
        m = read_substrate(self.path)
        T, N = m["states"]["shape"]
        if self.size != N:
            raise ReslmError(f"the recording in {self.path} has {N} state columns, not size {self.size} "
                             f"(leave --size out: a recorded substrate takes it from its file)")

    @staticmethod
    def implied(options: dict) -> dict:
        """The reservoir-LM fields the recording fixes, from its options: {"size": N, "embed_dim": d}."""
        if not options.get("path"):
            return {}
        m = read_substrate(options["path"])
        return {"size": m["states"]["shape"][1], "embed_dim": m["drive"]["input_dim"]}


class RecordedReservoir(Reservoir):
    """A recording in place of a reservoir: `replay(tokens, offset)` -> the states measured after each
    token; `forward`/`step` raise (see the module doc)."""

    drivable = False
    replays = True

    def __init__(self, cfg: RecordedConfig):
        super().__init__(cfg)
        self.manifest = read_substrate(cfg.path)
        self._states, self._tokens = None, None   # opened on first use: building a model reads no states

    def _open(self):
        if self._states is None:
            m, folder = self.manifest, Path(self.config.path)
            states = Path(m["states"]["path"])
            if file_fingerprint(states) != m["states"]["file"]:
                raise ReslmError(f"the states file {states} changed since it was imported into {folder}: re-import it")
            self._tokens = load_tokens(folder / TOKENS_FILE, m["tokens_sha256"])
            self._states = StateFile(states)
        return self._states, self._tokens

    def replay(self, tokens: torch.Tensor, offset: int | None) -> torch.Tensor:
        """States (S, N), float32 on tokens' device: row i is the state recorded right after token
        offset + i of the stream. ReslmError unless `tokens` (S,) are the recording's tokens there."""
        if offset is None:
            raise ReslmError("a recorded substrate needs the position of the tokens in its stream (features(..., position=))")
        states, ids = self._open()
        S = tokens.numel()
        if offset < 0 or offset + S > len(ids):
            raise ReslmError(f"positions {offset}..{offset + S - 1} lie outside the recording's {len(ids)} rows")
        if not np.array_equal(ids[offset:offset + S], tokens.detach().cpu().numpy()):
            raise ReslmError(f"the tokens at positions {offset}..{offset + S - 1} are not the ones the substrate in "
                             f"{self.config.path} was recorded on (another dataset?)")
        return states.rows(offset, offset + S).to(tokens.device)

    def init_state(self, batch: int, device=None, dtype=None) -> torch.Tensor:
        return torch.zeros(batch, self.size, device=device, dtype=dtype or torch.float32)

    def _refuse(self, *_):
        raise ReslmError("a recorded substrate only replays its recording: it cannot read new input (closed-loop "
                         "generation and window context need the device in the loop)")

    forward = step = _refuse
