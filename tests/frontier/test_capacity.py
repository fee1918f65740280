"""`reslm frontier capacity`: Jaeger's memory capacity of a plan's configurations, untrained (tiny sizes)."""
import json

from reslm.cli import main

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


def test_every_configuration_of_a_plan_gets_its_capacity(tmp_path, capsys):
    plan = tmp_path / "tiny.toml"
    plan.write_text(PLAN)
    out = tmp_path / "mc.json"
    assert main(["frontier", "capacity", str(plan), "--max-delay", "6", "--fit", "1000", "--out", str(out)]) in (0, None)
    rows = json.loads(out.read_text())["rows"]
    assert [r["label"] for r in rows] == ["base", "lmu"] and [r["size"] for r in rows] == [24, 32]
    assert all(0 < r["capacity"] <= 6 and len(r["r2"]) == 6 for r in rows)
    assert capsys.readouterr().out.count("MC") == 2
    assert main(["frontier", "capacity", str(plan), "--only", "lmu", "--max-delay", "4", "--fit", "1000",
                 "--channels", "2"]) in (0, None)
    assert capsys.readouterr().out.count("MC") == 1


def test_an_unknown_label_is_one_line_before_anything_is_computed(tmp_path, capsys):
    plan = tmp_path / "tiny.toml"
    plan.write_text(PLAN)
    assert main(["frontier", "capacity", str(plan), "--only", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "has no configuration nope" in err and "base, lmu" in err
