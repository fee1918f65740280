"""continue_from (issue 88): a new run from a published finished run's weights, its configuration with more
cycles and a fresh optimiser state, the record saying so; the same schedule, shuffles and dropout seeds as
the uninterrupted run of that many cycles; refused for anything that would make it another configuration."""
import json

import pytest
import torch

import reslm.train as tt
from reslm.cli import main
from reslm.core.errors import ReslmError
from reslm.models.identity import fingerprint
from reslm.publish import publish
from reslm.run import read_config, read_metrics
from reslm.settings import TrainConfig

MODEL = dict(ff_dim=16, n_heads=2, n_layers=1)
TRAIN = dict(batch_size=64, epochs_per_shard=2, epoch_samples=128, lr=3e-3, log_every=1, device="cpu",
             precision="fp32", window_step="plain")


@pytest.fixture(scope="module")
def source(chars, tmp_path_factory):
    """A finished one-cycle tiny transformer run, published (results/one), and its unpublished folder."""
    base = tmp_path_factory.mktemp("continue")
    run = tt.create_run(base / "runs" / "one", "tf", MODEL, {**TRAIN, "cycles": 1}, chars)
    tt.train(run, progress=False)
    publish(run, base / "results" / "one", date="2026-12-07")
    return base, chars


def _continue(base, chars, out, *extra) -> int:
    return main(["train", "--continue-from", str(base / "results" / "one"), "--cycles", "2", "--out", str(out),
                 "--root", str(chars.path.parent), "--no-progress", *extra])


def test_a_continued_run_goes_on_where_its_source_ended_and_says_so(source, tmp_path, capsys):
    base, chars = source
    assert _continue(base, chars, tmp_path / "cont") == 0
    capsys.readouterr()
    src_rows, rows = read_metrics(base / "results" / "one"), read_metrics(tmp_path / "cont")
    assert rows[:len(src_rows)] == src_rows   # the source's history, then the row that says where it took over
    row = rows[len(src_rows)]
    step = json.loads((base / "results" / "one" / "manifest.json").read_text())["step"]
    assert row["kind"] == "continued" and row["optimizer"] == "fresh" and row["run"] == "one" and row["step"] == step
    later = [r for r in rows[len(src_rows):] if r["kind"] == "eval"]
    assert later and {r["cycle"] for r in later} == {1} and later[0]["step"] > step
    summary = json.loads((tmp_path / "cont" / "summary.json").read_text())
    assert summary["finished"] and summary["continued_from"] == dict(run="one", step=step, cycles=1, optimizer="fresh")

    # the uninterrupted two-cycle run: the same schedule, another configuration (it is not the continued one)
    exact = tt.create_run(tmp_path / "exact", "tf", MODEL, {**TRAIN, "cycles": 2}, chars)
    tt.train(exact, progress=False)
    evals = read_metrics(exact, "eval")
    assert [(r["step"], r["cycle"]) for r in evals] == [(r["step"], r["cycle"]) for r in rows if r["kind"] == "eval"]
    keep = ("step", "cycle", "shard", "epoch", "test_loss")
    assert [{k: r[k] for k in keep} for r in evals if r["cycle"] == 0] == \
        [{k: r[k] for k in keep} for r in src_rows if r["kind"] == "eval"]
    cont_cfg, exact_cfg = read_config(tmp_path / "cont"), read_config(exact)
    assert cont_cfg["train"]["cycles"] == 2 and cont_cfg["train"]["continue_from"] == str(base / "results" / "one")
    assert fingerprint(cont_cfg) != fingerprint(exact_cfg)


