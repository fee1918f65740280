"""Tokens per second of stream states read through a fixed random projection (`--readout-dim`), on
CPU: the model's read (one 2-D GEMM over contiguous rows) against a matmul on the strided (B, k, N)
view the stream path hands over, and against no projection.

    python benchmarks/projection_read.py [OUT.json] [--size 1500] [--readout-dim 750] [--tokens 8192] [--threads 1]

Each variant runs the same random tokens through the same reservoir (rc, the authors' scaling) in
bfloat16 where the CPU has fast bf16 (reslm.core.device.bf16_fast) and in float32; the best of `--reps`
runs is kept. Prints one line per variant and writes the rows (with the CPU, torch and thread count)
to OUT.json.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import torch

from reslm.core.device import bf16_fast, cpu_name
from reslm.core.files import write_json
from reslm.models.rc import RC, RCConfig
from reslm.reservoir import shard_states


def rate(model, tokens, dtype, readout) -> float:
    c = model.config
    t = time.perf_counter()
    shard_states(model.reservoir, model.embed, tokens, mode="stream", context=c.context, streams=c.streams,
                 warmup=c.warmup, dtype=dtype, compute_dtype=dtype, readout=readout)
    return len(tokens) / (time.perf_counter() - t)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", help="JSON file for the rows")
    ap.add_argument("--size", type=int, default=1500)
    ap.add_argument("--readout-dim", type=int, default=750)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    if min(args.size, args.readout_dim, args.tokens, args.threads, args.reps) < 1:
        print("projection_read: --size, --readout-dim, --tokens, --threads and --reps must be >= 1", file=sys.stderr)
        return 2
    if args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        print(f"projection_read: no folder for {args.out}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    model = RC(RCConfig(size=args.size, readout_dim=args.readout_dim, spectral_radius=1.1111, input_scaling=1.1111,
                        reservoir_options="input_init=normal"))
    tokens = torch.randint(59, (args.tokens + 32,), generator=torch.Generator().manual_seed(0))
    dtypes = [torch.bfloat16, torch.float32] if bf16_fast(torch.device("cpu")) else [torch.float32]
    rows = []
    for dtype in dtypes:
        variants = {"projection, 2-D GEMM (model.read)": model.read,
                    "projection, matmul on the strided view": lambda s: s @ model.projection.to(s.dtype),
                    "no projection (N units stored)": None}
        best = dict.fromkeys(variants, 0.0)
        for _ in range(args.reps):
            for name, read in variants.items():
                best[name] = max(best[name], rate(model, tokens, dtype, read))
        for name, r in best.items():
            rows.append(dict(dtype=str(dtype).removeprefix("torch."), variant=name, tokens_per_s=round(r)))
            print(f"{rows[-1]['dtype']} {name}: {r:,.0f} tokens/s", flush=True)
    result = dict(cpu=cpu_name(), torch=torch.__version__, python=platform.python_version(), threads=args.threads,
                  size=args.size, readout_dim=args.readout_dim, tokens=args.tokens, rows=rows)
    if args.out:
        write_json(Path(args.out), result)   # whole, then renamed: never half a file
    return 0


if __name__ == "__main__":
    sys.exit(main())
