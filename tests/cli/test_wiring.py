"""The command line is wiring: small functions, a build_parser that only assembles the commands' modules,
and help texts that read what they quote from the library (the paper's protocol: reslm.paper)."""
import ast
from pathlib import Path

from reslm.cli.parsers import build_parser
from reslm.paper import PROTOCOL

CLI = Path(__file__).resolve().parents[2] / "reslm" / "cli"
LONGEST = 60   # lines of the longest function the command line may hold


def test_every_function_of_the_command_line_is_short():
    long = []
    for path in sorted(CLI.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n >= LONGEST:
                    long.append(f"{path.name}:{node.name} ({n} lines)")
    assert not long, long


def test_build_parser_only_assembles_the_commands():
    tree = ast.parse((CLI / "parsers.py").read_text(encoding="utf-8"))
    calls = {n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
    assert "add_parser" in calls and not calls & {"add_argument_group", "add_mutually_exclusive_group"}
    sub = next(a for a in build_parser([])._actions if a.dest == "command")
    assert list(sub.choices) == ["data", "presets", "train", "generate", "eval", "memory", "recall", "publish", "report", "reproduce",
                                 "lab", "bench", "sweep", "search", "substrate", "frontier", "verify", "demo"]


def test_the_help_quotes_the_papers_protocol_from_reslm_paper():
    sub = next(a for a in build_parser([])._actions if a.dest == "command")
    words = (f"{PROTOCOL['epochs_per_shard']} epochs on each full shard, batch {PROTOCOL['batch_size']}, "
             f"{PROTOCOL['optimizer'].capitalize()} ")
    for command in ("reproduce", "lab"):
        text = " ".join(sub.choices[command].format_help().split())
        assert words in text, command
        lr = text.split(words, 1)[1].split()[0]
        assert float(lr) == PROTOCOL["lr"] and lr == "1e-4", (command, lr)   # written as the paper writes it