def test_a_continued_run_stopped_and_resumed_ends_as_the_uninterrupted_continuation(source, tmp_path, capsys):
    base, chars = source
    assert _continue(base, chars, tmp_path / "whole") == 0
    src_steps = json.loads((base / "results" / "one" / "manifest.json").read_text())["step"]
    assert _continue(base, chars, tmp_path / "parts", "--stop-at", str(src_steps + 3)) == 0
    assert main(["train", "--out", str(tmp_path / "parts"), "--resume", "--root", str(chars.path.parent),
                 "--no-progress"]) == 0
    capsys.readouterr()
    a, b = (torch.load(tmp_path / k / "checkpoint.pt", weights_only=True)["model"] for k in ("whole", "parts"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r for r in read_metrics(tmp_path / "parts") if r["kind"] == "continued"] == \
        [r for r in read_metrics(tmp_path / "whole") if r["kind"] == "continued"]   # logged once, at the first start


@pytest.mark.parametrize("extra, said", [
    (["--cycles", "1"], "give --cycles K, more than the 1 it has"),
    (["--lr", "0.01"], "--lr would make it another"),
    (["--n-layers", "2"], "model options would make it another"),
])
def test_what_would_make_a_continued_run_another_configuration_is_refused(source, tmp_path, error_line, extra, said):
    base, chars = source
    out = tmp_path / "x"
    assert _continue(base, chars, out, *extra) == 2
    assert said in error_line()
    assert not out.exists()


def test_a_source_that_is_not_a_published_finished_run_is_refused(source, tmp_path, error_line):
    base, chars = source
    argv = ["train", "--cycles", "2", "--out", str(tmp_path / "x"), "--root", str(chars.path.parent), "--no-progress"]
    assert main([*argv, "--continue-from", str(base / "runs" / "one")]) == 2
    assert "not a published run folder" in error_line()
    for missing in (tmp_path / "nothing", tmp_path / "empty-file"):
        (tmp_path / "empty-file").write_text("")
        assert main(["train", "--continue-from", str(missing), "--cycles", "2", "--out", str(tmp_path / "z")]) == 2
        assert "not a published run folder" in error_line()
        assert not (tmp_path / "z").exists()
    assert main(["train", "--continue-from", str(base / "results" / "one"), "--out", str(tmp_path / "y"),
                 "--root", str(chars.path.parent)]) == 2
    assert "give --cycles K, more than the 1 it has" in error_line()


def test_a_run_described_in_full_must_be_its_source_with_more_cycles(source, tmp_path):
    base, chars = source
    run = tt.create_run(tmp_path / "other", "tf", MODEL,
                        {**TRAIN, "cycles": 2, "lr": 1e-3, "continue_from": str(base / "results" / "one")}, chars)
    with pytest.raises(ReslmError, match=r"cannot continue .*a different budget \(lr\)"):
        tt.train(run, progress=False)
    with pytest.raises(ReslmError, match="continue_from goes on from a run's last weights at a constant"):
        TrainConfig(schedule="cosine", continue_from="results/x").validate()


def test_a_plan_continues_each_seed_from_its_own_run(chars, tmp_path):
    """A plan's candidate with continue_from ".../one-s{seed}": each seed's run continues that seed's published
    one-pass run; the base trained through draws the same first pass as the sources."""
    import textwrap
    from reslm.frontier import load_plan, run_plan

    results = tmp_path / "results"
    for seed in (0, 1):
        run = tt.create_run(tmp_path / "src" / f"one-s{seed}", "tf", {**MODEL, "seed": seed},
                            {**TRAIN, "cycles": 1, "seed": seed}, chars)
        tt.train(run, progress=False)
        publish(run, results / f"one-s{seed}", date="2026-12-07")
    train = ", ".join(f"{k} = {json.dumps(v)}" for k, v in TRAIN.items() if k != "device")
    plan = tmp_path / "tiny-continue.toml"
    plan.write_text(textwrap.dedent(f"""
        [plan]
        about = "a tiny continuation"

        [base]
        label = "2c"
        family = "tf"
        data = "tiny"
        model = {{ ff_dim = 16, n_heads = 2, n_layers = 1 }}
        train = {{ {train}, cycles = 2 }}

        [rule]
        select = "none"
        seeds = [0, 1]
        strict = false

        [[candidate]]
        label = "2c-cont"
        train = {{ continue_from = "{results}/one-s{{seed}}" }}
        """))
    run_plan(load_plan(plan), results, tmp_path / "runs", data_root=chars.path.parent, progress=False,
             say=lambda m: None)
    for seed in (0, 1):
        src = read_metrics(results / f"one-s{seed}", "eval")
        (through,) = results.glob(f"tf-2c-????????-s{seed}")
        (cont,) = results.glob(f"tf-2c-cont-*-s{seed}")
        assert [r["test_loss"] for r in read_metrics(through, "eval")][:len(src)] == [r["test_loss"] for r in src]
        assert [r["run"] for r in read_metrics(cont, "continued")] == [f"one-s{seed}"]
        assert json.loads((cont / "summary.json").read_text())["finished"]
