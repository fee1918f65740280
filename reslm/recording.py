"""Recording a physical reservoir: the files a device exchanges with reslm (`reslm substrate
export | simulate | import`), which make its recorded states a substrate (reservoir/recorded.py).

A device in place of the digital reservoir is driven outside reslm. The round trip:

1. export_drive (`reslm substrate export`) writes DRIVE/ for a character dataset:
     drive.npy      float32 (S, d): the input vector of every token of the whole stream, in stream order,
                    drive[t] = E[tokens[t]] (little-endian, C order, numpy .npy format)
     embedding.npy  float32 (V, d): E, the model's fixed embedding, N(0, 1/d) from torch.Generator
                    seeded with `seed` (reslm.models.reservoir_lm.fixed_embedding), to check the drive
     tokens.npy     int32 (S,): the token ids; tokens_sha256 = sha256 of these bytes (ids as <i4)
     manifest.json  format "reslm-drive", version, rows S, input_dim d, seed, dtype, files, tokens_sha256,
                    the dataset (reslm.data.datasets.describe_dataset: name, vocabulary, shards, fingerprint)
                    and the protocol below
2. the device plays it. Protocol: shard by shard (manifest "shards", [start, end) rows of the stream),
   the device starts each shard from its rest state and then reads the rows one after another without
   a reset; after reading row t it records its state, one row of N numbers. Result: one (S, N) file,
   row t = the state right after reading drive[t], as .npy (float16/32/64) or .safetensors (one tensor,
   or one named "states"; F16/BF16/F32/F64; metadata "tokens_sha256" is checked when present).
   `simulate` (`reslm substrate simulate`) is such a device made of an in-process substrate plus optional
   Gaussian measurement noise: the test's device, and the reference a hardware user compares against.
3. import_states (`reslm substrate import`) checks the states (rows == S, 2-D, dtype, every value
   finite, the drive's tokens against their sha256, and an optional sha256 the device reports) and
   writes SUBSTRATE/ (reslm/reservoir/recorded.py): manifest.json pointing at the states file (absolute
   path, bytes, sampled sha256: the file is memory-mapped where it is, never copied or loaded whole)
   and a copy of tokens.npy. `reslm train --family rc|aerc --reservoir recorded --reservoir-options
   path=SUBSTRATE` then trains on it like on any precomputed states.

Exactness: the in-process equivalent of this protocol is stream context with `streams 1` (one piece per
shard from a zero state; `warmup` then plays no part). `simulate` computes each shard with the same code
and the same time chunks as that configuration (reslm.reservoir.shard_states), so an exported, simulated
(noise 0) and imported recording gives bit for bit the features, losses and test CE of the in-process run,
as long as training reads whole shards (shard_chars 0: a truncated shard changes the chunking, not the
states beyond rounding) and evaluation reads the whole test shard from its start (eval_samples 0, and
`reslm eval --score` up to 65,536). Elsewhere the recording has more history than the in-process run: an
evaluation block in mid-shard starts from zero in process but carries the device's state in a recording.
"""
from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from reslm.data.chars import CharDataset, file_fingerprint
from reslm.core.errors import ReslmError, writing
from reslm.models.resolve import build_config
from reslm.models.reservoir_lm import ReservoirLMConfig, fixed_embedding
from reslm.core.progress import bar
from reslm.reservoir import RESERVOIRS, shard_states
from reslm.reservoir.recorded import (MANIFEST, SUBSTRATE_FORMAT, SUBSTRATE_VERSION, TOKENS_FILE, StateFile,
                                      load_tokens, read_json_file, tokens_sha256)
from reslm.reservoir.seeding import generator
from reslm.core.files import atomic_write, fsync_dir, fsync_tree, make_temp_dir, write_json
from reslm.data.datasets import describe_dataset

DRIVE_FORMAT, DRIVE_VERSION = "reslm-drive", 1
DRIVE_FILE, EMBEDDING_FILE = "drive.npy", "embedding.npy"
PROTOCOL = dict(
    reset="shard",
    response="one state row per input row: row t is the device's state right after reading drive[t]; (S, N)",
    order="shard by shard; each shard starts from the device's rest state, then runs without a reset",
    formats=".npy (float16, float32, float64) or .safetensors (one tensor or one named 'states'; "
            "F16, BF16, F32, F64; optional metadata tokens_sha256)")
NOISE_KEY = 7   # seeding key of the simulator's measurement noise (child (noise_seed, 7, shard))
_CHUNK_ROWS = 1 << 20


