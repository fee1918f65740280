"""Benchmarks: the clock every `reslm bench` figure goes through, and models quick to build for timing.

Every timed region ends with `reslm.core.device.synchronize`; each measurement is warmed up first,
repeated, and the BEST repetition is the figure (the one least disturbed by other processes; the
median is kept next to it). `contention_probe` tells whether other processes were competing for the
cores while the figures were taken.

Timing reservoirs: building an ESN computes W's eigenvalues in float64 to set the spectral radius
exactly, which is slow for N in the thousands and does not change any timing. `timing_reservoir`
therefore draws the same kind of dense uniform matrices and scales them by the circular-law estimate
of their spectral radius (sqrt(N density / 3)) instead; `timing_model` puts one into a model.
"""
from __future__ import annotations

import math
import os
import statistics
import time

import torch

from reslm.core.device import synchronize
from reslm.models import MODELS, build_model, make_config
from reslm.models.reservoir_lm import ReservoirLM
from reslm.reservoir import ESN, ESNConfig


def sig(x, digits: int = 4):
    """Round to `digits` significant digits for the report (None and non-finite kept as they are)."""
    if x is None or not isinstance(x, float) or not math.isfinite(x) or x == 0:
        return x
    return round(x, max(0, digits - 1 - int(math.floor(math.log10(abs(x))))))


def repeat(fns: dict, device: torch.device, *, reps: int, budget_s: float, warmup=None,
           min_time_s: float = 0.0, max_reps: int | None = None) -> dict:
    """Time each callable in `fns` once per repetition, alternating them within a repetition (so
    that load from other processes hits all of them alike).

    `warmup()` (or each fn once, when warmup is None) runs first, untimed. Then at least `reps`
    repetitions, and more (up to `max_reps`) until `min_time_s` seconds were spent timing, so that
    cheap measurements get many tries at a quiet moment; but never another one once `budget_s`
    seconds were spent (at least one always runs). Returns {name: [seconds of each repetition]}.
    """
    if warmup is None:
        for fn in fns.values():
            fn()
    else:
        warmup()
    synchronize(device)
    times = {k: [] for k in fns}
    start = time.perf_counter()
    max_reps = max(reps, max_reps or reps)
    while True:
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            synchronize(device)
            times[k].append(time.perf_counter() - t0)
        n, spent = len(times[next(iter(fns))]), time.perf_counter() - start
        if n >= max_reps or spent > budget_s or (n >= reps and spent >= min_time_s):
            return times


def stats(times: list[float]) -> dict:
    """best_s (the figure), median_s and reps of one measurement's repetitions."""
    return dict(best_s=sig(min(times)), median_s=sig(statistics.median(times)), reps=len(times))


def loadavg():
    """1-minute load average (other processes competing for the CPU make every figure lower)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def contention_probe(elems: int = 2**20, ops: int = 20) -> dict:
    """How much another process slows this one down: `ops` in-place adds over `elems` floats on the
    CPU with torch's thread count and with one thread, best of 3 each. On an idle machine the
    multi-threaded run is faster; when other processes occupy the cores, every parallel region
    waits for a descheduled worker thread (a scheduler tick), which hits small ops (readout heads,
    small reservoirs, the transformer) far harder than large GEMMs. multi_vs_single > 1.5 is
    reported as contended: figures taken then are not comparable across runs."""
    x = torch.zeros(elems)
    threads = torch.get_num_threads()

    def best(n_threads):
        torch.set_num_threads(n_threads)
        try:
            x.add_(1.0)
            out = []
            for _ in range(3):
                t0 = time.perf_counter()
                for _ in range(ops):
                    x.add_(1.0)
                out.append(time.perf_counter() - t0)
            return min(out)
        finally:
            torch.set_num_threads(threads)

    multi, single = best(threads), best(1)
    ratio = multi / single
    return dict(threads=threads, multi_ms_per_op=sig(1e3 * multi / ops), single_ms_per_op=sig(1e3 * single / ops),
                multi_vs_single=sig(ratio), contended=bool(threads > 1 and ratio > 1.5))


def timing_reservoir(cfg: ESNConfig, device: torch.device) -> ESN:
    """An ESN of cfg's shape whose W is scaled by the circular-law estimate of its spectral radius
    (|eigenvalues| of an N x N matrix of iid entries of variance v fill a disc of radius
    sqrt(N v); here v = density / 3) instead of an exact eigenvalue computation. Same shapes,
    dtypes and density as `ESN(cfg)`, so the same timings; for benchmarking only."""
    with torch.device("meta"):
        esn = ESN(cfg)
    if {n for n, _ in esn.named_buffers()} | {n for n, _ in esn.named_parameters()} != {"W_T", "W_in_T", "bias"}:
        return ESN(cfg).to(device)   # an ESN this function does not know how to fill: build it for real
    esn.to_empty(device=device)
    g = torch.Generator().manual_seed(cfg.seed)
    N, d = cfg.size, cfg.input_dim
    with torch.no_grad():
        w = torch.rand(N, N, generator=g) * 2 - 1
        if cfg.density < 1:
            w *= torch.rand(N, N, generator=g) < cfg.density
        w *= cfg.spectral_radius / math.sqrt(N * cfg.density / 3)
        w_in = torch.rand(d, N, generator=g) * 2 - 1
        if cfg.input_density < 1:
            w_in *= torch.rand(d, N, generator=g) < cfg.input_density
        esn.W_T.copy_(w.T)
        esn.W_in_T.copy_(w_in * cfg.input_scaling)
        esn.bias.copy_((torch.rand(N, generator=g) * 2 - 1) * cfg.bias_scaling)
    return esn


def timing_model(family: str, overrides: dict, device: torch.device):
    """The model build_model(family, **overrides) makes, on `device`; a reservoir model gets a
    `timing_reservoir` (its embedding and head are drawn as the constructor draws them)."""
    cfg = make_config(family, **overrides)
    model_cls = MODELS[family][1]
    if not issubclass(model_cls, ReservoirLM) or cfg.reservoir != "esn":
        return build_model(family, cfg).to(device)
    with torch.device("meta"):
        model = build_model(family, cfg)
    model.reservoir = timing_reservoir(cfg.reservoir_config(), torch.device("cpu"))
    model.embedding = (torch.randn(cfg.vocab_size, cfg.embed_dim, generator=torch.Generator().manual_seed(cfg.seed))
                       / cfg.embed_dim ** 0.5)
    rng = torch.random.get_rng_state()
    torch.manual_seed(cfg.seed + 1)
    try:
        with torch.device("cpu"):
            model.head = model.make_head()
    finally:
        torch.random.set_rng_state(rng)
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise RuntimeError(f"timing_model: {', '.join(left)} left uninitialised")
    return model.to(device)
