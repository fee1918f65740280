"""Benchmarks: `reslm bench`, reservoir and training throughput on this machine against the authors' approach.

Everything is measured in one run, on the device `pick_device("auto")` picks (CUDA when present),
with fp32 weights and states unless a figure says otherwise, through `reslm.bench_timing` (warm-up,
repetitions, best repetition). Measured figures are in the README, with the command.

What is measured (keys of the returned dict; `_bf16` keys hold the bfloat16 runs, which are skipped,
with a note under `bf16`, where bf16 is slow: see `reslm.device.bf16_fast`):

1. Recurrence vs GEMM (`reservoir_gflops`, `gemm_gflops`, `reservoir_vs_gemm`; detail in
   `recurrence[dtype][N]`). `ESN.forward(u (B,T,d), s0)` over B = 1024 streams and T steps, counted
   as the 2 B T N^2 flops of the recurrent products only (the tiny input products and tanh are
   overhead the reservoir has to hide); GEMM = T x `torch.mm((B,N), (N,N), out=...)`, same shape and
   dtype, timed alternately with the reservoir. The cost of one tanh over (B,N) per step is reported
   too: it is what separates the two.
2. Reservoir chars/s (`reservoir_chars_per_s[N][mode]`; detail in `reservoir_states`): the per-shard
   work of a reservoir model, `model.features` (`shard_states` + the state normalisation) over a
   random token stream, in `stream` mode (1024 streams, 32 warm-up tokens each: one reservoir step
   per char plus the warm-up) and in `window` mode (each sample from a zero state over its 32-char
   window); chars/s = samples/s = samples / seconds.
3. Training (`training[model]`, `training_samples_per_s`). Reservoir models: (a) head-only training
   on precomputed states (random states of the right shape, shuffled batches of 1024 drawn with
   `Features.batch`, `forward_features` + backward + Adam step), the same in both context modes;
   (b) the amortised figure under the paper's 5-epochs-per-shard schedule: one sample-epoch costs
   reservoir seconds per sample / 5 + head seconds per sample (`amortised_samples_per_s`), per
   context mode. Transformers: full training steps in train mode (dropout active), and beside them
   the model's FLOP rate (`transformer_model_gflops`: samples/s x `training_flops_per_sample`, the
   analytic count of forward + backward) against an fp32 GEMM timed in the same repetitions
   (`transformer_gemm_gflops`, `transformer_vs_gemm`).
4. The authors' approach, measured in the same run and timed alternately with 3.
   (`authors_samples_per_s`, `speedup_vs_authors`): RC/AERC re-run the reservoir over each sample's
   32-char window in every batch, then the paper's readout (`reslm.models.reference`:
   `authors_window_states`, `authors_logits`); the transformer is `ReferenceTransformer` (torch's
   nn.TransformerEncoder). These are re-implementations written for timing, not the authors' code;
   `authors_quoted` holds the figures the issue quotes for their code, for comparison across machines.
5. Token level (`token_level`, `reslm.bench_tokens`): LAERC vs GPT training tokens/s and generation
   time per token.

Context: device, threads, torch version, batch size, `method` (how each figure was measured), the
load average and `contention`: `bench_timing.contention_probe` run between the sections. When other
processes hold the cores, small-op figures (heads, AERC, small reservoirs, tanh, the transformer)
drop many times; the report then carries a warning. `meets_target` compares with `TARGETS`.
"""
from __future__ import annotations

import functools
import json
import math
import os
import sys
import time
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from reslm import bench_tokens
from reslm.bench_timing import contention_probe, loadavg, repeat, sig, stats, timing_model, timing_reservoir
from reslm.device import autocast, bf16_status, cpu_name, pick_device
from reslm.lab import SUBSTRATES, _names
from reslm.lab import model_overrides as lab_overrides
from reslm.models import PRESETS, make_config
from reslm.models.base import TensorFeatures
from reslm.models.reference import ReferenceTransformer, authors_logits, authors_window_states
from reslm.models.transformer import CharTransformer, training_flops_per_sample
from reslm.reservoir import ESNConfig

