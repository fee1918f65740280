"""The frontier as a tool: plans as data (plan.py: a base configuration, candidate changes, seeds and
the rule that chooses on validation), their runs (runner.py: found by what they are, resumable,
published as each finishes; the rule's choice), running them (schedule.py: several at once, to a
deadline, the choice then scored on the paper's metric), their ledger (ledger.py: what was known when
each candidate joined), their report (report.py) and benchmarking your own reservoir against the
published frontier (bench.py). The plans reslm ships are plans/*.toml."""
from reslm.frontier.plan import Plan, bundled_plans, load_plan
from reslm.frontier.report import status_lines, write_plans_page
from reslm.frontier.runner import plan_table, selection
from reslm.frontier.schedule import run_plan, run_plans

__all__ = ["Plan", "bundled_plans", "load_plan", "plan_table", "run_plan", "run_plans", "selection", "status_lines",
           "write_plans_page"]
