"""Transformer training step (forward + backward + Adam, context 32, dropout on) under the variants of
issue 27, timed alternately in one process with a fp32 and a bf16 GEMM, best of the repetitions:

    plain        CharTransformer.forward_features, eager (the reference path)
    plain_bf16   the same under torch.autocast(bfloat16)
    comp_bmm     torch.compile(fused_forward, pointwise=False): hashed dropout, attention as matmuls
    comp_pw      torch.compile(fused_forward): hashed dropout, attention as broadcast multiply + sum
    comp_pw_bf16 comp_pw under bf16 autocast
    ref          reslm.bench.reference.ReferenceTransformer (torch's nn.TransformerEncoder: the authors' model)

    python benchmarks/tf_speed.py tf-64-4-4 plain,comp_pw,ref 5 [batch] [threads] [out.json]

Prints samples/s, model GFLOP/s (reslm.models.transformer.training_flops_per_sample) and its ratio
to the same run's GEMM (torch.mm (1024, 768) x (768, 768), fp32 and bf16); compile time (the first
two steps) apart. Writes the numbers as JSON when given a path.
"""
import json
import os
import sys
import time

import torch

from reslm.core.device import cpu_name, grad_scaler
from reslm.models import PRESETS, build_model
from fused import draw_seeds, fused_forward   # benchmarks/fused.py, beside this script
from reslm.bench.reference import ReferenceTransformer
from reslm.models.transformer import training_flops_per_sample
from reslm.train import make_optimizer, train_config, train_step


def make_step(kind: str, preset: str, batch: int):
    family, over, _ = PRESETS[preset]
    torch.manual_seed(0)
    model = (ReferenceTransformer(build_model(family, **over).config) if kind == "ref"
             else build_model(family, **over)).train()
    opt = make_optimizer(model, train_config("tf", lr=1e-4), torch.device("cpu"))
    scaler = grad_scaler("fp32", torch.device("cpu"))
    x, y = torch.randint(59, (batch, 32)), torch.randint(59, (batch,))
    bf16 = kind.endswith("_bf16")
    if kind.startswith("comp"):
        fwd = torch.compile(lambda *a: fused_forward(model, *a))
        pointwise = "_pw" in kind

        def forward(x, y):
            return fwd(x, y, draw_seeds(model), pointwise)
    else:
        forward = model

    def step():   # the training loop's own step (reslm.train.train_step)
        train_step(forward, [(x, y)], opt, scaler, lr=1e-4, precision="bf16" if bf16 else "fp32")
    return step, model


def gemm(dtype, n=768, b=1024, reps=8):
    g = torch.Generator().manual_seed(0)
    a, w = torch.randn(b, n, generator=g).to(dtype), torch.randn(n, n, generator=g).to(dtype)
    out = torch.empty(b, n, dtype=dtype)

    def run():
        for _ in range(reps):
            torch.mm(a, w, out=out)
    return run, 2.0 * b * n * n * reps


def main():
    preset, kinds = sys.argv[1], sys.argv[2].split(",")
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    batch = int(sys.argv[4]) if len(sys.argv) > 4 else 1024
    if len(sys.argv) > 5 and int(sys.argv[5]):
        torch.set_num_threads(int(sys.argv[5]))
    out_path = sys.argv[6] if len(sys.argv) > 6 else None
    steps, warm, model = {}, {}, None
    for k in kinds:
        t0 = time.perf_counter()
        steps[k], m = make_step(k, preset, batch)
        model = model or (m if k != "ref" else None)
        steps[k]()
        steps[k]()
        warm[k] = time.perf_counter() - t0
        print(f"{k}: first two steps (compile included) {warm[k]:.1f} s", flush=True)
    gemms = {"gemm_fp32": gemm(torch.float32), "gemm_bf16": gemm(torch.bfloat16)}
    times = {k: [] for k in [*kinds, *gemms]}
    for _ in range(reps):
        for k in kinds:
            t0 = time.perf_counter()
            steps[k]()
            times[k].append(time.perf_counter() - t0)
        for k, (run, _) in gemms.items():
            t0 = time.perf_counter()
            run()
            times[k].append(time.perf_counter() - t0)
    flops = training_flops_per_sample(build_model(PRESETS[preset][0], **PRESETS[preset][1]).config)
    gf = {k: flops_ / min(times[k]) / 1e9 for k, (_, flops_) in gemms.items()}
    res = dict(preset=preset, batch=batch, threads=torch.get_num_threads(), cpu=cpu_name(), torch=torch.__version__,
               load_before=os.getloadavg()[0], reps=reps, model_flops_per_sample=flops,
               gemm_gflops={k: round(v, 2) for k, v in gf.items()}, variants={})
    print(f"{preset} batch {batch}, {res['threads']} threads, load {res['load_before']:.1f}; "
          f"GEMM fp32 {gf['gemm_fp32']:.1f} GFLOP/s, bf16 {gf['gemm_bf16']:.1f} GFLOP/s")
    ref = batch / min(times["ref"]) if "ref" in times else None
    for k in kinds:
        sps = batch / min(times[k])
        mf = sps * flops / 1e9
        row = dict(samples_per_s=round(sps, 1), model_gflops=round(mf, 3), vs_gemm_fp32=round(mf / gf["gemm_fp32"], 4),
                   vs_gemm_bf16=round(mf / gf["gemm_bf16"], 4), first_two_steps_s=round(warm[k], 2),
                   best_ms=round(1e3 * min(times[k]), 1), median_ms=round(1e3 * sorted(times[k])[len(times[k]) // 2], 1),
                   vs_ref=round(sps / ref, 3) if ref else None)
        res["variants"][k] = row
        print(f"  {k:13s} {sps:8,.0f} samples/s  {mf:6.2f} GFLOP/s  {row['vs_gemm_fp32']:.3f} of fp32 GEMM  "
              f"x{row['vs_ref']} ref  (best {row['best_ms']} ms, median {row['median_ms']} ms)")
    if out_path:
        with open(out_path, "a") as f:
            f.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
