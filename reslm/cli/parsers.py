"""The argparse tree: `build_parser(argv)` assembles one subparser per command from the modules that hold
each command's parser and handler (argv: the family whose flags `reslm train` and `reslm search` get)."""
from __future__ import annotations

import argparse
import sys

from reslm.cli import data, experiments, frontier, publish, runs, search, substrate, train, verify
from reslm.cli.flags import Parser


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    argv = sys.argv[1:] if argv is None else argv
    p = Parser(prog="reslm", description="Reservoir-computing language models: data, "
                                "training, generation, evaluation, reproduction and benchmarks (Köster & Uchida).")
    p.add_argument("--debug", action="store_true", help="show the full traceback of an error (also RESLM_DEBUG=1)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    data.add_data(sub)
    data.add_presets(sub)
    train.add_parser(sub, argv)
    runs.add_generate(sub)
    runs.add_eval(sub)
    runs.add_memory(sub)
    runs.add_recall(sub)
    publish.add_publish(sub)
    publish.add_report(sub)
    experiments.add_reproduce(sub)
    experiments.add_lab(sub)
    experiments.add_bench(sub)
    experiments.add_sweep(sub)
    search.add_parser(sub, argv)
    substrate.add_parser(sub)
    frontier.add_parser(sub)
    verify.add_parser(sub)
    experiments.add_demo(sub)
    return p
