"""`reslm report`: every results table and figure from results/ (the bench JSON files: results/bench/); the
README's table is what the report writes (no number drifts), the report is deterministic, and docs/ holds
pages, never the report's inputs."""
import json
import shutil
from pathlib import Path

import pytest

import reslm.train as tt
from reslm.cli import main
from reslm.publish import publish
from reslm.paper import PROTOCOL
from reslm.report import README_BEGIN, README_END, build, report, speed_md
from reslm.report.rows import PAPER_OPTIMISER, PAPER_SAMPLING, lr_words
from reslm.run.lock import writer_of
from reslm.run.registry import published_folders

REPO = Path(__file__).resolve().parents[2]
PAPER = dict(batch_size=1024, lr=1e-4, epochs_per_shard=5, epoch_samples=0, shard_chars=0, eval_samples=0)


@pytest.fixture(scope="module")
def checkout() -> Path:
    """The repository, whose results/ the test reads; skipped while a run trains in place there (`reslm
    frontier run` continuing a published run): its files change under the test, and the docs describe
    them only once it has stopped and `reslm report` has run. A clean clone (CI) never skips."""
    busy = [f.name for f in published_folders(REPO / "results") if writer_of(f)]
    if busy:
        pytest.skip(f"results/{busy[0]} is being trained in place")
    return REPO


@pytest.fixture(scope="module")
def built(checkout):
    """build(REPO) once for the tests that read it: (outputs, figures)."""
    return build(checkout)


def test_readme_docs_and_figures_are_what_report_writes(built):
    """README.md's results table, docs/results.md and docs/speed.md equal what `reslm report` writes from the
    repository's data: run `reslm report` after publishing a run or adding a bench JSON to results/bench/."""
    text = (REPO / "README.md").read_text()
    assert text.count(README_BEGIN) == 1 and text.count(README_END) == 1
    outputs, _ = built
    assert outputs["README.md"] == text, "README.md's results table is out of date: run `reslm report`"
    assert report(REPO, check=True) == []


def test_legacy_rows_are_marked_and_read_from_their_curves(built):
    outputs, figs = built
    curves = figs["curves"]
    table = outputs["README.md"].split(README_BEGIN)[1].split(README_END)[0]
    row = next(line for line in table.splitlines() if line.startswith("| aerc-160-30 |") and "| window |" in line)
    assert "| 1.7992 | 1.73 | 2.596 | not published |" in row
    assert any(c["name"] == "tf-64-4-4" and len(c["epochs"]) >= 15 for c in curves)
    # Fig. 2: one curve per README row (a Table 1 preset, or a ceiling), each with its context
    assert len({c["name"] for c in curves}) == len(curves)
    assert {c["name"] for c in curves} == {line.split(" | ")[0][2:] for line in table.splitlines()[2:]
                                           if line.startswith("| ")} | {"rnn-gru-32-200", "rnn-lstm-32-173"}
    aerc = next(c for c in curves if c["name"] == "aerc-160-30")   # its run over the most passes, every cycle
    assert aerc["context"] == "stream" and len(aerc["epochs"]) == 75
    assert ("| aerc-75-13 | aerc | 15,464 | window | 2 | 1.9754 / 1.9838 / 1.9770 / 1.9617 / 1.9621 | 2.831 |"
            in outputs["docs/results.md"])


@pytest.fixture
def repo(tmp_path, checkout):
    """A copy of the repository's inputs to the report."""
    for name in ("docs", "results"):
        shutil.copytree(REPO / name, tmp_path / name)
    shutil.copy(REPO / "README.md", tmp_path / "README.md")
    return tmp_path


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
            and p.name != ".lock"}


def test_report_twice_gives_no_diff_and_published_runs_replace_legacy_rows(repo, chars, tmp_path, capsys):
    """A published paper-protocol run labelled rc-250 with another reservoir size is a variant: it gets a
    row with a link to its folder beside the legacy rc-250 row (a variant replaces nothing), and the
    README, which lists Table-1 presets only, keeps the legacy row; a run at another budget goes to
    "Other published runs"; a second report changes no byte (figure included)."""
    run = tt.create_run(tmp_path / "runs" / "a", "rc", dict(size=32, context_mode="window"), PAPER, chars,
                        preset="rc-250")
    tt.train(run, progress=False)
    publish(run, repo / "results" / "rc-250", date="2026-01-01T00:00:00+00:00")
    other = tt.create_run(tmp_path / "runs" / "b", "rc", dict(size=24), dict(batch_size=64, epochs_per_shard=1,
                                                                               epoch_samples=128), chars)
    tt.train(other, progress=False, stop_at=3)
    publish(other, repo / "results" / "small", date="2026-01-01T00:00:00+00:00")
    assert main(["report", "--repo", str(repo)]) == 0
    first = snapshot(repo)
    assert main(["report", "--repo", str(repo)]) == 0
    assert "up to date" in capsys.readouterr().out
    assert snapshot(repo) == first
    md = (repo / "docs" / "results.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| rc-250 |")]
    assert any("[results/rc-250](../results/rc-250)" in r and "size=32" in r for r in rows)   # a variant of rc-250
    assert any("weights not published" in r for r in rows)        # so the legacy rc-250 row stays beside it
    assert "## Other published runs" in md and "[small](../results/small)" in md and "| no |" in md
    assert (repo / "docs" / "results-fig2.png").read_bytes().startswith(b"\x89PNG")
    readme = (repo / "README.md").read_text()
    assert "[results/rc-250](results/rc-250)" not in readme      # the README lists Table-1 presets only
    assert "| rc-250 | 14,809 | stream | 2.1953 | - | 3.167 | [results/rc-250-stream](results/rc-250-stream) |" in readme


