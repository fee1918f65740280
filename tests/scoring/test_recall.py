"""`reslm recall` (reslm/scoring/recall.py): linear decoders of the character k steps back from a reservoir's
features. A known answer (NVAR holds exactly its last k inputs: on text of independent characters it
recalls lags 0..k-1 and nothing before), the same figures twice, runs and plan configurations side by
side, and the command's output and one-line errors. Tiny corpora made here."""
import json
import random

import pytest
import torch

from reslm import train as tt
from reslm.cli import main
from reslm.core.errors import ReslmError
from reslm.data import prepare_text
from reslm.scoring.recall import check_model, recall_profile, run_item
from reslm.recording import export_drive, import_states, simulate
from reslm.core.linear import RidgeAccumulator

FIT, SCORE = 2_000, 2_000
TINY = dict(batch_size=64, epochs_per_shard=1, epoch_samples=128, lr=3e-3, device="cpu", precision="fp32")
NVAR3 = dict(reservoir="nvar", reservoir_options="k=3", embed_dim=8, size=325, input_scaling=1.0, streams=4)


@pytest.fixture(scope="module")
def iid(tmp_path_factory):
    """Six shards of 5,000 independent, uniformly drawn letters of ten."""
    root = tmp_path_factory.mktemp("iid")
    rng = random.Random(0)
    (root / "a.txt").write_text("".join(rng.choice("abcdefghij") for _ in range(30_000)))
    return prepare_text([root / "a.txt"], root, name="iid", verbose=False)


@pytest.fixture(scope="module")
def runs(iid, tmp_path_factory):
    root = tmp_path_factory.mktemp("recall-runs")
    made = {name: tt.create_run(root / name, family, model, TINY, iid)
            for name, family, model in (("nvar", "rc", NVAR3), ("esn", "rc", dict(size=40, streams=4)),
                                        ("gru", "rnn", dict(cell="gru", embed_dim=8, hidden=16, context_mode="stream")),
                                        ("tf", "tf", dict(ff_dim=16, n_heads=2, n_layers=1, context=8)))}
    tt.train(made["gru"], progress=False)   # a recurrent network's state is read with its trained weights
    return made


def test_nvar_recalls_exactly_the_inputs_it_holds(runs):
    r = recall_profile([run_item(runs["nvar"])], max_lag=6, fit=FIT, score=SCORE, progress=False)
    row = r["runs"][0]
    recall = [x["recall"] for x in row["lags"]]
    assert [x["lag"] for x in row["lags"]] == list(range(7))
    assert min(recall[:3]) > 0.95, recall        # lags 0-2: in the state
    assert max(recall[3:]) < 0.05, recall        # lags 3-6: independent of what it holds
    assert row["capacity"] == pytest.approx(sum(recall[1:]))
    assert 1.9 < row["capacity"] < 2.2
    assert 0.08 < row["majority"] < 0.15 and row["features"] == 325 and row["reservoir"] == "nvar"


def test_the_figures_repeat_and_runs_share_the_text(runs):
    items = [run_item(runs["esn"]), run_item(runs["nvar"])]
    r = recall_profile(items, max_lag=4, fit=FIT, score=SCORE, progress=False)
    assert [x["name"] for x in r["runs"]] == [str(runs["esn"]), str(runs["nvar"])]
    assert r["runs"][0]["scored"] == r["runs"][1]["scored"]
    assert recall_profile(items, max_lag=4, fit=FIT, score=SCORE, progress=False) == r


def test_a_trained_gru_is_read_from_its_hidden_state(runs):
    r = recall_profile([run_item(runs["gru"])], max_lag=3, fit=FIT, score=SCORE, progress=False)["runs"][0]
    assert (r["family"], r["reservoir"], r["size"], r["features"]) == ("rnn", "gru", 16, 16)
    assert r["lags"][0]["recall"] > 0.5 and r["scored"] > 900


