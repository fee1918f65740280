"""The token-level half: the slope's interval (reslm.report.scaling), a sweep that publishes each run
(reslm.experiments.sweep), the report's page, CSV, JSON and README block from a tiny results folder
(reslm.report.tokens), and `reslm eval` / `reslm generate` on a published LAERC folder."""
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from reslm.cli import main
from reslm.core.errors import ReslmError
from reslm.experiments import Sweep, run_sweep
from reslm.experiments.plans import extras_plan, sweep_plan
from reslm.experiments.runner import evaluate_and_publish
from reslm.report import report
from reslm.report.scaling import fit_log10, fit_log10_ci, t_quantile
from reslm.report.tokens import TOKENS_BEGIN, TOKENS_END, token_rows
from reslm.run.registry import is_published

# Student's t quantiles (two-sided 95% and one-sided 95%), from the standard tables
T_TABLE = [(0.975, 1, 12.7062), (0.975, 2, 4.3027), (0.975, 3, 3.1824), (0.975, 8, 2.3060), (0.975, 30, 2.0423),
           (0.95, 5, 2.0150), (0.995, 4, 4.6041)]


@pytest.mark.parametrize("p,df,want", T_TABLE)
def test_t_quantile_matches_the_tables(p, df, want):
    assert t_quantile(p, df) == pytest.approx(want, abs=1e-4)


def test_t_quantile_refuses_bad_arguments():
    for p, df in ((0.4, 3), (1.0, 3), (0.975, 0)):
        with pytest.raises(ReslmError):
            t_quantile(p, df)


def test_slope_interval():
    n = np.array([3e4, 8e4, 2e5, 4e5, 1.5e6])
    exact = fit_log10_ci(n, -0.81 * np.log10(n) + 10.0)
    assert exact["a"] == pytest.approx(-0.81) and exact["a_se"] == pytest.approx(0.0, abs=1e-9)
    assert exact["a_lo"] == pytest.approx(-0.81) and exact["a_hi"] == pytest.approx(-0.81)
    y = -0.81 * np.log10(n) + 10.0 + np.array([0.03, -0.02, 0.01, -0.04, 0.02])
    fit = fit_log10_ci(n, y)
    x = np.log10(n)
    a, b, r2 = fit_log10(n, y)
    se = math.sqrt(((y - a * x - b) ** 2).sum() / 3 / ((x - x.mean()) ** 2).sum())   # OLS, n - 2 = 3
    assert (fit["a"], fit["b"], fit["r2"]) == (a, b, r2) and fit["a_se"] == pytest.approx(se)
    assert fit["a_lo"] == pytest.approx(a - 3.18245 * se, rel=1e-5) and fit["a_hi"] == pytest.approx(a + 3.18245 * se,
                                                                                                      rel=1e-5)
    assert fit["a_lo"] < -0.81 < fit["a_hi"] and fit["level"] == 0.95
    two = fit_log10_ci([1e4, 1e5], [5.0, 4.0])             # no degree of freedom: a line, no interval
    assert two["a"] == pytest.approx(-1.0) and two["a_se"] is None and two["a_lo"] is None


TINY = Sweep(
    name="tiny-published",
    sizes={"laerc": [dict(dim=8, n_layers=1, context=16, r_mult=2), dict(dim=12, n_layers=1, context=16, r_mult=2),
                     dict(dim=16, n_layers=1, context=16, r_mult=2)],
           "gpt": [dict(dim=8, n_layers=1, n_heads=2, context=16), dict(dim=12, n_layers=1, n_heads=2, context=16),
                   dict(dim=16, n_layers=1, n_heads=2, context=16)]},
    train=dict(batch_size=2, grad_accum=1, max_steps=4, warmup_steps=1, eval_every=2, eval_batches=1, log_every=1,
               device="cpu", precision="fp32", threads=1),
    order="size",
    extras=[("laerc-d8-l1-noreservoir", "laerc", dict(dim=8, n_layers=1, context=16, r_mult=2, no_reservoir=True), {}),
            ("laerc-d8-l1-lr", "laerc", dict(dim=8, n_layers=1, context=16, r_mult=2), dict(lr=1e-4))])


