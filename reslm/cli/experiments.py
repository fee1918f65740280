"""`reslm reproduce | lab | bench | sweep | demo`: their parsers and commands (many runs trained, or the
machine measured, into one folder)."""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import textwrap
from pathlib import Path

from reslm.bench import SECTIONS, format_summary, run_bench
from reslm.cli.flags import TRAINING_THREADS, data_root, int_for, int_range, shared
from reslm.experiments import ALL_FAMILIES, BUDGETS, LAB_BUDGETS, STATE_DTYPES, SUBSTRATES, SWEEPS, run_demo, run_lab
from reslm.experiments.demo import DEMO_FOLDER
from reslm.experiments.lab import lab_folder
from reslm.experiments.reproduce import reproduce, reproduce_folder
from reslm.experiments.sweep import SWEEP_DATA, sweep_folder, train_sweep
from reslm.paper import PROTOCOL_TEXT
from reslm.report import demo_text, write_lab, write_reproduction, write_scaling

REPRODUCE_DESCRIPTION = textwrap.dedent(f"""\
    Train the 15 Table-1 presets (rc, aerc, tf) and the LAERC / GPT size families, evaluate every run
    (test CE, closed-loop samples, 7/8-gram overlap, training and inference time with the reservoir's
    share apart), fit a character Kneser-Ney baseline, draw the paper's figures (PNG + CSV) and write
    OUT/report.md. Re-running skips finished runs and continues interrupted ones.
      smoke   every stage and figure from tiny training, a few minutes on 2 CPU cores
      quick   meaningful numbers in well under an hour on 2 CPU cores
      paper   the paper's protocol: window context, {PROTOCOL_TEXT}
              (hours on a CPU; the reservoir families fit 2 cores, the transformers want a GPU)""")
LAB_DESCRIPTION = textwrap.dedent(f"""\
    Train every reservoir substrate (esn, leaky, deep, parallel, nvar, diagonal, delay) as rc at the rc-2600 budget
    and as aerc at the aerc-160-30 budget (<= 155,459 trainable parameters), in stream context mode, with
    a `reslm reproduce` budget; score the esn runs under readout noise and b-bit ADCs; write OUT/report.md,
    substrates.csv|png, physical.csv|png and results.json. Re-running skips finished runs.
      smoke   tiny training: checks every stage (its numbers mean nothing)
      quick   ~0.4% of the paper's protocol per run (minutes per substrate on 2 CPU cores)
      paper   {PROTOCOL_TEXT} (hours per substrate on a CPU)""")
BENCH_DESCRIPTION = ("Benchmark the reservoir recurrence against plain GEMM at the same shape, "
                     "training samples/s of the three families in both context modes against "
                     "re-implementations of the authors' approach measured in the same run, LAERC/GPT "
                     "generation, and the stream states of every lab substrate. Progress lines go to "
                     "stderr; the summary (or --json) to stdout.")
SWEEP_DESCRIPTION = ("Train a family of LAERC and GPT sizes at one shared budget on a BPE dataset, "
                     "fit L_min = a log10 N + b per family, write scaling.csv, scaling_fit.json and scaling.png. "
                     "Re-running skips finished runs and resumes unfinished ones.")
DEMO_DESCRIPTION = ("Fetch the Shakespeare corpus if needed, train one model of each family "
                    "at a small budget, print a comparison table and a generated sample of each. "
                    "Resumable: re-running skips finished runs.")


