"""Benchmarks, 3./4. training: our training step against the authors' approach, timed alternately.

Every step timed here is `reslm.train.train_step` with the optimiser `reslm.train.make_optimizer`
builds from the family's training defaults: the step `reslm train` runs, not a copy of it. Only the
forward differs: the head on precomputed states, the authors' windowed recompute
(`reslm.bench.reference`), the transformer, or torch's encoder (ReferenceTransformer).

Every rate counts training targets per second: a window step of batch B has B targets, an
all-position step (the causal transformer, the stream-mode recurrent model) B targets in B / context
chunks, so the two modes are compared at the same targets per step, as `reslm train` runs them."""
from __future__ import annotations

import functools
from dataclasses import replace

import torch
import torch.nn.functional as F

from reslm.bench.plan import AUTHORS_QUOTED, MODES, BenchPlan, _spec
from reslm.bench.reference import ReferenceTransformer, authors_logits, authors_window_states
from reslm.bench.timing import repeat, sig, stats, timing_model
from reslm.core.device import bf16_status, grad_scaler
from reslm.features import estimate_loss, eval_batch_size
from reslm.models import MODELS, make_config, window_kernel
from reslm.models.base import TensorFeatures
from reslm.models.reservoir_lm import ReservoirLM
from reslm.models.rnn import CharRNN
from reslm.models.transformer import CharTransformer, training_flops_per_sample
from reslm.train import make_optimizer, train_config, train_step


# --- 3./4. training: ours against the authors' approach --------------------------------------------
def amortised_samples_per_s(reservoir_samples_per_s: float, head_samples_per_s: float,
                            epochs_per_shard: int = 5) -> float:
    """Training samples/s under the shard schedule: each sample's state is computed once per shard
    and used for `epochs_per_shard` epochs, so one sample-epoch costs
    reservoir_seconds_per_sample / epochs_per_shard + head_seconds_per_sample."""
    return 1.0 / (1.0 / (reservoir_samples_per_s * epochs_per_shard) + 1.0 / head_samples_per_s)


def trainer(model, forward, batches: list[tuple], *, family: str, lr: float, precision: str = "fp32"):
    """run(k, b=None): k training steps of `reslm.train.train_step` (forward(x, y) -> (logits, loss),
    backward, the optimiser of `family`'s training defaults at learning rate lr, the finite check),
    cycling through `batches` [(x, y), ...]; b keeps only the first b samples of each (a cheap warm-up)."""
    device = batches[0][0].device
    tc = train_config(family, lr=lr)
    opt, scaler = make_optimizer(model, tc, device), grad_scaler(precision, device)

    def run(k: int, b: int | None = None):
        model.train()
        for i in range(k):
            x, y = batches[i % len(batches)]
            train_step(forward, [(x[:b], y[:b])], opt, scaler, lr=lr, precision=precision, device=device,
                       grad_clip=tc.grad_clip)

    return run