def test_speed_page_reads_the_bench_files_in_results_bench(tmp_path):
    """docs/speed.md: one row per results/bench/bench-*.json, linked there, with the CPU that
    results/bench/bench-cpus.csv names for a file that recorded none; a bench JSON left in docs/ is not read."""
    bench = tmp_path / "results" / "bench"
    bench.mkdir(parents=True)
    figures = dict(device_name="x86_64", threads=2, seconds=60, reservoir_vs_gemm={"750": 0.5},
                   gemm_gflops={"750": 100.0})
    (bench / "bench-a.json").write_text(json.dumps(figures))
    (bench / "bench-cpus.csv").write_text('file,cpu,note\nbench-a.json,"Some CPU (AVX2)",quiet\n')
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "bench-b.json").write_text(json.dumps(figures))
    page = speed_md(tmp_path)
    assert "| [bench-a.json](../results/bench/bench-a.json) | Some CPU (AVX2) | 2 | 0.50 (100) |" in page
    assert "bench-b.json" not in page


def test_docs_holds_pages_and_what_the_report_draws_not_its_inputs(built):
    """docs/ holds no JSON but a command's report folder's own results.json beside its report.md: measured
    data lives under results/ (bench: results/bench/), and so do the fits the report computes
    (results/token-scaling.json); the report writes no JSON into docs/."""
    outputs, _ = built
    assert not [rel for rel in outputs if rel.startswith("docs/") and rel.endswith(".json")]
    assert "results/token-scaling.json" in outputs and (REPO / "results" / "token-scaling.json").is_file()
    docs = REPO / "docs"
    stray = [str(p.relative_to(REPO)) for p in sorted(docs.rglob("*.json"))
             if not (p.name == "results.json" and (p.parent / "report.md").is_file())]
    assert not stray, f"data files in docs/ (move them under results/, e.g. results/bench/): {stray}"


def test_the_report_says_the_paper_protocol_from_reslm_paper(built):
    """The protocol's numbers are written once (reslm.paper.PROTOCOL): the pages say them in words built
    from it, and no module of reslm/report spells them out again."""
    assert (lr_words(1e-4), lr_words(3e-3), lr_words(0.01)) == ("1e-4", "3e-3", "1e-2")
    epochs, batch, lr = PROTOCOL["epochs_per_shard"], PROTOCOL["batch_size"], lr_words(PROTOCOL["lr"])
    assert PAPER_SAMPLING == f"{epochs} epochs on each full training shard, batch {batch}"
    outputs, _ = built
    assert f"{PAPER_SAMPLING}, {PAPER_OPTIMISER};" in outputs["docs/results.md"]
    assert f"({PAPER_SAMPLING})" in outputs["docs/frontier.md"]
    copies = {p.name: w for p in sorted((REPO / "reslm" / "report").glob("*.py"))
              for w in (f"{epochs} epochs on each", f"batch {batch}", f"lr {lr}", f"Adam {lr}") if w in p.read_text()}
    assert not copies, f"the paper's protocol spelled out in the report (read reslm.paper.PROTOCOL): {copies}"


def test_check_names_what_is_out_of_date(repo, capsys):
    path = repo / "README.md"
    path.write_text(path.read_text().replace("| 1.7992 |", "| 1.7000 |"))
    assert main(["report", "--repo", str(repo), "--check"]) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("reslm: note:")]
    assert err == ["reslm: error: out of date: README.md (run `reslm report`)"]
    path.write_text(path.read_text().replace(README_BEGIN, ""))
    assert main(["report", "--repo", str(repo)]) == 2
    assert "has no <!-- results:begin -->" in capsys.readouterr().err