# Figures the issue quotes for the authors' code (2 threads, batch 1024, fp32), samples/s.
AUTHORS_QUOTED = {"rc-750": 4100.0, "rc-2600": 410.0, "aerc-100-20": 52000.0, "aerc-160-30": 24700.0,
                  "tf-128-8-8": 737.0}
AUTHORS_QUOTED_CONDITIONS = ("the authors' code as quoted in the issue: 2 CPU threads, batch 1024, fp32; "
                             "RC/AERC: windowed recompute of the reservoir per batch")
# Targets of the issue: reservoir recurrence >= 80% of GEMM; training speed-up over the authors.
TARGETS = {"reservoir_vs_gemm": 0.8, "speedup_vs_authors": {"rc": 20.0, "aerc": 2.5, "tf": 3.0}}
SUFFIX = {"float32": "", "bfloat16": "_bf16"}   # dtype -> suffix of its headline keys
MODES = ("window", "stream")


# --- plan ------------------------------------------------------------------------------------------
SECTIONS = ("recurrence", "states", "training", "tokens", "substrates")   # what `--only` can pick


def parse_sections(sections) -> tuple[str, ...]:
    """"a,b" or a list -> a tuple of SECTIONS, in their order; one-line error on anything else."""
    return _names(sections, SECTIONS, "bench section")


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
    # 2. reservoir states (chars/s) in fp32 for these sizes and those of the reservoir models
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
    tf_steps: int = 2                      # transformer training steps per repetition
    tf_warmup: int = 2                     # untimed transformer steps first
    tf_gemm: tuple = (1024, 768, 4)        # (rows, N, count): the GEMM timed beside the transformer, fp32
    # repetitions (see bench_timing.repeat)
    reps: int = 3                          # at least this many timed repetitions ...
    max_reps: int = 20                     # ... and up to this many while under min_time_s
    min_time_s: float = 3.0
    budget_s: float = 20.0                 # no new repetition after this many seconds
    seed: int = 0
    token_level: bool = True               # 5. LAERC vs GPT (reslm.bench_tokens)
    substrate_chars: int = 2**16           # 6. characters per timed stream of each substrate (0: skip)

    @classmethod
    def full(cls) -> "BenchPlan":
        return cls()

    @classmethod
    def quick(cls) -> "BenchPlan":
        return cls(recurrence_work=12e9, recurrence_steps=(2, 16), stream_work=0.3e12, stream_steps=(16, 64),
                   window_work=0.05e12, states_bf16=False, models=("rc-750", "aerc-100-20", "tf-128-8-8"), head_steps=4,
                   tf_steps=1, tf_warmup=1, reps=1, max_reps=10, min_time_s=1.0, budget_s=3.0,
                   substrate_chars=2**13)

    def only(self, sections) -> "BenchPlan":
        """This plan measuring only some of SECTIONS ("training" also times its models' states)."""
        keep = set(parse_sections(sections))
        return replace(self, recurrence_dtypes=self.recurrence_dtypes if "recurrence" in keep else (),
                       states_sizes=self.states_sizes if "states" in keep else (),
                       states_bf16=self.states_bf16 and "states" in keep,
                       models=self.models if "training" in keep else (),
                       token_level=self.token_level and "tokens" in keep,
                       substrate_chars=self.substrate_chars if "substrates" in keep else 0)

    def timing(self) -> dict:
        """The keyword arguments of bench_timing.repeat."""
        return dict(reps=self.reps, budget_s=self.budget_s, min_time_s=self.min_time_s, max_reps=self.max_reps)


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


def _log(progress: bool, msg: str):
    if progress:
        print(f"[bench] {msg}", file=sys.stderr, flush=True)


