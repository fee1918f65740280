"""Loading a trained run back: the model with its weights and the vocabulary."""
from __future__ import annotations

from pathlib import Path

from reslm.errors import ReslmError
from reslm.run import load_checkpoint, read_config


def load_run(run_dir: Path, device="cpu"):
    """(model in eval mode with the last checkpoint's weights, vocabulary list, run config)."""
    from reslm.train import load_model
    cfg = read_config(run_dir)
    ck = load_checkpoint(run_dir, map_location=device)
    if ck is None:
        raise ReslmError(f"{run_dir} has no checkpoint yet (train it first)")
    model = load_model(cfg, device)
    try:
        model.load_state_dict(ck["model"])
    except (RuntimeError, KeyError) as e:
        raise ReslmError(f"checkpoint in {run_dir} does not match its config: {str(e).splitlines()[0]}") from None
    return model.eval(), cfg["data"]["vocab"], cfg