def test_frontier_page_ranks_runs_and_names_the_best_strict_one(built):
    """docs/frontier.md: every whole-shard character run ranked by validation CE (runs with a split, within
    their split) and then by test CE, the strict-rules verdict per run (a transformer never qualifies), the
    best strict single run named, the Kneser-Ney reference from data."""
    from reslm.report.frontier import SPLIT_RANK
    outputs, figs = built
    page = outputs["docs/frontier.md"]
    points = figs["frontier"]
    with_val = [p for p in points if p.get("val_loss") is not None]
    ranks = [(SPLIT_RANK[p["val_split"]], p["val_loss"]) for p in with_val]   # within a split, by validation CE
    assert points[:len(with_val)] == with_val and ranks == sorted(ranks)
    rest = points[len(with_val):]
    assert [p["test_loss"] for p in rest] == sorted(p["test_loss"] for p in rest)
    strict = [p for p in points if p["strict"] and p["trainable_params"] <= 155_459]
    best = next(p for p in strict if p["finished"])   # the ranking's first: on validation
    assert f"Best single strict reservoir-family run: [{best['name']}]" in page
    lowest = min(strict, key=lambda p: p["test_loss"])   # named apart, as the best-of-many figure it is
    assert lowest is best or f"The lowest test CE of the {len(strict)} strict runs, [{lowest['name']}]" in page
    assert all(not p["strict"] for p in points if p["family"] in ("tf", "rnn"))
    assert "Kneser-Ney character 10-gram" in page and "results/kneser-ney.json" in page


def test_seed_groups_give_mean_and_spread_of_one_configuration_over_seeds():
    """Runs of one configuration at several seeds become one row: mean and sample standard deviation of
    the validation CE, the final test CE and the test CE at the best validation CE; a configuration at one
    seed, or an unfinished run, is no group."""
    from reslm.report.frontier import seed_groups

    def point(name, config, seed, test, val=None, at_best=None, finished=True):
        return dict(name=name, config=config, seed=seed, test_loss=test, val_loss=val, test_at_best_val=at_best,
                    folder=f"results/{name}", finished=finished, family="rc", strict=True, trainable_params=100,
                    route=[])

    groups = seed_groups([point("a", "A", 0, 1.60, 1.50, 1.59), point("a-s1", "A", 1, 1.64, 1.52, 1.62),
                          point("a-s2", "A", 2, 1.62, 1.51, 1.61, finished=False),
                          point("b", "B", 0, 1.70), point("b-s1", "B", 1, 1.80), point("c", "C", 0, 1.0)])
    assert [[r["name"] for r in g["runs"]] for g in groups] == [["a", "a-s1"], ["b", "b-s1"]]   # val first
    mean, sd, lo, hi = groups[0]["test"]
    assert mean == pytest.approx(1.62) and sd == pytest.approx(0.04 / 2 ** 0.5) and (lo, hi) == (1.60, 1.64)
    assert groups[0]["val"][0] == pytest.approx(1.51) and groups[0]["test_at_best_val"][0] == pytest.approx(1.605)
    assert groups[1]["val"] is None and groups[1]["test"][0] == pytest.approx(1.75)
    # validation CEs compare within a split only: whole file groups rank before the shard tails
    tails = [dict(point("t", "T", s, 1.60, 1.40), val_split="tails") for s in (0, 1)]
    plays = [dict(point("g", "G", s, 1.61, 1.55), val_split="groups") for s in (0, 1)]
    assert [g["runs"][0]["name"] for g in seed_groups(tails + plays)] == ["g", "t"]


def test_the_reservoir_and_the_ceiling_are_read_on_both_metrics():
    """Each seed group carries its test CE on the paper's windows and with the state carried, a mean only
    where every seed was scored on it; the page names the strict configuration and the trained ceiling that
    validation chooses on both metrics, and the gap between them on each."""
    from reslm.report.frontier import frontier_md, seed_groups

    def runs(config, family, vals, window, stream):
        return [dict(name=f"{config}-s{s}", config=config, base_config=config, seed=s, test_loss=stream[s],
                     val_loss=v, test_at_best_val=None, test_window=window[s], test_stream=stream[s],
                     folder=f"results/{config}-s{s}", finished=True, family=family, strict=family == "rc",
                     trainable_params=155_000, route=["stream context"], val_split="groups", cycle=2)
                for s, v in enumerate(vals)]

    points = (runs("esn", "rc", [1.60, 1.62, 1.61], [1.59, 1.61, 1.60], [1.58, 1.60, 1.59])
              + runs("half", "rc", [1.63, 1.64, 1.65], [1.57, None, 1.58], [1.57, 1.59, 1.58])
              + runs("two", "rc", [1.50, 1.51], [1.50, 1.51], [1.50, 1.51])   # lower, at two seeds of three
              + runs("gru", "rnn", [1.53, 1.55, 1.54], [1.49, 1.51, 1.50], [1.46, 1.48, 1.47]))
    groups = {g["runs"][0]["config"]: g for g in seed_groups(points)}
    assert groups["esn"]["test_window"][0] == pytest.approx(1.60) and groups["half"]["test_window"] is None
    page = frontier_md(points, None, None)
    assert ("[esn-s0](../results/esn-s0) and its other seeds, 155,000 trainable parameters: 1.6000 ± 0.0100 nats "
            "test CE on the paper's 32-character windows, 1.5900 ± 0.0100 nats test CE with the state carried") in page
    assert "(mean ± sd over 3 seeds; the lowest mean validation CE of the configurations at 3 seeds or more)" in page
    assert "ceiling of the same size on validation: [gru-s0](../results/gru-s0) and its other seeds" in page
    assert "gap to it: 0.1000 nats on the paper's 32-character windows and 0.1200 nats with the state" in page
    row = next(line for line in page.splitlines() if line.startswith("| half-s0 |") and "[1](" in line)
    assert "| - | 1.5800 ± 0.0100 |" in row   # windows: two seeds of three scored
    assert "| state carried |" in next(line for line in page.splitlines() if line.startswith("| esn-s1 |"))


