"""`reslm bench`: reservoir and training throughput on this machine, against the authors' approach.

Everything is measured in one run, on the device `pick_device("auto")` picks (CUDA when present),
with fp32 weights and states unless a figure says otherwise. Every timed region ends with
`reslm.device.synchronize`, each measurement is warmed up first, repeated, and the BEST repetition
is the figure (the one least disturbed by other processes; the median is kept next to it).

What is measured (keys of the returned dict):

1. Recurrence vs GEMM (`reservoir_gflops`, `gemm_gflops`, `reservoir_vs_gemm`, and the same with
   `_bf16`). `ESN.forward(u (B,T,d), s0)` over B = 1024 streams and T steps, counted as the
   2 B T N^2 flops of the recurrent products only (the tiny input products and tanh are overhead the
   reservoir has to hide); GEMM = T x `torch.mm((B,N), (N,N), out=...)` in a loop, same shape and
   dtype. The two are timed alternately within each repetition so that load from other processes
   hits both alike. `recurrence` also reports the cost of one tanh over (B,N) per step, which is what
   separates the two.

2. Reservoir chars/s (`reservoir_chars_per_s[N][mode]`): the per-shard work of a reservoir model,
   `model.features` (`shard_states` + the state normalisation) over a random token stream,
   in `stream` mode (1024 streams, 32 warm-up tokens each, so one reservoir step per char plus the
   warm-up) and in `window` mode (each sample from a zero state over its 32-char window: 32 steps
   per sample); chars/s = samples/s = samples / seconds.

3. Training (`training[model]`): for reservoir models
   (a) head-only training throughput on precomputed states: random states of the right shape
       (the computation does not depend on their values), shuffled batches of 1024 drawn with
       `Features.batch` as in training, `forward_features` + backward + Adam(lr 1e-4) step, fp32;
       the same in both context modes, since both hand the head an (M, N) state tensor; timed
       alternately with the authors' approach (4.) in each repetition;
   (b) the amortised figure under the paper's 5-epochs-per-shard schedule (states computed once per
       shard, reused for 5 epochs): seconds per sample-epoch = reservoir seconds per sample / 5 +
       head seconds per sample (`amortised_samples_per_s`), per context mode.
   Transformers have one figure, `train_step_throughput` (train mode: dropout active).

4. The authors' approach measured in the same run (`authors_samples_per_s`, `speedup_vs_authors`):
   RC/AERC re-compute the reservoir for every training batch from a zero state over each sample's
   32-char window (`authors_window_states`: 32 steps of (1024,N) x (N,N)), then the readout
   forward/backward/Adam step (`authors_logits`, with the AERC readout matrix W_att materialised per
   sample as the paper writes it). These are re-implementations written here for timing, not the
   authors' code. Transformer: `reference.ReferenceTransformer` (torch's nn.TransformerEncoder)
   through `reference.train_step_throughput`. `authors_quoted` holds the figures the issue quotes
   for the authors' code (2 threads, batch 1024, fp32), for comparison across machines.

Context: device, threads, torch version, batch size, `method` (how each figure was measured), the
load average and `contention`: a probe run between the phases that times a small parallel op with
torch's thread count against one thread. When other processes hold the cores, every parallel region
waits for a descheduled worker thread (milliseconds), which makes small-op figures (heads, AERC,
small reservoirs, tanh, the transformer) many times lower; the report then carries a warning.
`meets_target` compares each figure with the issue's targets (`targets`).

Timing reservoirs: building an ESN computes W's eigenvalues in float64 to set the spectral radius
exactly, which takes about a minute for N = 2600 on a small CPU and does not change any timing. The
bench therefore draws the same kind of dense uniform matrices and scales them by the circular-law
estimate of their spectral radius (sqrt(N density / 3)) instead (`timing_reservoir`, `timing_model`).
"""
from __future__ import annotations

import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from reslm.device import pick_device, synchronize
from reslm.models import MODELS, PRESETS, build_model, make_config
from reslm.models.base import TensorFeatures
from reslm.models.reservoir_lm import ReservoirLM
from reslm.reservoir import ESN, ESNConfig

# Figures the issue quotes for the authors' code (2 threads, batch 1024, fp32), samples/s.
AUTHORS_QUOTED = {"rc-750": 4100.0, "rc-2600": 410.0, "aerc-100-20": 52000.0, "aerc-160-30": 24700.0,
                  "tf-128-8-8": 737.0}
