"""The figures' names are declared once (reslm.core.metrics) and used by every writer and reader."""
import ast
import json
import math
from pathlib import Path

from reslm.core.metrics import (CHECK_LOSS, FIGURES, MIN_TRAIN_LOSS, SPLIT_FIGURES, TEST_LOSS, TEST_LOSS_AT_BEST_VAL,
                                VAL_LOSS, best_of, bits, final_of, kept_of, summary_names)

ROOT = Path(__file__).resolve().parents[2]
CODE = [p for d in ("reslm", "benchmarks") for p in sorted((ROOT / d).rglob("*.py"))
        if p != ROOT / "reslm" / "core" / "metrics.py"]


def _prose(tree) -> set[int]:
    """ids of the constants that are not keys: docstrings (their text may name a figure) and the
    names in `__all__` (a function may share a figure's name)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
            out |= {id(c) for c in ast.walk(node.value)}
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def test_every_figure_has_a_unit_and_its_summary_names_follow_one_rule():
    assert all(f.unit.split("/")[0] in ("nats", "bits") for f in FIGURES.values())
    assert (final_of(TEST_LOSS), best_of(VAL_LOSS), kept_of(TEST_LOSS)) == (
        "final_test_loss", "best_val_loss", "weights_test_loss")
    assert {MIN_TRAIN_LOSS, TEST_LOSS_AT_BEST_VAL} <= summary_names()
    assert all(loss in FIGURES and bpc in FIGURES for loss, bpc in SPLIT_FIGURES.values())
    assert math.isclose(bits(math.log(2)), 1.0)


def test_no_figure_name_is_spelled_outside_the_vocabulary():
    """A figure's key as a string literal or a keyword (dict(test_loss=...)) anywhere in the package or
    the scripts, outside reslm/core/metrics.py, is a second declaration of it."""
    names = (set(FIGURES) - {CHECK_LOSS}) | summary_names()   # "loss" alone is too common a word to ban
    found = []
    for path in CODE:
        tree = ast.parse(path.read_text(), str(path))
        docs = _prose(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in names and id(node) not in docs:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: '{node.value}'")
            elif isinstance(node, ast.keyword) and node.arg in names:
                found.append(f"{path.relative_to(ROOT)}:{node.value.lineno}: {node.arg}=")
    assert not found, "figure names spelled out (use reslm.core.metrics):\n" + "\n".join(found)


def test_the_published_files_use_only_declared_names():
    """Every loss or bits figure in the published summaries and evaluations is a name the vocabulary
    declares, so readers that go through it find them all."""
    names = set(FIGURES) | summary_names()
    odd = set()
    for path in sorted((ROOT / "results").glob("*/summary.json")) + sorted((ROOT / "results").glob("*/eval*.json")):
        for key in json.loads(path.read_text()):
            if key.endswith(("_loss", "_bpc", "_bits", "_per_token")) and key not in names and key != "adc_bits":
                odd.add(key)
    assert not odd, f"figures the vocabulary does not declare: {sorted(odd)}"