def test_a_configuration_level_on_validation_with_the_best_is_named_beside_it():
    """The best configuration on validation names each other configuration of its split whose mean
    validation CE is within one standard error of the mean of its own, with that one's test CE."""
    from reslm.report.frontier import _level_on_validation, seed_groups

    def runs(config, vals, test, split="groups"):
        return [dict(name=f"{config}-s{s}", config=config, seed=s, test_loss=test + s / 1000, val_loss=v,
                     test_at_best_val=test, folder=f"results/{config}-s{s}", finished=True, family="rc", strict=True,
                     trainable_params=155_000, route=[], val_split=split) for s, v in enumerate(vals)]

    groups = seed_groups(runs("top", [1.630, 1.634], 1.59) + runs("tie", [1.631, 1.634], 1.60)
                         + runs("far", [1.650, 1.652], 1.58) + runs("other", [1.6315, 1.6345], 1.57, "tails"))
    top = groups[0]
    assert top["runs"][0]["config"] == "top"
    text = "\n".join(_level_on_validation(top, groups))
    assert "| [tie-s0](../results/tie-s0) | 2 | 1.6325 | +0.00050 |" in text
    assert text.splitlines()[-1].endswith("| 1.6005 ± 0.0007 |")   # test: 1.600 and 1.601
    assert "far-s0" not in text and "other-s0" not in text   # 0.019 apart; another split
    assert _level_on_validation(groups[1], [groups[1]]) == []


def test_the_chosen_configuration_trained_on_the_whole_text_is_reported_as_its_refit():
    """Runs of a configuration compared on held-out plays, without the split (the same configuration less
    its validation fields), are its refit, marked so in the selection column; the chosen configuration's
    refit is named under it with its mean test CE. A configuration never validated stays *test*."""
    from reslm.report.frontier import frontier_md

    def runs(config, vals, test, base=None):
        return [dict(name=f"{config}-s{s}", config=config, base_config=base or config, seed=s, test_loss=test + s / 1000,
                     val_loss=v, test_at_best_val=None, folder=f"results/{config}-s{s}", finished=True, family="rc",
                     strict=True, trainable_params=155_000, route=["cycles=2"], val_split=v and "groups", cycle=2)
                for s, v in enumerate(vals)]

    points = (runs("chosen", [1.630, 1.634, 1.632], 1.60, base="B") + runs("other", [1.650, 1.652, 1.651], 1.58, base="O")
              + runs("refit", [None, None], 1.59, base="B") + runs("legacy", [None], 1.55, base="L")
              + runs("other-refit", [None], 1.57, base="O"))
    page = frontier_md(points, None, None)
    assert "[chosen-s0](../results/chosen-s0) and its other seeds" in page
    assert "[refit-s0](../results/refit-s0) and its other seeds at **1.5905 ± 0.0007** nats" in page
    rows = {line.split(" | ")[0][2:]: line for line in page.splitlines() if line.startswith("| ") and "-s" in line}
    assert "| refit of validation (groups) |" in rows["refit-s0"] and "| *test* |" in rows["legacy-s0"]
    assert "| validation (groups) |" in rows["chosen-s0"] and "| refit of validation (groups) |" in rows["other-refit-s0"]
    assert "other-refit-s0](" not in page.split("## Over seeds")[0]


def test_report_refuses_a_folder_without_results(tmp_path, capsys):
    assert main(["report", "--repo", str(tmp_path / "nowhere")]) == 2
    assert "has no results/ folder" in capsys.readouterr().err
    assert not (tmp_path / "nowhere").exists()


