"""The compiled training forward: `torch.compile` of a model's `forward_features` (TrainConfig.compile).

A small model's training step on a GPU is bound by kernel launches, not by arithmetic (a tf-64-4-4
step is a few hundred kernels of a few microseconds each). `torch.compile(mode="reduce-overhead")`
fuses the forward and backward into a few kernels and replays them as CUDA graphs, so a step costs a
handful of launches. The optimizer step stays the run's own Adam (its state is what checkpoints hold).

    compile "auto"  compiled on CUDA for a model that says it compiles (`compilable = True`: the
                    character transformer); the plain forward everywhere else
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

from reslm.core.progress import say


def wants_compile(model, compile_: str, device: torch.device) -> bool:
    """Whether the run's training forward is compiled (`compile_`: one of reslm.settings.COMPILES)."""
    if compile_ == "auto":
        return device.type == "cuda" and bool(getattr(model, "compilable", False))
    return compile_ == "on"


def compiled_forward(model, compile_: str, device: torch.device, *, backend: str | None = None,
                     announce: bool = True):
    """The training forward (x, y) -> (logits, loss): `model.forward_features`, compiled when
    `wants_compile` says so (mode "reduce-overhead" on CUDA). `backend` overrides torch's default
    ("inductor"), e.g. "aot_eager" to trace and differentiate without generating kernels."""
    forward = model.forward_features
    if not wants_compile(model, compile_, device):
        return forward
    import torch._inductor.config as inductor

    inductor.fallback_random = True   # dropout draws what the plain step draws
    mode = "reduce-overhead" if device.type == "cuda" and backend is None else None
    say(f"reslm: training forward compiled (torch.compile, backend {backend or 'inductor'}"
         f"{', mode ' + mode if mode else ''}; --compile off trains the plain one)",
        enabled=announce)
    return torch.compile(forward, backend=backend or "inductor", mode=mode)