def random_windows(vocab: int, batch: int, context: int, device: torch.device, seed: int, n: int = 4) -> list:
    """n batches of (windows (B, context), next tokens (B,)) of random token ids."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(vocab, (batch, context), generator=g).to(device),
             torch.randint(vocab, (batch,), generator=g).to(device)) for _ in range(n)]


def random_chunks(vocab: int, targets: int, context: int, device: torch.device, seed: int, n: int = 4) -> list:
    """n batches of (chunks (targets / context, context), next tokens of every position (same shape))."""
    g = torch.Generator().manual_seed(seed)
    rows = max(1, targets // context)
    return [(torch.randint(vocab, (rows, context), generator=g).to(device),
             torch.randint(vocab, (rows, context), generator=g).to(device)) for _ in range(n)]


def head_trainer(model, *, family: str, batch: int, lr: float, device: torch.device, pool_batches: int = 16):
    """Head-only training on precomputed (random) states: batches drawn with Features.batch from a
    pool of up to `pool_batches` batches of states, forward_features + the training step (the inner
    loop of training a reservoir model)."""
    N, V = model.config.size, model.config.vocab_size
    pool = max(batch, min(pool_batches * batch, 2**26 // N))
    g = torch.Generator().manual_seed(3)
    feats = TensorFeatures(torch.randn(pool, N, generator=g).to(device),
                           torch.randint(V, (pool,), generator=g).to(device))
    order = [torch.randperm(pool, generator=g)[:batch].to(device) for _ in range(8)]
    return trainer(model, lambda idx, y: model.forward_features(feats.batch(idx), y),
                   [(idx, feats.targets[idx]) for idx in order], family=family, lr=lr)


def authors_trainer(model, *, family: str, batch: int, context: int, lr: float, device: torch.device):
    """The authors' training step: the reservoir re-run over each sample's window for every batch
    (authors_window_states), then authors_logits and the same training step as ours."""
    def forward(windows, targets):
        logits = authors_logits(model, authors_window_states(model, windows))
        return logits, F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets)

    batches = random_windows(model.config.vocab_size, batch, context, device, seed=4)
    return trainer(model, forward, batches, family=family, lr=lr)


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
    trainers = dict(head=head_trainer(model, family=family, batch=plan.batch, lr=plan.lr, device=device),
                    authors=authors_trainer(model, family=family, batch=plan.batch, context=plan.context, lr=plan.lr,
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
    trainers = {k: trainer(m.to(device), m, batches, family=family, lr=plan.lr)
                for k, m in (("ours", CharTransformer(cfg)), ("authors", ReferenceTransformer(cfg)))}
    causal = CharTransformer(replace(cfg, context_mode="causal")).to(device)   # the same targets per step
    trainers["causal"] = trainer(causal, causal, random_chunks(cfg.vocab_size, plan.batch, cfg.context, device, seed=5),
                                 family=family, lr=plan.lr)
    if bf16_status(device)[0]:   # `--precision bf16`: the forward under bf16 autocast, where bf16 is fast
        m16 = CharTransformer(cfg).to(device)
        trainers["ours_bf16"] = trainer(m16, m16, batches, family=family, lr=plan.lr, precision="bf16")

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
    row["window_step"] = "fused" if device.type == "cpu" and window_kernel.status(cfg)[0] else "plain"
    row.update(causal_targets_per_s=d["causal"]["samples_per_s"],
               causal_speedup_vs_authors=sig(d["causal"]["samples_per_s"] / theirs),
               causal_speedup_vs_window=sig(d["causal"]["samples_per_s"] / ours))
    if "ours_bf16" in d:
        row.update(samples_per_s_bf16=d["ours_bf16"]["samples_per_s"],
                   speedup_vs_authors_bf16=sig(d["ours_bf16"]["samples_per_s"] / theirs),
                   model_gflops_bf16=sig(d["ours_bf16"]["samples_per_s"] * flops / 1e9))
    return row


def _gemm(shape: tuple, dtype: torch.dtype, device) -> tuple:
    """(a callable running `count` x torch.mm((rows, n), (n, n)) in `dtype`, its flops per call)."""
    rows, n, count = shape
    g = torch.Generator().manual_seed(6)
    a, w = torch.randn(rows, n, generator=g).to(device, dtype), torch.randn(n, n, generator=g).to(device, dtype)
    out = torch.empty(rows, n, device=device, dtype=dtype)

    def run(_k=None):
        for _ in range(count):
            torch.mm(a, w, out=out)
    return run, 2.0 * rows * n * n * count


def evaluator(model, batches: list[tuple], pieces: int):
    """run(k): k evaluations (`estimate_loss`, eval mode, no gradient) of a batch of `batches`, in
    forwards of `pieces` windows each: what a run's test-shard evaluation does per batch."""
    def run(k: int, _b=None):
        for i in range(k):
            x, y = batches[i % len(batches)]
            estimate_loss(model, [(x[j:j + pieces], y[j:j + pieces]) for j in range(0, len(y), pieces)])
    return run


