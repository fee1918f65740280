"""Tokens -> reservoir states: the states of a whole shard, computed once and reused across
epochs (paper: "reservoir responses are precomputed shard-wise and kept in memory").

Sample i of a token stream tokens[0:S] is the context tokens[i : i + context] with target
tokens[i + context] (the same samples as the transformer's windows). Its reservoir feature is the
state right after reading tokens[i + context - 1]. Two context modes:

- ``window`` (the paper's reference): each sample's state is computed from a zero state over its own
  `context` tokens: `context` reservoir steps per sample, memory limited to the window.
- ``stream``: the shard is cut into `streams` contiguous pieces run side by side with their state
  carried through: one reservoir step per token, memory beyond the window. Each piece is preceded by
  `warmup` tokens of the text before it (default: `context`; at most one piece's length; run from a
  zero state, states discarded), so every sample has at least min(position + 1, warmup + 1) tokens
  of history; with warmup >= context that is at least what the window mode sees.

Both run as batched recurrences: B sequences advance together, so each step is one
(B, N) x (N, N) matrix product (see ESN.forward).

Window mode shares common prefixes. A window's state after k steps depends only on its first k
tokens, and natural text repeats short strings, so few distinct short prefixes serve many windows.
The windows are sorted (lexicographically, whole shard), and step k runs once per distinct k-prefix
within a sorted chunk, from its (k-1)-prefix's state: fewer reservoir steps, with the same arithmetic
per step. It needs a reservoir whose forward(u, s0) is a pure function of its arguments (class
attribute `pure = True`: every registered digital substrate); a device that cannot be set to a given
state (a physical reservoir) runs every window from zero. Each step of a chunk also costs a dozen
small index operations, so sharing is the default only from N = SHARE_MIN_SIZE on, where the step's
GEMM outweighs them (the prefix counts and timings behind that threshold: docs/design-figures.md).
"""
from __future__ import annotations

import inspect
import math
from typing import Callable

import torch

from reslm.core.errors import ReslmError
from reslm.reservoir.base import CONTEXT_MODES
from reslm.core.progress import bar

SHARE_MIN_SIZE = 500   # window states share prefixes from this reservoir size on (module doc)