AUTHORS_QUOTED_CONDITIONS = ("the authors' code as quoted in the issue: 2 CPU threads, batch 1024, fp32; "
                             "RC/AERC: windowed recompute of the reservoir per batch")
# Targets of the issue: reservoir recurrence >= 80% of GEMM; training speed-up over the authors.
TARGETS = {"reservoir_vs_gemm": 0.8, "speedup_vs_authors": {"rc": 20.0, "aerc": 2.5, "tf": 3.0}}


# --- plan ------------------------------------------------------------------------------------------
@dataclass
class BenchPlan:
    """What to measure and how long to spend on it. Work sizes are in flops of the recurrent
    products; counts are derived from them per N and clamped, so big reservoirs get fewer steps."""

    batch: int = 1024                      # samples per training step, streams per recurrence
    context: int = 32                      # chars per window
    epochs_per_shard: int = 5              # the paper's schedule (states reused this many times)
    lr: float = 1e-4
    vocab: int = 59
    embed_dim: int = 16
    # 1. recurrence vs GEMM
    recurrence_sizes: tuple = (750, 2600)
    recurrence_dtypes: tuple = ("float32", "bfloat16")
    recurrence_work: float = 40e9          # flops per timed run -> T = work / (2 B N^2), clamped
    recurrence_steps: tuple = (3, 32)      # (min, max) T
    # 2. reservoir states (chars/s); sizes of the reservoir models are added
    states_sizes: tuple = (750, 2600)
    states_bf16: bool = True               # also states_sizes with bfloat16 states (not used for training)
    stream_work: float = 1.0e12            # flops per timed shard_states run in stream mode
    stream_steps: tuple = (32, 128)        # (min, max) steps per stream after the warm-up
    stream_warmup: int = 32                # tokens each stream reads first (the model default)
    window_work: float = 0.4e12            # flops per timed shard_states run in window mode
    window_samples: tuple = (64, None)     # (min, max); max None = one shard_states chunk
    # 3./4. training
    models: tuple = ("rc-750", "rc-2600", "aerc-100-20", "aerc-160-30", "tf-128-8-8")
    head_steps: int = 5                    # training steps per timed repetition (head only)
    authors_steps: int = 1                 # steps per repetition of the windowed recompute
    tf_steps: int = 2                      # steps per train_step_throughput call
    tf_warmup: int = 2                     # warm-up steps of the first call (1 in later calls)
    # repetitions (see `repeat`)
    reps: int = 3                          # at least this many timed repetitions ...
    max_reps: int = 20                     # ... and up to this many while under min_time_s
    min_time_s: float = 3.0
    budget_s: float = 20.0                 # no new repetition after this many seconds
    seed: int = 0
    token_level: bool = True               # 5. LAERC vs GPT (reslm.bench_tokens)

    @classmethod
    def full(cls) -> "BenchPlan":
        return cls()

    @classmethod
    def quick(cls) -> "BenchPlan":
        return cls(recurrence_work=12e9, recurrence_steps=(2, 16), stream_work=0.3e12, stream_steps=(16, 64),
                   window_work=0.05e12, states_bf16=False, models=("rc-750", "aerc-100-20", "tf-128-8-8"), head_steps=4,
                   tf_steps=1, tf_warmup=1, reps=1, max_reps=10, min_time_s=1.0, budget_s=3.0)


def _spec(model) -> tuple[str, str, dict]:
    """(label, family, config overrides) from a preset name or a (label, family, overrides) triple."""
    if isinstance(model, str):
        family, overrides, _ = PRESETS[model]
        return model, family, dict(overrides)
    label, family, overrides = model
    return label, family, dict(overrides)


def _clamp(x: float, lo: int, hi: int | None) -> int:
    x = max(lo, int(round(x)))
    return x if hi is None else min(hi, x)


# --- timing ----------------------------------------------------------------------------------------
def _log(progress: bool, msg: str):
    if progress:
        print(f"[bench] {msg}", file=sys.stderr, flush=True)


def _sig(x, digits: int = 4):
    """Round to `digits` significant digits for the report (None and non-finite kept as they are)."""
    if x is None or not isinstance(x, float) or not math.isfinite(x) or x == 0:
        return x
    return round(x, max(0, digits - 1 - int(math.floor(math.log10(abs(x))))))


