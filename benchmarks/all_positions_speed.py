"""Training targets per second of the trained character families in both context modes, beside the
authors' window transformer (torch's encoder), timed alternately in one process by `reslm bench`'s
own training rows (reslm.bench.training): the window step, the causal step at the same targets per
step (1,024 = 32 chunks of 32), and the rnn's window and stream steps.

    python benchmarks/all_positions_speed.py [OUT.json] [--models tf-128-8-8,tf-256-16-16,rnn-gru-32-200]

Prints one line per model and writes the rows (with the CPU, torch and thread count) to OUT.json
(e.g. results/bench/all-positions-speed-DATE.json, where the measured files are kept).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from dataclasses import replace

import torch

from reslm.bench.plan import BenchPlan
from reslm.bench.training import training_rows
from reslm.core.device import cpu_name
from reslm.models import PRESETS


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", help="JSON file for the rows")
    ap.add_argument("--models", default="tf-128-8-8,tf-256-16-16,rnn-gru-32-200")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    unknown = [m for m in args.models.split(",") if m not in PRESETS or PRESETS[m][0] not in ("tf", "rnn")]
    if unknown or args.threads < 1:
        print(f"all_positions_speed: --models takes tf and rnn presets (not {', '.join(unknown)}), --threads >= 1"
              if unknown else "all_positions_speed: --threads must be >= 1", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    plan = replace(BenchPlan.quick(), models=tuple(args.models.split(",")), reps=3, max_reps=5, budget_s=30.0)
    rows = training_rows(plan, torch.device("cpu"), {}, lambda msg: print(msg, file=sys.stderr, flush=True))
    result = dict(cpu=cpu_name(), torch=torch.__version__, python=platform.python_version(), threads=args.threads,
                  batch_targets=plan.batch, rows=rows)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    for name, r in rows.items():
        if "causal_targets_per_s" in r:
            print(f"{name}: window {r['samples_per_s']:,.0f}, causal {r['causal_targets_per_s']:,.0f} targets/s; "
                  f"authors' window model {r['authors_samples_per_s']:,.0f}: causal x{r['causal_speedup_vs_authors']}")
        elif "stream_targets_per_s" in r:
            print(f"{name}: window {r['samples_per_s']:,.0f}, stream {r['stream_targets_per_s']:,.0f} targets/s "
                  f"(x{r['stream_speedup_vs_window']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
