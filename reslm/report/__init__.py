"""Every report, table and figure of reslm, drawn from what training and the experiments wrote to disk
(run folders: config, summary, metrics, eval JSON; results/; a command's results.json). It imports no
experiment: a command measures, then this package draws.

    docs.py          `reslm report`: docs/results.md, docs/speed.md (from results/bench/), docs/frontier.md,
                     docs/token-scaling.md, the README's tables
    rows.py          the runs that report tabulates: published ones (results/) and results/legacy.csv
    frontier.py      docs/frontier.md: every character run at the paper's largest trainable budget
    figures.py       the paper's Fig. 2, 3, 4 and 6 (plain rows in, a PNG and its CSV out)
    plots.py         the lab's substrate and physical-constraint plots, the frontier plot
    scaling.py       Fig. 7: the scaling-law fit L = a log10 N + b, the slope's t interval, its figure
    tokens.py        docs/token-scaling.md: the published LAERC / GPT runs, their fits and ablations
    reproduction.py  `reslm reproduce`'s figures and report.md
    lab.py           `reslm lab`'s figures and report.md
    search.py        `reslm search`'s trials.csv, best.json, best command and plots
    demo.py          `reslm demo`'s table and samples
"""
from reslm.report.demo import demo_text
from reslm.report.docs import README_BEGIN, README_END, build, replace_readme_table, report, speed_md
from reslm.report.lab import write_lab
from reslm.report.reproduction import write_reproduction
from reslm.report.rows import legacy_rows, published_rows
from reslm.report.scaling import fit_log10, write_scaling

__all__ = ["report", "build", "README_BEGIN", "README_END", "replace_readme_table", "published_rows", "legacy_rows",
           "speed_md", "write_reproduction", "write_lab", "write_scaling", "fit_log10", "demo_text"]