@contextmanager
def _new_folder(out: Path):
    """Yield a temp folder beside `out`; on success it is fsynced and renamed to `out`, on failure removed.
    `out` must not exist yet (nothing is ever replaced)."""
    out = Path(out)
    if out.exists() or out.is_symlink():
        raise ReslmError(f"{out} already exists: pick another --out (nothing is overwritten)")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ReslmError(f"cannot create {out.parent}: {e.strerror or e}") from None
    tmp = make_temp_dir(out.parent, f".{out.name}.tmp-")
    try:
        yield tmp
        fsync_tree(tmp)
        if out.exists() or out.is_symlink():
            raise ReslmError(f"{out} appeared while it was being written: pick another --out")
        os.replace(tmp, out)
        fsync_dir(out.parent)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _npy_rows(path: Path, shape: tuple[int, int]):
    """Create a float32 .npy file of `shape` and return write(a, rows): rows (k, shape[1]) into rows a..a+k-1.
    Written through the file, not a memory map, so the process never holds more than the rows it writes."""
    with writing(path):
        header = np.lib.format.open_memmap(path, mode="w+", dtype="<f4", shape=shape)
        offset, row_bytes = header.offset, shape[1] * 4
        del header                                        # the data part is a hole until written

    def write(a: int, rows) -> None:
        with writing(path), open(path, "r+b") as f:      # a full disk: names the file
            f.seek(offset + a * row_bytes)
            f.write(np.ascontiguousarray(rows, dtype="<f4").tobytes())
    return write


def _check_shards(shards, rows: int) -> None:
    ends = [0] + [b for _, b in shards]
    if [a for a, _ in shards] != ends[:-1] or ends[-1] != rows:
        raise ReslmError(f"the dataset's shards {shards} do not cover its {rows} tokens back to back")


# --- 1. export -------------------------------------------------------------------------------------
def export_drive(dataset: CharDataset, out: Path, *, embed_dim: int = 16, seed: int = 0,
                 progress: bool = False) -> Path:
    """Write DRIVE/ (drive.npy, embedding.npy, tokens.npy, manifest.json) for `dataset`: see the module doc."""
    if not isinstance(dataset, CharDataset):
        raise ReslmError("a drive is exported for a character dataset (`reslm data shakespeare|text`)")
    if not isinstance(embed_dim, int) or embed_dim < 1:
        raise ReslmError(f"embed_dim must be an integer >= 1, got {embed_dim!r}")
    if not isinstance(seed, int) or seed < 0:
        raise ReslmError(f"seed must be an integer >= 0, got {seed!r}")
    S = len(dataset)
    _check_shards(dataset.shards, S)
    E = fixed_embedding(dataset.vocab_size, embed_dim, seed).numpy()          # (V, d) float32
    tokens = np.asarray(dataset.tokens, dtype="<i4")                          # (S,)
    with _new_folder(out) as tmp:
        for name, array in ((EMBEDDING_FILE, E), (TOKENS_FILE, tokens)):
            with writing(tmp / name):   # numpy's short write on a full disk -> "no space left on device"
                np.save(tmp / name, array)
        write = _npy_rows(tmp / DRIVE_FILE, (S, embed_dim))
        for a in bar(range(0, S, _CHUNK_ROWS), desc="drive", unit="chunk", enabled=progress, leave=False):
            write(a, E[tokens[a:a + _CHUNK_ROWS]])
        write_json(tmp / MANIFEST, dict(
            format=DRIVE_FORMAT, version=DRIVE_VERSION, rows=S, input_dim=embed_dim, seed=seed, dtype="float32",
            shape=[S, embed_dim], files=dict(drive=DRIVE_FILE, embedding=EMBEDDING_FILE, tokens=TOKENS_FILE),
            tokens_sha256=tokens_sha256(tokens), shards=dataset.shards, dataset=describe_dataset(dataset),
            embedding="E = randn(V, d, torch.Generator().manual_seed(seed)) / sqrt(d); drive[t] = E[tokens[t]]",
            protocol=PROTOCOL))
    return Path(out)


def read_drive(folder: Path) -> tuple[dict, np.ndarray]:
    """(manifest, token ids) of an exported DRIVE/ folder; the ids are checked against their sha256."""
    folder = Path(folder)
    m = read_json_file(folder / MANIFEST, "a drive folder (`reslm substrate export` writes it)")
    if m.get("format") != DRIVE_FORMAT or m.get("version") != DRIVE_VERSION:
        raise ReslmError(f"{folder / MANIFEST} is not a reslm drive manifest of version {DRIVE_VERSION}")
    ids = load_tokens(folder / TOKENS_FILE, m["tokens_sha256"])
    if len(ids) != m["rows"]:
        raise ReslmError(f"{folder / TOKENS_FILE} holds {len(ids)} tokens, the manifest {m['rows']}")
    return m, ids


