"""Print a markdown table of the test CE after each shard-epoch of several character runs, side by side.

    python scripts/compare_curves.py RUN [RUN...] [--every K]

Each RUN is a run folder or a published results/NAME; the columns are the runs, the rows the step of
each evaluation (runs whose steps differ are aligned by step; a cell is empty where a run did not
evaluate at that step). The last rows give each run's training seconds, targets per second and the
number of test positions its evaluations scored (the whole shard unless the run's config says fewer).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from reslm.core.metrics import TEST_LOSS


def read_rows(run: Path) -> list[dict]:
    rows = []
    with open(run / "metrics.jsonl", encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                r = json.loads(line)
                if r.get("kind") == "eval" and r.get("step", 0) > 0:
                    rows.append(r)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--every", type=int, default=1, help="show every K-th evaluation step (default 1)")
    args = ap.parse_args(argv)
    table, names, info = {}, [], []
    for run in args.runs:
        try:
            cfg = json.loads((run / "config.json").read_text(encoding="utf-8"))
            rows = read_rows(run)
            tc = cfg["train"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"compare_curves: {run} is not a readable run folder ({type(e).__name__}: {e})", file=sys.stderr)
            return 2
        names.append(run.name)
        for r in rows:
            table.setdefault(r["step"], {})[run.name] = r
        last = rows[-1] if rows else {}
        n = tc.get("eval_samples", 0)
        info.append((run.name, last.get("wall"), tc["batch_size"], last.get("samples_per_s"),
                     "whole shard" if not n else f"{n:,}" + (" (last: whole shard)" if tc.get("final_eval_samples") == 0 else "")))
    steps = sorted(table)
    print("| step | shard.epoch | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for i, step in enumerate(steps):
        if i % args.every and i != len(steps) - 1:
            continue
        cells = table[step]
        any_row = next(iter(cells.values()))
        where = f"{any_row.get('shard')}.{any_row.get('epoch')}" if len({(r.get('shard'), r.get('epoch')) for r in cells.values()}) == 1 else "-"
        print(f"| {step:,} | {where} | " + " | ".join(f"{cells[n][TEST_LOSS]:.4f}" if n in cells else "" for n in names) + " |")
    print()
    print("| run | train seconds | targets per step | targets/s (last segment) | test positions per evaluation |")
    print("|---|---|---|---|---|")
    for name, wall, batch, rate, pos in info:
        print(f"| {name} | {wall:,.0f} | {batch:,} | {rate:,.0f} | {pos} |" if wall else f"| {name} | - | {batch:,} | - | {pos} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
