"""The training forward: `torch.compile` of a model's `forward_features` (TrainConfig.compile), and the
character transformer's window step on a CPU (TrainConfig.window_step: the fused C kernel of
reslm.models.window_kernel, or the plain torch path).

`torch.compile` fuses the forward and backward into fewer kernels (on CUDA in mode "reduce-overhead",
which also replays them as CUDA graphs). The optimizer step stays the run's own Adam (its state is what
checkpoints hold). It is asked for, never chosen by default: on the GPU where it was measured (the
character transformer on an H200, docs/frontier-tool.md) the compiled step trained slower than the
plain one and took a minute to compile.

    compile "auto"  the plain forward (what `reslm train` chooses; kept as a name so that saved configs load)
            "on"    compiled on any device (CPU: inductor's default mode)
            "off"   the plain forward

The compiled step computes what the plain one does: dropout keeps the plain path's random draws
(`fallback_random`: the step's seed gives the same masks, not inductor's own generator), so the losses
agree to float rounding (bitwise with the "aot_eager" backend, which tests use on a CPU). A batch of
another shape (the last one of a shard-epoch) makes torch recompile once with that dimension dynamic,
then every shape reuses it. Checkpoints, the EMA and evaluation see the model itself, never the wrapper.
"""
from __future__ import annotations

import torch

from reslm.core import native
from reslm.core.errors import ReslmError
from reslm.core.progress import say
from reslm.models import window_kernel


def wants_compile(model, compile_: str, device: torch.device) -> bool:
    """Whether the run's training forward is compiled (`compile_`: one of reslm.settings.COMPILES): only
    when asked for ("on"), on any model and device."""
    return compile_ == "on"


def compiled_forward(model, compile_: str, device: torch.device, *, backend: str | None = None,
                     announce: bool = True):
    """The training forward (x, y) -> (logits, loss): `model.forward_features`, compiled when
    `wants_compile` says so (mode "reduce-overhead" on CUDA). `backend` overrides torch's default
    ("inductor"), e.g. "aot_eager" to trace and differentiate without generating kernels."""
    forward = model.forward_features
    if not wants_compile(model, compile_, device):
        return forward
    if hasattr(model, "window_step"):
        model.window_step = "plain"   # what is compiled is the plain torch path
    import torch._inductor.config as inductor

    inductor.fallback_random = True   # dropout draws what the plain step draws
    mode = "reduce-overhead" if device.type == "cuda" and backend is None else None
    say(f"reslm: training forward compiled (torch.compile, backend {backend or 'inductor'}"
         f"{', mode ' + mode if mode else ''}; --compile off trains the plain one)",
        enabled=announce)
    return torch.compile(forward, backend=backend or "inductor", mode=mode)


def choose_window_step(model, window_step: str, compile_: str, device: torch.device, precision: str, *,
                       announce: bool = True) -> str:
    """Set which step the character transformer's window mode takes (`model.window_step`) and return it:
    "fused" (reslm.models.window_kernel: a float32 CPU step, compiled here by the C compiler) or
    "plain". `window_step` "auto" takes the fused step where it applies (CPU, fp32, window mode, no
    torch.compile, a C compiler), "fused" requires it (ReslmError saying why not), "plain" never takes
    it. Other models have no window step: "fused" is refused for them, "auto" and "plain" change nothing."""
    if not hasattr(model, "window_step"):
        if window_step == "fused":
            raise ReslmError("--window-step fused is the character transformer's (family tf) window step")
        return "plain"
    why = None
    if model.config.context_mode != "window":
        why = "the fused step is for window mode"
    elif device.type != "cpu":
        why = f"the fused step runs on a CPU, not {device.type}"
    elif precision != "fp32":
        why = f"the fused step computes in fp32, the run in {precision}"
    elif wants_compile(model, compile_, device):
        why = "the training forward is compiled"
    else:
        ok, why = window_kernel.status(model.config)
        why = None if ok else why
    if window_step == "fused" and why:
        raise ReslmError(f"--window-step fused: {why}")
    chosen = "plain" if window_step == "plain" or why else "fused"
    model.window_step = "auto" if chosen == "fused" else "plain"
    if model.config.context_mode == "window":
        say(f"reslm: window step {chosen}" + (f" ({why})" if why and window_step != "plain" else
                                              f" (C kernel, -march={native.march()})" if chosen == "fused" else ""),
            enabled=announce)
    return chosen
