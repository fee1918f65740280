"""The run directory: the interface between training, generation, evaluation and reports.

    RUN_DIR/config.json      resolved config: family, preset, model fields, train fields, data, versions
    RUN_DIR/metrics.jsonl    one JSON row per logged step ("kind": "step"), per shard-epoch ("epoch"),
                             per shard's reservoir precomputation ("states"), and a final "done" row
    RUN_DIR/checkpoint.pt    model + optimizer + grad scaler + schedule position (plain tensors and
                             numbers: torch.load(..., weights_only=True) reads it)

Files are written atomically (temp file + rename), so an interrupted run leaves the last complete
checkpoint, never a half-written one. A new run directory appears only once its config is valid.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch

from reslm.errors import ReslmError

CONFIG, METRICS, CHECKPOINT = "config.json", "metrics.jsonl", "checkpoint.pt"


def atomic_write(path: Path, write) -> None:
    """Call write(tmp_path) then rename tmp_path onto path."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, obj) -> None:
    atomic_write(path, lambda p: p.write_text(json.dumps(obj, indent=2) + "\n"))


def create_run_dir(out: Path, config: dict) -> Path:
    """Make a new run directory holding config.json (atomically: a temp dir renamed into place)."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ReslmError(f"{out} already exists and is not empty (use --resume to continue a run there)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    try:
        write_json(tmp / CONFIG, config)
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        for f in tmp.glob("*"):
            f.unlink()
        tmp.rmdir()
        raise
    return out


def read_config(run_dir: Path) -> dict:
    run_dir = Path(run_dir)
    path = run_dir / CONFIG
    if not path.is_file():
        raise ReslmError(f"{run_dir} is not a reslm run directory (no {CONFIG})")
    try:
        cfg = json.loads(path.read_text())
        cfg["family"], cfg["model"], cfg["train"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ReslmError(f"{path} is not a valid run config ({e})") from None
    return cfg


def save_checkpoint(run_dir: Path, state: dict) -> None:
    atomic_write(Path(run_dir) / CHECKPOINT, lambda p: torch.save(state, p))


def load_checkpoint(run_dir: Path, map_location="cpu") -> dict | None:
    path = Path(run_dir) / CHECKPOINT
    if not path.exists():
        return None
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # a foreign or damaged file
        raise ReslmError(f"cannot read checkpoint {path}: {str(e).splitlines()[0]}") from None


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / METRICS
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class MetricsLog:
    """Append-only JSONL log; `truncate(n)` drops rows written after the checkpoint we resume from."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / METRICS
        self.rows = len(read_metrics(run_dir))

    def truncate(self, n: int) -> None:
        rows = read_metrics(self.path.parent)[:n]
        atomic_write(self.path, lambda p: p.write_text("".join(json.dumps(r) + "\n" for r in rows)))
        self.rows = len(rows)

    def write(self, row: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        self.rows += 1


# training fields that may differ between the run that was started and the one that resumes it
RUNTIME_FIELDS = ("device", "precision", "threads")


def check_same_run(run_dir: Path, want: dict) -> None:
    """Raise unless run_dir holds the model and training budget of the run config `want` (sweeps and
    reproductions continue existing runs; they must not silently mix budgets)."""
    have = read_config(run_dir)
    if have["family"] != want["family"] or have["model"] != want["model"]:
        raise ReslmError(f"{run_dir} holds a different model than asked for (remove it or use another output folder)")
    a = {k: v for k, v in have["train"].items() if k not in RUNTIME_FIELDS}
    b = {k: v for k, v in want["train"].items() if k not in RUNTIME_FIELDS}
    if a != b:
        diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        raise ReslmError(f"{run_dir} was trained with a different budget ({', '.join(diff)}); "
                         f"remove it or use another output folder")
