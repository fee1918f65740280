"""Opening a run back: its model with the checkpoint's weights, its tokenizer (its dataset is
reslm.data.datasets').

The reading side of the run folder (reslm.run) that needs the model layer; below training: train,
evaluate, generate and the reports all open runs through these functions, and nothing here imports
training code. (reslm.run itself does not import this module, so that the registry of published runs,
which load_run reads, can stand on reslm.run.)

    load_model(cfg, device)        the model a run config describes (weights not loaded)
    load_run(run_dir, device)      (model with the last checkpoint's weights, tokenizer, run config)
"""
from __future__ import annotations

from pathlib import Path

import torch

from reslm.core.device import bf16_status
from reslm.core.errors import ReslmError
from reslm.data.datasets import check_dataset, codec_of, data_kind, open_dataset
from reslm.models import build_model, family
from reslm.core.radii import deferred, remember_radii
from reslm.run.registry import MANIFEST, is_published, load_published, read_manifest
from reslm.run.checkpoint import load_checkpoint
from reslm.run.folder import read_config


def load_model(cfg: dict, device="cpu"):
    """Build the model a run config describes (weights not loaded). A reservoir asked to compute in
    bfloat16 on a device without fast bf16 is refused (without hardware bf16 it runs far slower than float32)."""
    name = cfg["family"]
    family(name)
    model = cfg["model"]
    if not isinstance(model, dict):
        raise ReslmError("the run config's model section is not an object")
    model = build_model(name, **model).to(device)
    if any(getattr(getattr(m, "config", None), "dtype", None) == "bfloat16" for m in model.modules()):
        fast, why = bf16_status(torch.device(device))
        if not fast:
            raise ReslmError(f"the reservoir is set to compute in bfloat16, which is slow here ({why}): "
                             f"use --reservoir-dtype float32 (or auto)")
    return model


def load_run_model(run_dir: Path, cfg: dict, device="cpu"):
    """load_model(cfg) for the run in run_dir, with the reservoir radii the run recorded (a published
    folder's manifest, a run's checkpoint) taken as computed: no eigendecomposition of the fixed
    matrix at load (seconds at N = 2600, minutes beside a busy training), and the same matrix bit for
    bit (published: checked against its fingerprint)."""
    run_dir = Path(run_dir)
    if is_published(run_dir):
        remember_radii(read_manifest(run_dir).get("radii"), f"{run_dir / MANIFEST}")
    return load_model(cfg, device)


def load_run(run_dir: Path, device="cpu"):
    """(model in eval mode with the last checkpoint's weights, its tokenizer (encode/decode), run config).
    A published folder (reslm.run.registry) gives its weights.safetensors on the buffers its seed rebuilds."""
    cfg = read_config(run_dir)
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