def shard_states(reservoir, embed: Callable[[torch.Tensor], torch.Tensor], tokens: torch.Tensor, *,
                 mode: str, context: int, streams: int = 1024, warmup: int | None = None,
                 dtype: torch.dtype = torch.float32, compute_dtype: torch.dtype | None = None,
                 chunk_elems: int = 2**22, progress: bool = False, desc: str = "reservoir",
                 share_prefixes: bool | None = None,
                 readout: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """States (M, N) with M = len(tokens) - context; row i is sample i's feature (see module doc).
    With `readout` (a fixed map (..., N) -> (..., D), such as a projection) each chunk of states is
    read through it before it is stored: (M, D), never the (M, N) states.

    dtype is how the states are stored, compute_dtype (default: dtype) what the reservoir computes in:
    bfloat16 storage halves the memory on any machine, bfloat16 compute pays only where the hardware
    has fast bf16 (the caller decides: reslm.core.device.bf16_fast).
    reservoir: forward(u (B,T,d), s0) -> (states (B,T,N), s_T) and attribute `size`.
    embed: token ids (...,) -> input vectors (..., d).
    chunk_elems bounds the working buffer (time-chunk x batch x N elements); 2^22 (16 MiB in fp32)
    keeps it near the caches, which is faster than a larger buffer (docs/design-figures.md).
    share_prefixes (window mode): compute a prefix shared by several windows once (module doc);
    None = where the reservoir is `pure` and N >= SHARE_MIN_SIZE. False runs every window from zero
    (the reference).
    """
    S = tokens.numel()
    M = S - context
    if M <= 0:
        raise ReslmError(f"a stream of {S} tokens has no sample for context {context}")
    if mode not in CONTEXT_MODES:
        raise ReslmError(f"unknown context mode {mode!r} (choose from {', '.join(CONTEXT_MODES)})")
    N = reservoir.size
    compute_dtype = compute_dtype or dtype
    read = readout or (lambda s: s)
    with torch.no_grad():
        D = read(torch.zeros(1, N, dtype=compute_dtype, device=tokens.device)).shape[-1]
        if mode == "window":
            if share_prefixes is None:
                share_prefixes = reservoir.pure and N >= SHARE_MIN_SIZE
            window = _shared_window_states if share_prefixes else _window_states
            return window(reservoir, embed, tokens, M, context, N, D, read, dtype, compute_dtype, chunk_elems,
                          progress, desc)
        return _stream_states(reservoir, embed, tokens, M, context, N, D, read, streams,
                              context if warmup is None else warmup, dtype, compute_dtype, chunk_elems, progress,
                              desc)


def _work(reservoir, elems: int, compute: torch.dtype, device) -> dict:
    """{"work": one buffer for every chunk} where the reservoir's forward takes one (reslm's ESN:
    its (T,B,N) states and a (B,N) scratch, so elems = (T + 1) B N)."""
    takes = "work" in inspect.signature(reservoir.forward).parameters
    return {"work": torch.empty(elems, dtype=compute, device=device)} if takes else {}


def _window_states(reservoir, embed, tokens, M, context, N, D, read, dtype, compute, chunk_elems, progress, desc):
    out = torch.empty(M, D, dtype=dtype, device=tokens.device)
    batch = min(M, max(256, chunk_elems // (context * N)))   # >= 256 rows keep the GEMMs efficient
    offsets = torch.arange(context, device=tokens.device)
    work = _work(reservoir, batch * (context + 1) * N, compute, tokens.device)
    for i0 in bar(range(0, M, batch), desc=f"{desc} (window)", unit="chunk", enabled=progress, leave=False):
        i1 = min(M, i0 + batch)
        windows = tokens[torch.arange(i0, i1, device=tokens.device)[:, None] + offsets]   # (b, context)
        _, last = reservoir(embed(windows).to(compute), **work)                             # (b, N)
        out[i0:i1] = read(last)                                                             # stored as dtype
    return out


def _sorted_windows(tokens: torch.Tensor, M: int, context: int) -> torch.Tensor:
    """The start positions 0..M-1 in lexicographic order of their windows tokens[i : i + context]
    (ties in position order): the windows packed base V into int64 keys, then stable sorts from the
    last key to the first."""
    V = max(2, int(tokens.max()) + 1)
    per = 1
    while V ** (per + 1) < 2**63:
        per += 1
    t = tokens.to(torch.int64)
    order = torch.arange(M, device=tokens.device)
    for j0 in reversed(range(0, context, per)):
        key = torch.zeros(M, dtype=torch.int64, device=tokens.device)
        for j in range(j0, min(context, j0 + per)):
            key.mul_(V).add_(t[j:j + M])
        order = order[torch.sort(key[order], stable=True).indices]
    return order


def _shared_window_states(reservoir, embed, tokens, M, context, N, D, read, dtype, compute, chunk_elems, progress,
                          desc):
    """Window states with shared prefixes computed once (module doc). Per chunk of sorted windows,
    lcp[i] is the length of the prefix row i shares with row i - 1 (0 for the chunk's first row); at
    step k the rows with lcp < k each start a distinct k-prefix, whose state is one reservoir step from
    its (k-1)-prefix's."""
    dev = tokens.device
    out = torch.empty(M, D, dtype=dtype, device=dev)
    order = _sorted_windows(tokens, M, context)
    batch = min(M, max(256, chunk_elems // (context * N)))   # the plain path's GEMM shapes (cache-sized)
    offsets = torch.arange(context, device=dev)
    work = _work(reservoir, 2 * batch * N, compute, dev)
    # Two gather buffers, reused across chunks (no fresh pages per step) and used in turn: a reservoir may
    # return a view of its s0, which the next step's gather must not overwrite while reading it.
    gathered = torch.empty(2, batch * N, dtype=compute, device=dev)
    for i0 in bar(range(0, M, batch), desc=f"{desc} (window)", unit="chunk", enabled=progress, leave=False):
        rows = order[i0:i0 + batch]
        windows = tokens[rows[:, None] + offsets]                                   # (b, context), sorted
        differ = windows[1:] != windows[:-1]
        lcp = torch.zeros(len(rows), dtype=torch.int64, device=dev)
        lcp[1:] = torch.where(differ.any(1), differ.to(torch.uint8).argmax(1), context)
        state, group = None, None   # state: one row per distinct prefix; group: each row's prefix index
        for k in range(1, context + 1):
            new = lcp < k
            first = new.nonzero().squeeze(1)                                        # one row per k-prefix
            u = embed(windows[first, k - 1:k]).to(compute)                          # (r, 1, d)
            s0 = None if state is None else torch.index_select(                     # the (k-1)-prefixes'
                state, 0, group[first], out=gathered[k % 2, :len(first) * N].view(len(first), N))
            _, state = reservoir(u, s0, **work)
            group = new.cumsum(0) - 1
        final = torch.index_select(state, 0, group, out=gathered[(context + 1) % 2, :len(rows) * N].view(-1, N))
        out.index_copy_(0, rows, read(final).to(dtype))
    return out


def _stream_states(reservoir, embed, tokens, M, context, N, D, read, streams, warmup, dtype, compute, chunk_elems,
                   progress, desc):
    P = M + context - 1                       # positions 0..P-1 need a state
    B = max(1, min(streams, P))
    L = math.ceil(P / B)                      # positions per stream
    dev = tokens.device
    starts = torch.arange(B, device=dev) * L  # stream j covers positions [j L, j L + L)
    # Warm-up: streams 1..B-1 read the min(warmup, L) tokens before their start (stream 1 has only L
    # before it, and one length for all keeps the batch rectangular); stream 0 starts at the beginning
    # of the text from a zero state.
    s = torch.zeros(B, N, dtype=compute, device=dev)
    w = min(warmup, L)
    if w > 0 and B > 1:
        idx = (starts[1:, None] - w + torch.arange(w, device=dev)).clamp_(0, P - 1)
        _, s[1:] = reservoir(embed(tokens[idx]).to(compute))
    out = torch.empty(B * L, D, dtype=dtype, device=dev)       # position-major: row = position
    out_bl = out.view(B, L, D)
    step = max(1, min(L, chunk_elems // (B * N)))
    work = _work(reservoir, (step + 1) * B * N, compute, dev)
    carry = torch.empty_like(s)
    for k0 in bar(range(0, L, step), desc=f"{desc} (stream)", unit="chunk", enabled=progress, leave=False):
        k1 = min(L, k0 + step)
        idx = (starts[:, None] + torch.arange(k0, k1, device=dev)).clamp_(max=P - 1)  # tail padding
        st, s = reservoir(embed(tokens[idx]).to(compute), s, **work)                 # (B, k, N)
        out_bl[:, k0:k1] = read(st)
        if work:                              # s is a view of the buffer the next chunk overwrites
            s = carry.copy_(s)
    return out[context - 1:P]


def state_bytes(n_tokens: int, context: int, size: int, dtype: torch.dtype) -> int:
    """Memory the states of one stream take (for the up-front memory check)."""
    return max(0, n_tokens) * size * torch.empty((), dtype=dtype).element_size()
