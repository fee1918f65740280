"""Issue 32.6-7: a published run as a newcomer meets it. `reslm eval results/NAME` scores the figure the
README shows (the whole test text) and says what it scored, leaves the folder as it is, names the one
command that prepares a missing dataset; loading a run rebuilds its reservoir from the recorded radius
(no eigendecomposition), bit for bit. Tiny rc runs on the shared corpus."""
import json
import shutil

import pytest

import reslm.reservoir.matrices as mats
import reslm.train as tt
from reslm.cli import main
from reslm.core import radii
from reslm.data.datasets import prepare_command
from reslm.models.load import load_run
from reslm.publish import publish
from reslm.run.registry import MANIFEST

MODEL = dict(size=24, context_mode="stream")          # as the published runs: the whole test shard is scored
TRAIN = dict(batch_size=64, lr=3e-3, epochs_per_shard=1, epoch_samples=128, log_every=1, eval_samples=0)
DATE = "2026-01-01T00:00:00+00:00"


@pytest.fixture(scope="module")
def pub(chars, tmp_path_factory):
    base = tmp_path_factory.mktemp("newcomer")
    run = tt.create_run(base / "run", "rc", MODEL, TRAIN, chars)
    tt.train(run, progress=False)
    publish(run, base / "results" / "rc", date=DATE)
    return base / "results" / "rc", run


@pytest.fixture
def clone(pub, chars, tmp_path, monkeypatch):
    folder = tmp_path / "results" / "rc"
    shutil.copytree(pub[0], folder)
    monkeypatch.setenv("RESLM_DATA", str(chars.path.parent))
    return folder


def test_eval_scores_the_whole_test_text_by_default_and_says_so(clone, pub, capsys):
    before = {p.name: p.read_bytes() for p in clone.iterdir()}
    assert main(["eval", str(clone), "--length", "20", "--ngrams", "3"]) == 0
    out, err = capsys.readouterr()
    assert "(the whole test text)" in out and "not written" in err
    last = [json.loads(r) for r in (clone / "metrics.jsonl").read_text().splitlines()]
    final = [r for r in last if r.get("kind") == "eval"][-1]["test_loss"]
    assert f"test CE {final:.4f}" in out                   # the figure the report's table shows
    assert {p.name: p.read_bytes() for p in clone.iterdir()} == before
    assert main(["eval", str(clone), "--length", "20", "--ngrams", "3", "--score", "300"]) == 0
    assert "start of the test text only; --score 0" in capsys.readouterr().out


def test_a_missing_dataset_names_the_command_that_makes_it(clone, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RESLM_DATA", str(tmp_path / "empty"))
    assert main(["eval", str(clone), "--length", "20", "--ngrams", "3"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "dataset tiny is not at" in line and "RESLM_DATA" in line
    assert prepare_command("shakespeare") == "reslm data shakespeare"
    assert "--tokenizer bpe:4096" in prepare_command("shakespeare-bpe4096")


def _no_eig(monkeypatch):
    def refuse(w):
        raise AssertionError("an eigendecomposition at load")
    monkeypatch.setitem(mats.RADIUS_NORMS, "spectral", refuse)
    monkeypatch.setattr(radii, "_RADII", {})


@pytest.mark.parametrize("where", ["published", "run"])
def test_loading_uses_the_recorded_radius_bit_for_bit(pub, clone, monkeypatch, where):
    """The manifest (published) or the checkpoint (a run folder) records the radius: loading computes no
    eigendecomposition and gives the very matrix (the published fingerprint is checked)."""
    folder = clone if where == "published" else pub[1]
    want = load_run(folder)[0].state_dict()
    _no_eig(monkeypatch)
    got = load_run(folder)[0].state_dict()
    assert all(got[k].equal(want[k]) for k in want)


def test_a_wrong_recorded_radius_is_refused(clone, monkeypatch, capsys):
    m = json.loads((clone / MANIFEST).read_text())
    assert m["radii"]
    m["radii"] = {k: v * 1.01 for k, v in m["radii"].items()}
    (clone / MANIFEST).write_text(json.dumps(m))
    monkeypatch.setattr(radii, "_RADII", {})
    assert main(["eval", str(clone), "--length", "20", "--ngrams", "3"]) == 2
    assert "does not match its fingerprint" in capsys.readouterr().err


@pytest.mark.parametrize("bad", [{"x": 1.0}, {'["spectral", "esn", 24, 0.1, 0]': -1.0},
                                 {'["spectral", "esn", 24, 0.1, 0]': "1"}, [1.0]])
def test_wrongly_typed_radii_are_one_line(clone, monkeypatch, capsys, bad):
    m = json.loads((clone / MANIFEST).read_text())
    m["radii"] = bad
    (clone / MANIFEST).write_text(json.dumps(m))
    assert main(["generate", str(clone), "--prompt", "to", "--length", "5"]) == 2
    err = capsys.readouterr().err
    assert "radii" in err and "Traceback" not in err
