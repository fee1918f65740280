"""The frontier as a tool: plans as data (plan.py: a base configuration, candidate changes, seeds and
the rule that chooses on validation), running them (runner.py: resumable, published as each run
finishes, several at once), their ledger (ledger.py: what was known when each candidate joined), their
report (report.py) and benchmarking your own reservoir against the published frontier (bench.py).
The plans reslm ships are plans/*.toml."""
from reslm.frontier.plan import Plan, bundled_plans, load_plan
from reslm.frontier.report import status_lines, write_plans_page
from reslm.frontier.runner import plan_table, run_plan, run_plans, selection

__all__ = ["Plan", "bundled_plans", "load_plan", "plan_table", "run_plan", "run_plans", "selection", "status_lines",
           "write_plans_page"]