def test_size_order_and_extras():
    names = [r.name for r in sweep_plan(TINY, ("laerc", "gpt"))]
    assert names == ["laerc-d8-l1", "gpt-d8-l1", "laerc-d12-l1", "gpt-d12-l1", "laerc-d16-l1", "gpt-d16-l1"]
    extra = extras_plan(TINY, ("laerc", "gpt"), dict(max_steps=3))
    assert [r.name for r in extra] == ["laerc-d8-l1-noreservoir", "laerc-d8-l1-lr"]
    assert extra[1].train["lr"] == 1e-4 and extra[1].train["max_steps"] == 3 and extra[0].model["no_reservoir"]
    assert extras_plan(TINY, ("gpt",)) == []


@pytest.fixture(scope="module")
def published(dataset, tmp_path_factory):
    """A repository with a README (both marker pairs) and the tiny sweep published into its results/."""
    repo = tmp_path_factory.mktemp("repo")
    (repo / "README.md").write_text("# x\n\n<!-- results:begin -->\n<!-- results:end -->\n\n"
                                    f"{TOKENS_BEGIN}\n{TOKENS_END}\n")
    rows = run_sweep(repo / "runs", dataset, TINY, progress=False,
                     after=lambda run_dir: evaluate_and_publish(run_dir, repo / "results"))
    return repo, rows


def test_sweep_publishes_every_run_with_its_val_split_score(published):
    repo, rows = published
    assert [r["name"] for r in rows][:2] == ["laerc-d8-l1", "gpt-d8-l1"] and len(rows) == 6   # extras not fitted
    names = sorted(p.name for p in (repo / "results").iterdir())
    assert names == sorted([r["name"] for r in rows] + ["laerc-d8-l1-noreservoir", "laerc-d8-l1-lr"])
    for name in names:
        folder = repo / "results" / name
        assert is_published(folder) and not (folder / "checkpoint.pt").exists()
        ev = json.loads((folder / "eval.json").read_text())
        assert ev["settings"]["score"] == 0 and np.isfinite(ev["test_loss"])


def test_report_tabulates_fits_and_ablations_from_results(published, capsys):
    repo, rows = published
    assert main(["report", "--repo", str(repo)]) == 0
    page = (repo / "docs" / "token-scaling.md").read_text()
    assert "| LAERC | 3 |" in page and "| GPT | 3 |" in page and "| -0.81 |" in page and "| -1.72 |" in page
    assert "[laerc-d8-l1-noreservoir](../results/laerc-d8-l1-noreservoir) | no_reservoir=True |" in page
    assert "[laerc-d8-l1-lr](../results/laerc-d8-l1-lr) | lr=0.0001 |" in page   # trained otherwise: a variant
    fits = json.loads((repo / "results" / "token-scaling.json").read_text())
    (per_key,) = fits["groups"].values()
    laerc = [r for r in token_rows(repo) if r["family"] == "laerc" and not r["variant"]]
    assert len(laerc) == 3 and per_key["best_val_loss"]["laerc"]["n"] == 3
    a, b, r2 = fit_log10([r["trainable_params"] for r in laerc], [r["best_val_loss"] for r in laerc])
    fit = per_key["best_val_loss"]["laerc"]
    assert fit["a"] == pytest.approx(a) and fit["r2"] == pytest.approx(r2) and fit["a_lo"] < a < fit["a_hi"]
    readme = (repo / "README.md").read_text()
    block = readme.split(TOKENS_BEGIN)[1].split(TOKENS_END)[0]
    assert "| LAERC |" in block and "| GPT |" in block and "R²" in block
    assert (repo / "docs" / "token-scaling.png").read_bytes().startswith(b"\x89PNG")
    capsys.readouterr()
    assert main(["report", "--repo", str(repo), "--check"]) == 0          # the same inputs: nothing to change
    assert "up to date" in capsys.readouterr().out