def test_a_published_solver_run_is_on_the_frontier(repo, chars, tmp_path):
    """A ridge (or lbfgs) run logs one evaluation with no cycle or shard: the frontier lists it as one
    pass over the shards instead of failing on the missing keys."""
    run = tt.create_run(tmp_path / "runs" / "ridge", "rc", dict(size=24, context_mode="stream"),
                        dict(PAPER, optimizer="ridge"), chars)
    tt.train(run, progress=False)
    publish(run, repo / "results" / "rc-24-ridge", date="2026-01-01T00:00:00+00:00")
    assert main(["report", "--repo", str(repo)]) == 0
    row = next(line for line in (repo / "docs" / "frontier.md").read_text().splitlines()
               if line.startswith("| rc-24-ridge |"))
    assert "| yes |" in row and "optimizer=ridge" in row and "| 1 |" in row


def test_a_configuration_is_the_same_across_fields_added_since(checkout):
    """Seeds of one configuration group together even when one was trained after a model or training
    field was added (its config.json names the field at its default; the older ones do not)."""
    import json
    from reslm.report.frontier import frontier_points
    names = ["rc-750-mlp2-160-authors-cos3e-3-ema-val", "rc-750-mlp2-160-authors-cos3e-3-ema-val-s2"]
    models = [json.loads((REPO / "results" / n / "config.json").read_text())["model"] for n in names]
    assert "readout_dim" not in models[0] and models[1]["readout_dim"] == 0   # seed 2 came after --readout-dim
    points = {p["name"]: p for p in frontier_points(REPO, [])}
    assert points[names[0]]["config"] == points[names[1]]["config"]


def test_test_ce_at_best_val_is_a_whole_shard_figure():
    """The frontier's *test CE at best val*: the kept weights' whole-shard score when a run kept them, the
    evaluation's own score when it covered the whole shard, and no figure when it scored a sample."""
    from reslm.report.frontier import _test_at_best_val
    evals = [dict(step=10, test_loss=2.0, test_samples=65536), dict(step=20, test_loss=1.9, test_samples=1_000_000)]
    kept = dict(weights="best-val", weights_test_loss=1.85, best_val_step=10, test_loss_at_best_val=2.0)
    assert _test_at_best_val(kept, evals) == 1.85
    assert _test_at_best_val(dict(best_val_step=10, test_loss_at_best_val=2.0), evals) is None      # on a sample
    assert _test_at_best_val(dict(best_val_step=20, test_loss_at_best_val=1.9), evals) == 1.9
    assert _test_at_best_val({}, evals) is None                                                    # no split


def test_an_unfinished_runs_sampled_ce_is_labelled():
    """The results table's bits cell of an unfinished run names the shard it reached, and says so when its
    per-shard CE scored a sample of the test shard rather than all of it."""
    from reslm.report.docs import _bits
    row = dict(bits=3.125, shards=[2.4, 2.3, None], partial=True)
    assert _bits(row) == "3.125 after shard 2"
    assert _bits({**row, "sampled": True}) == "3.125 after shard 2, sampled"
    assert _bits({**row, "partial": False, "sampled": True}) == "3.125"     # finished: the whole shard


def test_a_run_that_scores_test_at_shard_ends_is_read_where_its_last_evaluation_did_not(chars, tmp_path):
    """test_every shard: an unfinished run's last evaluation may have no test CE; the results rows and the
    frontier read the last one that has (a shard's end), and its validation beside it."""
    from reslm.report.frontier import frontier_points
    from reslm.report.rows import published_rows
    from reslm.run import read_metrics
    train = dict(batch_size=64, epochs_per_shard=2, epoch_samples=128, lr=3e-3, val_fraction=0.2,
                 test_every="shard")
    run = tt.create_run(tmp_path / "runs" / "r", "rc", dict(size=24, context_mode="stream"), train, chars)
    tt.train(run, progress=False, stop_at=6)   # shard 0's two epochs, then shard 1's first: no test there
    publish(run, tmp_path / "results" / "r", date="2026-01-01T00:00:00+00:00")
    evals = [r for r in read_metrics(run) if r["kind"] == "eval"]
    assert "test_loss" not in evals[-1] and "test_loss" in evals[-2]
    paper, other = published_rows(tmp_path)
    assert [r["loss"] for r in paper + other] == [evals[-2]["test_loss"]]
    point = next(p for p in frontier_points(tmp_path, []) if p["name"] == "r")
    assert (point["test_loss"], point["val_loss"]) == (evals[-2]["test_loss"], evals[-2]["val_loss"])


