"""Opening a run back: its model with the checkpoint's weights, its tokenizer (its dataset is
reslm.data.datasets').

The reading side of the run folder (reslm.run) that needs the model layer; below training: train,
evaluate, generate and the reports all open runs through these functions, and nothing here imports
training code. (reslm.run itself does not import this module, so that the registry of published runs,
which load_run reads, can stand on reslm.run.)

    load_model(cfg, device)        the model a run config describes (weights not loaded)
    check_fits(spec)               refuse a model whose weights alone cannot fit in memory, before it is built
    load_run(run_dir, device)      (model with the last checkpoint's weights, tokenizer, run config)
    check_source(run_dir, cfg)     refuse a run whose reservoir a user's file registered unless this process
                                   ran that file (--import FILE.py, its sha256 the one the run records)
"""
from __future__ import annotations

from pathlib import Path

import torch

from reslm.core.device import bf16_status, check_memory
from reslm.core.errors import ReslmError
from reslm.data.datasets import check_dataset, codec_of, data_kind, open_dataset
from reslm.models import build_model, family
from reslm.models.resolve import ModelSpec, resolve
from reslm.core.radii import deferred, remember_radii
from reslm.reservoir.registry import RESERVOIRS, SOURCES
from reslm.run.registry import MANIFEST, is_published, load_published, read_manifest
from reslm.run.checkpoint import load_checkpoint
from reslm.run.folder import read_config
from reslm.run.source import SOURCE, read_source


def check_fits(spec: ModelSpec, flag: str = "--size") -> None:
    """Refuse, before any matrix is drawn, a model whose weights alone do not fit in memory (every model is
    built on the CPU first), by the one rule of reslm.core.device.check_memory: exit 2 beyond what this process
    can ever hold (the machine, its cgroup, `ulimit -v`), 75 (try again later) beyond what is available now.
    `flag` names the setting that shrinks it. The count is a lower bound: building takes some more."""
    size = getattr(spec.config, "size", None)
    what = f"a model of reservoir size {size:,}" if isinstance(size, int) else "the model"
    check_memory(spec.bytes, f"{what} (its weights)", f"give a smaller {flag}")


def load_model(cfg: dict, device="cpu"):
    """Build the model a run config describes (weights not loaded), once its weights are known to fit in
    memory (check_fits). A reservoir asked to compute in bfloat16 on a device without fast bf16 is refused
    (without hardware bf16 it runs far slower than float32)."""
    name = cfg["family"]
    family(name)
    model = cfg["model"]
    if not isinstance(model, dict):
        raise ReslmError("the run config's model section is not an object")
    spec = resolve(name, model)
    check_fits(spec)
    model = build_model(name, spec.config).to(device)
    if any(getattr(getattr(m, "config", None), "dtype", None) == "bfloat16" for m in model.modules()):
        fast, why = bf16_status(torch.device(device))
        if not fast:
            raise ReslmError(f"the reservoir is set to compute in bfloat16, which is slow here ({why}): "
                             f"use --reservoir-dtype float32 (or auto)")
    return model


class NeedsImport(ReslmError):
    """A run whose reservoir a user's file registered, read without that file: one line naming the run, its
    reservoir, the sha256 it records and the flag that reads it (--import FILE.py)."""


def _not_these(name: str, file: str | None) -> str:
    """The --import files this process ran, none of which is the one a run needs ("not --import a.py (sha256 ...)
    nor b.py (sha256 ...)"): those that registered the run's reservoir name, or share its file's name, first;
    "" when it ran none."""
    ran = {}
    for s in SOURCES.values():
        ran.setdefault(s["sha256"], s)
    alike = sorted(ran.values(), key=lambda s: not (s["name"] == name or Path(s["path"]).name == file))
    shown = [f"{s['path']} (sha256 {s['sha256'][:12]})" for s in alike[:3]]
    return "not --import " + " nor ".join(shown) + (f" nor {len(alike) - 3} other(s)" if len(alike) > 3 else "") \
        if shown else ""


def check_source(run_dir: Path, cfg: dict, how: str = "give --import FILE.py with that file") -> None:
    """Before a run's model is built: a run whose reservoir came from a user's file (its record,
    reslm.run.source, or a reservoir named NAME@SHA12) is read only once this process ran that file, an
    `--import FILE.py` whose whole sha256 is the one the run records (reslm.reservoir.registry.SOURCES).
    NeedsImport otherwise, naming the run, its reservoir and the sha256 it records, the --import files this
    process ran instead (each with its sha256), and ending with `how` (the flag that reads it); a record that
    contradicts the run's config is a ReslmError naming it. The run's copy of the file is hashed (read_source),
    never run."""
    model = cfg.get("model")
    reservoir = model.get("reservoir") if isinstance(model, dict) else None
    record = read_source(run_dir)
    if record is None and not (isinstance(reservoir, str) and "@" in reservoir):
        return
    if record is not None and record["reservoir"] != reservoir:
        raise ReslmError(f"{Path(run_dir) / SOURCE} records the reservoir {record['reservoir']}, its config "
                         f"{reservoir}")
    name, _, short = reservoir.partition("@")
    sha = record["sha256"] if record else short
    ran = SOURCES.get(reservoir)
    if reservoir in RESERVOIRS and ran is not None and ran["sha256"].startswith(sha):
        return
    file = f"your file {record['file']}" if record else "a file of yours"
    why = _not_these(name, record["file"] if record else None) or "run only when you name it"
    raise NeedsImport(f"{run_dir}: its reservoir {reservoir} is from {file} (sha256 {sha[:12]}), {why}: {how}")


def load_run_model(run_dir: Path, cfg: dict, device="cpu"):
    """load_model(cfg) for the run in run_dir, with the reservoir radii the run recorded (a published
    folder's manifest, a run's checkpoint) taken as computed: no eigendecomposition of the fixed
    matrix at load (seconds at N = 2600, minutes beside a busy training), and the same matrix bit for
    bit (published: checked against its fingerprint)."""
    run_dir = Path(run_dir)
    check_source(run_dir, cfg)
    if is_published(run_dir):
        remember_radii(read_manifest(run_dir).get("radii"), f"{run_dir / MANIFEST}")
    return load_model(cfg, device)


def load_run(run_dir: Path, device="cpu"):
    """(model in eval mode with the last checkpoint's weights, its tokenizer (encode/decode), run config).
    A published folder (reslm.run.registry) gives its weights.safetensors on the buffers its seed rebuilds."""
    cfg = read_config(run_dir)
    check_source(run_dir, cfg)
    if is_published(run_dir):
        model = load_published(run_dir, load_run_model(run_dir, cfg, device))
    else:
        ck = load_checkpoint(run_dir, map_location=device)   # refuses another run's or a damaged checkpoint
        if ck is None:
            raise ReslmError(f"{run_dir} has no checkpoint yet (train it first)")
        with deferred():   # the checkpoint holds the scaled reservoir: no eigendecomposition to rebuild it
            model = load_model(cfg, device)
        try:
            model.load_state_dict(ck["model"])
        except (RuntimeError, KeyError, TypeError) as e:
            raise ReslmError(f"checkpoint in {run_dir} does not match its config: "
                             f"{(str(e).strip().splitlines() or [type(e).__name__])[0]}") from None
    ds = None
    if data_kind(cfg["data"]) == "tokens":  # the tokenizer lives with the dataset: check it is the run's
        ds = open_dataset(cfg["data"])
        check_dataset(cfg, ds)
    return model.eval(), codec_of(cfg, ds), cfg
