"""Benchmarks: `run_bench` (every section of a BenchPlan, in one run) and the report it returns."""
from __future__ import annotations

import functools
import json
import os
import sys
import time

import torch

from reslm.bench import tokens as bench_tokens
from reslm.bench.kernels import recurrence_rows, states_rows, substrate_rows
from reslm.bench.plan import (AUTHORS_QUOTED, AUTHORS_QUOTED_CONDITIONS, MODES, SECTIONS, SUFFIX, TARGETS, BenchPlan,
                              _spec, parse_sections)
from reslm.bench.timing import contention_probe, loadavg, sig
from reslm.bench.training import training_rows, window_step_rows
from reslm.core.device import bf16_status, cpu_name, pick_device
from reslm.models import MODELS, make_config
from reslm.models.reservoir_lm import ReservoirLM


def _log(progress: bool, msg: str):
    if progress:
        print(f"[bench] {msg}", file=sys.stderr, flush=True)


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
    authored = {k: v for k, v in training.items() if "authors_samples_per_s" in v}   # the rnn has no authors' model
    out["authors_samples_per_s"] = {k: v["authors_samples_per_s"] for k, v in authored.items()}
    out["speedup_vs_authors"] = {k: {m: v[m]["speedup_vs_authors"] for m in MODES} if k in reservoir
                                 else v["speedup_vs_authors"] for k, v in authored.items()}
    # all-position training at the same targets per step: the causal transformer, the stream-mode rnn
    out["all_position_targets_per_s"] = {k: v.get("causal_targets_per_s", v.get("stream_targets_per_s"))
                                         for k, v in training.items() if "causal_targets_per_s" in v
                                         or "stream_targets_per_s" in v}
    out["causal_speedup_vs_authors"] = {k: v["causal_speedup_vs_authors"] for k, v in training.items()
                                        if "causal_speedup_vs_authors" in v}
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

    model_sizes = [make_config(f, **o).size for _, f, o in map(_spec, plan.models)
                   if issubclass(MODELS[f][1], ReservoirLM)]
    sizes = {"float32": list(dict.fromkeys([*plan.states_sizes, *model_sizes])),
             "bfloat16": list(plan.states_sizes) if plan.states_bf16 else []}
    states = {d: states_rows(plan, dev, d, sizes[d], say) for d in dtypes if sizes[d]}
    probes["after states"] = contention_probe()

    training = training_rows(plan, dev, states.get("float32", {}), say)
    window = window_step_rows(plan, dev, say)

    result = dict(machine(dev), dtype="float32", bf16=bf16_note, batch_size=plan.batch, context=plan.context,
                  epochs_per_shard=plan.epochs_per_shard, quick=bool(quick),
                  sections=list(SECTIONS if only is None else parse_sections(only)),
                  **headline(recurrence, states, training),
                  authors_quoted=dict(AUTHORS_QUOTED, conditions=AUTHORS_QUOTED_CONDITIONS), targets=TARGETS,
                  recurrence=recurrence, reservoir_states=states.get("float32", {}),
                  reservoir_states_bf16=states.get("bfloat16", {}), training=training, method=method(plan))
    if window:
        result["window_step"] = window
        result["window_step_vs_plain_fp32"] = {k: v["fused_fp32"]["vs_plain_fp32"] for k, v in window.items()
                                               if "fused_fp32" in v}
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
        clock="time.perf_counter around each repetition, reslm.core.device.synchronize before reading it",
        reservoir_gflops=("ESN.forward(u (B,T,d), s0), its default backend (recurrence[dtype][N]['backend']; "
                          "on a CPU 'sigmoid', tanh as 2 sigmoid(2z) - 1 in float32; loop_gflops: the plain loop "
                          "with torch.tanh, blocked_gflops: that loop in row blocks), B=batch_size streams and T steps "
                          f"(T = {plan.recurrence_work:g} flops / (2 B N^2) clamped to {plan.recurrence_steps}; "
                          "per N in recurrence[dtype][N]['steps']), counted as 2 B T N^2 flops; "
                          "timing reservoir (see reslm.bench.timing)"),
        gemm_gflops="T x torch.mm((B,N), (N,N), out=) in a loop, same shape, dtype and T, timed alternately "
                    "with the reservoir in each repetition; tanh_ms_per_step: torch.tanh((B,N), out=)",
        reservoir_chars_per_s=("model.features (shard_states + state normalisation: the per-shard work) over "
                               f"random tokens; stream: {plan.batch} streams, "
                               f"{plan.stream_warmup} warm-up tokens per stream, steps per stream in "
                               "reservoir_states[N]['stream'] (the warm-up is counted in the time); window: "
                               f"{plan.context} steps per sample from a zero state; chars/s = samples / best seconds; "
                               "_bf16: the same with bfloat16 states (not used for the training figures, which "
                               "use fp32 states); skipped where bf16 is slow (key bf16)"),
        training_step=("every training step is reslm.train.train_step, the step of `reslm train`, with the optimiser "
                       "make_optimizer builds from the family's training defaults (rc, aerc, tf: Adam) at lr "
                       f"{plan.lr:g}: forward, backward, the finite check, the optimiser step"),
        head_samples_per_s=(f"forward_features + the training step, batch {plan.batch}, fp32, "
                            "random (already normalised) states drawn by TensorFeatures.batch from a pool of up "
                            f"to 16 batches; {plan.head_steps} steps per repetition after 3 warm-up steps, timed "
                            "alternately with the authors' approach; the same in both context modes (both give "
                            "the head an (M, N) state tensor)"),
        amortised_samples_per_s=(f"1 / (1 / (reservoir chars/s x {plan.epochs_per_shard}) + 1 / head samples/s): "
                                 f"states computed once per shard and reused for {plan.epochs_per_shard} epochs "
                                 "(reservoir chars/s of the model's N and context mode, from reservoir_chars_per_s)"),
        authors_samples_per_s=("RC/AERC: reslm.bench.reference.authors_window_states (the authors' windowed "
                               f"recompute: {plan.context} plain steps of (B,N) x (N,N) from a zero state per batch) "
                               "+ authors_logits (AERC W_att materialised) + the training step; "
                               f"{plan.authors_steps} step(s) per repetition after 2 warm-up steps at batch 64. "
                               "Transformer: reslm.bench.reference.ReferenceTransformer (nn.TransformerEncoder)"),
        transformer_samples_per_s=(f"forward + the training step on random windows of {plan.context} "
                                   f"chars, batch {plan.batch}, train mode (dropout active); {plan.tf_steps} steps "
                                   f"per repetition after {plan.tf_warmup} warm-up step(s), ours and the "
                                   "reference alternately"),
        transformer_model_gflops=("samples/s x reslm.models.transformer.training_flops_per_sample (the matrix "
                                  "products of forward + backward, counted analytically); transformer_gemm_gflops: "
                                  f"{plan.tf_gemm[2]} x torch.mm(({plan.tf_gemm[0]}, {plan.tf_gemm[1]}), "
                                  f"({plan.tf_gemm[1]}, {plan.tf_gemm[1]})) fp32 timed in the same repetitions as "
                                  "the transformer; transformer_vs_gemm = their quotient"),
        window_step=(f"the transformer's window training step (train_step + Adam, batch {plan.batch}, random "
                     "windows, dropout on) with the fused C kernel (fused_fp32) and the plain torch path "
                     "(plain_fp32, and plain_bf16 under bf16 autocast where bf16 is fast here), "
                     f"{plan.tf_steps} steps per repetition, alternately with {plan.tf_gemm[2]} x torch.mm(("
                     f"{plan.tf_gemm[0]}, {plan.tf_gemm[1]}), ({plan.tf_gemm[1]}, {plan.tf_gemm[1]})) in fp32 and "
                     "bf16; vs_gemm = windows/s x training_flops_per_sample / the GEMM's flop rate of the same "
                     "dtype; vs_plain_fp32 = windows/s / the plain fp32 step's"),
        speedup_vs_authors="ours / the authors' approach measured in this run (per context mode for RC/AERC); "
                           "speedup_vs_authors_quoted divides by authors_quoted instead",
    )