def test_the_readme_takes_one_row_per_preset_at_the_papers_protocol():
    """preset_rows: per preset of the paper's families, its one-pass row in window context, or in stream context
    where the family's stream figures equal its window figures within STREAM_TOLERANCE wherever both were
    measured; a finished run with weights first (window before stream), then one without weights (legacy),
    then an unfinished one; variants, other contexts and other cycles never. ceiling_rows: the finished rnn
    runs, one per preset."""
    from reslm.report.rows import STREAM_TOLERANCE, ceiling_rows, preset_rows, stream_stands_for_window

    def row(name, family, context, last, weights=None, cycle=1, done=5, finished=True, variant=False):
        shards = [2.0] * (done - 1) + [last] + [None] * (5 - done)
        return dict(name=name, family=family, context=context, cycle=cycle, shards=shards, weights=weights,
                    partial=done < 5, finished=finished, variant=variant, trainable=1, paper="Fig. 2 only")

    rows = [row("rc-250", "rc", "window", 2.1953), row("rc-250", "rc", "stream", 2.1954, "results/rc-250-stream"),
            row("rc-1750", "rc", "window", 1.8838),
            row("rc-1750", "rc", "stream", 1.95, "results/rc-1750-s", done=2, finished=False),
            row("aerc-160-30", "aerc", "window", 1.7992),
            row("aerc-160-30", "aerc", "stream", 1.7434, "results/a-s", cycle=3),
            row("aerc-160-30", "aerc", "stream", 1.70, "results/a-variant", variant=True),
            row("tf-64-4-4", "tf", "causal", 2.1786, "results/tf-c"),
            row("tf-64-4-4", "tf", "window", 2.032, "results/tf-w"),
            row("tf-72-8-8", "tf", "window", 2.25, "results/tf72-w", done=1, finished=False),
            row("rnn-gru-32-200", "rnn", "stream", 1.6439, "results/gru"),
            row("rnn-lstm-32-173", "rnn", "stream", 1.70, "results/lstm", done=3, finished=False)]
    assert stream_stands_for_window(rows) == {"rc"}   # aerc: no preset measured in both at one pass; tf: none
    chosen = {r["name"]: (r["context"], r["weights"]) for r in preset_rows(rows)}
    assert chosen == {"rc-250": ("stream", "results/rc-250-stream"), "rc-1750": ("window", None),
                      "aerc-160-30": ("window", None), "tf-64-4-4": ("window", "results/tf-w"),
                      "tf-72-8-8": ("window", "results/tf72-w")}
    assert [r["name"] for r in preset_rows(rows)] == ["rc-250", "rc-1750", "aerc-160-30", "tf-64-4-4", "tf-72-8-8"]
    assert [r["weights"] for r in ceiling_rows(rows)] == ["results/gru"]
    # a stream figure off its window figure by more than the tolerance: the family's window rows stand
    apart = [row("rc-250", "rc", "window", 2.1953),
             row("rc-250", "rc", "stream", 2.1953 + 2 * STREAM_TOLERANCE, "results/s")]
    assert stream_stands_for_window(apart) == set()
    assert [(r["context"], r["weights"]) for r in preset_rows(apart)] == [("window", None)]


def test_the_ordering_page_orders_a_size_only_when_its_three_rows_are_final():
    """docs/ordering.md: at each Table 1 size the RC, AERC and TF rows the README shows, their order where all
    three are final; a row still training gives its latest whole-test-shard CE and how far it has got, and its
    size stays open; the largest size is set against the paper's numbers."""
    from reslm.report.ordering import ordering_md, sizes, table1

    def row(name, family, last, done=5, finished=True, loss=None, steps=None):
        shards = [2.5] * (done - 1) + [last] * (done > 0) + [None] * (5 - done)
        return dict(name=name, family=family, context="window", cycle=1, shards=shards, weights="results/x",
                    partial=done < 5, finished=finished, variant=False, trainable=1000, paper="Fig. 2 only",
                    loss=loss, steps=steps)

    assert table1()[0] == {"rc": "rc-250", "aerc": "aerc-75-13", "tf": "tf-64-4-4"} and len(table1()) == 5
    rows = [row("rc-250", "rc", 2.1953), row("aerc-75-13", "aerc", 1.9944), row("tf-64-4-4", "tf", 2.0320),
            row("rc-2600", "rc", 1.8426), row("aerc-160-30", "aerc", 1.7992),
            row("tf-256-16-16", "tf", 2.30, done=0, finished=False, loss=2.2279, steps=4349)]
    first, *_, last = sizes(rows)
    assert first["order"] == ["aerc", "tf", "rc"] and last["order"] is None
    assert last["states"]["tf"][1] == dict(ce=2.2279, final=False, where="training: 0 of 5 shards done, step 4,349",
                                           fell=None)
    page = ordering_md(rows)
    assert "| AERC < TF < RC |" in page and "open (TF not final)" in page and "open (RC, AERC, TF not final)" in page
    assert "rc-2600: 1.8426 against the paper's 1.81, +0.033 nats" in page
    assert "tf-256-16-16: still training (0 of 5 shards done, step 4,349; latest 2.2279); the paper: 1.67" in page
    assert "Sizes with all three rows final: 1 of 5; the transformer is lowest at none of them" in page
    # each pair in the paper's order (TF < AERC < RC), over the sizes where both of its rows are final
    assert ("Pair by pair, in the paper's order, over the sizes where both rows are final: TF below AERC at 0 of 1; "
            "TF below RC at 1 of 1; AERC below RC at 2 of 2.") in page
    assert "Closer than" not in page
    # how far each family's final rows still fell over the last shard (after shard 4 against after shard 5)
    assert ("over its last shard (test CE after shard 4 against after shard 5) the final rows' test CE fell, RC by "
            "0.305 to 0.657 nats (2 of 5 sizes); AERC by 0.506 to 0.701 nats (2 of 5 sizes); TF by 0.468 nats "
            "(1 of 5 sizes).") in page
    # two final rows closer than TIE: marked ≈ and named, still counted by their CE
    rows += [row("rc-1750", "rc", 1.8838), row("aerc-150-25", "aerc", 1.8151), row("tf-356-8-8", "tf", 1.8836)]
    page = ordering_md(rows)
    assert "| AERC < TF ≈ RC |" in page and "size 4, TF and RC (0.0002 apart)" in page
    assert "TF below RC at 2 of 2" in page


