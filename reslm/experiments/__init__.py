"""The experiments: reproduce, lab, sweep and demo as plans (tables of runs) that one executor runs, and
search, optuna's trials over a substrate's knobs.

    plans.py      the data: budgets, sweep sizes, lab substrates, the demo's presets, and the functions
                  that turn them into plans (lists of Run: name, family, model and training
                  overrides); parse_names, the comma-separated selection of names every command takes
    runner.py     run_plan (train each run with reslm.train.train: finished ones skipped, interrupted
                  ones resumed), evaluate_once (reslm.scoring.evaluate.evaluate_run unless eval.json is fresh),
                  the stamped and locked output folder
    reproduce.py  `reslm reproduce`: the Table-1 presets, the LAERC/GPT sweep, evaluations, Kneser-Ney
    lab.py        `reslm lab`: substrates at the paper's largest reservoir budgets, physical grids
    sweep.py      the LAERC vs. GPT scaling sweep
    demo.py       `reslm demo`
    search.py     `reslm search`: optuna TPE over a substrate's knobs; a trial is a training run scored on
                  held-out tails of the training shards

`reslm.experiments.reproduce.reproduce` is not re-exported here: the function would hide its module.
No command module imports another's names; the paper's published figures are reslm.paper's. Every
report, table and figure of these commands is reslm.report's, drawn from what these write to disk.
"""
from reslm.experiments.demo import run_demo
from reslm.experiments.lab import run_lab
from reslm.experiments.plans import (ALL_FAMILIES, BUDGETS, DEMO_PRESETS, LAB_BUDGETS, STATE_DTYPES, SUBSTRATES,
                                     SWEEPS, Budget, Run, Sweep, model_overrides, param_table, parse_names)
from reslm.experiments.runner import evaluate_once, run_plan
from reslm.experiments.sweep import run_sweep

__all__ = ["run_demo", "run_lab", "run_sweep", "run_plan", "evaluate_once", "parse_names", "Run",
           "ALL_FAMILIES", "BUDGETS", "DEMO_PRESETS", "LAB_BUDGETS", "STATE_DTYPES", "SUBSTRATES", "SWEEPS",
           "Budget", "Sweep", "model_overrides", "param_table"]