def window_step_row(cfg, family: str, plan: BenchPlan, device) -> dict:
    """window_step[label]: the transformer's window training step (reslm train's, train_step + Adam, batch
    plan.batch, dropout on) on the fused kernel and on the plain torch path, in fp32 and (where bf16 is
    fast here) under bf16 autocast, with fp32 and bf16 GEMMs in the same repetitions. The fused kernel
    computes in fp32 only: under bf16 autocast the plain path runs, so there is no fused bf16 figure.
    In the same repetitions, the evaluation forward in fp32 (`eval`: windows/s of the test-shard
    evaluation): fused in the forwards `eval_batch_size` gives it, fused in pieces of the plain path's
    cap, and plain in its pieces."""
    batches = random_windows(cfg.vocab_size, plan.batch, cfg.context, device, seed=5)
    trainers, gemm_flops, evals = {}, {}, {}
    for name, step, precision in (("fused_fp32", "auto", "fp32"), ("plain_fp32", "plain", "fp32"),
                                  ("plain_bf16", "plain", "bf16")):
        if precision == "bf16" and not bf16_status(device)[0]:
            continue
        model = CharTransformer(cfg).to(device)
        model.window_step = step
        if name == "fused_fp32" and not (device.type == "cpu" and window_kernel.status(cfg)[0]):
            continue
        trainers[name] = trainer(model, model, batches, family=family, lr=plan.lr, precision=precision)
        if precision == "fp32":
            whole = eval_batch_size(model, plan.batch, device)
            for pieces in dict.fromkeys((whole, min(plan.batch, model.cpu_eval_batch) if device.type == "cpu" else whole)):
                key = f"{name.split('_')[0]}_in_{pieces}"   # fused_in_1024, fused_in_64, plain_in_64
                evals[key] = trainers[f"eval_{key}"] = evaluator(
                    model, batches, pieces)
    for dtype, key in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        if any(k.endswith(key) for k in trainers):
            trainers[f"gemm_{key}"], gemm_flops[key] = _gemm(plan.tf_gemm, dtype, device)

    def warm():
        for run in trainers.values():
            run(plan.tf_warmup)

    d = bench_training(trainers, dict.fromkeys(trainers, plan.tf_steps), batch=plan.batch, device=device,
                       warmup=warm, **plan.timing())
    gemm = {key: sig(gemm_flops[key] / d.pop(f"gemm_{key}")["best_s"] / 1e9) for key in gemm_flops}
    evaluation = {name: d.pop(f"eval_{name}") for name in evals}
    flops = training_flops_per_sample(cfg)
    plain = d["plain_fp32"]["samples_per_s"]
    row = dict(family=family, flops_per_sample=sig(flops), gemm_gflops=gemm, detail=d,
               fused=(f"the {window_kernel.status(cfg)[1]}, reslm.models.window_kernel" if "fused_fp32" in d else
                      f"not available here: {window_kernel.status(cfg)[1]}"),
               bf16=("the plain path under bf16 autocast (the fused kernel computes in fp32)"
                     if "plain_bf16" in d else f"skipped: {bf16_status(device)[1]}"))
    for name, r in d.items():
        rate, key = r["samples_per_s"], name.split("_")[1]
        row[name] = dict(windows_per_s=rate, vs_gemm=sig(rate * flops / 1e9 / gemm[key]), vs_plain_fp32=sig(rate / plain))
    plain_eval = next(r["samples_per_s"] for name, r in evaluation.items() if name.startswith("plain"))
    row["eval"] = {name: dict(windows_per_s=r["samples_per_s"], windows_per_forward=int(name.rsplit("_", 1)[1]),
                              vs_plain=sig(r["samples_per_s"] / plain_eval), detail=r) for name, r in evaluation.items()}
    return row