def add_reproduce(sub) -> None:
    rp = sub.add_parser("reproduce", help="the paper's comparison in one command: train, evaluate, figures, report.md",
                        description=REPRODUCE_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    rp.add_argument("--budget", choices=list(BUDGETS), default="quick", help="how much to train (default quick)")
    rp.add_argument("--families", default=",".join(ALL_FAMILIES),
                    help=f"comma-separated subset of {','.join(ALL_FAMILIES)} (default: all)")
    rp.add_argument("--presets", help="comma-separated Table-1 presets to train (default: all of the chosen character "
                    "families; see `reslm presets`)")
    rp.add_argument("--out", help=f"output folder (default {reproduce_folder('BUDGET')})")
    rp.add_argument("--data", default="shakespeare", help="character dataset name or path (default shakespeare)")
    rp.add_argument("--token-data", help="BPE dataset for LAERC / GPT (default shakespeare-bpe4096; paper: shakespeare-gpt2)")
    rp.add_argument("--cycles", type=int_for("cycles"), help="passes over the five training shards (default 1; the paper does not "
                    "say how many it ran)")
    rp.add_argument("--context-mode", choices=["window", "stream"],
                    help="rc/aerc context mode (default: window for the paper budget, as in the paper; stream otherwise)")
    rp.add_argument("--state-dtype", choices=STATE_DTYPES,
                    help="how rc/aerc store their reservoir states: bfloat16 halves their memory and, where the CPU "
                    "computes bf16 natively (AMX, avx512_bf16), is also what the reservoir computes in, which is faster "
                    "there (docs/speed.md); auto: float32 where it fits in memory (default: "
                    "auto for the paper budget, float32 otherwise)")
    shared(rp, "--root", "--device", "--no-progress", "--threads", threads_help=TRAINING_THREADS)
    rp.set_defaults(func=cmd_reproduce)


def add_lab(sub) -> None:
    lb = sub.add_parser("lab", help="the reservoir lab: every substrate at the paper's largest reservoir budgets, "
                        "and what physical constraints cost",
                        description=LAB_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    lb.add_argument("--budget", choices=list(LAB_BUDGETS), default="quick", help="how much to train (default quick)")
    lb.add_argument("--substrates", default=",".join(SUBSTRATES),
                    help=f"comma-separated subset of {','.join(SUBSTRATES)} (default: all)")
    lb.add_argument("--families", default="rc,aerc", help="rc, aerc or both (default both)")
    lb.add_argument("--physical-substrate", default="esn", help="the substrate whose runs are scored under noise "
                    "and ADC bits (default esn)")
    lb.add_argument("--score", type=int_range(0, 2**63 - 1), help="test positions scored by the physical grids (default: the budget's; 0: all)")
    lb.add_argument("--data", default="shakespeare", help="character dataset name or path (default shakespeare)")
    lb.add_argument("--out", help=f"output folder (default {lab_folder('BUDGET')})")
    shared(lb, "--root", "--device", "--no-progress", "--threads", threads_help=TRAINING_THREADS)
    lb.set_defaults(func=cmd_lab)


def add_bench(sub) -> None:
    b = sub.add_parser("bench", help="measure reservoir and training throughput on this machine",
                       description=BENCH_DESCRIPTION)
    b.add_argument("--json", action="store_true", help="print one JSON object (progress still goes to stderr)")
    b.add_argument("--quick", action="store_true", help="fewer repetitions and smaller substrate streams (a rough "
                   "figure in a few minutes)")
    b.add_argument("--only", metavar="SECTIONS", help="comma-separated subset of " + ",".join(SECTIONS)
                   + " (default: all; training also times its models' reservoir states)")
    shared(b, "--no-progress", "--threads", threads_help="torch CPU threads to measure with, at most this machine's "
           "cores (default: torch's default, as the recorded bench results)")
    b.set_defaults(func=cmd_bench)


def add_sweep(sub) -> None:
    sw = sub.add_parser("sweep", help="scaling sweep of LAERC vs GPT sizes with L_min = a log10 N + b fits",
                        description=SWEEP_DESCRIPTION)
    sw.add_argument("--sweep", default="cpu", choices=list(SWEEPS),
                    help="cpu: bpe:4096-sized for 2 CPU cores, minutes; cpu-scaling: 5 sizes per family over 1.6 "
                    "decades, ~1 epoch per run, plus ablations (about 1.5 h of one core); cpu-scaling-4ep: the same over "
                    "~4 epochs per run, runs named *-4ep (about 6 h of one core); paper: Appendix A.3 budget (GPU)")
    sw.add_argument("--publish", metavar="DIR", help="evaluate each run on the whole val split once it is trained "
                    "and publish it into DIR/<run name> (e.g. results)")
    sw.add_argument("--no-extras", action="store_true", help="skip the sweep's extra runs (ablations)")
    sw.add_argument("--families", default="laerc,gpt", help="comma-separated (default laerc,gpt)")
    sw.add_argument("--data", help=f"BPE dataset name or path (default {SWEEP_DATA})")
    sw.add_argument("--out", help=f"sweep folder (default {sweep_folder('<sweep>')})")
    sw.add_argument("--max-steps", type=int_for("max_steps"), help="override the sweep's steps per run")
    sw.add_argument("--precision", help="auto | fp32 | bf16 | fp16")
    sw.add_argument("--threads", type=int_for("threads"), help=TRAINING_THREADS)
    shared(sw, "--root", "--device", "--no-progress")
    sw.set_defaults(func=cmd_sweep)


def add_demo(sub) -> None:
    dm = sub.add_parser("demo", help="the embedded default job: data, three families, table, samples",
                        description=DEMO_DESCRIPTION)
    dm.add_argument("--out", default=str(DEMO_FOLDER), help=f"folder for the three runs (default {DEMO_FOLDER})")
    shared(dm, "--root", "--no-progress", "--threads", threads_help=TRAINING_THREADS)
    dm.set_defaults(func=cmd_demo)


def cmd_reproduce(args):
    out = Path(args.out) if args.out else reproduce_folder(args.budget)
    reproduce(args.budget, args.families, out, data=args.data, token_data=args.token_data,
              data_root=data_root(args), device=args.device, progress=not args.no_progress, cycles=args.cycles,
              context_mode=args.context_mode, presets=args.presets, state_dtype=args.state_dtype,
              command=shlex.join(["reslm", *sys.argv[1:]]) if sys.argv[1:2] == ["reproduce"] else "")
    print(write_reproduction(out))


def cmd_lab(args):
    out = Path(args.out) if args.out else lab_folder(args.budget)
    run_lab(out, data=args.data, budget=args.budget, substrates=args.substrates, families=args.families,
            physical_substrate=args.physical_substrate, data_root=data_root(args),
            device=args.device, progress=not args.no_progress, score=args.score)
    print(write_lab(out))


def cmd_bench(args):
    result = run_bench(quick=args.quick, progress=not args.no_progress, only=args.only)
    print(json.dumps(result, indent=2) if args.json else format_summary(result))


def cmd_sweep(args):
    out = Path(args.out) if args.out else sweep_folder(args.sweep)
    over = {k: v for k, v in dict(max_steps=args.max_steps, device=args.device, precision=args.precision,
                                  threads=args.threads).items() if v is not None}
    rows = train_sweep(out, args.data, args.sweep, args.families.split(","), over, data_root=data_root(args),
                       publish=Path(args.publish) if args.publish else None, progress=not args.no_progress,
                       extras=not args.no_extras)
    result = write_scaling(out, rows)
    if result["note"]:
        print(f"reslm: {result['note']}", file=sys.stderr)
    print(json.dumps(result["fits"], indent=2))


def cmd_demo(args):
    print(demo_text(run_demo(Path(args.out), data_root=data_root(args), progress=not args.no_progress)))