def repeat(fns: dict, device: torch.device, *, reps: int, budget_s: float, warmup=None,
           min_time_s: float = 0.0, max_reps: int | None = None) -> dict:
    """Time each callable in `fns` once per repetition, alternating them within a repetition.

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


def _reps(plan) -> dict:
    return dict(reps=plan.reps, budget_s=plan.budget_s, min_time_s=plan.min_time_s, max_reps=plan.max_reps)


def _loadavg():
    """1-minute load average (other processes competing for the CPU make every figure lower)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def contention_probe(elems: int = 2**20, ops: int = 20) -> dict:
    """How much another process slows this one down: `ops` in-place adds over `elems` floats on the
    CPU with torch's thread count and with one thread, best of 3 each. On an idle machine the
    multi-threaded run is faster; when other processes occupy the cores, every parallel region
    waits for a descheduled worker thread (a scheduler tick, milliseconds), which hits small ops
    (readout heads, small reservoirs, the transformer) far harder than large GEMMs. multi_vs_single
    > 1.5 is reported as contended: figures taken then are not comparable across runs."""
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
    return dict(threads=threads, multi_ms_per_op=_sig(1e3 * multi / ops), single_ms_per_op=_sig(1e3 * single / ops),
                multi_vs_single=_sig(ratio), contended=bool(threads > 1 and ratio > 1.5))


def _stats(times: list[float]) -> dict:
    return dict(best_s=_sig(min(times)), median_s=_sig(statistics.median(times)), reps=len(times))


# --- timing reservoirs and models ------------------------------------------------------------------
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


# --- 1. recurrence vs GEMM -------------------------------------------------------------------------
def bench_recurrence(size: int, *, batch: int, steps: int, dtype: torch.dtype, device: torch.device,
                     input_dim: int = 16, **timing) -> dict:
    """ESN.forward over `batch` streams x `steps` steps vs `steps` x torch.mm((B,N),(N,N)), same dtype.

    Both sides count 2 B N^2 flops per step; the reservoir side also pays its input GEMM and tanh."""
    esn = timing_reservoir(ESNConfig(size=size, input_dim=input_dim), device)
    g = torch.Generator().manual_seed(1)
    u = torch.randn(batch, steps, input_dim, generator=g).to(device, dtype)
    s0 = torch.zeros(batch, size, device=device, dtype=dtype)   # given, so every step has its product
    W = esn.W_T.to(dtype)
    x = torch.randn(batch, size, generator=g).tanh().to(device, dtype)
    y = torch.empty(batch, size, device=device, dtype=dtype)

    # Driven the way shard_states drives it: time chunks of <= 2^22 state elements, state carried.
    # (One call over all steps would allocate a fresh buffer of up to 100 MB per call, above glibc's
    # mmap threshold, and time page faults instead of the recurrence.)
    chunk = max(1, 2**22 // (batch * size))

    def reservoir():
        s = s0
        for k in range(0, steps, chunk):
            _, s = esn(u[:, k:k + chunk], s)

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

    t = repeat(dict(gemm=gemm, reservoir=reservoir, tanh=tanh), device, **timing,
               warmup=warm)
    flops = 2.0 * batch * steps * size * size
    res_s, gemm_s = min(t["reservoir"]), min(t["gemm"])
    return dict(size=size, batch=batch, steps=steps, dtype=str(dtype).replace("torch.", ""),
                reservoir_gflops=_sig(flops / res_s / 1e9), gemm_gflops=_sig(flops / gemm_s / 1e9),
                reservoir_vs_gemm=_sig(gemm_s / res_s),
                reservoir_ms_per_step=_sig(1e3 * res_s / steps), gemm_ms_per_step=_sig(1e3 * gemm_s / steps),
                tanh_ms_per_step=_sig(1e3 * min(t["tanh"]) / steps),
                states_per_s=_sig(batch * steps / res_s),
                reservoir=_stats(t["reservoir"]), gemm=_stats(t["gemm"]))


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
               chars_per_s=_sig(n_samples / min(t["states"])), **_stats(t["states"]))
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


# --- 3. training: head only, amortised ---------------------------------------------------------------
def amortised_samples_per_s(reservoir_samples_per_s: float, head_samples_per_s: float,
                            epochs_per_shard: int = 5) -> float:
    """Training samples/s under the shard schedule: each sample's state is computed once per shard
    and used for `epochs_per_shard` epochs, so one sample-epoch costs
    reservoir_seconds_per_sample / epochs_per_shard + head_seconds_per_sample."""
    return 1.0 / (1.0 / (reservoir_samples_per_s * epochs_per_shard) + 1.0 / head_samples_per_s)


