"""The experiment layer's shape: the report imports no experiment, no command module imports another's
names, and the paper's published figures are stored once (reslm.paper)."""
import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "reslm"
COMMANDS = ("reproduce", "lab", "sweep", "demo")


def imports(path: Path) -> set[str]:
    """The reslm modules a file imports anywhere in it (module level or not)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("reslm"):
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("reslm")}
    return out


def test_the_report_imports_no_experiment():
    for path in (PKG / "report").glob("*.py"):
        assert not [m for m in imports(path) if m.startswith("reslm.experiments")], path.name


def test_no_command_imports_another():
    for cmd in COMMANDS:
        others = {f"reslm.experiments.{c}" for c in COMMANDS if c != cmd}
        assert not imports(PKG / "experiments" / f"{cmd}.py") & others, cmd


def test_the_papers_figures_are_stored_once():
    for needle in ("-1.72", "-0.81", "1.81", "1.73", "1.67"):
        homes = [p.relative_to(PKG).as_posix() for p in PKG.rglob("*.py") if needle in p.read_text()]
        assert homes == ["paper.py"], (needle, homes)
