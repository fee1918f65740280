"""Windows per second of a transformer's evaluation (each window's last position scored, as the test
CE does) at several windows per forward, on CPU: what `CharTransformer.cpu_eval_batch` is chosen by.

    python benchmarks/eval_batch.py [OUT.json] [--models tf-256-16-16,tf-128-8-8,tf-e64-144-4-4] [--threads 1]

Each size is timed `--reps` times, interleaved with the others, on the same 2,048 random windows; the
best rate of each is kept. Prints one line per model and context mode and writes the rows (with the
CPU, torch and thread count) to OUT.json.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import torch

from reslm.core.device import cpu_name
from reslm.core.files import write_json
from reslm.features import estimate_loss, feature_batches
from reslm.models import PRESETS, build_model, preset
from reslm.models.base import WindowFeatures

SIZES = (1024, 256, 128, 64, 32, 16)


def rate(model, feats, batch: int) -> float:
    t = time.perf_counter()
    _, n = estimate_loss(model, feature_batches(feats, batch))
    return n / (time.perf_counter() - t)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", help="JSON file for the rows")
    ap.add_argument("--models", default="tf-256-16-16,tf-128-8-8,tf-e64-144-4-4")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    models = args.models.split(",")
    unknown = [m for m in models if m not in PRESETS or PRESETS[m][0] != "tf"]
    if unknown or args.threads < 1 or args.reps < 1:
        print(f"eval_batch: --models takes tf presets (not {', '.join(unknown)})" if unknown
              else "eval_batch: --threads and --reps must be >= 1", file=sys.stderr)
        return 2
    if args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        print(f"eval_batch: no folder for {args.out}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    feats = WindowFeatures(torch.randint(59, (2048 + 32,), generator=torch.Generator().manual_seed(0)), 32)
    rows = []
    for name in models:
        for mode in ("window", "causal"):
            family, shape = preset(name)
            model = build_model(family, **shape, context_mode=mode)
            best = {b: 0.0 for b in SIZES}
            for _ in range(args.reps):
                for b in SIZES:
                    best[b] = max(best[b], rate(model, feats, b))
            rows.append(dict(model=name, context_mode=mode, windows_per_s={str(b): round(r) for b, r in best.items()}))
            print(f"{name} {mode}: " + ", ".join(f"{b}: {r:,.0f}/s" for b, r in best.items()), flush=True)
    result = dict(cpu=cpu_name(), torch=torch.__version__, python=platform.python_version(), threads=args.threads,
                  rows=rows)
    if args.out:
        write_json(Path(args.out), result)   # whole, then renamed: never half a file
    return 0


if __name__ == "__main__":
    sys.exit(main())