def _optimise(opt, loss: torch.Tensor):
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def head_trainer(model, *, batch: int, lr: float, device: torch.device, pool_batches: int = 16):
    """run(k): k head-only training steps on precomputed (random) states, batches drawn with
    Features.batch from a pool of up to `pool_batches` batches of states, forward_features +
    backward + Adam step (the inner loop of train.py)."""
    N, V = model.config.size, model.config.vocab_size
    pool = max(batch, min(pool_batches * batch, 2**26 // N))
    g = torch.Generator().manual_seed(3)
    feats = TensorFeatures(torch.randn(pool, N, generator=g).to(device),
                           torch.randint(V, (pool,), generator=g).to(device))
    order = [torch.randperm(pool, generator=g)[:batch].to(device) for _ in range(8)]
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)

    def run(k):
        model.train()
        for i in range(k):
            idx = order[i % len(order)]
            _optimise(opt, model.forward_features(feats.batch(idx), feats.targets[idx])[1])

    return run


# --- 4. the authors' approach (re-implemented for timing) ------------------------------------------
@torch.no_grad()
def authors_window_states(model, windows: torch.Tensor) -> torch.Tensor:
    """Re-implementation, for timing, of the authors' per-batch reservoir: every sample's state is
    recomputed from a zero state over its own window, one plain step at a time,
        s_t = (1 - a) s_{t-1} + a tanh(W_in x_t + W s_{t-1} + b),
    i.e. `context` products (B,N) x (N,N) per training batch. windows (B, T) -> s_T (B, N)."""
    esn = model.reservoir
    a = esn.config.leak_rate
    u = model.embed(windows)
    s = torch.zeros(windows.shape[0], esn.size, device=u.device, dtype=u.dtype)
    for t in range(windows.shape[1]):
        pre = u[:, t] @ esn.W_in_T + s @ esn.W_T + esn.bias
        s = torch.tanh(pre) if a == 1 else (1 - a) * s + a * torch.tanh(pre)
    return s


def authors_logits(model, states: torch.Tensor) -> torch.Tensor:
    """The readout as the paper writes it (re-implementation for timing): LayerNorm of the state
    (every step: the authors' model normalises inside its forward), then RC: W_out r + b; AERC:
    W_att = reshape(W_2 ReLU(W_1 r + b_1) + b_2, H x N) materialised per sample, r_o = W_att r,
    logits = W_out r_o + b_out. Same numbers as model.forward_features(model.normalize(states))."""
    x = F.layer_norm(states, (states.shape[-1],)) if model.config.state_norm else states
    head = model.head
    if hasattr(head, "net2"):  # AERC's AttentionReadout
        z = torch.relu(head.net1(x))
        W_att = head.net2(z).view(-1, head.hidden, head.size)                     # (B, H, N)
        r_o = (W_att @ x.unsqueeze(-1)).squeeze(-1)                               # (B, H)
        return head.out(r_o)
    return head(x)


def authors_trainer(model, *, batch: int, context: int, lr: float, device: torch.device):
    """run(k, b=batch): k training steps of the authors' approach: the reservoir recomputed for the
    batch over each sample's window (authors_window_states), then authors_logits + backward + Adam."""
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(4)
    batches = [(torch.randint(V, (batch, context), generator=g).to(device),
                torch.randint(V, (batch,), generator=g).to(device)) for _ in range(4)]
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)

    def run(k, b=batch):
        model.train()
        for i in range(k):
            w, y = batches[i % len(batches)]
            s = authors_window_states(model, w[:b])
            _optimise(opt, F.cross_entropy(authors_logits(model, s), y[:b]))

    return run


def bench_training(model, *, batch: int, context: int, head_steps: int, authors_steps: int, lr: float,
                   device: torch.device, **timing) -> dict:
    """Head-only training (ours) and the authors' windowed recompute, timed alternately in each
    repetition (so that load from other processes hits both alike). Returns {head: .., authors: ..}."""
    head, authors = (head_trainer(model, batch=batch, lr=lr, device=device),
                     authors_trainer(model, batch=batch, context=context, lr=lr, device=device))

    def warm():
        head(3)
        authors(2, min(batch, 64))

    t = repeat(dict(head=lambda: head(head_steps), authors=lambda: authors(authors_steps)), device, **timing,
               warmup=warm)
    return {k: dict(samples_per_s=_sig(batch * n / min(t[k])), steps=n, **_stats(t[k]))
            for k, n in (("head", head_steps), ("authors", authors_steps))}


