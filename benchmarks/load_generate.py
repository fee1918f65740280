"""Load + generate time of a published run, on this machine as it is and beside busy CPUs (issue 32.7).

    .venv/bin/python benchmarks/load_generate.py results/rc-2600-stream [--length 50] [--burners 2]

Four ways of running `reslm generate RUN --length L`, each in a fresh process (so nothing is cached):
    before     torch's default threads, the reservoir's radius computed by an eigendecomposition at load
               (what reslm did before issue 32: the manifest's recorded radii are ignored)
    threads    the default of today's --threads (the cores the load leaves idle), eigendecomposition
    radii      torch's default threads, the recorded radius (no eigendecomposition)
    now        both: what `reslm generate` does today
each measured on the machine as it is ("as is", its 1-minute load average printed) and with `--burners`
extra processes spinning one core each ("busy"), as a training in the background does. Prints one table
row per (machine, way): seconds to load the model, seconds to generate, and the total.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
from pathlib import Path
from reslm.core.device import use_threads
from reslm.core import radii
way, run, length = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
if way in ("threads", "now"):
    use_threads(None)
if way in ("before", "threads"):          # the old load: recorded radii ignored
    radii.remember_radii = lambda *a, **k: None
    import reslm.models.load as L
    L.remember_radii = radii.remember_radii
from reslm.models.load import load_run
from reslm.generate import sample
t1 = time.perf_counter()
model, codec, cfg = load_run(run)
t2 = time.perf_counter()
ids = sample(model, list(codec.encode("to be")), length, temperature=1.0, seed=0)
t3 = time.perf_counter()
print(json.dumps(dict(imports=t1 - t0, load=t2 - t1, generate=t3 - t2, threads=torch.get_num_threads())))
"""


def burn() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def measure(way: str, run: str, length: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, way, run, str(length)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.getcwd()}, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run")
    ap.add_argument("--length", type=int, default=50)
    ap.add_argument("--burners", type=int, default=2)
    ap.add_argument("--ways", default="before,threads,radii,now")
    args = ap.parse_args()
    print(f"{args.run}, generate --length {args.length}, {os.cpu_count()} CPUs")
    print(f"{'machine':<28}{'way':<9}{'threads':>8}{'load s':>9}{'generate s':>12}{'total s':>9}")
    for machine in ("as is", "busy"):
        burners = [burn() for _ in range(args.burners)] if machine == "busy" else []
        try:
            if burners:
                time.sleep(5)   # let the load average see them (the default threads read it)
            label = f"{machine} (load {os.getloadavg()[0]:.1f})"
            for way in args.ways.split(","):
                r = measure(way, args.run, args.length)
                print(f"{label:<28}{way:<9}{r['threads']:>8}{r['load']:>9.2f}{r['generate']:>12.2f}"
                      f"{r['load'] + r['generate']:>9.2f}", flush=True)
        finally:
            for b in burners:
                b.kill()
                b.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