def test_eval_and_generate_a_published_laerc(published, dataset, monkeypatch, capsys):
    repo, _ = published
    folder = repo / "results" / "laerc-d16-l1"
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    monkeypatch.setenv("RESLM_DATA", str(dataset.path.parent))
    assert main(["eval", str(folder), "--score", "0", "--length", "12", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "laerc" in out and "val CE" in out and "nats/token" in out and "(the whole val split)" in out
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before      # a published folder is only read
    assert main(["generate", str(folder), "--prompt", "the cat", "--length", "8", "--threads", "1"]) == 0
    assert capsys.readouterr().out.startswith("the cat")
    monkeypatch.setenv("RESLM_DATA", str(repo / "no-data"))               # a dataset reslm cannot build
    assert main(["generate", str(folder), "--prompt", "the cat"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("reslm: error:")


def test_sweep_command_refuses_a_file_as_publish_folder(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    assert main(["sweep", "--sweep", "smoke", "--publish", str(tmp_path / "f"), "--out", str(tmp_path / "s")]) == 2
    assert capsys.readouterr().err.strip() == f"reslm: error: --publish {tmp_path / 'f'}: not a folder"


def test_report_without_token_runs_keeps_an_empty_block(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "README.md").write_text(f"<!-- results:begin -->\n<!-- results:end -->\n{TOKENS_BEGIN}\n{TOKENS_END}\n")
    report(tmp_path)
    assert "No token-level run is published yet." in (tmp_path / "README.md").read_text()
    assert not (tmp_path / "docs" / "token-scaling.md").exists()
    shutil.rmtree(tmp_path / "results")


def test_a_run_config_written_before_a_field_rename_keeps_its_variant():
    """A LAERC run whose config.json still says radius_start / radius_end (the published sweep's) is
    labelled as one written today: the authors' variant by name, the plain model with none."""
    from reslm.models.laerc import AUTHORS_VARIANT
    from reslm.report.tokens import _variant
    old = {k: v for k, v in AUTHORS_VARIANT.items() if not k.startswith("spectral_radius")}
    old.update(radius_start=AUTHORS_VARIANT["spectral_radius"], radius_end=AUTHORS_VARIANT["spectral_radius_end"])
    assert _variant(dict(family="laerc", model=dict(dim=8, n_layers=1, **old))) == "authors' variant"
    assert _variant(dict(family="laerc", model=dict(dim=8, n_layers=1, radius_start=0.9, radius_end=0.99))) != \
        "authors' variant"


def test_the_readme_shows_the_longer_budget_once_it_covers_as_many_sizes():
    from reslm.report.tokens import main_group, readme_block
    def row(g, fam, n, steps, finished=True):
        return dict(group=g, family=fam, variant="", finished=finished, steps=steps, trainable_params=n,
                    epochs=steps / 1500)
    short, long = "d, 1,500 steps of 16 x 128 tokens", "d, 6,000 steps of 16 x 128 tokens"
    fit = dict(a=-0.7, a_lo=-0.9, a_hi=-0.5, r2=0.9)
    fits = {g: {k: {"laerc": fit} for k in ("min_train_loss", "best_val_loss")} for g in (short, long)}
    rows = [row(short, "laerc", n, 1500) for n in (1e4, 1e5, 1e6)]
    partial = rows + [row(long, "laerc", n, 6000) for n in (1e4, 1e5)] + [row(long, "laerc", 1e6, 3000, False)]
    assert main_group(partial, fits) == short                  # the longer budget is still missing a size
    done = rows + [row(long, "laerc", n, 6000) for n in (1e4, 1e5, 1e6)]
    assert main_group(done, fits) == long
    assert readme_block(done, fits).startswith("Every size: 6,000 steps of 16 x 128 tokens (4.0 epochs);")
