"""RUN/states: a run's computed reservoir states kept on disk (`StateCache`), so that a resumed run
reads them back instead of computing them again (reslm.train's cache_states; reslm.train.batches.CharShards
reads and writes it)."""
from __future__ import annotations

import hashlib
import shutil
import sys
from pathlib import Path

import torch

from reslm.core.errors import ReslmError
from reslm.features import TensorFeatures
from reslm.core.files import atomic_write
from reslm.core.progress import say


def tensors_sha256(*tensors: torch.Tensor) -> str:
    """sha256 over the dtype, shape and raw bytes of each tensor, read in 64 MiB pieces (a memory-mapped
    tensor is streamed, not copied)."""
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().contiguous()
        h.update(f"{t.dtype} {tuple(t.shape)}\n".encode())
        flat = t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)
        for a in range(0, flat.numel(), 1 << 26):
            h.update(flat[a:a + (1 << 26)].numpy())
    return h.hexdigest()


def _cached_tensors(inputs, targets, chars, table) -> list[torch.Tensor]:
    """What a state-cache file's checksum covers: the features, and the character ids and their
    table when the head reads the current character too."""
    return [inputs, targets] + [t for t in (chars, table) if isinstance(t, torch.Tensor)]


def reserve_bytes(folder: Path) -> int:
    """The free disk that keeping more training shards' states must leave: a tenth of the disk, at
    least 4 GiB."""
    return max(4 << 30, shutil.disk_usage(folder).total // 10)


def _nbytes(feats) -> int:
    return sum(t.numel() * t.element_size() for t in (feats.inputs, feats.targets, feats.chars, feats.table)
               if isinstance(t, torch.Tensor))


class StateCache:
    """Computed features kept on disk in the run folder (RUN/states/NAME.pt) so that a resumed run
    reads them back instead of computing them again: window-mode states of a large reservoir take
    hours per shard on a CPU, longer than the gaps between a laptop's or a session's interruptions.

    Files are written atomically with a sha256 of the tensors inside (`tensors_sha256`) and read back
    memory-mapped (torch.load(mmap=True)), their checksum checked. A file of another dtype or an
    unreadable one is ignored (and recomputed); one whose checksum does not match (changed since it was
    written: an edit, bit rot) or that has none (written before checksums) is recomputed with a
    warning on stderr naming it, and replaced. Recomputing rather than refusing: the cache is derived
    data, and a recomputation gives bitwise what an intact file holds, so nothing is lost and no one
    has to delete RUN/states by hand. The test states are kept, and either the current training shard's
    only or, for a schedule that comes back to a shard (`store(..., keep_all=True)`), every training
    shard's while the disk keeps `reserve_bytes` free besides; train() removes the folder when the run
    is finished. The features are a fixed function of the run's config (reservoir, embedding,
    measurement and its noise seeds)."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        if self.folder.is_symlink() or (self.folder.exists() and not self.folder.is_dir()):
            # never a link: the cache removes the *.pt files it finds there (a user's, through a link)
            raise ReslmError(f"{self.folder} is a symbolic link or not a folder: reslm keeps a run's states only "
                             f"in a folder of its own (remove it)")
        for tmp in self.folder.glob(".*.tmp"):   # a killed writer's partial file (we hold the run's lock)
            tmp.unlink(missing_ok=True)

    def load(self, name: str, dtype: torch.dtype) -> "TensorFeatures | None":
        path = self.folder / f"{name}.pt"
        if path.is_symlink() or not path.is_file():   # a link or a special file is recomputed, never read
            return None
        try:
            d = torch.load(path, mmap=True, weights_only=True)
            inputs, targets, chars, table = d["inputs"], d["targets"], d.get("chars"), d.get("table")
        except Exception:   # noqa: BLE001 - a torn or foreign file is recomputed, never trusted
            return None
        if not (isinstance(inputs, torch.Tensor) and isinstance(targets, torch.Tensor)) \
                or inputs.dtype != dtype or inputs.dim() != 2 or len(inputs) != len(targets):
            return None
        saved = d.get("sha256")
        if saved != tensors_sha256(*_cached_tensors(inputs, targets, chars, table)):
            why = "has no checksum (written by an older reslm)" if saved is None else \
                "does not match its checksum (changed since it was written)"
            print(f"reslm: warning: the cached reservoir states {path} {why}: computing them again",
                  file=sys.stderr, flush=True)
            return None
        return TensorFeatures(inputs, targets, chars, table)

    def store(self, name: str, feats, keep_prefix: str | None = None, keep_all: bool = False) -> None:
        """Write `feats` as NAME.pt. keep_prefix: first drop every other file whose name does not start
        with it (the previous training shard's: disk), unless keep_all and the disk has room for this
        file with reserve_bytes() to spare (then every file stays)."""
        self.folder.mkdir(exist_ok=True)
        if keep_all and shutil.disk_usage(self.folder).free - _nbytes(feats) < reserve_bytes(self.folder):
            keep_all = False
        if keep_prefix is not None and not keep_all:   # drop the previous training shard's file first (disk)
            for old in self.folder.glob("*.pt"):
                if old.stem != name and not old.name.startswith(keep_prefix):
                    old.unlink(missing_ok=True)
        try:
            digest = tensors_sha256(*_cached_tensors(feats.inputs, feats.targets, feats.chars, feats.table))
            atomic_write(self.folder / f"{name}.pt",
                         lambda p: torch.save(dict(inputs=feats.inputs, targets=feats.targets, sha256=digest,
                                                   **({} if feats.chars is None else
                                                      dict(chars=feats.chars, table=feats.table))), p))
        except ReslmError as e:   # e.g. disk full: training goes on, a resume computes them again
            say(f"reslm: reservoir states not cached ({e})")