def test_the_ordering_page_gives_each_pass_and_the_seed_spread():
    """Issue 88: past one pass, a table per pass from each preset's longest run (its end-of-pass figures; a pass
    still training shows its latest), a sentence per size saying from which pass the paper's order holds, and
    the seed spread of a preset measured at several seeds."""
    from reslm.report.ordering import ordering_md, pass_table

    def evals(ends: list[list[float]], shards=5, epochs=5):
        """eval rows: for each pass, the test CE after each shard (its last epoch), in order."""
        out, index = [], 0
        for c, per_shard in enumerate(ends):
            for s, ce in enumerate(per_shard):
                out.append(dict(index=index, cycle=c, shard=s, epoch=epochs - 1, test_loss=ce))
                index += epochs
        return out

    def row(name, family, last, *, cycles=1, passes=None, seed=0, weights="results/x", finished=True):
        shards = [2.5] * 4 + [last]
        r = dict(name=name, family=family, context="window", cycle=1, shards=shards, weights=weights,
                 partial=False, finished=finished, variant=bool(seed), seed_only=bool(seed), seed=seed,
                 trainable=1000, paper="Fig. 2 only", loss=None, steps=1000, cycles=cycles,
                 epochs=evals([shards]))
        if passes:
            r.update(cycle=len(passes), epochs=evals(passes), shards=passes[-1] + [None] * (5 - len(passes[-1])),
                     partial=len(passes[-1]) < 5)
        return r

    one = [row("rc-2600", "rc", 1.8426), row("aerc-160-30", "aerc", 1.7992), row("tf-256-16-16", "tf", 1.8425),
           row("tf-64-4-4", "tf", 2.0320), row("tf-64-4-4", "tf", 2.0420, seed=1), row("tf-64-4-4", "tf", 2.0220, seed=2)]
    assert "## Past one pass" not in ordering_md(one)
    assert "tf-64-4-4 2.0320 ± 0.0100 nats (2.932 ± 0.014 bits/char) over seeds 0, 1, 2" in ordering_md(one)
    longer = [row("rc-2600", "rc", 0, cycles=3, passes=[[1.9] * 4 + [1.8426], [1.82] * 5, [1.81] * 5],
                  weights="results/rc3"),
              row("aerc-160-30", "aerc", 0, cycles=3, passes=[[1.9] * 4 + [1.7992], [1.762] * 5, [1.7434] * 5],
                  weights="results/a3"),
              row("tf-256-16-16", "tf", 0, cycles=3, passes=[[1.9] * 4 + [1.8425], [1.74] * 5, [1.70, 1.69]],
                  weights="results/t3", finished=False)]
    most, table = pass_table(one + longer)
    assert most == 3 and table[-1]["tf"][1] == {1: (1.8425, True), 2: (1.74, True), 3: (1.69, False)}
    page = ordering_md(one + longer)
    assert "| 5 | rc-2600: 1.8200 (2.626) | aerc-160-30: 1.7620 (2.542) | tf-256-16-16: 1.7400 (2.510) | " \
           "TF < AERC < RC |" in page
    assert "tf-256-16-16: 1.6900 (2.438), training (step 1,000)" in page
    assert ("- Size 5: after pass 2, TF < AERC < RC; the paper's order (TF < AERC < RC) holds from pass 2 on; "
            "pass 3 not complete for every family.") in page
    assert "- Size 1: no pass has all three rows final yet." in page


