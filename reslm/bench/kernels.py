"""Benchmarks, the reservoir itself: 1. recurrence vs GEMM, 2. reservoir states (chars/s) per context
mode, 6. every lab substrate's stream states. See `reslm.bench` for what each figure means."""
from __future__ import annotations

import math

import torch

from reslm.bench.plan import BenchPlan, _clamp
from reslm.bench.timing import repeat, sig, stats, timing_model, timing_reservoir
from reslm.core.device import onednn_available
from reslm.models.substrates import SUBSTRATES
from reslm.models.substrates import model_overrides as lab_overrides
from reslm.reservoir import ESNConfig
from reslm.reservoir.esn import onednn_weight


# --- 1. recurrence vs GEMM -------------------------------------------------------------------------
def bench_recurrence(size: int, *, batch: int, steps: int, dtype: torch.dtype, device: torch.device,
                     input_dim: int = 16, **timing) -> dict:
    """ESN.forward over `batch` streams x `steps` steps vs `steps` x torch.mm((B,N),(N,N)), same dtype;
    `onednn_gemm_gflops` (`_onednn_case`), `gemm_library` (the one the reservoir used: esn.onednn_weight).

    Both sides count 2 B N^2 flops per step; the reservoir side also pays its input GEMM and tanh.
    The ESN runs with its default backend ("reservoir": on a CPU tanh as 2 sigmoid(2z) - 1), with the
    plain loop and torch.tanh ("loop", the reference) and with the row-blocked loop ("blocked")."""
    esn, esn_loop, esn_blocked = (timing_reservoir(ESNConfig(size=size, input_dim=input_dim, backend=b), device)
                                  for b in ("auto", "loop", "blocked"))
    g = torch.Generator().manual_seed(1)
    u = torch.randn(batch, steps, input_dim, generator=g).to(device, dtype)
    s0 = torch.zeros(batch, size, device=device, dtype=dtype)   # given, so every step has its product
    W = esn.W_T.to(dtype)
    x = torch.randn(batch, size, generator=g).tanh().to(device, dtype)
    y = torch.empty(batch, size, device=device, dtype=dtype)

    # Driven the way shard_states drives it: time chunks of <= 2^22 state elements in one work buffer,
    # the state carried. (A fresh buffer per call, above glibc's mmap threshold, is mapped and
    # page-faulted anew each time: the timing would be of page faults, not of the recurrence.)
    chunk = max(1, 2**22 // (batch * size))
    work = torch.empty((chunk + 1) * batch * size, device=device, dtype=dtype)
    carry = torch.empty(batch, size, device=device, dtype=dtype)

    def reservoir(esn=esn):
        s = s0
        for k in range(0, steps, chunk):
            _, s = esn(u[:, k:k + chunk], s, work=work)
            s = carry.copy_(s)

    def gemm():
        for _ in range(steps):
            torch.mm(x, W, out=y)

    def tanh():
        for _ in range(steps):
            torch.tanh(x, out=y)

    def warm():
        esn(u[:, :1], s0)
        torch.mm(x, W, out=y)
        torch.tanh(x, out=y)

    cases = dict(gemm=gemm, reservoir=reservoir, loop=lambda: reservoir(esn_loop),
                 blocked=lambda: reservoir(esn_blocked), tanh=tanh, **_onednn_case(x, W, steps, device))
    t = repeat(cases, device, **timing, warmup=warm)
    flops = 2.0 * batch * steps * size * size
    res_s, gemm_s, loop_s, blk_s = (min(t[k]) for k in ("reservoir", "gemm", "loop", "blocked"))
    return dict(size=size, batch=batch, steps=steps, dtype=str(dtype).replace("torch.", ""),
                backend=esn.backend(device),
                reservoir_gflops=sig(flops / res_s / 1e9), gemm_gflops=sig(flops / gemm_s / 1e9),
                reservoir_vs_gemm=sig(gemm_s / res_s),
                loop_gflops=sig(flops / loop_s / 1e9), loop_vs_gemm=sig(gemm_s / loop_s),
                blocked_gflops=sig(flops / blk_s / 1e9), blocked_vs_gemm=sig(gemm_s / blk_s),
                reservoir_ms_per_step=sig(1e3 * res_s / steps), gemm_ms_per_step=sig(1e3 * gemm_s / steps),
                tanh_ms_per_step=sig(1e3 * min(t["tanh"]) / steps),
                states_per_s=sig(batch * steps / res_s),
                gemm_library="torch" if onednn_weight(x, W, batch) is None else "onednn",
                **(dict(onednn_gemm_gflops=sig(flops / min(t["onednn"]) / 1e9)) if "onednn" in t else {}),
                **{k: stats(t[k]) for k in ("reservoir", "gemm", "loop", "blocked")})


def _onednn_case(x: torch.Tensor, W_T: torch.Tensor, steps: int, device: torch.device) -> dict:
    """{"onednn": steps x x @ W_T through oneDNN's inner product} (what cpu_gemm may route the
    recurrence's product to), on a CPU in float32 where torch has it; else {}."""
    if device.type != "cpu" or x.dtype != torch.float32 or not onednn_available():
        return {}
    W = W_T.t().contiguous()

    def onednn():
        for _ in range(steps):
            torch.ops.mkldnn._linear_pointwise(x, W, None, "none", [], "")
    return dict(onednn=onednn)


def recurrence_rows(plan: BenchPlan, device: torch.device, dtype: str, say) -> dict:
    """Section 1 in one dtype: {str(N): bench_recurrence(...)} for plan.recurrence_sizes."""
    rows = {}
    for N in plan.recurrence_sizes:
        T = _clamp(plan.recurrence_work / (2.0 * plan.batch * N * N), *plan.recurrence_steps)
        r = rows[str(N)] = bench_recurrence(N, batch=plan.batch, steps=T, dtype=getattr(torch, dtype),
                                            device=device, input_dim=plan.embed_dim, **plan.timing())
        say(f"recurrence N={N} {dtype} B={plan.batch} T={T}: reservoir {r['reservoir_gflops']} GFLOP/s, "
            f"gemm {r['gemm_gflops']} GFLOP/s, ratio {r['reservoir_vs_gemm']} ({r['backend']}; torch.tanh loop "
            f"{r['loop_vs_gemm']}, blocked {r['blocked_vs_gemm']}; its GEMM through {r['gemm_library']}"
            + (f", oneDNN's {r['onednn_gemm_gflops']} GFLOP/s" if "onednn_gemm_gflops" in r else "") + ") "
            f"(tanh {r['tanh_ms_per_step']} ms/step; best of {r['reservoir']['reps']})")
    return rows


# --- 2. reservoir states ---------------------------------------------------------------------------
def bench_states(size: int, mode: str, *, n_samples: int, context: int, streams: int, warmup: int,
                 device: torch.device, dtype: torch.dtype = torch.float32, vocab: int = 59,
                 input_dim: int = 16, **timing) -> dict:
    """The per-shard reservoir work of a reservoir model of N = size units in context `mode`:
    model.features (shard_states + the state normalisation) over a random stream of
    n_samples + context tokens; chars/s = samples / seconds."""
    model = timing_model("rc", dict(size=size, context_mode=mode, context=context, streams=streams,
                                    warmup=warmup, vocab_size=vocab, embed_dim=input_dim), device)
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(vocab, (n_samples + context,), generator=g).to(device)

    def run(tok):
        return model.features(tok, dtype=dtype)

    t = repeat(dict(states=lambda: run(tokens)), device, **timing,
               warmup=lambda: run(tokens[:context + min(n_samples, 256)]))
    out = dict(size=size, mode=mode, samples=n_samples, dtype=str(dtype).replace("torch.", ""),
               chars_per_s=sig(n_samples / min(t["states"])), **stats(t["states"]))
    if mode == "stream":
        L = math.ceil((n_samples + context - 1) / streams)
        out.update(streams=streams, steps_per_stream=L, warmup_steps=min(warmup, L))
    else:
        out.update(steps_per_sample=context)
    return out


def stream_samples(size: int, plan: BenchPlan) -> int:
    """Samples for a stream-mode run: streams x L positions, L from the work budget."""
    step_flops = 2.0 * plan.batch * size * size
    L = _clamp(plan.stream_work / step_flops - plan.stream_warmup, *plan.stream_steps)
    return max(1, plan.batch * L - plan.context + 1)  # so that P = M + context - 1 = streams * L


def window_samples(size: int, plan: BenchPlan) -> int:
    chunk = max(1, 2**26 // (plan.context * size))   # shard_states' default chunk (windows per call)
    lo, hi = plan.window_samples
    return _clamp(plan.window_work / (2.0 * plan.context * size * size), lo, chunk if hi is None else hi)


def states_rows(plan: BenchPlan, device: torch.device, dtype: str, sizes, say) -> dict:
    """Section 2 in one dtype: {str(N): {mode: bench_states(...)}} for each N in sizes."""
    rows = {}
    for N in sizes:
        rows[str(N)] = {}
        for mode in ("stream", "window"):
            n = stream_samples(N, plan) if mode == "stream" else window_samples(N, plan)
            r = rows[str(N)][mode] = bench_states(
                N, mode, n_samples=n, context=plan.context, streams=plan.batch, warmup=plan.stream_warmup,
                device=device, dtype=getattr(torch, dtype), vocab=plan.vocab, input_dim=plan.embed_dim,
                **plan.timing())
            extra = (f", {r['steps_per_stream']} steps/stream + {r['warmup_steps']} warm-up"
                     if mode == "stream" else "")
            say(f"states N={N} {mode} {dtype}: {r['chars_per_s']} chars/s ({n} samples{extra}; "
                f"best of {r['reps']})")
    return rows



# --- 6. substrates -----------------------------------------------------------------------------------
LINEAR_DIAGONAL = "diagonal-linear"   # the lab's diagonal without its fixed tanh mix: the parallel scan alone


def _substrate_overrides(name: str) -> dict:
    """rc-budget model overrides of a lab substrate, or of the linear diagonal reservoir (N = 2K real
    states from K complex units; the lab's diagonal spends half of N on tanh(M x), one (N/2)^2 GEMM per step)."""
    if name == LINEAR_DIAGONAL:
        return {**lab_overrides("diagonal", "rc"), "reservoir_options": "nonlinear=false"}
    return lab_overrides(name, "rc")


def substrate_rows(plan: BenchPlan, device: torch.device, say, substrates=None) -> dict:
    """{substrate: {"size", "chars_per_s", "vs_esn", ...}}: stream-mode reservoir states (model.states,
    before measurement and normalisation) of each `reslm lab` substrate, and of the linear diagonal
    reservoir (LINEAR_DIAGONAL), at its rc-2600-budget size, over a random stream of plan.substrate_chars
    characters, in `plan.streams` streams, best of the repeats."""
    rows = {}
    g = torch.Generator().manual_seed(plan.seed)
    for name in substrates or (*SUBSTRATES, LINEAR_DIAGONAL):
        over = {**_substrate_overrides(name), "streams": plan.batch, "warmup": plan.stream_warmup}
        model = timing_model("rc", over, device)
        tokens = torch.randint(model.config.vocab_size, (plan.substrate_chars,), generator=g).to(device)
        t = repeat({name: lambda: model.states(tokens)}, device, **plan.timing())[name]
        n = tokens.numel() - model.config.context
        rows[name] = dict(size=model.reservoir.size, chars=n, chars_per_s=sig(n / min(t)), **stats(t))
    esn = rows.get("esn", {}).get("chars_per_s")
    for name, r in rows.items():
        r["vs_esn"] = sig(r["chars_per_s"] / esn) if esn else None
        say(f"substrate {name} N={r['size']}: {r['chars_per_s']:,} chars/s (stream)"
            + (f", x{r['vs_esn']} the esn's" if esn else ""))
    return rows
