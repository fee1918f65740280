"""Device and numeric precision: one place decides, everything else asks.

precision "auto" = bf16 autocast on CUDA GPUs that support it, fp16 autocast with a GradScaler on
older GPUs, fp32 on CPU (deterministic; bf16 on CPU is available with precision="bf16").
"""
from __future__ import annotations

import contextlib

import torch

from reslm.errors import ReslmError

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def pick_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ReslmError(f"unknown device {name!r}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ReslmError("device cuda requested but CUDA is not available")
    return dev


def resolve_precision(precision: str, device: torch.device) -> str:
    if precision not in PRECISIONS:
        raise ReslmError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "auto":
        if device.type != "cuda":
            return "fp32"
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    if precision == "fp16" and device.type != "cuda":
        raise ReslmError("fp16 training needs a CUDA device (use bf16 or fp32 on CPU)")
    return precision


def autocast(precision: str, device: torch.device):
    """Context manager for the forward pass under the resolved precision."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def grad_scaler(precision: str, device: torch.device):
    """A GradScaler for fp16 (dynamic loss scaling); a disabled one otherwise."""
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")


def state_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ReslmError(f"unknown dtype {name!r} (use float32 or bfloat16)")
    return DTYPES[name]


def synchronize(device: torch.device):
    """Wait for queued GPU work before reading a clock."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def setup_cuda():
    """TF32 matmuls and cuDNN autotuning on GPUs (no effect on CPU)."""
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