def bench_transformers(cfg, *, batch: int, steps: int, device: torch.device, reps: int, budget_s: float,
                       warmup: int = 2, **_) -> dict:
    """CharTransformer and ReferenceTransformer (torch's encoder: the authors' model) through
    reference.train_step_throughput, one call of each in turn, up to `reps` calls each (none started
    after budget_s seconds); the best call counts."""
    from reslm.models.reference import ReferenceTransformer, train_step_throughput as measure
    from reslm.models.transformer import CharTransformer

    ours, theirs = CharTransformer(cfg).to(device), ReferenceTransformer(cfg).to(device)
    sps = {"ours": [], "authors": []}
    start = time.perf_counter()
    for r in range(reps):
        for name, m in (("ours", ours), ("authors", theirs)):
            synchronize(device)
            sps[name].append(measure(m, batch_size=batch, context=cfg.context, steps=steps,
                                     warmup=warmup if r == 0 else 1, vocab=cfg.vocab_size))
        if time.perf_counter() - start > budget_s:
            break
    return {k: dict(samples_per_s=_sig(max(v)), median_samples_per_s=_sig(statistics.median(v)), calls=len(v),
                    steps=steps, function=measure.__name__) for k, v in sps.items()}


# --- the whole bench -------------------------------------------------------------------------------
def run_bench(quick: bool = False, progress: bool = False, plan: BenchPlan | None = None,
              device: str | torch.device = "auto") -> dict:
    """Run every measurement of `plan` (BenchPlan.quick() / .full() by default) and return the report."""
    plan = plan or (BenchPlan.quick() if quick else BenchPlan.full())
    dev = pick_device(device) if isinstance(device, str) else device
    t_start = time.perf_counter()
    load_before, probe_before = _loadavg(), contention_probe()
    probes = {"start": probe_before}
    torch.manual_seed(plan.seed)
    B, ctx, E = plan.batch, plan.context, plan.epochs_per_shard
    say = lambda msg: _log(progress, msg)  # noqa: E731
    say(f"device {dev}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
        f"{'quick' if quick else 'full'} plan; load {load_before}, contention probe: "
        f"{probe_before['multi_vs_single']}x the single-thread time per small op"
        f"{' (CONTENDED)' if probe_before['contended'] else ''}")

    # 1. recurrence vs GEMM
    recurrence = {}
    for dname in plan.recurrence_dtypes:
        dtype = getattr(torch, dname)
        recurrence[dname] = {}
        for N in plan.recurrence_sizes:
            T = _clamp(plan.recurrence_work / (2.0 * B * N * N), *plan.recurrence_steps)
            r = bench_recurrence(N, batch=B, steps=T, dtype=dtype, device=dev, input_dim=plan.embed_dim,
                                 **_reps(plan))
            recurrence[dname][str(N)] = r
            say(f"recurrence N={N} {dname} B={B} T={T}: reservoir {r['reservoir_gflops']} GFLOP/s, "
                f"gemm {r['gemm_gflops']} GFLOP/s, ratio {r['reservoir_vs_gemm']} "
                f"(tanh {r['tanh_ms_per_step']} ms/step; best of {r['reservoir']['reps']})")

    probes["after recurrence"] = contention_probe()
    # 2. reservoir states: the requested sizes and those of the reservoir models
    specs = [_spec(m) for m in plan.models]
    model_cfgs = {label: make_config(family, **ov) for label, family, ov in specs}
    sizes = list(dict.fromkeys([*plan.states_sizes,
                                *(c.size for c in model_cfgs.values() if hasattr(c, "reservoir"))]))
    states = {}
    for N in sizes:
        states[str(N)] = {}
        for mode in ("stream", "window"):
            n = stream_samples(N, plan) if mode == "stream" else window_samples(N, plan)
            r = bench_states(N, mode, n_samples=n, context=ctx, streams=B, warmup=plan.stream_warmup,
                             device=dev, vocab=plan.vocab, input_dim=plan.embed_dim, **_reps(plan))
            states[str(N)][mode] = r
            extra = (f", {r['steps_per_stream']} steps/stream + {r['warmup_steps']} warm-up"
                     if mode == "stream" else "")
            say(f"states N={N} {mode}: {r['chars_per_s']} chars/s ({n} samples{extra}; best of {r['reps']})")

    states_bf16 = {}
    for N in (plan.states_sizes if plan.states_bf16 else ()):
        states_bf16[str(N)] = {}
        for mode in ("stream", "window"):
            n = stream_samples(N, plan) if mode == "stream" else window_samples(N, plan)
            r = bench_states(N, mode, n_samples=n, context=ctx, streams=B, warmup=plan.stream_warmup,
                             device=dev, dtype=torch.bfloat16, vocab=plan.vocab, input_dim=plan.embed_dim,
                             **_reps(plan))
            states_bf16[str(N)][mode] = r
            say(f"states N={N} {mode} bfloat16: {r['chars_per_s']} chars/s ({n} samples; best of {r['reps']})")

    probes["after states"] = contention_probe()
    # 3./4. training
    training, speedups = {}, {}
    for label, family, ov in specs:
        cfg = model_cfgs[label]
        quoted = AUTHORS_QUOTED.get(label)
        if not hasattr(cfg, "reservoir"):  # transformer
            r = bench_transformers(cfg, batch=B, steps=plan.tf_steps, device=dev, warmup=plan.tf_warmup,
                                   **_reps(plan))
            ours, theirs = r["ours"]["samples_per_s"], r["authors"]["samples_per_s"]
            training[label] = dict(family=family, samples_per_s=ours, authors_samples_per_s=theirs,
                                   speedup_vs_authors=_sig(ours / theirs),
                                   authors_quoted_samples_per_s=quoted,
                                   speedup_vs_authors_quoted=_sig(ours / quoted) if quoted else None,
                                   detail=r)
            speedups[label] = training[label]["speedup_vs_authors"]
            say(f"train {label}: {ours} samples/s, authors (ReferenceTransformer) {theirs} samples/s, "
                f"x{training[label]['speedup_vs_authors']} (best of {r['ours']['calls']} calls)")
            continue
        model = timing_model(family, ov, dev)
        tr = bench_training(model, batch=B, context=ctx, head_steps=plan.head_steps,
                            authors_steps=plan.authors_steps, lr=plan.lr, device=dev, **_reps(plan))
        head, auth = tr["head"], tr["authors"]
        say(f"train {label}: head only {head['samples_per_s']} samples/s (best of {head['reps']} x "
            f"{head['steps']} steps), authors' windowed recompute {auth['samples_per_s']} samples/s "
            f"(best of {auth['reps']} x {auth['steps']} steps)")
        entry = dict(family=family, size=cfg.size, head_samples_per_s=head["samples_per_s"],
                     authors_samples_per_s=auth["samples_per_s"], authors_quoted_samples_per_s=quoted,
                     detail=dict(head=head, authors=auth))
        speedups[label] = {}
        for mode in ("window", "stream"):
            res = states[str(cfg.size)][mode]["chars_per_s"]
            am = amortised_samples_per_s(res, head["samples_per_s"], E)
            entry[mode] = dict(head_samples_per_s=head["samples_per_s"], reservoir_samples_per_s=res,
                               amortised_samples_per_s=_sig(am),
                               speedup_vs_authors=_sig(am / auth["samples_per_s"]),
                               speedup_vs_authors_quoted=_sig(am / quoted) if quoted else None)
            speedups[label][mode] = entry[mode]["speedup_vs_authors"]
            say(f"train {label} {mode}: amortised {entry[mode]['amortised_samples_per_s']} samples/s, "
                f"x{entry[mode]['speedup_vs_authors']} vs authors' approach measured here")
        training[label] = entry
        del model

    def per_size(dname, key):
        return {n: r[key] for n, r in recurrence.get(dname, {}).items()}

    result = dict(
        device=str(dev), device_name=(torch.cuda.get_device_name(dev) if dev.type == "cuda"
                                      else platform.processor() or platform.machine()),
        dtype="float32", torch=torch.__version__, threads=torch.get_num_threads(), batch_size=B,
        context=ctx, epochs_per_shard=E, quick=bool(quick),
        reservoir_gflops=per_size("float32", "reservoir_gflops"),
        gemm_gflops=per_size("float32", "gemm_gflops"),
        reservoir_vs_gemm=per_size("float32", "reservoir_vs_gemm"),
        reservoir_gflops_bf16=per_size("bfloat16", "reservoir_gflops"),
        gemm_gflops_bf16=per_size("bfloat16", "gemm_gflops"),
        reservoir_vs_gemm_bf16=per_size("bfloat16", "reservoir_vs_gemm"),
        reservoir_chars_per_s={n: {m: r["chars_per_s"] for m, r in v.items()} for n, v in states.items()},
        reservoir_chars_per_s_bf16={n: {m: r["chars_per_s"] for m, r in v.items()} for n, v in states_bf16.items()},
        training_samples_per_s={k: ({m: dict(head=v["head_samples_per_s"],
                                               amortised=v[m]["amortised_samples_per_s"])
                                      for m in ("window", "stream")} if "window" in v else v["samples_per_s"])
                                for k, v in training.items()},
        authors_samples_per_s={k: v["authors_samples_per_s"] for k, v in training.items()},
        speedup_vs_authors=speedups,
        authors_quoted=dict(AUTHORS_QUOTED, conditions=AUTHORS_QUOTED_CONDITIONS),
        targets=TARGETS,
        recurrence=recurrence, reservoir_states=states, reservoir_states_bf16=states_bf16, training=training,
        method=_method(plan),
    )
    result["load_average"] = dict(before=load_before, after=_loadavg(), cpus=os.cpu_count())
    t_sp = TARGETS["speedup_vs_authors"]
    result["meets_target"] = dict(
        reservoir_vs_gemm={n: v >= TARGETS["reservoir_vs_gemm"] for n, v in result["reservoir_vs_gemm"].items()},
        reservoir_vs_gemm_bf16={n: v >= TARGETS["reservoir_vs_gemm"]
                                for n, v in result["reservoir_vs_gemm_bf16"].items()},
        speedup_vs_authors={k: ({m: x >= t_sp[training[k]["family"]] for m, x in v.items()} if isinstance(v, dict)
                                else v >= t_sp[training[k]["family"]])
                            for k, v in speedups.items() if training[k]["family"] in t_sp})
    if plan.token_level:  # LAERC vs GPT: training tokens/s, generation per token (stateful vs re-run)
        from reslm import bench_tokens
        result["token_level"] = bench_tokens.run(quick, dev, say)
    probes["end"] = contention_probe()
    result["contention"] = dict(probes=probes, contended=[k for k, p in probes.items() if p["contended"]])
    if result["contention"]["contended"]:
        result["contention"]["warning"] = ("other processes were competing for the CPU (see contention_probe): "
                                           "small-op figures (heads, AERC, transformer, tanh) can be many times "
                                           "lower than on an idle machine, and not comparable across runs")
    result["seconds"] = _sig(time.perf_counter() - t_start)
    say(f"done in {result['seconds']} s")
    return result