def rnn_training_row(cfg, family: str, plan: BenchPlan, device) -> dict:
    """training[label] of a trained recurrent model: window mode (one target per window, from a zero
    state) against stream mode (truncated BPTT, every position a target, the state carried), at the same
    targets per step, timed alternately."""
    window = CharRNN(replace(cfg, context_mode="window")).to(device)
    stream = CharRNN(replace(cfg, context_mode="stream")).to(device)
    trainers = dict(window=trainer(window, window, random_windows(cfg.vocab_size, plan.batch, cfg.context, device, 7),
                                   family=family, lr=plan.lr),
                    stream=trainer(stream, stream, random_chunks(cfg.vocab_size, plan.batch, cfg.context, device, 7),
                                   family=family, lr=plan.lr))

    def warm():
        for run in trainers.values():
            run(plan.tf_warmup)

    d = bench_training(trainers, dict.fromkeys(trainers, plan.tf_steps), batch=plan.batch, device=device,
                       warmup=warm, **plan.timing())
    w, s = d["window"]["samples_per_s"], d["stream"]["samples_per_s"]
    return dict(family=family, samples_per_s=w, stream_targets_per_s=s, stream_speedup_vs_window=sig(s / w), detail=d)


def training_rows(plan: BenchPlan, device: torch.device, states: dict, say) -> dict:
    """Sections 3 and 4 for every model of the plan: {label: row}."""
    rows = {}
    for label, family, overrides in map(_spec, plan.models):
        cfg, quoted = make_config(family, **overrides), AUTHORS_QUOTED.get(label)
        if family == "rnn":
            r = rows[label] = rnn_training_row(cfg, family, plan, device)
            say(f"train {label}: window {r['samples_per_s']} targets/s, stream {r['stream_targets_per_s']} "
                f"targets/s, x{r['stream_speedup_vs_window']}")
        elif issubclass(MODELS[family][1], ReservoirLM):
            r = rows[label] = reservoir_training_row(cfg, family, overrides, plan, device, states, quoted)
            say(f"train {label}: head only {r['head_samples_per_s']} samples/s, authors' windowed recompute "
                f"{r['authors_samples_per_s']} samples/s; amortised " + ", ".join(
                    f"{m} {r[m]['amortised_samples_per_s']} (x{r[m]['speedup_vs_authors']})" for m in MODES))
        else:
            r = rows[label] = transformer_training_row(cfg, family, plan, device, quoted)
            say(f"train {label}: {r['samples_per_s']} samples/s, authors (ReferenceTransformer) "
                f"{r['authors_samples_per_s']} samples/s, x{r['speedup_vs_authors']}; {r['model_gflops']} model "
                f"GFLOP/s vs GEMM {r['gemm_gflops']} GFLOP/s = {r['model_vs_gemm']}; causal "
                f"{r['causal_targets_per_s']} targets/s, x{r['causal_speedup_vs_authors']} the authors'"
                + (f"; bf16 autocast {r['samples_per_s_bf16']} samples/s, x{r['speedup_vs_authors_bf16']}"
                   if "samples_per_s_bf16" in r else ""))
    return rows


def window_step_rows(plan: BenchPlan, device: torch.device, say) -> dict:
    """The window-step section for every transformer of plan.window_models: {label: row}."""
    rows = {}
    for label, family, overrides in map(_spec, plan.window_models):
        r = rows[label] = window_step_row(make_config(family, **overrides), family, plan, device)
        say(f"window step {label}: " + ", ".join(
            f"{k} {v['windows_per_s']} windows/s ({v['vs_gemm']} of GEMM, x{v['vs_plain_fp32']} plain fp32)"
            for k, v in r.items() if isinstance(v, dict) and "windows_per_s" in v))
        say(f"evaluation {label}: " + ", ".join(f"{k} {v['windows_per_s']} windows/s (x{v['vs_plain']} plain)"
                                                for k, v in r["eval"].items()))
    return rows
