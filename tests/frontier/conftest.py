"""Fixtures of the frontier tests."""
import textwrap

import pytest

from reslm.frontier import bench as fbench
from reslm.frontier import load_plan


@pytest.fixture
def bench_on(tmp_path, chars, monkeypatch):
    """bench_on(RECIPE): the bench's recipe replaced by RECIPE's base (a plan's text); returns a function of
    an output folder's name giving the flags that point the bench at the tiny corpus, an empty results
    registry and that folder, without the memory profile (a later --memory-positions P turns it on)."""
    def setup(recipe: str):
        plan = tmp_path / "tiny-recipe.toml"
        plan.write_text(textwrap.dedent(recipe))
        monkeypatch.setattr(fbench, "recipe_config", lambda *a, **k: load_plan(plan).base)
        monkeypatch.chdir(tmp_path)
        return lambda out: ["--seeds", "0", "--out", str(tmp_path / out), "--results", str(tmp_path / "results"),
                            "--root", str(chars.path.parent), "--no-progress", "--memory-positions", "0"]
    return setup