def _method(plan: BenchPlan) -> dict:
    reps = (f"an untimed warm-up, then at least {plan.reps} timed repetitions, more (up to {plan.max_reps}) "
            f"until {plan.min_time_s:g} s were spent, none started after {plan.budget_s:g} s (so a slow one may "
            "have fewer); the figure is the BEST repetition (least disturbed by other processes), the median "
            "and the count are in the details (best_s, median_s, reps)")
    return dict(
        repetitions=reps,
        clock="time.perf_counter around each repetition, reslm.device.synchronize before reading it",
        reservoir_gflops=("ESN.forward(u (B,T,d), s0) with B=batch_size streams and T steps "
                          f"(T = {plan.recurrence_work:g} flops / (2 B N^2) clamped to {plan.recurrence_steps}; "
                          "per N in recurrence[dtype][N]['steps']), counted as 2 B T N^2 flops; "
                          "timing reservoir (see module doc)"),
        gemm_gflops="T x torch.mm((B,N), (N,N), out=) in a loop, same shape, dtype and T, timed alternately "
                    "with the reservoir in each repetition; tanh_ms_per_step: torch.tanh((B,N), out=)",
        reservoir_chars_per_s=("model.features (shard_states + state normalisation: the per-shard work) over "
                               f"random tokens; stream: {plan.batch} streams, "
                               f"{plan.stream_warmup} warm-up tokens per stream, steps per stream in "
                               "reservoir_states[N]['stream'] (the warm-up is counted in the time); window: "
                               f"{plan.context} steps per sample from a zero state; chars/s = samples / best seconds; "
                               "_bf16: the same with bfloat16 states (reservoir in bf16; not used for the training "
                               "figures, which use fp32 states)"),
        head_samples_per_s=(f"forward_features + backward + Adam(lr {plan.lr:g}) step, batch {plan.batch}, fp32, "
                            "random (already normalised) states drawn by TensorFeatures.batch from a pool of up to 16 batches; "
                            f"{plan.head_steps} steps per repetition after 3 warm-up steps, timed alternately "
                            "with the authors' approach; the same in both context modes (both give the head an "
                            "(M, N) state tensor)"),
        amortised_samples_per_s=(f"1 / (1 / (reservoir chars/s x {plan.epochs_per_shard}) + 1 / head samples/s): "
                                 f"states computed once per shard and reused for {plan.epochs_per_shard} epochs "
                                 "(reservoir chars/s of the model's N and context mode, from reservoir_chars_per_s)"),
        authors_samples_per_s=("RC/AERC: re-implementation of the authors' windowed recompute (authors_window_states: "
                               f"{plan.context} plain steps of (B,N) x (N,N) from a zero state per batch; "
                               "authors_logits: AERC W_att materialised) + backward + Adam step; "
                               f"{plan.authors_steps} step(s) per repetition after 2 warm-up steps at batch 64. "
                               "Transformer: reference.ReferenceTransformer through reference.train_step_throughput"),
        transformer_samples_per_s=(f"reference.train_step_throughput(model, batch {plan.batch}, context "
                                   f"{plan.context}, steps {plan.tf_steps}) in train mode (dropout active), ours "
                                   "and the reference alternately (each call: batch / median step time); best call, up to "
                                   f"{plan.reps} calls each (warm-up {plan.tf_warmup} step(s) in the first call, "
                                   "1 after)"),
        speedup_vs_authors="ours / the authors' approach measured in this run (per context mode for RC/AERC); "
                           "speedup_vs_authors_quoted divides by authors_quoted instead",
    )


