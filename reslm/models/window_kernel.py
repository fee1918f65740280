"""The character transformer's fused window step on a CPU (TrainConfig.window_step, "fused").

In window mode (the paper's protocol: one target per 32-character window) every window goes through
all layers on its own, and the plain torch step spends most of its time on memory passes over
(B, h, T, T) attention tensors, dropout masks and reshapes around matrices of inner dimension 16
(docs/transformer-speed.md). kernels/window_transformer.c computes the same layers one window at a
time, with the window's layers in the cache, in parallel over the batch (OpenMP, torch's thread
count). In training (`_WindowLoss`) each window makes one pass: forward through the layers keeping
their intermediates, the head and the cross-entropy, then the backward; elsewhere (`_WindowStack`)
the forward keeps each layer's input only and the backward recomputes each layer from it.

Same model, same parameters, same checkpoints: the layers' weights are packed into one vector per
step (a differentiable `torch.cat`, so autograd hands each parameter its gradient); the embedding
and the positional encoding stay in torch, the head and the loss too outside training. What differs from the plain path is
where dropout's randomness comes from: a mask element is a 32-bit hash of its index in the plain
path's tensor of that site under a seed pair per (layer, site) drawn from torch's generator each step
(`draw_seeds`; torch.manual_seed still decides every mask), so the backward regenerates masks instead
of storing them. `HashedDropout` gives the plain path the very same masks (tests compare gradients
through it), and `hashed_drop_mask` is the reference of the hash.

The fused step applies to a float32 CPU forward of full windows (T = context) in window mode, in
training and evaluation; anything else (CUDA, bf16 autocast, the causal mode, a shorter window, sizes
the kernel does not lay out (`unsupported`), no C compiler) runs the plain path. `status(cfg)` says which and why.
"""
from __future__ import annotations

import ctypes
import math
from pathlib import Path

import torch

from reslm.core import native
from reslm.core.errors import OutOfMemory, ReslmError
from reslm.models.base import next_token_loss

SOURCE = Path(__file__).with_name("kernels") / "window_transformer.c"
DROPOUT_SITES = 4   # dropout calls per layer: attention weights, attention out, ff hidden, ff out


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash of int32 values (xorshift-multiply rounds; products wrap modulo 2^32, the
    right shifts are made logical by masking); the kernel's mix32 on uint32, bit for bit."""
    x = x ^ ((x >> 16) & 0xFFFF)
    x = x * 0x7FEB352D
    x = x ^ ((x >> 15) & 0x1FFFF)
    x = x * 0x2C1B3C6D
    return x ^ ((x >> 16) & 0xFFFF)


def hashed_drop_mask(shape: torch.Size, p: float, seed: torch.Tensor, device: torch.device | str = "cpu") -> torch.Tensor:
    """Bool tensor, True where an element is DROPPED (probability round(p * 2^32) / 2^32): the hash of
    the element's flat index i, mix32((i ^ seed[1]) * (seed[0] | 1)), under the site's seed pair
    (int32 tensor of shape (2,)). The seed picks an odd multiplier and an xor of the index, so masks
    under different seeds are not shifted copies of each other."""
    n = math.prod(shape)
    if n >= 2**31:
        raise ReslmError(f"hashed dropout numbers elements in int32; a tensor of {n} elements is too large")
    i = torch.arange(n, dtype=torch.int32, device=device).view(shape)
    h = mix32((i ^ seed[1]) * (seed[0] | 1))
    return h < -2**31 + round(p * 2**32)


