"""benchmarks/memory_capacity.py: Jaeger's memory capacity of a plan's configurations, untrained (tiny sizes here)."""
import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "memory_capacity.py"
PLAN = """
[plan]
about = "tiny"

[base]
preset = "rc-750"
model = { size = 24 }

[rule]
select = "none"
seeds = [0]

[[candidate]]
label = "lmu"
model = { size = 32, reservoir = "composite", reservoir_options = "parts=esn:16+legendre(theta=8)" }
"""


def load():
    spec = importlib.util.spec_from_file_location("memory_capacity", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_configuration_of_a_plan_gets_its_capacity(tmp_path, capsys):
    plan = tmp_path / "tiny.toml"
    plan.write_text(PLAN)
    out = tmp_path / "mc.json"
    assert load().main([str(plan), "--max-delay", "6", "--fit", "1000", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["label"] for r in rows] == ["base", "lmu"] and [r["size"] for r in rows] == [24, 32]
    assert all(0 < r["capacity"] <= 6 and len(r["r2"]) == 6 for r in rows)
    assert capsys.readouterr().out.count("MC") == 2
    assert load().main([str(plan), "--only", "lmu", "--max-delay", "4", "--fit", "1000", "--channels", "2"]) == 0
    assert capsys.readouterr().out.count("MC") == 1