# --- 1. recurrence vs GEMM -------------------------------------------------------------------------
def bench_recurrence(size: int, *, batch: int, steps: int, dtype: torch.dtype, device: torch.device,
                     input_dim: int = 16, **timing) -> dict:
    """ESN.forward over `batch` streams x `steps` steps vs `steps` x torch.mm((B,N),(N,N)), same dtype.

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

    t = repeat(dict(gemm=gemm, reservoir=reservoir, loop=lambda: reservoir(esn_loop),
                    blocked=lambda: reservoir(esn_blocked), tanh=tanh), device, **timing, warmup=warm)
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
                **{k: stats(t[k]) for k in ("reservoir", "gemm", "loop", "blocked")})


def recurrence_rows(plan: BenchPlan, device: torch.device, dtype: str, say) -> dict:
    """Section 1 in one dtype: {str(N): bench_recurrence(...)} for plan.recurrence_sizes."""
    rows = {}
    for N in plan.recurrence_sizes:
        T = _clamp(plan.recurrence_work / (2.0 * plan.batch * N * N), *plan.recurrence_steps)
        r = rows[str(N)] = bench_recurrence(N, batch=plan.batch, steps=T, dtype=getattr(torch, dtype),
                                            device=device, input_dim=plan.embed_dim, **plan.timing())
        say(f"recurrence N={N} {dtype} B={plan.batch} T={T}: reservoir {r['reservoir_gflops']} GFLOP/s, "
            f"gemm {r['gemm_gflops']} GFLOP/s, ratio {r['reservoir_vs_gemm']} ({r['backend']}; torch.tanh loop "
            f"{r['loop_vs_gemm']}, blocked {r['blocked_vs_gemm']}) "
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


# --- 3./4. training: ours against the authors' approach --------------------------------------------
def amortised_samples_per_s(reservoir_samples_per_s: float, head_samples_per_s: float,
                            epochs_per_shard: int = 5) -> float:
    """Training samples/s under the shard schedule: each sample's state is computed once per shard
    and used for `epochs_per_shard` epochs, so one sample-epoch costs
    reservoir_seconds_per_sample / epochs_per_shard + head_seconds_per_sample."""
    return 1.0 / (1.0 / (reservoir_samples_per_s * epochs_per_shard) + 1.0 / head_samples_per_s)


def trainer(model, loss, batches: list[tuple], lr: float):
    """run(k, b=None): k training steps, loss(*batch) + backward + Adam(lr) on the trainable
    parameters, cycling through `batches` (tuples of tensors); b keeps only the first b samples of
    each tensor (a cheap warm-up)."""
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)

    def run(k: int, b: int | None = None):
        model.train()
        for i in range(k):
            opt.zero_grad(set_to_none=True)
            loss(*(t[:b] for t in batches[i % len(batches)])).backward()
            opt.step()

    return run


def random_windows(vocab: int, batch: int, context: int, device: torch.device, seed: int, n: int = 4) -> list:
    """n batches of (windows (B, context), next tokens (B,)) of random token ids."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(vocab, (batch, context), generator=g).to(device),
             torch.randint(vocab, (batch,), generator=g).to(device)) for _ in range(n)]