# --- 2. a simulated device -------------------------------------------------------------------------
def simulate(drive_dir: Path, out: Path, *, reservoir: str = "esn", size: int = 750, seed: int | None = None,
             noise: float = 0.0, noise_seed: int = 0, progress: bool = False, **reservoir_fields) -> Path:
    """Play DRIVE/ through an in-process substrate and write its states (S, N) float32 to `out` (.npy).

    The substrate is the one a reservoir LM with these settings builds (ReservoirLMConfig: `reservoir`,
    `size`, `seed` (default: the drive's), and any of its reservoir fields such as spectral_radius or
    reservoir_options), so noise 0 reproduces the in-process states exactly (module doc). `noise` adds
    N(0, noise^2) to every recorded value, seeded per shard from (noise_seed, NOISE_KEY, shard)."""
    m, _ = read_drive(drive_dir)
    if Path(out).suffix.lower() != ".npy":
        raise ReslmError(f"the simulator writes .npy files, not {Path(out).name}")
    if not (isinstance(noise, (int, float)) and np.isfinite(noise) and noise >= 0):
        raise ReslmError(f"noise must be a finite number >= 0, got {noise!r}")
    if reservoir in RESERVOIRS and not RESERVOIRS[reservoir][1].drivable:
        raise ReslmError(f"reservoir {reservoir!r} cannot be driven: simulate with an in-process substrate")
    cfg = build_config(ReservoirLMConfig, dict(vocab_size=m["dataset"]["vocab_size"], embed_dim=m["input_dim"],
                                               reservoir=reservoir, size=size, seed=m["seed"] if seed is None else seed,
                                               **reservoir_fields), "simulated substrate")
    res = RESERVOIRS[reservoir][1](cfg.reservoir_config())
    drive = StateFile(Path(drive_dir) / DRIVE_FILE)
    if drive.shape != (m["rows"], m["input_dim"]) or drive.dtype != "float32":
        raise ReslmError(f"{Path(drive_dir) / DRIVE_FILE} holds {drive.dtype} {drive.shape}, not the manifest's "
                         f"float32 {tuple(m['shape'])}")

    def write(tmp: Path):
        write_rows = _npy_rows(tmp, (m["rows"], size))
        for k, (a, b) in enumerate(bar(m["shards"], desc="simulate", unit="shard", enabled=progress, leave=False)):
            u = drive.rows(a, b)                                                            # (S_k, d)
            write_rows(a, _play_shard(res, u, noise, generator(noise_seed, NOISE_KEY, k)).numpy())

    atomic_write(Path(out), write)
    return Path(out)


def _play_shard(res, u: torch.Tensor, noise: float, gen: torch.Generator) -> torch.Tensor:
    """States (S, N) after each input of one shard u (S, d), from a zero state. The first S - 1 rows
    come from shard_states exactly as the in-process stream mode (streams 1) computes a shard of S
    tokens (the same time chunks, so the same floating-point results); the last is one more step."""
    S = u.shape[0]
    with torch.no_grad():
        if S > 1:
            head = shard_states(res, lambda i: u[i], torch.arange(S), mode="stream", context=1, streams=1,
                                warmup=0)                                                   # (S - 1, N)
            _, last = res(u[None, -1:], head[-1:])
        else:
            head = u.new_zeros(0, res.size)
            _, last = res(u[None, -1:])
        out = torch.cat([head, last])
    return out + noise * torch.randn(out.shape, generator=gen) if noise else out


# --- 3. import -------------------------------------------------------------------------------------
def import_states(states_path: Path, drive_dir: Path, out: Path, *, tokens_sha: str | None = None,
                  progress: bool = False) -> dict:
    """Check a device's states file against DRIVE/ and write SUBSTRATE/ (module doc); returns its manifest."""
    m, ids = read_drive(drive_dir)
    states_path = Path(states_path).resolve()
    sf = StateFile(states_path)
    T, N = sf.shape
    if T != m["rows"]:
        raise ReslmError(f"{states_path.name} has {T:,} rows but the drive has {m['rows']:,}: the device must "
                         f"write one state row per input row")
    for who, sha in (("--tokens-sha256", tokens_sha), ("its metadata tokens_sha256", sf.metadata.get("tokens_sha256"))):
        if sha is not None and sha != m["tokens_sha256"]:
            raise ReslmError(f"{states_path.name} was recorded on another token stream: {who} is {sha[:16]}..., "
                             f"the drive's {m['tokens_sha256'][:16]}...")
    for a, rows in bar(sf.blocks(), desc="check", unit="block", enabled=progress, leave=False):
        bad = (~torch.isfinite(rows).all(dim=1)).nonzero()
        if len(bad):
            r = a + int(bad[0])
            k = next(i for i, (s, e) in enumerate(m["shards"]) if s <= r < e)
            raise ReslmError(f"{states_path.name}: row {r:,} (shard {k}, position {r - m['shards'][k][0]:,}) holds "
                             f"a non-finite value")
    manifest = dict(
        format=SUBSTRATE_FORMAT, version=SUBSTRATE_VERSION,
        states=dict(path=str(states_path), file=file_fingerprint(states_path), shape=[T, N], dtype=sf.dtype),
        tokens_sha256=m["tokens_sha256"], shards=m["shards"], protocol=m["protocol"],
        drive=dict(path=str(Path(drive_dir).resolve()), input_dim=m["input_dim"], seed=m["seed"]),
        dataset=m["dataset"])
    with _new_folder(out) as tmp:
        with writing(tmp / TOKENS_FILE):
            shutil.copyfile(Path(drive_dir) / TOKENS_FILE, tmp / TOKENS_FILE)
        write_json(tmp / MANIFEST, manifest)
    return manifest
