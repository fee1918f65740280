"""`reslm frontier bench` end to end on substrates that come from outside reslm: a physical device's recorded
states (docs/recorded-substrates.md) and a reservoirpy node registered by an --import file, each at a tiny
budget (a tiny recipe plan on a tiny corpus made in the test, in place of the esn-lr plan's choice)."""
import json
import textwrap

import pytest

from reslm.cli import main
from reslm.recording import export_drive, import_states, simulate
from reslm.run import read_config

N = 24
# the in-process equivalent of a recording's protocol: stream context, one stream per shard, whole shards
RECIPE = f"""
[plan]
about = "a tiny recipe for the bench"

[base]
label = "tiny-recipe"
family = "rc"
data = "tiny"
model = {{ size = {N}, streams = 1, context_mode = "stream" }}
train = {{ batch_size = 64, epochs_per_shard = 1, epoch_samples = 128, shard_chars = 0, lr = 3e-3, val_fraction = 0.2, eval_samples = 0 }}

[rule]
seeds = [0]
"""


@pytest.fixture
def tiny_recipe(bench_on):
    """The flags of a bench on this file's tiny recipe (conftest.bench_on)."""
    return bench_on(RECIPE)


def bench_row(text: str, name: str) -> list[str]:
    """The cells of the table row of `name` (the bench's own row) in the printed table."""
    row = next(line for line in text.splitlines() if line.startswith(f"| **{name}**"))
    return [c.strip() for c in row.strip("|").split("|")]


def test_a_recorded_device_runs_through_the_bench_like_the_reservoir_it_recorded(tiny_recipe, chars, tmp_path, capsys):
    """export -> a simulated device (the in-process ESN, no noise) -> import -> `reslm frontier bench
    --reservoir recorded`: a table row, a card and a run on the recording, whose test CE is the bench of
    the ESN it recorded (the same layout: stream context, one stream per shard, whole shards)."""
    export_drive(chars, tmp_path / "drive", embed_dim=16, seed=0)
    simulate(tmp_path / "drive", tmp_path / "states.npy", reservoir="esn", size=N)
    import_states(tmp_path / "states.npy", tmp_path / "drive", tmp_path / "sub")
    assert main(["frontier", "bench", "--reservoir", "recorded", "--reservoir-options", f"path={tmp_path / 'sub'}",
                 *tiny_recipe("rec")]) == 0
    rec = capsys.readouterr().out
    assert main(["frontier", "bench", "--reservoir", "esn", *tiny_recipe("esn")]) == 0
    esn = capsys.readouterr().out
    cells = bench_row(rec, "recorded")
    assert cells[1] == "quick" and cells[3].endswith("(1)")        # one seed measured at the quick budget
    assert cells[3] == bench_row(esn, "esn")[3]                     # the recording scores as its reservoir
    run, ref = (next(p for p in (tmp_path / d).iterdir() if p.is_dir()) for d in ("rec", "esn"))
    got, want = (json.loads((r / "summary.json").read_text()) for r in (run, ref))
    tests = [k for k in want if k.endswith("test_loss")]
    assert tests and all(got[k] == want[k] for k in tests)          # to the bit
    model = read_config(run)["model"]
    assert model["reservoir"] == "recorded" and model["size"] == N and str(tmp_path / "sub") in model["reservoir_options"]
    card = (tmp_path / "rec" / "card.md").read_text()
    assert "`recorded`" in card and "Strict reservoir rules" in card and run.name in card


def test_a_reservoirpy_node_from_an_import_file_runs_through_the_bench(tiny_recipe, tmp_path, capsys, registry):
    """An --import file that builds reservoirpy nodes (one per seed) and registers them with the adapter:
    the bench trains on them under the name and the file's sha256, with the node's size."""
    pytest.importorskip("reservoirpy")
    user = tmp_path / "my_node.py"
    user.write_text(textwrap.dedent(f"""\
        from reservoirpy.nodes import Reservoir
        from reslm.reservoir.reservoirpy_node import register
        register("rpy-test", lambda seed: Reservoir({N}, lr=0.5, sr=0.9, seed=seed))
        """))
    assert main(["frontier", "bench", "--reservoir", "rpy-test", "--import", str(user), *tiny_recipe("rpy")]) == 0
    cells = bench_row(capsys.readouterr().out, "rpy-test")
    assert cells[3].endswith("(1)") and float(cells[3].split()[0]) > 0
    run = next(p for p in (tmp_path / "rpy").iterdir() if p.is_dir())
    model = read_config(run)["model"]
    assert model["reservoir"].startswith("rpy-test@") and model["size"] == N
    assert json.loads((run / "summary.json").read_text())["trainable_params"] > 0
    assert str(user) in (tmp_path / "rpy" / "card.md").read_text()


def test_the_card_and_the_table_hold_the_runs_memory_beside_a_published_profile(tiny_recipe, chars, tmp_path, capsys):
    """--memory-positions P: the first seed's `reslm memory` profile (k = 1 ... 256) and the substrate's memory capacity
    in memory.json, the table's last column and the card's Memory section with its figure; a published profile
    measured on other positions is left out with a note, never drawn beside it."""
    from reslm.frontier.profile import REFERENCE
    from reslm.core.files import read_json, write_json
    ref = tmp_path / "results" / REFERENCE
    ref.parent.mkdir(parents=True)
    write_json(ref, dict(positions=99, lengths=[1], split="test", text="x", text_symbols=1, data="other", runs=[]))
    flags = tiny_recipe("mem") + ["--memory-positions", "64"]
    assert main(["frontier", "bench", "--reservoir", "esn", *flags]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "CE from 16 / 256 chars" in out.splitlines()[0]
    cells = bench_row(out, "esn")
    k16, k256 = (float(x) for x in cells[-1].split(" / "))
    mem = read_json(tmp_path / "mem" / "memory.json")
    assert mem["positions"] == 64 and mem["lengths"] == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert (round(mem["curve"]["16"], 3), round(mem["curve"]["256"], 3)) == (k16, k256) and mem["seed"] == 0
    assert 0 < mem["capacity"] <= 256 and mem["capacity_esn"] == mem["capacity"]   # the recipe's own ESN
    assert mem["references"] == {} and "other positions" in mem["notes"][0]
    card = (tmp_path / "mem" / "card.md").read_text()
    assert "## Memory" in card and "![test CE against the characters read](memory.png)" in card
    assert (tmp_path / "mem" / "memory.png").stat().st_size > 0


def test_a_published_profile_on_the_same_positions_gives_the_references_curves(tmp_path):
    from reslm.core.files import write_json
    from reslm.frontier.profile import _references
    prof = dict(positions=64, lengths=[1, 2], split="test", text="the test shard", text_symbols=900, data="tiny")
    curve = {"1": 3.0, "2": 2.5}
    write_json(tmp_path / "ref.json", dict(prof, runs=[dict(run="esn-run", memory_loss=curve)]))
    refs, notes = _references(prof, tmp_path / "ref.json", {"ESN frontier": "esn-run", "trained ceiling": "gru-run"})
    assert refs == {"ESN frontier": curve} and notes == ["trained ceiling: gru-run is not in " + str(tmp_path / "ref.json")]
