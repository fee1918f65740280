import csv

import numpy as np
import pytest

from reslm.report import figures
from reslm.core.errors import ReslmError
from reslm.report.figures import fit_alpha_log10, plot_char_losses, plot_overlap, plot_times, plot_token_curves

pytest.importorskip("matplotlib")


def _read_csv(path):
    with open(path, newline="") as f:
        r = csv.reader(f)
        header = next(r)
        return header, list(r)


def _check(res, header, n_rows):
    assert res["png"] is not None and res["png"].is_file() and res["png"].stat().st_size > 1000
    assert res["png"].stem == res["csv"].stem
    got_header, rows = _read_csv(res["csv"])
    assert got_header == list(header)
    assert len(rows) == n_rows
    return rows


def _char_runs():
    """Two families, two sizes each; 2 cycles x 2 shards x 2 epochs = 8 shard-epochs per run."""
    runs = []
    for fam in ("rc", "tf"):
        for size, params in ((1, 1_000), (2, 50_000)):
            epochs = []
            for k in range(8):
                cycle, shard, epoch = k // 4, (k // 2) % 2, k % 2
                epochs.append(dict(index=k, step=10 * (k + 1), cycle=cycle, shard=shard, epoch=epoch,
                                   train_loss=3.0 - 0.1 * k * size, test_loss=3.1 - 0.08 * k * size,
                                   test_bpc=1.0, samples_per_s=1.0, epoch_seconds=0.1, wall=0.1 * k))
            runs.append(dict(family=fam, name=f"{fam}-{size}", trainable_params=params, epochs=epochs,
                             shards_per_cycle=2))
    return runs


def _overlap_rows():
    return [dict(family="rc", name="rc-1", trainable_params=1e3, overlap={7: 0.1, 8: 0.05}),
            dict(family="rc", name="rc-2", trainable_params=1e5, overlap={"7": 0.3, "8": 0.2}),
            dict(family="aerc", name="aerc-1", trainable_params=2e4, overlap={"7": 0.4, "8": 0.25})]


def _time_rows():
    rows = []
    for fam, res in (("tf", 0.0), ("aerc", 2.0)):
        for p in (1e3, 1e4, 1e5):
            rows.append(dict(family=fam, name=f"{fam}-{p:g}", trainable_params=p,
                             train_seconds=3.0 * np.log10(p), infer_seconds=0.5 * np.log10(p),
                             reservoir_train_seconds=res, reservoir_infer_seconds=res / 4))
    return rows


def _token_runs():
    runs = []
    for fam in ("gpt", "laerc"):
        for dim, params in ((8, 2_000), (16, 7_000)):
            steps = [dict(step=s, lr=1e-3, train_loss=5.0 - 0.01 * s * dim / 8, tokens_per_s=1.0, wall=s)
                     for s in range(10, 101, 10)]
            evals = [dict(step=s, val_loss=5.0 - 0.009 * s) for s in (0, 50, 100)]
            runs.append(dict(family=fam, name=f"{fam}-d{dim}", trainable_params=params, steps=steps, evals=evals))
    return runs


def test_fit_alpha_exact_and_noisy():
    x = np.geomspace(1e3, 1e7, 9)
    assert fit_alpha_log10(x, 3.5 * np.log10(x)) == pytest.approx(3.5, rel=1e-12)
    noisy = 3.5 * np.log10(x) + np.random.default_rng(0).normal(0, 0.05, len(x))
    assert fit_alpha_log10(x, noisy) == pytest.approx(3.5, abs=0.05)
    assert fit_alpha_log10([100.0], [4.0]) == pytest.approx(2.0)


@pytest.mark.parametrize("x, y", [([], []), ([0.0, 10.0], [1.0, 2.0]), ([-5.0], [1.0]), ([1.0], [3.0])])
def test_fit_alpha_rejects_bad_input(x, y):
    with pytest.raises(ReslmError):
        fit_alpha_log10(x, y)


def test_char_losses(tmp_path):
    runs = _char_runs()
    runs[-1]["context"] = "window"   # where given, the context is in the CSV and the label
    res = plot_char_losses(runs, tmp_path)
    rows = _check(res, figures.CHAR_LOSS_FIELDS, 4 * 8)
    assert res["png"].name == "fig2_losses.png" and res["note"] == ""
    assert rows[0][:4] == ["rc", "rc-1", "", "1000"] and rows[-1][2] == "window"


def test_boundaries():
    shard_x, cycle_x = figures._boundaries(_char_runs()[0]["epochs"])
    assert shard_x == [2, 6] and cycle_x == [4]


def test_overlap_accepts_string_keys(tmp_path):
    res = plot_overlap(_overlap_rows(), tmp_path, baselines={"5-gram model": {"7": 0.5, 8: 0.3}})
    rows = _check(res, ("family", "name", "trainable_params", "overlap_7", "overlap_8"), 3)
    assert [float(v) for v in rows[1][3:]] == [0.3, 0.2]


def test_times_fits(tmp_path):
    res = plot_times(_time_rows(), tmp_path)
    rows = _check(res, figures.TIME_FIELDS, 6)
    assert res["fits"]["tf"]["train"] == pytest.approx(3.0)
    assert res["fits"]["tf"]["infer"] == pytest.approx(0.5)
    assert res["fits"]["tf"]["train_total"] == pytest.approx(3.0)
    assert res["fits"]["aerc"]["train_total"] > res["fits"]["aerc"]["train"]
    assert float(rows[-1][7]) == pytest.approx(3.0 * 5 + 2.0)


def test_token_curves(tmp_path):
    res = plot_token_curves(_token_runs(), tmp_path, smooth=0.5)
    # per run: steps 10..100 (10 rows) plus the eval-only step 0
    rows = _check(res, figures.TOKEN_LOSS_FIELDS, 4 * 11)
    first = rows[0]
    assert first[3] == "0" and first[4] == "" and first[6] != ""
    assert [r[6] == "" for r in rows[1:11]].count(False) == 2  # evals at 50 and 100


def test_ema():
    assert figures.ema([1.0, 2.0, 3.0], 0.0) == [1.0, 2.0, 3.0]
    assert figures.ema([2.0] * 5, 0.9) == pytest.approx([2.0] * 5)  # debiased: no pull towards 0
    with pytest.raises(ReslmError):
        figures.ema([1.0], 1.0)


def test_empty_input_is_an_error(tmp_path):
    with pytest.raises(ReslmError):
        plot_times([], tmp_path)


def test_without_matplotlib_csv_only(tmp_path, monkeypatch):
    monkeypatch.setattr(figures, "_pyplot", lambda: None)
    results = [plot_char_losses(_char_runs(), tmp_path), plot_overlap(_overlap_rows(), tmp_path),
               plot_times(_time_rows(), tmp_path), plot_token_curves(_token_runs(), tmp_path)]
    for res in results:
        assert res["png"] is None and "matplotlib" in res["note"]
        assert res["csv"].is_file() and len(_read_csv(res["csv"])[1]) > 0
    assert results[2]["fits"]["tf"]["train"] == pytest.approx(3.0)
    assert not list(tmp_path.glob("*.png"))
