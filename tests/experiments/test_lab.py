"""`reslm lab` on a tiny corpus: every (family, substrate) run is an ordinary run directory, the
physical grids and the report are written, a re-run skips finished runs, bad input is one line."""
import json
import random

import pytest
import torch

from reslm.cli import main
from reslm.data.chars import prepare_text
from reslm.core.errors import ReslmError
from reslm.experiments import plans
from reslm.experiments import run_lab as measure
from reslm.experiments.plans import SUBSTRATES, model_overrides
from reslm.models import build_model, make_config
from reslm.models.base import count_params
from reslm.report import write_lab


def run_lab(out, **kw):
    """What `reslm lab` does: the measurements (reslm.experiments), then the report drawn from them."""
    results = measure(out, **kw)
    write_lab(out)
    return results


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab")
    rng = random.Random(2)
    words = "to be or not that is the question whether tis nobler in mind suffer".split()
    (root / "a.txt").write_text("\n".join(" ".join(rng.choice(words) for _ in range(10)) for _ in range(900)))
    return prepare_text([root / "a.txt"], root, "lab", verbose=False)


@pytest.mark.parametrize("substrate", list(SUBSTRATES))
def test_every_substrate_fits_the_budget(substrate):
    """At the lab's settings every substrate stays within the paper's largest trainable budgets."""
    for fam, limit in (("rc", 153_459), ("aerc", 155_459)):
        cfg = make_config(fam, **model_overrides(substrate, fam))
        with torch.device("meta"):
            trainable, _ = count_params(build_model(fam, cfg))
        assert trainable <= limit, (substrate, fam, trainable)


def test_lab_smoke(text, tmp_path, capsys, monkeypatch):
    real = plans.model_overrides   # the lab's own sizes are the paper's budgets: tiny ones here
    monkeypatch.setattr(plans, "model_overrides", lambda sub, fam: {**real(sub, fam), "size": 32, "hidden": 4}
                        if fam == "aerc" else {**real(sub, fam), "size": 48})
    out = tmp_path / "lab"
    r = run_lab(out, data=str(text.path), budget="smoke", substrates="esn,diagonal", device="cpu", progress=False)
    assert [(x["family"], x["substrate"]) for x in r["substrates"]] == [
        ("rc", "esn"), ("aerc", "esn"), ("rc", "diagonal"), ("aerc", "diagonal")]
    assert all(x["test_loss"] > 0 and x["trainable_params"] > 0 for x in r["substrates"])
    for fam in ("rc", "aerc"):
        p = r["physical"][fam]
        assert [x["sigma"] for x in p["noise"]][0] == 0 and len(p["adc"]) >= 3
        assert len({x["test_loss"] for x in p["noise"]}) == len(p["noise"])   # each sigma scores its own noise
    for name in ("report.md", "results.json", "substrates.csv", "physical.csv"):
        assert (out / name).is_file()
    assert "## Substrates" in (out / "report.md").read_text()
    capsys.readouterr()
    assert main(["lab", "--budget", "smoke", "--data", str(text.path), "--substrates", "esn,diagonal",
                 "--out", str(out), "--device", "cpu", "--no-progress"]) == 0
    assert capsys.readouterr().err.count(": done") == 4       # nothing retrained
    assert json.loads((out / "results.json").read_text())["budget"]["name"] == "smoke"


def test_lab_bad_input(text, tmp_path, capsys):
    with pytest.raises(ReslmError, match="unknown substrate"):
        run_lab(tmp_path / "x", data=str(text.path), budget="smoke", substrates="esn,lstm")
    with pytest.raises(ReslmError, match="physical-substrate"):
        run_lab(tmp_path / "x", data=str(text.path), budget="smoke", substrates="esn", physical_substrate="delay")
    assert main(["lab", "--budget", "huge", "--out", str(tmp_path / "y")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("reslm lab: error:")
    assert main(["lab", "--budget", "smoke", "--substrates", "esn,lstm", "--out", str(tmp_path / "y")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("reslm: error: unknown substrate lstm")
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