class HashedDropout:
    """dropout(x, p, training) for the plain path (CharTransformer._forward's `drop`) with the masks of
    the fused kernel: call c uses the seed pair seeds[c] ((n_layers * DROPOUT_SITES, 2) int32, from
    `draw_seeds`); like reslm.models.transformer.dropout, no 1/(1-p) rescaling."""

    def __init__(self, seeds: torch.Tensor | None):
        self.seeds, self.used = seeds, 0

    def __call__(self, x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
        if not training or p == 0.0:
            return x
        seed = self.seeds[self.used]
        self.used += 1
        return torch.where(hashed_drop_mask(x.shape, p, seed, x.device), 0.0, x)


def draw_seeds(n_layers: int) -> torch.Tensor:
    """One step's dropout seed pairs, (n_layers * DROPOUT_SITES, 2) int32, from torch's global generator."""
    return torch.randint(-2**31, 2**31, (n_layers * DROPOUT_SITES, 2), dtype=torch.int64).to(torch.int32)


def _macros(cfg) -> tuple[tuple[str, int], ...]:
    return (("D", cfg.embed_dim), ("T", cfg.context), ("H", cfg.n_heads), ("F", cfg.ff_dim), ("L", cfg.n_layers))


def unsupported(cfg) -> str | None:
    """Why the kernel's layout does not fit these sizes on this CPU (None: it does): it keeps a row's
    channels in vectors of `native.vector_floats()` floats, each head's channels side by side in one."""
    d, h, n = cfg.embed_dim, cfg.n_heads, native.vector_floats()
    if d % n or d % h or n % (d // h):
        return (f"the fused step needs embed_dim a multiple of {n} and embed_dim/n_heads dividing {n} on this CPU "
                f"(got {d} and {h} heads)")
    return None


def library(cfg) -> ctypes.CDLL | None:
    """The kernel compiled for this configuration's sizes (cached), or None where it cannot be built
    or its layout does not fit them (`unsupported`)."""
    if unsupported(cfg):
        return None
    lib = native.build(SOURCE, _macros(cfg))
    if lib is not None and not getattr(lib, "_reslm_typed", False):
        p, i64, i32, dbl = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_double
        lib.reslm_window_forward.argtypes = [i64, p, p, p, dbl, i32, i32, p, p]
        lib.reslm_window_backward.argtypes = [i64, p, p, p, p, dbl, i32, i32, p, p]
        lib.reslm_window_train.argtypes = [i64, p, p, p, p, i32, p, p, dbl, i32, i32, p, p, p, p, p]
        lib.reslm_window_forward.restype = lib.reslm_window_backward.restype = lib.reslm_window_train.restype = i32
        lib.reslm_params_per_layer.restype = i32
        lib._reslm_typed = True
    return lib


def status(cfg) -> tuple[bool, str]:
    """(whether the fused step can run for this configuration here, why not / what runs)."""
    if cfg.context_mode != "window":
        return False, "the fused step is for window mode"
    if unsupported(cfg):
        return False, unsupported(cfg)
    if library(cfg) is None:
        return False, native.why_not(SOURCE) or "the kernel did not build"
    return True, f"fused window step ({native.compiler()}, -march={native.march()})"


def fits(model) -> bool:
    """Whether `model` itself can take the fused step on a CPU: window mode, float32 parameters and a
    kernel built for its sizes (what `applies` asks of the model, not of a batch)."""
    return (model.config.context_mode == "window" and model.embed.weight.dtype == torch.float32
            and library(model.config) is not None)


def applies(model, x: torch.Tensor) -> bool:
    """Whether `model`'s forward on windows `x` can take the fused step: float32 on a CPU, no autocast,
    full windows in window mode, and a kernel built for its sizes."""
    return (x.device.type == "cpu" and x.dim() == 2 and x.shape[1] == model.config.context
            and not torch.is_autocast_enabled("cpu") and fits(model))


def _packed(model) -> torch.Tensor:
    """The layers' parameters in the kernel's order (differentiable: gradients flow to each)."""
    parts = []
    for layer in model.layers:
        att = layer.self_attn
        parts += [att.in_proj_weight, att.in_proj_bias, att.out_proj.weight, att.out_proj.bias,
                  layer.linear1.weight, layer.linear1.bias, layer.linear2.weight, layer.linear2.bias,
                  layer.norm1.weight, layer.norm1.bias, layer.norm2.weight, layer.norm2.bias]
    return torch.cat([t.reshape(-1) for t in parts])


def _ptr(t: torch.Tensor) -> int:
    return t.data_ptr()


class _WindowStack(torch.autograd.Function):
    """x0 (B, T, d), packed layer parameters -> the last layer's output at the last position (B, d)."""

    @staticmethod
    def forward(ctx, x0, packed, lib, seeds, p, train, threads):
        x0, packed = x0.contiguous(), packed.contiguous()
        B, T, d = x0.shape
        L = packed.numel() // lib.reslm_params_per_layer()
        saved = torch.empty(B, L, T, d) if train or x0.requires_grad or packed.requires_grad else None
        y = torch.empty(B, d)
        seeds = seeds.contiguous()
        if lib.reslm_window_forward(B, _ptr(x0), _ptr(packed), _ptr(seeds), p, int(train), threads,
                                    _ptr(saved) if saved is not None else None, _ptr(y)):
            raise OutOfMemory("the fused window step could not allocate its workspace")
        ctx.lib, ctx.p, ctx.train, ctx.threads = lib, p, train, threads
        ctx.save_for_backward(saved if saved is not None else torch.empty(0), packed, seeds)
        return y

    @staticmethod
    def backward(ctx, dy):
        saved, packed, seeds = ctx.saved_tensors
        B, L, T, d = saved.shape
        dx0 = torch.empty(B, T, d)
        grads = torch.zeros(ctx.threads, packed.numel())
        if ctx.lib.reslm_window_backward(B, _ptr(saved), _ptr(dy.contiguous().float()), _ptr(packed), _ptr(seeds),
                                         ctx.p, int(ctx.train), ctx.threads, _ptr(dx0), _ptr(grads)):
            raise OutOfMemory("the fused window step could not allocate its workspace")
        return dx0, grads.sum(0), None, None, None, None, None


class _WindowLoss(torch.autograd.Function):
    """x0 (B, T, d), packed layer parameters, the head's weight (V, d) and bias (V), targets (B) -> (the
    mean cross-entropy, the logits (B, V)), with every gradient of the loss computed in the same pass
    (backward only scales them). A backward through the logits is refused (ReslmError)."""

    @staticmethod
    def forward(ctx, x0, packed, hw, hb, targets, lib, seeds, p, train, threads):
        x0, packed, hw, hb = x0.contiguous(), packed.contiguous(), hw.contiguous(), hb.contiguous()
        B, V = x0.shape[0], hw.shape[0]
        targets = targets.reshape(-1).to(torch.int64).contiguous()
        if targets.numel() != B or (B and not 0 <= int(targets.min()) <= int(targets.max()) < V):
            raise ReslmError(f"the fused training step needs one target in [0, {V}) per window")
        logits, losses, dx0 = torch.empty(B, V), torch.empty(B), torch.empty_like(x0)
        grads, ghead = torch.zeros(threads, packed.numel()), torch.zeros(threads, hw.numel() + V)
        if lib.reslm_window_train(B, _ptr(x0), _ptr(packed), _ptr(hw), _ptr(hb), V, _ptr(targets), _ptr(seeds.contiguous()),
                                  p, int(train), threads, _ptr(logits), _ptr(losses), _ptr(dx0), _ptr(grads), _ptr(ghead)):
            raise OutOfMemory("the fused window step could not allocate its workspace")
        gh = ghead.sum(0)
        ctx.save_for_backward(dx0, grads.sum(0), gh[:hw.numel()].view_as(hw), gh[hw.numel():])
        ctx.set_materialize_grads(False)
        return losses.mean(), logits

    @staticmethod
    def backward(ctx, g, g_logits):
        if g_logits is not None or g is None:
            raise ReslmError("the fused training step computes the gradient of its loss only; for a gradient through "
                             "the logits set model.window_step = 'plain' or call with targets=None")
        dx0, gp, ghw, ghb = ctx.saved_tensors
        return dx0 * g, gp * g, ghw * g, ghb * g, None, None, None, None, None, None


def fused_forward(model, x: torch.Tensor, targets: torch.Tensor | None = None, seeds: torch.Tensor | None = None):
    """model.forward_features(x, targets) through the kernel: (logits (B, 1, V), loss). In training with
    dropout the masks come from `seeds` (default: `draw_seeds`, from torch's generator); in eval mode
    the logits equal the plain path's up to float rounding. In training mode with targets and a gradient
    wanted, the kernel computes the loss and its every gradient in one pass (each layer once, not
    again in the backward); a backward through the logits it returns then is refused."""
    lib = library(model.config)
    if lib is None:
        why = unsupported(model.config) or native.why_not(SOURCE)
        raise ReslmError(f"the fused window step is not available here: {why}")
    p = float(model.config.dropout)
    train = bool(model.training and p > 0)
    if seeds is None:
        seeds = draw_seeds(len(model.layers)) if train else torch.zeros(len(model.layers) * DROPOUT_SITES, 2,
                                                                        dtype=torch.int32)
    x0 = model.embed(x) + model.pe[:x.shape[1]]
    if model.training and targets is not None and torch.is_grad_enabled():
        loss, logits = _WindowLoss.apply(x0, _packed(model), model.head.weight, model.head.bias, targets, lib, seeds, p,
                                         train, torch.get_num_threads())
        return logits[:, None, :], loss
    h = _WindowStack.apply(x0, _packed(model), lib, seeds, p, train, torch.get_num_threads())
    logits = model.head(h[:, None, :])
    return logits, next_token_loss(logits, targets)