def test_the_ordering_page_says_whether_a_continued_row_may_stand_for_one_trained_through():
    """Plan continue-check (issue 88): at each seed the two-cycle tf-64-4-4 trained through beside the one
    continued with a fresh optimiser state; a continued row enters the pass tables only once every continued
    run lands within one seed standard deviation of the trained-through runs, at two seeds or more."""
    from reslm.report.ordering import ordering_md
    from reslm.report.rows import continuation_verdict, multi_pass_rows

    def row(loss, seed, continued, name="tf-64-4-4", cycles=2):
        return dict(name=name, family="tf", context="window", cycle=cycles, shards=[loss] * 5, weights="results/x",
                    partial=False, finished=True, variant=bool(seed), seed_only=bool(seed), seed=seed, loss=loss,
                    steps=1000, cycles=cycles, continued=continued, trainable=1000, paper="Fig. 2 only",
                    epochs=[dict(index=i, cycle=c, shard=4, epoch=4, test_loss=loss) for i, c in enumerate(range(cycles))])

    assert "Not measured yet: `reslm frontier run continue-check`" in ordering_md([])
    half = [row(1.98, 1, False), row(1.985, 1, True)]
    assert continuation_verdict(half) == (None, None)
    assert "| 1 | 1.9800 (2.857) | 1.9850 (2.864) | +0.0050 |" in ordering_md(half)
    both = half + [row(2.00, 2, False), row(1.999, 2, True)]
    ok, spread = continuation_verdict(both)
    assert ok is True and abs(spread - 0.02 / 2**0.5) < 1e-12
    assert "Every continued run lands within it" in ordering_md(both)
    assert continuation_verdict(half + [row(2.00, 2, False), row(2.03, 2, True)])[0] is False
    # a continued seed-0 row of a larger preset: in the pass tables only once continuation is shown harmless
    big = row(1.70, 0, True, name="tf-256-16-16", cycles=3)
    assert "tf-256-16-16" not in multi_pass_rows(half + [big])
    assert multi_pass_rows(both + [big])["tf-256-16-16"] is big


def test_the_authors_recipe_is_set_beside_reslms_protocol_at_as_many_training_windows():
    """Issue 88: each epoch of the authors' recipe beside the protocol run's evaluations either side of as many
    training windows; an epoch past the protocol's last evaluation has "-" after it."""
    from reslm.report.gap import equal_samples
    ours = [(1000, 2.2), (2000, 2.1), (3000, 2.0)]
    lines = equal_samples([(1500, 2.15), (3000, 2.05), (4500, 1.99)], ours, 5)
    assert lines[0] == "| epoch 1 of 5 | 1,500 | 2.1500 (3.102) | 2.2000 (3.174) at 1,000 | 2.1000 (3.030) at 2,000 |"
    assert lines[1].endswith("| 2.0000 (2.885) at 3,000 | 2.0000 (2.885) at 3,000 |")
    assert lines[2].startswith("| epoch 3 of 5 |") and lines[2].endswith("at 3,000 | - |")


def test_a_cross_scoring_says_how_much_of_the_other_test_shard_the_run_trained_on(tmp_path):
    """The share of another dataset's test shard inside a run's training text comes from its eval-on-NAME.json
    (scored_on), not from a figure written into the report."""
    import json
    from reslm.report.gap import _cross
    (tmp_path / "eval-on-shakespeare.json").write_text(json.dumps(
        {"test_loss": 1.9, "scored_on": {"test_span": [1000, 2000], "trained_chars_in_test": 370}}))
    (tmp_path / "eval-on-other.json").write_text(json.dumps(
        {"test_loss": 1.8, "scored_on": {"test_span": [0, 10], "trained_chars_in_test": 0}}))
    assert _cross(tmp_path, "shakespeare") == (1.9, " (its training text holds 37% of it)", 370, 1000)
    assert _cross(tmp_path, "other") == (1.8, "", 0, 10)
    assert _cross(tmp_path, "missing") == (None, "", 0, 0) and _cross(None, "shakespeare") == (None, "", 0, 0)


def test_the_finished_authors_recipe_is_measured_against_reslms_row_and_the_paper():
    from reslm.report.gap import verdict
    text = verdict(1.85, 1.84, 1.8473, 1.8425)
    assert "+0.0100 nats from reslm's one-pass row on the authors' own test slice" in text
    assert "+0.0048 on reslm's test shard" in text and "1.67 lies 0.1800 nats below" in text
    assert "test shard" not in verdict(1.85, 1.84, None, 1.8425).split(";")[0].split("slice")[1]
    assert "does not come from" in text and "lies in where their script differs" in verdict(1.80, 1.84, None, None)
