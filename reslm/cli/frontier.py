"""`reslm frontier`: its parser and its commands (list, run, status, report, bench, capacity)."""
from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

from reslm.cli.flags import data_root, int_range, shared
from reslm.core.device import pick_device, usable_cores
from reslm.core.errors import ReslmError
from reslm.core.files import write_json
from reslm.frontier import bench as fbench
from reslm.frontier.capacity import plan_capacities
from reslm.frontier import bundled_plans, load_plan, plan_table, status_lines, write_plans_page
from reslm.frontier.schedule import command_lines, run_plans
from reslm.scoring.memory import POSITIONS
RUN_DESCRIPTION = ("Train the plans' runs that are not done (plan by plan in the order given, each its screen "
                   "first, then its finalists' other seeds), resuming interrupted ones and skipping those another "
                   "process holds; publish each into --results as it finishes. Then each plan's chosen configuration "
                   "is scored on the paper's 32-character windows where it trained with its state carried (`reslm "
                   "eval RUN --context-mode window --score 0 --write`), so that both metrics are on record. Re-run to "
                   "continue: with --jobs and --minutes, one call keeps the cores busy until a deadline.")
REPORT_DESCRIPTION = ("Write docs/frontier-plans.md under --repo from its results/: one section per "
                      "plan (every plan reslm ships, or the ones given), each configuration's mean ± sd over its "
                      "seeds, the rule's verdict and the ledger's account of when each candidate joined.")


def _paths(args) -> tuple[Path, Path]:
    for flag, value in (("--results", args.results), ("--runs", args.runs)):
        if not str(value).strip():
            raise ReslmError(f"{flag} must not be empty")
    return Path(args.results), Path(args.runs)


def cmd_list(args):
    for path in bundled_plans():
        plan = load_plan(path)
        about = " ".join(plan.about.split())
        n = len(plan.candidates)
        print(f"{plan.name:<28} {n:>2} candidate{'s' if n != 1 else ''}, seeds {list(plan.rule.seeds)}: "
              f"{about[:90]}{'...' if len(about) > 90 else ''}")


def _plans(names: list[str]) -> list:
    """The plans named, in order, each once."""
    return list({plan.name: plan for plan in map(load_plan, names)}.values())


def cmd_run(args):
    plans = _plans(args.plans)
    results, runs = _paths(args)
    if args.commands:   # every line built (and checked) before the first is printed
        lines, waiting = command_lines(plans, results, runs, args.threads, data_root(args), args.device)
        for line in lines:
            print(line)
        print(f"# {len(lines)} commands to run now" + (f"; {waiting} runs wait on the screen (print again when it is "
                                                       "done)" if waiting else ""), file=sys.stderr)
        return
    say = (lambda msg: print(f"reslm frontier: {msg}", file=sys.stderr, flush=True))
    if args.device:
        pick_device(args.device)   # an unknown device, or CUDA where there is none: refused before any run starts
    tables = run_plans(plans, results, runs, jobs=args.jobs, threads=args.threads, device=args.device,
                       minutes=args.minutes, only=tuple(args.only or ()), data_root=data_root(args),
                       progress=not args.no_progress, say=say)
    print("\n\n".join("\n".join(status_lines(plan, tables[plan.name])) for plan in plans))


def cmd_status(args):
    plans = _plans(args.plans)
    results, runs = _paths(args)
    if not results.is_dir():
        raise ReslmError(f"--results {results}: no such folder")
    tables = [(plan, plan_table(plan, results, runs)) for plan in plans]
    if args.json:
        print(json.dumps([dict(plan=plan.name, run=e.name, label=e.label, seed=e.seed, state=e.state,
                               folder=str(e.folder), val=e.val, test=e.test, test_window=e.test_window,
                               test_stream=e.test_stream, progress=e.progress) for plan, table in tables for e in table],
                         indent=2))
        return
    print("\n\n".join("\n".join(status_lines(plan, table)) for plan, table in tables))


def cmd_report(args):
    plans = [load_plan(p) for p in args.plans] if args.plans else None
    changed = write_plans_page(Path(args.repo), plans)
    print(f"updated: {', '.join(changed)}" if changed else "up to date")


def cmd_bench(args):
    result = fbench.bench(args.reservoir, budget=args.budget, seeds=tuple(args.seeds), imports=args.imports,
                          reservoir_options=args.reservoir_options, settings=args.set, size=args.size,
                          out=Path(args.out),
                          results=Path(args.results), jobs=args.jobs, threads=args.threads,
                          data_root=data_root(args), progress=not args.no_progress,
                          memory_positions=args.memory_positions)
    print(result["table"])
    print(f"(model card: {result['card']})", file=sys.stderr)


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"{text!r}: give distinct non-negative integers, e.g. 0,1,2")
    return seeds