def test_a_recorded_device_is_read_like_the_substrate_it_recorded(iid, tmp_path):
    """A device's recording (here an ESN played through `reslm substrate`'s drive) gives the recall of
    the same ESN computed in process, one stream per shard as the device plays it."""
    export_drive(iid, tmp_path / "drive", embed_dim=16, seed=0)
    simulate(tmp_path / "drive", tmp_path / "states.npy", reservoir="esn", size=40)
    import_states(tmp_path / "states.npy", tmp_path / "drive", tmp_path / "sub")
    ref = tt.create_run(tmp_path / "ref", "rc", dict(size=40, streams=1), TINY, iid)
    rec = tt.create_run(tmp_path / "rec", "rc", dict(reservoir="recorded", reservoir_options=f"path={tmp_path / 'sub'}"),
                        TINY, iid)
    a, b = (recall_profile([run_item(r)], max_lag=4, fit=FIT, score=SCORE, progress=False)["runs"][0]
            for r in (ref, rec))
    assert b["reservoir"] == "recorded" and b["size"] == 40
    assert [x["accuracy"] for x in a["lags"]] == [x["accuracy"] for x in b["lags"]]
    assert a["capacity"] == b["capacity"] > 0.5


def test_an_untrained_recurrent_network_is_refused():
    with pytest.raises(ReslmError, match="p:gru: a recurrent network's state is read from a trained run"):
        check_model("p:gru", dict(family="rnn", data=dict(kind="chars")), None)
    check_model("p:esn", dict(family="rc", data=dict(kind="chars")), None)


def test_several_targets_per_sample_are_separate_decoders():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(300, 5, generator=g), torch.randint(0, 4, (300, 2), generator=g)
    both = RidgeAccumulator(5, 8).add(x, y + torch.tensor([0, 4]))
    one, two = RidgeAccumulator(5, 4).add(x, y[:, 0]), RidgeAccumulator(5, 4).add(x, y[:, 1])
    torch.testing.assert_close(both.G, one.G)
    torch.testing.assert_close(both.Ct, torch.cat([one.Ct, two.Ct]))
    torch.testing.assert_close(both.solve(1e-3), torch.cat([one.solve(1e-3), two.solve(1e-3)], dim=1))


def test_the_command_reads_runs_and_a_plans_configurations(runs, iid, tmp_path, capsys):
    plan = tmp_path / "p.toml"
    plan.write_text('[plan]\nabout = "t"\n\n[base]\nfamily = "rc"\ndata = "iid"\nmodel = { size = 40, streams = 4 }\n'
                    'train = { batch_size = 64, val_fraction = 0.2 }\n\n[[candidate]]\nlabel = "nvar3"\nmodel = { reservoir = "nvar", '
                    'reservoir_options = "k=3", embed_dim = 8, size = 325, input_scaling = 1.0 }\n')
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    assert main(["recall", str(runs["esn"]), "--plan", str(plan), "--only", "nvar3", "--root", str(iid.path.parent),
                 "--max-lag", "4", "--fit", str(FIT), "--score", str(SCORE), "--out", str(out), "--plot", str(png),
                 "--no-progress", "--threads", "1"]) == 0
    text = capsys.readouterr().out
    assert "linear recall of the character k steps back" in text and "p:nvar3" in text
    result = json.loads(out.read_text())
    assert [r["name"] for r in result["runs"]] == [str(runs["esn"]), "p:nvar3"]
    assert result["runs"][1]["capacity"] > 1.9
    assert png.read_bytes().startswith(b"\x89PNG")
    assert not list(tmp_path.glob("runs*"))   # a plan's configuration is built, never trained


@pytest.mark.parametrize("args, message", [
    ([], "name at least one run"),
    (["--only", "x"], "--only names configurations of --plan"),
    (["{tf}"], "recall reads a reservoir's states"),
    (["{esn}", "--out", "r.txt"], "must end in .json"),
    (["{esn}", "--out", "no/such/r.json"], "does not exist"),
    (["{esn}", "--fit", "10"], "--fit: 10 is out of range"),
    (["{esn}", "--fit", "100000"], "the first training shard has"),
])
def test_bad_input_is_one_line_and_exit_2(runs, tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    args = [a.format(**{k: str(v) for k, v in runs.items()}) for a in args]
    assert main(["recall", *args, "--no-progress", "--out" if "--out" not in args else "--json", *(
        ["r.json"] if "--out" not in args else [])]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "r.json").exists()
