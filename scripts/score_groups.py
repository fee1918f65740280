"""Cross-entropy of trained reservoir runs on each file group of a stretch of their dataset.

    python scripts/score_groups.py START END RUN [RUN ...] [--json OUT.json]

START and END are token offsets of the dataset (file groups are read from its meta.json). Every
token of [START, END) is predicted once, from a reservoir run from the zero state over the stretch
and the context (32) tokens before it, as a run's validation and test evaluations do; each
prediction is credited to the group of the token it predicts. So the "all" row is what the run
logs as its validation (or test) CE when the stretch is that split, and the rows say which groups
make it. For the Shakespeare groups split at 0.05 the stretch is
7680547 8017937 (the Sonnets and The Taming of the Shrew); the test shard is 8017937 9543024.
(A stream-context run scores a split that spans training shards shard by shard, each from the
zero state; this script runs one stream over the stretch, so there its figure differs slightly.)
A run trained with measurement noise on its states is scored here with another draw of that noise.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from reslm.core.errors import ReslmError
from reslm.core.files import write_json
from reslm.data.datasets import open_dataset
from reslm.data.splits import file_groups
from reslm.models.load import load_run


@torch.no_grad()
def position_losses(model, tokens: torch.Tensor, start: int, dtype: torch.dtype) -> torch.Tensor:
    """CE (nats) of each prediction of a token stream: of tokens[context:], from the states of a
    reservoir started at tokens[0], which sits at offset `start` of the dataset."""
    feats = model.features(tokens, position=start, dtype=dtype)
    out = []
    for i0 in range(0, len(feats), 8192):
        index = torch.arange(i0, min(len(feats), i0 + 8192))
        logits, _ = model.forward_features(feats.batch(index), None)
        out.append(F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), feats.targets[index].reshape(-1),
                                   reduction="none"))
    return torch.cat(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("start", type=int)
    ap.add_argument("end", type=int)
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--json", type=Path, help="also write the table here")
    args = ap.parse_args()
    try:
        return score(args)
    except ReslmError as e:
        print(f"score_groups: {e}", file=sys.stderr)
        return 2


def score(args) -> int:
    torch.set_num_threads(1)
    table = {}
    for run in args.runs:
        model, _, cfg = load_run(run)
        ds = open_dataset(cfg["data"])
        ctx = model.config.context
        if not ctx <= args.start < args.end <= ds.n_chars:
            print(f"score_groups: [{args.start}, {args.end}) must lie in [{ctx}, {ds.n_chars}] (the context "
                  f"before START is read too)", file=sys.stderr)
            return 2
        dtype = torch.bfloat16 if cfg.get("train", {}).get("state_dtype") == "bfloat16" else torch.float32
        tokens = torch.as_tensor(ds.tokens[args.start - ctx:args.end].astype("int64"))
        losses = position_losses(model, tokens, args.start - ctx, dtype)   # losses[i] predicts token start + i
        row = {"all": (losses.mean().item(), len(losses))}
        for group, a, b in file_groups(ds.meta, within=(args.start, args.end)):
            row[group] = (losses[a - args.start:b - args.start].mean().item(), b - a)
        table[run.name] = row
        print(run.name)
        for group, (ce, n) in row.items():
            print(f"  {group:28s} {ce:.4f}  ({n:,} positions)")
    if args.json:
        write_json(args.json, {"start": args.start, "end": args.end, "runs": table})   # whole or not at all
    return 0


if __name__ == "__main__":
    sys.exit(main())