def _window_step_lines(name: str, row: dict) -> list[str]:
    """format_summary's lines for one transformer of the window-step section: its steps, then its evaluation."""
    lines = []
    for key in ("fused_fp32", "plain_fp32", "plain_bf16"):
        if key in row:
            v = row[key]
            lines.append(f"window step {name} {key.replace('_', ' ')}: {v['windows_per_s']:,.0f} windows/s, "
                         f"{v['vs_gemm']:.3f} of the {key[-4:]} GEMM rate ({row['gemm_gflops'][key[-4:]]} GFLOP/s), "
                         f"x{v['vs_plain_fp32']:.2f} the plain fp32 step")
    if "fused_fp32" not in row:
        lines.append(f"window step {name}: fused {row['fused']}")
    if row.get("eval"):
        lines.append(f"evaluation {name} fp32: " + ", ".join(
            f"{k.split('_')[0]} in forwards of {v['windows_per_forward']} {v['windows_per_s']:,.0f} windows/s "
            f"(x{v['vs_plain']:.2f})" for k, v in row["eval"].items()))
    return lines


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
        elif speed is None:
            lines.append(f"train {name}: {v:,.0f} targets/s in window mode")
        else:
            lines.append(f"train {name}: {v:,.0f} samples/s, x{speed:.1f} vs authors' approach")
            if name in r.get("transformer_vs_gemm", {}):
                lines.append(f"train {name}: {r['transformer_model_gflops'][name]} model GFLOP/s (forward + backward) "
                             f"vs GEMM {r['transformer_gemm_gflops'][name]} GFLOP/s in the same repetitions "
                             f"-> {r['transformer_vs_gemm'][name]:.3f}")
            if name in r.get("causal_speedup_vs_authors", {}):
                lines.append(f"train {name} causal: {r['all_position_targets_per_s'][name]:,.0f} targets/s, "
                             f"x{r['causal_speedup_vs_authors'][name]:.1f} vs authors' window model")
            if name in r.get("training_samples_per_s_bf16", {}):
                lines.append(f"train {name} bf16 autocast: {r['training_samples_per_s_bf16'][name]:,.0f} samples/s, "
                             f"x{r['speedup_vs_authors_bf16'][name]:.1f} vs authors' approach (fp32)")
        if name in r.get("all_position_targets_per_s", {}) and name not in r.get("causal_speedup_vs_authors", {}):
            lines.append(f"train {name} stream: {r['all_position_targets_per_s'][name]:,.0f} targets/s")
    for name, row in r.get("window_step", {}).items():
        lines += _window_step_lines(name, row)
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
