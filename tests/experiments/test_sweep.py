import csv
import json
import random

import numpy as np
import pytest

from reslm.run import read_metrics
from reslm.train import create_run
from reslm.train import train as train_run

from reslm.data.bpe import prepare_bpe
from reslm.core.errors import ReslmError
from reslm.experiments import SWEEPS, Sweep, param_table, plans, run_sweep
from reslm.experiments.plans import extras_plan, sweep_plan
from reslm.report import fit_log10, write_scaling

TINY = Sweep(
    name="tiny",
    sizes={"laerc": [dict(dim=8, n_layers=1, context=16, r_mult=2), dict(dim=16, n_layers=1, context=16, r_mult=2)],
           "gpt": [dict(dim=8, n_layers=1, n_heads=2, context=16), dict(dim=16, n_layers=1, n_heads=2, context=16)]},
    train=dict(context=16, batch_size=2, grad_accum=1, max_steps=4, warmup_steps=1, eval_every=2,
               eval_batches=1, log_every=1, device="cpu", precision="fp32"))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep-data")
    rng = random.Random(1)
    words = "the cat sat on a mat and the dog ran to the red door while birds sang".split()
    f = root / "corpus.txt"
    f.write_text("\n".join(" ".join(rng.choice(words) for _ in range(12)) + "." for _ in range(200)))
    return prepare_bpe([f], "bpe:300", root=root, val_fraction=0.2, verbose=False)


def test_fit_log10_recovers_line():
    n = np.array([1e4, 3e4, 1e5, 1e6, 2.5e6])
    a, b, r2 = fit_log10(n, -1.72 * np.log10(n) + 14.0)
    assert a == pytest.approx(-1.72, abs=1e-10) and b == pytest.approx(14.0, abs=1e-9)
    assert r2 == pytest.approx(1.0, abs=1e-12)
    a, b, r2 = fit_log10([1e3, 1e4, 1e5], [5.0, 4.0, 3.5])
    assert a < 0 and 0 < r2 < 1
    with pytest.raises(ReslmError):
        fit_log10([1e3], [1.0])
    with pytest.raises(ReslmError):
        fit_log10([0, 10], [1.0, 2.0])


def test_tiny_sweep(dataset, tmp_path):
    out = tmp_path / "sweep"
    rows = run_sweep(out, dataset, TINY, progress=False)
    names = ["laerc-d8-l1", "laerc-d16-l1", "gpt-d8-l1", "gpt-d16-l1"]
    assert [r["name"] for r in rows] == names
    for r in rows:
        assert (out / r["name"] / "checkpoint.pt").is_file() and r["steps"] == 4
        assert r["trainable_params"] > 0 and np.isfinite(r["min_train_loss"]) and np.isfinite(r["final_val_loss"])
    assert rows[1]["trainable_params"] > rows[0]["trainable_params"]

    res = write_scaling(out, rows)
    with open(out / "scaling.csv") as f:
        table = list(csv.DictReader(f))
    assert [t["name"] for t in table] == names and float(table[0]["min_train_loss"]) == rows[0]["min_train_loss"]
    fits = json.loads((out / "scaling_fit.json").read_text())
    for fam in ("laerc", "gpt"):
        assert fits[fam]["n"] == 2 and fits[fam]["r2"] == pytest.approx(1.0)
        pts = [r for r in rows if r["family"] == fam]
        a, b, _ = fit_log10([r["trainable_params"] for r in pts], [r["min_train_loss"] for r in pts])
        assert fits[fam]["a"] == pytest.approx(a) and fits[fam]["b"] == pytest.approx(b)
    assert fits["paper"] == {"a_TF": -1.72, "a_Res": -0.81}
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert res["png"] is None and res["note"]
    else:
        assert (out / "scaling.png").stat().st_size > 1000 and res["png"] == out / "scaling.png"

    # again: every run is finished, nothing is retrained
    ck = out / "laerc-d8-l1" / "checkpoint.pt"
    before = ck.stat().st_mtime_ns
    again = run_sweep(out, dataset, TINY, progress=False)
    assert ck.stat().st_mtime_ns == before
    assert again == rows


