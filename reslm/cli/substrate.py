"""`reslm substrate export | simulate | import`: its parsers and commands (a physical reservoir's files,
reslm/recording.py)."""
from __future__ import annotations

import argparse
import textwrap
from dataclasses import fields
from pathlib import Path

from reslm.cli.flags import INT64, SEED, add_flags, data_root, given, int_range, shared
from reslm.data.datasets import find_dataset
from reslm.models.reservoir_lm import ReservoirLMConfig
from reslm.recording import DRIVE_FILE, export_drive, import_states, simulate
from reslm.reservoir import KNOBS

DESCRIPTION = textwrap.dedent("""\
    Use a physical (or any external) reservoir: export the input vectors of a dataset's character
    stream for the device to play, let it record one state row per input row, import that file, then
    `reslm train --family rc|aerc --reservoir recorded --reservoir-options path=SUBSTRATE`.
      export    DRIVE/: drive.npy float32 (S, d), embedding.npy, tokens.npy, manifest.json (protocol)
      simulate  play DRIVE/ through an in-process substrate (+ noise): a stand-in device and a reference
      import    check STATES (.npy / .safetensors, (S, N)) against DRIVE/ and write SUBSTRATE/
    The device starts every shard from rest and runs through it; row t = its state after drive[t].
    The in-process equivalent is --context-mode stream --streams 1 (see reslm/recording.py).""")
EXPORT_DESCRIPTION = ("Write OUT/drive.npy (float32 (S, d): the fixed random embedding of every "
                      "character of the dataset, in stream order), embedding.npy (V, d), tokens.npy (int32 ids) "
                      "and manifest.json (dataset fingerprint, shard boundaries, tokens sha256, the protocol "
                      "the device must follow). OUT must not exist.")
SIMULATE_DESCRIPTION = ("Play DRIVE/ through the in-process substrate that `reslm train --reservoir "
                        "NAME` would build with these settings, following the device protocol, and write its "
                        "states (S, N) float32 to OUT (.npy), optionally with Gaussian measurement noise. "
                        "With noise 0 the imported result trains exactly like --context-mode stream --streams 1.")
IMPORT_DESCRIPTION = ("Check STATES (.npy or .safetensors, memory-mapped: shape (S, N) with S the "
                      "drive's rows, a float dtype, every value finite, the drive's tokens against their "
                      "sha256) and write OUT/manifest.json (pointing at STATES where it is: keep it there) "
                      "and OUT/tokens.npy. Train on it with --reservoir recorded --reservoir-options path=OUT.")


def add_parser(sub) -> None:
    sp = sub.add_parser("substrate", help="a physical reservoir: export its drive, simulate one, import its states",
                        formatter_class=argparse.RawDescriptionHelpFormatter, description=DESCRIPTION)
    acts = sp.add_subparsers(dest="action", required=True, metavar="ACTION")
    for add in (_add_export, _add_simulate, _add_import):
        add(acts)


def _add_export(acts) -> None:
    ex = acts.add_parser("export", help="write the drive signal of a dataset for a device to play",
                         description=EXPORT_DESCRIPTION)
    ex.add_argument("--data", default="shakespeare", help="character dataset name under --root, or a path "
                    "(default shakespeare)")
    ex.add_argument("--embed-dim", type=int_range(*INT64), default=16, help="d, the input size (default 16, the paper's)")
    ex.add_argument("--seed", type=int_range(*SEED), default=0, help="embedding seed; train with the same --seed (default 0)")
    ex.add_argument("--out", required=True, help="the drive folder to write")
    shared(ex, "--root", "--no-progress", "--threads")
    ex.set_defaults(func=cmd_export)


def _add_simulate(acts) -> None:
    si = acts.add_parser("simulate", help="play a drive through an in-process substrate (a simulated device)",
                         description=SIMULATE_DESCRIPTION)
    si.add_argument("drive", help="a folder written by `reslm substrate export`")
    si.add_argument("--reservoir", default="esn", help="substrate name (default esn; see reslm.reservoir)")
    si.add_argument("--size", type=int_range(*INT64), default=750, help="N, state size (default 750)")
    si.add_argument("--seed", type=int_range(*SEED), help="reservoir seed (default: the drive's embedding seed)")
    si.add_argument("--noise", type=float, default=0.0, help="std of Gaussian noise added to every state value "
                    "(default 0)")
    si.add_argument("--noise-seed", type=int_range(*SEED), default=0, help="seed of the noise (default 0)")
    si.add_argument("--out", required=True, help="the states file to write (.npy)")
    knobs = {*KNOBS, "reservoir_options"} - {"size", "seed"}
    res_fields = add_flags(si.add_argument_group("reservoir options (as in `reslm train`)"), ReservoirLMConfig, {},
                           skip=[f.name for f in fields(ReservoirLMConfig) if f.name not in knobs])
    shared(si, "--no-progress", "--threads")
    si.set_defaults(_reservoir_fields=res_fields, func=cmd_simulate)


def _add_import(acts) -> None:
    im = acts.add_parser("import", help="check a device's states against its drive and make a substrate",
                         description=IMPORT_DESCRIPTION)
    im.add_argument("states", help="the device's states file, (S, N), .npy or .safetensors")
    im.add_argument("--drive", required=True, help="the drive folder the device played")
    im.add_argument("--out", required=True, help="the substrate folder to write")
    im.add_argument("--tokens-sha256", help="the tokens sha256 the device reports it played (checked)")
    shared(im, "--no-progress", "--threads")
    im.set_defaults(func=cmd_import)


def cmd_export(args):
    ds = find_dataset(args.data, "chars", data_root(args))
    out = export_drive(ds, Path(args.out), embed_dim=args.embed_dim, seed=args.seed, progress=not args.no_progress)
    print(f"{out}: drive of {len(ds):,} tokens x {args.embed_dim} inputs ({DRIVE_FILE}, manifest.json)")


def cmd_simulate(args):
    out = simulate(Path(args.drive), Path(args.out), reservoir=args.reservoir, size=args.size, seed=args.seed,
                   noise=args.noise, noise_seed=args.noise_seed, progress=not args.no_progress,
                   **given(args, args._reservoir_fields))
    print(f"{out}: states of {args.reservoir} (size {args.size}, noise {args.noise:g})")


def cmd_import(args):
    m = import_states(Path(args.states), Path(args.drive), Path(args.out), tokens_sha=args.tokens_sha256,
                      progress=not args.no_progress)
    T, N = m["states"]["shape"]
    print(f"{args.out}: {T:,} x {N} {m['states']['dtype']} states tied to {m['dataset']['name']} "
          f"(train with --reservoir recorded --reservoir-options path={Path(args.out).resolve()})")