def head_trainer(model, *, batch: int, lr: float, device: torch.device, pool_batches: int = 16):
    """Head-only training on precomputed (random) states: batches drawn with Features.batch from a
    pool of up to `pool_batches` batches of states, forward_features + backward + Adam step (the
    inner loop of training a reservoir model)."""
    N, V = model.config.size, model.config.vocab_size
    pool = max(batch, min(pool_batches * batch, 2**26 // N))
    g = torch.Generator().manual_seed(3)
    feats = TensorFeatures(torch.randn(pool, N, generator=g).to(device),
                           torch.randint(V, (pool,), generator=g).to(device))
    order = [(torch.randperm(pool, generator=g)[:batch].to(device),) for _ in range(8)]
    return trainer(model, lambda idx: model.forward_features(feats.batch(idx), feats.targets[idx])[1], order, lr)


def authors_trainer(model, *, batch: int, context: int, lr: float, device: torch.device):
    """The authors' training step: the reservoir re-run over each sample's window for every batch
    (authors_window_states), then authors_logits + backward + Adam."""
    def loss(windows, targets):
        logits = authors_logits(model, authors_window_states(model, windows))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets)

    batches = random_windows(model.config.vocab_size, batch, context, device, seed=4)
    return trainer(model, loss, batches, lr)


def bench_training(trainers: dict, steps: dict, *, batch: int, device: torch.device, warmup, **timing) -> dict:
    """Time `steps[k]` steps of each trainer per repetition, alternately. {k: samples_per_s, ...}."""
    t = repeat({k: functools.partial(run, steps[k]) for k, run in trainers.items()}, device,
               warmup=warmup, **timing)
    return {k: dict(samples_per_s=sig(batch * steps[k] / min(t[k])), steps=steps[k], **stats(t[k]))
            for k in trainers}


def _speedups(ours: float, authors: float, quoted: float | None) -> dict:
    return dict(speedup_vs_authors=sig(ours / authors),
                speedup_vs_authors_quoted=sig(ours / quoted) if quoted else None)


def reservoir_training_row(cfg, family: str, overrides: dict, plan: BenchPlan, device, states: dict,
                           quoted: float | None) -> dict:
    """training[label] of a reservoir model: head only and the authors' approach timed together,
    then the amortised figure and the speed-up per context mode (reservoir speed from `states`)."""
    model = timing_model(family, overrides, device)
    trainers = dict(head=head_trainer(model, batch=plan.batch, lr=plan.lr, device=device),
                    authors=authors_trainer(model, batch=plan.batch, context=plan.context, lr=plan.lr,
                                            device=device))

    def warm():
        trainers["head"](3)
        trainers["authors"](2, min(plan.batch, 64))

    d = bench_training(trainers, dict(head=plan.head_steps, authors=plan.authors_steps), batch=plan.batch,
                       device=device, warmup=warm, **plan.timing())
    head, auth = d["head"]["samples_per_s"], d["authors"]["samples_per_s"]
    row = dict(family=family, size=cfg.size, head_samples_per_s=head, authors_samples_per_s=auth,
               authors_quoted_samples_per_s=quoted, detail=d)
    for mode in MODES:
        res = states[str(cfg.size)][mode]["chars_per_s"]
        am = sig(amortised_samples_per_s(res, head, plan.epochs_per_shard))
        row[mode] = dict(head_samples_per_s=head, reservoir_samples_per_s=res, amortised_samples_per_s=am,
                         **_speedups(am, auth, quoted))
    return row


def transformer_training_row(cfg, family: str, plan: BenchPlan, device, quoted: float | None) -> dict:
    """training[label] of a transformer: CharTransformer and ReferenceTransformer (torch's encoder:
    the authors' model) of the same config, full training steps timed alternately."""
    batches = random_windows(cfg.vocab_size, plan.batch, cfg.context, device, seed=5)
    trainers = {k: trainer(m.to(device), lambda x, y, m=m: m(x, y)[1], batches, plan.lr)
                for k, m in (("ours", CharTransformer(cfg)), ("authors", ReferenceTransformer(cfg)))}
    if bf16_status(device)[0]:   # `--precision bf16`: the forward under bf16 autocast, where bf16 is fast
        m16 = CharTransformer(cfg).to(device)

        def loss_bf16(x, y):
            with autocast("bf16", device):
                return m16(x, y)[1]

        trainers["ours_bf16"] = trainer(m16, loss_bf16, batches, plan.lr)

    rows, n, count = plan.tf_gemm      # a GEMM in the same repetitions: the machine's rate at this moment
    g = torch.Generator().manual_seed(6)
    a, w = torch.randn(rows, n, generator=g).to(device), torch.randn(n, n, generator=g).to(device)
    out = torch.empty(rows, n, device=device)

    def gemm(_k=None):
        for _ in range(count):
            torch.mm(a, w, out=out)
    trainers["gemm"] = gemm

    def warm():
        for run in trainers.values():
            run(plan.tf_warmup)

    d = bench_training(trainers, dict.fromkeys(trainers, plan.tf_steps), batch=plan.batch, device=device,
                       warmup=warm, **plan.timing())
    gemm_row = d.pop("gemm")
    gemm_gflops = 2.0 * rows * n * n * count / gemm_row["best_s"] / 1e9
    flops = training_flops_per_sample(cfg)
    ours, theirs = d["ours"]["samples_per_s"], d["authors"]["samples_per_s"]
    row = dict(family=family, samples_per_s=ours, authors_samples_per_s=theirs, authors_quoted_samples_per_s=quoted,
               **_speedups(ours, theirs, quoted), flops_per_sample=sig(flops), model_gflops=sig(ours * flops / 1e9),
               gemm_gflops=sig(gemm_gflops), model_vs_gemm=sig(ours * flops / 1e9 / gemm_gflops),
               gemm=dict(shape=[rows, n, n], count=count, **{k: v for k, v in gemm_row.items() if k != "samples_per_s"}),
               detail=d)
    if "ours_bf16" in d:
        row.update(samples_per_s_bf16=d["ours_bf16"]["samples_per_s"],
                   speedup_vs_authors_bf16=sig(d["ours_bf16"]["samples_per_s"] / theirs),
                   model_gflops_bf16=sig(d["ours_bf16"]["samples_per_s"] * flops / 1e9))
    return row


def training_rows(plan: BenchPlan, device: torch.device, states: dict, say) -> dict:
    """Sections 3 and 4 for every model of the plan: {label: row}."""
    rows = {}
    for label, family, overrides in map(_spec, plan.models):
        cfg, quoted = make_config(family, **overrides), AUTHORS_QUOTED.get(label)
        if hasattr(cfg, "reservoir"):
            r = rows[label] = reservoir_training_row(cfg, family, overrides, plan, device, states, quoted)
            say(f"train {label}: head only {r['head_samples_per_s']} samples/s, authors' windowed recompute "
                f"{r['authors_samples_per_s']} samples/s; amortised " + ", ".join(
                    f"{m} {r[m]['amortised_samples_per_s']} (x{r[m]['speedup_vs_authors']})" for m in MODES))
        else:
            r = rows[label] = transformer_training_row(cfg, family, plan, device, quoted)
            say(f"train {label}: {r['samples_per_s']} samples/s, authors (ReferenceTransformer) "
                f"{r['authors_samples_per_s']} samples/s, x{r['speedup_vs_authors']}; {r['model_gflops']} model "
                f"GFLOP/s vs GEMM {r['gemm_gflops']} GFLOP/s = {r['model_vs_gemm']}"
                + (f"; bf16 autocast {r['samples_per_s_bf16']} samples/s, x{r['speedup_vs_authors_bf16']}"
                   if "samples_per_s_bf16" in r else ""))
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


# --- the report --------------------------------------------------------------------------------------
def headline(recurrence: dict, states: dict, training: dict) -> dict:
    """The flat figures of the report from the detailed rows ({dtype: rows} for recurrence/states)."""
    out = {}
    for dtype, sfx in SUFFIX.items():
        for key in ("reservoir_gflops", "gemm_gflops", "reservoir_vs_gemm"):
            out[key + sfx] = {n: r[key] for n, r in recurrence.get(dtype, {}).items()}
        out["reservoir_chars_per_s" + sfx] = {n: {m: r["chars_per_s"] for m, r in v.items()}
                                              for n, v in states.get(dtype, {}).items()}
    reservoir = {k for k, v in training.items() if "window" in v}
    out["training_samples_per_s"] = {
        k: {m: dict(head=v["head_samples_per_s"], amortised=v[m]["amortised_samples_per_s"]) for m in MODES}
        if k in reservoir else v["samples_per_s"] for k, v in training.items()}
    out["authors_samples_per_s"] = {k: v["authors_samples_per_s"] for k, v in training.items()}
    out["speedup_vs_authors"] = {k: {m: v[m]["speedup_vs_authors"] for m in MODES} if k in reservoir
                                 else v["speedup_vs_authors"] for k, v in training.items()}
    tf = {k: v for k, v in training.items() if "model_gflops" in v}
    out["transformer_model_gflops"] = {k: v["model_gflops"] for k, v in tf.items()}
    out["transformer_gemm_gflops"] = {k: v["gemm_gflops"] for k, v in tf.items()}
    out["transformer_vs_gemm"] = {k: v["model_vs_gemm"] for k, v in tf.items()}
    bf16 = {k: v for k, v in training.items() if "samples_per_s_bf16" in v}
    if bf16:   # the transformer under bf16 autocast (`--precision bf16`), where the hardware has fast bf16
        out["training_samples_per_s_bf16"] = {k: v["samples_per_s_bf16"] for k, v in bf16.items()}
        out["speedup_vs_authors_bf16"] = {k: v["speedup_vs_authors_bf16"] for k, v in bf16.items()}
    return out


def meets_target(head: dict, training: dict) -> dict:
    """Each headline figure against TARGETS (True/False), in the shape of the figure."""
    out = {f"reservoir_vs_gemm{sfx}": {n: v >= TARGETS["reservoir_vs_gemm"]
                                       for n, v in head[f"reservoir_vs_gemm{sfx}"].items()}
           for sfx in SUFFIX.values()}
    targets = TARGETS["speedup_vs_authors"]
    out["speedup_vs_authors"] = {
        k: {m: x >= targets[training[k]["family"]] for m, x in v.items()} if isinstance(v, dict)
        else v >= targets[training[k]["family"]]
        for k, v in head["speedup_vs_authors"].items() if training[k]["family"] in targets}
    return out


def contention(probes: dict) -> dict:
    out = dict(probes=probes, contended=[k for k, p in probes.items() if p["contended"]])
    if out["contended"]:
        out["warning"] = ("other processes were competing for the CPU (see contention_probe): small-op figures "
                          "(heads, AERC, transformer, tanh) can be many times lower than on an idle machine, "
                          "and not comparable across runs")
    return out


def machine(device: torch.device) -> dict:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    return dict(device=str(device), device_name=name, torch=torch.__version__, threads=torch.get_num_threads())


def bench_dtypes(device: torch.device) -> tuple[list[str], str]:
    """(the dtypes to measure, the note for the report's `bf16` key): bf16 only where it is fast."""
    fast, why = bf16_status(device)
    if fast:
        return ["float32", "bfloat16"], "measured"
    return ["float32"], f"skipped: no fast bf16 on this {device.type.upper()} ({why})"


def run_bench(quick: bool = False, progress: bool = False, plan: BenchPlan | None = None,
              device: str | torch.device = "auto", only=None) -> dict:
    """Run every measurement of `plan` (BenchPlan.quick() / .full() by default), or `only` some of
    SECTIONS ("a,b" or a list), and return the report."""
    plan = plan or (BenchPlan.quick() if quick else BenchPlan.full())
    if only is not None:
        plan = plan.only(only)
    dev = pick_device(device) if isinstance(device, str) else device
    say = functools.partial(_log, progress)
    t_start, load_before = time.perf_counter(), loadavg()
    probes = {"start": contention_probe()}
    torch.manual_seed(plan.seed)
    dtypes, bf16_note = bench_dtypes(dev)
    say(f"device {dev}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
        f"{'quick' if quick else 'full'} plan; bf16 {bf16_note}; load {load_before}, contention probe: "
        f"{probes['start']['multi_vs_single']}x the single-thread time per small op"
        f"{' (CONTENDED)' if probes['start']['contended'] else ''}")

    recurrence = {d: recurrence_rows(plan, dev, d, say) for d in dtypes if d in plan.recurrence_dtypes}
    probes["after recurrence"] = contention_probe()

    model_sizes = [c.size for c in (make_config(f, **o) for _, f, o in map(_spec, plan.models))
                   if hasattr(c, "reservoir")]
    sizes = {"float32": list(dict.fromkeys([*plan.states_sizes, *model_sizes])),
             "bfloat16": list(plan.states_sizes) if plan.states_bf16 else []}
    states = {d: states_rows(plan, dev, d, sizes[d], say) for d in dtypes if sizes[d]}
    probes["after states"] = contention_probe()

    training = training_rows(plan, dev, states.get("float32", {}), say)

    result = dict(machine(dev), dtype="float32", bf16=bf16_note, batch_size=plan.batch, context=plan.context,
                  epochs_per_shard=plan.epochs_per_shard, quick=bool(quick),
                  sections=list(SECTIONS if only is None else parse_sections(only)),
                  **headline(recurrence, states, training),
                  authors_quoted=dict(AUTHORS_QUOTED, conditions=AUTHORS_QUOTED_CONDITIONS), targets=TARGETS,
                  recurrence=recurrence, reservoir_states=states.get("float32", {}),
                  reservoir_states_bf16=states.get("bfloat16", {}), training=training, method=method(plan))
    result["meets_target"] = meets_target(result, training)
    result["load_average"] = dict(before=load_before, after=loadavg(), cpus=os.cpu_count())
    if plan.token_level:
        result["token_level"] = bench_tokens.run(quick, dev, say)
    if plan.substrate_chars:
        result["substrate_chars_per_s"] = substrate_rows(plan, dev, say)
    probes["end"] = contention_probe()
    result["contention"] = contention(probes)
    result["seconds"] = sig(time.perf_counter() - t_start)
    say(f"done in {result['seconds']} s")
    return result


def method(plan: BenchPlan) -> dict:
    """How each figure was measured, in words, for the report."""
    reps = (f"an untimed warm-up, then at least {plan.reps} timed repetitions, more (up to {plan.max_reps}) "
            f"until {plan.min_time_s:g} s were spent, none started after {plan.budget_s:g} s (so a slow one may "
            "have fewer); the figure is the BEST repetition (least disturbed by other processes), the median "
            "and the count are in the details (best_s, median_s, reps)")
    return dict(
        repetitions=reps,
        clock="time.perf_counter around each repetition, reslm.device.synchronize before reading it",
        reservoir_gflops=("ESN.forward(u (B,T,d), s0), its default backend (recurrence[dtype][N]['backend']; "
                          "on a CPU 'sigmoid', tanh as 2 sigmoid(2z) - 1 in float32; loop_gflops: the plain loop "
                          "with torch.tanh, blocked_gflops: that loop in row blocks), B=batch_size streams and T steps "
                          f"(T = {plan.recurrence_work:g} flops / (2 B N^2) clamped to {plan.recurrence_steps}; "
                          "per N in recurrence[dtype][N]['steps']), counted as 2 B T N^2 flops; "
                          "timing reservoir (see reslm.bench_timing)"),
        gemm_gflops="T x torch.mm((B,N), (N,N), out=) in a loop, same shape, dtype and T, timed alternately "
                    "with the reservoir in each repetition; tanh_ms_per_step: torch.tanh((B,N), out=)",
        reservoir_chars_per_s=("model.features (shard_states + state normalisation: the per-shard work) over "
                               f"random tokens; stream: {plan.batch} streams, "
                               f"{plan.stream_warmup} warm-up tokens per stream, steps per stream in "
                               "reservoir_states[N]['stream'] (the warm-up is counted in the time); window: "
                               f"{plan.context} steps per sample from a zero state; chars/s = samples / best seconds; "
                               "_bf16: the same with bfloat16 states (not used for the training figures, which "
                               "use fp32 states); skipped where bf16 is slow (key bf16)"),
        head_samples_per_s=(f"forward_features + backward + Adam(lr {plan.lr:g}) step, batch {plan.batch}, fp32, "
                            "random (already normalised) states drawn by TensorFeatures.batch from a pool of up "
                            f"to 16 batches; {plan.head_steps} steps per repetition after 3 warm-up steps, timed "
                            "alternately with the authors' approach; the same in both context modes (both give "
                            "the head an (M, N) state tensor)"),
        amortised_samples_per_s=(f"1 / (1 / (reservoir chars/s x {plan.epochs_per_shard}) + 1 / head samples/s): "
                                 f"states computed once per shard and reused for {plan.epochs_per_shard} epochs "
                                 "(reservoir chars/s of the model's N and context mode, from reservoir_chars_per_s)"),
        authors_samples_per_s=("RC/AERC: reslm.models.reference.authors_window_states (the authors' windowed "
                               f"recompute: {plan.context} plain steps of (B,N) x (N,N) from a zero state per batch) "
                               "+ authors_logits (AERC W_att materialised) + backward + Adam step; "
                               f"{plan.authors_steps} step(s) per repetition after 2 warm-up steps at batch 64. "
                               "Transformer: reference.ReferenceTransformer (nn.TransformerEncoder)"),
        transformer_samples_per_s=(f"forward + backward + Adam(lr {plan.lr:g}) on random windows of {plan.context} "
                                   f"chars, batch {plan.batch}, train mode (dropout active); {plan.tf_steps} steps "
                                   f"per repetition after {plan.tf_warmup} warm-up step(s), ours and the "
                                   "reference alternately"),
        transformer_model_gflops=("samples/s x reslm.models.transformer.training_flops_per_sample (the matrix "
                                  "products of forward + backward, counted analytically); transformer_gemm_gflops: "
                                  f"{plan.tf_gemm[2]} x torch.mm(({plan.tf_gemm[0]}, {plan.tf_gemm[1]}), "
                                  f"({plan.tf_gemm[1]}, {plan.tf_gemm[1]})) fp32 timed in the same repetitions as "
                                  "the transformer; transformer_vs_gemm = their quotient"),
        speedup_vs_authors="ours / the authors' approach measured in this run (per context mode for RC/AERC); "
                           "speedup_vs_authors_quoted divides by authors_quoted instead",
    )


def format_summary(r: dict) -> str:
    """The headline figures of a bench result as a short text table (the JSON has everything)."""
    lines = [f"device {r['device']} ({r['device_name']}), torch {r['torch']}, {r['threads']} threads, "
             f"batch {r['batch_size']}, {r['seconds']:.0f} s"]
    for sfx, dtype in (("", "fp32"), ("_bf16", "bf16")):
        for n, v in r.get(f"reservoir_gflops{sfx}", {}).items():
            lines.append(f"reservoir N={n} {dtype}: {v} GFLOP/s vs GEMM {r[f'gemm_gflops{sfx}'][n]} "
                         f"-> {r[f'reservoir_vs_gemm{sfx}'][n]:.2f} (target >= {TARGETS['reservoir_vs_gemm']})")
    if str(r.get("bf16", "")).startswith("skipped"):
        lines.append(f"bf16 {r['bf16']}")
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
            if name in r.get("transformer_vs_gemm", {}):
                lines.append(f"train {name}: {r['transformer_model_gflops'][name]} model GFLOP/s (forward + backward) "
                             f"vs GEMM {r['transformer_gemm_gflops'][name]} GFLOP/s in the same repetitions "
                             f"-> {r['transformer_vs_gemm'][name]:.3f}")
            if name in r.get("training_samples_per_s_bf16", {}):
                lines.append(f"train {name} bf16 autocast: {r['training_samples_per_s_bf16'][name]:,.0f} samples/s, "
                             f"x{r['speedup_vs_authors_bf16'][name]:.1f} vs authors' approach (fp32)")
    for name, v in r.get("substrate_chars_per_s", {}).items():
        lines.append(f"substrate {name} (N={v['size']}): {v['chars_per_s']:,.0f} chars/s stream"
                     + (f", x{v['vs_esn']:.1f} the esn's" if v.get("vs_esn") else ""))
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


if __name__ == "__main__":
    print(json.dumps(run_bench(quick="--quick" in sys.argv, progress=True), indent=2))