def test_resume_unfinished_and_mismatch(dataset, tmp_path):
    out = tmp_path / "sweep"
    short = dict(max_steps=2)
    # an interrupted run: started with the sweep's config but only 2 of 4 steps done
    r = plans.sweep_plan(TINY, ("gpt",))[0]
    fam, name, model, train = r.family, r.name, r.model, r.train
    run_dir = create_run(out / name, fam, model, train, dataset)
    train_run(run_dir, progress=False, stop_at=short["max_steps"])   # stopped at step 2
    rows = run_sweep(out, dataset, TINY, families=("gpt",), progress=False)
    assert rows[0]["steps"] == 4
    assert [r["step"] for r in read_metrics(run_dir) if r["kind"] == "eval"] == [0, 2, 4]
    # a different budget in an existing folder is refused
    with pytest.raises(ReslmError, match="different budget"):
        run_sweep(out, dataset, TINY, families=("gpt",), train_overrides=dict(lr=1e-2), progress=False)


def test_bad_names(dataset, tmp_path):
    with pytest.raises(ReslmError, match="unknown sweep"):
        run_sweep(tmp_path / "x", dataset, "nope", progress=False)
    with pytest.raises(ReslmError, match="unknown family"):
        run_sweep(tmp_path / "x", dataset, TINY, families=("rnn",), progress=False)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("name,vocab,sizes", [("cpu", 4096, 4), ("paper", 50257, 4), ("cpu-scaling", 4096, 5),
                                              ("cpu-scaling-4ep", 4096, 5)])
def test_builtin_sweeps_are_param_matched(name, vocab, sizes):
    table = param_table(name, vocab)
    laerc = [r["trainable_params"] for r in table if r["family"] == "laerc"]
    gpt = [r["trainable_params"] for r in table if r["family"] == "gpt"]
    assert len(laerc) == len(gpt) == sizes and laerc == sorted(laerc) and gpt == sorted(gpt)
    for x, y in zip(laerc, gpt):
        assert 0.9 < y / x < 1.1
    assert SWEEPS[name].train["max_steps"] > 0
    if name.startswith("cpu-scaling"):   # the published sweeps: >= 1.5 decades per family, GPT within 5% of LAERC
        assert np.log10(laerc[-1] / laerc[0]) >= 1.5 and np.log10(gpt[-1] / gpt[0]) >= 1.5
        assert all(abs(y / x - 1) < 0.05 for x, y in zip(laerc, gpt))


def test_the_longer_scaling_sweep_names_its_runs_apart():
    """cpu-scaling-4ep: cpu-scaling's models and ablations under other names, 4x the steps."""
    short, long = sweep_plan("cpu-scaling", ("laerc", "gpt")), sweep_plan("cpu-scaling-4ep", ("laerc", "gpt"))
    assert [r.name + "-4ep" for r in short] == [r.name for r in long]
    assert [r.model for r in short] == [r.model for r in long]
    assert all(r.train["max_steps"] == 4 * s.train["max_steps"] for r, s in zip(long, short))
    extras = extras_plan("cpu-scaling-4ep", ("laerc",))
    assert [r.name for r in extras] == [r.name + "-4ep" for r in extras_plan("cpu-scaling", ("laerc",))]


def test_reslm_sweep_checks_its_folder_and_publish_before_the_dataset(tmp_path):
    from pathlib import Path
    from reslm.experiments.sweep import sweep_folder, train_sweep
    assert sweep_folder("cpu") == Path("runs/sweep-cpu")
    (tmp_path / "file").write_text("")
    with pytest.raises(ReslmError, match="--publish .*file: not a folder"):
        train_sweep(tmp_path / "out", "no-such-dataset", "cpu", ["gpt"], {}, publish=tmp_path / "file")
    with pytest.raises(ReslmError, match="no-such-dataset"):
        train_sweep(tmp_path / "out", "no-such-dataset", "cpu", ["gpt"], {}, data_root=tmp_path)
