"""Benchmarks (`reslm bench`), reservoir and training throughput on this machine against the authors' approach.

Everything is measured in one run, on the device `pick_device("auto")` picks (CUDA when present),
with fp32 weights and states unless a figure says otherwise, through `reslm.bench.timing` (warm-up,
repetitions, best repetition). Measured figures are in the README, with the command.

What is measured (keys of the returned dict; `_bf16` keys hold the bfloat16 runs, which are skipped,
with a note under `bf16`, where bf16 is slow: see `reslm.core.device.bf16_fast`):

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
   32-char window in every batch, then the paper's readout
   (`reslm.bench.reference`: `authors_window_states`, `authors_logits`); the transformer is
   `ReferenceTransformer` (torch's nn.TransformerEncoder). These are re-implementations written for timing, not the authors' code;
   `authors_quoted` holds the figures the issue quotes for their code, for comparison across machines.
5. Token level (`token_level`, `reslm.bench.tokens`): LAERC vs GPT training tokens/s and generation
   time per token.

Context: device, threads, torch version, batch size, `method` (how each figure was measured), the
load average and `contention`: `timing.contention_probe` run between the sections. When other
processes hold the cores, small-op figures (heads, AERC, small reservoirs, tanh, the transformer)
drop many times; the report then carries a warning. `meets_target` compares with `TARGETS`.

The package: plan.py (BenchPlan, what to measure), kernels.py (sections 1, 2 and the substrates),
training.py (3, 4: every training step is `reslm.train.train_step`, the loop's own step),
tokens.py (5), run.py (`run_bench`, the report), timing.py (the clock) and reference.py (the authors'
models, re-implemented for timing).
Nothing in the library's core imports this package.
"""
from reslm.bench.plan import SECTIONS, TARGETS, BenchPlan, parse_sections
from reslm.bench.run import format_summary, run_bench

__all__ = ["SECTIONS", "TARGETS", "BenchPlan", "parse_sections", "format_summary", "run_bench"]