def _minutes(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: give a positive number of minutes, e.g. 9")
    return value


def _where(p, runs_default: str = "runs"):
    p.add_argument("--results", default="results", help="the results registry: where finished runs are looked up "
                   "and published, and the plan's ledger is kept (default results)")
    p.add_argument("--runs", default=runs_default, help=f"where runs train before they are published (default "
                   f"{runs_default})")


DESCRIPTION = textwrap.dedent("""\
    A frontier plan (a TOML file, or the name of one reslm ships: `reslm frontier list`) is a base
    configuration, candidate changes to it, seeds, and the rule that chooses on the validation split:
    every candidate at the screen seed, the lowest below the base on validation on to every seed, the
    lowest mean validation CE chosen; test CE is read only to report. Runs are found in results/ by
    configuration and seed, so a finished one is never trained twice, and each is published there
    as it finishes.""")
BENCH_DESCRIPTION = textwrap.dedent(f"""\
    How good a language model is your reservoir at the paper's budget? Runs the frontier's chosen recipe
    ({fbench.RECIPE_PLAN} plan) with --reservoir in place of the ESN at each seed, checks the strict rules
    first, and prints its mean ± sd test CE beside the published ESN frontier and the trained GRU ceiling,
    with bits/char and wall time; a model card (card.md) goes into --out. --budget quick: {fbench.QUICK_TEXT};
    full: the recipe as published (about 25 min of one thread per seed).""")


def add_parser(sub) -> None:
    fr = sub.add_parser("frontier", help="frontier plans: run, follow and report them; benchmark your own reservoir",
                        formatter_class=argparse.RawDescriptionHelpFormatter, description=DESCRIPTION)
    acts = fr.add_subparsers(dest="action", required=True, metavar="ACTION")
    ls = acts.add_parser("list", help="the plans reslm ships")
    ls.set_defaults(func=cmd_list)
    _add_run(acts)
    _add_status(acts)
    _add_report(acts)
    _add_bench(acts)
    _add_capacity(acts)


def _add_capacity(acts) -> None:
    cp = acts.add_parser("capacity", help="the cheap screen: Jaeger's memory capacity of each configuration's "
                         "reservoir, untrained", description=(
                             "Jaeger's linear memory capacity of the fixed reservoir each configuration of a plan "
                             "builds at --seed, untrained (no data, no training): an i.i.d. signal along a random "
                             "input direction, linear readouts per delay k = 1..--max-delay; one line per "
                             "configuration with the capacity (sum of r^2) and the last delays read with r^2 >= 0.5 "
                             "and >= 0.1. A minute or two of one thread per 2,250-unit reservoir."))
    cp.add_argument("plan", help="a plan file (.toml) or the name of a plan reslm ships")
    cp.add_argument("--only", action="append", default=[], metavar="LABEL",
                    help="this configuration only (repeatable; the base is `base` where it has no label)")
    cp.add_argument("--seed", type=int_range(0, 2**31 - 1), default=0, help="the reservoirs' seed (default 0)")
    cp.add_argument("--max-delay", type=int_range(1, 100_000), default=400, help="delays read (default 400)")
    cp.add_argument("--channels", type=int_range(1, 4096), default=1,
                    help="independent signals at once, the same total input power (default 1; 16: a character's width)")
    cp.add_argument("--fit", type=int_range(100, 10**8), default=None,
                    help="driven steps the readouts are fitted on (default: the capacity module's)")
    cp.add_argument("--threads", type=int_range(1, 4096), default=1, help="torch CPU threads (default 1)")
    cp.add_argument("--out", type=Path, help="write every delay's r^2 per configuration to this JSON file")
    cp.set_defaults(func=cmd_capacity)


def cmd_capacity(args):
    import platform

    import torch

    torch.set_num_threads(min(args.threads, usable_cores()))
    plan = load_plan(args.plan)
    rows = plan_capacities(plan, only=args.only, seed=args.seed, max_delay=args.max_delay, channels=args.channels,
                           fit=args.fit, say=lambda line: print(line, flush=True))
    if args.out:
        write_json(args.out, dict(plan=plan.name, seed=args.seed, threads=torch.get_num_threads(),
                                  cpu=platform.processor() or platform.machine(), torch=torch.__version__, rows=rows))


def _add_run(acts) -> None:
    run = acts.add_parser("run", help="train every run the plans' rules need now, publishing each as it finishes",
                          description=RUN_DESCRIPTION)
    run.add_argument("plans", nargs="+", metavar="plan", help="plan files (.toml) or names of plans reslm ships, "
                     "in the order their runs go (a configuration two plans share trains once)")
    run.add_argument("--jobs", type=int_range(1, max(1, usable_cores())), default=1,
                     help="runs at once (default 1); more than one: each in its own process, and the plans' runs "
                     "that other processes on this machine train count among them; a run that runs out of memory "
                     "beside others goes again alone, with all their threads; once nothing is left to start, "
                     "the jobs going share the call's cores (--jobs x --threads): a training with fewer threads "
                     "than its share goes again with it")
    run.add_argument("--only", action="append", metavar="NAME", help="only this run (repeatable; names from "
                     "`reslm frontier status`); a candidate's seed that waits on the screen trains ahead of it "
                     "when named, and the rule still chooses at the screen seed")
    run.add_argument("--commands", action="store_true", help="train nothing: print one self-contained command per "
                     "run to run now, for a cluster's scheduler (SLURM job array, GNU parallel) on machines that "
                     "share --results and --runs; the run lock keeps two claimants of one run apart")
    run.add_argument("--minutes", type=_minutes, metavar="M", help="a time budget for this call: within a plan the "
                     "runs go shortest-left first, none starts with under a minute left, each is stopped at the "
                     "deadline and published unfinished, and a later call continues them (a session, a lent GPU's "
                     "time, a cluster slot)")
    run.add_argument("--device", help="where the runs train: auto, cpu, cuda or cuda:N (default: each run's own, "
                     "auto for a new one); where a run runs, never part of what it is")
    _where(run)
    shared(run, "--root", "--no-progress", "--threads",
           threads_help=f"torch CPU threads of each run, at most {usable_cores()} (default: each run's torch default)")
    run.set_defaults(func=cmd_run)


def _add_status(acts) -> None:
    st = acts.add_parser("status", help="what is done, running and left in plans, with time estimates")
    st.add_argument("plans", nargs="+", metavar="plan", help="plan files (.toml) or names of plans reslm ships")
    st.add_argument("--json", action="store_true", help="one JSON object per run")
    _where(st)
    st.set_defaults(func=cmd_status)


def _add_report(acts) -> None:
    rp = acts.add_parser("report", help="write docs/frontier-plans.md: every plan's verdict and figures",
                         description=REPORT_DESCRIPTION)
    rp.add_argument("plans", nargs="*", help="plan files or names (default: every plan reslm ships)")
    rp.add_argument("--repo", default=".", help="the repository root holding results/ and docs/ (default .)")
    rp.set_defaults(func=cmd_report)


def _add_bench(acts) -> None:
    bn = acts.add_parser("bench", help="your reservoir in the frontier's recipe at 3 seeds, beside the ESN and the GRU",
                         formatter_class=argparse.RawDescriptionHelpFormatter, description=BENCH_DESCRIPTION)
    bn.add_argument("--reservoir", required=True, help="a registered reservoir name (`esn`, `leaky`, `recorded`, ...), "
                    "or one that --import registers")
    bn.add_argument("--import", dest="imports", action="append", metavar="FILE.py",
                    help="a Python file to run first: it registers your reservoir in reslm.reservoir.RESERVOIRS "
                         "(repeatable)")
    bn.add_argument("--reservoir-options", help="the substrate's own options, k=v,k=v (e.g. path=... for a recorded "
                    "one, k=1 for nvar)")
    bn.add_argument("--set", metavar="FIELD=V,...", help="model fields, e.g. spectral_radius=0.99,input_scaling=0.5: "
                    "the substrate's operating point (the recipe's values were tuned for the ESN and apply to it only; "
                    "any other substrate starts from its own defaults); recorded in the runs' config and name")
    bn.add_argument("--size", type=int_range(1, 100_000), help="reservoir size N (default the recipe's 750); the "
                    "head's width is fitted to the budget")
    bn.add_argument("--budget", choices=fbench.BUDGETS, default="quick", help="quick (default) or full")
    bn.add_argument("--seeds", type=_seeds, default=[0, 1, 2], help="comma-separated seeds (default 0,1,2)")
    bn.add_argument("--out", default=str(fbench.OUT), help=f"where its runs and card.md go (default {fbench.OUT})")
    bn.add_argument("--results", default="results", help="the results registry with the published references "
                    "(default results)")
    bn.add_argument("--jobs", type=int_range(1, max(1, usable_cores())), default=None,
                    help="seeds at once, each in its own process (default: one per core, each with its share of the "
                         "threads; a seed whose states do not fit in memory beside the others trains again alone)")
    bn.add_argument("--memory-positions", type=int_range(0, 1_000_000), default=POSITIONS, metavar="P",
                    help=f"test positions of the runs' memory profile (`reslm memory`, k = 1 ... 256) in the table "
                         f"and the card, beside the ESN's and the GRU's (default {POSITIONS:,}; 0 leaves it out)")
    shared(bn, "--root", "--no-progress", "--threads",
           threads_help=f"torch CPU threads of each run, at most {usable_cores()}")
    bn.set_defaults(func=cmd_bench)