if __name__ == "__main__":
    import json

    print(json.dumps(run_bench(quick="--quick" in sys.argv, progress=True), indent=2))


def format_summary(r: dict) -> str:
    """The headline figures of a bench result as a short text table (the JSON has everything)."""
    lines = [f"device {r['device']} ({r['device_name']}), torch {r['torch']}, {r['threads']} threads, "
             f"batch {r['batch_size']}, {r['seconds']:.0f} s"]
    for key, dtype in (("", "fp32"), ("_bf16", "bf16")):
        for n, v in r.get(f"reservoir_gflops{key}", {}).items():
            lines.append(f"reservoir N={n} {dtype}: {v} GFLOP/s vs GEMM {r[f'gemm_gflops{key}'][n]} "
                         f"-> {r[f'reservoir_vs_gemm{key}'][n]:.2f} (target >= {TARGETS['reservoir_vs_gemm']})")
    for n, modes in r["reservoir_chars_per_s"].items():
        lines.append(f"reservoir states N={n}: " + ", ".join(f"{m} {v:,.0f} chars/s" for m, v in modes.items()))
    for name, v in r["training_samples_per_s"].items():
        speed = r["speedup_vs_authors"].get(name)
        if isinstance(v, dict):
            for mode, figs in v.items():
                lines.append(f"train {name} {mode}: {figs['amortised']:,.0f} samples/s per sample-epoch "
                             f"(head {figs['head']:,.0f}), x{speed[mode]:.1f} vs authors' approach")
        else:
            lines.append(f"train {name}: {v:,.0f} samples/s, x{speed:.1f} vs authors' approach")
    for name, t in r.get("token_level", {}).items():
        if name == "targets":
            continue
        longest = max(t["generation"], key=int)
        lines.append(f"{name} ({t['trainable_params']:,} params): {t['train_tokens_per_s']:,.0f} train tokens/s; "
                     f"per token at {longest}: {t['generation'][longest]['stateful_ms']} ms stateful, "
                     f"x{t['speedup_vs_rerun_at_longest']} vs re-running the prefix, "
                     f"x{t['growth_long_vs_short']} of the time at {min(t['generation'], key=int)}")
    if r.get("contention", {}).get("contended"):
        lines.append("warning: another process was busy on these cores; figures are unreliable")
    return "\n".join(lines)
